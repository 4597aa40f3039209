"""The host a session ran on, for its record: OS release, kernel, glibc, and the host's
executables that the sandbox exposes.

A session binds the host's ``/usr`` read-only, so a task's ``test.sh`` may run any of its
tools (``bash``, ``grep``, ``git``…). Knowing which ones ran would need tracing every
``exec``; hashing the whole set the sandbox exposes on ``PATH`` (``/usr/local/bin``,
``/usr/bin``, ``/usr/sbin``: about 1,300 files and 400 MB here) is cheaper once cached:
:func:`executables` hashes each file once per (device, inode, size, mtime) and keeps the
hashes in a cache file of the harness home, so later sessions only ``stat`` them. The record
names the set by one digest and the trial keeps the full list beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
import threading
from pathlib import Path
from typing import Any

#: The folders of the sandbox's PATH that come from the host (``/bin`` and ``/sbin`` are
#: links into /usr on merged-usr systems, else bound read-only too).
BIN_DIRS = ("/usr/local/bin", "/usr/local/sbin", "/usr/bin", "/usr/sbin", "/bin", "/sbin")
CACHE_NAME = "harbor-host-executables.json"
_LOCK = threading.Lock()
_MEMO: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def os_release(path: Path = Path("/etc/os-release")) -> dict[str, str]:
    """``ID``, ``VERSION_ID`` and ``PRETTY_NAME`` of ``/etc/os-release`` (those present)."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("ID", "VERSION_ID", "PRETTY_NAME", "VERSION_CODENAME"):
            out[key.lower()] = value.strip().strip('"')
    return out


def summary() -> dict[str, Any]:
    """OS release, kernel, architecture and C library of this host."""
    uname = platform.uname()
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        libc = ""
    if not libc:
        name, version = platform.libc_ver()
        libc = f"{name} {version}".strip()
    return {
        "os": os_release(),
        "kernel": uname.release,
        "kernel_version": uname.version,
        "machine": uname.machine,
        "libc": libc or None,
        "hostname": uname.node,
    }


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def executables(cache_dir: Path | None = None, dirs: tuple[str, ...] = BIN_DIRS) -> dict[str, str]:
    """``{path: sha256}`` of every executable file in ``dirs`` (links resolved to the file
    they name; a path reached twice through a linked folder is listed once, by its real
    folder). Cached in memory and in ``cache_dir/harbor-host-executables.json``."""
    with _LOCK:
        if not _MEMO and cache_dir is not None:
            _load(cache_dir / CACHE_NAME)
        before = len(_MEMO)
        out: dict[str, str] = {}
        seen: set[str] = set()
        changed = False
        for folder in dirs:
            real = os.path.realpath(folder)
            if real in seen or not os.path.isdir(real):
                continue
            seen.add(real)
            try:
                entries = sorted(os.scandir(real), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:  # scandir: one stat per file, a realpath only for links
                path = entry.path
                try:
                    st = entry.stat()
                except OSError:
                    continue  # a dangling link
                if not (st.st_mode & 0o111) or not stat.S_ISREG(st.st_mode):
                    continue
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                target = os.path.realpath(path) if entry.is_symlink() else path
                memo = _MEMO.get(target)
                if memo is None or memo[0] != key:
                    try:
                        memo = (key, _sha256(target))
                    except OSError:
                        continue  # unreadable to this user: left out
                    _MEMO[target] = memo
                    changed = True
                out[path] = memo[1]
        if cache_dir is not None and (changed or len(_MEMO) != before):
            _save(cache_dir / CACHE_NAME)
        return out


def digest(files: dict[str, str]) -> str:
    """``sha256:`` over the sorted ``path<TAB>sha256`` lines of ``files``."""
    text = "".join(f"{p}\t{h}\n" for p, h in sorted(files.items()))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _load(path: Path) -> None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        for target, (key, sha) in data.items():
            dev, ino, size, mtime = (int(k) for k in key)
            _MEMO[target] = ((dev, ino, size, mtime), str(sha))
    except (OSError, ValueError, TypeError):
        pass  # a missing or damaged cache is rebuilt


def _save(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps({t: [list(k), s] for t, (k, s) in _MEMO.items()}), encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        pass  # the cache is an optimisation; the record is complete without it
