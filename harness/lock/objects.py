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


#: Bump when the meaning of a built wheel's inputs changes (how realize builds it).
BUILT_WHEEL_SCHEME = 1


def built_wheel_path(package: LockedPackage, lock: Lock) -> str | None:
    """The store path of the wheel realize builds from ``package``'s sdist: a derived path
    (``built-wheel``) of its own, so a store builds it once for every environment that installs
    it and a binary cache carries it. None when the package installs a wheel, or when its
    sdist is built against the environment (``build-isolation = false``: it is built inside
    the environment's own build, from what is installed there). Pure.

    Named by what the build reads: the sdist's store path (its sha256), the interpreter it is
    built with (``lock.python.store``: a host copy standing in gives another path), the store
    paths of the files of its build packages (:func:`build_set`: its isolated build
    environment may take any of them) and the uv version that drives the build."""
    if not package.build_isolation or package.wheels or package.sdist is None:
        return None
    file = package.sdist
    from harness.store.hashing import sanitize_name, store_hash, store_path_name

    name = sanitize_name(f"{package.name}-{package.version}-wheel")
    inputs = {
        "scheme": BUILT_WHEEL_SCHEME,
        "sdist": file.store,
        "python": lock.python.store,
        "build": sorted({chosen_file(p, lock).store for p in build_set(package.build_requires, lock)}),
        "uv": lock.uv,
    }
    return store_path_name(store_hash("built-wheel", name, inputs), name)


def build_set(requires: list[str], lock: Lock) -> list[LockedPackage]:
    """The build packages of ``lock`` that a build naming ``requires`` (``name==version``, a
    package's or a source's ``build-requires``) is made of; every build package when
    ``requires`` is empty (a lock written before each build named its own). Pure."""
    if not requires:
        return list(lock.build_packages)
    wanted = set(requires)
    return [p for p in lock.build_packages if f"{p.name}=={p.version}" in wanted]


def built_wheels(lock: Lock) -> list[tuple[LockedPackage, str]]:
    """Each package of ``lock`` (build packages first: the others' builds may need them) that
    installs a wheel built from its sdist, with that wheel's store path. Pure."""
    found = []
    for package in [*lock.build_packages, *lock.packages]:
        name = built_wheel_path(package, lock)
        if name is not None:
            found.append((package, name))
    return found


def lock_objects(lock: Lock) -> list[str]:
    """Every store path the lock's environment needs, in build order."""
    from harness.lock.storepaths import view_paths

    names = [chosen_file(p, lock).store for p in [*lock.packages, *lock.build_packages]]
    names += [s.store for s in lock.sources]
    names += [w.store for w in lock.weights]
    names += view_paths(lock)
    names += [lock.python.store]
    names += [name for _, name in built_wheels(lock)]
    names += [lock.environment.store]
    return list(dict.fromkeys(names))
