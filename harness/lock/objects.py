"""Which store paths a lock's environment is made of: its runtime closure (the sources,
weights and views, the interpreter and the environment: :func:`lock_objects`) and the build
inputs it is installed from (the one file of each locked package a target installs, the
wheels built from sdists: :func:`build_inputs`). Pure.

Below both realize (which builds these paths) and the binary caches (which substitute them
and check what they pull against the lock's hashes, :mod:`harness.cache.substitute`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
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
    """The runtime closure of the lock's environment, in build order: the sources, weights
    and views, the interpreter and the environment. What a launch, a run record, a push and
    the roots of a process using the environment need. The files the environment was
    installed from are not in it (:func:`build_inputs`): the environment's record references
    none of them, so a realized environment runs, verifies and is audited without them."""
    from harness.lock.storepaths import view_paths

    names = [s.store for s in lock.sources]
    names += [w.store for w in lock.weights]
    names += view_paths(lock)
    names += [lock.python.store]
    names += [lock.environment.store]
    return list(dict.fromkeys(names))


def build_inputs(lock: Lock) -> list[str]:
    """The store paths the lock's environment is built from and only built from: the one
    file of each package (and build package) a target installs, and the wheels built from
    sdists. A realize that must build the environment needs them (:func:`needed_build_inputs`);
    a realized environment does not. Pure."""
    names = [chosen_file(p, lock).store for p in [*lock.packages, *lock.build_packages]]
    names += [name for _, name in built_wheels(lock)]
    return list(dict.fromkeys(names))


def needed_build_inputs(lock: Lock, registered: Callable[[str], bool], also: Collection[str] = ()) -> list[str]:
    """The build inputs (:func:`build_inputs`) a realize needs given what is ``registered``:
    none when the environment is; else every package's file and built wheel, but the sdist a
    registered built wheel was made from. ``also``: build inputs wanted all the same (a repair
    registers again what it deleted), with what building them takes. Pure but for asking
    ``registered``."""
    wanted = set(also)
    built = built_wheels(lock)
    names: list[str] = []
    if not registered(lock.environment.store):
        done = {chosen_file(p, lock).store for p, name in built if registered(name)}
        names = [chosen_file(p, lock).store for p in [*lock.packages, *lock.build_packages]]
        names = [name for name in names if name not in done]
        names += [name for _, name in built]
    for package, name in built:
        if name in wanted and not registered(name):
            names += [chosen_file(package, lock).store, name]
            for needed in build_set(package.build_requires, lock):
                names.append(chosen_file(needed, lock).store)
                names += [n for n in [built_wheel_path(needed, lock)] if n is not None]
    names += [name for name in build_inputs(lock) if name in wanted]
    return list(dict.fromkeys(names))


def all_objects(lock: Lock) -> list[str]:
    """The runtime closure and every build input: what a realize of ``lock`` may use. Pure."""
    return list(dict.fromkeys([*build_inputs(lock), *lock_objects(lock)]))
