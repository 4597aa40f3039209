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
from harness.lock.variants import Choice

__all__ = ["platforms_of", "merge", "for_platform", "fits_host", "host_platform_of", "for_host", "no_platform_error"]


def merge(locks: list[Lock]) -> Lock:
    """One lock for the targets of ``locks`` (single-target locks of one manifest: each of
    ``[lock] platforms``, in order, and for a manifest with accelerator variants each variant
    on each platform); a single lock is returned as it is (module doc)."""
    if len(locks) == 1:
        return locks[0]
    first = locks[0]
    versions = {lock.python.version for lock in locks}
    if len(versions) != 1:
        raise HarnessError(
            f"the platforms lock different Python versions ({', '.join(sorted(versions))})",
            hint="pin the version in harness.toml: [lock.python]",
        )
    keys = [(lock.python.platform, lock.variant) for lock in locks]
    return assign_store_paths(
        first.model_copy(
            update={
                "targets": [
                    LockedTarget(
                        platform=lock.python.platform,
                        source=lock.python.source,
                        variant=lock.variant,
                        cuda=lock.cuda,
                        wheel_variants=lock.wheel_variants,
                    )
                    for lock in locks
                ],
                "packages": _merge_packages([lock.packages for lock in locks], keys),
                "build_packages": _merge_packages([lock.build_packages for lock in locks], keys),
            }
        )
    )


def _merge_packages(per_target: list[list[LockedPackage]], keys: list[tuple[str, str]]) -> list[LockedPackage]:
    """One entry per pin, saying where it holds: ``platforms`` and ``variants`` (empty: every
    one). A pin held on a set of targets that is no platforms × variants product (another
    version on one platform's cu128 alone) is one entry per platform."""
    every_platform = list(dict.fromkeys(platform for platform, _ in keys))
    every_variant = list(dict.fromkeys(variant for _, variant in keys))
    # A pin whose sdist builds from another build set on one platform is an entry of its own.
    groups: dict[tuple[str, str, str, str, tuple[str, ...]], list[tuple[tuple[str, str], LockedPackage]]] = {}
    for key, packages in zip(keys, per_target, strict=True):
        for package in packages:
            pin = (package.name, package.version, package.marker, package.index, tuple(package.build_requires))
            groups.setdefault(pin, []).append((key, package))
    merged = []
    for members in groups.values():
        where = [key for key, _ in members]
        platforms = [p for p in every_platform if any(k[0] == p for k in where)]
        variants = [v for v in every_variant if any(k[1] == v for k in where)]
        product = len(where) == len(platforms) * len(variants)
        parts = (
            [(platforms, variants)]
            if product
            else [([p], [v for v in every_variant if (p, v) in where]) for p in platforms]
        )
        for part_platforms, part_variants in parts:
            held = [package for key, package in members if key[0] in part_platforms and key[1] in part_variants]
            wheels = {w.file: w for p in held for w in p.wheels}
            sdists = [p.sdist for p in held if p.sdist is not None]
            merged.append(
                held[0].model_copy(
                    update={
                        "platforms": [] if part_platforms == every_platform else part_platforms,
                        "variants": [] if part_variants == every_variant else part_variants,
                        "wheels": [wheels[name] for name in sorted(wheels)],
                        "sdist": sdists[0] if sdists else None,
                    }
                )
            )
    return merged


def for_platform(lock: Lock, platform: str, variant: str = "") -> Lock:
    """The single-target lock of ``platform`` (of ``variant``, in a lock of accelerator
    variants), one of ``lock``'s targets (module doc)."""
    return assign_store_paths(project_platform(lock, platform, variant))


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
    """``lock`` for this machine (:func:`host_platform_of`), of the accelerator variant it
    runs (:func:`host_variant_of`); a clear HarnessError when it holds nothing this machine runs."""
    platform = host_platform_of(lock)
    if platform is None:
        raise no_platform_error(lock, path)
    choice = host_variant_of(lock, platform, path)
    if not lock.targets:
        return lock
    return for_platform(lock, platform, choice.variant if choice is not None else "")


def host_variant_of(lock: Lock, platform: str, path: Path | None = None) -> Choice | None:
    """The accelerator variant of ``lock`` for ``platform`` this machine runs, and why
    (``harness/lock/variants.py``); None for a lock without variants."""
    from harness.lock.projection import variants_of
    from harness.lock.variants import choose_variant, driver_cuda, forced_variant

    variants = variants_of(lock, platform)
    if not variants:
        return None
    what = f"lock {lock.name}" + (f" ({path})" if path is not None else "")
    return choose_variant(variants, driver=driver_cuda(), forced=forced_variant(), what=what)


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
