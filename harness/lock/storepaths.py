"""Which store path each object of a lock realizes to: a pure function of the lock.

The scheme (specified with golden vectors in ``store/README.md``):

* leaf objects are **fixed-output**: their path depends only on what their bytes must be —
  a wheel on its file name and sha256, a source on its tree hash, a weight set on its files'
  paths, sizes and sha256. Where the bytes came from (which index, hub or mirror) is not an
  input, so a mirror realizes the same paths.
* the interpreter depends on implementation, version and platform (and, for a lock whose
  interpreter can only come from the host, on that: ``source = "host"``);
* a **host copy** standing in for the lock's interpreter on one machine (realize's fallback,
  see ``harness/realize/standin.py``) is named by its own content, ``<hash>-cpython-<version>-host``:
  never the lock's name, so a store or a binary cache can never hold two contents under one
  name; the environment built on it gets its own path too (:func:`with_interpreter`);
* the environment depends on the store paths of everything in it, how sources are installed,
  and the uv version that builds it (uv writes the venv's files).

Store paths are names, not locations: ``<hash>-<name>``, the same in every ``HARNESS_HOME``.
"""

from __future__ import annotations

from harness.lock.document import (
    Lock,
    LockedFile,
    LockedInterpreter,
    LockedPackage,
    LockedSource,
    LockedWeights,
)
from harness.store.hashing import store_hash, store_path_name

#: Bump when the meaning of an environment's inputs changes (its layout, its build steps).
ENVIRONMENT_SCHEME = 1


def file_path(file: LockedFile) -> str:
    """A wheel's or sdist's store path: fixed by its name and sha256."""
    return store_path_name(store_hash("file", file.file, {"sha256": file.sha256}), file.file)


def source_path(source: LockedSource) -> str:
    """A source tree's store path: fixed by its tree hash (the commit's content)."""
    return store_path_name(store_hash("source", source.name, {"tree": source.tree}), source.name)


def weights_path(lock_name: str, weights: LockedWeights) -> str:
    """A weight set's store path: fixed by its files (path, size, sha256)."""
    name = f"{lock_name}-{weights.dir.replace('/', '-')}"
    files = [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in weights.files]
    return store_path_name(store_hash("weights", name, {"files": files}), name)


#: The suffix of a host copy's name (``<hash>-cpython-3.11.7-host``).
HOST_SUFFIX = "-host"


def interpreter_path(lock: Lock) -> str:
    """The lock's own interpreter: fixed by implementation, version and platform.

    A ``source = "host"`` lock (a version uv cannot download) gets ``source`` as one more
    input, so its name never equals the uv-managed interpreter's of the same version; no
    store ever registers it (realize always stands a content-named host copy in for it)."""
    python = lock.python
    name = f"{python.implementation}-{python.version}"
    inputs: dict[str, object] = {
        "implementation": python.implementation,
        "version": python.version,
        "platform": python.platform,
    }
    if python.source != "uv-managed":
        inputs["source"] = python.source
    return store_path_name(store_hash("python", name, inputs), name)


def host_interpreter_path(python: LockedInterpreter, content: str) -> str:
    """The store path of a host copy of CPython ``python.version`` whose content hash is
    ``content`` (``blake3:…``): the copy is fixed-output, named by what it is, so two machines
    whose host interpreters copy to the same bytes share it and no other bytes can take it."""
    name = f"{python.implementation}-{python.version}{HOST_SUFFIX}"
    inputs = {
        "implementation": python.implementation,
        "version": python.version,
        "platform": python.platform,
        "content": content,
    }
    return store_path_name(store_hash("python", name, inputs), name)


def is_host_interpreter(store_name: str) -> bool:
    """Whether a ``python`` store path name is a host copy's (:func:`host_interpreter_path`)."""
    return store_name.endswith(HOST_SUFFIX)


def _with_file_paths(package: LockedPackage) -> LockedPackage:
    wheels = [w.model_copy(update={"store": file_path(w)}) for w in sorted(package.wheels, key=lambda w: w.file)]
    sdist = package.sdist.model_copy(update={"store": file_path(package.sdist)}) if package.sdist else None
    return package.model_copy(update={"wheels": wheels, "sdist": sdist})


def _package_key(package: LockedPackage) -> dict[str, object]:
    files = [w.store for w in package.wheels] or ([package.sdist.store] if package.sdist else [])
    key: dict[str, object] = {
        "name": package.name,
        "version": package.version,
        "marker": package.marker,
        "files": sorted(files),
    }
    if not package.build_isolation:  # only when off: other environments keep their paths
        key["build-isolation"] = False
    if package.build_requires:  # only where named: environments of older locks keep their paths
        key["build-requires"] = sorted(package.build_requires)
    return key


def assign_store_paths(lock: Lock) -> Lock:
    """A copy of ``lock`` in canonical order with every ``store`` field filled in.

    Pure and deterministic; packages, wheels and weight files come out sorted, so the lock
    in memory equals the lock read back from its file.
    """
    order = lambda p: (p.name, p.version, p.marker, p.platforms, p.variants)  # noqa: E731
    packages = [_with_file_paths(p) for p in sorted(lock.packages, key=order)]
    build_packages = [_with_file_paths(p) for p in sorted(lock.build_packages, key=order)]
    sources = [s.model_copy(update={"store": source_path(s)}) for s in lock.sources]
    weights = []
    for weight_set in lock.weights:
        files = sorted(weight_set.files, key=lambda f: f.path)
        ordered = weight_set.model_copy(update={"files": files})
        weights.append(ordered.model_copy(update={"store": weights_path(lock.name, ordered)}))
    if lock.targets:
        # Several platforms: each target's paths are those of its own single-platform lock
        # (harness.lock.platforms), and python/environment repeat the first target's.
        from harness.lock.projection import project_platform

        common = lock.model_copy(
            update={"packages": packages, "build_packages": build_packages, "sources": sources, "weights": weights}
        )
        targets = []
        for target in lock.targets:
            alone = assign_store_paths(project_platform(common, target.platform, target.variant))
            targets.append(
                target.model_copy(update={"python": alone.python.store, "environment": alone.environment.store})
            )
        first = targets[0]
        return common.model_copy(
            update={
                "targets": targets,
                "variant": first.variant,
                "cuda": first.cuda,
                "wheel_variants": first.wheel_variants,
                "python": lock.python.model_copy(
                    update={"platform": first.platform, "source": first.source, "store": first.python}
                ),
                "environment": lock.environment.model_copy(update={"store": first.environment}),
            }
        )
    python = lock.python.model_copy(update={"store": interpreter_path(lock)})
    assigned = lock.model_copy(
        update={
            "python": python,
            "packages": packages,
            "build_packages": build_packages,
            "sources": sources,
            "weights": weights,
        }
    )
    return with_interpreter(assigned, python.store)


def environment_path_before_sdist_builds(lock: Lock) -> str:
    """The environment path a harness from before sdists were built into wheels first gave
    a single-platform ``lock`` (``lock --check`` tells such a lock by it). Pure."""
    return _environment_path(lock, lock.python.store, sdists_first=False)


def _environment_path(lock: Lock, python_store: str, *, sdists_first: bool = True) -> str:
    """The environment's store path when built on interpreter ``python_store`` (the lock's
    packages and sources must already carry their store paths)."""
    env_inputs = {
        "scheme": ENVIRONMENT_SCHEME,
        "uv": lock.uv,
        "python": python_store,
        "packages": sorted((_package_key(p) for p in lock.packages), key=repr),
        "build": sorted((_package_key(p) for p in lock.build_packages), key=repr),
        # Only for a lock installing an sdist (other environments keep their paths): its sdists
        # are built into wheels first, offline from the build packages alone (realize.environment).
        **({"sdists": "built-first"} if sdists_first and any(p.sdist and not p.wheels for p in lock.packages) else {}),
        "sources": [
            {
                "store": s.store,
                "install": s.install,
                "subdirectory": s.subdirectory or "",
                # only when off, so environments of sources without the key keep their paths
                **({} if s.build_isolation else {"build-isolation": False}),
                **({"build-requires": sorted(s.build_requires)} if s.build_requires else {}),
                # the path sources' .pth sorts first (realize.environment.PATH_SOURCES_PTH);
                # environments built before that order are another layout, so another path
                **({"pth": "first"} if s.install == "path" else {}),
                # a path source with links is on sys.path as its view
                **({"view": view} if s.install == "path" and (view := source_view_path(lock, s)) else {}),
            }
            for s in lock.sources
        ],
    }
    env_name = f"{lock.name}-env"
    return store_path_name(store_hash("environment", env_name, env_inputs), env_name)


def with_interpreter(lock: Lock, python_store: str) -> Lock:
    """``lock`` (store paths assigned) as built on interpreter ``python_store``: that
    interpreter's path and the environment path that follows from it. Pure. With the lock's
    own interpreter path this is the lock itself; with a host copy's it is what one machine
    realizes in its place (``harness/realize/standin.py``)."""
    python = lock.python.model_copy(update={"store": python_store})
    environment = lock.environment.model_copy(update={"store": _environment_path(lock, python_store)})
    return lock.model_copy(update={"python": python, "environment": environment})


def link_target(lock: Lock, target: str) -> tuple[str, str]:
    """The weight set's store path and the path inside it that a source link's ``target`` (a
    path in the weights view: ``robodojo/Assets``) names; the innermost set wins.

    :class:`~harness.errors.InputError` when no weight set of ``lock`` holds it (a hand-edited
    lock: the manifest's own check refuses such a link before anything is locked)."""
    for weights in sorted(lock.weights, key=lambda w: -len(w.dir)):
        folder = weights.dir.strip("/")
        if target == folder:
            return weights.store, ""
        if target.startswith(folder + "/"):
            return weights.store, target[len(folder) + 1 :]
    from harness.errors import InputError

    raise InputError(f"lock {lock.name}: source link target {target!r} is in none of its weight sets")


def source_view_path(lock: Lock, source: LockedSource) -> str | None:
    """The store path of ``source``'s view: its checkout with its ``links`` added
    (``harness/realize/views.py``). None for a source without links.

    Depends on the checkout's store path and, per link, the weight set's store path and the
    path inside it: like the weights view, it relocates with them."""
    if not source.links:
        return None
    name = f"{source.name}-view"
    links = {path: list(link_target(lock, target)) for path, target in sorted(source.links.items())}
    return store_path_name(store_hash("source-view", name, {"source": source.store, "links": links}), name)


def source_folders(lock: Lock) -> list[str]:
    """What each of ``lock``'s sources is used as, in order: its view where it has links
    (``{source:NAME}``, the path sources' ``.pth``), else its checkout."""
    return [source_view_path(lock, s) or s.store for s in lock.sources]


def view_paths(lock: Lock) -> list[str]:
    """The store paths of ``lock`` that are made of links to its other paths: the weights view
    and the source views, in build order (after the weight sets and sources they name)."""
    views = [weights_view_path(lock), *(source_view_path(lock, s) for s in lock.sources)]
    return [v for v in views if v]


def weights_view_path(lock: Lock) -> str | None:
    """The store path of the folder ``{weights}`` names: one relative link per weight set.

    Depends only on the dirs and the weight sets' store paths, so it relocates with them.
    None when the lock has no weights.
    """
    if not lock.weights:
        return None
    name = f"{lock.name}-weights"
    links = {w.dir: w.store for w in lock.weights}
    return store_path_name(store_hash("weights-view", name, {"links": links}), name)
