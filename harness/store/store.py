"""The content-addressed store under ``$HARNESS_HOME/store``: registration, records, locks.

Layout (plain files, so a store can live on NFS and be rsynced)::

    store/<hash>-<name>            an object: a file or a directory, read-only
    store/.meta/<hash>-<name>.json its record: kind, references, content hash, size, provenance
    store/.locks/<hash>-<name>.lock  per-path lock (filelock)
    store/.tmp/                    builds in progress, on the same filesystem
    store/.roots/                  garbage-collector roots (projects, pins)
    store/.links/<blake3>[x]       one hard link per distinct file content of shared kinds
    store/.stat/<hash>-<name>.json a path's fingerprint for the launch check (inodes, times)

Contract of :meth:`Store.add` (DESIGN invariant 2): an object is built in ``.tmp``,
canonicalized (read-only, fixed mtimes), hashed, renamed into place and only then
registered by writing its record, atomically. A path without a record is not registered:
a crash at any instant leaves either no registered path or a complete one, and leftovers
are removed by the next :meth:`Store.add` of that path or :meth:`Store.clean`. Two
processes adding the same path serialize on its lock: it is built once and both succeed.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import __version__
from harness.errors import HarnessError
from harness.progress import QUIET, Reporter, Stopped, format_bytes
from harness.store.entries import removable
from harness.store.entries import user_name  # callers import it from here too

if TYPE_CHECKING:
    from harness.store.entries import PathLock
    from harness.store.trust import Trust
    from harness.store.fingerprint import Entry
    from harness.store.hashing import NarDigest

#: Every object's files get this mtime (Nix uses 1 too): content, not history.
FIXED_MTIME = 1
FIXED_MTIME_NS = FIXED_MTIME * 1_000_000_000

KINDS = ("file", "source", "weights", "weights-view", "source-view", "python", "built-wheel", "environment", "rootfs")

#: Kinds whose files are hard-linked to identical files of other paths (see Store._share_files):
#: environments repeat one another's bytecode, scripts and metadata.
SHARED_KINDS = frozenset({"environment"})


class StoreError(HarnessError):
    """A store operation failed; the store is as it was before it."""


@dataclass(frozen=True)
class Record:
    """What the store knows about one registered path (``.meta/<name>.json``)."""

    name: str
    kind: str
    content: str  # "blake3:<hex>" of the NAR serialization
    nar_size: int
    references: tuple[str, ...] = ()
    builder: str = f"harness {__version__}"
    obtained: str = ""  # how: "index pypi", "git <repo>@<commit>", "host /usr/bin/python3.11", ...
    impure: str | None = None  # set when the bytes depend on the host (a host interpreter)
    registered: float = 0.0

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["references"] = list(self.references)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            content=str(data["content"]),
            nar_size=int(data["nar_size"]),
            references=tuple(str(r) for r in data.get("references", ())),
            builder=str(data.get("builder", "")),
            obtained=str(data.get("obtained", "")),
            impure=None if data.get("impure") is None else str(data["impure"]),
            registered=float(data.get("registered", 0.0)),
        )


@dataclass
class BuildResult:
    """What a builder tells the store about the object it just built."""

    obtained: str = ""
    impure: str | None = None
    references: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


Builder = Callable[[Path], BuildResult | None]


class _Guard:
    """An ``flock`` held on a lock file of its own from any thread until :meth:`release`
    (filelock's locks belong to the thread that took them; a staged object is built on one
    thread and committed on another). Held, it tells :meth:`Store.clean` that the scratch
    folder of the same name is in use."""

    def __init__(self, path: Path) -> None:
        import fcntl

        self.path = path
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def release(self) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # its name is this holder's alone
            os.close(self._fd)
            self._fd = None


#: What ends a build at the user's request (Ctrl-C; a realize stopped in another thread,
#: :class:`harness.progress.Stopped`). The build's scratch folder is then not removed at once:
#: an environment of gigabytes takes seconds to delete, and Ctrl-C must end realize within
#: one. It is debris under ``.tmp/`` like a crash's, which the next :meth:`Store.clean` (every
#: realize starts with one; ``store gc``) removes; nothing of it is registered.
INTERRUPTS: tuple[type[BaseException], ...] = (KeyboardInterrupt, Stopped)


def _interrupted(exc: BaseException, progress: Reporter) -> bool:
    """Whether ``exc`` ended a build because the user asked: an interrupt itself, or a failure
    while ``progress``'s realize is being stopped (a compile subprocess killed by the same
    Ctrl-C fails before this thread hears of the interrupt)."""
    if isinstance(exc, INTERRUPTS):
        return True
    try:
        progress.check()
    except Stopped:
        return True
    return False


@dataclass
class Staged:
    """An object built, canonicalized and hashed in the store's scratch but not registered
    (:meth:`Store.stage`): :meth:`Store.commit` registers it, :meth:`discard` drops it.

    ``fingerprint`` is the stat fingerprint of ``out`` taken after canonicalizing and before
    hashing (:mod:`harness.store.fingerprint`): commit compares it, instead of hashing again,
    to know that ``digest`` still describes the bytes it registers.
    """

    store: Store
    kind: str
    out: Path
    digest: NarDigest
    result: BuildResult
    scratch: Path
    guard: _Guard
    fingerprint: tuple[int, dict[str, Entry]]

    def discard(self, *, now: bool = True) -> None:
        """Remove the scratch build and let go of it (nothing of it was registered). Idempotent.
        ``now=False`` (an interrupt: :data:`INTERRUPTS`) only lets go of it, leaving the
        scratch to the next :meth:`Store.clean`."""
        if now:
            remove_tree(self.scratch)
        self.guard.release()


class Store:
    """One store directory. Cheap to construct; creates its folders on first write."""

    def __init__(self, root: Path) -> None:
        self.root = root
        #: Entries :meth:`records` skipped because they are not records harness wrote
        #: (:class:`harness.store.entries.BadEntry`): commands report them and go on.
        self.bad_entries: list[str] = []
        self._trust: Trust | None = None

    @property
    def trust(self) -> Trust:
        """Whose registrations this process uses here (:mod:`harness.store.trust`)."""
        if self._trust is None:
            from harness.store.trust import Trust

            self._trust = Trust(self.root)
        return self._trust

    @classmethod
    def in_home(cls, home: Path) -> Store:
        return cls(home / "store")

    # -- paths ---------------------------------------------------------------------------

    @property
    def meta_dir(self) -> Path:
        return self.root / ".meta"

    @property
    def locks_dir(self) -> Path:
        return self.root / ".locks"

    @property
    def tmp_dir(self) -> Path:
        return self.root / ".tmp"

    @property
    def roots_dir(self) -> Path:
        return self.root / ".roots"

    @property
    def links_dir(self) -> Path:
        return self.root / ".links"

    def path(self, name: str) -> Path:
        """Where object ``name`` (``<hash>-<name>``) lives, registered or not.

        A name that is not a store path name (``/``, ``..``, a leading ``.``) raises
        StoreError: nothing outside the store is ever named.
        """
        from harness.store.hashing import check_store_name

        try:
            check_store_name(name)
        except ValueError as exc:
            raise StoreError(f"{exc}; it cannot name a path in {self.root}") from None
        return self.root / name

    def record_path(self, name: str) -> Path:
        return self.meta_dir / f"{name}.json"

    # -- queries -------------------------------------------------------------------------

    def is_registered(self, name: str) -> bool:
        """Whether ``name`` is registered for this user: a regular record file and the path,
        both made by a member this user trusts (:mod:`harness.store.trust`). Two ``lstat`` s."""
        try:
            record = os.lstat(self.record_path(name))
            path = os.lstat(self.root / name)
        except OSError:
            return False
        if not stat.S_ISREG(record.st_mode):
            return False
        if self.trust.trusts(record.st_uid) and self.trust.trusts(path.st_uid):
            return True
        return self._vouched(name)

    def _vouched(self, name: str) -> bool:
        """Whether this user checked ``name`` (another member's fixed-output path) against its
        lock, and its record still claims the content checked (:mod:`harness.store.trust`)."""
        from harness.store.trust import vouched

        checked = vouched(self.root, name)
        if checked is None:
            return False
        try:
            record = self.record(name, any_member=True)
        except StoreError:
            return False
        return record is not None and record.content == checked

    def untrusted_owner(self, name: str) -> int | None:
        """The uid of the member who registered ``name`` when this user does not trust them
        (so :meth:`record` says None for it); None otherwise."""
        for entry in (self.root / name, self.record_path(name)):
            try:
                uid = os.lstat(entry).st_uid
            except OSError:
                continue
            if not self.trust.trusts(uid):
                return None if self._vouched(name) else uid
        return None

    def record(self, name: str, *, even_if_gone: bool = False, any_member: bool = False) -> Record | None:
        """The record of a registered path, or None (no record, its path is gone, or a member
        this user does not trust registered it: :mod:`harness.store.trust`).

        ``even_if_gone`` returns the record of a path deleted behind the store's back too
        (``verify`` reports it missing, ``gc`` removes the record); ``any_member`` that of a
        path an untrusted member registered (``store ls`` lists them). A record file that is
        not one harness wrote (a symlink, a folder, garbage) is a StoreError naming it.
        """
        from harness.store.entries import BadEntry, read_entry

        path = self.record_path(name)
        try:
            raw, st = read_entry(path)
            data = json.loads(raw.decode("utf-8"))
            record = Record.from_json(data)
        except FileNotFoundError:
            return None
        except BadEntry as exc:
            raise StoreError(exc.message, hint=exc.hint) from None
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise StoreError(
                f"store record {path} is not a record harness wrote ({type(exc).__name__}: {str(exc)[:200]})",
                hint="its owner, the store folder's owner or root can remove it",
            ) from None
        if record.name != name:
            raise StoreError(f"store record {path} names another path ({record.name[:80]!r})")
        try:
            owner = os.lstat(self.root / name).st_uid
        except FileNotFoundError:
            if not even_if_gone:
                return None
            owner = st.st_uid
        if not any_member and not (self.trust.trusts(st.st_uid) and self.trust.trusts(owner)):
            from harness.store.trust import vouched

            if vouched(self.root, name) != record.content:
                return None
        return record

    def records(self, *, even_if_gone: bool = False, any_member: bool = False) -> Iterator[Record]:
        """Every registered path's record, sorted by name (see :meth:`record`). An entry of
        ``.meta`` that is not a record is skipped, its message kept in :attr:`bad_entries`."""
        if not self.meta_dir.is_dir():
            return
        self.bad_entries = []
        for entry in sorted(self.meta_dir.glob("*.json")):
            try:
                record = self.record(entry.name[: -len(".json")], even_if_gone=even_if_gone, any_member=any_member)
            except StoreError as exc:
                self.bad_entries.append(exc.message)
                continue
            if record is not None:
                yield record

    # -- adding --------------------------------------------------------------------------

    def _ensure_dirs(self) -> None:
        for folder in (self.root, self.meta_dir, self.locks_dir, self.tmp_dir):
            folder.mkdir(parents=True, exist_ok=True)

    def lock(self, name: str) -> PathLock:
        """The per-path lock (:func:`lock_file`), for use as a context manager.

        The name is checked first, so a bad name creates no file anywhere. Lock files are
        group-writable: in a store shared by a group (``harness store init --group``) every
        member must be able to open the lock file another member created.
        """
        self.path(name)  # refuses a name with '/' or '..' before any file is created
        self._ensure_dirs()
        return lock_file(self.locks_dir / f"{name}.lock")

    def owner(self, name: str) -> int | None:
        """The uid that registered ``name`` (the owner of its path), or None when absent."""
        try:
            return os.lstat(self.root / name).st_uid
        except FileNotFoundError:
            return None

    def may_remove(self, name: str) -> bool:
        """Whether this process may delete ``name`` (see :meth:`check_removable`)."""
        uid = self.owner(name)
        return uid is None or uid == os.geteuid() or os.geteuid() == 0

    def check_removable(self, name: str) -> None:
        """Raise StoreError unless this process may delete or replace ``name``.

        In a shared store (sticky, like ``/tmp``) only the member who registered a path (or
        root) may remove it; the check comes first so that nothing is half removed.
        """
        untrusted = self.untrusted_owner(name)
        if untrusted is not None:
            from harness.store.trust import untrusted_message

            raise StoreError(untrusted_message(self.root / name, untrusted))
        if self.may_remove(name):
            return
        who = user_name(self.owner(name) or 0)
        raise StoreError(
            f"{self.root / name} was registered by {who}: only {who} (or root) can delete or replace it",
            hint=f"ask {who} to run `harness store verify --repair` or `harness store gc`",
        )

    def _claimed(self, name: str) -> tuple[int, Record] | None:
        """The untrusted member and their record when one this user does not trust has
        ``name`` (which a sticky store does not let this user replace); None otherwise.
        StoreError when they left a path without a record (nothing to check it against)."""
        untrusted = self.untrusted_owner(name)
        if untrusted is None:
            return None
        theirs = self.record(name, any_member=True)
        if theirs is None:
            from harness.store.trust import untrusted_message

            raise StoreError(untrusted_message(self.root / name, untrusted))
        return untrusted, theirs

    def _adopt(self, name: str, claimed: tuple[int, Record], ours: str) -> Record:
        """Use the path an untrusted member registered under ``name`` when this user's own
        build of it hashed to ``ours`` and their path holds exactly that: the bytes are then
        this user's own build's, whoever registered them (Nix's ``--check``). Vouched for
        (:func:`harness.store.trust.vouch`), so the next use needs no build. Else StoreError
        naming the path, its owner and both hashes; nothing is used."""
        from harness.store.hashing import nar_digest
        from harness.store.trust import vouch

        uid, theirs = claimed
        who = user_name(uid)
        path = self.root / name
        if theirs.content != ours:
            raise StoreError(
                f"{path}, registered by {who}, is not what this user builds for it (theirs {theirs.content}, "
                f"this build {ours}); harness does not use it",
                hint=f"only {who} (or root) can remove it; the store's owner can trust {who} (`harness store trust {who}`)",
            )
        found = nar_digest(path).hash
        if found != theirs.content:
            raise StoreError(
                f"{path}, registered by {who}, does not hold what its record says "
                f"(recorded {theirs.content}, found {found}); harness does not use it"
            )
        vouch(self.root, name, theirs.content)
        return theirs

    def add(
        self,
        name: str,
        kind: str,
        build: Builder,
        *,
        references: tuple[str, ...] = (),
        expected_content: str | None = None,
        progress: Reporter = QUIET,
        digests: dict[str, str] | None = None,
    ) -> Record:
        """Build ``name`` with ``build(out)`` unless registered; return its record.

        ``build`` must create ``out`` (a file or a directory; it does not exist on entry).
        ``expected_content``, when given (a source's tree hash), must equal the built
        object's content hash, else nothing is registered and StoreError names both.
        A failing builder leaves the store exactly as before. ``progress`` shows what
        follows the build (sharing files, hashing, registering) as one phase; the builder
        shows its own. ``digests``, when given, receives the blake3 (hex) of each file of a
        shared kind that the seal read to pool it, by its path relative to ``out`` (POSIX
        spelling): files that were pool inodes already are not read and not listed. The
        bytecode index takes a fresh pyc's digest from here rather than reading it again.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown store object kind {kind!r}")
        existing = self.record(name)
        if existing is not None:
            return existing
        self._ensure_dirs()
        with self.lock(name):
            existing = self.record(name)
            if existing is not None:
                return existing  # another process built it while we waited
            # Another member's, whom this user does not trust: built here all the same, and
            # theirs used only if it is exactly this build (:meth:`_adopt`).
            claimed = self._claimed(name)
            target = self.path(name)
            if claimed is None and os.path.lexists(target):
                # A crash between rename and record: not registered, so not trusted.
                self.check_removable(name)
                remove_tree(target)
            import tempfile  # lazy: `store verify` and lookups never build (CLI start-up)

            scratch = Path(tempfile.mkdtemp(prefix=f"{name[:40]}.", dir=self.tmp_dir))
            interrupted = False
            try:
                out = scratch / "out"
                result = build(out) or BuildResult()
                with progress.phase(f"hashing and registering {kind} {_display_name(name)}") as phase:
                    digest = self._seal_and_hash(out, kind, name, digests=digests)
                    phase.summary = format_bytes(digest.nar_size)
                    if claimed is not None:
                        if expected_content is not None and digest.hash != expected_content:
                            raise StoreError(
                                f"{name}: content hash mismatch: expected {expected_content}, got {digest.hash}"
                            )
                        return self._adopt(name, claimed, digest.hash)
                    return self._place(out, name, kind, digest, result, references, expected_content)
            except BaseException as exc:
                interrupted = _interrupted(exc, progress)
                raise
            finally:
                if not interrupted:  # else left to the next clean (INTERRUPTS)
                    remove_tree(scratch)

    def stage(self, kind: str, build: Builder, *, label: str, progress: Reporter = QUIET) -> Staged:
        """Build an object with ``build(out)`` in the store's scratch, canonicalize and hash it,
        and register nothing: the caller then :meth:`commit` s it under a name (which may
        depend on its content hash, computed here once) or :meth:`Staged.discard` s it.

        What this is for: realize builds the interpreter and exports the git sources while it
        fetches, and registers them only once the fetch succeeded, so a failed realize leaves
        the store as it was. The bytes are read once, here: commit relies on a stat
        fingerprint taken before the hash (:class:`Staged`). The
        scratch folder is held (an ``flock`` on ``.locks/<label>-<token>.lock``) until then,
        so a concurrent :meth:`clean` (another realize, ``gc``) leaves it alone; after a
        crash it is debris that the next clean removes. A failing builder leaves nothing.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown store object kind {kind!r}")
        import secrets

        from harness.store.hashing import sanitize_name

        self._ensure_dirs()
        guard_name = f"{sanitize_name(label)[:60]}-{secrets.token_hex(4)}"
        guard = _Guard(self.locks_dir / f"{guard_name}.lock")
        scratch = self.tmp_dir / f"{guard_name}.stage"
        try:
            scratch.mkdir()
            out = scratch / "out"
            result = build(out) or BuildResult()
            with progress.phase(f"hashing {kind} {_display_name(label)}") as phase:
                fingerprints: list[tuple[int, dict[str, Entry]]] = []
                digest = self._seal_and_hash(out, kind, label, fingerprints=fingerprints)
                phase.summary = format_bytes(digest.nar_size)
        except BaseException as exc:
            if not _interrupted(exc, progress):  # else left to the next clean (INTERRUPTS)
                remove_tree(scratch)
            guard.release()
            raise
        return Staged(self, kind, out, digest, result, scratch, guard, fingerprints[0])

    def commit(
        self,
        staged: Staged,
        name: str,
        *,
        references: tuple[str, ...] = (),
        expected_content: str | None = None,
    ) -> Record:
        """Register ``staged`` (built and hashed by :meth:`stage`) under ``name``, without
        hashing it again; return its record. Already registered (another process was first):
        the staged copy is dropped and the registered record returned. Either way the staged
        object is gone afterwards. ``expected_content`` as for :meth:`add`.

        The staged hash is trusted only while the staged tree's stat fingerprint is the one
        taken before it was hashed (one ``lstat`` per entry, no reads). Anything different (a
        file written or replaced in the scratch since; or merely a changed ctime, as a hard
        link elsewhere gives) costs one re-hash: the same content is registered, other
        content is refused with StoreError and nothing is registered."""
        try:
            existing = self.record(name)
            if existing is not None:
                return existing
            with self.lock(name):
                existing = self.record(name)
                if existing is not None:
                    return existing
                claimed = self._claimed(name)
                if claimed is not None:  # another member's, whom this user does not trust
                    self._check_staged(staged, name)
                    return self._adopt(name, claimed, staged.digest.hash)
                target = self.path(name)
                if os.path.lexists(target):
                    self.check_removable(name)  # a crash between rename and record (see add)
                    remove_tree(target)
                taken = self._check_staged(staged, name)
                return self._place(
                    staged.out, name, staged.kind, staged.digest, staged.result, references, expected_content, taken
                )
        finally:
            staged.discard()

    @staticmethod
    def _check_staged(staged: Staged, name: str) -> tuple[int, dict[str, Entry]]:
        """``staged.out``'s fingerprint now, once its bytes are known to be the hashed ones
        (the stage's fingerprint is unchanged, or a re-hash gives the staged digest); else
        StoreError. Taken before any re-hash, as the stage's is: a change while re-hashing
        then shows at the next launch check rather than being recorded as registered."""
        from harness.store.fingerprint import take_fingerprint
        from harness.store.hashing import nar_digest

        now = take_fingerprint(staged.out)
        if now == staged.fingerprint:
            return now
        digest = nar_digest(staged.out)
        if digest != staged.digest:
            raise StoreError(
                f"{name}: the staged build changed after it was hashed (hashed {staged.digest.hash}, "
                f"now {digest.hash}); nothing was registered"
            )
        return now

    def _seal_and_hash(
        self,
        out: Path,
        kind: str,
        name: str,
        *,
        fingerprints: list[tuple[int, dict[str, Entry]]] | None = None,
        digests: dict[str, str] | None = None,
    ) -> NarDigest:
        """Share, canonicalize and hash a built object (the part of a build after the builder).

        ``fingerprints``, when given, receives ``out``'s stat fingerprint taken between
        canonicalizing and hashing: any later change to an entry changes its ctime, so the
        fingerprint still matching later means the bytes are the hashed ones.
        """
        from harness.store.hashing import nar_digest

        if not os.path.lexists(out):
            raise StoreError(f"building {name} produced nothing")
        if kind in SHARED_KINDS and fingerprints is None:
            # One read of every file, shared and hashed together (hashing.nar_digest's
            # ``files``: as canonicalize leaves it, which then changes no byte).
            digest = nar_digest(out, files=_Sharer(self, out, digests))
            canonicalize(out, keep_top_writable=True)
            return digest
        if kind in SHARED_KINDS:
            self._share_files(out)
        # The top directory stays writable until it is in place: moving a directory to another
        # parent rewrites its ``..``, which Linux allows only in a directory its owner can write
        # (or to root). Its mode is not content.
        canonicalize(out, keep_top_writable=True)
        if fingerprints is not None:
            from harness.store.fingerprint import take_fingerprint

            fingerprints.append(take_fingerprint(out))
        return nar_digest(out)

    def _place(
        self,
        out: Path,
        name: str,
        kind: str,
        digest: NarDigest,
        result: BuildResult,
        references: tuple[str, ...],
        expected_content: str | None,
        taken: tuple[int, dict[str, Entry]] | None = None,
    ) -> Record:
        """Move a canonicalized, hashed object to ``name`` and register it (under its lock).

        ``taken``: ``out``'s fingerprint just taken (by :meth:`commit`), reused for the launch
        check's with only the top entry taken again (the move and the sealing change it alone);
        without it the whole path is walked after the move.
        """
        if expected_content is not None and digest.hash != expected_content:
            raise StoreError(
                f"{name}: content hash mismatch: expected {expected_content}, got {digest.hash}; nothing was registered"
            )
        target = self.path(name)
        os.rename(out, target)
        # Read-only before registration: a registered path is never writable, and a crash here
        # leaves an unregistered path that the next add or clean removes.
        _seal_top(target)
        # The launch check's fingerprint (inodes, times), taken after the rename and the
        # sealing, which change the top's ctime; a cache, so written before the record.
        from harness.store.statfile import write_fingerprint

        if taken is not None:
            from harness.store.fingerprint import take_top

            taken = (taken[0], {**taken[1], "": take_top(target)})
        write_fingerprint(self.root, name, digest.hash, taken)
        record = Record(
            name=name,
            kind=kind,
            content=digest.hash,
            nar_size=digest.nar_size,
            references=tuple(sorted(set(references) | set(result.references))),
            obtained=result.obtained,
            impure=result.impure,
            registered=time.time(),
        )
        self._write_record(record)
        return record

    def _share_files(self, out: Path) -> None:
        """Hard-link each regular file of ``out`` to the one inode holding its content.

        Nix's store optimisation: ``.links/<blake3 of the bytes>`` (``x`` appended for an
        executable) is a hard link to the first file seen with those bytes; a later identical
        file is replaced by a link to it, so a second environment of the same wheels costs
        little more than its directory entries. Content is unchanged, so the path's content
        hash is too. A pool file whose bytes no longer match its name (changed behind the
        store's back) is replaced by the new file rather than linked to. Links that cannot be
        made (no hard links, too many) leave the file as it is. Runs before canonicalization,
        which gives shared inodes the mode and mtime they already have.

        A file that already *is* a pool inode (uv installs by hard-linking its cache, whose
        files an earlier environment put in the pool) is reused unread while it is as the
        store sealed it: read-only, mtime 1. One whose mode or mtime moved was changed behind
        the store's back, and uv's cache shares it: its bytes are checked against its pool
        name, and a mismatch is a StoreError naming the file (never registered as this
        path's content: ``store verify --repair`` mends the cache).
        """
        import blake3

        from harness.store.hashing import file_blake3

        sharer = _Sharer(self, out)
        for dirpath, _, filenames in os.walk(out):
            for filename in filenames:
                path = os.path.join(dirpath, filename)
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or not sharer.wants(path, st):
                    continue
                if st.st_size < 1 << 20:  # most are small: one read, no thread pool
                    with open(path, "rb") as handle:
                        digest = blake3.blake3(handle.read()).hexdigest()
                else:
                    digest = file_blake3(path)
                sharer.add(path, st, digest)

    def collect_links(self) -> int:
        """Remove pool links no store path shares any more (link count 1); returns how many."""
        removed = 0
        if not self.links_dir.is_dir():
            return removed
        with os.scandir(self.links_dir) as entries:
            for entry in entries:
                try:
                    if entry.stat(follow_symlinks=False).st_nlink == 1:
                        os.unlink(entry.path)
                        removed += 1
                except (FileNotFoundError, PermissionError):
                    continue  # gone, or another member's (a shared store's pool is sticky)
        return removed

    def _write_record(self, record: Record) -> None:
        final = self.record_path(record.name)
        import tempfile

        fd, temp = tempfile.mkstemp(prefix=f".{record.name[:40]}.", dir=self.meta_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                # Readable by everyone who can read the store (mkstemp makes 0600); a record,
                # like its path, never changes once registered.
                os.fchmod(handle.fileno(), 0o444)
                json.dump(record.as_json(), handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.replace(temp, final)  # registration: the last step, atomic
            except PermissionError:
                from harness.store.entries import owner_of

                raise StoreError(
                    f"cannot register {record.name}: its record {final} was made by {owner_of(final)}, "
                    "and only they (or root) can replace it in this shared store"
                ) from None
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    # -- removing and cleaning -----------------------------------------------------------

    def delete(self, name: str) -> None:
        """Unregister and remove ``name``: the record goes first, so a crash leaves debris.

        Refused (StoreError, nothing touched) for a path another member of a shared store
        registered.
        """
        with self.lock(name):
            self.check_removable(name)
            self.record_path(name).unlink(missing_ok=True)
            (self.root / ".stat" / f"{name}.json").unlink(missing_ok=True)  # its launch-check fingerprint
            for theirs in (self.root / ".stat").glob(f"{name}.*.json"):  # other members' of it
                with contextlib.suppress(OSError):
                    theirs.unlink()
            target = self.root / name
            if os.path.lexists(target):
                remove_tree(target)

    def clean(self) -> list[str]:
        """Remove leftovers of interrupted builds: temp dirs and unregistered paths.

        Only what no live process holds is touched: each leftover path is removed under its
        lock, and temp dirs only when no lock of the same name is held.
        """
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith("."):
                continue
            if self.record_path(entry.name).is_file():
                continue
            from filelock import Timeout

            if not removable(entry):
                continue  # another member's leftover (shared store): theirs to clean
            try:
                with self.lock(entry.name).acquire(timeout=0):
                    if not self.record_path(entry.name).is_file() and os.path.lexists(entry):
                        remove_tree(entry)
                        removed.append(entry.name)
            except Timeout:
                continue  # being built right now
            except StoreError:
                continue  # not a store path name: not the store's to remove
        if self.tmp_dir.is_dir():
            for scratch in sorted(self.tmp_dir.iterdir()):
                name_prefix = scratch.name.rsplit(".", 1)[0]
                if not removable(scratch) or self._someone_building(name_prefix):
                    continue
                remove_tree(scratch)
                removed.append(f".tmp/{scratch.name}")
        for temp in sorted(self.meta_dir.glob(".*")) if self.meta_dir.is_dir() else []:
            # A record being written right now (under its path's lock) is not debris.
            if removable(temp) and not self._someone_building(temp.name[1:].rsplit(".", 1)[0]):
                temp.unlink(missing_ok=True)
        return removed

    def _someone_building(self, name_prefix: str) -> bool:
        """Whether a lock of a path named ``name_prefix…`` is held. An entry there that is no
        lock file (a fifo or link another member planted) counts as held: what it guards is
        left alone, and the command goes on."""
        from filelock import Timeout

        from harness.store.entries import BadEntry

        for path in self.locks_dir.glob(f"{name_prefix}*.lock"):
            try:
                with lock_file(path).acquire(timeout=0):
                    pass
            except (Timeout, BadEntry):
                return True
        return False


def _display_name(name: str) -> str:
    """A store path's name without its hash, for people (``<hash>-vlm`` → ``vlm``)."""
    head, _, rest = name.partition("-")
    return rest if len(head) == 32 and rest else name


def lock_file(path: Path, *, thread_local: bool = True) -> PathLock:
    """An ``flock`` on ``path`` that every member of the folder's group can open, and that no
    member can point elsewhere (:class:`harness.store.entries.PathLock`: never opened through
    a symlink). Group-writable (0664; the process umask may still take bits away in a private
    home). Any thread may release it; ``thread_local`` is kept for callers that said so."""
    from harness.store.entries import PathLock

    del thread_local  # an flock belongs to the open file, not to a thread
    return PathLock(path, mode=0o664)


def canonicalize(path: Path, *, keep_top_writable: bool = False) -> None:
    """Make ``path`` read-only with fixed mtimes; keep only the executable bit as meaning.

    Files become 0444 or 0555, directories 0555, symlinks are left as they are (their
    targets are content). Ownership is not touched (that needs privileges and is not
    content). Children are done before their directory, since a read-only directory's
    entries can no longer be changed. ``keep_top_writable`` leaves a top directory 0755
    (mtime fixed all the same) so it can still be moved into the store without root; the
    caller seals it with :func:`_seal_top` once it is in place.
    """

    def fix(entry: Path, st: os.stat_result) -> None:
        # What is already canonical is left alone: a file shared with other paths (the pool,
        # uv's cache) keeps its ctime, which their launch-check fingerprints record.
        if stat.S_ISLNK(st.st_mode):
            if st.st_mtime_ns != FIXED_MTIME_NS:
                os.utime(entry, (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)
            return
        if stat.S_ISDIR(st.st_mode):
            mode = 0o555
        elif stat.S_ISREG(st.st_mode):
            mode = 0o555 if st.st_mode & 0o111 else 0o444
        else:
            raise StoreError(f"{entry}: not a regular file, directory or symlink")
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(entry, mode)
        if st.st_mtime_ns != FIXED_MTIME_NS:
            os.utime(entry, (FIXED_MTIME, FIXED_MTIME))

    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        for dirpath, dirnames, filenames in os.walk(path, topdown=False):
            for child in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                full = Path(dirpath, child)
                fix(full, os.lstat(full))
            for child in dirnames:
                full = Path(dirpath, child)
                if not os.path.islink(full):
                    fix(full, os.lstat(full))
        if keep_top_writable:
            os.chmod(path, 0o755)
            os.utime(path, (FIXED_MTIME, FIXED_MTIME))
            return
    fix(path, st)


def _seal_top(path: Path) -> None:
    """Make a just-moved top directory read-only (files and symlinks already are)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        os.chmod(path, 0o555)
    if not stat.S_ISLNK(st.st_mode):
        os.utime(path, (FIXED_MTIME, FIXED_MTIME))


class _Sharer:
    """:meth:`Store._share_files` for one built path, file by file: :meth:`wants` says whether
    a file must be read (it is not a pool inode already, which it checks), :meth:`add` links it
    to the pool by its bytes' blake3. ``Store._seal_and_hash`` hands it to
    :func:`harness.store.hashing.nar_digest`, which reads each file once for both."""

    def __init__(self, store: Store, out: Path, digests: dict[str, str] | None = None) -> None:
        self.out = out
        self.digests = digests
        self._prefix = len(os.fsencode(out)) + 1
        self.links_dir = store.links_dir
        self.links_dir.mkdir(exist_ok=True)
        # Inodes already in the pool (readdir gives them for free): files installed as hard
        # links of uv's cache are usually among them, and need no reading at all.
        with os.scandir(self.links_dir) as entries:
            self.pooled = {entry.inode(): entry.name for entry in entries}
        self.device = os.stat(self.links_dir).st_dev
        #: Inodes of this build put in the pool now: sealed with the rest of it, not yet.
        self.linked: set[int] = set()

    def wants(self, path: str | bytes, st: os.stat_result) -> bool:
        if st.st_ino in self.pooled and st.st_dev == self.device:
            if st.st_mtime_ns != FIXED_MTIME_NS or st.st_mode & 0o222:
                _check_pooled(os.fsdecode(path), self.pooled[st.st_ino], self.out)
            return False
        return True

    def add(self, path: str | bytes, st: os.stat_result, digest: str) -> None:
        raw = os.fsencode(path)
        if self.digests is not None:
            self.digests[os.fsdecode(raw[self._prefix :])] = digest
        path = os.fsdecode(raw)
        pool = self.links_dir / (digest + ("x" if st.st_mode & 0o111 else ""))
        try:
            os.link(path, pool)
            self.linked.add(st.st_ino)
            return  # the first file with these bytes
        except FileExistsError:
            pass
        except OSError:
            return
        try:
            held = os.lstat(pool)
            if (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino):
                return
            ours = held.st_ino in self.linked and held.st_dev == st.st_dev
            if not (ours or _poolable(held)) or not _same_bytes(path, pool):
                # A damaged pool file, or what another member put there (a link, a fifo, a
                # file they can still write): ours is right. In a shared store's sticky
                # .links another member's entry stays (PermissionError) and ours unshared.
                _replace_with_link(Path(path), pool)
                self.linked.add(st.st_ino)
            else:
                _replace_with_link(pool, Path(path))
        except OSError:
            return


def _check_pooled(path: str, pool_name: str, out: Path) -> None:
    """StoreError unless ``path`` (a pool inode whose mode or mtime moved) still holds the
    bytes its pool name says."""
    from harness.store.hashing import file_blake3

    found = file_blake3(path)
    if found != pool_name.removesuffix("x"):
        rel = os.path.relpath(path, out)
        raise StoreError(
            f"{rel}: the file installed here was changed behind the store's back (its bytes are no longer "
            f"those of the store's .links/{pool_name}; uv's cache shares the file); nothing was registered",
            hint="`harness store verify --repair` rebuilds what shares it and mends uv's cache",
        )


def _poolable(st: os.stat_result) -> bool:
    """Whether a pool entry is one a path's file may become another name of: a regular file
    nobody can write, with the store's fixed mtime (as sealing leaves every store file)."""
    return stat.S_ISREG(st.st_mode) and not st.st_mode & 0o222 and st.st_mtime_ns == FIXED_MTIME_NS


def _same_bytes(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    from harness.store.entries import open_regular

    with open(a, "rb") as first, open_regular(Path(b)) as second:
        if os.fstat(first.fileno()).st_size != os.fstat(second.fileno()).st_size:
            return False
        while True:
            chunk = first.read(1 << 20)
            if chunk != second.read(1 << 20):
                return False
            if not chunk:
                return True


def _replace_with_link(source: Path, target: Path) -> None:
    """Make ``target`` another name of ``source``'s inode, atomically."""
    temp = target.with_name(f".{target.name}.{os.getpid()}.link")
    temp.unlink(missing_ok=True)
    os.link(source, temp)
    try:
        os.replace(temp, target)
    except OSError:
        temp.unlink(missing_ok=True)
        raise


def remove_tree(path: Path) -> None:
    """Remove a file or tree even when read-only (store objects are)."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return

    # Entries of a read-only directory cannot be unlinked: open every directory up first
    # (files themselves may stay read-only; unlinking needs only the parent's write bit).
    for dirpath, dirnames, _ in os.walk(path):
        os.chmod(dirpath, 0o755)
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                os.chmod(full, 0o755)
    import shutil  # lazy: shutil pulls in bz2 and lzma, which most commands never need

    shutil.rmtree(path)
