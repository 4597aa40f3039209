"""The store's bytecode index: which pyc in the pool (``.links``) a source file compiles to.

A pyc's bytes are a function of the interpreter (its store path), the source's bytes, the
file name recorded in it (relative to the environment, ``lib/python3.11/site-packages/…``)
and the optimization level, *given how harness compiles* (``harness/realize/bytecode.py``:
unchecked-hash pycs, ``PYTHONHASHSEED=0``, one fixed worker script). So a second
environment that installs the same file of the same package on the same interpreter can
take the pyc an earlier environment compiled instead of compiling it again; uv compiles
every environment's files from scratch.

Layout (``store/README.md``, section 8)::

    store/.bytecode/<interpreter store name>/<k[:2]>/<k[2:]>

``k`` is :func:`entry_key` (hex blake3 of the scheme, the interpreter store name, the
relative file name, the source's blake3 and the optimization level); the file holds one line,
``<pyc blake3 hex> <check>\\n``, where ``check`` is the first 16 hex digits of the blake3 of
``k`` and the pyc digest: an entry damaged on disk fails it and counts as absent. The pyc
itself is the pool file ``.links/<pyc blake3 hex>`` (pycs are never executable), which every
environment holding that pyc hard-links to (``Store._share_files``).

Contract (what makes the index safe to be wrong):

* an entry is only a hint. Absent, malformed, failing its check, or naming a pool file that
  is gone or whose bytes do not hash to its name: the caller compiles, as with no index;
* every reused pyc is read and hashed before it is placed (:meth:`BytecodeIndex.read`), so a
  pool file changed behind the store's back never enters a new path, and the new path's
  content hash (computed at registration, checked by ``store verify``) covers its bytes;
* entries are written only after the environment holding the pyc is registered, and only
  when the pool file exists (:meth:`BytecodeIndex.record`); writes are atomic (temp + rename);
* ``gc`` drops entries whose pool file it removed and folders of interpreters no longer
  registered (:func:`prune`). A concurrent gc can still remove a pool file between lookup
  and link: the link then fails and that file is compiled.

Bumping :data:`SCHEME` (a change of the compile routine that changes bytes) changes every
key, so older entries are never matched again; ``gc`` removes them once their pool files go.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import blake3

#: Names the compile routine the pycs came from; part of every key (module doc).
SCHEME = "harness-pyc-1"
#: A well-formed entry: pyc digest, check.
_ENTRY = re.compile(rb"^([0-9a-f]{64}) ([0-9a-f]{16})\n$")


def entry_key(interpreter: str, relative: str, source_blake3: str, optimization: int = 0) -> str:
    """The index key of one source file (hex blake3 over NUL-separated fields)."""
    preimage = "\0".join((SCHEME, interpreter, relative, source_blake3, str(optimization)))
    return blake3.blake3(preimage.encode("utf-8", "surrogateescape")).hexdigest()


def _check(key: str, pyc: str) -> str:
    return blake3.blake3(f"{key} {pyc}".encode("ascii")).hexdigest()[:16]


class BytecodeIndex:
    """The entries of one interpreter in one store (module doc). Cheap to construct."""

    def __init__(self, store_root: Path, interpreter: str) -> None:
        self.store_root = store_root
        self.interpreter = interpreter
        self.folder = store_root / ".bytecode" / interpreter
        self.links = store_root / ".links"

    def _entry(self, key: str) -> Path:
        return self.folder / key[:2] / key[2:]

    def lookup(self, key: str) -> str | None:
        """The pyc digest an intact entry names, or None (no entry, or a damaged one)."""
        try:
            with open(self._entry(key), "rb") as handle:
                data = handle.read(128)
        except OSError:
            return None
        match = _ENTRY.match(data)
        if match is None:
            return None
        pyc, check = match.group(1).decode("ascii"), match.group(2).decode("ascii")
        return pyc if _check(key, pyc) == check else None

    def read(self, pyc: str) -> bytes | None:
        """The bytes of pool file ``pyc`` when they hash to its name, else None."""
        try:
            with open(self.links / pyc, "rb") as handle:
                data = handle.read()
        except OSError:
            return None
        return data if blake3.blake3(data).hexdigest() == pyc else None

    def record(self, entries: Iterable[tuple[str, str]]) -> int:
        """Write ``(key, pyc digest)`` entries whose pool file exists; returns how many.

        Called after the path holding the pycs is registered (its files are then in the
        pool). Best effort: an entry that cannot be written (a read-only store, a full
        disk) only means that file is compiled again next time.
        """
        written = 0
        made: set[Path] = set()
        for key, pyc in entries:
            if not (self.links / pyc).is_file():
                continue
            target = self._entry(key)
            try:
                if target.parent not in made:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    made.add(target.parent)
                _write_atomic(target, f"{pyc} {_check(key, pyc)}\n".encode("ascii"))
                written += 1
            except OSError:
                continue
        return written


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
    """Remove entries whose pool file is gone, damaged entries, stray temp files, and the
    folders of interpreters not in ``registered``; returns how many entries went. For gc,
    after it collected the pool (module doc)."""
    import shutil

    top = store_root / ".bytecode"
    if not top.is_dir():
        return 0
    links = store_root / ".links"
    keep = set(registered)
    removed = 0
    for folder in sorted(top.iterdir()):
        if folder.name not in keep:
            removed += sum(len(files) for _, _, files in os.walk(folder))
            shutil.rmtree(folder, ignore_errors=True)
            continue
        for dirpath, _, filenames in os.walk(folder):
            for name in filenames:
                path = os.path.join(dirpath, name)
                key = os.path.basename(dirpath) + name
                try:
                    with open(path, "rb") as handle:
                        match = _ENTRY.match(handle.read(128))
                    stale = (
                        name.startswith(".")
                        or match is None
                        or _check(key, match.group(1).decode("ascii")) != match.group(2).decode("ascii")
                        or not os.path.isfile(links / match.group(1).decode("ascii"))
                    )
                    if stale:
                        os.unlink(path)
                        removed += 1
                except OSError:
                    continue  # gone, or another member's entry (a shared store's folder is sticky)
    return removed
