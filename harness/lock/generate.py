"""Generating locks: manifests in, lockfiles out, upstreams read through the resolvers.

This is the I/O edge of locking. Per manifest, in order:

1. the interpreter (``resolve.interpreter``): the request resolved to an exact version for
   the target platform (a previous lock's version is kept unless upgrading);
2. git sources (``resolve.git``): each rev to a commit and the content hash of its tree;
   sources that are Python projects are exported so uv resolves their dependencies, and
   their build requirements are resolved too (``build-packages``) so realize can build them
   offline;
3. Python packages (``resolve.python``): uv resolves, harness records files and hashes;
4. weights (``resolve.weights``): hub revisions to commits, every file hashed;
5. store paths (``lock.storepaths``), a pure function of all of the above.

Nothing is written unless the whole manifest locked: the old lock stays on any failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from harness.config import Settings
from harness.errors import HarnessError, InputError, unknown_names
from harness.lock.document import (
    LINKS_LOCK_VERSION,
    LOCK_VERSION,
    Lock,
    LockedFile,
    LockedInterpreter,
    LockedPackage,
    LockedSource,
    LockedSubmodule,
    LockedWeightFile,
    LockedWeights,
)
from harness.lock.digest import manifest_digest
from harness.lock.lockfile import lock_path, read, write
from harness.lock.outcome import LockOptions as LockOptions
from harness.lock.outcome import Outcome as Outcome
from harness.lock.storepaths import assign_store_paths
from harness.manifests.model import BenchmarkManifest, Environment, ServiceManifest, Source
from harness.manifests.project import Project
from harness.resolve.pins import DistFile, GitSource, Interpreter, Package, WeightSet

if TYPE_CHECKING:
    from harness.resolve.interpreter import PythonListing
    from harness.resolve.sdists import SdistOptions

Manifest = ServiceManifest | BenchmarkManifest


def load_manifests(project: Project) -> dict[str, tuple[str, Manifest]]:
    """Every manifest of the project: name → (type, manifest)."""
    found: dict[str, tuple[str, Manifest]] = {}
    for name, manifest in project.load_services().items():
        found[name] = ("service", manifest)
    for name, benchmark in project.load_benchmarks().items():
        found[name] = ("benchmark", benchmark)
    return found


def select(found: dict[str, tuple[str, Manifest]], names: list[str]) -> list[str]:
    """The names to lock: all when none given; an unknown name is an error."""
    if not names:
        return sorted(found)
    unknown = [n for n in names if n not in found]
    if unknown:
        raise unknown_names("manifest", unknown, set(found))
    return list(dict.fromkeys(names))


def lock_project(
    project: Project,
    names: list[str],
    *,
    settings: Settings,
    cache_dir: Path,
    options: LockOptions,
    on_done: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Lock the named manifests (all when empty), in parallel; each outcome says what happened.

    A manifest that fails keeps its old lock; others still lock. A manifest none of whose
    inputs changed since its last lock keeps it without resolving (:mod:`harness.lock.stamp`),
    unless ``options`` ask to resolve anyway.
    """
    from harness.lock.stamp import LockStamps

    stamps = LockStamps(cache_dir, project, platform=options.platform)
    snapshot = stamps.snapshot()  # before any manifest is read: what the locks are made from
    found = load_manifests(project)
    chosen = select(found, names)
    lock_targets(settings, options)  # a bad platform setting: one clear error, before any work
    made: dict[str, Lock] = {}

    def one(name: str) -> Outcome:
        kind, manifest = found[name]
        path = lock_path(project.locks_dir, name)
        if snapshot is not None and not options.resolves_anyway:
            kept = stamps.unchanged(name, _manifest_file(project, name, kind), snapshot.common)
            if kept is not None:
                if on_done is not None:
                    on_done(kept)
                return kept
        outcome = Outcome(name, path)
        try:
            if snapshot is not None:
                stamps.before_resolving(snapshot, name, manifest)
            previous = _previous(path)
            lock = lock_manifest(
                project,
                name,
                kind,
                manifest,
                settings=settings,
                cache_dir=cache_dir,
                options=options,
                previous=previous,
            )
            outcome.changed = write(path, lock)
            outcome.lock = lock
            outcome.environment = lock.environment.store
            made[name] = lock
            if outcome.changed:
                from harness.lock.changes import lock_changes

                outcome.changes = lock_changes(previous, lock)
        except HarnessError as exc:
            outcome.error = str(exc)
        if on_done is not None:
            on_done(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        outcomes = list(pool.map(one, chosen))
    if snapshot is not None and made:
        stamps.save(snapshot, made)
    return outcomes


def _manifest_file(project: Project, name: str, kind: str) -> Path:
    return (project.services_dir if kind == "service" else project.benchmarks_dir) / f"{name}.toml"


def _previous(path: Path) -> Lock | None:
    if not path.is_file():
        return None
    try:
        return read(path, whole=True)
    except HarnessError:
        return None  # a corrupt old lock is replaced, not trusted for preferences


def lock_manifest(
    project: Project,
    name: str,
    kind: str,
    manifest: Manifest,
    *,
    settings: Settings,
    cache_dir: Path,
    options: LockOptions,
    previous: Lock | None = None,
) -> Lock:
    """Lock one manifest; raises HarnessError (prefixed with the manifest) on any failure."""
    try:
        return _lock_manifest(
            project, name, kind, manifest, settings=settings, cache_dir=cache_dir, options=options, previous=previous
        )
    except HarnessError as exc:
        label = f"services/{name}.toml" if kind == "service" else f"benchmarks/{name}.toml"
        raise HarnessError(f"{label}: {exc.message}", hint=exc.hint) from None


def _lock_manifest(
    project: Project,
    name: str,
    kind: str,
    manifest: Manifest,
    *,
    settings: Settings,
    cache_dir: Path,
    options: LockOptions,
    previous: Lock | None,
) -> Lock:
    """The steps of the module doc, with what is independent run side by side: the interpreter
    listings, uv's version and every weight set in threads (:func:`_start_side_jobs`), git
    sources here, then every platform's (and accelerator variant's) Python resolution, each
    going on to its sdists' build sets as soon as it is done (:class:`_TargetPipeline`), as
    many at once as there are cores. Errors are raised in the order of the steps, whichever
    finished first. Several platforms give one lock (:func:`harness.lock.platforms.merge`)."""
    from harness.lock.platforms import merge

    run = _Locking(project, settings, cache_dir, options, previous)
    environment = manifest.environment
    targets = lock_targets(settings, options)
    version = _python_version(environment.python, run)
    workers = min(16, 2 + len(manifest.weights) + 3 * len(targets))
    with (
        ThreadPoolExecutor(max_workers=workers) as pool,
        tempfile.TemporaryDirectory(prefix="harness-lock-") as scratch,
    ):
        side = _start_side_jobs(pool, manifest, targets, version.pin, run)
        with side.interpreter_errors_first():
            sources = _sources(environment, Path(scratch), settings=settings, cache_dir=cache_dir, options=options)
            # With the exact version known up front, resolve while uv lists interpreters (the
            # listing only says where the interpreter comes from, and checks that it exists).
            guesses = _known_interpreters(version.exact, targets) if version.exact is not None else side.interpreters()
            # Each accelerator variant is resolved as an environment of its own (its platforms
            # side by side), in the manifest's order.
            variants = {v: environment.for_variant(v) for v in environment.variants} or {"": environment}
            pipelines = [
                _TargetPipeline(
                    dataclasses.replace(run, variant=v), env, t, guesses[t], sources, side, pool, Path(scratch)
                )
                for v, env in variants.items()
                for t in targets
            ]
            _run_pipelines(pipelines)
            _raise_first(p.failed for p in pipelines if p.failed_resolving)
        interpreters = side.interpreters()
        _raise_first(p.failed for p in pipelines)
        by_variant: dict[str, dict[str, _Resolution]] = {v: {} for v in variants}
        for p in pipelines:
            assert p.resolution is not None
            by_variant[p.run.variant][p.target] = p.resolution
        wheel_meta = _wheel_variants(run, environment, targets, by_variant)
        weights = side.weight_sets()
        uv = side.uv.result()

    locks = [
        _single_lock(
            name,
            kind,
            manifest,
            uv=uv,
            interpreter=interpreters[t],
            pins=sources.pins,
            resolution=by_variant[v][t],
            weights=weights,
            variant=v,
            wheel_variants=wheel_meta.get((v, t), []),
        )
        for t in targets
        for v in variants
    ]
    return merge(locks)


def _wheel_variants(
    run: _Locking, environment: Environment, targets: list[str], by_variant: dict[str, dict[str, _Resolution]]
) -> dict[tuple[str, str], list[str]]:
    """(variant, platform) → what the variant's wheels need by the wheel-variant metadata their
    indexes serve (``harness/lock/wheelmeta.py``; offline: the previous lock's, for unchanged
    pins). InputError naming the manifest's cuda and the metadata when they disagree."""
    from harness.lock.wheelmeta import (
        declaration_problem,
        previous_wheel_variants,
        read_wheel_variants,
        variant_packages,
    )

    found: dict[tuple[str, str], list[str]] = {}
    seen: dict[tuple[str, str, str], object] = {}
    for v in environment.variants:
        names = variant_packages(environment, v)
        for t in targets:
            packages = by_variant[v][t].packages
            if run.options.offline:
                entries = previous_wheel_variants(run.previous, t, v, packages)
            else:
                entries = read_wheel_variants(
                    packages, names, v, settings=run.settings, cache_dir=run.cache_dir, seen=seen
                )
            problem = declaration_problem(v, environment.variants[v].cuda, entries)
            if problem is not None:
                raise problem
            found[(v, t)] = entries
    return found


@dataclass(frozen=True)
class _Locking:
    """What every step of locking one manifest reads: the project, the settings, uv's cache,
    the options, and the previous lock (its pins are preferences)."""

    project: Project
    settings: Settings
    cache_dir: Path
    options: LockOptions
    previous: Lock | None
    #: The accelerator variant being resolved ("" without variants): its previous pins are preferences.
    variant: str = ""


class _PythonVersion(NamedTuple):
    """The interpreter version a lock asks for before uv lists interpreters (:func:`_python_version`)."""

    #: The exact version to keep: the settings' pin, else the previous lock's patch version.
    pin: str | None
    #: The version known up front (the pin, or a request naming a patch version), else None.
    exact: str | None


def _python_version(request: str, run: _Locking) -> _PythonVersion:
    """The settings' pin of ``request``; else, re-locking without upgrading, the previous
    lock's version when it still matches the request (the patch version it had is kept)."""
    previous = run.previous
    pin = run.settings.python_pins.get(request)
    if pin is None and previous is not None and not run.options.upgrade and _matches(previous.python.version, request):
        pin = previous.python.version  # re-locking keeps the patch version it had
    return _PythonVersion(pin, pin or (request if request.count(".") == 2 else None))


@dataclass(frozen=True)
class _SideJobs:
    """What runs in threads beside the git sources and the resolutions (:func:`_start_side_jobs`):
    uv's interpreter listing per platform, uv's version, every weight set."""

    request: str
    cache_dir: Path
    targets: list[str]
    interpreter_jobs: dict[str, Future[Interpreter]]
    uv: Future[str]
    weights: list[Future[WeightSet]]

    def interpreters(self) -> dict[str, Interpreter]:
        """Platform → interpreter, waiting for the listings; one Python version for every
        platform: the first's (another platform's is chosen again with it pinned)."""
        chosen = {t: job.result() for t, job in self.interpreter_jobs.items()}
        first = chosen[self.targets[0]]
        for t in self.targets[1:]:
            if chosen[t].version != first.version:
                chosen[t] = _pin_interpreter(self.request, platform=t, cache_dir=self.cache_dir, pin=first.version)
        return chosen

    @contextlib.contextmanager
    def interpreter_errors_first(self) -> Iterator[None]:
        """A :class:`HarnessError` of the steps inside is raised only once every interpreter
        listing finished without one: an interpreter error is the first step's, so it wins."""
        try:
            yield
        except HarnessError:
            for job in self.interpreter_jobs.values():
                job.result()
            raise

    def weight_sets(self) -> list[WeightSet]:
        """The pinned weight sets, in the manifest's order (the first failure raised)."""
        return [job.result() for job in self.weights]


def _start_side_jobs(
    pool: ThreadPoolExecutor, manifest: Manifest, targets: list[str], pin: str | None, run: _Locking
) -> _SideJobs:
    """Submit to ``pool``, in this order, each platform's interpreter choice, uv's version and
    every weight set (each kept at the previous lock's pin where it had one)."""
    from harness.resolve.uvtool import uv_version

    if manifest.weights:
        from harness.resolve.weights import lock_weights

    request = manifest.environment.python
    interpreter_jobs = {
        t: pool.submit(_pin_interpreter, request, platform=t, cache_dir=run.cache_dir, pin=pin) for t in targets
    }
    uv_job = pool.submit(uv_version)
    weight_jobs: list[Future[WeightSet]] = []
    if manifest.weights:
        old_weights = {w.dir: w for w in run.previous.weights} if run.previous else {}
        weight_jobs = [
            pool.submit(
                lock_weights,
                spec,
                project_root=run.project.root,
                settings=run.settings,
                cache_dir=run.cache_dir,
                offline=run.options.offline,
                previous=old_weights[spec.dir].pin() if spec.dir in old_weights else None,
            )
            for spec in manifest.weights
        ]
    return _SideJobs(request, run.cache_dir, targets, interpreter_jobs, uv_job, weight_jobs)


def _known_interpreters(version: str, targets: list[str]) -> dict[str, Interpreter]:
    """The interpreters of an exact ``version`` known up front, for resolving before uv's
    listing says where each comes from."""
    return {t: Interpreter("cpython", version, t, "host") for t in targets}


def _guessed_wrong(interpreters: dict[str, Interpreter], guesses: dict[str, Interpreter]) -> dict[str, Interpreter]:
    """The platforms whose chosen interpreter differs in version or platform from the one
    resolved for: those resolve again."""
    return {
        t: i for t, i in interpreters.items() if (i.version, i.platform) != (guesses[t].version, guesses[t].platform)
    }


def source_links(source: Source) -> tuple[tuple[str, str], ...]:
    """A manifest source's ``links`` as the lock pins them: (path in the checkout, path in the
    weights view), normalized and sorted, so spelling (``Assets/``) does not change a lock."""
    from pathlib import PurePosixPath

    return tuple(
        sorted(
            (PurePosixPath(path).as_posix(), PurePosixPath(target.removeprefix("{weights}/")).as_posix())
            for path, target in source.links.items()
        )
    )


def lock_targets(settings: Settings, options: LockOptions) -> list[str]:
    """The platforms a lock is for, in uv's canonical spelling: ``lock --platform X`` locks X
    this once; a plain lock always takes the settings' platforms (or this machine's), never
    the previous lock's, so one ``--platform`` run does not stick. InputError names the
    setting (or the option) of a platform harness cannot lock for."""
    from harness.resolve.interpreter import host_platform, parse_platform

    if options.platform:
        wanted, origin = [options.platform], "--platform"
    elif settings.lock_platforms:
        wanted, origin = list(settings.lock_platforms), settings.lock_platforms_origin
    else:
        wanted, origin = [host_platform()], "this machine"
    targets = []
    for platform in wanted:
        try:
            targets.append(parse_platform(platform).platform)
        except InputError as exc:
            raise InputError(f"{origin}: {exc.message}", hint=exc.hint) from None
    return list(dict.fromkeys(targets))


def _single_lock(
    name: str,
    kind: str,
    manifest: Manifest,
    *,
    uv: str,
    interpreter: Interpreter,
    pins: list[GitSource],
    resolution: _Resolution,
    weights: list[WeightSet],
    variant: str = "",
    wheel_variants: list[str] | None = None,
) -> Lock:
    """The lock of one platform (of one accelerator variant, for a manifest with variants),
    store paths filled in."""
    isolated = set(manifest.environment.no_build_isolation)

    def package(p: Package) -> LockedPackage:
        return _package(
            p, isolated=p.name not in isolated, build_requires=resolution.sdist_builds.get((p.name, p.version))
        )

    lock = Lock(
        lock_version=LINKS_LOCK_VERSION if any(p.links for p in pins) else LOCK_VERSION,
        name=name,
        type=kind,
        manifest=f"{'services' if kind == 'service' else 'benchmarks'}/{name}.toml",
        manifest_digest=manifest_digest(manifest),
        uv=uv,
        variant=variant,
        cuda=manifest.environment.variants[variant].cuda if variant else None,
        wheel_variants=wheel_variants or [],
        python=LockedInterpreter(
            implementation=interpreter.implementation,
            version=interpreter.version,
            platform=interpreter.platform,
            source=interpreter.source,
        ),
        packages=[package(p) for p in resolution.packages],
        build_packages=[package(p) for p in resolution.build_packages],
        sources=[
            LockedSource(
                name=p.name,
                repo=p.repo,
                rev=p.rev,
                commit=p.commit,
                tree=p.tree,
                install=p.install,
                subdirectory=p.subdirectory,
                **{"build-isolation": p.build_isolation},
                # An isolated build's set: the sources' build packages (a checkout only builds nothing).
                **{
                    "build-requires": resolution.source_builds
                    if p.build_isolation and p.install not in ("none", "path")
                    else []
                },
                submodules=[LockedSubmodule(path=m.path, url=m.url, commit=m.commit) for m in p.submodules],
                links=dict(p.links),
            )
            for p in pins
        ],
        weights=[
            LockedWeights(
                dir=w.dir,
                provider=w.provider,
                repo=w.repo,
                revision=w.revision,
                repo_type=w.repo_type,
                files=[
                    LockedWeightFile(path=f.path, size=f.size, sha256=f.sha256, revision=f.revision) for f in w.files
                ],
            )
            for w in weights
        ],
    )
    return assign_store_paths(lock)


@dataclass
class _Sources:
    """The manifest's git sources, pinned and exported: what the resolutions need of them."""

    pins: list[GitSource]
    #: The installed ones' project roots and extras, for uv to read their dependencies.
    project_dirs: list[tuple[Path, tuple[str, ...]]]
    build_requirements: list[str]
    #: Build requirements of sources built without isolation: installed in the environment.
    environment_requirements: list[str] = field(default_factory=list)


def _sources(
    environment: Environment, scratch: Path, *, settings: Settings, cache_dir: Path, options: LockOptions
) -> _Sources:
    """Pin every git source to a commit and export the installed ones into ``scratch``; ask
    each installed one's build backend what it needs (static and PEP 517 dynamic build
    requirements): a build environment's requirements, or, for a source built without
    isolation, the environment's own."""
    import hashlib
    import json

    from harness.resolve.python import build_requirements, dynamic_build_requirements

    pins: list[GitSource] = []
    # Where each installed source's files are left by lock_source, which exports them to
    # hash them anyway: one export per source, not a second one to read them.
    exported: list[Path] = []
    if environment.sources:
        from harness.resolve.git import lock_source

        for number, source in enumerate(environment.sources):
            keep = scratch / f"source-{number}"
            pin = lock_source(
                source,
                cache_dir,
                offline=options.offline,
                mirrors=settings.git_mirrors,
                keep=None if source.install in ("none", "path") else keep,
            )
            pins.append(dataclasses.replace(pin, links=source_links(source)) if source.links else pin)
            exported.append(keep)
    project_dirs: list[tuple[Path, tuple[str, ...]]] = []
    build_reqs: list[str] = []
    env_reqs: list[str] = []
    for pin_, source, dest in zip(pins, environment.sources, exported, strict=True):
        if pin_.install in ("none", "path"):
            continue  # a checkout only: realized into the store, never built
        root = dest / pin_.subdirectory if pin_.subdirectory else dest
        if not ((root / "pyproject.toml").is_file() or (root / "setup.py").is_file()):
            raise HarnessError(
                f"source {pin_.repo} at {pin_.commit[:12]}"
                f"{'/' + pin_.subdirectory if pin_.subdirectory else ''} is not a Python project "
                "(no pyproject.toml or setup.py)",
                hint='set install = "none" to realize it as a checkout only',
            )
        project_dirs.append((root, tuple(source.extras)))
        static = build_requirements(root)
        key = hashlib.sha256(
            json.dumps(
                ["harness-build-requires-v1", pin_.tree, pin_.subdirectory or "", pin_.install, sorted(static)]
            ).encode()
        ).hexdigest()[:40]
        dynamic = dynamic_build_requirements(
            root,
            static,
            editable=pin_.install == "editable",
            key=key,
            indexes=list(environment.indexes),
            settings=settings,
            cache_dir=cache_dir,
            offline=options.offline,
        )
        (build_reqs if pin_.build_isolation else env_reqs).extend([*static, *dynamic])
    return _Sources(pins, project_dirs, sorted(set(build_reqs)), sorted(set(env_reqs)))


class _Resolution(NamedTuple):
    """One platform's Python resolution: the environment's packages and the build packages;
    once the sdists' builds are resolved (:func:`_with_sdist_builds`), which build packages
    (``name==version``) each isolated sdist's build uses, by (name, version), and the sources'."""

    packages: list[Package]
    build_packages: list[Package]
    sdist_builds: dict[tuple[str, str], list[str]] = {}
    source_builds: list[str] = []


def _resolve_all(
    run: _Locking,
    environment: Environment,
    interpreters: dict[str, Interpreter],
    sources: _Sources,
    pool: ThreadPoolExecutor,
) -> dict[str, _Resolution]:
    """Platform → its :class:`_Resolution`: every resolution submitted to ``pool`` at once.
    The first failure in platform order is raised (a package error before a build one)."""

    jobs: dict[str, tuple[Future[list[Package]], Future[list[Package]] | None]] = {}
    for target, interpreter in interpreters.items():
        before = _previous_for(run, target)
        resolve = _resolver(run, environment, interpreter)
        requirements = [
            *environment.requirements,
            *_not_named(sources.environment_requirements, environment.requirements),
        ]
        packages = pool.submit(
            resolve,
            requirements,
            previous=_to_pins(before.packages) if before else None,
            extra_paths=sources.project_dirs,
            package_index=environment.package_index,
        )
        build = (
            pool.submit(
                resolve,
                sources.build_requirements,
                previous=_to_pins(before.build_packages) if before else None,
                package_index=_direct_only(environment.package_index, sources.build_requirements),
            )
            if sources.build_requirements
            else None
        )
        jobs[target] = (packages, build)
    wait([job for pair in jobs.values() for job in pair if job is not None])
    return {
        target: _Resolution(packages.result(), build.result() if build is not None else [])
        for target, (packages, build) in jobs.items()
    }


@dataclass
class _TargetPipeline:
    """One (variant, platform) of a lock, from its resolution to its sdists' build sets, run
    in a thread of its own (:func:`_run_pipelines`): a platform whose resolution is done goes
    on to fetch its sdists and ask their backends while another platform still resolves, and
    what both need is done once (:mod:`harness.resolve.sdists` answers the second from the
    first's work). Its outcome is kept, not raised, so the caller raises failures in the
    lock's order whichever finished first: every resolution's (``failed_resolving``: the
    packages, the sources' build packages, the interpreter listing) before any sdist's."""

    run: _Locking
    environment: Environment
    target: str
    guess: Interpreter
    sources: _Sources
    side: _SideJobs
    pool: ThreadPoolExecutor
    scratch: Path
    resolution: _Resolution | None = None
    failed: HarnessError | None = None
    failed_resolving: bool = False

    def _resolve(self, interpreter: Interpreter) -> _Resolution:
        resolved = _resolve_all(self.run, self.environment, {self.target: interpreter}, self.sources, self.pool)
        return resolved[self.target]

    def __call__(self) -> None:
        try:
            resolution = self._resolve(self.guess)
            interpreter = self.side.interpreters()[self.target]
        except HarnessError as exc:
            self.failed, self.failed_resolving = exc, True
            return
        try:
            if _guessed_wrong({self.target: interpreter}, {self.target: self.guess}):
                resolution = self._resolve(interpreter)
            self.resolution = _with_sdist_builds(
                self.run,
                self.environment,
                {self.target: interpreter},
                self.sources,
                {self.target: resolution},
                self.scratch,
            )[self.target]
        except HarnessError as exc:
            self.failed = exc


def _run_pipelines(pipelines: list[_TargetPipeline]) -> None:
    """Run every pipeline, as many at once as this machine has cores (at least two: most of a
    resolution is waiting on the index); a failure that is no :class:`HarnessError` (a bug,
    an interrupt) is raised."""
    import os

    with ThreadPoolExecutor(max_workers=max(2, min(len(pipelines), os.cpu_count() or 2))) as threads:
        for job in [threads.submit(p) for p in pipelines]:
            job.result()


def _raise_first(failures: Iterable[HarnessError | None]) -> None:
    """Raise the first of ``failures`` that is one."""
    for failure in failures:
        if failure is not None:
            raise failure


def _resolver(run: _Locking, environment: Environment, interpreter: Interpreter) -> Callable[..., list[Package]]:
    """:func:`harness.resolve.python.resolve_packages` for ``interpreter`` with the
    environment's indexes and the lock's options; the caller gives requirements and pins."""
    from harness.resolve.python import resolve_packages

    return functools.partial(
        resolve_packages,
        interpreter=interpreter,
        indexes=list(environment.indexes),
        settings=run.settings,
        cache_dir=run.cache_dir,
        offline=run.options.offline,
        upgrade=run.options.upgrade,
        upgrade_packages=list(run.options.upgrade_packages),
    )


#: How many times the build packages are resolved again for sdists among them (a build
#: requirement that is itself only an sdist needs its own backend's requirements).
_SDIST_ROUNDS = 4


def _with_sdist_builds(
    run: _Locking,
    environment: Environment,
    interpreters: dict[str, Interpreter],
    sources: _Sources,
    resolved: dict[str, _Resolution],
    scratch: Path,
) -> dict[str, _Resolution]:
    """Each platform's resolution with what the sdists it installs need to build
    (:mod:`harness.resolve.sdists`): an isolated sdist's build requirements in the build
    packages, beside the git sources' (realize builds it offline from those alone); one the
    manifest builds without isolation (``no-build-isolation``) has its requirements resolved
    into the environment itself, which it is built against. Platforms without an sdist keep
    their resolution as it is."""
    out = dict(resolved)
    for target, resolution in resolved.items():
        packages = _with_environment_builds(
            run, environment, interpreters[target], sources, resolution, scratch, target
        )
        builds = _isolated_builds(
            run, environment, interpreters[target], sources, packages, resolution, scratch, target
        )
        out[target] = _Resolution(packages, *builds)
    return out


def _sdist_options(
    run: _Locking, environment: Environment, scratch: Path, on_static: Callable[[list[str]], None] | None = None
) -> SdistOptions:
    from harness.resolve.sdists import SdistOptions

    return SdistOptions(
        indexes=tuple(environment.indexes),
        settings=run.settings,
        cache_dir=run.cache_dir,
        scratch=scratch,
        offline=run.options.offline,
        on_static=on_static,
    )


def _sdist_needs(run: _Locking, environment: Environment, packages: list[Package], scratch: Path) -> list[str]:
    from harness.resolve.sdists import sdist_build_requirements

    return sdist_build_requirements(packages, _sdist_options(run, environment, scratch))


def _with_environment_builds(
    run: _Locking,
    environment: Environment,
    interpreter: Interpreter,
    sources: _Sources,
    resolution: _Resolution,
    scratch: Path,
    target: str,
) -> list[Package]:
    """The environment's packages, resolved again with the build requirements of the sdists
    built against it (``no-build-isolation``) until they hold every one."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    against = set(environment.no_build_isolation)
    packages = resolution.packages
    added: list[str] = []
    for _ in range(_SDIST_ROUNDS):
        needs = _sdist_needs(run, environment, [p for p in packages if p.name in against], scratch)
        named = {canonicalize_name(p.name) for p in packages}
        missing = [r for r in needs if canonicalize_name(Requirement(r).name) not in named and r not in added]
        if not missing:
            return packages
        added += missing
        before = _previous_for(run, target)
        requirements = [
            *environment.requirements,
            *_not_named([*sources.environment_requirements, *added], environment.requirements),
        ]
        packages = _resolver(run, environment, interpreter)(
            requirements,
            previous=_to_pins(before.packages) if before else None,
            extra_paths=sources.project_dirs,
            package_index=environment.package_index,
        )
    raise HarnessError(f"the build requirements of its sdists did not settle after {_SDIST_ROUNDS} rounds")


class _BuildSets(NamedTuple):
    """The build packages of one platform (every build set's, once each) and which of them
    (``name==version``) each isolated sdist's build and the sources' builds use."""

    build_packages: list[Package]
    sdist_builds: dict[tuple[str, str], list[str]]
    source_builds: list[str]


def _isolated_builds(
    run: _Locking,
    environment: Environment,
    interpreter: Interpreter,
    sources: _Sources,
    packages: list[Package],
    resolution: _Resolution,
    scratch: Path,
    target: str,
) -> _BuildSets:
    """A build set per distinct list of build requirements: the git sources' together (their
    resolution, ``resolution.build_packages``), and each isolated sdist among ``packages`` (and
    among the build packages themselves, until they settle) its own, so two sdists whose
    backends want conflicting versions (an old setuptools and a new one) both lock, and an
    sdist's wheel is named by exactly what its build reads. Sdists asking for the same
    requirements share one resolution."""
    against = set(environment.no_build_isolation)
    before = _previous_for(run, target)
    sets: dict[tuple[str, ...], list[Package]] = {}
    if sources.build_requirements:
        sets[tuple(sorted(set(sources.build_requirements)))] = resolution.build_packages
    needs_of: dict[tuple[str, str], tuple[str, ...]] = {}
    for _ in range(_SDIST_ROUNDS):
        every = _union(sets.values())
        waiting = [
            p
            for p in [*packages, *every]
            if p.sdist is not None and not p.wheels and p.name not in against and (p.name, p.version) not in needs_of
        ]
        if not waiting:
            break
        for package in waiting:
            needs = _needs_resolving_ahead(run, environment, interpreter, package, scratch, before, sets)
            needs_of[(package.name, package.version)] = needs
            if needs and needs not in sets:
                sets[needs] = _resolver(run, environment, interpreter)(
                    list(needs),
                    previous=_previous_build_pins(before, package),
                    package_index=_direct_only(environment.package_index, list(needs)),
                )
    else:
        raise HarnessError(f"the build requirements of its sdists did not settle after {_SDIST_ROUNDS} rounds")

    def pins(needs: tuple[str, ...]) -> list[str]:
        return sorted({f"{p.name}=={p.version}" for p in sets.get(needs, [])})

    return _BuildSets(
        _union(sets.values()),
        {key: pins(needs) for key, needs in needs_of.items()},
        pins(tuple(sorted(set(sources.build_requirements)))),
    )


def _needs_resolving_ahead(
    run: _Locking,
    environment: Environment,
    interpreter: Interpreter,
    package: Package,
    scratch: Path,
    before: Lock | None,
    sets: dict[tuple[str, ...], list[Package]],
) -> tuple[str, ...]:
    """The build requirements of ``package``'s sdist (sorted, once each). While its backend
    is asked for its dynamic ones, its static ones are already resolved beside it; when they
    are all it needs (a backend seldom asks for more), that resolution goes into ``sets``, and
    the build set costs no time after the backend's answer. Otherwise it is dropped, its
    failure too, and the caller resolves what the sdist needs."""
    from harness.resolve.sdists import sdist_build_requirements

    resolve = _resolver(run, environment, interpreter)
    ahead: dict[tuple[str, ...], Future[list[Package]]] = {}
    with ThreadPoolExecutor(max_workers=1) as early:

        def on_static(static: list[str]) -> None:
            key = tuple(sorted(set(static)))
            if key and key not in sets:
                ahead[key] = early.submit(
                    resolve,
                    list(key),
                    previous=_previous_build_pins(before, package),
                    package_index=_direct_only(environment.package_index, list(key)),
                )

        needs = tuple(
            sorted(set(sdist_build_requirements([package], _sdist_options(run, environment, scratch, on_static))))
        )
        if needs in ahead:
            sets[needs] = ahead[needs].result()
    return needs


def _union(sets: Iterable[list[Package]]) -> list[Package]:
    """Every package of ``sets`` once (by name, version, marker and index), in a stable order."""
    seen: dict[tuple[str, str, str, str], Package] = {}
    for packages in sets:
        for package in packages:
            seen.setdefault((package.name, package.version, package.marker, package.index), package)
    return [seen[key] for key in sorted(seen)]


def _previous_build_pins(before: Lock | None, package: Package) -> list[Package] | None:
    """The previous lock's pins of the build set ``package``'s sdist used, as preferences (all
    its build packages, one version of each, when it named none: a lock written before)."""
    if before is None:
        return None
    previous = next(
        (
            p
            for p in [*before.packages, *before.build_packages]
            if (p.name, p.version) == (package.name, package.version)
        ),
        None,
    )
    from harness.lock.objects import build_set

    chosen = build_set(previous.build_requires if previous is not None else [], before)
    return _to_pins(list({p.name: p for p in chosen}.values()))


def _previous_for(run: _Locking, target: str) -> Lock | None:
    """The previous lock's pins for ``target`` (its own platform's, else its first's; of the
    variant being resolved, else the first variant), as preferences; None when upgrading
    everything."""
    previous = run.previous
    if previous is None or run.options.upgrade:
        return None
    if not previous.targets:
        return previous
    from harness.lock.platforms import for_platform, platforms_of
    from harness.lock.projection import variants_of

    held = platforms_of(previous)
    platform = target if target in held else held[0]
    variants = [name for name, _ in variants_of(previous, platform)]
    variant = run.variant if run.variant in variants else (variants[0] if variants else "")
    try:
        return for_platform(previous, platform, variant)
    except HarnessError:
        return None


def _not_named(extra: list[str], requirements: list[str]) -> list[str]:
    """The requirements of ``extra`` whose package ``requirements`` does not already name
    (the manifest's own pin of, say, torch is the one that counts)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    named = {canonicalize_name(Requirement(r).name) for r in requirements}
    return [r for r in extra if canonicalize_name(Requirement(r).name) not in named]


def _direct_only(package_index: dict[str, str], requirements: list[str]) -> dict[str, str]:
    """The entries of ``package_index`` naming one of ``requirements``: build requirements
    take their pinned index, but naming a package in package-index must not add it to the
    build environment (resolve.python, "Per-package indexes")."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    named = {canonicalize_name(Requirement(r).name) for r in requirements}
    return {k: v for k, v in package_index.items() if canonicalize_name(k) in named}


#: uv's CPython downloads per (cache, platform), once per process (generate's and
#: harness.lock.early's readers); each key's first reader lists, the others wait for it.
_DOWNLOADS: dict[tuple[Path, str], list[PythonListing]] = {}
_DOWNLOADS_LOCKS: dict[tuple[Path, str], threading.Lock] = {}
_DOWNLOADS_LOCK = threading.Lock()


def _pin_interpreter(request: str, *, platform: str | None, cache_dir: Path, pin: str | None) -> Interpreter:
    """The interpreter a lock records: :func:`~harness.resolve.interpreter.find_interpreter`'s
    choice, without the installed path it also looks for (a lock does not need it).

    uv's download list for the platform (built into uv, listed in 0.02–0.05 s and kept per uv
    binary) decides whenever it offers the version; only otherwise are installed interpreters
    discovered, which takes seconds where pyenv shims are on PATH. The choice is the same
    either way, since ``choose_version`` prefers a download and falls back to installed ones
    only without one.
    """
    from harness.resolve.interpreter import (
        choose_version,
        find_interpreter,
        host_platform,
        list_downloads,
        parse_platform,
        python_list_key,
    )

    target = parse_platform(platform if platform is not None else host_platform())
    key = (cache_dir, python_list_key(target))
    with _DOWNLOADS_LOCK:
        listing_lock = _DOWNLOADS_LOCKS.setdefault(key, threading.Lock())
    with listing_lock:
        if key not in _DOWNLOADS:
            _DOWNLOADS[key] = list_downloads(cache_dir, target)
        downloads = _DOWNLOADS[key]
    try:
        version, source = choose_version(request, downloads, platform=target.platform, pin=pin)
    except InputError:  # no download fits: installed interpreters may (or the full error says why)
        return find_interpreter(request, platform=target.platform, cache_dir=cache_dir, pin=pin)[0]
    return Interpreter(implementation="cpython", version=version, platform=target.platform, source=source)


def _matches(version: str, request: str) -> bool:
    return version == request or version.startswith(request + ".")


def _file(file: DistFile) -> LockedFile:
    return LockedFile(file=file.file, size=file.size, sha256=file.sha256)


def _package(package: Package, *, isolated: bool = True, build_requires: list[str] | None = None) -> LockedPackage:
    """``isolated``: false for a package the manifest builds against the environment; kept
    only where it matters, for an sdist, as ``build_requires``: the build packages its
    isolated build uses."""
    built = not package.wheels and package.sdist is not None
    return LockedPackage(
        name=package.name,
        version=package.version,
        index=package.index,
        marker=package.marker,
        wheels=[_file(w) for w in package.wheels],
        sdist=_file(package.sdist) if package.sdist else None,
        **{
            "build-isolation": isolated or not built,
            "build-requires": sorted(build_requires or []) if built and isolated else [],
        },
    )


def _to_pins(packages: list[LockedPackage]) -> list[Package]:
    return [
        Package(
            name=p.name,
            version=p.version,
            index=p.index,
            marker=p.marker,
            wheels=tuple(DistFile(w.file, w.sha256, w.size) for w in p.wheels),
            sdist=DistFile(p.sdist.file, p.sdist.sha256, p.sdist.size) if p.sdist else None,
        )
        for p in packages
    ]
