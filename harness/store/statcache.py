"""A small stat cache: a file's sha256, remembered while its stat says it is unchanged.

Checking ``path`` weights (``harness lock --check``, ``harness realize``) re-hashes files in
the project; a checkpoint there may be gigabytes. :class:`HashCache` keeps, per real path,
``(device, inode, size, mtime_ns, ctime_ns) → sha256`` in one JSON file (under
``$HARNESS_HOME/cache``) and re-hashes a file only when one of those changed, as git's index
does. ``ctime`` changes on every write and on ``touch -d``, so resetting an mtime does not fool
it.

A file written within :data:`RACY_NS` of being hashed is not remembered: the kernel's clock
ticks coarsely, so a second write in the same tick with the same size would leave the stat
unchanged (git's "racily clean" entries). Such files are simply hashed again next time.

The cache is an optimization only: an unreadable or corrupt cache file is ignored, and two
processes saving at once lose at most each other's new entries.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

#: Files changed this recently (by mtime or ctime) are hashed but not remembered.
RACY_NS = 2_000_000_000


class HashCache:
    """``sha256(path)`` through the cache file ``file``; call :meth:`save` to keep new entries."""

    def __init__(self, file: Path | None) -> None:
        self.file = file
        self._entries: dict[str, list[int | str]] = {}
        self._dirty = False
        if file is not None:
            from harness.store.entries import BadEntry, read_entry

            try:
                raw, st = read_entry(file, limit=1 << 28)
                data = json.loads(raw.decode("utf-8"))
                if (
                    st.st_uid == os.geteuid()  # a cache of this user's, never another member's
                    and isinstance(data, dict)
                    and data.get("version") == 1
                    and isinstance(data.get("files"), dict)
                ):
                    self._entries = data["files"]
            except (OSError, BadEntry, UnicodeDecodeError, ValueError, RecursionError):
                pass

    def sha256(self, path: str | os.PathLike[str]) -> str:
        """The sha256 of ``path``'s bytes (following links), hashed only if its stat changed."""
        from harness.store.hashing import file_sha256

        real = os.path.realpath(path)
        before = os.stat(real)
        key = _key(before)
        entry = self._entries.get(real)
        if entry is not None and entry[:-1] == key:
            return str(entry[-1])
        digest = file_sha256(real)
        after = os.stat(real)
        now = time.time_ns()
        if _key(after) == key and now - max(after.st_mtime_ns, after.st_ctime_ns) > RACY_NS:
            self._entries[real] = [*key, digest]
            self._dirty = True
        return digest

    def save(self) -> None:
        if self.file is None or not self._dirty:
            return
        temp = None
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=f".{self.file.name}.", dir=self.file.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"version": 1, "files": self._entries}, handle, sort_keys=True)
            os.replace(temp, self.file)
        except OSError:
            if temp is not None:
                Path(temp).unlink(missing_ok=True)  # a cache that cannot be written costs only time
        self._dirty = False


def _key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
