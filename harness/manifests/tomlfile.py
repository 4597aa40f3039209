"""Reading TOML files with errors that name the file, line and column. Standard library only.

Kept apart from :mod:`harness.manifests.loading` (which validates models with pydantic) so the
paths that read TOML before, or without, any model — settings, the start of ``harness lock``
(:mod:`harness.lock.stamp`, :mod:`harness.lock.early`) — do not load pydantic.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from harness.errors import InputError

_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


def display_path(path: Path) -> str:
    """A path as a user wants to read it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def read_toml(path: Path) -> dict[str, Any]:
    """Parse ``path`` as TOML; malformed input raises InputError with file, line and column."""
    shown = display_path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{shown}: no such file") from None
    except OSError as exc:
        raise InputError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{shown}: not UTF-8 text (byte {exc.start})") from None
    return parse_toml(text, shown)


def parse_toml(text: str, shown: str) -> dict[str, Any]:
    """Parse TOML ``text`` that came from ``shown``; errors carry line and column."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _TOML_POSITION.search(message)
        if match:
            reason = message[: match.start()].strip()
            raise InputError(f"{shown}:{match.group(1)}:{match.group(2)}: invalid TOML: {reason}") from None
        raise InputError(f"{shown}: invalid TOML: {message}") from None
    except RecursionError:
        raise InputError(f"{shown}: invalid TOML: nested too deeply") from None
