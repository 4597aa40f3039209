"""Several platforms in one lock (``[lock] platforms``): merging, projecting, choosing. Pure.

GPU servers are x86_64 and robots' computers aarch64; one lock serves both. ``harness lock``
resolves each platform on its own (one ``uv pip compile`` per target, side by side) and
:func:`merge` folds the single-platform locks into one:

* ``targets`` lists the platforms in order, each with its interpreter's source and the store
  paths of its interpreter and environment; ``python`` and ``environment`` are the first's;
* a package pinned identically everywhere is one entry whose wheels are the union of the
  files each platform takes; a pin some platforms lack (another version, or a package only
  one needs) carries ``platforms = [...]``.

:func:`for_platform` is the inverse: the single-platform lock of one target, byte for byte
what locking that platform alone gives (same packages, same fitting wheels, the sdist only
where no wheel fits, the same store paths). Realize, launch and audit only ever see such a
projection (:func:`for_host`, through :func:`harness.lock.lockfile.read`).
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import HarnessError
from harness.lock.document import Lock, LockedPackage, LockedTarget
from harness.lock.projection import platforms_of, project_platform
from harness.lock.storepaths import assign_store_paths

__all__ = ["platforms_of", "merge", "for_platform", "fits_host", "host_platform_of", "for_host", "no_platform_error"]


def merge(locks: list[Lock]) -> Lock:
    """One lock for the platforms of ``locks`` (single-platform locks of one manifest, in
    ``[lock] platforms`` order); a single lock is returned as it is (module doc)."""
    if len(locks) == 1:
        return locks[0]
    first = locks[0]
    versions = {lock.python.version for lock in locks}
    if len(versions) != 1:
        raise HarnessError(
            f"the platforms lock different Python versions ({', '.join(sorted(versions))})",
            hint="pin the version in harness.toml: [lock.python]",
        )
    platforms = [lock.python.platform for lock in locks]
    return assign_store_paths(
        first.model_copy(
            update={
                "targets": [LockedTarget(platform=lock.python.platform, source=lock.python.source) for lock in locks],
                "packages": _merge_packages([lock.packages for lock in locks], platforms),
                "build_packages": _merge_packages([lock.build_packages for lock in locks], platforms),
            }
        )
    )


def _merge_packages(per_platform: list[list[LockedPackage]], platforms: list[str]) -> list[LockedPackage]:
    # A pin whose sdist builds from another build set on one platform is an entry of its own.
    groups: dict[tuple[str, str, str, str, tuple[str, ...]], list[tuple[str, LockedPackage]]] = {}
    for platform, packages in zip(platforms, per_platform, strict=True):
        for package in packages:
            key = (package.name, package.version, package.marker, package.index, tuple(package.build_requires))
            groups.setdefault(key, []).append((platform, package))
    merged = []
    for members in groups.values():
        wheels = {w.file: w for _, p in members for w in p.wheels}
        sdists = [p.sdist for _, p in members if p.sdist is not None]
        where = [platform for platform, _ in members]
        merged.append(
            members[0][1].model_copy(
                update={
                    "platforms": [] if len(where) == len(platforms) else where,
                    "wheels": [wheels[name] for name in sorted(wheels)],
                    "sdist": sdists[0] if sdists else None,
                }
            )
        )
    return merged


def for_platform(lock: Lock, platform: str) -> Lock:
    """The single-platform lock of ``platform``, one of ``lock``'s targets (module doc)."""
    return assign_store_paths(project_platform(lock, platform))


def fits_host(platform: str, host_tags: list[str] | None = None) -> bool:
    """Whether wheels built for ``platform`` run here: a manylinux target no newer than this
    machine's glibc on its architecture, or the same OS, architecture and libc otherwise."""
    from packaging import tags as pkgtags

    from harness.resolve.interpreter import default_platform_from_tags, parse_platform

    found = list(pkgtags.platform_tags()) if host_tags is None else host_tags
    target = parse_platform(platform)
    if target.libc == "gnu":
        return f"manylinux_2_{target.glibc_minor}_{target.arch}" in found
    try:
        host = parse_platform(default_platform_from_tags(found))
    except HarnessError:
        return False
    return (host.os, host.arch, host.libc) == (target.os, target.arch, target.libc)


def host_platform_of(lock: Lock, host_tags: list[str] | None = None) -> str | None:
    """The first of ``lock``'s platforms this machine runs, or None."""
    return next((p for p in platforms_of(lock) if fits_host(p, host_tags)), None)


def for_host(lock: Lock, path: Path | None = None) -> Lock:
    """``lock`` for this machine (:func:`host_platform_of`); a clear HarnessError when it
    holds nothing this machine runs."""
    platform = host_platform_of(lock)
    if platform is None:
        raise no_platform_error(lock, path)
    return for_platform(lock, platform)


def no_platform_error(lock: Lock, path: Path | None = None) -> HarnessError:
    from harness.resolve.interpreter import host_platform

    try:
        here = host_platform()
    except HarnessError:
        here = "this machine's platform"
    where = str(path) if path is not None else f"the lock of {lock.name}"
    return HarnessError(
        f"{where} holds {', '.join(platforms_of(lock))}, and nothing for this machine ({here})",
        hint=f'add "{here}" to [lock] platforms in harness.toml and run `harness lock`',
    )
