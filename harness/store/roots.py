"""Temporary gc roots and the gc lock: nothing a live process uses is ever collected.

Nix's protocol, on plain files under ``store/.roots`` (so a second process, or a person,
can see what holds what)::

    .roots/gc.lock             shared while a root is added, exclusive while gc collects
    .roots/temp/<pid>-<token>  one process's temporary roots: a label line, then names
    .roots/procs/<key>.json    paths held on behalf of another process (``harness up``'s
                               broker): its pid and start time, so a reused pid is no holder

**Contract.** A process that is about to use store paths (realize, run, up, push, pull)
first *roots* them with :func:`hold` (or a :class:`TempRoots` of its own), and only then
checks that they are registered; whatever it finds registered then stays so until it
releases the roots or exits. Adding a root takes the gc lock shared; :func:`gc_lock`
(taken by ``store gc`` for the whole collection) takes it exclusive, so a root is either
added before gc reads the roots (and gc keeps the path) or after gc is done (and the
holder's check then sees whether the path survived, and builds or fetches it again). No
path is deleted between "found" and "rooted".

**Liveness.** Each temp-roots file is locked (``flock``, exclusive) by its holder for as
long as it holds it; the kernel drops the lock when the holder exits however it exits, so
gc tells a live holder (the file is locked) from a dead one (it is not: gc removes the
file). Files are created under the shared gc lock, so gc never sees one before its lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import stat
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from harness.errors import HarnessError
from harness.store.entries import BadEntry, owner_of, read_entry
from harness.store.store import Store


def _roots_dir(store: Store) -> Path:
    return store.roots_dir


def _temp_dir(store: Store, *, make: bool = False) -> Path | None:
    return _holders_folder(store, "temp", make=make)


def _procs_dir(store: Store, *, make: bool = False) -> Path | None:
    return _holders_folder(store, "procs", make=make)


def _unsafe(folder: Path, reason: str) -> HarnessError:
    return HarnessError(
        f"{folder}: {reason}; nothing is collected or rooted through it",
        hint="the home's owner (or root) runs `harness store init --group GROUP` again, which makes it anew",
    )


def _holders_folder(store: Store, name: str, *, make: bool) -> Path | None:
    """``.roots/<name>``, where live processes keep their roots: None when missing (made now
    with ``make``), else a folder that only its makers' entries can leave.

    In a shared store it must be a sticky folder (a member may remove only the files they
    made: their own roots) made by this user, root or the store's owner (whoever owns a
    folder may remove every entry in it). Anything else there, a link first of all, is a
    :class:`HarnessError` naming who made it: gc then deletes nothing, and no root is written
    through it. ``store init --group`` lays these folders out."""
    folder = store.roots_dir / name
    if make:
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir(mode=0o755)
        except FileExistsError:
            pass
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        what = "a link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise _unsafe(folder, f"{what} made by {owner_of(folder)}, not the store's folder of roots")
    if not os.stat(store.root).st_mode & stat.S_ISGID:
        return folder  # a store of one user's
    me = os.geteuid()
    if st.st_uid not in (me, 0, os.stat(store.roots_dir).st_uid):
        raise _unsafe(folder, f"made by {owner_of(folder)}, who could remove every member's roots from it")
    if not st.st_mode & stat.S_ISVTX:
        if st.st_uid != me:
            raise _unsafe(
                folder, f"made by {owner_of(folder)} without the sticky bit: any member could remove another's roots"
            )
        os.chmod(folder, stat.S_IMODE(st.st_mode) | 0o3070)
    return folder


@contextmanager
def gc_lock(store: Store, *, exclusive: bool) -> Iterator[None]:
    """The store's gc lock: exclusive for a collection, shared while a root is added."""
    folder = _roots_dir(store)
    folder.mkdir(parents=True, exist_ok=True)
    # Read-only is enough for flock, and lets every member of a group-shared store lock it.
    path = folder / "gc.lock"
    try:  # never through a planted link, nor blocking on a planted fifo
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError:
        read_entry(path)  # raises BadEntry, saying what is there and whose it is
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        read_entry(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class TempRoots:
    """A set of temporary roots held by this process until :meth:`close` (or its exit).

    Thread-safe. ``label`` says who holds them (``store why`` and ``gc --dry-run`` show it):
    ``harness run 2026…``, ``broker of /state``. Adding a name already held costs nothing.
    """

    def __init__(self, store: Store, label: str) -> None:
        self.store = store
        self.label = " ".join(label.split())
        self._names: set[str] = set()
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self.path: Path | None = None

    def add(self, names: Iterable[str]) -> None:
        """Root ``names`` (store path names) from now until :meth:`close`.

        Blocks while a gc is collecting; returns once the roots are on disk. Check that
        the paths are registered *after* this returns (see the module docstring).
        """
        with self._lock:
            new = [n for n in dict.fromkeys(names) if n and n not in self._names]
            if not new:
                return
            with gc_lock(self.store, exclusive=False):
                handle = self._open()
                handle.write("".join(f"{n}\n" for n in new))
                handle.flush()
            self._names.update(new)

    def _open(self) -> IO[str]:
        """This holder's file, created and locked (under the shared gc lock) on first use."""
        if self._file is None:
            folder = _temp_dir(self.store, make=True)
            assert folder is not None
            path = folder / f"{os.getpid()}-{secrets.token_hex(4)}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            handle = open(fd, "a", encoding="utf-8")  # held open: its flock is the liveness
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            handle.write(f"# {self.label} (pid {os.getpid()})\n")
            self._file, self.path = handle, path
        return self._file

    @property
    def names(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._names)

    def close(self) -> None:
        """Release every root: the file goes, so the next gc may collect the paths."""
        with self._lock:
            if self._file is not None:
                assert self.path is not None
                self.path.unlink(missing_ok=True)
                self._file.close()  # closing releases the flock
                self._file = None
            self._names.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_process_roots: dict[tuple[int, str], TempRoots] = {}
_process_lock = threading.Lock()


def process_roots(store: Store) -> TempRoots:
    """This process's own temporary roots in ``store``: held until the process exits
    (a forked child gets roots of its own)."""
    import sys

    key = (os.getpid(), os.path.abspath(store.root))
    with _process_lock:
        held = _process_roots.get(key)
        if held is None:
            label = " ".join(["harness", *sys.argv[1:]])[:160]
            held = _process_roots[key] = TempRoots(store, label)
        return held


def _pid_of(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[0])
    except ValueError:
        return -1


def release_process_roots() -> None:
    """Release every root :func:`hold` took in this process (a CLI command is done)."""
    with _process_lock:
        mine = [key for key in _process_roots if key[0] == os.getpid()]
        held = [_process_roots.pop(key) for key in mine]
    for roots in held:
        roots.close()


def hold(store: Store, names: Iterable[str]) -> None:
    """Root ``names`` for the rest of this process's life (see :func:`process_roots`)."""
    process_roots(store).add(names)


@contextmanager
def held(store: Store, names: Iterable[str], label: str) -> Iterator[TempRoots]:
    """Root ``names`` for the duration of a ``with`` block (a broker's lease, a push)."""
    roots = TempRoots(store, label)
    try:
        roots.add(names)
        yield roots
    finally:
        roots.close()


# ----------------------------------------------------------------- on behalf of a process


def hold_for_process(store: Store, pid: int, names: Iterable[str], label: str) -> Path:
    """Root ``names`` for as long as process ``pid`` lives (``harness up``'s broker).

    The caller must already hold the names itself (it does: it realized them), so there is
    no gap. The root records the process's start time: a later process that reuses the pid
    holds nothing. Returns the root file.
    """
    import psutil

    started = psutil.Process(pid).create_time()
    folder = _procs_dir(store, make=True)
    assert folder is not None
    target = folder / f"{pid}-{secrets.token_hex(4)}.json"
    data = {"pid": pid, "started": started, "label": label, "paths": sorted(set(names))}
    temp = target.with_name(f".{target.name}")
    with gc_lock(store, exclusive=False):
        temp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(temp, target)
    return target


def process_alive(pid: int, started: float | None) -> bool:
    """Whether ``pid`` runs and (when ``started`` is given) is the process that started then."""
    import psutil

    if pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if started is not None and abs(process.create_time() - started) > 0.01:
            return False
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


# -------------------------------------------------------------------------- for gc


@dataclass(frozen=True)
class LiveHolder:
    """A live process's roots, as gc sees them."""

    kind: str  # "process" (temporary roots) or "services" (held on behalf of a process)
    label: str
    pid: int
    names: frozenset[str]
    #: the temporary-roots file (``TempRoots.path``) or the services' root file
    file: Path | None = None


def live_holders(store: Store) -> list[LiveHolder]:
    """The roots of every live holder; removes the files of dead ones.

    Call with the gc lock held exclusively (:func:`gc_lock`) when the answer decides a
    deletion; ``store why`` may call it without.
    """
    found: list[LiveHolder] = []
    folder = _temp_dir(store)
    for path in sorted(folder.iterdir()) if folder is not None else []:
        if path.name.startswith("."):
            continue
        holder = _read_temp(path)
        if holder is not None:
            found.append(holder)
    folder = _procs_dir(store)
    for path in sorted(folder.glob("*.json")) if folder is not None else []:
        try:
            raw, _ = read_entry(path)
            data: dict[str, Any] = json.loads(raw.decode("utf-8"))
            pid = int(data["pid"])
        except (OSError, BadEntry, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
            continue
        if process_alive(pid, data.get("started")):
            found.append(
                LiveHolder(
                    "services",
                    str(data.get("label", "")),
                    pid,
                    frozenset(str(n) for n in data.get("paths", [])),
                    path,
                )
            )
        else:
            _remove(path)
    return found


def _remove(path: Path) -> None:
    """Remove a dead holder's file; in a shared store another member's may not be ours to."""
    try:
        path.unlink(missing_ok=True)
    except PermissionError:
        pass


def _read_temp(path: Path) -> LiveHolder | None:
    """A temp-roots file's holder, or None (and the file removed) when its holder is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # gone, or a planted link: no holder
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a planted fifo or folder: no holder

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # locked: its holder lives
        else:
            _remove(path)  # nobody holds it: a dead process's leftovers
            return None
        with os.fdopen(os.dup(fd), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    finally:
        os.close(fd)
    label = lines[0][2:] if lines and lines[0].startswith("# ") else path.name
    names = frozenset(line for line in lines if line and not line.startswith("#"))
    return LiveHolder("process", label, _pid_of(path), names, path)
