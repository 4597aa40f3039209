"""Projecting a several-platform lock onto one of its platforms. Pure.

Below :mod:`harness.lock.storepaths` and :mod:`harness.lock.platforms`: the store paths of a
several-platform lock's targets are those of each target's projection, and
:func:`harness.lock.platforms.for_platform` is a projection with its store paths assigned.
"""

from __future__ import annotations

from harness.errors import HarnessError
from harness.lock.document import Lock, LockedPackage


def platforms_of(lock: Lock) -> list[str]:
    """The platforms a lock holds, in order (each once, however many variants it has)."""
    return list(dict.fromkeys(t.platform for t in lock.targets)) or [lock.python.platform]


def variants_of(lock: Lock, platform: str) -> list[tuple[str, str | None]]:
    """The accelerator variants ``lock`` holds for ``platform``, in order, each with the CUDA
    version it needs (None: it runs anywhere): its wheels' metadata where the lock recorded it,
    the manifest's declaration otherwise (``needs_cuda``); [] for a lock without variants."""
    if not lock.targets:
        return [(lock.variant, lock.needs_cuda)] if lock.variant else []
    return [(t.variant, t.needs_cuda) for t in lock.targets if t.platform == platform and t.variant]


def cuda_source_of(lock: Lock, platform: str, variant: str) -> str:
    """Which source decided what ``variant`` of ``lock`` on ``platform`` needs of the driver
    (:func:`harness.lock.variants.cuda_source`): for ``plan`` and ``doctor``."""
    from harness.lock.variants import cuda_source

    for t in lock.targets or []:
        if t.platform == platform and t.variant == variant:
            return cuda_source(t.cuda, list(t.wheel_variants))
    return cuda_source(lock.cuda, list(lock.wheel_variants))


def project_platform(lock: Lock, platform: str, variant: str = "") -> Lock:
    """The packages of ``lock`` (one of whose targets is ``platform``, of ``variant`` in a lock
    of accelerator variants) that the target takes, with the wheels that fit it (the sdist only
    where none does), as a single-target lock whose store paths are not yet assigned
    (:func:`harness.lock.storepaths.assign_store_paths` does that;
    :func:`harness.lock.platforms.for_platform` is both). Pure."""
    from harness.resolve.interpreter import target_tags
    from harness.resolve.python import wheel_fits

    if not lock.targets:
        if platform != lock.python.platform:
            raise HarnessError(f"lock {lock.name} holds {lock.python.platform} only, not {platform}")
        if variant and variant != lock.variant:
            raise HarnessError(f"lock {lock.name} holds variant {lock.variant or '(none)'} only, not {variant}")
        return lock
    target = next((t for t in lock.targets if t.platform == platform and t.variant == variant), None)
    if target is None:
        held = ", ".join(f"{t.platform}{f' ({t.variant})' if t.variant else ''}" for t in lock.targets)
        wanted = f"{platform}{f' ({variant})' if variant else ''}"
        raise HarnessError(f"lock {lock.name} holds {held}, not {wanted}")
    tags = target_tags(lock.python.version, platform)

    def keep(packages: list[LockedPackage]) -> list[LockedPackage]:
        out = []
        for package in packages:
            if package.platforms and platform not in package.platforms:
                continue
            if package.variants and variant not in package.variants:
                continue
            wheels = [w for w in package.wheels if wheel_fits(w.file, tags)]
            # A wheel fits: nothing is built, so no build set (as locking this platform alone writes).
            out.append(
                package.model_copy(
                    update={
                        "platforms": [],
                        "variants": [],
                        "wheels": wheels,
                        "sdist": None if wheels else package.sdist,
                        "build_requires": [] if wheels else package.build_requires,
                    }
                )
            )
        return out

    return lock.model_copy(
        update={
            "targets": [],
            "python": lock.python.model_copy(update={"platform": platform, "source": target.source}),
            "variant": target.variant,
            "cuda": target.cuda,
            "wheel_variants": target.wheel_variants,
            "packages": keep(lock.packages),
            "build_packages": keep(lock.build_packages),
        }
    )
