"""The address each streamed wheel came from, remembered beside the uv cache that holds it.

With ``[gc] keep-wheel-files = false`` a realize stores no wheel from an index: the
environment's sync downloads it by address and sha256 (``builder.py:_streamed``), and uv's
cache keeps it unpacked, under that address and no other (the same wheel at another address
is "not found in the cache"). Offline, the index page that gave the address cannot be read
again, so the address is written down here when the sync is handed it, and an offline
realize of an environment that shares the wheel hands uv the same address with
``--offline``: uv installs it from its cache, still checked against the lock's sha256.

The notes are a JSON object ``{"version": 1, "urls": {sha256: address}}`` in
``harness-wheel-urls.json`` at the top of uv's cache folder for the home (in a shared home,
the member's own: ``store/shared.py:uv_cache``), so they go with the cache they describe
(``uv cache clean`` removes both). They are advice: a file that is not this user's, a link,
garbage or one too large reads as no notes; two realizes writing at once may lose one's
additions (an offline realize then names the wheel it lacks). At most :data:`LIMIT` addresses
are kept, the newest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

NAME = "harness-wheel-urls.json"
#: Addresses kept (a few hundred bytes each): far more wheels than a home's environments hold.
LIMIT = 20_000
_BYTES_LIMIT = 16 << 20


def remembered(uv_cache: Path) -> dict[str, str]:
    """sha256 → address of every wheel noted for the uv cache folder ``uv_cache``."""
    from harness.store.entries import read_own

    data = read_own(uv_cache / NAME, limit=_BYTES_LIMIT)
    if data is None:
        return {}
    try:
        notes = json.loads(data)
    except ValueError:
        return {}
    urls = notes.get("urls") if isinstance(notes, dict) and notes.get("version") == 1 else None
    if not isinstance(urls, dict):
        return {}
    return {sha: url for sha, url in urls.items() if isinstance(sha, str) and isinstance(url, str)}


def remember(uv_cache: Path, urls: Mapping[str, str]) -> None:
    """Add ``urls`` (sha256 → address) to the notes of ``uv_cache``; the newest
    :data:`LIMIT` are kept. A folder that cannot take them is left as it is (advice only)."""
    from harness.errors import HarnessError
    from harness.store.entries import write_entry

    held = remembered(uv_cache)
    if all(held.get(sha) == url for sha, url in urls.items()):
        return
    for sha in urls:
        held.pop(sha, None)  # re-added last: the newest are kept
    held.update(urls)
    kept = dict(list(held.items())[-LIMIT:])
    data = json.dumps({"version": 1, "urls": kept}, sort_keys=False).encode()
    try:
        uv_cache.mkdir(parents=True, exist_ok=True)
        write_entry(uv_cache / NAME, data, mode=0o600)
    except (OSError, HarnessError):
        return


__all__ = ["LIMIT", "NAME", "remember", "remembered"]
