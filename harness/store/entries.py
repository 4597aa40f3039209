"""The store's own small files, opened as files another member may have planted.

In a home a group shares (``harness store init --group``) every member can create entries in
``.meta``, ``.locks``, ``.roots`` and ``.stat``. Those folders are sticky, so nobody can
replace or delete an entry another member made, but anyone can make a *new* one: a symlink
to ``/etc``, a fifo, a folder, a huge file, garbage. Nothing such an entry says may make a
command fail for anyone else, and nothing it points at may be opened through it. So:

* :func:`read_entry` opens without following a symlink (``O_NOFOLLOW``) and without blocking
  on a fifo (``O_NONBLOCK``), checks on the open descriptor that it is a regular file no
  larger than the caller's limit, and reads it: :class:`BadEntry` says what is wrong with
  that one entry; callers that walk many entries report it as that entry and go on;
* :class:`PathLock` is the per-path lock (an ``flock``) on a lock file opened the same way:
  a planted symlink or folder is a :class:`BadEntry` naming the entry and its owner, never
  a write through the link (a lock file is opened read-write, which would truncate or create
  whatever the link names in other libraries' locks).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, cast

from harness.errors import HarnessError

#: A record or a root is a few kilobytes; a fingerprint of a large environment a few MB.
RECORD_LIMIT = 1 << 20

_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class BadEntry(HarnessError):
    """One entry of the store is not what the store writes there (a symlink, not a regular
    file, too large, unreadable); ``path`` is the entry, ``reason`` says how, naming its owner."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"{path}: {reason}; harness ignores it",
            hint="its owner, the store folder's owner or root can remove it",
        )
        self.path = path
        self.reason = reason


def user_name(uid: int) -> str:
    """The login name of ``uid``, or the number when the system does not know it."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def owner_of(path: Path) -> str:
    """Who owns ``path`` (its login name), for messages; "someone" when it cannot be seen."""
    try:
        return user_name(os.lstat(path).st_uid)
    except OSError:
        return "someone"


def _what(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if stat.S_ISFIFO(st.st_mode):
        return "a fifo"
    return "not a regular file"


def _refused(path: Path, exc: OSError) -> BadEntry:
    if exc.errno == errno.ELOOP:
        return BadEntry(path, f"a symlink made by {owner_of(path)}, not a file harness wrote")
    return BadEntry(path, f"unreadable ({exc.strerror or exc})")


def read_entry(path: Path, *, limit: int = RECORD_LIMIT) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path`` and its stat, read without following a symlink.

    Raises FileNotFoundError when there is no entry, :class:`BadEntry` when it is a symlink,
    a folder, a fifo or a device, larger than ``limit`` bytes, or cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _refused(path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadEntry(path, f"{_what(st)} made by {owner_of(path)}, not a file harness wrote")
        if st.st_size > limit:
            raise BadEntry(path, f"{st.st_size} bytes, more than the {limit} such an entry may hold")
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise BadEntry(path, f"more than the {limit} bytes such an entry may hold")
        return data, st
    except OSError as exc:
        raise _refused(path, exc) from None
    finally:
        os.close(fd)


#: The most a run record's file may hold (its closure, its events, its launch checks).
RUN_FILE_LIMIT = 64 << 20


def read_regular(path: Path, *, limit: int = RUN_FILE_LIMIT) -> bytes | None:
    """The bytes of ``path`` when it is a regular file (read as :func:`read_entry` reads:
    never through a link, never blocking on a fifo), else None: for what a report or a
    listing shows when it is there, whoever made it."""
    try:
        return read_entry(path, limit=limit)[0]
    except (OSError, BadEntry):
        return None


def is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (a link to one is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def removable(path: Path) -> bool:
    """Whether this user may remove ``path`` from a (possibly shared, sticky) folder: an
    entry of theirs, or any as root."""
    try:
        return os.geteuid() == 0 or os.lstat(path).st_uid == os.geteuid()
    except FileNotFoundError:
        return False


def read_own(path: Path, *, limit: int = RECORD_LIMIT) -> bytes | None:
    """The bytes of ``path`` when it is a regular file of this user's (read as
    :func:`read_entry` reads), else None: for caches and notes that are only advice, where
    another member's file, a link or garbage means "ask again", never an error."""
    try:
        data, st = read_entry(path, limit=limit)
    except (OSError, BadEntry):
        return None
    return data if st.st_uid == os.geteuid() else None


def write_entry(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically: a temporary file made with ``O_EXCL`` (never
    through a planted link) and ``mode``, renamed over it. In a sticky folder an entry another
    member made cannot be replaced: that is a :class:`BadEntry` naming them."""
    import secrets

    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask took bits away
            os.write(fd, data)
        finally:
            os.close(fd)
        try:
            os.replace(temp, path)
        except PermissionError:
            raise BadEntry(path, f"made by {owner_of(path)}, and only they can replace it here") from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def held_part(path: Path) -> int:
    """How many bytes the partial download ``path`` holds: its size when it is a regular file,
    0 when there is nothing; anything else there (a link, a fifo: what another member of a
    shared home can put in the group's download folder) is removed, never followed, and the
    download starts from zero. OSError when it cannot be removed (a folder, a sticky one)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if stat.S_ISREG(st.st_mode):
        return st.st_size
    os.unlink(path)  # the link itself, never what it names
    return 0


def open_part(path: Path, *, append: bool) -> BinaryIO:
    """The partial download ``path`` opened to read and write (created when missing; emptied
    unless ``append``), never through a link and never blocking on a fifo: an entry that is not
    a regular file is an OSError (``ELOOP``, ``EISDIR``, ``EINVAL``). What such a file holds is
    only ever kept once its hash matches, whoever wrote it."""
    flags = os.O_RDWR | os.O_CREAT | _OPEN | (0 if append else os.O_TRUNC)
    if not append:
        held_part(path)  # a link or fifo in its place goes first (O_TRUNC would open a fifo)
    return _regular(os.open(path, flags, 0o666), path, "r+b")


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened to read (a partial download, a directory cache's file), never through a
    link nor blocking on a fifo (an OSError for anything but a regular file)."""
    return _regular(os.open(path, os.O_RDONLY | _OPEN), path, "rb")


def _regular(fd: int, path: Path, mode: str) -> BinaryIO:
    """``fd`` (opened with ``O_NONBLOCK``) as a blocking file object in ``mode``; an OSError
    (``EINVAL``), the descriptor closed, when it is not a regular file."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return cast(BinaryIO, os.fdopen(fd, mode))
    except BaseException:
        os.close(fd)
        raise


def regular_size(path: Path) -> int:
    """The size of ``path`` when it is a regular file (not followed through a link), else 0."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def own_folder(folder: Path, what: str) -> Path:
    """``folder`` (a folder named for this user, in a sticky folder of the store), made now
    when missing (``0755``, its parents as needed); a :class:`BadEntry` naming who made it
    when another member made that name first, or it is not a folder. ``what`` says what
    the folder holds, for that message."""
    import stat

    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o755)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise BadEntry(folder, f"made by {owner_of(folder)}, not this user's folder of {what}")
    return folder


class PathLock:
    """An exclusive ``flock`` on the lock file ``path``, for ``with`` or :meth:`acquire`.

    The file is created (``mode``, group-writable so that every member of a shared store can
    open the one another member created) or opened as it is, never through a symlink; one
    that is not a regular file is a :class:`BadEntry`. A member who can only read it (it was
    made without group write) still locks it: ``flock`` needs no write access. Re-entrant per
    instance; released from any thread (an ``flock`` belongs to the open file, not a thread).
    ``acquire(timeout=…)`` raises ``filelock.Timeout`` when the time runs out, as the
    ``filelock`` locks harness used before did.
    """

    def __init__(self, path: Path | str, *, mode: int = 0o664) -> None:
        self.path = Path(path)
        self.lock_file = str(path)
        self.mode = mode
        self._fd: int | None = None
        self._depth = 0

    @property
    def is_locked(self) -> bool:
        return self._fd is not None

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _OPEN, self.mode)
        except PermissionError:
            try:
                fd = os.open(self.path, os.O_RDONLY | _OPEN)
            except OSError as exc:
                raise _refused(self.path, exc) from None
        except OSError as exc:
            raise _refused(self.path, exc) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise BadEntry(self.path, f"{_what(st)} made by {owner_of(self.path)}, not a lock file harness made")
            if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != self.mode:
                try:
                    os.fchmod(fd, self.mode)  # the umask took bits the group needs
                except OSError:
                    pass
        except BaseException:
            os.close(fd)
            raise
        return fd

    def acquire(self, timeout: float | None = None, poll_interval: float = 0.05) -> _Held:
        """Take the lock, waiting at most ``timeout`` seconds (None: as long as it takes);
        ``with lock.acquire(…):`` releases it at the end of the block."""
        import fcntl

        if self._fd is not None:
            self._depth += 1
            return _Held(self)
        fd = self._open()
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        try:
            if deadline is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            from filelock import Timeout

                            raise Timeout(self.lock_file) from None
                        time.sleep(poll_interval)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._depth = fd, 1
        return _Held(self)

    def release(self, force: bool = False) -> None:
        """Let go (the outermost release, or any with ``force``); the file stays for others."""
        if self._fd is None:
            return
        self._depth -= 1
        if self._depth > 0 and not force:
            return
        fd, self._fd, self._depth = self._fd, None, 0
        os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> PathLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()


class _Held:
    """What :meth:`PathLock.acquire` returns: ``with`` it releases the lock once."""

    def __init__(self, lock: PathLock) -> None:
        self.lock = lock

    def __enter__(self) -> PathLock:
        return self.lock

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.lock.release()
