"""What a re-lock changed, for people: ``numpy 2.2.6 → 2.4.6``, ``+ einops 0.8.1``, ``- tqdm``.

:func:`lock_changes` compares two locks of one manifest (the previous one may be missing)
and lists, in a stable order: the interpreter, the platforms, packages, build packages, git
sources (by repository and subdirectory: commits, and submodule commits) and weight sets
(hub revisions, or their files where no revision applies). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.lock.document import Lock, LockedPackage


@dataclass(frozen=True)
class Change:
    """One difference: ``kind`` (python, platforms, package, build-package, source,
    submodule, weights), the thing's name, and its old and new value (None: absent)."""

    kind: str
    name: str
    old: str | None
    new: str | None

    def __str__(self) -> str:
        label = {
            "package": "",
            "build-package": "build ",
            "source": "source ",
            "submodule": "submodule ",
            "weights": "weights ",
            "python": "",
            "platforms": "",
        }.get(self.kind, f"{self.kind} ")
        if self.old is None:
            return f"+ {label}{self.name} {self.new}"
        if self.new is None:
            return f"- {label}{self.name}"
        return f"{label}{self.name} {self.old} → {self.new}"

    def as_json(self) -> dict[str, str | None]:
        return {"kind": self.kind, "name": self.name, "old": self.old, "new": self.new}


def _versions(packages: list[LockedPackage]) -> dict[str, str]:
    """name → its version (versions, comma-separated, where platforms pin differently)."""
    found: dict[str, set[str]] = {}
    for package in packages:
        found.setdefault(package.name, set()).add(package.version)
    return {name: ", ".join(sorted(versions)) for name, versions in found.items()}


def _compare(kind: str, old: dict[str, str], new: dict[str, str]) -> list[Change]:
    changes = []
    for name in sorted(old.keys() | new.keys()):
        if old.get(name) != new.get(name):
            changes.append(Change(kind, name, old.get(name), new.get(name)))
    return changes


def _short(commit: str) -> str:
    return commit[:12]


def lock_changes(old: Lock | None, new: Lock) -> list[Change]:
    """Every difference from ``old`` to ``new`` (everything is new when ``old`` is None)."""
    from harness.lock.platforms import platforms_of

    changes: list[Change] = []
    if old is None or old.python.version != new.python.version:
        changes.append(Change("python", "python", old.python.version if old else None, new.python.version))
    old_platforms = ", ".join(platforms_of(old)) if old else None
    if old is not None and old_platforms != ", ".join(platforms_of(new)):
        changes.append(Change("platforms", "platforms", old_platforms, ", ".join(platforms_of(new))))
    changes += _compare("package", _versions(old.packages) if old else {}, _versions(new.packages))
    changes += _compare("build-package", _versions(old.build_packages) if old else {}, _versions(new.build_packages))

    def sources(lock: Lock | None) -> dict[str, str]:
        if lock is None:
            return {}
        return {s.repo + (f"#{s.subdirectory}" if s.subdirectory else ""): _short(s.commit) for s in lock.sources}

    def submodules(lock: Lock | None) -> dict[str, str]:
        if lock is None:
            return {}
        return {f"{s.repo}:{m.path}": _short(m.commit) for s in lock.sources for m in s.submodules}

    changes += _compare("source", sources(old), sources(new))
    changes += _compare("submodule", submodules(old), submodules(new))

    def weights(lock: Lock | None) -> dict[str, str]:
        if lock is None:
            return {}
        out = {}
        for w in lock.weights:
            files = w.store.split("-", 1)[0][:12]  # the store hash: fixed by the files
            if w.revision and len(w.revision) == 40:
                out[w.dir] = _short(w.revision)  # a commit fixes the files (given the include)
            elif w.revision:  # a tag or branch (ModelScope): its files may move under it
                out[w.dir] = f"{w.revision} (files {files})"
            else:  # a URL or a path
                out[w.dir] = f"files {files}"
        return out

    changes += _compare("weights", weights(old), weights(new))
    return changes
