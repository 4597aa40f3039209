"""A directory cache in one tar file: ``harness store export`` / ``harness store import``.

The tar holds exactly a directory cache's files (``harness-cache-info``, ``*.narinfo``,
``nar/*.nar.zst``), uncompressed (the archives are zstd already), so ``tar -xf`` of it is a
directory cache too. Export writes it through :class:`TarWriter` (a write-only backend that
push fills in order: an archive before its narinfo, references' narinfos before a path's);
import reads it in place through :class:`TarReader`, which never extracts anything: the
files it serves go through the same checks as a pull from any cache.

The reader refuses a tar holding anything but regular files and directories with plain
relative names (absolute names, ``..``, links, devices, sparse files) before using it.
"""

from __future__ import annotations

import os
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

from harness.cache.backends import KEY, ByteStream, Progress, check_key
from harness.cache.format import CacheError

#: Every member of an exported tar gets this mtime: the tar's bytes depend on content only.
_MTIME = 1


def _ignore(_n: int) -> None:
    pass


class TarReader:
    """A read-only cache backend over a tar file, reading members in place, thread-safe."""

    writable = False
    local = True

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"tar {path}"
        self.members: dict[str, tarfile.TarInfo] = {}
        try:
            with tarfile.open(path, "r:") as archive:
                for member in archive:
                    self._check(member)
                    if member.isfile():
                        self.members[member.name.removeprefix("./")] = member
        except (tarfile.TarError, OSError) as exc:
            raise CacheError(f"{path}: not a readable, uncompressed tar: {exc}") from None

    def _check(self, member: tarfile.TarInfo) -> None:
        name = member.name.removeprefix("./")
        if member.isdir() and name in ("", ".", "nar", "nar/"):
            return
        if name.startswith("/") or ".." in name.split("/"):
            raise CacheError(
                f"{self.path}: member {member.name!r} has an absolute or climbing name; refusing the whole file"
            )
        if not member.isfile() or member.issparse():
            what = (
                "a symlink"
                if member.issym()
                else "a hard link"
                if member.islnk()
                else "a device file"
                if member.ischr() or member.isblk()
                else "a fifo"
                if member.isfifo()
                else "not a regular file"
            )
            raise CacheError(
                f"{self.path}: member {member.name!r} is {what}; an exported cache holds only regular files"
            )
        if not KEY.match(name):
            raise CacheError(f"{self.path}: member {member.name!r} is not a cache file name")

    def _member(self, key: str) -> tarfile.TarInfo | None:
        return self.members.get(check_key(key))

    def read_bytes(self, key: str) -> bytes | None:
        member = self._member(key)
        if member is None:
            return None
        stream, _ = self.open(key)
        with stream:
            return stream.read(member.size)

    def open(self, key: str, start: int = 0) -> tuple[ByteStream, int]:
        member = self._member(key)
        if member is None:
            raise CacheError(f"{self.url} has no {key}")
        # A handle of its own per reader: tarfile's shared file object is not thread-safe.
        return _Slice(self.path, member.offset_data + start, member.size - start), start

    def exists(self, key: str) -> bool:
        return self._member(key) is not None

    def list(self, prefix: str = "") -> Iterator[str]:
        yield from sorted(k for k in self.members if "/" not in k and k.startswith(prefix))

    def put_bytes(self, key: str, data: bytes) -> None:
        raise CacheError(f"{self.url} is read-only")

    def put_file(self, key: str, path: Path, progress: Progress = _ignore) -> None:
        raise CacheError(f"{self.url} is read-only")

    def local_path(self, key: str) -> Path | None:
        return None

    def staging_dir(self) -> Path | None:
        return None


class _Slice:
    """``size`` bytes of a file from ``offset``, as a read-only stream."""

    def __init__(self, path: Path, offset: int, size: int) -> None:
        self.handle = open(path, "rb")
        self.handle.seek(offset)
        self.left = size

    def read(self, n: int = -1) -> bytes:
        want = self.left if n is None or n < 0 else min(n, self.left)
        data = self.handle.read(want)
        if len(data) < want and want:
            raise CacheError(f"{self.handle.name}: the tar ends in the middle of a member")
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> _Slice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TarWriter:
    """A write-only cache backend that appends to a fresh tar; close it when push is done.

    Writes are serialized (push compresses archives in parallel, then appends each whole).
    The tar is written to ``<path>.part`` and renamed on :meth:`close`, so an interrupted
    export never leaves a file that looks complete.
    """

    writable = True
    local = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"tar {path}"
        self.part = path.with_name(path.name + ".part")
        self._tar = tarfile.open(self.part, "w:", format=tarfile.PAX_FORMAT)
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def _info(self, key: str, size: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(check_key(key))
        info.size, info.mtime, info.mode = size, _MTIME, 0o644
        return info

    def read_bytes(self, key: str) -> bytes | None:
        return None  # a fresh tar holds nothing yet; push writes its cache-info first

    def open(self, key: str, start: int = 0) -> tuple[ByteStream, int]:
        raise CacheError(f"{self.url} is write-only")

    def exists(self, key: str) -> bool:
        with self._lock:
            return key in self._keys

    def list(self, prefix: str = "") -> Iterator[str]:
        with self._lock:
            yield from sorted(k for k in self._keys if k.startswith(prefix))

    def put_bytes(self, key: str, data: bytes) -> None:
        import io

        with self._lock:
            if key not in self._keys:
                self._tar.addfile(self._info(key, len(data)), io.BytesIO(data))
                self._keys.add(key)

    def put_file(self, key: str, path: Path, progress: Progress = _ignore) -> None:
        size = path.stat().st_size
        with self._lock:
            if key not in self._keys:
                with open(path, "rb") as handle:
                    self._tar.addfile(self._info(key, size), handle)
                self._keys.add(key)
        progress(size)

    def local_path(self, key: str) -> Path | None:
        return None

    def staging_dir(self) -> Path | None:
        return None

    def close(self, *, keep: bool) -> None:
        """Finish the tar and give it its name (``keep``), or delete it."""
        self._tar.close()
        if keep:
            with open(self.part, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(self.part, self.path)
        else:
            self.part.unlink(missing_ok=True)


__all__ = ["TarReader", "TarWriter"]
