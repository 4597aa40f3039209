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
    "cache/substitute.py": {"realize"},  # which file of a locked package this host uses
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
