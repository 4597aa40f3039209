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
from pathlib import Path

_LIMIT = 1 << 20


def cached_answer(path: Path) -> list[str] | None:
    """The requirements remembered in ``path``, or None (absent, not this user's, broken)."""
    from harness.store.entries import read_own

    raw = read_own(path, limit=_LIMIT)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return [str(r) for r in data] if isinstance(data, list) and all(isinstance(r, str) for r in data) else None


def remember_answer(path: Path, requirements: list[str]) -> None:
    """Remember ``requirements`` in ``path`` (atomically, under a name of its own; never raises)."""
    from harness.store.entries import BadEntry, write_entry

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_entry(path, json.dumps(requirements).encode("utf-8"))
    except (OSError, BadEntry):
        pass
