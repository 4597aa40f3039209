"""``harness lock --check``: which locks are missing or stale. No network.

A lock is stale when the digest of what shapes it (the manifest's environment and weights,
:mod:`harness.lock.digest`; runtime-only keys such as ``load_seconds`` do not count) differs
from the one it records, when the settings that shape it changed (the ``[lock] platforms``
set, in order, or the ``[lock.python]`` pin of its Python request), when its ``path``
weights changed on disk (re-hashed here, since they are local), when it installs an sdist but
was written before sdists' build requirements were locked, or when it cannot be read. Hub, git and index upstreams are not consulted: that would need the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import HarnessError
from harness.lock.digest import accepted_digests
from harness.lock.lockfile import lock_path, read
from harness.lock.projection import platforms_of
from harness.manifests.project import Project

if TYPE_CHECKING:
    from harness.config import Settings
    from harness.lock.document import Lock, LockedWeights
    from harness.manifests.model import BenchmarkManifest, ServiceManifest, Weights
    from harness.store.statcache import HashCache


@dataclass(frozen=True)
class Staleness:
    name: str
    lock: Path
    #: "missing", "manifest changed", "platforms changed: …", "python pin changed: …",
    #: "weights <dir> changed: <file>", "unreadable: …", "written by an older harness: …"
    reason: str


def check_locks(
    project: Project,
    names: list[str],
    *,
    settings: Settings | None = None,
    hash_cache: Path | None = None,
    platform: str | None = None,
) -> list[Staleness]:
    """Every named (or every) manifest whose lock is missing or stale, with the reason.

    ``settings`` (this machine's, :func:`harness.config.load_settings`) are compared with what
    each lock was made for; None leaves them out. ``hash_cache`` (a file, see
    :class:`harness.store.statcache.HashCache`) lets ``path`` weights whose files' stats are
    unchanged skip re-hashing.
    """
    from harness.lock.generate import load_manifests, select
    from harness.store.statcache import HashCache

    found = load_manifests(project)
    cache = HashCache(hash_cache)
    stale: list[Staleness] = []
    for name in select(found, names):
        _, manifest = found[name]
        path = lock_path(project.locks_dir, name)
        if not path.is_file():
            stale.append(Staleness(name, path, "missing"))
            continue
        try:
            lock = read(path, whole=True)
        except HarnessError as exc:
            stale.append(Staleness(name, path, f"unreadable: {exc.message.splitlines()[0]}"))
            continue
        if lock.manifest_digest not in accepted_digests(manifest):
            stale.append(Staleness(name, path, "manifest changed"))
            continue
        reason = _settings_changed(manifest, lock, settings) if settings is not None else None
        reason = reason or _sdists_unlocked(lock)
        reason = reason or _local_weights_changed(project, manifest, lock, cache)
        reason = reason or (_platform_missing(lock, platform) if platform is not None else None)
        if reason:
            stale.append(Staleness(name, path, reason))
    cache.save()
    return stale


def _platform_missing(lock: Lock, platform: str) -> str | None:
    """Why ``lock`` is stale for ``platform`` (uv's canonical spelling): it was not made for it."""
    locked = platforms_of(lock)
    if platform in locked:
        return None
    return f"not locked for {platform} (locked for {', '.join(locked)})"


def _sdists_unlocked(lock: Lock) -> str | None:
    """A lock that installs an sdist (on one of its platforms) but was written before sdists'
    build requirements were locked (that platform's environment store path is the one that
    harness gave it): realize could not build it offline on a clean machine."""
    from harness.lock.storepaths import environment_path_before_sdist_builds

    if lock.targets:
        from harness.lock.platforms import for_platform

        written = [(t.environment, for_platform(lock, t.platform, t.variant)) for t in lock.targets]
    else:
        written = [(lock.environment.store, lock)]
    for environment, one in written:
        if any(p.sdist is not None and not p.wheels for p in one.packages):
            if environment == environment_path_before_sdist_builds(one):
                return "written by an older harness: its sdists' build requirements are not locked"
    return None


def _settings_changed(manifest: ServiceManifest | BenchmarkManifest, lock: Lock, settings: Settings) -> str | None:
    """What a plain ``harness lock`` would now make differently because of the settings: the
    platforms, when ``[lock] platforms`` names them (without it a lock is for the machine
    that made it, and a checkout on another machine is not stale for that), and the exact
    Python release that ``[lock.python]`` pins the manifest's request to."""
    from harness.lock.generate import lock_targets
    from harness.lock.outcome import LockOptions

    if settings.lock_platforms:
        try:
            wanted = lock_targets(settings, LockOptions())
        except HarnessError as exc:
            return f"platforms: {exc.message}"
        locked = platforms_of(lock)
        if locked != wanted:
            return (
                f"platforms changed: locked for {', '.join(locked)}; "
                f"{settings.lock_platforms_origin} asks for {', '.join(wanted)}"
            )
    environment = getattr(manifest, "environment", None)
    if environment is None:
        return None
    pin = settings.python_pins.get(environment.python)
    if pin is not None and lock.python.version != pin:
        return f"python pin changed: locked {lock.python.version}; lock.python pins {environment.python} to {pin}"
    return None


def _local_weights_changed(
    project: Project, manifest: ServiceManifest | BenchmarkManifest, lock: Lock, cache: HashCache
) -> str | None:
    """Re-hash ``path`` weights with the same code that locked them; name the first change.

    Files whose stat is unchanged since they were last hashed are taken from ``cache``; only
    when that shows a difference (or fails) are they re-locked to name it.
    """
    import tempfile

    from harness.config import Settings
    from harness.resolve.weights import lock_weights

    locked = {w.dir: w for w in lock.weights}
    for spec in manifest.weights:
        if spec.provider != "path" or spec.dir not in locked:
            continue
        if _path_weights_unchanged(project, spec, locked[spec.dir], cache):
            continue
        with tempfile.TemporaryDirectory(prefix="harness-check-") as scratch:
            try:
                current = lock_weights(
                    spec, project_root=project.root, settings=Settings(), cache_dir=Path(scratch), offline=True
                )
            except HarnessError as exc:
                return f"weights {spec.dir}: {exc.message}"
        now = {(f.path, f.size, f.sha256) for f in current.files}
        before = {(f.path, f.size, f.sha256) for f in locked[spec.dir].files}
        if now != before:
            changed = sorted({p for p, _, _ in now ^ before})[0]
            return f"weights {spec.dir} changed: {changed}"
    return None


def _path_weights_unchanged(project: Project, spec: Weights, locked: LockedWeights, cache: HashCache) -> bool:
    """Whether the ``path`` weights of ``spec`` still hold exactly ``locked``'s files, listed
    as :func:`harness.resolve.weights.lock_weights` lists them, hashed through ``cache``."""
    from harness.resolve.weights import _path_root, _walk_folder, include_matches

    include = list(spec.include)
    try:
        root = _path_root(spec.location, project.root)
        if root.is_file():
            listed = [(root.name, root)]
        elif root.is_dir():
            listed = list(_walk_folder(root))
        else:
            return False
        now = {(rel, path.stat().st_size, cache.sha256(path)) for rel, path in listed if include_matches(rel, include)}
    except (HarnessError, OSError):
        return False
    return bool(now) and now == {(f.path, f.size, f.sha256) for f in locked.files}
