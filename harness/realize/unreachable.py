"""Remembering, per home, that uv could not download a lock's interpreter.

When a lock's uv-managed interpreter is not in the store, realize asks uv to install it; on a
machine without network (or with an unreachable mirror or download list) uv retries for
5–11 s before it gives up and a host copy stands in (``harness/realize/standin.py``). Every
later ``realize``, ``up`` and ``run`` that took the full path paid that wait again, with the
stand-in already realized. So a failed download that uv really attempted (not ``--offline``,
which only reads uv's archive cache, and not ``UV_PYTHON_DOWNLOADS=never``, which tries
nothing) is noted in ``$HARNESS_HOME/cache/python-unreachable/<key>-<uid>.json``:
``{"version": 1, "key", "reason", "at"}``. For ``[python] download-retry-minutes`` after
``at`` (60 by default; ``0`` remembers nothing) realize uses the host copy without asking uv;
``harness realize --refresh`` asks at once, and a success forgets the note.

The key is a digest of the interpreter's store name and of everything that says where uv
downloads from: the settings' download list and mirror, uv's own variables for them, the
proxy variables, and the size and mtime of a download list on this machine. Changing any of
them asks again. Addresses are hashed, never written.

The note is advice, never trusted input: it is read without following a symlink, only when it
is a small regular file owned by this user that names its own key and a time not in the
future; anything else (a planted link, garbage, another member's file in a shared home) is
"unknown", and realize asks uv as it would without the note. It is written atomically, mode
0600; a note that cannot be written costs only time.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: The folder of notes, under the home's cache folder.
FOLDER = "python-unreachable"
#: Bump when what a note says changes.
_VERSION = 1
#: The variables besides the settings' that change where (or whether) uv's download goes.
_VARIABLES = (
    "UV_PYTHON_INSTALL_MIRROR",
    "UV_PYTHON_DOWNLOADS_JSON_URL",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "UV_NATIVE_TLS",
)
#: A note is a few hundred bytes; anything much larger is not one.
_MAX_BYTES = 16384


@dataclass(frozen=True)
class Unreachable:
    """A remembered failed download: uv's one line of why, and when (seconds since the epoch)."""

    reason: str
    at: float

    def note(self) -> str:
        """The reason as reports say it: uv's, and that it was not asked again."""
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.at))
        return f"{self.reason} (as of {when}: not asked again; `harness realize --refresh` asks now)"


def download_key(python_store: str, download_env: Mapping[str, str]) -> str:
    """The key of a download attempt of interpreter ``python_store`` with ``download_env``
    (the settings' variables for uv, :meth:`harness.config.Settings.python_download_env`)."""
    digest = hashlib.sha256(f"harness-python-unreachable-v{_VERSION}\0{python_store}\0".encode())
    for key in sorted(download_env):
        digest.update(f"settings {key}={download_env[key]}\0".encode())
    for key in _VARIABLES:
        digest.update(f"env {key}={os.environ.get(key, '')}\0".encode())
    listing = download_env.get("UV_PYTHON_DOWNLOADS_JSON_URL", "")
    if listing.startswith("file://") or listing.startswith("/"):
        try:
            st = os.stat(listing.removeprefix("file://"))
            digest.update(f"list {st.st_size} {st.st_mtime_ns} {st.st_ino}\0".encode())
        except OSError:
            digest.update(b"list missing\0")
    return digest.hexdigest()[:32]


def _note_path(cache_dir: Path, key: str) -> Path:
    # Per user: in a shared home's sticky folder a member cannot replace another's file, and
    # another member's note is not this user's to trust.
    return cache_dir / FOLDER / f"{key}-{os.getuid()}.json"


def remembered(cache_dir: Path, key: str, *, minutes: float, now: float | None = None) -> Unreachable | None:
    """The failed download noted under ``key`` less than ``minutes`` ago, or None (none, too
    old, or not a note this user wrote: module doc)."""
    if minutes <= 0:
        return None
    data = _read(_note_path(cache_dir, key))
    if data is None or data.get("version") != _VERSION or data.get("key") != key:
        return None
    reason, at = data.get("reason"), data.get("at")
    if not isinstance(reason, str) or not reason or len(reason) > 2000:
        return None
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return None
    now = time.time() if now is None else now
    if at > now + 60 or now - at >= minutes * 60:
        return None
    return Unreachable(reason, float(at))


def remember_unreachable(cache_dir: Path, key: str, reason: str) -> None:
    """Note that uv could not download under ``key`` now, and why (never raises)."""
    from harness.store.entries import BadEntry, write_entry

    path = _note_path(cache_dir, key)
    data = json.dumps({"version": _VERSION, "key": key, "reason": reason, "at": time.time()}, sort_keys=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_entry(path, data.encode("utf-8") + b"\n", mode=0o600)
    except (OSError, BadEntry):
        pass


def forget_unreachable(cache_dir: Path, key: str) -> None:
    """Drop the note under ``key`` (uv downloaded the interpreter after all; never raises)."""
    try:
        _note_path(cache_dir, key).unlink(missing_ok=True)
    except OSError:
        pass


def _read(path: Path) -> dict[str, object] | None:
    """A note's JSON object, or None when ``path`` is not a small regular file of this user's
    (:func:`harness.store.entries.read_own`: no link followed, no fifo waited on)."""
    from harness.store.entries import read_own

    raw = read_own(path, limit=_MAX_BYTES)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
