"""The note that uv could not download a lock's interpreter (harness/realize/unreachable.py):
trusted for ``download-retry-minutes``, keyed by where downloads come from, and never trusted
when it is not this user's own small regular file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from harness.realize.unreachable import (
    FOLDER,
    download_key,
    forget_unreachable,
    remember_unreachable,
    remembered,
)

STORE = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-python-3.11.9"


def _note(cache: Path, key: str) -> Path:
    [path] = (cache / FOLDER).glob(f"{key}-*.json")
    return path


def test_a_failure_is_remembered_for_the_retry_window_then_forgotten(tmp_path: Path) -> None:
    key = download_key(STORE, {})
    assert remembered(tmp_path, key, minutes=60) is None
    remember_unreachable(tmp_path, key, "uv could not install it: connection refused")
    known = remembered(tmp_path, key, minutes=60)
    assert known is not None and known.reason == "uv could not install it: connection refused"
    assert "--refresh" in known.note() and "not asked again" in known.note()
    assert _note(tmp_path, key).stat().st_mode & 0o777 == 0o600
    # Outside the window, or with the window set to 0, it is not trusted.
    assert remembered(tmp_path, key, minutes=60, now=time.time() + 3601) is None
    assert remembered(tmp_path, key, minutes=0) is None
    # A time in the future (a clock set back, a hand-written note) is not trusted either.
    assert remembered(tmp_path, key, minutes=60, now=known.at - 3600) is None
    forget_unreachable(tmp_path, key)
    assert remembered(tmp_path, key, minutes=60) is None
    forget_unreachable(tmp_path, key)  # nothing there: no error


def test_the_key_follows_where_downloads_come_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = download_key(STORE, {})
    assert plain == download_key(STORE, {})
    assert download_key(STORE.replace("3.11.9", "3.11.8"), {}) != plain
    mirror = download_key(STORE, {"UV_PYTHON_INSTALL_MIRROR": "http://127.0.0.1:1/mirror"})
    assert mirror != plain
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    assert download_key(STORE, {}) != plain
    monkeypatch.delenv("HTTPS_PROXY")
    # A download list on this machine: editing it asks again.
    listing = tmp_path / "downloads.json"
    listing.write_text("{}\n")
    before = download_key(STORE, {"UV_PYTHON_DOWNLOADS_JSON_URL": str(listing)})
    listing.write_text('{"cpython-3.11.9-linux-x86_64-gnu": {}}\n')
    assert download_key(STORE, {"UV_PYTHON_DOWNLOADS_JSON_URL": str(listing)}) != before
    # Addresses are hashed, never written.
    remember_unreachable(tmp_path, mirror, "uv could not install it")
    assert "127.0.0.1" not in _note(tmp_path, mirror).read_text()


@pytest.mark.parametrize(
    "planted",
    ["symlink", "garbage", "huge", "other key", "not an object", "bad time", "directory", "fifo"],
)
def test_a_planted_or_broken_note_is_not_trusted(tmp_path: Path, planted: str) -> None:
    key = download_key(STORE, {})
    remember_unreachable(tmp_path, key, "uv could not install it")
    path = _note(tmp_path, key)
    good = json.loads(path.read_text())
    path.unlink()
    if planted == "symlink":
        target = tmp_path / "elsewhere.json"
        target.write_text(json.dumps(good))
        path.symlink_to(target)
    elif planted == "garbage":
        path.write_bytes(b"\xff\x00{not json")
    elif planted == "huge":
        path.write_text(json.dumps({**good, "pad": "x" * 100_000}))
    elif planted == "other key":
        path.write_text(json.dumps({**good, "key": "0" * 32}))
    elif planted == "not an object":
        path.write_text("[1, 2]")
    elif planted == "bad time":
        path.write_text(json.dumps({**good, "at": "yesterday"}))
    elif planted == "directory":
        path.mkdir()
    elif planted == "fifo":
        os.mkfifo(path)
    started = time.monotonic()
    assert remembered(tmp_path, key, minutes=60) is None
    assert time.monotonic() - started < 1  # a fifo does not block the read
    if planted not in ("directory",):
        # Writing a new note replaces what was planted (never writes through it).
        remember_unreachable(tmp_path, key, "again")
        known = remembered(tmp_path, key, minutes=60)
        assert known is not None and known.reason == "again"
        if planted == "symlink":
            assert json.loads((tmp_path / "elsewhere.json").read_text()) == good


def test_a_note_that_cannot_be_written_costs_nothing_but_time(tmp_path: Path) -> None:
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the folder would be")
    key = download_key(STORE, {})
    remember_unreachable(blocked, key, "uv could not install it")  # never raises
    assert remembered(blocked, key, minutes=60) is None
