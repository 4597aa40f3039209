"""``harness store verify --repair``: delete the named store paths and realize them again
from the project's locks (what a repair rebuilds comes from the lock's inputs, checked
against its hashes, as any realize)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.lock.objects import lock_objects

if TYPE_CHECKING:
    from harness.manifests.project import Project
    from harness.store.store import Store


def repair_paths(store: Store, project: Project, home: Path, deploy_path: Path | None, names: list[str]) -> list[str]:
    """Delete ``names`` from ``store`` and realize them again from ``project``'s locks (with
    ``home``'s settings and download cache, and the deploy's weights folder when
    ``deploy_path`` names one); returns the names registered again, sorted."""
    from harness.config import load_settings
    from harness.lock.lockfile import read
    from harness.realize.builder import Context, realize_locks
    from harness.realize.install import deploy_local_weights
    from harness.realize.standin import realized_lock

    locks = [read(p) for p in sorted(project.locks_dir.glob("*.lock.toml"))]
    affected = [lock for lock in locks if set(names) & {*lock_objects(lock), *lock_objects(realized_lock(store, lock))}]
    local_weights = None
    if deploy_path is not None:  # read before anything is deleted: a bad deploy deletes nothing
        local_weights = deploy_local_weights(project.load_deploy(deploy_path), deploy_path)
    for name in names:
        store.delete(name)
    ctx = Context(
        store=store,
        project_root=project.root,
        settings=load_settings(home, project.root),
        cache_dir=home / "cache",
        local_weights=local_weights,
    )
    realize_locks(ctx, affected)
    return sorted(n for n in names if store.is_registered(n))
