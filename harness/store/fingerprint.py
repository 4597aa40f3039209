"""A store path's stat fingerprint: every entry's inode, size, mode, mtime and ctime.

What :mod:`harness.store.launchcheck` compares with the one each registered path keeps
(``.stat/``, :mod:`harness.store.statfile`). Equal fingerprints mean equal bytes unless an entry changed within :data:`RACY_NS`
of the first one being taken: a store file is read-only with mtime 1, so changing its bytes
means a ``chmod`` or a write, both of which set its ctime to now (no user can set a ctime
back), and adding, removing or renaming an entry changes its folder's times. Only a second
change in the same tick of the file system's clock could leave every figure as it was
(git's "racily clean" entries).
"""

from __future__ import annotations

import os
import stat
import time

#: Entries changed this recently are not trusted to a fingerprint.
RACY_NS = 2_000_000_000

Entry = tuple[int, int, int, int, int]  # inode, size, mode, mtime_ns, ctime_ns


def _entry(st: os.stat_result) -> Entry:
    return (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)


def take_fingerprint(path: str | os.PathLike[str]) -> tuple[int, dict[str, Entry]]:
    """``(device, {relative entry: (inode, size, mode, mtime_ns, ctime_ns)})`` of ``path``;
    the root is the entry ``""``. Symlinks are not followed."""
    root = os.fspath(path)
    st = os.lstat(root)
    entries: dict[str, Entry] = {"": _entry(st)}
    if stat.S_ISDIR(st.st_mode):
        stack = [""]
        while stack:
            rel = stack.pop()
            with os.scandir(os.path.join(root, rel) if rel else root) as listing:
                for item in listing:
                    child = f"{rel}/{item.name}" if rel else item.name
                    child_st = item.stat(follow_symlinks=False)
                    entries[child] = _entry(child_st)
                    if stat.S_ISDIR(child_st.st_mode):
                        stack.append(child)
    return st.st_dev, entries


def take_top(path: str | os.PathLike[str]) -> Entry:
    """The root entry of ``take_fingerprint(path)`` alone (after a move or a ``chmod`` of the
    root, which change nothing below it)."""
    return _entry(os.lstat(path))


def racy(entries: dict[str, Entry], now_ns: int | None = None) -> bool:
    """Whether an entry changed within :data:`RACY_NS` before ``now_ns`` (default: now)."""
    newest = max((max(e[3], e[4]) for e in entries.values()), default=0)
    return (time.time_ns() if now_ns is None else now_ns) - newest < RACY_NS
