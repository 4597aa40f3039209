"""The store paths every target of a lock realizes to: each (platform, accelerator variant). Pure.

A cluster run's nodes need not all be the head's machine: an aarch64 robot computer and x86
servers share a two-platform lock, a server with a CUDA 12.8 driver and a laptop without a GPU
share a lock of variants. Each node is proven against the closure of the target it runs, and
that closure follows from the lock alone: :func:`target_paths` is, for every target the lock
holds, what :func:`harness.lock.objects.lock_objects` names for its projection
(:func:`harness.lock.platforms.for_platform`), built on the host copy that stands in for the
target's own interpreter where one does (:func:`harness.lock.storepaths.with_interpreter`, as
``harness/realize/standin.py`` realizes it), and a digest over those paths.

Only the paths follow from the lock: the content hash of an environment is known once it is
built. A node's bits are checked against what the head realized where the two share a path,
and against each other within one target (``harness/runs/groups.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from harness.lock.document import Lock


@dataclass(frozen=True)
class TargetPaths:
    """One target of a lock and the store paths its environment is made of."""

    platform: str
    variant: str  # "" for a lock without variants
    cuda: str | None  # the CUDA version the driver must support (None: anywhere): ``needs_cuda``
    own_interpreter: str  # the lock's own interpreter for this target
    interpreter: str  # what it is built on: the own one, or the host copy standing in
    environment: str
    paths: tuple[str, ...]  # in build order (lock_objects)

    @property
    def digest(self) -> str:
        """blake3 over the sorted store paths: equal digests, equal store path names (whose
        hashes are those of every input: the same pins, files, sources and interpreter)."""
        return paths_digest(self.paths)


def paths_digest(paths: Iterable[str]) -> str:
    """blake3 over the sorted store path names ``paths`` (each once)."""
    from blake3 import blake3

    names = sorted(set(paths))
    return "blake3:" + blake3(json.dumps(names).encode()).hexdigest()


def target_keys(lock: Lock) -> list[tuple[str, str, str | None]]:
    """(platform, variant, cuda) of every target ``lock`` (as written, not projected) holds,
    in order, cuda as the driver must support it (the wheels' metadata, else the manifest's);
    one for a single-target lock."""
    if lock.targets:
        return [(t.platform, t.variant, t.needs_cuda) for t in lock.targets]
    return [(lock.python.platform, lock.variant, lock.needs_cuda)]


def target_paths(lock: Lock, standins: Mapping[str, str] | None = None) -> list[TargetPaths]:
    """For every target of ``lock`` (as written: ``read(path, whole=True)``), the store paths
    it realizes to; where ``standins`` (lock interpreter → host copy) names a copy standing in
    for the target's own interpreter, the paths as built on that copy. Pure."""
    from harness.lock.objects import lock_objects
    from harness.lock.platforms import for_platform
    from harness.lock.storepaths import interpreter_path, with_interpreter

    found = []
    for platform, variant, cuda in target_keys(lock):
        single = for_platform(lock, platform, variant) if lock.targets else lock
        own = interpreter_path(single)
        host = (standins or {}).get(own)
        built = with_interpreter(single, host) if host else with_interpreter(single, own)
        found.append(
            TargetPaths(
                platform=platform,
                variant=variant,
                cuda=cuda,
                own_interpreter=own,
                interpreter=built.python.store,
                environment=built.environment.store,
                paths=tuple(lock_objects(built)),
            )
        )
    return found
