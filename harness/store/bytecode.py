"""The store's bytecode index: which pyc in the pool (``.links``) a source file compiles to.

A pyc's bytes are a function of the interpreter (its store path), the source's bytes, the
file name recorded in it (relative to the environment, ``lib/python3.11/site-packages/…``)
and the optimization level, *given how harness compiles* (``harness/realize/bytecode.py``:
unchecked-hash pycs, ``PYTHONHASHSEED=0``, one fixed worker script). So a second
environment that installs the same file of the same package on the same interpreter can
take the pyc an earlier environment compiled instead of compiling it again; uv compiles
every environment's files from scratch.

Layout (``store/README.md``, section 9, "Bytecode index")::

    store/.bytecode/<interpreter store name>/<store name of the path that compiled them>

Each such file holds one line per pyc that path compiled, ``<k> <pyc> <check>\\n``: ``k`` is
:func:`entry_key` (hex blake3 of the scheme, the interpreter store name, the relative file
name, the source's blake3 and the optimization level), ``pyc`` the hex blake3 of the pyc,
which is the pool file ``.links/<pyc>`` (pycs are never executable), and ``check`` the first
16 hex digits of the blake3 of ``"<k> <pyc>"``: a line damaged on disk fails it and counts as
absent. One file per registered path, written once: registering an environment of thousands
of files costs one file write, not thousands. A lookup reads the interpreter's files once.

Contract (what makes the index safe to be wrong):

* an entry is only a hint. Absent, malformed, failing its check, or naming a pool file that
  is gone or whose bytes do not hash to its name: the caller compiles, as with no index;
* only files the current user (or root) wrote are read. In a store a group shares, another
  member could otherwise map a source to a pyc of their choosing, and a pyc's header cannot
  tell (its source hash is copied as easily as the rest): members share pool files, which
  are checked by hash, but each follows only the mappings it made itself;
* every reused pyc is read and hashed before it is placed (:meth:`BytecodeIndex.read`), so a
  pool file changed behind the store's back never enters a new path, and the new path's
  content hash (computed at registration, checked by ``store verify``) covers its bytes;
* entries are written only after the path holding the pycs is registered, and only for
  pool files that exist (:meth:`BytecodeIndex.record`); files are written atomically;
* ``gc`` drops the entries whose pool file it removed and the folders of interpreters no
  longer registered (:func:`prune`). A concurrent gc can still remove a pool file between
  lookup and link: the link then fails and that file is compiled.

:data:`SCHEME` is part of every key: a change of the compile routine that changes bytes
bumps it, so older entries are never matched again (``gc`` drops them with their pool files).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import blake3

#: Names the compile routine the pycs came from; part of every key (module doc).
SCHEME = "harness-pyc-1"
#: A well-formed line: key, pyc digest, check.
_LINE = re.compile(r"^([0-9a-f]{64}) ([0-9a-f]{64}) ([0-9a-f]{16})$")


def entry_key(interpreter: str, relative: str, source_blake3: str, optimization: int = 0) -> str:
    """The index key of one source file (hex blake3 over NUL-separated fields)."""
    preimage = "\0".join((SCHEME, interpreter, relative, source_blake3, str(optimization)))
    return blake3.blake3(preimage.encode("utf-8", "surrogateescape")).hexdigest()


def _check(key: str, pyc: str) -> str:
    return blake3.blake3(f"{key} {pyc}".encode("ascii")).hexdigest()[:16]


def _parse(text: str) -> Iterable[tuple[str, str, str]]:
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is not None:
            yield match.group(1), match.group(2), match.group(3)


class BytecodeIndex:
    """The entries of one interpreter in one store (module doc). Cheap to construct; the
    entries are read on the first :meth:`lookup`."""

    def __init__(self, store_root: Path, interpreter: str) -> None:
        self.store_root = store_root
        self.interpreter = interpreter
        self.folder = store_root / ".bytecode" / interpreter
        self.links = store_root / ".links"
        self._entries: dict[str, tuple[str, str]] | None = None

    def load(self) -> None:
        """Read the interpreter's entries now (else the first :meth:`lookup` does)."""
        if self._entries is None:
            self._entries = self._load()

    def _load(self) -> dict[str, tuple[str, str]]:
        entries: dict[str, tuple[str, str]] = {}
        try:
            names = sorted(os.listdir(self.folder))
        except OSError:
            return entries
        for name in names:
            if name.startswith("."):
                continue  # a file being written
            text = _read_own(self.folder / name)
            for key, pyc, check in _parse(text or ""):
                entries[key] = (pyc, check)
        return entries

    def lookup(self, key: str) -> str | None:
        """The pyc digest an intact entry names, or None (no entry, a damaged one, or one
        another user wrote: see the module doc)."""
        self.load()
        assert self._entries is not None
        found = self._entries.get(key)
        if found is None:
            return None
        pyc, check = found
        return pyc if _check(key, pyc) == check else None

    def read(self, pyc: str) -> bytes | None:
        """The bytes of pool file ``pyc`` when they hash to its name and it is sealed (a
        regular file nobody can write, the store's fixed mtime), else None."""
        from harness.store.entries import open_regular
        from harness.store.store import FIXED_MTIME_NS

        try:
            with open_regular(self.links / pyc) as handle:  # never a link, never a fifo
                st = os.fstat(handle.fileno())
                if st.st_mode & 0o222 or st.st_mtime_ns != FIXED_MTIME_NS:
                    return None  # not sealed as the store seals its files: someone can write it
                data = handle.read()
        except OSError:
            return None
        return data if blake3.blake3(data).hexdigest() == pyc else None

    def record(self, path: str, entries: Iterable[tuple[str, str]]) -> int:
        """Write the ``(key, pyc digest)`` entries of registered store path ``path`` whose
        pool file exists, as one file; returns how many.

        Called after ``path`` is registered (its files are then in the pool). Best effort: a
        file that cannot be written (a read-only store, a full disk) only means those files
        are compiled again next time.
        """
        lines = sorted({f"{key} {pyc} {_check(key, pyc)}\n" for key, pyc in entries if (self.links / pyc).is_file()})
        if not lines:
            return 0
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            _sticky_if_shared(self.folder, self.store_root)
            _write_atomic(self.folder / path, "".join(lines).encode("ascii"))
        except OSError:
            return 0
        if self._entries is not None:
            self._entries.update((key, (pyc, check)) for key, pyc, check in _parse("".join(lines)))
        return len(lines)


def _read_own(path: Path) -> str | None:
    """The text of index file ``path`` when this user (or root) wrote it, else None: another
    member's file, a link, a fifo (module doc). Read as :func:`harness.store.entries.read_entry`
    reads (an environment of ten thousand files makes a file of 1.5 MB)."""
    from harness.store.entries import BadEntry, read_entry

    try:
        raw, st = read_entry(path, limit=256 << 20)
    except (OSError, BadEntry):
        return None
    return raw.decode("ascii", errors="replace") if st.st_uid in (os.geteuid(), 0) else None


def _sticky_if_shared(folder: Path, store_root: Path) -> None:
    """In a shared store (setgid), an interpreter's folder of this user's is made sticky: each
    member writes their own index files there, and none may remove another's."""
    st = os.lstat(folder)
    if os.stat(store_root).st_mode & stat.S_ISGID and st.st_uid == os.geteuid() and not st.st_mode & stat.S_ISVTX:
        os.chmod(folder, stat.S_IMODE(st.st_mode) | stat.S_ISVTX)


def _write_atomic(target: Path, data: bytes) -> None:
    fd, temp = tempfile.mkstemp(prefix=".", dir=target.parent)
    try:
        try:
            os.write(fd, data)
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def prune(store_root: Path, registered: Iterable[str]) -> int:
    """Drop entries whose pool file is gone and damaged lines (rewriting or removing their
    files), and the folders of interpreters not in ``registered``; returns how many entries
    went. For gc, after it collected the pool (module doc)."""
    import shutil

    top = store_root / ".bytecode"
    if not top.is_dir():
        return 0
    links = store_root / ".links"
    keep = set(registered)
    removed = 0
    me = os.geteuid()
    for folder in sorted(top.iterdir()):
        try:
            st = folder.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue  # a link or a file planted there: never followed
        if folder.name not in keep:
            if st.st_uid in (me, 0) or me == 0:
                shutil.rmtree(folder, ignore_errors=True)  # what is ours to remove in it goes
            continue
        for entry in sorted(folder.iterdir()):
            try:
                held = entry.lstat()
                # Only this user's own files: rewriting another member's would make what
                # they wrote this user's, and then believed (module doc).
                if held.st_uid != me:
                    continue
                if entry.name.startswith("."):  # a file being written, or left by a crash
                    if time.time() - held.st_mtime > 3600:
                        entry.unlink()
                    continue
                text = _read_own(entry)
                if text is None:
                    continue
                lines = text.splitlines()
                alive = [
                    f"{key} {pyc} {check}\n"
                    for key, pyc, check in _parse(text)
                    if _check(key, pyc) == check and os.path.isfile(links / pyc)
                ]
                if not alive:
                    entry.unlink()
                elif len(alive) != len(lines):
                    _write_atomic(entry, "".join(alive).encode("ascii"))
                removed += len(lines) - len(alive)
            except OSError:
                continue  # gone, or another member's file (theirs to prune)
    return removed
