"""Which store paths a lock's environment is made of: the one file of each locked package
a target installs, the sources, weights and views, the interpreter and the environment. Pure.

Below both realize (which builds these paths) and the binary caches (which substitute them
and check what they pull against the lock's hashes, :mod:`harness.cache.substitute`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from harness.errors import HarnessError

if TYPE_CHECKING:  # the types only: realize's no-op path loads this module without pydantic
    from packaging.tags import Tag

    from harness.lock.document import Lock, LockedFile, LockedPackage


@functools.lru_cache(maxsize=16)
def _tag_ranking(version: str, platform: str) -> dict[Tag, int]:
    """Each wheel tag the target accepts and its rank (0 best). Cached: a realize asks for
    every package of every lock several times, and building the list takes milliseconds."""
    from harness.resolve.interpreter import ranked_target_tags

    return {tag: i for i, tag in enumerate(ranked_target_tags(version, platform))}


def chosen_file(package: LockedPackage, lock: Lock) -> LockedFile:
    """The one file of ``package`` the environment installs: the best-ranked wheel for the
    lock's target (as an installer would choose), else the sdist. Pure."""
    from packaging.utils import parse_wheel_filename

    if package.wheels:
        ranking = _tag_ranking(lock.python.version, lock.python.platform)

        def rank(file: LockedFile) -> tuple[int, str]:
            tags = parse_wheel_filename(file.file)[3]
            return (min((ranking.get(t, len(ranking)) for t in tags), default=len(ranking)), file.file)

        return min(package.wheels, key=rank)
    if package.sdist is None:
        raise HarnessError(f"locked package {package.name} {package.version} has no file")
    return package.sdist


def lock_objects(lock: Lock) -> list[str]:
    """Every store path the lock's environment needs, in build order."""
    from harness.lock.storepaths import view_paths

    names = [chosen_file(p, lock).store for p in [*lock.packages, *lock.build_packages]]
    names += [s.store for s in lock.sources]
    names += [w.store for w in lock.weights]
    names += view_paths(lock)
    names += [lock.python.store, lock.environment.store]
    return list(dict.fromkeys(names))
