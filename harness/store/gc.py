"""Garbage collection roots and ``harness store gc`` / ``harness store why``.

Roots (plain files under ``store/.roots``, so they survive on NFS and are easy to inspect):

* ``projects/<id>`` — a project that realized into this store: its locks name live paths;
* ``pins/<name>`` — a path pinned by hand (``harness store pin``);
* ``runs/<id>`` — a run in progress (the runtime writes it with its pid and store paths).

A path is live when a root names it or a live path references it. Everything else is
garbage. Deletion unregisters first, so a crash mid-collection leaves only debris that the
next ``clean`` removes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.store.store import Store


def register_project(store: Store, project_root: Path, names: Iterable[str] = ()) -> None:
    """Remember that ``project_root`` realized into ``store`` (its locks become roots).

    The root file holds the project's folder, then the store paths ``names`` it realized
    (merged with those already listed): what gc keeps for the project when another user
    runs it and cannot read the project's locks (a shared store, a private home).
    """
    folder = store.roots_dir / "projects"
    folder.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(str(project_root.resolve()).encode()).hexdigest()[:32]
    target = folder / key
    try:
        old = target.read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        old = []
    text = "\n".join([str(project_root.resolve()), *sorted(set(old[1:]) | set(names))]) + "\n"
    if old[:1] != [str(project_root.resolve())] or "\n".join(old) + "\n" != text:
        target.write_text(text)


def pin(store: Store, name: str) -> None:
    folder = store.roots_dir / "pins"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(name + "\n")


def unpin(store: Store, name: str) -> None:
    (store.roots_dir / "pins" / name).unlink(missing_ok=True)


@dataclass(frozen=True)
class Root:
    kind: str  # "project", "pin", "run"
    label: str
    names: frozenset[str]


def roots(store: Store) -> list[Root]:
    """Every root and the store paths it names directly."""
    from harness.errors import HarnessError
    from harness.lock.lockfile import read

    found: list[Root] = []
    for entry in sorted((store.roots_dir / "projects").glob("*")) if (store.roots_dir / "projects").is_dir() else []:
        lines = entry.read_text().splitlines()
        project = Path(lines[0].strip() if lines else "")
        names: set[str] = set()
        locks = project / "locks"
        try:
            if not locks.is_dir():
                continue  # the project is gone: it roots nothing any more
            for lock_file in sorted(locks.glob("*.lock.toml")):
                try:
                    names |= lock_store_paths(read(lock_file))
                except HarnessError:
                    continue
        except PermissionError:
            # Another user's project this user cannot read: keep what it last realized.
            names = {line.strip() for line in lines[1:] if line.strip()}
        found.append(Root("project", str(project), frozenset(names)))
    for entry in sorted((store.roots_dir / "pins").glob("*")) if (store.roots_dir / "pins").is_dir() else []:
        found.append(Root("pin", entry.name, frozenset({entry.name})))
    for entry in sorted((store.roots_dir / "runs").glob("*")) if (store.roots_dir / "runs").is_dir() else []:
        try:
            data = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(data.get("pid", 0))):
            found.append(Root("run", entry.name, frozenset(data.get("paths", []))))
    return found


def lock_store_paths(lock) -> set[str]:
    """Every store path a lock names."""
    names = {lock.python.store, lock.environment.store}
    for package in [*lock.packages, *lock.build_packages]:
        names |= {w.store for w in package.wheels}
        if package.sdist is not None:
            names.add(package.sdist.store)
    names |= {s.store for s in lock.sources}
    names |= {w.store for w in lock.weights}
    from harness.lock.storepaths import weights_view_path

    view = weights_view_path(lock)
    if view:
        names.add(view)
    return {n for n in names if n}


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_paths(store: Store) -> set[str]:
    """The closure of every root under references."""
    live: set[str] = set()
    pending = [name for root in roots(store) for name in root.names]
    while pending:
        name = pending.pop()
        if name in live:
            continue
        live.add(name)
        record = store.record(name)
        if record is not None:
            pending.extend(record.references)
    return live


def collect(store: Store, *, dry_run: bool) -> list[str]:
    """Delete every registered path no root reaches; returns their names (sorted)."""
    live = live_paths(store)
    # A record whose path was deleted behind the store's back is dead weight too.
    dead = sorted(r.name for r in store.records(even_if_gone=True) if r.name not in live)
    # In a shared store only the member who registered a path (or root) deletes it.
    dead = [name for name in dead if store.may_remove(name)]
    if not dry_run:
        for name in dead:
            store.delete(name)
        store.clean()
        store.collect_links()
    return dead


def why(store: Store, name: str) -> list[str]:
    """Why ``name`` is alive: the paths that reference it and the roots that name it."""
    reasons = [f"referenced by {r.name}" for r in store.records() if name in r.references]
    for root in roots(store):
        if name in root.names:
            reasons.append(f"root {root.kind} {root.label}")
    return reasons
