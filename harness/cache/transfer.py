"""Moving closures between a store and binary caches: :func:`push` and :func:`pull`.

**Push** publishes what the cache lacks, so that a reader never sees half a closure: the
archives go first (compressed in parallel, each named by its blake3, skipped when already
there), then the narinfos in dependency order, each only once its archive and the narinfo of
every reference exist. A path already described in the cache costs one existence check and
nothing else, which is what makes a second push of an unchanged closure transfer nothing.
Each archive's NAR is hashed while it is compressed and must equal the path's record: a path
changed since registration is refused, never published under its old hash.

**Pull** registers what the store lacks. For every path it asks the caches in priority
order for a narinfo that parses, names the path and is *trusted*:

* a path the caller expects (an :class:`ExpectedContent`, from a lock: wheels, sources,
  weight sets) is trusted by that expectation: its kind must match, a source's content hash
  must equal the lock's tree hash, and after unpacking every file of a wheel or weight set
  must have the lock's sha256 (and nothing else may be there);
* any other path (an environment, an interpreter, a weights view) needs a signature by a
  trusted key over its fingerprint; unsigned or otherwise signed paths are refused.

Archives are then fetched in parallel (remote ones into ``<cache_dir>/nar`` with resume
from a ``.part``; directory and tar caches are read in place) and unpacked into the store's
build folder, references first; the store re-hashes the result against the narinfo's content
hash before it registers anything. A path that fails any check — or whose reference does —
is reported and skipped, never half-registered.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from harness.cache.backends import Backend, ByteStream, CacheUrl, open_backend, parse_url
from harness.cache.format import (
    CACHE_INFO_KEY,
    CacheError,
    CacheInfo,
    NarInfo,
    archive_key,
    narinfo_key,
)
from harness.cache.signing import PublicKey, SecretKey, signed_by_trusted
from harness.errors import HarnessError
from harness.store.store import BuildResult, Record, Store

if TYPE_CHECKING:
    from harness.cache.nar import Packed, Unpacked
    from harness.realize.fetch import FetchJob

_CHUNK = 1 << 20
#: A remote archive transfer that breaks off is resumed this many times within one pull.
ATTEMPTS = 3


# ----------------------------------------------------------------------------- closures


def closure(store: Store, names: Sequence[str]) -> list[str]:
    """``names`` and everything they reference, registered, references before referrers.

    Raises :class:`CacheError` naming a path that is not registered (or whose reference is
    not). The order is deterministic: a depth-first post-order over sorted names.
    """
    records: dict[str, Record] = {}
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str, via: str | None) -> None:
        if name in records:
            return
        if name in visiting:
            raise CacheError(f"store paths reference each other in a cycle through {name}")
        record = store.record(name)
        if record is None:
            where = f" (referenced by {via})" if via else ""
            raise CacheError(
                f"{name} is not registered in {store.root}{where}: never realized here, "
                "or collected by `harness store gc`",
                hint="realize it (again) first (`harness realize`), or name what is realized",
            )
        visiting.add(name)
        for ref in sorted(record.references):
            if ref != name:
                visit(ref, name)
        visiting.discard(name)
        records[name] = record
        order.append(name)

    for name in sorted(set(names)):
        visit(name, None)
    return order


def topological(names: Sequence[str], references: Callable[[str], Sequence[str]]) -> list[str]:
    """``names`` ordered references first (only edges inside ``names`` count)."""
    inside = set(names)
    order: list[str] = []
    done: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in stack:
            raise CacheError(f"cache metadata references form a cycle through {name}")
        for ref in sorted(references(name)):
            if ref == name:  # waiting for itself would never end: refused like any cycle
                raise CacheError(f"cache metadata of {name} lists {name} itself among its references")
            if ref in inside:
                visit(ref, (*stack, name))
        done.add(name)
        order.append(name)

    for name in sorted(inside):
        visit(name, ())
    return order


# --------------------------------------------------------------------------------- push


@dataclass
class PushResult:
    """What :func:`push` did: paths published, paths already there, writes and bytes."""

    pushed: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    puts: int = 0
    uploaded_bytes: int = 0


def ensure_cache_info(backend: Backend) -> tuple[CacheInfo, bool]:
    """The cache's info, writing a default one into an empty cache; (info, written)."""
    from harness.cache.backends import DirectoryBackend

    if isinstance(backend, DirectoryBackend) and backend.writable:
        backend.root.mkdir(parents=True, exist_ok=True)  # pushing to a new folder makes it
    text = backend.read_bytes(CACHE_INFO_KEY)
    if text is not None:
        return CacheInfo.parse(text.decode("utf-8", "replace"), f"{backend.url}/{CACHE_INFO_KEY}"), False
    if not backend.writable:
        raise CacheError(f"{backend.url} is not a harness cache (no {CACHE_INFO_KEY})")
    info = CacheInfo()
    backend.put_bytes(CACHE_INFO_KEY, info.render().encode())
    return info, True


def push(
    store: Store,
    names: Sequence[str],
    backend: Backend,
    *,
    secret: SecretKey | None,
    cache_dir: Path,
    jobs: int = 8,
    show_progress: bool = False,
) -> PushResult:
    """Publish the closure of ``names`` to ``backend``: only what it lacks (module docstring).

    Narinfos are signed with ``secret`` when given. Raises :class:`CacheError` (or another
    :class:`HarnessError`) after publishing every narinfo whose archive and references made
    it, so a failed push never leaves a half-described closure and a rerun does the rest.
    """
    from harness.store.roots import TempRoots

    if not backend.writable:
        raise CacheError(f"cache {backend.url} is read-only")
    # Rooting the named paths keeps their whole closure (gc keeps what roots reference) for
    # the push; what is registered after this stays registered until the push is done.
    with TempRoots(store, f"harness store push to {backend.url}") as roots:
        roots.add(names)
        return _push(
            store,
            closure(store, names),
            backend,
            secret=secret,
            cache_dir=cache_dir,
            jobs=jobs,
            show_progress=show_progress,
        )


def _push(
    store: Store,
    paths: list[str],
    backend: Backend,
    *,
    secret: SecretKey | None,
    cache_dir: Path,
    jobs: int,
    show_progress: bool,
) -> PushResult:
    """:func:`push` of a rooted closure (``paths``, references first), in phases: refuse host
    copies, see what the cache already describes, upload the missing archives, publish their
    narinfos, take back every archive left undescribed, and raise what failed."""
    _refuse_host_copies(store, paths)
    result = PushResult()
    _, wrote_info = ensure_cache_info(backend)
    result.puts += int(wrote_info)
    presence = _presence(backend, paths, jobs)
    result.present = presence.present
    if not presence.missing:
        return result
    staging = backend.staging_dir() or (cache_dir / "push")
    staging.mkdir(parents=True, exist_ok=True)
    uploads = _Uploads(staging)
    described = set(result.present)
    try:
        _upload_archives(store, presence.missing, backend, uploads, result, jobs=jobs, show_progress=show_progress)
        _publish_narinfos(store, presence.missing, backend, uploads, described, secret, result)
    finally:
        # However the push ended, no archive it wrote stays without its narinfo.
        _take_back(backend, {n: k for n, k in uploads.written.items() if n not in described})
    _raise_failures(uploads.failures)
    return result


class _Presence(NamedTuple):
    """A closure split by whether the cache describes each path already (both in closure order)."""

    present: list[str]
    missing: list[str]


@dataclass
class _Uploads:
    """What the archive phase of a push hands the narinfo phase.

    Upload jobs write it from their threads, under ``lock``: the narinfo each uploaded (or
    found) archive gets, why a path failed, and the archive keys this push wrote (path ->
    key), which are taken back when their path ends up undescribed.
    """

    staging: Path
    infos: dict[str, NarInfo] = field(default_factory=dict)
    failures: dict[str, HarnessError] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _refuse_host_copies(store: Store, paths: Sequence[str]) -> None:
    """Raise :class:`CacheError` for the first of ``paths`` that is a host interpreter under
    a lock interpreter's name (:func:`host_copy_problem`): nothing is pushed then."""
    for name in paths:
        record = store.record(name)
        problem = host_copy_problem(name, record.kind, record.impure) if record is not None else None
        if problem:
            raise CacheError(
                f"{name}: {problem}; not pushing it",
                hint="realize again: harness replaces it with the lock's own interpreter or a "
                "host copy under a name of its own",
            )


def present_in(backend: Backend, paths: Sequence[str], jobs: int = 8) -> set[str]:
    """Which of ``paths`` ``backend`` holds (a narinfo for each), asked in parallel."""
    return set(_presence(backend, list(dict.fromkeys(paths)), jobs).present)


def _presence(backend: Backend, paths: Sequence[str], jobs: int) -> _Presence:
    """Which of ``paths`` ``backend`` has a narinfo for, asked in parallel (``jobs`` at once)."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        there = dict(zip(paths, pool.map(lambda n: backend.exists(narinfo_key(n)), paths), strict=True))
    return _Presence(present=[n for n in paths if there[n]], missing=[n for n in paths if not there[n]])


def _upload_archives(
    store: Store,
    missing: Sequence[str],
    backend: Backend,
    uploads: _Uploads,
    result: PushResult,
    *,
    jobs: int,
    show_progress: bool,
) -> None:
    """Pack and upload the archive of every path of ``missing`` in parallel, as one progress
    phase; each path's narinfo (or failure) lands in ``uploads``, bytes and writes in ``result``."""
    from harness.realize.fetch import fetch_all

    fetch_all(
        [_upload_job(store, name, backend, uploads, result) for name in missing],
        max_workers=jobs,
        show_progress=show_progress,
        label=f"pushing {len(missing)} path(s) to {backend.url}",
    )


def _upload_job(store: Store, name: str, backend: Backend, uploads: _Uploads, result: PushResult) -> FetchJob:
    """The job that packs ``name`` (checked against its record), uploads the archive unless
    the cache has it, and notes the path's narinfo in ``uploads``. A :class:`HarnessError` is
    recorded in ``uploads.failures``, not raised: the other archives still go up, so a rerun
    has less to do."""
    from harness.realize.fetch import FetchJob

    record = store.record(name)
    assert record is not None  # closure() checked

    def run(report: Callable[[int], None]) -> None:
        progress = _halves(report)
        temp = _temp_archive(uploads.staging)
        try:
            packed = _pack_unchanged(store, name, record, temp, progress)
            key = archive_key(packed.file_hash)
            uploaded = _upload_archive(backend, key, temp, packed, record.nar_size, progress)
            if uploaded:
                with uploads.lock:
                    uploads.written[name] = key
            info = _narinfo(name, record, packed, key)
            with uploads.lock:
                uploads.infos[name] = info
                result.uploaded_bytes += uploaded
                result.puts += int(bool(uploaded))
        except HarnessError as exc:
            with uploads.lock:
                uploads.failures[name] = exc
        finally:
            temp.unlink(missing_ok=True)

    return FetchJob(label=name, size=record.nar_size, run=run)


def _halves(report: Callable[[int], None]) -> Callable[[int], None]:
    """A progress callback reporting half of what it is given to ``report``.

    Packing and uploading each count the NAR's bytes once: half each, so the phase's total
    is what is pushed, not twice it."""
    halves = [0, 0]  # bytes counted, bytes reported

    def progress(n: int) -> None:
        halves[0] += n
        step = halves[0] // 2 - halves[1]
        halves[1] += step
        report(step)

    return progress


def _temp_archive(staging: Path) -> Path:
    """A new empty file in ``staging`` for one archive; the caller deletes it."""
    import tempfile

    fd, temp_name = tempfile.mkstemp(prefix=".push-", suffix=".nar.zst", dir=staging)
    os.close(fd)
    return Path(temp_name)


def _pack_unchanged(store: Store, name: str, record: Record, temp: Path, progress: Callable[[int], None]) -> Packed:
    """Pack store path ``name`` into ``temp``, or raise :class:`CacheError` when it is gone,
    cannot be read, or no longer has its record's content hash and NAR size."""
    from harness.cache.nar import pack

    if not os.path.lexists(store.root / name):
        raise CacheError(
            f"{name} is no longer in the store (deleted or collected while being pushed); not pushing it",
            hint="realize it again, then push again",
        )
    try:
        packed = pack(store.root / name, temp, progress=progress)
    except OSError as exc:
        raise CacheError(
            f"{name} cannot be read from the store ({exc.strerror or exc}: "
            "deleted or collected while being pushed?); not pushing it",
            hint="run `harness store verify --repair`, then push again",
        ) from None
    if packed.content != record.content or packed.nar_size != record.nar_size:
        raise CacheError(
            f"{name} changed since it was registered (record {record.content}, now {packed.content}); not pushing it",
            hint=f"run `harness store verify --repair {name}`",
        )
    return packed


def _upload_archive(
    backend: Backend, key: str, temp: Path, packed: Packed, nar_size: int, progress: Callable[[int], None]
) -> int:
    """Upload ``temp`` as ``key`` unless the cache has that archive; the bytes uploaded (0 when
    it was there). Upload progress is scaled to the NAR's ``nar_size``, as packing counts it."""
    if backend.exists(key):
        return 0
    scale = nar_size / max(1, packed.file_size)
    backend.put_file(key, temp, lambda n: progress(int(n * scale)))
    return packed.file_size


def _narinfo(name: str, record: Record, packed: Packed, key: str) -> NarInfo:
    """The (unsigned) narinfo of store path ``name`` (its ``record``), whose archive
    ``packed`` is at ``key``."""
    return NarInfo(
        store_path=name,
        kind=record.kind,
        url=key,
        file_hash=packed.file_hash,
        file_size=packed.file_size,
        content=record.content,
        nar_size=record.nar_size,
        references=tuple(sorted(r for r in record.references)),
        impure=record.impure,
        obtained=record.obtained,
    )


def _publish_narinfos(
    store: Store,
    missing: Sequence[str],
    backend: Backend,
    uploads: _Uploads,
    described: set[str],
    secret: SecretKey | None,
    result: PushResult,
) -> None:
    """Write the narinfo of each path of ``missing`` (closure order: references first) whose
    archive went up and whose references are all ``described``, signed with ``secret`` when
    given; each one written joins ``described`` and ``result.pushed``."""
    for name in missing:
        info = uploads.infos.get(name)
        record = store.record(name)
        if info is None or record is None or not all(r in described or r == name for r in record.references):
            continue
        if secret is not None:
            info = info.with_signatures([secret.sign(info)])
        backend.put_bytes(narinfo_key(name), info.render().encode())  # the narinfo last: publication
        result.puts += 1
        described.add(name)
        result.pushed.append(name)


def _raise_failures(failures: Mapping[str, HarnessError]) -> None:
    """Raise the one failure of a push as it was, several as one :class:`CacheError` listing them."""
    if len(failures) == 1:
        raise next(iter(failures.values()))
    if failures:
        raise CacheError(
            f"{len(failures)} paths were not pushed:\n"
            + "\n".join(f"  - {exc.message}" for _, exc in sorted(failures.items()))
        )


def _take_back(backend: Backend, orphans: Mapping[str, str]) -> None:
    """Delete the archives (path -> key) a failed push wrote but never described.

    An archive that a narinfo now names (a concurrent push of the same path published it)
    stays. A backend that cannot delete (a tar being written, which a failed export
    discards whole) keeps them.
    """
    from harness.cache.backends import Deletable

    if not orphans or not isinstance(backend, Deletable):
        return
    for name, key in sorted(orphans.items()):
        try:
            if not backend.exists(narinfo_key(name)):
                backend.delete(key)
        except CacheError:
            continue  # best effort: the push's own error is the one to report


# --------------------------------------------------------------------------------- pull


@dataclass(frozen=True)
class ExpectedContent:
    """What a lock says a fixed-output path holds; such a path needs no signature.

    ``kind`` must equal the narinfo's. ``content`` (a source's tree hash) must equal the
    narinfo's content hash, and so, through the store's check, the unpacked bytes'.
    ``files`` (relative path → sha256, for a wheel's folder or a weight set) must be exactly
    the regular, non-executable files of the unpacked tree, with those hashes.
    """

    kind: str
    content: str | None = None
    files: Mapping[str, str] | None = None


@dataclass
class Substituter:
    """A cache being read from: its backend and priority (lower is asked first)."""

    url: str
    backend: Backend
    priority: int
    info: CacheInfo


@dataclass
class PullResult:
    """What :func:`pull` did: paths registered (references first), already present, refused."""

    registered: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0


def open_substituters(
    urls: Sequence[str], *, jobs: int = 8, backends: Mapping[str, Backend] | None = None
) -> tuple[list[Substituter], dict[str, str]]:
    """Open caches by URL: the usable ones sorted by priority (ties: the order given), and
    why each other one cannot be used (unreachable, not a harness cache), by URL. A
    malformed URL raises :class:`~harness.cache.format.CacheConfigError`. ``backends``
    supplies ready ones by URL (a tar being imported)."""
    parsed = [(url, parse_url(url) if not (backends and url in backends) else None) for url in urls]
    # A URL without a ready backend was parsed above, so ``p`` is set wherever it is opened.
    opened = [(url, (backends or {}).get(url) or open_backend(p or url, jobs=jobs), p) for url, p in parsed]

    def info_of(item: tuple[str, Backend, CacheUrl | None]) -> tuple[CacheInfo | None, str | None]:
        url, backend, _ = item
        try:
            text = backend.read_bytes(CACHE_INFO_KEY)
        except CacheError as exc:
            return None, exc.message
        if text is None:
            return None, f"{url} is not a harness cache (it has no {CACHE_INFO_KEY})"
        try:
            return CacheInfo.parse(text.decode("utf-8", "replace"), f"{url}/{CACHE_INFO_KEY}"), None
        except CacheError as exc:
            return None, exc.message

    with ThreadPoolExecutor(max_workers=max(1, min(len(opened), 8)) if opened else 1) as pool:
        answers = list(pool.map(info_of, opened))
    subs: list[Substituter] = []
    problems: dict[str, str] = {}
    for (url, backend, p), (info, problem) in zip(opened, answers, strict=True):
        if info is None:
            problems[url] = problem or "unusable"
            continue
        priority = p.priority if p is not None and p.priority is not None else info.priority
        subs.append(Substituter(url, backend, priority, info))
    subs.sort(key=lambda s: s.priority)  # stable: ties keep the configured order
    return subs, problems


def host_copy_problem(name: str, kind: str, impure: str | None) -> str | None:
    """Why a path may not go through a cache because it is a host interpreter under an
    interpreter's own (uv-managed) name, or None. Host copies have names of their own
    (``…-cpython-3.X.Y-host``, harness/realize/standin.py); one under the lock's name is what
    an older harness registered, and would serve one machine's bytes as everyone's."""
    from harness.lock.storepaths import is_host_interpreter

    if kind == "python" and impure and not is_host_interpreter(name):
        return f"a host interpreter ({impure}) under the name of a lock's own interpreter"
    return None


def trust_problem(
    info: NarInfo, expected: ExpectedContent | None, trusted: Mapping[str, list[PublicKey]]
) -> str | None:
    """Why ``info`` may not be used, or None when it may (module docstring: trust)."""
    if expected is not None:
        if info.kind != expected.kind:
            return f"the cache says it is a {info.kind!r}, the lock a {expected.kind!r}"
        if expected.content is not None and info.content != expected.content:
            return f"its content hash {info.content} is not the lock's {expected.content}"
        if info.references and signed_by_trusted(info, trusted) is None:
            return "a fixed-output path with references must be signed by a trusted key"
        return None
    if signed_by_trusted(info, trusted) is not None:
        return None
    if not info.signatures:
        return "not signed, and a built path needs a signature by a trusted key"
    names = sorted({sig.partition(":")[0] for sig in info.signatures})
    return f"not signed by a trusted key (signatures by {', '.join(names)} do not verify under trusted-keys)"


def pull(
    store: Store,
    names: Sequence[str],
    substituters: Sequence[Substituter],
    *,
    trusted: Mapping[str, list[PublicKey]],
    expected: Mapping[str, ExpectedContent],
    cache_dir: Path,
    jobs: int = 8,
    show_progress: bool = False,
) -> PullResult:
    """Register the closures of ``names`` from ``substituters`` (module docstring).

    Never raises for a path that cannot be had: it lands in ``failed`` with the reason, with
    every path that needs it. Raises only for bugs and interrupts. Paths already registered
    are listed in ``present`` and not looked up.

    In phases: root and note what is present, look up the rest's closures, keep what can be
    had with all its references, then download and register that, references first.
    """
    from harness.store.roots import hold

    result = PullResult()
    wanted = list(dict.fromkeys(names))
    # Rooted before they are looked up: what is present stays, what is pulled is kept for
    # this process (a realize that substitutes, then builds on them).
    hold(store, wanted)
    result.present = [n for n in wanted if store.is_registered(n)]
    lookup = _NarinfoLookup(substituters, trusted, expected, result.warnings)
    lookups = _look_up_closures(store, [n for n in wanted if n not in result.present], lookup, jobs)
    usable = _usable_in_order(store, lookups, result)
    for name, problems in lookups.reasons.items():
        result.failed.setdefault(name, "; ".join(problems))
    if usable:
        _fetch_and_register(store, usable, lookups.found, expected, cache_dir, jobs, show_progress, result)
    return result


class _Found(NamedTuple):
    """A trusted narinfo of one store path, and the substituter that has it."""

    substituter: Substituter
    info: NarInfo


class _Answer(NamedTuple):
    """What looking up one path gave: a hit (or None), and why other substituters' did not do."""

    name: str
    hit: _Found | None
    problems: list[str]


@dataclass
class _Lookups:
    """What the lookup phase of a pull found: a hit per path, and why each other path has none."""

    found: dict[str, _Found] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class _NarinfoLookup:
    """Asks ``substituters`` in priority order for a path's trusted narinfo (called from
    several threads). A substituter that fails to answer (unreachable, broken off) is not
    asked again during this pull, and disabling it appends one line to ``warnings``."""

    substituters: Sequence[Substituter]
    trusted: Mapping[str, list[PublicKey]]
    expected: Mapping[str, ExpectedContent]
    warnings: list[str]
    dead: set[str] = field(default_factory=set)  # substituters that failed mid-pull
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, name: str) -> _Answer:
        """The first substituter's usable narinfo of ``name``, and the problems met before it."""
        problems: list[str] = []
        for sub in self.substituters:
            if sub.url in self.dead:
                continue
            info = self._ask(sub, name, problems)
            if info is not None:
                return _Answer(name, _Found(sub, info), problems)
        return _Answer(name, None, problems)

    def _ask(self, sub: Substituter, name: str, problems: list[str]) -> NarInfo | None:
        """``sub``'s narinfo of ``name`` when it parses, names ``name`` and is trusted; else
        None, with why appended to ``problems`` (nothing when ``sub`` has none)."""
        key = narinfo_key(name)
        try:
            text = sub.backend.read_bytes(key)
        except CacheError as exc:
            self._disable(sub, exc)
            problems.append(f"{sub.url}: {exc.message}")
            return None
        if text is None:
            return None
        try:
            info = NarInfo.parse(text.decode("utf-8", "replace"), f"{sub.url}/{key}")
        except CacheError as exc:
            problems.append(exc.message)
            return None
        if info.store_path != name:
            problems.append(f"{sub.url}/{key} describes {info.store_path}, not {name}")
            return None
        problem = host_copy_problem(name, info.kind, info.impure) or trust_problem(
            info, self.expected.get(name), self.trusted
        )
        if problem:
            problems.append(f"{sub.url}: {problem}")
            return None
        return info

    def _disable(self, sub: Substituter, exc: CacheError) -> None:
        """Ask ``sub`` no more during this pull; warn once."""
        with self.lock:
            if sub.url not in self.dead:
                self.dead.add(sub.url)
                self.warnings.append(f"substituter {sub.url} disabled: {exc.message}")


def _look_up_closures(store: Store, pending: list[str], lookup: _NarinfoLookup, jobs: int) -> _Lookups:
    """Look up ``pending`` in parallel, then round by round every reference of a hit that is
    neither registered nor asked yet. A hit's references are rooted before their
    registration is relied on."""
    from harness.store.roots import hold

    lookups = _Lookups()
    asked: set[str] = set(pending)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        while pending:
            next_round: list[str] = []
            for name, hit, problems in pool.map(lookup, pending):
                if hit is None:
                    lookups.reasons[name] = problems or ["no substituter has it"]
                    continue
                lookups.found[name] = hit
                hold(store, hit.info.references)  # rooted before their registration is relied on
                for ref in hit.info.references:
                    if ref != name and ref not in asked and not store.is_registered(ref):
                        asked.add(ref)
                        next_round.append(ref)
            pending = next_round
    return lookups


def _usable_in_order(store: Store, lookups: _Lookups, result: PullResult) -> list[str]:
    """The found paths whose every reference is registered or usable itself, references
    first. Each other found path lands in ``result.failed``, naming the reference that cannot
    be had; references forming a cycle fail every found path (caches cannot hold one honestly)."""
    found = lookups.found
    try:
        order = topological(list(found), lambda n: found[n].info.references)
    except CacheError as exc:
        result.failed.update({name: exc.message for name in found})
        order = []
    usable: list[str] = []
    for name in order:
        info = found[name].info
        blocked = next(
            (r for r in info.references if r != name and r not in found and not store.is_registered(r)), None
        )
        blocked = blocked or next((r for r in info.references if r in result.failed), None)
        if blocked is not None:
            why = "; ".join(lookups.reasons.get(blocked, [])) or result.failed.get(blocked, "not available")
            result.failed[name] = f"its reference {blocked} cannot be had ({why})"
            continue
        usable.append(name)
    return usable


def _fetch_and_register(
    store: Store,
    order: list[str],
    found: Mapping[str, _Found],
    expected: Mapping[str, ExpectedContent],
    cache_dir: Path,
    jobs: int,
    show_progress: bool,
    result: PullResult,
) -> None:
    """Download (in parallel) and register (references first) every path of ``order``."""
    from harness.realize.fetch import FetchJob, fetch_all

    done = {name: threading.Event() for name in order}
    lock = threading.Lock()
    downloads = cache_dir / "nar"
    finished_downloads: set[Path] = set()

    def job(name: str) -> FetchJob:
        sub, info = found[name]

        def run(progress: Callable[[int], None]) -> None:
            try:
                archive: Path | None = None
                if not sub.backend.local:
                    archive = _download(sub, info, downloads, progress)
                    with lock:
                        finished_downloads.add(archive)
                        result.downloaded_bytes += info.file_size
                # Jobs start in dependency order on a FIFO pool, so every reference's job is
                # running or done: waiting here cannot deadlock. progress(0) lets a cancelled
                # pull (Ctrl-C) interrupt the wait.
                for ref in info.references:
                    event = done.get(ref) if ref != name else None
                    while event is not None and not event.wait(0.2):
                        progress(0)
                    with lock:
                        why = result.failed.get(ref)
                    if why is not None:
                        raise CacheError(f"its reference {ref} was not substituted ({why}); nothing was registered")
                _register(store, name, sub, info, expected.get(name), archive, progress)
                with lock:
                    result.registered.append(name)
            except HarnessError as exc:
                with lock:
                    result.failed[name] = exc.message
            finally:
                done[name].set()

        return FetchJob(label=name, size=info.file_size, run=run)

    try:
        sources = ", ".join(dict.fromkeys(found[n].substituter.url for n in order))
        fetch_all(
            [job(n) for n in order],
            max_workers=jobs,
            show_progress=show_progress,
            label=f"pulling {len(order)} path(s) from {sources}",
        )
    finally:
        for path in finished_downloads:
            path.unlink(missing_ok=True)


def _download(sub: Substituter, info: NarInfo, folder: Path, progress: Callable[[int], None]) -> Path:
    """The archive of ``info`` as a local file, checked against FileSize and FileHash.

    Bytes go to ``<folder>/<hex>.nar.zst.part`` and are kept there when the transfer breaks
    off, so the next pull resumes with a ranged GET. The ``.part`` is deleted when the
    finished file does not match (it cannot be resumed into a right one). Whatever stands in
    the way in the folder (in a shared home, a folder another member made under one of those
    names) is a :class:`CacheError` for this path alone: it is not substituted, and realize
    builds it as usual.
    """
    try:
        return _download_archive(sub, info, folder, progress)
    except OSError as exc:
        where = exc.filename or folder
        raise CacheError(f"{sub.url}/{info.url}: cannot keep the archive at {where}: {exc.strerror or exc}") from None


def _download_archive(sub: Substituter, info: NarInfo, folder: Path, progress: Callable[[int], None]) -> Path:
    """:func:`_download`, its OSErrors left to it."""
    from harness.store.entries import held_part, open_part
    from harness.store.entries import regular_size as _regular_size
    from harness.store.hashing import file_blake3
    from harness.store.store import lock_file

    folder.mkdir(parents=True, exist_ok=True)
    hex_hash = info.file_hash.removeprefix("blake3:")
    final = folder / f"{hex_hash}.nar.zst"
    part = folder / f"{hex_hash}.nar.zst.part"
    with lock_file(folder / f"{hex_hash}.lock"):
        # In a shared home this folder is the group's: a link or fifo another member put in
        # place of either file is never followed (held_part, open_part, _regular_size).
        if _regular_size(final) == info.file_size and file_blake3(final) == hex_hash:
            progress(info.file_size)
            return final
        for attempt in range(ATTEMPTS):
            held = held_part(part)
            if held > info.file_size:
                part.unlink()
                held = 0
            if held == info.file_size:
                break
            check_free_space(folder, info.file_size - held, f"{sub.url}/{info.url} (FileSize)")
            stream, start = sub.backend.open(info.url, held)
            progress(start)
            try:
                with stream, open_part(part, append=bool(start)) as out:
                    out.seek(start)
                    out.truncate()
                    got = start
                    while chunk := stream.read(_CHUNK):
                        got += len(chunk)
                        if got > info.file_size:
                            break
                        out.write(chunk)
                        progress(len(chunk))
                break
            except CacheError:
                if attempt == ATTEMPTS - 1:
                    raise
                progress(-_regular_size(part))  # re-reported on resume
        got = _regular_size(part)
        if got != info.file_size or file_blake3(part) != hex_hash:
            part.unlink(missing_ok=True)
            raise CacheError(
                f"{sub.url}/{info.url}: the archive does not match its narinfo "
                f"(FileSize {info.file_size}, FileHash {info.file_hash}); got {got} bytes"
            )
        os.replace(part, final)
        return final


def _register(
    store: Store,
    name: str,
    sub: Substituter,
    info: NarInfo,
    expected: ExpectedContent | None,
    archive: Path | None,
    progress: Callable[[int], None],
) -> None:
    """Unpack ``info``'s archive into the store's build folder and register it."""
    from harness.cache.nar import unpack
    from harness.store.store import StoreError

    label = f"{name} from {sub.url}"

    def build(out: Path) -> BuildResult:
        lost = [r for r in info.references if r != name and not store.is_registered(r)]
        if lost:
            raise CacheError(f"{label}: its reference {lost[0]} is not in the store; nothing was registered")
        if archive is not None:
            stream: ByteStream = open(archive, "rb")
            file_hash = None  # checked by _download
            report: Callable[[int], None] = _ignore
        else:
            stream, _ = sub.backend.open(info.url)
            file_hash = info.file_hash
            report = progress
        with stream:
            unpacked = unpack(
                stream,
                out,
                store_name=name,
                references=set(info.references),
                file_size=info.file_size,
                file_hash=file_hash,
                nar_size=info.nar_size,
                label=label,
                hash_files=bool(expected and expected.files is not None),
                progress=report,
            )
        if expected is not None and expected.files is not None:
            _check_files(label, unpacked, expected.files)
        obtained = f"cache {sub.url}" + (f" ({info.obtained})" if info.obtained else "")
        return BuildResult(obtained=obtained, impure=info.impure)

    # A declared size the disk cannot hold is refused before anything is written.
    check_free_space(store.root, info.nar_size, f"{label} (NarSize)")
    try:
        store.add(name, info.kind, build, references=info.references, expected_content=info.content)
    except StoreError as exc:
        raise CacheError(f"{label}: {exc.message}") from None


def check_free_space(folder: Path, needed: int, what: str) -> None:
    """Raise CacheError when the filesystem of ``folder`` (or of its nearest existing parent)
    has fewer than ``needed`` bytes free: a size a cache declares is checked before writing."""
    import shutil

    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return  # cannot tell: the write itself will say
    if needed > free:
        raise CacheError(
            f"{what}: needs {needed} bytes, and {probe} has only {free} free; nothing was written",
            hint="free space there, or point --home / HARNESS_HOME at a larger filesystem",
        )


def _check_files(label: str, unpacked: Unpacked, files: Mapping[str, str]) -> None:
    """A wheel folder or weight set must be exactly the lock's files, with their sha256."""
    if "" not in unpacked.directories:
        raise CacheError(f"{label}: expected a folder of locked files, the archive holds a single file or link")
    if unpacked.symlinks:
        raise CacheError(f"{label}: a fixed-output path holds a symlink {unpacked.symlinks[0]!r}")
    if unpacked.executables:
        raise CacheError(f"{label}: {unpacked.executables[0]!r} is executable; locked files are not")
    got = set(unpacked.file_sha256)
    extra, absent = sorted(got - set(files)), sorted(set(files) - got)
    if extra or absent:
        raise CacheError(
            f"{label}: its files are not the lock's: "
            + ", ".join([*(f"unexpected {p!r}" for p in extra), *(f"missing {p!r}" for p in absent)])
        )
    for path, sha in sorted(files.items()):
        if unpacked.file_sha256[path] != sha:
            raise CacheError(f"{label}: {path!r} has sha256 {unpacked.file_sha256[path]}, the lock says {sha}")
    parents = {""} | {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
    stray = sorted(set(unpacked.directories) - parents)
    if stray:
        raise CacheError(f"{label}: unexpected folder {stray[0]!r}")


def _ignore(_n: int) -> None:
    pass


__all__ = [
    "ExpectedContent",
    "PullResult",
    "PushResult",
    "Substituter",
    "closure",
    "ensure_cache_info",
    "open_substituters",
    "pull",
    "push",
    "topological",
    "trust_problem",
]
