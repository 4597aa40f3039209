"""The layering of docs/architecture.md, checked on every import in the package.

Lazy imports inside functions count too: they are still dependencies, only deferred. An
edge this table does not allow fails with the importing file, so a new dependency is either
moved to the stage that owns it or added here and to docs/architecture.md on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "harness"

# What each top-level part of the package may import (its own modules always).
_BASE = {"errors", "progress"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "progress": set(),  # progress on stderr (a leaf, like errors): realize, store and cache show phases
    "manifests": _BASE,
    "config": _BASE | {"manifests"},
    "store": _BASE,
    "hostnames": set(),  # each host looked up once per process (a leaf): download's connections
    "download": _BASE | {"store", "hostnames"},
    "resolve": _BASE | {"manifests", "config", "store", "download"},
    "lock": _BASE | {"manifests", "config", "store", "download", "resolve"},
    "realize": _BASE | {"manifests", "config", "store", "download", "resolve", "lock"},
    "cache": _BASE | {"config", "store", "download", "lock"},
    "runtime": _BASE | {"manifests", "config", "store", "lock", "realize"},
    "runs": _BASE | {"manifests", "config", "store", "download", "resolve", "lock", "realize", "cache", "runtime"},
    "client": _BASE,
}
# Edges against the grain, each for a stated reason (docs/architecture.md).
EXCEPTIONS: dict[str, set[str]] = {
    "store/gc.py": {"lock"},  # gc roots are the store paths of the project's locks
    "realize/builder.py": {"cache"},  # realize asks binary caches first
    "cache/transfer.py": {"realize"},  # the parallel fetcher of realize/fetch.py
}
TOP = {"cli", "entry", "harbor", "__main__", "__init__"}  # shells: may import anything


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("harness.")}
    return found


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layering(path: Path) -> None:
    part = _part(path)
    if part in TOP:
        return
    assert part in ALLOWED, f"{part} is not in the layering table (tests/test_architecture.py)"
    rel = path.relative_to(PACKAGE).as_posix()
    allowed = ALLOWED[part] | EXCEPTIONS.get(rel, set()) | {part}
    bad = _imports(path) - allowed
    assert not bad, f"harness/{rel} imports {sorted(bad)}: not allowed for {part} (docs/architecture.md)"


def test_nothing_imports_the_shells() -> None:
    offenders = [
        p.relative_to(PACKAGE).as_posix() for p in _files() if _part(p) not in TOP and _imports(p) & {"cli", "harbor"}
    ]
    assert offenders == []


def test_every_exception_is_still_needed() -> None:
    # A stale exception would hide a new edge of the same kind: drop it when the code no longer needs it.
    for rel, parts in EXCEPTIONS.items():
        assert parts <= _imports(PACKAGE / rel), f"{rel} no longer imports {sorted(parts)}: drop the exception"


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _file_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules ``path`` imports, anywhere in the file (lazy imports inside
    functions and ``TYPE_CHECKING`` blocks too): ``from harness.a import b`` names
    ``harness.a.b`` when that is a module, else ``harness.a``."""
    found: set[str] = set()
    this = _module(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:
                    found.add(f"{target}.{alias.name}")
                elif target in modules:
                    found.add(target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
    return found - {this}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_import_cycles_are_found() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_between_files() -> None:
    # A circle says a boundary is in the wrong place: what both files need belongs below both.
    files = {_module(p): p for p in _files()}
    graph = {name: _file_imports(path, set(files)) for name, path in files.items()}
    assert import_cycles(graph) == []


# The stages whose public faces are typed: no ``Any`` in the signature of a public function
# or method, nor in a public class's fields, but as the value type of a JSON object
# (``dict[str, Any]``, ``Mapping[str, Any]``). mypy then checks the seams, not only the insides.
TYPED_STAGES = ("realize", "runtime", "runs", "cache", "lock")
_JSON_OBJECTS = {"dict", "Mapping", "MutableMapping"}


def _untyped_spots(annotation: ast.expr | None) -> int:
    """How many ``Any`` in ``annotation`` are not a JSON object's value type."""
    if annotation is None:
        return 0
    allowed: set[int] = set()
    for node in ast.walk(annotation):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in _JSON_OBJECTS
            and isinstance(node.slice, ast.Tuple)
            and len(node.slice.elts) == 2
            and isinstance(node.slice.elts[0], ast.Name)
            and node.slice.elts[0].id == "str"
        ):
            allowed.add(id(node.slice.elts[1]))
    return sum(1 for n in ast.walk(annotation) if isinstance(n, ast.Name) and n.id == "Any" and id(n) not in allowed)


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def any_in_public_faces(path: Path) -> list[str]:
    """``file:line name`` of each public function, method or class field typed with ``Any``."""
    found: list[str] = []
    rel = path.relative_to(PACKAGE).as_posix()

    def function(node: ast.FunctionDef | ast.AsyncFunctionDef, owner: str) -> None:
        args = node.args
        # ``*args: Any, **kwargs: Any`` only pass everything on: allowed.
        spots = sum(_untyped_spots(a.annotation) for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
        spots += _untyped_spots(node.returns)
        if spots:
            found.append(f"{rel}:{node.lineno} {owner}{node.name}")

    for top in ast.parse(path.read_text(), str(path)).body:
        if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef) and _public(top.name):
            function(top, "")
        elif isinstance(top, ast.ClassDef) and _public(top.name):
            for item in top.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and _public(item.name):
                    function(item, f"{top.name}.")
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and _public(item.target.id):
                    if _untyped_spots(item.annotation):
                        found.append(f"{rel}:{item.lineno} {top.name}.{item.target.id}")
    return found


def test_the_any_check_sees_what_it_should() -> None:
    def spots(text: str) -> int:
        return _untyped_spots(ast.parse(text, mode="eval").body)

    assert spots("Any") == spots("Any | None") == spots("list[Any]") == spots("dict[Any, int]") == 1
    assert spots("dict[str, Any]") == spots("Mapping[str, Any] | None") == spots("list[dict[str, Any]]") == 0


def test_stage_faces_are_typed() -> None:
    found = [
        spot
        for stage in TYPED_STAGES
        for p in sorted((PACKAGE / stage).rglob("*.py"))
        for spot in any_in_public_faces(p)
    ]
    assert found == [], "typed faces (name the type that passes between stages):\n" + "\n".join(found)


#: The longest a function may be (lines, its docstring included): an orchestrator reads as a
#: short list of named phases, each a function whose name says what it does.
MAX_FUNCTION_LINES = 100


def test_no_function_is_longer_than_a_page() -> None:
    long = [
        f"{p.relative_to(PACKAGE).as_posix()}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for p in _files()
        for node in ast.walk(ast.parse(p.read_text(), str(p)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == [], "split into named phases:\n" + "\n".join(long)


def test_every_test_that_needs_root_is_marked_root() -> None:
    """CI runs the user's test files as root only with ``-m root``: a test that skips unless
    it is root but lacks the marker never runs anywhere (one did, for a whole wave)."""
    unmarked = []
    for path in sorted((PACKAGE.parent / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_root = "mark.root" in ast.unparse(tree) and any(
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
            and "mark.root" in ast.unparse(node.value)
            for node in tree.body
        )
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            decorators = [ast.unparse(d) for d in node.decorator_list]
            needs_root = any("geteuid() != 0" in d for d in decorators)
            if needs_root and not module_root and not any(d.endswith("mark.root") for d in decorators):
                unmarked.append(f"{path.name}::{node.name}")
    assert unmarked == [], f"skipped unless root but not marked @pytest.mark.root: {unmarked}"


_MARKER = ("<" * 7 + " ", "=" * 7 + "\n", ">" * 7 + " ")
_SOURCES = ("harness", "tests", "bench", "scripts", "docs/src/content", ".ci", "services", "benchmarks")


def test_no_merge_conflict_markers_are_left() -> None:
    """A merge whose conflicts were resolved by hand can leave a marker line in a table or a
    page that every other check reads past (a Markdown row after ``<<<<<<< HEAD`` still
    renders); the map and the guides must not carry one."""
    root = PACKAGE.parent
    files = [root / "README.md", root / "docs" / "architecture.md", root / "docs" / "benchmarks.md"]
    for folder in _SOURCES:
        files += [
            p for p in (root / folder).rglob("*") if p.is_file() and p.suffix in {".py", ".md", ".sh", ".toml", ""}
        ]
    found = []
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{path.relative_to(root)}:{n}" for n, line in enumerate(lines, 1) if line.startswith(_MARKER)]
    assert not found, f"merge conflict markers left: {found}"
