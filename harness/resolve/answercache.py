"""A per-user cache of build backends' answers (``cache_dir/build-requires/<key>.json``).

Asking a PEP 517 backend what it needs to build takes a throw-away environment and seconds,
so lock remembers each answer by a digest of what was asked. The answer goes into the lock
(and what it names is built and run at realize), so only a file this user wrote counts: in a
home a group shares another member could otherwise plant build requirements of their choice.
A file is read without following a link and written under a name of its own, then renamed:
threads of one lock (platforms resolved side by side) may write the same answer at once.
Anything wrong with the cache only costs asking the backend again.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

_LIMIT = 1 << 20


def cached_answer(path: Path) -> list[str] | None:
    """The requirements remembered in ``path``, or None (absent, not this user's, broken)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > _LIMIT:
            return None
        raw = os.read(fd, _LIMIT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return [str(r) for r in data] if isinstance(data, list) and all(isinstance(r, str) for r in data) else None


def remember_answer(path: Path, requirements: list[str]) -> None:
    """Remember ``requirements`` in ``path`` (atomically; never raises)."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, json.dumps(requirements).encode("utf-8"))
        finally:
            os.close(fd)
        os.replace(temp, path)
    except OSError:
        try:
            temp.unlink(missing_ok=True)
        except OSError:
            pass
