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
    "download": _BASE | {"store"},
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
