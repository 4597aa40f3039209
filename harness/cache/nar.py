"""Cache archives: a store path's NAR serialization, zstd-compressed, and its safe unpacking.

:func:`pack` streams :func:`harness.store.hashing.iter_nar` through zstd into a file, hashing
both streams on the way (the NAR's blake3 is the path's content hash; the compressed file's
blake3 names the archive). :func:`unpack` is its inverse and is written for archives from
someone else: it rebuilds exactly the serialized tree and refuses, with a message naming the
entry, anything that could write outside its output or that the store could not hold:

* entry names that are empty, ``.``, ``..``, contain ``/`` or NUL (absolute or
  climbing paths), or are not in strictly ascending byte order (duplicates, reordering);
* node types other than regular file, directory and symlink (devices, fifos…);
* symlink targets that are absolute, that use ``..`` after a normal component (a chain
  through another link could then climb further than the text says), or that leave the
  path for anything but one of its declared references (a sibling store path);
* non-zero padding, trailing bytes, more NAR bytes than the metadata's ``NarSize`` (a
  decompression bomb stops there), more compressed bytes than its ``FileSize``, and a
  compressed stream whose blake3 is not its ``FileHash``;
* nesting deeper than :data:`MAX_DEPTH`.

The caller unpacks into :meth:`harness.store.store.Store.add`'s build folder, so a refusal
leaves the store exactly as it was; the store then re-hashes the result against the
metadata's content hash before registering it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import blake3
import zstandard

from harness.cache.format import CacheError
from harness.store.hashing import iter_nar

if TYPE_CHECKING:
    from harness.cache.backends import ByteStream

#: Compression level: zstd's default. Wheels and weights hardly compress; 3 keeps pushes
#: fast, and decompression speed does not depend on it.
ZSTD_LEVEL = 3
#: Directory nesting an archive may have; deeper ones are refused (no recursion blow-up).
MAX_DEPTH = 200
#: Longest token (a name, a tag) and symlink target accepted; longer ones are refused.
MAX_NAME = 255
MAX_TARGET = 4096
_CHUNK = 1 << 20

Progress = Callable[[int], None]


def _ignore(_n: int) -> None:
    pass


@dataclass(frozen=True)
class Packed:
    """A written archive: its blake3 and size, and the NAR's (the path's content hash)."""

    file_hash: str
    file_size: int
    content: str
    nar_size: int


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through to ``raw``."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.hasher = blake3.blake3()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hasher.update(data)
        self.size += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def pack(path: Path, dest: Path, *, progress: Progress = _ignore) -> Packed:
    """Write the zstd-compressed NAR of ``path`` to ``dest`` (fsynced); return its hashes.

    ``progress`` gets NAR byte counts. The caller compares ``content`` with the path's record:
    a path changed since registration must not be published under its old hash.
    """
    nar_hasher = blake3.blake3()
    nar_size = 0
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1)
    with open(dest, "wb") as raw:
        writer = _HashingWriter(raw)
        with compressor.stream_writer(writer, closefd=False) as stream:  # type: ignore[arg-type]
            for chunk in iter_nar(path):
                nar_hasher.update(chunk)
                stream.write(chunk)
                nar_size += len(chunk)
                progress(len(chunk))
        raw.flush()
        # The narinfo that names this archive is written after it: the bytes must be durable first.
        os.fsync(raw.fileno())
    return Packed(f"blake3:{writer.hasher.hexdigest()}", writer.size, f"blake3:{nar_hasher.hexdigest()}", nar_size)


# --------------------------------------------------------------------------------- unpacking


class _Source:
    """Reads the compressed archive, hashing and counting it, never past ``size`` + 1 bytes."""

    def __init__(self, raw: ByteStream, size: int, label: str, progress: Progress) -> None:
        self.raw = raw
        self.size = size
        self.label = label
        self.progress = progress
        self.hasher = blake3.blake3()
        self.got = 0

    def read(self, n: int = -1) -> bytes:
        want = _CHUNK if n is None or n < 0 else n
        # One byte beyond the announced size is enough to know the archive is too long.
        want = min(want, self.size + 1 - self.got)
        if want <= 0:
            raise CacheError(f"{self.label}: the archive is longer than its FileSize ({self.size} bytes)")
        try:
            data = self.raw.read(want)
        except OSError as exc:
            raise CacheError(f"{self.label}: reading the archive failed: {exc.strerror or exc}") from None
        self.hasher.update(data)
        self.got += len(data)
        self.progress(len(data))
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _Nar:
    """Buffered reading of the decompressed NAR, counting bytes against ``limit``."""

    def __init__(self, stream: BinaryIO, limit: int, label: str) -> None:
        self.stream = stream
        self.limit = limit
        self.label = label
        self.consumed = 0
        self._buf = b""
        self._pos = 0

    def _take(self, n: int) -> bytes:
        """Up to ``n`` bytes (at least one), refilling the buffer from the stream."""
        if self._pos >= len(self._buf):
            try:
                self._buf = self.stream.read(_CHUNK)
            except zstandard.ZstdError as exc:
                raise CacheError(f"{self.label}: the archive is not valid zstd: {exc}") from None
            self._pos = 0
            if not self._buf:
                raise CacheError(f"{self.label}: the archive ends in the middle of its NAR")
        chunk = self._buf[self._pos : self._pos + n]
        self._pos += len(chunk)
        self.consumed += len(chunk)
        if self.consumed > self.limit:
            raise CacheError(f"{self.label}: the NAR is longer than its NarSize ({self.limit} bytes)")
        return chunk

    def read_exact(self, n: int) -> bytes:
        parts = []
        while n:
            chunk = self._take(n)
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def at_end(self) -> bool:
        if self._pos < len(self._buf):
            return False
        try:
            more = self.stream.read(1)
        except zstandard.ZstdError as exc:
            raise CacheError(f"{self.label}: the archive is not valid zstd: {exc}") from None
        if more:
            self._buf, self._pos = more, 0
            return False
        return True

    def u64(self) -> int:
        return int.from_bytes(self.read_exact(8), "little")

    def padding(self, size: int, where: str) -> None:
        pad = -size % 8
        if pad and self.read_exact(pad) != b"\0" * pad:
            raise CacheError(f"{self.label}: {where}: non-zero padding")

    def string(self, limit: int, where: str) -> bytes:
        size = self.u64()
        if size > limit:
            raise CacheError(f"{self.label}: {where}: a {size}-byte string where at most {limit} fit")
        data = self.read_exact(size)
        self.padding(size, where)
        return data

    def expect(self, token: bytes, where: str) -> None:
        got = self.string(MAX_NAME, where)
        if got != token:
            raise CacheError(f"{self.label}: {where}: expected {token.decode()!r}, found {_show(got)}")


def _show(data: bytes) -> str:
    return repr(data.decode("utf-8", "backslashreplace"))


@dataclass
class Unpacked:
    """What :func:`unpack` rebuilt, by relative path (``""`` is the root): every regular
    file (with its sha256 when asked, else ``""``), executable, directory and symlink."""

    file_sha256: dict[str, str] = field(default_factory=dict)
    executables: list[str] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)
    symlinks: list[str] = field(default_factory=list)


def unpack(
    source: ByteStream,
    out: Path,
    *,
    store_name: str,
    references: frozenset[str] | set[str],
    file_size: int,
    file_hash: str | None,
    nar_size: int,
    label: str,
    hash_files: bool = False,
    progress: Progress = _ignore,
) -> Unpacked:
    """Rebuild the tree serialized in the zstd archive ``source`` at ``out`` (must not exist).

    ``store_name`` and ``references`` decide where symlinks may point (module docstring);
    ``file_hash`` (``blake3:<hex>``, None when the caller already checked the file) and
    ``file_size`` are checked against the compressed bytes, ``nar_size`` against the NAR.
    With ``hash_files`` the sha256 of every regular file is computed as it is written.
    Raises :class:`CacheError` naming ``label`` and the entry; ``out`` may then hold a
    partial tree, which the caller (the store's build folder) discards.
    """
    counted = _Source(source, file_size, label, progress)
    # zstandard reads any object with read(); its stubs ask for IO[bytes], which _Source
    # (a counting, hashing reader) is in behaviour but not in type.
    reader = zstandard.ZstdDecompressor().stream_reader(
        counted,  # type: ignore[arg-type]
        read_size=_CHUNK,
        read_across_frames=True,
        closefd=False,
    )
    nar = _Nar(reader, nar_size, label)
    result = Unpacked()
    nar.expect(b"nix-archive-1", "the archive header")
    _Unpacker(nar, store_name, frozenset(references), hash_files, result).node(out, [], 0)
    if not nar.at_end():
        raise CacheError(f"{label}: bytes after the end of the NAR")
    if nar.consumed != nar_size:
        raise CacheError(f"{label}: the NAR is {nar.consumed} bytes, its NarSize says {nar_size}")
    # Drain the compressed source: a zstd frame may end before the file does (trailing junk).
    while counted.got <= file_size and counted.read(_CHUNK):
        pass
    if counted.got != file_size:
        raise CacheError(f"{label}: the archive is {counted.got} bytes, its FileSize says {file_size}")
    if file_hash is not None and f"blake3:{counted.hasher.hexdigest()}" != file_hash:
        raise CacheError(f"{label}: the archive's blake3 is not its FileHash {file_hash}")
    return result


class _Unpacker:
    def __init__(
        self, nar: _Nar, store_name: str, references: frozenset[str], hash_files: bool, result: Unpacked
    ) -> None:
        self.nar = nar
        self.store_name = store_name
        self.references = references
        self.hash_files = hash_files
        self.result = result
        self.buffer = bytearray(_CHUNK)

    def fail(self, rel: list[str], message: str) -> CacheError:
        where = "/".join(rel) or "(the path itself)"
        return CacheError(f"{self.nar.label}: entry {where!r}: {message}")

    def node(self, target: Path, rel: list[str], depth: int) -> None:
        nar = self.nar
        where = "/".join(rel) or "(root)"
        if depth > MAX_DEPTH:
            raise self.fail(rel, f"nested deeper than {MAX_DEPTH} directories")
        nar.expect(b"(", where)
        nar.expect(b"type", where)
        kind = nar.string(MAX_NAME, where)
        if kind == b"regular":
            self.regular(target, rel)
        elif kind == b"symlink":
            nar.expect(b"target", where)
            link = nar.string(MAX_TARGET, where)
            self.check_link(link, rel)
            os.symlink(link, target)
            self.result.symlinks.append("/".join(rel))
            nar.expect(b")", where)
        elif kind == b"directory":
            self.directory(target, rel, depth)
        else:
            raise self.fail(
                rel,
                f"is of type {_show(kind)} (a device, fifo or other special file); "
                "only regular files, directories and symlinks can be stored",
            )

    def regular(self, target: Path, rel: list[str]) -> None:
        nar = self.nar
        where = "/".join(rel) or "(root)"
        tag = nar.string(MAX_NAME, where)
        executable = tag == b"executable"
        if executable:
            nar.expect(b"", where)
            tag = nar.string(MAX_NAME, where)
        if tag != b"contents":
            raise self.fail(rel, f"expected 'contents', found {_show(tag)}")
        size = nar.u64()
        if size > nar.limit - nar.consumed:
            raise self.fail(rel, f"declares {size} bytes, more than the NarSize leaves")
        digest = hashlib.sha256() if self.hash_files else None
        # O_EXCL|O_NOFOLLOW: never write through anything that already exists at that name.
        fd = os.open(
            target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o755 if executable else 0o644
        )
        try:
            left = size
            while left:
                chunk = nar._take(min(left, _CHUNK))
                view = memoryview(chunk)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                if digest is not None:
                    digest.update(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
        nar.padding(size, where)
        nar.expect(b")", where)
        name = "/".join(rel)
        self.result.file_sha256[name] = digest.hexdigest() if digest is not None else ""
        if executable:
            self.result.executables.append(name)

    def directory(self, target: Path, rel: list[str], depth: int) -> None:
        nar = self.nar
        where = "/".join(rel) or "(root)"
        os.mkdir(target, 0o755)
        self.result.directories.append("/".join(rel))
        previous: bytes | None = None
        while True:
            tag = nar.string(MAX_NAME, where)
            if tag == b")":
                return
            if tag != b"entry":
                raise self.fail(rel, f"expected 'entry' or ')', found {_show(tag)}")
            nar.expect(b"(", where)
            nar.expect(b"name", where)
            name = nar.string(MAX_NAME, where)
            shown = [*rel, name.decode("utf-8", "backslashreplace")]
            if not name or name in (b".", b"..") or b"/" in name or b"\0" in name:
                raise self.fail(
                    shown,
                    "is not a plain file name (empty, '.', '..', or holds '/' or NUL): an absolute or climbing path",
                )
            if previous is not None and name <= previous:
                what = "appears twice" if name == previous else f"comes after {_show(previous)}: entries must be sorted"
                raise self.fail(shown, what)
            previous = name
            nar.expect(b"node", "/".join(shown))
            self.node(target / os.fsdecode(name), shown, depth + 1)
            nar.expect(b")", "/".join(shown))

    def check_link(self, link: bytes, rel: list[str]) -> None:
        """A link may point inside its path, or into one of its references, and nowhere else."""
        text = link.decode("utf-8", "backslashreplace")
        if not link or b"\0" in link:
            raise self.fail(rel, "symlink with an empty or NUL-holding target")
        if link.startswith(b"/"):
            raise self.fail(rel, f"symlink target {text!r} is absolute: it would point out of the store")
        parts = [p for p in link.split(b"/") if p not in (b"", b".")]
        ups = 0
        while ups < len(parts) and parts[ups] == b"..":
            ups += 1
        if b".." in parts[ups:]:
            raise self.fail(rel, f"symlink target {text!r} climbs after descending ('..' in the middle)")
        # The link's folder, as components from the store folder: <path>/<its parent dirs>.
        folder = [self.store_name, *rel[:-1]] if rel else []
        if ups > len(folder):
            raise self.fail(rel, f"symlink target {text!r} points out of the store")
        resolved = folder[: len(folder) - ups] + [os.fsdecode(p) for p in parts[ups:]]
        if not resolved:
            raise self.fail(rel, f"symlink target {text!r} points at the store folder itself")
        if resolved[0] != self.store_name and resolved[0] not in self.references:
            raise self.fail(
                rel,
                f"symlink target {text!r} points out of its path, to {resolved[0]!r}, "
                "which is not one of its references",
            )


__all__ = ["MAX_DEPTH", "ZSTD_LEVEL", "Packed", "Unpacked", "pack", "unpack"]
