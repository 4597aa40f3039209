"""Fetching everything a lock names, in parallel, behind one progress display.

:func:`fetch_all` runs :class:`FetchJob` s — each a label, a size and a callable doing one
checked transfer (:func:`harness.download.download` underneath) — on a thread pool.
Downloads are I/O bound and hashing (``hashlib``) releases the GIL, so threads are enough.

:func:`wheel_jobs` and :func:`weight_jobs` make the jobs for a lock's wheels and sdists and its
weight files. Addresses come from :class:`~harness.config.Settings` when the jobs *run*
(DESIGN invariant 4), and every byte is checked against the lock's sha256 before it gets its
final name (invariant 3). Where the files land is the caller's choice (``dest_for``): the
builder points them into a temporary build place of the store.

:class:`LocalWeights` is a deploy's ``weights`` folder, a local source of weight files laid
out as a service's ``{weights}`` view (``<folder>/<dir>/<path>``). :func:`fetch_weight` takes a
file from there first, copying (never linking: a store file must not share an inode with a
file its user can change) and checking it like any download; a copy that does not match is
discarded with a warning and the file comes from its locked origin as before. So nothing in
that folder can change what lands in the store, only where the bytes come from.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

from harness.download import Progress, download
from harness.config import Settings, normalize_index_name
from harness.errors import HarnessError
from harness.lock.document import Lock, LockedFile, LockedWeightFile, LockedWeights
from harness.progress import Phase, Reporter, reporter

if TYPE_CHECKING:
    from rich.console import Console

#: Files at least this big get a bar of their own under the overall one.
LARGE_FILE_BYTES = 32 << 20
#: Default parallelism: enough to fill a link with many small wheels, few enough for a hub.
DEFAULT_JOBS = 8


@dataclass(frozen=True)
class FetchJob:
    """One file to fetch: ``run(progress)`` performs the whole checked transfer.

    ``size`` is the file's locked size (the display's total). ``run`` must report bytes
    through ``progress`` as :func:`harness.download.download` does, must let exceptions
    raised by ``progress`` propagate (that is how :func:`fetch_all` cancels it), and raises
    :class:`HarnessError` for a failure a user can act on.
    """

    label: str
    size: int
    run: Callable[[Progress], None]


@dataclass(frozen=True)
class LocalWeights:
    """A folder on this machine holding weight files laid out as a ``{weights}`` view.

    ``folder`` is absolute (``~`` and variables expanded); ``origin`` says where it was set,
    as errors name it (``configs/deploy/lab.toml: weights``).
    """

    folder: Path
    origin: str

    def path_for(self, weights: LockedWeights, file: LockedWeightFile) -> Path:
        """Where this folder would hold ``file`` of ``weights``: ``<folder>/<dir>/<path>``.

        Both parts are :data:`~harness.manifests.model.InsidePath` s (no ``..``, not absolute),
        so the result stays inside the folder."""
        return self.folder / weights.dir / file.path

    def problem(self) -> str | None:
        """Why the folder cannot serve (it does not exist, or is not a folder), naming
        ``origin``; None when it can. A missing folder is a warning, not an error, as a missing
        ``--find-links`` folder is to pip: the seed's example deploys name ``~/harness-weights``,
        and a machine without it fetches every file from its origin (offline, each missing
        file is then an error of its own)."""
        if self.folder.is_dir():
            return None
        what = "is not a folder" if self.folder.exists() else "does not exist"
        return f"{self.origin}: {self.folder} {what}; weight files come from their origins"


class _Cancelled(BaseException):
    """Raised inside a job's progress callback once another job has failed.

    A BaseException so that no ``except Exception`` between the callback and the job can
    swallow it; :func:`fetch_all` never lets it escape.
    """


def fetch_all(
    jobs: Sequence[FetchJob],
    *,
    max_workers: int = DEFAULT_JOBS,
    show_progress: bool = True,
    console: Console | None = None,
    progress: Reporter | None = None,
    label: str | None = None,
) -> None:
    """Run ``jobs`` on up to ``max_workers`` threads; return once all succeeded.

    Progress: one phase named ``label`` (default "fetching N file(s)") on ``progress``
    (default: :func:`harness.progress.reporter` of ``show_progress``, on stderr or
    ``console``): on a terminal, overall bytes, speed and time left and a bar per running
    file of at least :data:`LARGE_FILE_BYTES`; otherwise plain lines; nothing when quiet.

    Failure: the first failing job stops the rest — jobs not started never start, running
    ones stop at their next progress report (a download's ``.part`` stays for a later resume)
    — and once every thread has stopped the failure is raised: the job's
    :class:`HarnessError` itself, or one :class:`HarnessError` listing each distinct failure
    when several jobs failed at once. An exception that is not a HarnessError (a bug) is
    re-raised as it is. A KeyboardInterrupt stops the jobs the same way and propagates.
    """
    if not jobs:
        return
    if max_workers < 1:
        raise ValueError("max_workers must be at least 1")
    cancel = threading.Event()
    shown = progress if progress is not None else reporter(show_progress, console=console)
    with shown.phase(label or f"fetching {len(jobs)} file(s)", total=sum(j.size for j in jobs), unit="bytes") as phase:
        _run_all(jobs, max_workers, cancel, _Display(shown, phase, len(jobs)))


def _run_all(jobs: Sequence[FetchJob], max_workers: int, cancel: threading.Event, display: _Display) -> None:
    """:func:`fetch_all`'s pool, failure handling and errors."""

    def work(job: FetchJob) -> None:
        if cancel.is_set():
            raise _Cancelled()
        handle = display.begin(job)

        def progress(n: int) -> None:
            if cancel.is_set():
                raise _Cancelled()
            display.advance(handle, n)

        succeeded = False
        try:
            job.run(progress)
            succeeded = True
        except _Cancelled:
            raise
        except BaseException:
            # Set here, not when the waiting thread notices: this worker takes its next job at once.
            cancel.set()
            raise
        finally:
            display.end(handle, succeeded)

    failures: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=min(max_workers, len(jobs)), thread_name_prefix="harness-fetch") as pool:
        pending: set[Future[None]] = {pool.submit(work, job) for job in jobs}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for future in done:
                    exc = None if future.cancelled() else future.exception()
                    if exc is not None and not isinstance(exc, _Cancelled):
                        failures.append(exc)
                if failures and not cancel.is_set():
                    cancel.set()
                    for future in pending:
                        future.cancel()
        except BaseException:  # KeyboardInterrupt in the waiting thread: stop the workers
            cancel.set()
            for future in pending:
                future.cancel()
            raise
    if not failures:
        return
    for exc in failures:
        if not isinstance(exc, HarnessError):
            raise exc
    errors = [exc for exc in failures if isinstance(exc, HarnessError)]
    if len(errors) == 1:
        raise errors[0]
    messages = list(dict.fromkeys(e.message for e in errors))
    hints = list(dict.fromkeys(e.hint for e in errors if e.hint))
    raise HarnessError(
        f"{len(messages)} downloads failed:\n" + "\n".join(f"  - {m}" for m in messages),
        hint="; ".join(hints) or None,
    )


def wheel_jobs(
    lock: Lock,
    settings: Settings,
    cache_dir: Path | None,
    dest_for: Callable[[LockedFile], Path],
) -> list[FetchJob]:
    """A job per wheel and sdist of ``lock.packages`` and ``lock.build_packages``.

    Each fetches its file by name from the index the lock names, at the address ``settings``
    gives now (``pypi`` unconfigured: uv's default, see
    :func:`harness.resolve.indexpages.default_index_url`; ``cache_dir`` is uv's cache for that
    question), into ``dest_for(file)``, checked against the lock's size and sha256. Lookups
    are grouped by index and project: the first job of a project reads its page (once, for
    all the project's files) and the others reuse it. A file named twice (a package that is
    also a build requirement) is fetched once; the same destination for two different hashes
    is a :class:`HarnessError`. An index name with no configured address raises
    :class:`~harness.errors.InputError` now, before anything runs.
    """
    lookups: dict[tuple[str, str], _ProjectLookup] = {}
    seen: dict[Path, LockedFile] = {}
    jobs: list[FetchJob] = []
    for package in [*lock.packages, *lock.build_packages]:
        settings.index_url(package.index)  # fail early on an index nobody configured
        key = (normalize_index_name(package.index), canonicalize_name(package.name))
        lookup = lookups.get(key)
        if lookup is None:
            lookup = lookups[key] = _ProjectLookup(package.index, package.name, settings, cache_dir)
        for f in [*package.wheels, *([package.sdist] if package.sdist else [])]:
            dest = dest_for(f)
            if dest in seen:
                if seen[dest].sha256 != f.sha256:
                    raise HarnessError(
                        f"the lock names {f.file} twice with different hashes ({seen[dest].sha256} and {f.sha256})",
                        hint="re-lock",
                    )
                continue
            seen[dest] = f
            lookup.files.append(f.file)
            jobs.append(FetchJob(label=f.file, size=f.size, run=_wheel_runner(lookup, f, dest)))
    return jobs


def weight_jobs(
    lock: Lock,
    project_root: Path,
    settings: Settings,
    dest_for: Callable[[LockedWeights, LockedWeightFile], Path],
    *,
    local: LocalWeights | None = None,
) -> list[FetchJob]:
    """A job per file of every weight set of ``lock``, fetched into ``dest_for(set, file)``.

    Each runs :func:`fetch_weight` (the ``local`` folder first, when given; then
    :func:`harness.resolve.weights.fetch_weight_file`: hub endpoints from ``settings``,
    ``path`` weights relative to ``project_root``): resumable, checked against the lock's
    size and sha256.
    """
    jobs: list[FetchJob] = []
    for weights in lock.weights:
        for locked in weights.files:
            dest = dest_for(weights, locked)

            def run(
                progress: Progress,
                weights: LockedWeights = weights,
                locked: LockedWeightFile = locked,
                dest: Path = dest,
            ) -> None:
                fetch_weight(
                    weights, locked, dest, project_root=project_root, settings=settings, progress=progress, local=local
                )

            jobs.append(FetchJob(label=weight_label(weights, locked, local), size=locked.size, run=run))
    return jobs


def weight_label(weights: LockedWeights, file: LockedWeightFile, local: LocalWeights | None) -> str:
    """How the progress display names a weight file's job: ``<dir>/<path>``, and "(from the
    deploy's weights folder)" when ``local`` holds a copy of the locked size."""
    label = f"{weights.dir}/{file.path}"
    if local is not None and _local_size(local.path_for(weights, file)) == file.size:
        label += " (from the deploy's weights folder)"
    return label


def fetch_weight(
    weights: LockedWeights,
    file: LockedWeightFile,
    dest: Path,
    *,
    project_root: Path,
    settings: Settings,
    progress: Progress | None = None,
    local: LocalWeights | None = None,
    offline: bool = False,
    warn: Callable[[str], None] | None = None,
) -> None:
    """Put ``file`` of ``weights`` at ``dest``, checked against the lock's size and sha256.

    With ``local``, a copy at ``local.path_for(weights, file)`` of the locked size is tried
    first: its bytes are copied to ``dest`` through :func:`harness.download.download` (hashed
    on the way, renamed only when they match; never a link). When that copy is of another
    size or does not match, ``warn`` (default: a "warning:" line on stderr) is told the file,
    expected and actual, the bytes reported to ``progress`` are withdrawn, and the file is
    fetched from its locked origin (:func:`harness.resolve.weights.fetch_weight_file`) as
    without ``local``. If that is not possible either (``offline``, or the origin fails) the
    :class:`HarnessError` names the local file with expected and actual, and why the origin
    failed. A missing local file is no warning: the folder may hold only some sets.
    """
    from harness.resolve.weights import describe_origin, fetch_weight_file

    report = progress or (lambda _n: None)
    problem: str | None = None
    if local is not None:
        path = local.path_for(weights, file)
        size = _local_size(path)
        if size is not None and size != file.size:
            problem = (
                f"the deploy's weights folder holds {path} of {size} bytes, the lock says "
                f"sha256 {file.sha256} ({file.size} bytes)"
            )
        elif size is not None:
            reported = 0

            def counted(n: int) -> None:
                nonlocal reported
                report(n)  # first: a cancel raised here must not leave the count ahead
                reported += n

            try:
                download(
                    path,
                    dest,
                    sha256=file.sha256,
                    size=file.size,
                    progress=counted,
                    label=f"the deploy's weights folder's copy {path}",
                )
                return
            except HarnessError as exc:
                problem = exc.message
                report(-reported)
    if problem is not None and offline:
        raise HarnessError(problem, hint="replace the folder's copy, or realize once with network")
    if problem is not None:
        (warn or _warn)(f"{problem}; fetching it from {describe_origin(weights.pin())} instead")
    try:
        fetch_weight_file(
            weights.pin(), file.pin(), dest, project_root=project_root, settings=settings, progress=progress
        )
    except HarnessError as exc:
        if problem is None:
            raise
        raise HarnessError(f"{problem}, and fetching it from its origin failed: {exc.message}", hint=exc.hint) from None


# ---------------------------------------------------------------------------------------------
# Internals
# ---------------------------------------------------------------------------------------------


def _local_size(path: Path) -> int | None:
    """The size of the regular file at ``path`` (links followed), or None when there is none."""
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def _warn(line: str) -> None:
    from harness.progress import write_line

    write_line(sys.stderr, f"warning: {line}")


class _ProjectLookup:
    """The URLs of one project's locked files on one index, looked up once, on first use."""

    def __init__(self, index: str, project: str, settings: Settings, cache_dir: Path | None) -> None:
        self.index = index
        self.project = project
        self.settings = settings
        self.cache_dir = cache_dir
        self.files: list[str] = []
        self._lock = threading.Lock()
        self._urls: dict[str, str] | None = None
        self._error: HarnessError | None = None

    def url_for(self, file: str) -> str:
        from harness.resolve.indexpages import find_file_urls, index_address

        with self._lock:
            if self._urls is None and self._error is None:
                try:
                    address = index_address(self.index, self.settings, self.cache_dir)
                    self._urls = find_file_urls(address, self.project, self.files, index_name=self.index)
                except HarnessError as exc:
                    self._error = exc
            if self._error is not None:
                # A fresh exception per job: one object raised in several threads tangles tracebacks.
                raise HarnessError(self._error.message, hint=self._error.hint)
            assert self._urls is not None
            return self._urls[file]


def _wheel_runner(lookup: _ProjectLookup, f: LockedFile, dest: Path) -> Callable[[Progress], None]:
    def run(progress: Progress) -> None:
        url = lookup.url_for(f.file)
        download(
            url, dest, sha256=f.sha256, size=f.size, progress=progress, label=f"{f.file} from index {lookup.index!r}"
        )

    return run


class _Display:
    """The fetch phase's counts: bytes overall, files done, and on a live display a phase of
    its own for each running file of at least :data:`LARGE_FILE_BYTES` (plain lines would
    only repeat the overall ones)."""

    def __init__(self, shown: Reporter, phase: Phase, count: int) -> None:
        self.shown = shown
        self.phase = phase
        self.count = count
        self.done = 0
        self._lock = threading.Lock()
        self.phase.summary = self._describe()

    def _describe(self) -> str | None:
        return f"{self.done} of {self.count} files" if self.done < self.count else None

    def begin(self, job: FetchJob) -> Phase | None:
        if self.shown.mode != "live" or job.size < LARGE_FILE_BYTES:
            return None
        return self.shown.phase(f"  {job.label}", total=job.size, unit="bytes").start()

    def advance(self, task: Phase | None, n: int) -> None:
        self.phase.advance(n)
        if task is not None:
            task.advance(n)

    def end(self, task: Phase | None, succeeded: bool) -> None:
        if task is not None:
            task.finish("done" if succeeded else "failed")
        if not succeeded:
            return
        with self._lock:
            self.done += 1
            self.phase.summary = self._describe()


__all__ = [
    "DEFAULT_JOBS",
    "LARGE_FILE_BYTES",
    "FetchJob",
    "LocalWeights",
    "fetch_all",
    "fetch_weight",
    "weight_jobs",
    "weight_label",
    "wheel_jobs",
]
