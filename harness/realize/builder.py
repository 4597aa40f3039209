"""``harness realize``: build exactly what a lock names into the store.

Two phases, so the network is touched once and registration is fast and local:

1. **fetch** — every wheel, sdist and weight file the store lacks is downloaded, in
   parallel with one progress display, into ``$HARNESS_HOME/cache/downloads/<sha256>``
   (resumable: an interrupted download continues from its ``.part``), each checked against
   the lock's size and sha256 before it is kept (a weight file that the deploy's ``weights``
   folder holds is copied from there instead, checked the same way; a copy that does not
   match is reported and the file downloaded: :func:`harness.realize.fetch.fetch_weight`).
   Meanwhile, on two more threads, the
   interpreter is installed or copied and compiled, and the git sources are exported and
   checked against their tree hashes, each *staged* in the store's scratch
   (:meth:`Store.stage`): nothing is registered yet;
2. **register** — objects are added to the store in dependency order (files, sources,
   weight sets, the weights view, the interpreter, the environment), each by moving
   already-verified bytes into its build folder or committing what was staged (or building
   offline from realized parts), so a crash at any point leaves the store consistent (see
   Store.add).

A lock that fails in the fetch phase (a wrong hash, an unreachable file), or whose source or
interpreter could not be had, registers nothing: its staged builds are dropped (when the whole
fetch failed, they stop at their next phase first) and the project's root is not touched. A
lock that fails while it registers (uv, an sdist's build, a missing build dependency) gives
up again the paths it newly registered: once every lock is done, those no lock of this
realize that succeeded needs are deleted by :func:`harness.store.gc.discard_unused`, which
keeps any that another process has taken into use meanwhile (its roots say so), and the
package files among them are first put back into the download cache, so the retry downloads
nothing (the weight files are still there: their downloads are dropped only once the store
holds them for good). Either way a failed realize leaves the store as it was.

The interpreter is the lock's own (uv-managed: from a binary cache, else installed through
uv from the configured download list or mirror) whenever that can be had. When it cannot, a
host copy stands in under a store path of its own and the environment is built on it under
another path (``harness/realize/standin.py``); the report says so and why. A realize that
does any work tries for the lock's own interpreter again, so a host copy is replaced as soon
as a cache or the network can provide the real one; but a download that uv tried and failed
is not waited on again for ``[python] download-retry-minutes`` (an hour) in this home, unless
the download settings change or ``--refresh`` asks (``harness/realize/unreachable.py``).

``--offline`` never touches the network: anything that would need it is listed, all at
once, before anything is built (a weight file the deploy's folder holds at the locked size
is not listed; should its bytes not match, the realize fails naming it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
import os
import shutil
import stat
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
import functools
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from harness.config import Settings
from harness.errors import HarnessError
from harness.lock.objects import (
    all_objects,
    build_inputs,
    built_wheels,
    chosen_file,
    lock_objects,
    needed_build_inputs,
)
from harness.progress import Reporter, Stopped, reporter, write_line
from harness.store.store import INTERRUPTS, BuildResult, Staged, Store

if TYPE_CHECKING:  # the lock models load pydantic: only where a lock is actually read
    from harness.store.entries import PathLock

    from harness.download import Progress
    from harness.lock.document import (
        Lock,
        LockedFile,
        LockedPackage,
        LockedSource,
        LockedWeightFile,
        LockedWeights,
    )
    from harness.realize.environment import RemoteWheel
    from harness.realize.fetch import FetchJob, LocalWeights

    _T = TypeVar("_T")
    _R = TypeVar("_R")

    #: A file the fetch phase is to download, by what it is: a package file (its index, its
    #: project, the file) or a weight file (its weight set, the file).
    _Wanted = (
        tuple[Literal["file"], tuple[str, str, LockedFile]]
        | tuple[Literal["weight"], tuple[LockedWeights, LockedWeightFile]]
    )


class OfflineMissing(HarnessError):
    """An offline realize needs things that are neither in the store nor cached."""


class RealizeFailed(HarnessError):
    """Some locks failed to realize; the others were realized. ``reports`` are the ones
    that succeeded, ``failures`` maps each failed lock's name to its error message."""

    def __init__(self, reports: list[Report], failures: dict[str, str]) -> None:
        lines = [f"{name}: {message}" for name, message in failures.items()]
        done = f"; {len(reports)} other(s) realized" if reports else ""
        super().__init__(
            f"{len(failures)} of {len(reports) + len(failures)} failed to realize{done}:\n"
            + "\n".join("  " + line.replace("\n", "\n    ") for line in lines)
        )
        self.reports = reports
        self.failures = failures


@dataclass
class Report:
    """What one lock's realize did. ``environment`` is the environment realized here (another
    path than the lock's when a host interpreter stands in; ``impure`` then says so)."""

    name: str
    environment: str
    built: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    impure: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Context:
    """Where realize reads and writes."""

    store: Store
    project_root: Path
    settings: Settings
    cache_dir: Path
    offline: bool = False
    jobs: int = 8
    show_progress: bool = True
    #: Binary caches consulted before anything is fetched upstream or built (issue 7).
    substituters: tuple[str, ...] = ()
    trusted_keys: tuple[str, ...] = ()
    #: A deploy's ``weights`` folder: weight files are copied from there when it holds them
    #: (checked like downloads), and fetched from their origin otherwise.
    local_weights: LocalWeights | None = None
    #: uv's cache for environment builds (default: ``cache_dir``). A repair gives a fresh
    #: one: uv installs by hard-linking its cache, whose files a tampered environment shares.
    uv_cache_dir: Path | None = None
    #: Ask uv for a lock's interpreter even when a failed download is remembered
    #: (``harness/realize/unreachable.py``; ``harness realize --refresh``).
    refresh: bool = False
    #: Why uv could not install an interpreter, by its store name, once this realize found
    #: out: the next lock on the same interpreter goes straight to the host copy instead of
    #: waiting through uv's download retries again.
    unavailable: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: File name → address of the wheels uv is to download into an environment
    #: (:func:`_streamed`), looked up while the interpreter is prepared (:func:`_look_up_streamed`).
    file_urls: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: The thread of that look-up, which phase 1 starts and does not wait for: only an
    #: environment's sync needs the addresses (:func:`_remote_wheels` joins it).
    lookups: list[threading.Thread] = field(default_factory=list, init=False, repr=False, compare=False)
    #: The warnings the substitution passes printed: a path several passes ask for (the lock's
    #: own, then those a stand-in still lacks) is refused once on the screen.
    warned: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    #: Build inputs (package files, built wheels) to register even where no environment
    #: needs them: what ``store verify --repair`` deleted (``harness/realize/repair.py``).
    rebuild: frozenset[str] = frozenset()

    @cached_property
    def uv_cache(self) -> Path:
        """uv's cache folder for environment builds (in a shared home, this member's own)."""
        from harness.store.shared import uv_cache

        return uv_cache(self.uv_cache_dir or self.cache_dir)

    @cached_property
    def wheel_urls(self) -> dict[str, str]:
        """sha256 → address of the wheels uv streamed into this home's environments, as
        noted beside its cache (``harness/realize/wheelurls.py``): read once per realize."""
        from harness.realize.wheelurls import remembered

        return remembered(self.uv_cache)

    @cached_property
    def progress(self) -> Reporter:
        """Where realize shows its phases (stderr: live, plain lines or, without
        ``show_progress``, nothing; ``harness.progress``)."""
        return reporter(self.show_progress)

    @property
    def compile_jobs(self) -> int:
        """Bytecode compile workers: ``jobs``, but no more than the CPUs (compiling is CPU-bound)."""
        from harness.realize.bytecode import cpu_count

        return max(1, min(self.jobs, cpu_count()))

    @property
    def downloads(self) -> Path:
        return self.cache_dir / "downloads"

    def download_path(self, sha256: str) -> Path:
        return self.downloads / sha256

    def download_lock(self, sha256: str) -> PathLock:
        """Serializes everything that touches one download among concurrent realizes."""
        from harness.store.store import lock_file

        self.downloads.mkdir(parents=True, exist_ok=True)
        return lock_file(self.downloads / f"{sha256}.lock")


def missing(store: Store, lock: Lock) -> list[str]:
    """The store paths of ``lock`` as this store realizes it (a host interpreter may stand
    in: ``harness/realize/standin.py``) that are not registered: its runtime closure, and the
    build inputs only where the environment must be built (``lock/objects.py``), so a
    realized environment needs none of its wheel files."""
    from harness.realize.standin import realized_lock

    realized = realized_lock(store, lock)
    names = [*lock_objects(realized), *needed_build_inputs(realized, store.is_registered)]
    return [name for name in dict.fromkeys(names) if not store.is_registered(name)]


def _needed(ctx: Context, realized: Lock) -> set[str]:
    """The build inputs a realize of ``realized`` (the lock as realized here) registers: those
    its environment's build needs, and those ``ctx.rebuild`` names (a repair)."""
    return set(needed_build_inputs(realized, ctx.store.is_registered, ctx.rebuild))


def _wants_work(store: Store, lock: Lock) -> bool:
    """Whether a realize has anything to do for ``lock``: a path missing, or a host copy
    standing in for a uv-managed interpreter that may be had now (module doc)."""
    from harness.realize.standin import own_interpreter_registered

    if missing(store, lock):
        return True
    return lock.python.source == "uv-managed" and not own_interpreter_registered(store, lock)


def realize_locks(ctx: Context, locks: list[Lock], *, fail_fast: bool = False) -> list[Report]:
    """Realize several locks: fetch everything first (one progress display), then build.

    A lock that fails (a download, a build) does not stop the others: every lock that can
    be realized is, then :class:`RealizeFailed` lists every failure. What a failed lock had
    registered is given up again (module doc). With ``fail_fast`` the
    first failure is raised as it is, and nothing after it is built.
    """
    _root_inputs(ctx, locks)
    _check_members_paths(ctx, locks)
    todo = _locks_to_build(ctx, locks)
    _warn_about_weights_folder(ctx, todo)
    if ctx.offline:
        _check_offline(ctx, todo)
    run = _Realizing()
    try:
        if todo:
            _fetch_and_prepare(ctx, todo, run, fail_fast=fail_fast)
        _register_locks(ctx, locks, todo, run, fail_fast=fail_fast)
    except INTERRUPTS:
        # Ctrl-C: what was built in scratch is left to the next realize's clean (deleting an
        # interpreter copy takes a while); what was registered stays for it to use.
        _drop_what_failed(ctx, locks, run, now=False)
        raise
    except BaseException:
        _drop_what_failed(ctx, locks, run)
        # A failed fetch stops the builds beside it, which leave their scratch as an
        # interrupt does (store.INTERRUPTS): a failed realize leaves nothing.
        ctx.store.clean()
        raise
    _drop_what_failed(ctx, locks, run)
    _drop_downloads(ctx, locks)
    _root_realized(ctx, locks, run.failures)
    _drop_package_files(ctx, locks, run.failures)
    return _reports_unless_failed(run)


def _root_inputs(ctx: Context, locks: list[Lock]) -> None:
    """Root every path ``locks`` may use, before anything is looked up: a concurrent
    `store gc` can no longer take an input (a wheel, a source) between "found registered"
    and "used by the build". A host copy standing in, and the environments on it, are
    inputs too."""
    from harness.realize.standin import realized_lock
    from harness.store.roots import hold

    hold(
        ctx.store,
        [name for lock in locks for name in {*all_objects(lock), *all_objects(realized_lock(ctx.store, lock))}],
    )


def _check_members_paths(ctx: Context, locks: list[Lock]) -> None:
    """In a shared store: check the wheels, sdists and weights another member registered
    against the locks before they count as registered here (``harness/realize/members.py``)."""
    from harness.realize.members import check_members_paths

    check_members_paths(ctx.store, locks)


def _locks_to_build(ctx: Context, locks: list[Lock]) -> list[Lock]:
    """The locks of ``locks`` a realize has work for (:func:`_wants_work`) once the binary
    caches have given what they hold (:func:`_substitute`)."""

    def wants_work(lock: Lock) -> bool:
        if _wants_work(ctx.store, lock):
            return True
        from harness.realize.standin import realized_lock

        needed = _needed(ctx, realized_lock(ctx.store, lock)) if ctx.rebuild else set()
        return any(not ctx.store.is_registered(name) for name in needed)

    todo = [lock for lock in locks if wants_work(lock)]
    if todo and ctx.substituters:
        _substitute(ctx, todo)
        todo = [lock for lock in locks if wants_work(lock)]
    return todo


def _warn_about_weights_folder(ctx: Context, todo: list[Lock]) -> None:
    """Warn on stderr when the deploy's weights folder is unusable, only when a weight file
    is to be fetched: a machine that already holds (or pulls from a cache) every weight set
    needs no folder."""
    if ctx.local_weights is None or not any(what == "weight" for what, _ in _files_to_fetch(ctx, todo).values()):
        return
    problem = ctx.local_weights.problem()
    if problem is not None:
        write_line(sys.stderr, f"warning: {problem}")


def _fetch_and_prepare(ctx: Context, todo: list[Lock], run: _Realizing, *, fail_fast: bool) -> None:
    """Phase 1 for the locks that have work: the interpreters and git sources are built in
    the store's scratch (``run.prepared``) while the files download (they need none of them);
    they are registered only after the fetch succeeded (:func:`_register_locks`). When the
    whole fetch fails, the builds stop at their next phase (all of it is dropped)."""
    ctx.store.clean()  # leftovers matter only to a build (Store.add clears its own path's anyway)
    prepared = run.prepared
    interpreters_ready = _standins_from_caches(ctx, todo, prepared)
    _look_up_streamed(ctx, todo)
    with ThreadPoolExecutor(max_workers=2) as pool:
        staging = [] if interpreters_ready else [pool.submit(_prepare_interpreters, ctx, todo, prepared)]
        staging.append(pool.submit(_prepare_sources, ctx, todo, prepared))
        try:
            _fetch_for_locks(ctx, todo, run.failures, fail_fast=fail_fast)
            for future in staging:
                future.exception()  # waits: nothing is registered while one is building
        except BaseException:
            # The fetch failed, or an interrupt came (while fetching or waiting): all of it is
            # dropped, so the builds stop at their next step (a folder copied, a file compiled).
            prepared.stop.set()
            for future in staging:
                future.exception()
            raise
    for future in staging:
        future.result()  # a bug, not a lock's failure (those are kept in ``prepared``)


def _fetch_for_locks(ctx: Context, todo: list[Lock], failures: dict[str, HarnessError], *, fail_fast: bool) -> None:
    """Fetch what ``todo`` lacks, all at once. When that fails (and neither ``fail_fast`` nor
    a single lock makes it the realize's error), each lock fetches again on its own, which
    says which locks lack what (what came is kept); those go into ``failures``."""
    try:
        _fetch(ctx, todo)
    except HarnessError:
        if fail_fast or len(todo) == 1:
            raise
        for lock in todo:
            try:
                _fetch(ctx, [lock])
            except HarnessError as exc:
                failures[lock.name] = exc


def _register_locks(ctx: Context, locks: list[Lock], todo: list[Lock], run: _Realizing, *, fail_fast: bool) -> None:
    """Phase 2, lock by lock in order: register each lock of ``todo`` that did not fail to
    fetch (:func:`_register`), report the others as complete; a failure goes into
    ``run.failures`` (with ``fail_fast``, it is raised)."""
    building = {id(lock) for lock in todo}
    for lock in locks:
        if lock.name in run.failures:
            continue
        try:
            if id(lock) in building:
                with ctx.progress.phase(f"realizing {lock.name}"):
                    run.reports.append(_register(ctx, lock, run.prepared, run.given_up.setdefault(lock.name, set())))
            else:
                run.reports.append(_complete(ctx, lock))
        except HarnessError as exc:
            if fail_fast:
                raise
            run.failures[lock.name] = exc


def _drop_what_failed(ctx: Context, locks: list[Lock], run: _Realizing, *, now: bool = True) -> None:
    """Drop what was made ready but no lock that succeeded registered, and give up again
    what the failed locks registered (:func:`_give_up`): a failed realize leaves nothing.
    ``now=False`` (an interrupt) leaves the scratch builds to the next clean."""
    run.prepared.release(now=now)
    done = {report.name for report in run.reports}
    _give_up(
        ctx,
        [lock for lock in locks if run.given_up.get(lock.name)],
        [lock for lock in locks if lock.name in done],
        run.given_up,
    )


def _root_realized(ctx: Context, locks: list[Lock], failures: dict[str, HarnessError]) -> None:
    """Record in the project's gc root what this store realized (a host copy and its
    environments, where one stands in). A lock that failed keeps what the project's root
    said of it before: a failed realize changes no root."""
    from harness.realize.standin import realized_lock
    from harness.store.gc import register_project

    # With `[gc] keep-wheel-files = false` the downloaded package files are not the project's
    # to keep (:func:`_drop_package_files`): the runtime closure is recorded, and the wheels
    # built from sdists.
    def runtime_and_built(lock: Lock) -> list[str]:
        return [*lock_objects(lock), *(name for _, name in built_wheels(lock))]

    objects = all_objects if ctx.settings.gc_keep_wheel_files else runtime_and_built
    realized: dict[str, Iterable[str]] = {
        lock.name: objects(realized_lock(ctx.store, lock)) for lock in locks if lock.name not in failures
    }
    if realized or not locks:
        register_project(ctx.store, ctx.project_root, realized)


def _drop_package_files(ctx: Context, locks: list[Lock], failures: dict[str, HarnessError]) -> None:
    """With ``[gc] keep-wheel-files = false`` (the default): delete the downloaded package files
    (wheels, sdists, build packages) of each lock whose environment is registered and passes
    the launch check, once no other root keeps them (:func:`harness.store.gc.discard_unused`,
    under the gc lock: another process's realize or project that still needs one keeps it). A
    lock of this realize whose environment is not there (it failed) keeps its own. The wheels
    built from sdists stay: making one again takes a build (a compiler, minutes for some), and
    a second environment installing the same sdist takes it, offline too. A later environment
    that installs a dropped file fetches it again (binary caches first); offline it is refused,
    naming it."""
    if ctx.settings.gc_keep_wheel_files:
        return
    from harness.realize.standin import realized_lock
    from harness.store.gc import discard_unused
    from harness.store.launchcheck import check_closure
    from harness.store.roots import process_roots

    store = ctx.store
    names: set[str] = set()
    keep: set[str] = set()
    for lock in locks:
        realized = realized_lock(store, lock)
        built = {name for _, name in built_wheels(realized)}
        inputs = {name for name in build_inputs(realized) if store.is_registered(name) and name not in built}
        if lock.name in failures or not store.is_registered(realized.environment.store):
            keep |= inputs
            continue
        if not inputs:
            continue
        try:
            check_closure(store.root, [realized.environment.store])
        except HarnessError as exc:
            write_line(sys.stderr, f"warning: keeping the package files of {lock.name}: {exc}")
            keep |= inputs
            continue
        names |= inputs
    if names - keep:
        try:
            discard_unused(store, names - keep, own_roots=process_roots(store).path)
        except (HarnessError, OSError) as exc:  # the environments are realized: only say so
            write_line(sys.stderr, f"warning: could not drop the package files ({exc}); `harness store gc` does")


def _reports_unless_failed(run: _Realizing) -> list[Report]:
    """The reports, when no lock failed; else the one failure as it is (when nothing was
    realized), or :class:`RealizeFailed` naming every failure."""
    if run.failures:
        if len(run.failures) == 1 and not run.reports:
            raise next(iter(run.failures.values()))
        raise RealizeFailed(run.reports, {name: str(exc) for name, exc in run.failures.items()})
    return run.reports


def _substitute(ctx: Context, locks: list[Lock]) -> None:
    """Pull what binary caches hold of the missing paths; what they lack is built as usual.

    Offline, only caches on this machine (a directory) are asked. Fixed-output paths are
    checked against the locks' hashes, built paths need a trusted signature; anything
    refused is reported on stderr and built locally instead.
    """
    from harness.realize.standin import realized_lock

    usable = _usable_substituters(ctx)
    # The lock's own paths first (a cache may hold the uv-managed interpreter and the
    # environment built on it, which replace a host copy standing in), then whatever the
    # paths realized here still lack: the runtime closure first, and only then the build
    # inputs of an environment the caches did not have (they are not needed beside it).
    names = [
        name
        for lock in locks
        for name in lock_objects(lock)
        if not ctx.store.is_registered(name) and (name != lock.python.store or lock.python.source == "uv-managed")
    ]
    names += [name for lock in locks for name in lock_objects(realized_lock(ctx.store, lock))]
    if not usable:
        return
    _substitute_names(ctx, usable, locks, [name for name in names if not ctx.store.is_registered(name)])
    _substitute_names(ctx, usable, locks, [name for lock in locks for name in missing(ctx.store, lock)])


def _usable_substituters(ctx: Context) -> list[str]:
    """The binary caches this realize may ask: all of them, or offline only those on this
    machine (a directory)."""
    return [
        url
        for url in ctx.substituters
        if not ctx.offline or not url.split("?", 1)[0].startswith(("http://", "https://", "s3://"))
    ]


def _standins_from_caches(ctx: Context, todo: list[Lock], prepared: _Prepared) -> bool:
    """Before the fetch: pull from the binary caches the environment built on a host copy
    that is to stand in for the first time. True when the interpreters of ``todo`` were made
    ready here (into ``prepared``), so the fetch phase does not make them again.

    A host copy is named by its content (``standin.py``), so which environment a cache could
    hold for it is known only once the copy is made, and :func:`_substitute` cannot ask for
    it. Another home on a machine with the same host CPython (a cluster's nodes, the other
    members of a lab) pushed exactly that copy and the environment on it: where binary caches
    are configured and a lock's own interpreter is neither registered nor already stood in
    for, the interpreters are made ready first (copied, hashed: not registered), the
    environment on each new host copy and the rest of its closure are pulled, and a copy the
    cache had is noted as standing in at once (its staged twin is dropped). The fetch then
    leaves out the package files that environment needed, which the pushing home may not
    have kept (``[gc] keep-wheel-files = false``). What the caches lack is built as before;
    the cost is that the copy no longer overlaps the fetch in that first realize. Only where
    a host copy is known to stand in (:func:`_standin_expected`): an interpreter uv may still
    download overlaps the fetch as before."""
    usable = _usable_substituters(ctx)
    if not usable:
        return False
    from harness.lock.storepaths import with_interpreter
    from harness.realize.standin import own_interpreter_registered
    from harness.store.standins import remember_standin, standin_for

    store = ctx.store
    first = [
        lock
        for lock in todo
        if not own_interpreter_registered(store, lock)
        and standin_for(store, lock.python.store) is None
        and _standin_expected(ctx, lock)
    ]
    if not first:
        return False
    _prepare_interpreters(ctx, todo, prepared)
    for lock in first:
        ready = prepared.interpreters.get(lock.python.store)
        if ready is None or ready.error is not None or ready.reason is None:
            continue  # the lock's own interpreter after all (uv installs it), or none at all
        standin = with_interpreter(lock, ready.name)
        _hold_standin(store, lock, ready.name)
        _substitute_names(ctx, usable, [lock], list(lock_objects(standin)))
    for python_store, ready in prepared.interpreters.items():
        if ready.error is None and ready.reason is not None and store.is_registered(ready.name):
            if ready.staged is not None:  # the cache's copy has the same content, hence name
                ready.staged.discard()
                ready.staged = None
            remember_standin(store, python_store, ready.name, ready.reason)
    return True


def _standin_expected(ctx: Context, lock: Lock) -> bool:
    """Whether a host copy is to stand in for ``lock``'s interpreter, known without asking uv
    (the checks :func:`_stage_own_interpreter` makes before it does): a host lock, offline, uv's
    downloads forbidden, or one that failed in this realize or a short while ago."""
    from harness.realize.interpreter import why_no_download
    from harness.realize.unreachable import download_key, remembered

    python = lock.python
    if python.source != "uv-managed" or ctx.offline or python.store in ctx.unavailable or why_no_download():
        return True
    if ctx.refresh:
        return False
    key = download_key(python.store, ctx.settings.python_download_env())
    return remembered(ctx.cache_dir, key, minutes=ctx.settings.python_download_retry_minutes) is not None


def _substitute_names(ctx: Context, usable: list[str], locks: list[Lock], names: list[str]) -> None:
    """Pull ``names`` (those not registered) from the ``usable`` caches (:func:`_substitute`)."""
    from harness.cache.substitute import expected_from_locks, substitute

    names = list(dict.fromkeys(name for name in names if not ctx.store.is_registered(name)))
    if not names:
        return
    substitute(
        ctx.store,
        names,
        substituters=usable,
        trusted_keys=list(ctx.trusted_keys),
        expected=expected_from_locks(locks),
        cache_dir=ctx.cache_dir,
        jobs=ctx.jobs,
        show_progress=ctx.show_progress,
        warn=lambda line: _warn_once(ctx, line),
    )


def _warn_once(ctx: Context, line: str) -> None:
    import sys

    if line not in ctx.warned:
        ctx.warned.add(line)
        write_line(sys.stderr, f"warning: {line}")


def _complete(ctx: Context, lock: Lock) -> Report:
    """The report of a lock whose every path is registered: nothing to build or fetch."""
    from harness.realize.standin import realized_lock

    realized = realized_lock(ctx.store, lock)
    present = [name for name in all_objects(realized) if ctx.store.is_registered(name)]
    report = Report(lock.name, realized.environment.store, present=sorted(present))
    report.impure += interpreter_notes(ctx.store, lock, realized)
    report.impure += built_wheel_notes(ctx.store, realized)
    return report


def built_wheel_notes(store: Store, realized: Lock) -> list[str]:
    """What a report says about the wheels built from sdists for ``realized`` (the lock as
    realized here): each compiled with this machine's toolchain, which the lock does not name."""
    notes = []
    for _, name in built_wheels(realized):
        record = store.record(name)
        if record is not None and record.impure:
            notes.append(f"{name}: {record.impure}")
    return notes


def interpreter_notes(store: Store, lock: Lock, realized: Lock) -> list[str]:
    """What a report says about the interpreter realized for ``lock``: nothing when it is the
    lock's own; the host copy, what it stands in for and why, when one stands in."""
    from harness.realize.standin import standin_note

    if realized.python.store != lock.python.store:
        return [standin_note(store, lock, realized)]
    record = store.record(lock.python.store)
    return [f"{lock.python.store}: {record.impure}"] if record is not None and record.impure else []


# -- phase 1: fetch --------------------------------------------------------------------


def _files_to_fetch(ctx: Context, locks: list[Lock]) -> dict[str, _Wanted]:
    """sha256 → (what, job data) for every file that is neither stored nor downloaded: the
    weight files, and the package files only where the environment (as realized here) must be
    built (:func:`harness.lock.objects.needed_build_inputs`)."""
    from harness.realize.standin import realized_lock

    wanted: dict[str, _Wanted] = {}
    for lock in locks:
        realized = realized_lock(ctx.store, lock)
        needed = _needed(ctx, realized).difference(_streamed(ctx, realized))
        for package in [*lock.packages, *lock.build_packages]:
            file = chosen_file(package, lock)
            if file.store not in needed:
                continue
            if not ctx.store.is_registered(file.store) and not ctx.download_path(file.sha256).is_file():
                wanted.setdefault(file.sha256, ("file", (package.index, package.name, file)))
        for weights in lock.weights:
            if ctx.store.is_registered(weights.store):
                continue
            for item in weights.files:
                if not ctx.download_path(item.sha256).is_file():
                    wanted.setdefault(item.sha256, ("weight", (weights, item)))
    return wanted


def _streamed(ctx: Context, realized: Lock) -> dict[str, tuple[str, str, LockedFile]]:
    """The wheels uv downloads straight into the environment of ``realized`` (the lock as
    realized here), by store name: (index, project, file). With ``[gc] keep-wheel-files =
    false`` and online, the store is not to keep a wheel once its environment is built, so it
    never holds one it lacks: the environment's sync downloads it instead, checking its
    sha256 as it streams and unpacking it meanwhile, where a fetch would write it whole and
    only then let uv unpack it (issue 30). Only a wheel of a package (not a build package's
    file, nor one the environment's own source builds take: those must be files) from an
    index whose address carries no credentials, neither registered nor downloaded already
    (a binary cache, another lock, or a repair may have it). Offline, only those whose
    address is noted beside uv's cache (:attr:`Context.wheel_urls`): uv streamed them into
    an earlier environment and installs them from its cache. Empty otherwise."""
    if ctx.settings.gc_keep_wheel_files or ctx.rebuild or ctx.store.is_registered(realized.environment.store):
        return {}  # (a registered environment is not synced again: nothing to stream)
    from harness.download import split_credentials

    files = {chosen_file(p, realized).store for p in [*realized.build_packages, *_sources_build_set(realized)]}
    streamed: dict[str, tuple[str, str, LockedFile]] = {}
    for package in realized.packages:
        file = chosen_file(package, realized)
        if not file.file.endswith(".whl") or file.store in files or ctx.store.is_registered(file.store):
            continue
        if ctx.download_path(file.sha256).is_file():
            continue
        if ctx.offline and file.sha256 not in ctx.wheel_urls:
            continue
        address = ctx.settings.index_url(package.index)
        if address is not None and (not address.startswith(("http://", "https://")) or split_credentials(address)[1]):
            continue
        streamed[file.store] = (package.index, package.name, file)
    return streamed


def _check_offline(ctx: Context, locks: list[Lock]) -> None:
    from harness.resolve.git import mirror_path

    problems: list[str] = []
    for _sha, wanted in sorted(_files_to_fetch(ctx, locks).items(), key=lambda kv: str(kv[1])):
        if wanted[0] == "file":
            index, project, file = wanted[1]
            problems.append(f"wheel {file.file} (index {index})")
        else:
            weights, item = wanted[1]
            note = ""
            if ctx.local_weights is not None:
                local = ctx.local_weights.path_for(weights, item)
                size = local.stat().st_size if local.is_file() else None
                if size == item.size:
                    continue  # copied (and checked) from the deploy's weights folder
                note = f"; the deploy's weights folder {'lacks' if size is None else 'has another size of'} {local}"
            if weights.provider != "path":
                problems.append(f"weight file {weights.dir}/{item.path} ({weights.provider} {weights.repo}{note})")
    for lock in locks:
        for source in lock.sources:
            if ctx.store.is_registered(source.store):
                continue
            for repo, commit in [(source.repo, source.commit), *((m.url, m.commit) for m in source.submodules)]:
                if not mirror_path(ctx.cache_dir, repo).is_dir():
                    problems.append(f"source {repo} at {commit[:12]}")
        # The interpreter is not listed: offline, uv installs from its archive cache or a
        # host copy stands in (realize says so); neither needs the network.
    if problems:
        listed = "\n  ".join(sorted(set(problems)))
        raise OfflineMissing(
            f"offline, and the store lacks {len(set(problems))} thing(s):\n  {listed}",
            hint="run `harness realize` once with network, or pull from a cache",
        )


def _fetch(ctx: Context, locks: list[Lock]) -> None:
    from harness.realize.fetch import fetch_all

    wanted = _files_to_fetch(ctx, locks)
    if not wanted:
        return
    from harness.resolve.indexpages import index_address

    ctx.downloads.mkdir(parents=True, exist_ok=True)
    jobs: list[FetchJob] = []
    addresses: dict[str, str] = {}
    for _sha, item in sorted(wanted.items()):
        if item[0] == "file":
            index, project, file = item[1]
            if index not in addresses:
                addresses[index] = index_address(index, ctx.settings, ctx.cache_dir)
            jobs.append(_file_job(ctx, file, functools.partial(_file_url, addresses[index], project, file.file)))
        else:
            weights, weight_file = item[1]
            jobs.append(_weight_job(ctx, weights, weight_file))
    # Largest first: the longest download starts at once rather than last, and each job reads
    # its project's index page as it starts (once per page), so the downloads do not wait for
    # every page to be read first.
    jobs.sort(key=lambda job: -job.size)
    fetch_all(jobs, max_workers=ctx.jobs, progress=ctx.progress)


def _file_url(address: str, project: str, file: str) -> str:
    """The address of ``file`` of ``project`` on the index at ``address`` (its page read once
    per process: :func:`harness.resolve.indexpages.find_file_urls`)."""
    from harness.resolve.indexpages import find_file_urls

    return find_file_urls(address, project, [file])[file]


def _file_urls(ctx: Context, wanted: list[tuple[str, str, LockedFile]]) -> dict[str, str]:
    """Each wanted file's URL, one index page per (index, project), read by daemon threads,
    which an interrupt does not wait for (a thread pool's are joined when the process exits:
    a page that hangs held a Ctrl-C up to the read's timeout, 60 s)."""
    from harness.resolve.indexpages import find_file_urls, index_address

    by_project: dict[tuple[str, str], list[str]] = {}
    for index, project, file in wanted:
        by_project.setdefault((index, project), []).append(file.file)
    addresses = {index: index_address(index, ctx.settings, ctx.cache_dir) for index, _ in by_project}

    def look_up(item: tuple[tuple[str, str], list[str]]) -> dict[str, str]:
        (index, project), files = item
        return find_file_urls(addresses[index], project, files)

    # One page per project, read in parallel: each is a round trip to the index.
    urls: dict[str, str] = {}
    for found in _in_daemon_threads(look_up, sorted(by_project.items()), max(1, min(ctx.jobs, len(by_project)))):
        urls.update(found)
    return urls


def _in_daemon_threads(function: Callable[[_T], _R], items: list[_T], workers: int) -> list[_R]:
    """``[function(item) for item in items]`` over up to ``workers`` daemon threads; the first
    error any raised is raised once all are done."""
    results: dict[int, _R] = {}
    errors: list[BaseException] = []
    todo = list(enumerate(items))
    taking = threading.Lock()

    def work() -> None:
        while True:
            with taking:
                if not todo:
                    return
                index, item = todo.pop()
            try:
                results[index] = function(item)
            except BaseException as exc:  # raised by the caller, in its own thread
                errors.append(exc)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [results[index] for index in range(len(items))]


def _file_job(ctx: Context, file: LockedFile, url: Callable[[], str]) -> FetchJob:
    from harness.download import download
    from harness.realize.fetch import FetchJob

    def run(progress: Progress) -> None:
        with ctx.download_lock(file.sha256):
            if ctx.download_path(file.sha256).is_file() or ctx.store.is_registered(file.store):
                return  # another realize fetched it while this one waited
            download(url(), ctx.download_path(file.sha256), sha256=file.sha256, size=file.size, progress=progress)

    return FetchJob(label=file.file, size=file.size, run=run)


def _weight_job(ctx: Context, weights: LockedWeights, item: LockedWeightFile) -> FetchJob:
    from harness.realize.fetch import FetchJob, fetch_weight, weight_label

    def run(progress: Progress) -> None:
        with ctx.download_lock(item.sha256):
            if ctx.download_path(item.sha256).is_file() or ctx.store.is_registered(weights.store):
                return  # another realize fetched it while this one waited
            fetch_weight(
                weights,
                item,
                ctx.download_path(item.sha256),
                project_root=ctx.project_root,
                settings=ctx.settings,
                progress=progress,
                local=ctx.local_weights,
                offline=ctx.offline,
            )

    return FetchJob(label=weight_label(weights, item, ctx.local_weights), size=item.size, run=run)


# -- phase 2: register -----------------------------------------------------------------


def _take_download(ctx: Context, sha256: str, size: int, dest: Path) -> None:
    """Put a verified download into a build folder: a hard link (no second copy on disk)
    where only this user can write the downloads folder; a copy checked again against
    ``sha256`` and ``size`` where others can (a shared home's ``cache/downloads`` is
    group-writable: another member could change the file's bytes after :func:`_fetch`
    checked them, and a hard link would carry them into this store path).

    The download itself stays until :func:`_drop_downloads` removes what the store now
    holds, so several objects (or several realizes) sharing one file all find it.
    """
    from harness.download import copy_checked

    source = ctx.download_path(sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with ctx.download_lock(sha256):
        if not source.is_file():
            raise HarnessError(
                f"download of {dest.name} (sha256 {sha256}) vanished before registration", hint="run the realize again"
            )
        if _others_may_write(ctx.downloads):
            try:
                copy_checked(source, dest, sha256=sha256, size=size, where=f"realize of {dest.name}")
            except HarnessError:
                # Not kept for the next realize to trip over (it would skip the download):
                # the folder is not sticky, so this member can remove another's file.
                with contextlib.suppress(OSError):
                    source.unlink()
                raise
            return
        try:
            os.link(source, dest)
        except OSError:
            shutil.copyfile(source, dest)


def _others_may_write(folder: Path) -> bool:
    """Whether users other than this one can add, rename or change files in ``folder``."""
    try:
        st = folder.stat()
    except OSError:
        return True
    return st.st_uid != os.geteuid() or bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _drop_downloads(ctx: Context, locks: list[Lock], *, weights: bool = True) -> None:
    """Remove downloads whose objects are registered: the store holds their bytes now.
    ``weights=False``: the package files' only (a weight file of one lock's set may be a file
    of another lock's set, registered later in the same realize from the same download)."""
    for lock in locks:
        done: list[tuple[str, bool]] = []
        for package in [*lock.packages, *lock.build_packages]:
            file = chosen_file(package, lock)
            done.append((file.sha256, ctx.store.is_registered(file.store)))
        for weight_set in lock.weights if weights else []:
            done += [(f.sha256, ctx.store.is_registered(weight_set.store)) for f in weight_set.files]
        for sha256, registered in done:
            if registered and ctx.download_path(sha256).exists():
                with ctx.download_lock(sha256):
                    ctx.download_path(sha256).unlink(missing_ok=True)


@dataclass
class _Prepared:
    """What one realize built in the store's scratch alongside the fetch phase, by store name
    of what needs it: interpreters by the lock interpreter's name, git sources by their own
    (a source that failed: its error). Each is registered by the first lock that needs it and
    is realized; :meth:`release` drops the rest."""

    interpreters: dict[str, _Interpreter] = field(default_factory=dict)
    sources: dict[str, Staged | HarnessError] = field(default_factory=dict)
    #: Set when the fetch failed for good: the builds stop at their next phase (all is dropped).
    stop: threading.Event = field(default_factory=threading.Event)

    def release(self, *, now: bool = True) -> None:
        for interpreter in self.interpreters.values():
            interpreter.release(now=now)
        for source in self.sources.values():
            if isinstance(source, Staged):
                source.discard(now=now)


@dataclass
class _Realizing:
    """One :func:`realize_locks` as it goes: what was built in the store's scratch alongside
    the fetch phase, the locks that failed (by name: their error), per lock that failed while
    registering the paths it newly registered (:func:`_register`'s ``left``), and the reports
    of the locks realized."""

    prepared: _Prepared = field(default_factory=_Prepared)
    failures: dict[str, HarnessError] = field(default_factory=dict)
    given_up: dict[str, set[str]] = field(default_factory=dict)
    reports: list[Report] = field(default_factory=list)


def _prepare_interpreters(ctx: Context, locks: list[Lock], prepared: _Prepared) -> None:
    """Each distinct interpreter of ``locks``, made ready (:func:`_prepare_interpreter`) into
    ``prepared``: one after the other, in name order (their guards are always taken in one
    order, so two realizes never wait for each other)."""
    by_name = {lock.python.store: lock for lock in locks}
    progress = ctx.progress.until(prepared.stop)
    for name in sorted(by_name):
        try:
            ready = _prepare_interpreter(ctx, by_name[name], progress=progress)
        except HarnessError as exc:
            ready = _Interpreter(error=exc)
        except Stopped:
            return
        if ready is not None:
            prepared.interpreters[name] = ready


def _prepare_sources(ctx: Context, locks: list[Lock], prepared: _Prepared) -> None:
    """Export and check each git source of ``locks`` the store lacks into its scratch, into
    ``prepared`` (a source that cannot be had: its error, raised when a lock registers)."""
    progress = ctx.progress.until(prepared.stop)
    for source in {s.store: s for lock in locks for s in lock.sources}.values():
        if ctx.store.is_registered(source.store):
            continue
        try:
            prepared.sources[source.store] = _stage_source(ctx, source, progress)
        except HarnessError as exc:
            prepared.sources[source.store] = exc
        except Stopped:
            return


def _give_up(ctx: Context, failed: list[Lock], succeeded: list[Lock], given_up: dict[str, set[str]]) -> None:
    """Delete again the paths that ``failed`` locks newly registered before they failed
    (``given_up``, by lock name), except those a lock in ``succeeded`` realized and those
    another process has taken into use (:func:`harness.store.gc.discard_unused`).

    Before a package file's path goes, its bytes go back to ``downloads/<sha256>`` (a hard
    link, checked against the lock's sha256 as a download is), and a weight set's files too
    where their download is gone; a host copy's stand-in note goes with it. A rollback that
    itself fails only warns: the lock's own error is the one to report, and the paths left are
    valid ones that ``harness store gc`` removes.
    """
    names = {name for lock in failed for name in given_up[lock.name]}
    if not names:
        return
    try:
        _discard_given_up(ctx, failed, succeeded, names)
    except (HarnessError, OSError) as exc:
        import sys

        print(
            f"warning: could not remove what the failed lock(s) registered ({exc}); "
            "those paths are complete, and `harness store gc` removes them",
            file=sys.stderr,
        )


def _discard_given_up(ctx: Context, failed: list[Lock], succeeded: list[Lock], names: set[str]) -> None:
    """The work of :func:`_give_up`, which reports what this raises."""
    from harness.realize.standin import realized_lock
    from harness.store.gc import discard_unused
    from harness.store.roots import process_roots
    from harness.store.standins import forget_standin

    names -= {name for lock in succeeded for name in all_objects(realized_lock(ctx.store, lock))}
    if not names:
        return
    files: dict[str, list[tuple[str, int, str]]] = {}  # store name -> (sha256, size, file in it)
    notes: dict[str, str] = {}  # host copy -> the interpreter it stands in for
    for lock in failed:
        for package in [*lock.packages, *lock.build_packages]:
            file = chosen_file(package, lock)
            files.setdefault(file.store, [(file.sha256, file.size, file.file)])
        for weights in lock.weights:
            files.setdefault(weights.store, [(item.sha256, item.size, item.path) for item in weights.files])
        host = realized_lock(ctx.store, lock).python.store
        if host != lock.python.store:
            notes[host] = lock.python.store

    def before_delete(name: str) -> None:
        for sha256, size, rel in files.get(name, []):
            _salvage_download(ctx, sha256, size, ctx.store.root / name / rel)
        if name in notes:
            forget_standin(ctx.store, notes[name], name)

    # This process's own roots name them all (realize_locks held them first): they keep nothing.
    discard_unused(ctx.store, names, own_roots=process_roots(ctx.store).path, before_delete=before_delete)


def _salvage_download(ctx: Context, sha256: str, size: int, stored: Path) -> None:
    """Put ``stored`` (a registered file about to be deleted) back at ``downloads/<sha256>``
    unless a download is there: a hard link (a copy where none can be made), kept only when
    its size and sha256 are the lock's, as a download is (:mod:`harness.download`)."""
    from harness.store.hashing import file_sha256

    dest = ctx.download_path(sha256)
    with ctx.download_lock(sha256):
        if dest.is_file() or not stored.is_file():
            return
        temp = dest.with_name(f"{sha256}.{os.getpid()}.back")
        temp.unlink(missing_ok=True)
        try:
            try:
                os.link(stored, temp)
            except OSError:
                shutil.copyfile(stored, temp)
            if temp.stat().st_size == size and file_sha256(temp) == sha256:
                os.replace(temp, dest)
        finally:
            temp.unlink(missing_ok=True)


def _register(ctx: Context, lock: Lock, prepared: _Prepared | None = None, left: set[str] | None = None) -> Report:
    """Register every path of ``lock`` in dependency order (module doc) and build its
    environment. When it fails after registering some, ``left`` receives the paths it newly
    registered (not registered when it began), for the caller to give up again."""
    store = ctx.store
    from harness.realize.standin import realized_lock

    prepared = prepared or _Prepared()
    # What could not be made ready fails the lock before any of its paths is registered.
    for source in lock.sources:
        failed = prepared.sources.get(source.store)
        if isinstance(failed, HarnessError):
            raise failed
    interpreter = prepared.interpreters.get(lock.python.store)
    if interpreter is not None and interpreter.error is not None:
        raise interpreter.error
    report = Report(lock.name, lock.environment.store)
    candidates = {*all_objects(lock), *all_objects(realized_lock(store, lock))}
    present = {name for name in candidates if store.is_registered(name)}
    try:
        return _register_paths(ctx, lock, prepared, report, present)
    except Exception:
        if left is not None:
            # Computed again: a host copy built here has a name of its own (its content's).
            names = candidates | set(all_objects(realized_lock(store, lock)))
            left.update(name for name in names - present if store.is_registered(name))
        raise


def _register_paths(ctx: Context, lock: Lock, prepared: _Prepared, report: Report, present: set[str]) -> Report:
    """The body of :func:`_register`; ``present``: the lock's paths registered before it.

    The package files are registered once the interpreter is known: which of them are
    needed follows from whether the environment on it is registered
    (:func:`harness.lock.objects.needed_build_inputs`)."""
    store = ctx.store
    report.present = sorted(present)
    for source in lock.sources:
        staged = prepared.sources.pop(source.store, None)
        if isinstance(staged, Staged):
            store.commit(staged, source.store, expected_content=source.tree)
        else:
            _add_source(ctx, source)
    for weights in lock.weights:
        _add_weights(ctx, weights)
    from harness.lock.storepaths import weights_view_path

    view = weights_view_path(lock)
    if view:
        _add_weights_view(ctx, lock, view)
    from harness.realize.views import add_source_views

    add_source_views(ctx.store, lock)
    from harness.lock.storepaths import with_interpreter

    if lock.python.store in prepared.interpreters:
        python_store = _commit_interpreter(ctx, lock, prepared.interpreters.pop(lock.python.store))
    else:
        python_store = _add_interpreter(ctx, lock)
    realized = lock if python_store == lock.python.store else with_interpreter(lock, python_store)
    report.environment = realized.environment.store
    report.impure += interpreter_notes(store, lock, realized)
    _add_package_files(ctx, realized)
    _add_built_wheels(ctx, realized)
    report.impure += built_wheel_notes(store, realized)
    _add_environment(ctx, realized)
    used = {*lock_objects(realized), *(n for n in build_inputs(realized) if store.is_registered(n))}
    report.built = sorted(used - present)
    report.present = sorted(used & present)
    return report


def _add_package_files(ctx: Context, realized: Lock) -> None:
    """Register the package files the environment of ``realized`` (the lock on the interpreter
    just registered) must be built from and the store lacks, each from its checked download.
    One the fetch phase did not foresee (the lock's own interpreter came where a host copy's
    environment was realized) is fetched now; offline, the realize fails naming it."""
    store = ctx.store
    needed = _needed(ctx, realized).difference(_streamed(ctx, realized))
    wanted_once: dict[str, tuple[str, LockedFile]] = {}
    for package in [*realized.packages, *realized.build_packages]:
        file = chosen_file(package, realized)
        if file.store in needed:
            wanted_once.setdefault(file.store, (package.index, file))
    adding = [item for name, item in wanted_once.items() if not store.is_registered(name)]
    if adding:
        _register_files(ctx, realized, adding)
    # Drop the downloads the store now holds *before* the environment is built: unlinking a
    # download (a second name of a store file) changes the file's ctime, which uv's cache
    # keys local wheels on, so dropping it later made the next environment's uv unpack every
    # wheel again (a second copy in uv's cache, and the time it takes). Only the package
    # files': the weight sets were registered just before, and another lock may share a file.
    _drop_downloads(ctx, [realized], weights=False)


def _register_files(ctx: Context, realized: Lock, adding: list[tuple[str, LockedFile]]) -> None:
    """Register each (index, file) of ``adding`` from its download, fetched first where gone."""
    store = ctx.store
    if any(not ctx.download_path(file.sha256).is_file() for _, file in adding):
        if ctx.offline:
            _check_offline(ctx, [realized])
        _fetch(ctx, [realized])

    def add_file(index: str, file: LockedFile) -> None:
        # A folder holding the file under its own name: installers read a wheel's tags and
        # version from its file name, which the store path's hash prefix would hide.
        def build(out: Path) -> BuildResult:
            out.mkdir()
            _take_download(ctx, file.sha256, file.size, out / file.file)
            return BuildResult(obtained=f"index {index}")

        store.add(file.store, "file", build)

    with (
        ctx.progress.phase(f"registering {len(adding)} package file(s)", total=len(adding)) as phase,
        ThreadPoolExecutor(max_workers=max(1, ctx.jobs)) as pool,
    ):
        for _ in pool.map(lambda item: add_file(*item), adding):
            phase.advance()


def _source_builder(
    ctx: Context, source: LockedSource, progress: Reporter | None = None
) -> Callable[[Path], BuildResult]:
    """The store builder of a locked git source: its files at the locked commit, *unchecked*.

    The export does not hash the files itself (``check_tree=False``): the store hashes what
    the builder made (:meth:`Store.stage`), and :func:`_stage_source` compares that with the
    lock's tree hash before anything is registered; one read of every byte, not two.
    """
    from harness.resolve.git import export_source
    from harness.resolve.pins import GitSource, Submodule

    pin = GitSource(
        name=source.name,
        repo=source.repo,
        rev=source.rev,
        commit=source.commit,
        tree=source.tree,
        install=source.install,
        subdirectory=source.subdirectory,
        submodules=tuple(Submodule(m.path, m.url, m.commit) for m in source.submodules),
    )

    def build(out: Path) -> BuildResult:
        with (progress or ctx.progress).phase(f"exporting source {source.name} at {source.commit[:12]} (git)"):
            export_source(
                pin, ctx.cache_dir, out, offline=ctx.offline, mirrors=ctx.settings.git_mirrors, check_tree=False
            )
        return BuildResult(obtained=f"git {source.repo} {source.commit}")

    return build


def _add_source(ctx: Context, source: LockedSource) -> None:
    """Register a git source that was not staged ahead (:func:`_stage_source`, then commit)."""
    if not ctx.store.is_registered(source.store):
        ctx.store.commit(_stage_source(ctx, source, ctx.progress), source.store, expected_content=source.tree)


def _stage_source(ctx: Context, source: LockedSource, progress: Reporter) -> Staged:
    """A git source exported and hashed (once) in the store's scratch, checked against the
    lock's tree hash, not registered. When they differ, GitError names the repo, the commit
    and both hashes, and nothing is kept."""
    from harness.resolve.git import GitError, tree_mismatch

    staged = ctx.store.stage("source", _source_builder(ctx, source, progress), label=source.store, progress=progress)
    if staged.digest.hash != source.tree:
        staged.discard()
        message = tree_mismatch(source.repo, source.commit, staged.digest.hash, source.tree)
        raise GitError(f"{message}; nothing was registered")
    return staged


def _add_weights(ctx: Context, weights: LockedWeights) -> None:
    def build(out: Path) -> BuildResult:
        out.mkdir()
        for item in weights.files:
            _take_download(ctx, item.sha256, item.size, out / item.path)
        return BuildResult(
            obtained=f"{weights.provider} {weights.repo}" + (f"@{weights.revision}" if weights.revision else "")
        )

    ctx.store.add(weights.store, "weights", build, progress=ctx.progress)


def _add_weights_view(ctx: Context, lock: Lock, view: str) -> None:
    def build(out: Path) -> BuildResult:
        out.mkdir()
        for weights in lock.weights:
            link = out / weights.dir
            link.parent.mkdir(parents=True, exist_ok=True)
            # Relative links, computed from where the view will live (not the build folder):
            # the view means the same in every store location.
            final_parent = (ctx.store.root / view / weights.dir).parent
            target = os.path.relpath(ctx.store.root / weights.store, final_parent)
            link.symlink_to(target)
        return BuildResult(obtained="links")

    ctx.store.add(view, "weights-view", build, references=tuple(w.store for w in lock.weights))


@dataclass
class _Interpreter:
    """The interpreter a lock is built on here, made ready during the fetch phase but not yet
    registered (:func:`_prepare_interpreter`); :func:`_commit_interpreter` registers it.

    ``name`` is the store path it is (or will be) registered under: the lock's own, or a host
    copy's. ``staged`` holds a new build in the store's scratch (None when ``name`` is already
    registered); ``reason`` says why a host copy stands in (None for the lock's own);
    ``guard`` is the lock on ``<lock interpreter>.standin``, held from before the lookup until
    the build is registered or dropped, so concurrent realizes build one interpreter at a time
    and never register one that another is about to. ``error`` is why none could be had (the
    lock fails, at registration, with it).
    """

    name: str = ""
    staged: Staged | None = None
    reason: str | None = None
    guard: PathLock | None = None
    error: HarnessError | None = None

    def release(self, *, now: bool = True) -> None:
        """Drop what was not registered and let concurrent realizes go on. Idempotent.
        ``now=False``: the scratch build is left to the next clean (an interrupt)."""
        if self.staged is not None:
            self.staged.discard(now=now)
            self.staged = None
        if self.guard is not None:
            self.guard.release()
            self.guard = None


def _standin_guard(store: Store, python_store: str) -> PathLock:
    """The lock serializing interpreter builds for ``python_store`` among realizes; not tied to
    a thread (it is taken while preparing and released after registering, on another)."""
    from harness.store.store import lock_file

    store.lock(f"{python_store}.standin")  # checks the name, makes the folders
    return lock_file(store.locks_dir / f"{python_store}.standin.lock", thread_local=False)


def _prepare_interpreter(ctx: Context, lock: Lock, *, progress: Reporter | None = None) -> _Interpreter | None:
    """Make the interpreter ``lock`` is built on here ready to register, registering nothing;
    None when the lock's own is registered already.

    The lock's own when it is registered or uv can install it now; else the host copy that
    already stands in for it, else a new host copy (module doc, ``standin.py``). New builds
    are staged in the store's scratch (:meth:`Store.stage`): realize runs this alongside the
    fetch phase and registers the result only once every download is in, so a realize that
    fails leaves the store as it was. A host copy is hashed once, there: its name is its
    content's.
    """
    from harness.realize.standin import own_interpreter_registered

    store = ctx.store
    progress = progress or ctx.progress
    if own_interpreter_registered(store, lock):
        return None
    # One interpreter build at a time per lock interpreter: concurrent realizes wait for the
    # first rather than each installing or copying and compiling the same interpreter.
    guard = _standin_guard(store, lock.python.store)
    prepared = _Interpreter(guard=guard)
    guard.acquire()
    try:
        if own_interpreter_registered(store, lock):  # the realize we waited for registered it
            prepared.release()
            return None
        if not _stage_own_interpreter(ctx, lock, prepared, progress):
            _prepare_host_copy(ctx, lock, prepared, progress)
        return prepared
    except BaseException:
        prepared.release()
        raise


def _stage_own_interpreter(ctx: Context, lock: Lock, prepared: _Interpreter, progress: Reporter) -> bool:
    """Stage the lock's own interpreter into ``prepared`` (uv installs it); False, with
    ``prepared.reason`` saying why, when it cannot be had here: a host one, or one uv could
    not download (in this realize already: ``ctx.unavailable``; in an earlier one, less than
    ``download-retry-minutes`` ago: ``harness/realize/unreachable.py``, unless ``ctx.refresh``;
    or now, which is then remembered)."""
    from harness.realize.interpreter import DownloadUnavailable, build_uv_managed
    from harness.realize.unreachable import download_key, forget_unreachable, remember_unreachable, remembered

    python = lock.python
    if python.source == "uv-managed" and python.store in ctx.unavailable:
        prepared.reason = ctx.unavailable[python.store]
        return False
    if python.source != "uv-managed":
        prepared.reason = (
            f'the lock\'s interpreter is a host one (source = "host": uv offers no download of '
            f"CPython {python.version} for {python.platform})"
        )
        return False
    key = download_key(python.store, ctx.settings.python_download_env())
    known = None if ctx.refresh else remembered(ctx.cache_dir, key, minutes=ctx.settings.python_download_retry_minutes)
    if known is not None:  # uv failed to download it a short while ago: not waited on again
        prepared.reason = ctx.unavailable[python.store] = known.note()
        return False

    def build(out: Path) -> BuildResult:
        out.mkdir()
        result = build_uv_managed(
            python,
            out,
            cache_dir=ctx.cache_dir,
            offline=ctx.offline,
            uv_env=ctx.settings.python_download_env(),
            progress=progress,
            jobs=ctx.compile_jobs,
        )
        return BuildResult(obtained=result.source)

    try:
        prepared.staged = ctx.store.stage("python", build, label=python.store, progress=progress)
    except DownloadUnavailable as exc:
        prepared.reason = ctx.unavailable[python.store] = exc.reason
        if exc.tried and ctx.settings.python_download_retry_minutes > 0:
            remember_unreachable(ctx.cache_dir, key, exc.reason)
        return False
    forget_unreachable(ctx.cache_dir, key)
    prepared.name = python.store
    return True


def _prepare_host_copy(ctx: Context, lock: Lock, prepared: _Interpreter, progress: Reporter) -> None:
    """Make a host copy ready to stand in for ``lock``'s interpreter (``prepared.reason``
    says why), into ``prepared``: the one that stands in already, else a new copy staged.
    No host interpreter either: an error with a hint naming the pins that would work."""
    from harness.lock.storepaths import host_interpreter_path
    from harness.realize.interpreter import build_host_copy
    from harness.store.standins import standin_for

    store, python = ctx.store, lock.python
    host = standin_for(store, python.store)
    if host is not None:
        # Rooted, then looked up again: a concurrent `store gc` may have taken it between
        # the lookup and the root (nothing else roots a stand-in while the lock is unrooted).
        _hold_standin(store, lock, host)
        host = standin_for(store, python.store)
    if host is not None:
        prepared.name = host
        return

    versions: list[str] = []

    def copy(out: Path) -> BuildResult:
        out.mkdir()
        result = build_host_copy(python, out, progress=progress, jobs=ctx.compile_jobs)
        versions.append(result.version)
        impure = result.source
        if result.version != python.version:  # another release of the series stands in
            impure += f" (CPython {result.version}: no {python.version} on this machine)"
        return BuildResult(obtained=result.source, impure=impure)

    try:
        prepared.staged = store.stage("python", copy, label=f"cpython-{python.version}-host", progress=progress)
    except HarnessError as exc:  # no host interpreter either: say which pins would work
        progress.check()  # unless the realize is being stopped: then nobody reads a hint
        raise HarnessError(f"{exc.message} ({prepared.reason})", hint=_interpreter_hint(ctx, lock, exc.hint)) from None
    # Named by its own content and by the version it is (a 3.11.2 copy is never "3.11.7").
    copied = python.model_copy(update={"version": versions[0]}) if versions else python
    prepared.name = host_interpreter_path(copied, prepared.staged.digest.hash)


def _commit_interpreter(ctx: Context, lock: Lock, prepared: _Interpreter | None) -> str:
    """Register what :func:`_prepare_interpreter` made ready for ``lock``; return the store
    path name of the interpreter its environment is built on. Releases ``prepared``."""
    from harness.store.standins import remember_standin

    store, python = ctx.store, lock.python
    if prepared is None:
        return python.store
    try:
        if prepared.error is not None:
            raise prepared.error
        if prepared.staged is not None:
            if prepared.reason is None:
                _drop_legacy_host_copy(store, python.store)
            else:
                _hold_standin(store, lock, prepared.name)  # before it is registered: gc never sees it unrooted
            store.commit(prepared.staged, prepared.name, expected_content=prepared.staged.digest.hash)
        if prepared.reason is not None:
            remember_standin(store, python.store, prepared.name, prepared.reason)
        return prepared.name
    finally:
        prepared.release()


def _add_interpreter(ctx: Context, lock: Lock) -> str:
    """Make ready and register the interpreter ``lock`` is built on here, at once; return its
    store path name (:func:`_prepare_interpreter`, :func:`_commit_interpreter`)."""
    return _commit_interpreter(ctx, lock, _prepare_interpreter(ctx, lock))


def _hold_standin(store: Store, lock: Lock, host: str) -> None:
    """Root host copy ``host`` and the environment built on it for as long as this process
    lives: the environment is built (or used) on it next."""
    from harness.lock.storepaths import with_interpreter
    from harness.store.roots import hold

    hold(store, [host, with_interpreter(lock, host).environment.store])


def _drop_legacy_host_copy(store: Store, python_store: str) -> None:
    """Remove a host copy that an older harness registered under the lock's own interpreter
    name, with every environment built on it: that name belongs to the uv-managed build."""
    record = store.record(python_store)
    if record is None or not record.impure:
        return
    import sys

    print(
        f"warning: removing {python_store}: a host interpreter registered under the lock's "
        "uv-managed name by an older harness, and the environments built on it",
        file=sys.stderr,
    )
    for other in list(store.records()):
        if other.kind == "environment" and python_store in other.references:
            store.delete(other.name)
    store.delete(python_store)


def _interpreter_hint(ctx: Context, lock: Lock, hint: str | None) -> str:
    """The hint for an interpreter that cannot be realized: the installed patch releases of
    its series that a ``[lock.python]`` pin could name instead, then the builder's own hint."""
    from harness.resolve.interpreter import list_pythons

    series = ".".join(lock.python.version.split(".")[:2])
    try:
        installed = sorted(
            {
                p.version
                for p in list_pythons(ctx.cache_dir)
                if p.path is not None and p.version.startswith(series + ".")
            },
            key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()),
        )
    except HarnessError:
        installed = []
    if installed:
        pin = (
            f"installed here: CPython {', '.join(installed)}; pin one in harness.toml "
            f'([lock.python] "{series}" = "{installed[-1]}") and run `harness lock`'
        )
    else:
        pin = (
            f"no CPython {series}.x is installed here; once one is, pin it in harness.toml "
            f'([lock.python] "{series}" = "{series}.N") and run `harness lock`'
        )
    return f"{pin}; or {hint}" if hint else pin


def _not_reproducible(embedded: tuple[str, ...]) -> str:
    """What an environment's record says of compiled files that name where they were built
    (an extension linked against a host interpreter copy keeps its store path as a run
    path): another home builds other bytes for them, so its content hash will differ."""
    if not embedded:
        return ""
    shown = ", ".join(embedded[:5]) + (f" and {len(embedded) - 5} more" if len(embedded) > 5 else "")
    return f"; not reproducible in another home: {shown} name this store's location"


def _add_built_wheels(ctx: Context, lock: Lock) -> None:
    """Build and register each wheel ``lock`` builds from an sdist (``lock/objects.py:built_wheels``)
    that the store lacks, build packages first: each from the registered sdist, with the
    interpreter the environment is built on, offline from the lock's build packages alone
    (``realize/environment.py:build_sdist_wheel``). Once registered, every environment that
    installs it, in this store or one that pulls it from a binary cache, installs these bytes."""
    store = ctx.store
    needed = _needed(ctx, lock)  # none once the environment is there (but a repair's)
    todo = [(package, name) for package, name in built_wheels(lock) if name in needed and not store.is_registered(name)]
    if not todo:
        return
    with ctx.progress.phase(f"building {len(todo)} wheel(s) from sdists for {lock.name}", total=len(todo)) as phase:
        for package, name in todo:
            store.add(name, "built-wheel", _wheel_builder(ctx, lock, chosen_file(package, lock)), progress=ctx.progress)
            phase.advance()


def _wheel_builder(ctx: Context, lock: Lock, sdist: LockedFile) -> Callable[[Path], BuildResult]:
    """The store builder of the wheel built from registered ``sdist`` for ``lock``: with the
    build packages' wheels registered now (a build package published as an sdist: its wheel,
    built before)."""
    from harness.realize.environment import build_sdist_wheel, host_toolchain

    store = ctx.store
    package = next(p for p in [*lock.build_packages, *lock.packages] if p.sdist == sdist)
    build_files = _build_wheel_files(store, lock, package.build_requires)
    hashes = {sdist.file: sdist.sha256, **{path.name: sha for path, sha in build_files.items()}}
    major_minor = ".".join(lock.python.version.split(".")[:2])

    def build(out: Path) -> BuildResult:
        out.mkdir()
        result = build_sdist_wheel(
            out,
            interpreter_dir=store.root / lock.python.store,
            interpreter_exe=f"bin/python{major_minor}",
            sdist=store.root / sdist.store / sdist.file,
            build_wheels=list(build_files),
            cache_dir=ctx.uv_cache_dir or ctx.cache_dir,
            hashes=hashes,
        )
        impure = None
        if result.compiled:  # the compiler and headers are the machine's: the lock names neither
            impure = f"compiled from its sdist with this machine's toolchain ({host_toolchain()})"
        obtained = f"uv {lock.uv} build of {sdist.file}" + _not_reproducible(result.embedded_paths)
        return BuildResult(obtained=obtained, impure=impure)

    return build


def _build_wheel_files(store: Store, lock: Lock, requires: list[str]) -> dict[Path, str]:
    """The wheel of every build package of ``lock`` that a build naming ``requires`` uses
    (``lock/objects.py:build_set``) in the store (a package published only as an sdist: the
    wheel built from it, once registered), with its sha256: the lock's for a downloaded
    wheel, the checked file's for a built one (:func:`_built_wheel_file`)."""
    from harness.lock.objects import build_set, built_wheel_path

    files: dict[Path, str] = {}
    for package in build_set(requires, lock):
        built = built_wheel_path(package, lock)
        if built is None:
            file = chosen_file(package, lock)
            files[store.root / file.store / file.file] = file.sha256
        elif store.is_registered(built):
            path, sha256 = _built_wheel_file(store, built)
            files[path] = sha256
    return files


def _built_wheel_file(store: Store, name: str) -> tuple[Path, str]:
    """The one wheel in registered built-wheel path ``name`` and its sha256, once the path is
    checked to hold what its record says (its NAR hash): no lock names these bytes, so the
    record's content hash is what they are held to before an installer takes them."""
    from harness.store.hashing import file_sha256, nar_digest

    folder = store.root / name
    record = store.record(name)
    wheels = sorted(folder.glob("*.whl"))
    if record is None or len(wheels) != 1:
        raise HarnessError(f"{folder}: expected one registered wheel there", hint="run `harness store verify --repair`")
    found = nar_digest(folder).hash
    if found != record.content:
        raise HarnessError(
            f"{folder}: the built wheel changed since it was registered (content {found}, registered {record.content})",
            hint="run `harness store verify --repair`",
        )
    return wheels[0], file_sha256(wheels[0])


def _sources_build_set(lock: Lock) -> list[LockedPackage]:
    """The build packages the environment's own builds (its isolated sources) may take: those
    the sources name (``build-requires``), not the sdists' sets, which may hold other versions
    of one backend; every build package for a lock written before each build named its own."""
    from harness.lock.objects import build_set

    named = sorted({r for s in lock.sources for r in s.build_requires})
    if named:
        return build_set(named, lock)
    if any(p.build_requires for p in [*lock.packages, *lock.build_packages]):
        return []  # each build names its own, and no source names any
    return list(lock.build_packages)


def _look_up_streamed(ctx: Context, locks: list[Lock]) -> None:
    """Start looking up, in a thread of its own, the addresses of the wheels uv is to download
    into the environments of ``locks`` (:func:`_streamed`), into ``ctx.file_urls``: the
    interpreters, the sources, the fetch and the sdists' builds go on meanwhile, and only an
    environment's sync waits for it (:func:`_remote_wheels`; a realize of 45 streamed wheels
    waited 5 s on these pages in phase 1). A lookup that fails is left for that build, which
    fails its own lock naming it. The thread is a daemon: an interrupt does not wait for it."""
    from harness.realize.standin import realized_lock

    streams = [_streamed(ctx, realized_lock(ctx.store, lock)) for lock in locks]
    # An environment built from uv's cache first needs none (:func:`_from_uv_cache_first`).
    wanted = {item[2].file: item for s in streams if not _from_uv_cache_first(ctx, s) for item in s.values()}
    if not wanted or ctx.offline:
        return  # offline, the addresses are the noted ones (_remote_wheels)

    def look_up() -> None:
        # Any failure is the build's to report (it looks the address up again), not a
        # traceback from a thread.
        with contextlib.suppress(Exception):
            ctx.file_urls.update(_file_urls(ctx, list(wanted.values())))

    thread = threading.Thread(target=look_up, name="harness-streamed-urls", daemon=True)
    thread.start()
    ctx.lookups.append(thread)


def _remote_wheels(ctx: Context, streamed: list[tuple[str, str, LockedFile]]) -> list[RemoteWheel]:
    """The address on its index of each wheel of ``streamed`` (:func:`_streamed`), for the
    environment's sync to download: those phase 1 started to look up (waited for here), and
    the others now (one index page per project, read in parallel)."""
    from harness.realize.environment import RemoteWheel

    from harness.realize.wheelurls import remember

    if ctx.offline:
        return _noted_wheels(ctx, streamed)
    for thread in ctx.lookups:
        thread.join()
    missing = [item for item in streamed if item[2].file not in ctx.file_urls]
    if missing:
        ctx.file_urls.update(_file_urls(ctx, missing))
    remote = [RemoteWheel(file.file, ctx.file_urls[file.file], file.sha256) for _, _, file in streamed]
    # Noted before the sync: uv's cache keeps what it streams even when a later step fails,
    # and an offline retry asks it for these addresses.
    remember(ctx.uv_cache, {wheel.sha256: wheel.url for wheel in remote})
    return remote


def _environment_sources(store: Store, lock: Lock) -> tuple[list[tuple[Path, str, str | None, bool]], list[str]]:
    """The sources ``lock``'s environment installs (folder, install mode, subdirectory, build
    isolation) and the environment's runtime references: the interpreter its ``bin/python``
    links to and the editable and path sources its ``.pth`` files name. Wheels are copied in,
    so they are build inputs, not references."""
    from harness.lock.storepaths import source_folders

    # A path source with links goes on sys.path as its view (harness/realize/views.py).
    folders = source_folders(lock)
    sources: list[tuple[Path, str, str | None, bool]] = [
        (store.root / folder, s.install, s.subdirectory, s.build_isolation)
        for s, folder in zip(lock.sources, folders, strict=True)
        if s.install != "none"
    ]
    references = [
        lock.python.store,
        *[folder for s, folder in zip(lock.sources, folders, strict=True) if s.install in ("editable", "path")],
    ]
    return sources, references


def _noted_wheels(ctx: Context, streamed: list[tuple[str, str, LockedFile]]) -> list[RemoteWheel]:
    """Each wheel of ``streamed`` at the address noted beside uv's cache when uv streamed it
    (``wheelurls.py``): uv's cache keeps it under that address."""
    from harness.realize.environment import RemoteWheel

    return [RemoteWheel(file.file, ctx.wheel_urls[file.sha256], file.sha256) for _, _, file in streamed]


def _from_uv_cache_first(ctx: Context, streamed: dict[str, tuple[str, str, LockedFile]]) -> bool:
    """Whether an online build of an environment that streams ``streamed`` takes them from uv's
    cache first, as offline: each was streamed before and its address noted (a second
    environment sharing the first one's wheels). Neither an index page is read nor an address
    asked again; where uv's cache has lost one, the build goes to the index after all
    (:func:`_add_environment`). Same bytes either way: uv checks each against the lock's sha256."""
    return not ctx.offline and bool(streamed) and all(f.sha256 in ctx.wheel_urls for _, _, f in streamed.values())


def _add_environment(ctx: Context, lock: Lock) -> None:
    """Build and register the lock's environment; then record the pycs compiled for it in the
    store's bytecode index, so the next environment on this interpreter takes them from the
    pool (``harness/store/bytecode.py``)."""
    from harness.lock.objects import built_wheel_path
    from harness.realize.bytecode import ReuseFrom, fresh_entries
    from harness.realize.environment import EnvironmentBuild, NotCached, build_environment, wheel_embedded_paths

    store = ctx.store
    if store.is_registered(lock.environment.store):
        return  # its package files may be gone (lock/objects.py:needed_build_inputs): none is needed
    built_hashes: dict[str, str] = {}
    unreproducible: list[str] = []

    def file_in_store(package: LockedPackage) -> Path:
        built = built_wheel_path(package, lock)
        if built is None:
            file = chosen_file(package, lock)
            return store.root / file.store / file.file
        path, sha256 = _built_wheel_file(store, built)
        built_hashes[path.name] = sha256
        if wheel_embedded_paths(path, [store.root], label=f"{package.name} {package.version}"):
            unreproducible.append(path.name)
        return path

    streamed = _streamed(ctx, lock)
    from_cache = _from_uv_cache_first(ctx, streamed)
    remote = _noted_wheels(ctx, list(streamed.values())) if from_cache else _remote_wheels(ctx, list(streamed.values()))
    wheels = [file_in_store(p) for p in lock.packages if chosen_file(p, lock).store not in streamed]
    build_wheels = [file_in_store(p) for p in _sources_build_set(lock)]
    sources, references = _environment_sources(store, lock)
    hashes = {chosen_file(p, lock).file: chosen_file(p, lock).sha256 for p in [*lock.packages, *lock.build_packages]}
    hashes.update(built_hashes)
    major_minor = ".".join(lock.python.version.split(".")[:2])
    reuse = ReuseFrom(store.root, lock.python.store)
    built: list[EnvironmentBuild] = []

    def build(out: Path) -> BuildResult:
        out.mkdir()
        result = build_environment(
            out,
            interpreter_dir=store.root / lock.python.store,
            interpreter_exe=f"bin/python{major_minor}",
            wheels=wheels,
            sources=sources,
            build_wheels=build_wheels,
            cache_dir=ctx.uv_cache_dir or ctx.cache_dir,
            remote_wheels=remote,
            offline=ctx.offline or from_cache,
            interpreter_store_name=lock.python.store,
            hashes=hashes,
            prompt=lock.name,
            progress=ctx.progress,
            jobs=ctx.compile_jobs,
            bytecode_from=reuse,
            against_environment=[p.name for p in lock.packages if not p.build_isolation],
        )
        built.append(result)
        embedded = (*result.embedded_paths, *(f"{wheel} (built from its sdist)" for wheel in unreproducible))
        return BuildResult(obtained=f"uv {lock.uv}" + _not_reproducible(embedded))

    digests: dict[str, str] = {}

    def add() -> None:
        store.add(
            lock.environment.store,
            "environment",
            build,
            references=tuple(references),
            progress=ctx.progress,
            digests=digests,
        )

    try:
        add()
    except NotCached:
        if not from_cache:
            raise
        # uv's cache lost a wheel it streamed: read the addresses from the index, and sync online.
        from_cache, remote = False, _remote_wheels(ctx, list(streamed.values()))
        built.clear()
        digests.clear()
        add()
    # Registered: its pycs are in the pool now (the environment kind's files are shared),
    # under the digests the seal read them for.
    for result in built:
        if result.bytecode is not None and result.bytecode.fresh:
            reuse.index.record(lock.environment.store, fresh_entries(result.bytecode, digests))
