"""``harness store verify --repair``: delete the named store paths and realize them again
from the project's locks (what a repair rebuilds comes from the lock's inputs, checked
against its hashes, as any realize).

A repair never launders what it repairs. Environment files are hard links into the store's
pool (``.links``) and into uv's cache, so a file changed in one path is changed in every
path and cache that shares its inode; rebuilding from those would register the changed
bytes again. So a repair

* builds environments with a fresh uv cache of its own (the pool is safe to reuse: a file is
  linked to a pool entry only when their bytes are equal, and a pool entry whose bytes
  differ is replaced by the rebuilt file);
* mends the home's uv cache: each of its files that is one inode with a file of a repaired
  environment (the ones the stat fingerprint says changed; every file when there is none)
  and whose bytes differ from the rebuilt file is replaced by it, so the next realize does
  not install the changed bytes into a new path;
* checks that each repaired path hashes to the content it was registered with. One that
  does not is deleted again and the repair fails naming it, the files that changed since it
  was registered, and both hashes: one store name never holds two contents.

Other paths that share a changed inode stay changed until they are repaired too: the cheap
``store verify`` finds them (their fingerprints moved with the inode) and one ``--repair``
repairs all it found.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from harness.lock.objects import all_objects
from harness.store.store import SHARED_KINDS, StoreError, remove_tree

if TYPE_CHECKING:
    from harness.manifests.project import Project
    from harness.store.store import Store


def repair_paths(store: Store, project: Project, home: Path, deploy_path: Path | None, names: list[str]) -> list[str]:
    """Delete ``names`` from ``store`` and realize them again from ``project``'s locks (with
    ``home``'s settings and download cache, and the deploy's weights folder when
    ``deploy_path`` names one); returns the names registered again, sorted. StoreError when
    a rebuilt path's content is not the one it was registered with (module doc)."""
    from harness.config import load_settings
    from harness.lock.lockfile import read
    from harness.realize.builder import Context, realize_locks
    from harness.realize.install import deploy_local_weights
    from harness.realize.standin import realized_lock
    from harness.store.statfile import changed_entries

    locks = [read(p) for p in sorted(project.locks_dir.glob("*.lock.toml"))]
    affected = [lock for lock in locks if set(names) & {*all_objects(lock), *all_objects(realized_lock(store, lock))}]
    local_weights = None
    if deploy_path is not None:  # read before anything is deleted: a bad deploy deletes nothing
        local_weights = deploy_local_weights(project.load_deploy(deploy_path), deploy_path)
    registered: dict[str, str] = {}
    changed: dict[str, list[str]] = {}
    shared: dict[tuple[int, int], str] = {}  # (device, inode) of a repaired environment's file → its place
    for name in names:
        record = store.record(name, even_if_gone=True)
        if record is not None:
            registered[name] = record.content
            found = changed_entries(store.root, name, record.content)
            changed[name] = found or []
            if record.kind in SHARED_KINDS:
                shared.update(_inodes(store.root, name, found))
    for name in names:
        store.delete(name)
    store.tmp_dir.mkdir(parents=True, exist_ok=True)
    uv_cache = Path(tempfile.mkdtemp(prefix="repair-uv-cache.", dir=store.tmp_dir))
    try:
        ctx = Context(
            store=store,
            project_root=project.root,
            settings=load_settings(home, project.root),
            cache_dir=home / "cache",
            local_weights=local_weights,
            uv_cache_dir=uv_cache,
            rebuild=frozenset(names),
        )
        realize_locks(ctx, affected)
    finally:
        remove_tree(uv_cache)
        _mend_cache(home / "cache", store.root, shared)
    _check_repaired(store, registered, changed)
    return sorted(n for n in names if store.is_registered(n))


def _inodes(store_root: Path, name: str, changed: list[str] | None) -> dict[tuple[int, int], str]:
    """The regular files of path ``name`` (those in ``changed``, store-relative, or all when
    None) by (device, inode), each as its store-relative place."""
    places = changed
    if places is None:
        places = [
            os.path.relpath(os.path.join(folder, file), store_root)
            for folder, _, files in os.walk(store_root / name)
            for file in files
        ]
    found: dict[tuple[int, int], str] = {}
    for place in places:
        try:
            st = os.lstat(store_root / place)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found[(st.st_dev, st.st_ino)] = place
    return found


def _mend_cache(cache: Path, store_root: Path, shared: dict[tuple[int, int], str]) -> None:
    """Replace each file of ``cache`` that is one of the ``shared`` inodes and whose bytes
    differ from the rebuilt file at its place with a link to (or a copy of) the rebuilt one."""
    from harness.store.store import _replace_with_link, _same_bytes

    if not shared or not cache.is_dir():
        return
    for folder, _, files in os.walk(cache):
        for file in files:
            path = os.path.join(folder, file)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            place = shared.get((st.st_dev, st.st_ino))
            if place is None or not stat.S_ISREG(st.st_mode):
                continue
            good = store_root / place
            try:
                if not good.is_file() or _same_bytes(path, good):
                    continue
                os.chmod(folder, os.stat(folder).st_mode | stat.S_IWUSR)
                _replace_with_link(good, Path(path))
            except OSError:
                continue  # not this user's to mend (a shared home): its owner's repair does


def _check_repaired(store: Store, registered: dict[str, str], changed: dict[str, list[str]]) -> None:
    """Delete every rebuilt path whose content is not its registered one, and raise naming them."""
    wrong = []
    for name, content in sorted(registered.items()):
        record = store.record(name)
        if record is None or record.content == content:
            continue
        store.delete(name)
        files = changed.get(name) or []
        shown = ", ".join(files[:10]) + (f" and {len(files) - 10} more" if len(files) > 10 else "")
        wrong.append(
            f"{name}: rebuilt as {record.content}, registered as {content}"
            + (f" (changed since registered: {shown})" if files else "")
        )
    if wrong:
        raise StoreError(
            "repair did not restore what was registered, so nothing was registered in its place:\n  "
            + "\n  ".join(wrong),
            hint="the rebuild is not reproducible here, or its inputs changed too; "
            "`harness store verify --check-contents` lists every path that changed",
        )
