"""Reading TOML files with errors that name the file, line and column. Standard library only.

Kept apart from :mod:`harness.manifests.loading` (which validates models with pydantic) so the
paths that read TOML before, or without, any model — settings, the start of ``harness lock``
(:mod:`harness.lock.stamp`, :mod:`harness.lock.early`) — do not load pydantic.

Every document harness reads (manifests, locks, deploys, agent configurations, settings) is
**bounded** (DESIGN invariant 9): before anything validates it, a document over one of
these limits is refused with one line naming the file and the key, at once:

* :data:`MAX_FILE_BYTES` — a file of at most 32 MiB (a lock of ten thousand packages with
  a dozen wheels each is a few MiB);
* :data:`MAX_DEPTH` — tables and arrays nested at most 32 deep (a lock nests 4 deep);
* :data:`MAX_ITEMS` — at most 50,000 entries in one array or table (a lock's packages or
  a weight set's files are counted in thousands);
* :data:`INT_RANGE` — integers within TOML's own range, signed 64 bits.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from pathlib import Path
from typing import Any

from harness.errors import InputError

#: Largest file read as a document (bytes).
MAX_FILE_BYTES = 32 << 20
#: Deepest nesting of tables and arrays (the top-level table is depth 0).
MAX_DEPTH = 32
#: Most entries in one array or table.
MAX_ITEMS = 50_000
#: The integers a document may hold (TOML's: signed 64 bits).
INT_RANGE = (-(1 << 63), (1 << 63) - 1)

_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


def display_path(path: Path) -> str:
    """A path as a user wants to read it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def read_toml(path: Path) -> dict[str, Any]:
    """Parse ``path`` as TOML; malformed input raises InputError with file, line and column,
    and so does a document beyond the limits of this module."""
    shown = display_path(path)
    try:
        raw = read_bounded(path, shown)
    except FileNotFoundError:
        raise InputError(f"{shown}: no such file") from None
    except OSError as exc:
        raise InputError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{shown}: not UTF-8 text (byte {exc.start})") from None
    return parse_toml(text, shown)


def read_bounded(path: Path, shown: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path``, refused (InputError) when over ``limit``: a regular file by its
    size, before reading; anything else (a pipe, a device) after ``limit`` bytes. A fifo
    nobody writes to reads as empty rather than blocking (opened without waiting for a
    writer: what another member of a shared home may leave in their project's ``locks/``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    os.set_blocking(fd, True)
    with open(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise InputError(_too_big(shown, info.st_size, limit))
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise InputError(_too_big(shown, None, limit))
    return raw


def _too_big(shown: str, size: int | None, limit: int) -> str:
    what = f"{size:,} bytes" if size is not None else "more bytes"
    return f"{shown}: {what}, over the {limit >> 20} MiB harness reads in one document"


def parse_toml(text: str, shown: str) -> dict[str, Any]:
    """Parse TOML ``text`` that came from ``shown``; errors carry line and column, and a
    document beyond the limits of this module is refused naming its key."""
    try:
        return loads_bounded(text, shown)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _TOML_POSITION.search(message)
        if match:
            reason = message[: match.start()].strip()
            raise InputError(f"{shown}:{match.group(1)}:{match.group(2)}: invalid TOML: {reason}") from None
        raise InputError(f"{shown}: invalid TOML: {message}") from None


def loads_bounded(text: str, shown: str) -> dict[str, Any]:
    """``tomllib.loads`` within the limits of this module: malformed TOML raises
    ``tomllib.TOMLDecodeError`` as there; a document beyond a limit raises InputError
    naming ``shown``, the line where the parser could not go on, and the key."""
    if len(text) > MAX_FILE_BYTES:
        raise InputError(_too_big(shown, len(text.encode("utf-8", "replace")), MAX_FILE_BYTES))
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise
    except ValueError:  # int() refused an integer of thousands of digits
        raise InputError(_long_integer(text, shown)) from None
    except RecursionError:
        raise InputError(_too_deep(text, shown)) from None
    check_bounds(data, shown)
    return data


def check_bounds(data: Any, shown: str, prefix: str = "") -> None:
    """Refuse (InputError naming ``shown`` and the key) parsed ``data`` nested deeper than
    :data:`MAX_DEPTH`, with an array or table of more than :data:`MAX_ITEMS` entries or an
    integer outside :data:`INT_RANGE`. Iterative: any depth is safe to check."""
    low, high = INT_RANGE
    if isinstance(data, int) and not isinstance(data, bool) and not low <= data <= high:
        _refuse_int(data, shown, prefix)
    if not isinstance(data, dict | list):
        return
    # (container, its parent's entry, its name there, depth): the key is spelled out only
    # for a refusal, so a lock of thousands of packages costs one tuple per table or array.
    root: _Entry = (data, None, prefix, 0)
    stack = [root]
    while stack:
        entry = stack.pop()
        value, _, _, depth = entry
        if depth >= MAX_DEPTH:
            raise InputError(f"{shown}: {_key(entry) or '(top level)'}: nested deeper than {MAX_DEPTH} levels")
        if len(value) > MAX_ITEMS:
            what = "an array" if isinstance(value, list) else "a table"
            raise InputError(
                f"{shown}: {_key(entry) or '(top level)'}: {what} of {len(value):,} entries, over the "
                f"{MAX_ITEMS:,} harness reads in one"
            )
        entries = value.items() if isinstance(value, dict) else enumerate(value)
        for name, item in entries:
            kind = type(item)
            if kind is str or kind is bool or kind is float:
                continue  # the common case, first
            if kind is int:
                if not low <= item <= high:
                    _refuse_int(item, shown, _key((item, entry, name, depth + 1)))
            elif kind is dict or kind is list:
                stack.append((item, entry, name, depth + 1))


_Entry = tuple[Any, Any, "str | int", int]


def _key(entry: _Entry) -> str:
    """The dotted key of an entry of :func:`check_bounds` (``packages[3].wheels[0].size``)."""
    names: list[str | int] = []
    current: _Entry | None = entry
    while current is not None:
        names.append(current[2])
        current = current[1]
    text = ""
    for name in reversed(names):
        if isinstance(name, int):
            text += f"[{name}]"
        elif name:
            text += f".{name}" if text else name
    return text


def _refuse_int(value: int, shown: str, key: str) -> None:
    raise InputError(
        f"{shown}: {key or '(top level)'}: an integer of {len(str(abs(value)))} digits, outside the signed "
        "64-bit range harness reads"
    )


#: An integer too long for ``int()`` (what tomllib's ValueError is about).
#: Only decimal ones: ``int()`` converts any length of a base that is a power of two.
_LONG_DIGITS = re.compile(r"(?<![\w.\"'])[+-]?[0-9][0-9_]{4000,}")
#: The last ``key =`` of a line.
_KEY_BEFORE = re.compile(r"([A-Za-z0-9_-]+|\"[^\"\n]*\"|'[^'\n]*')\s*=\s*[^=]*$")


def _line_and_key(text: str, position: int) -> tuple[int, str]:
    """The line number of ``position`` and the key whose value holds it: the last ``key =``
    before it on its line, else on the lines above (an array over several lines)."""
    line = text.count("\n", 0, position) + 1
    start = text.rfind("\n", 0, position) + 1
    match = _KEY_BEFORE.search(text, start, position)
    while match is None and start > 0:
        end = start - 1
        start = text.rfind("\n", 0, end) + 1
        if text[start:end].lstrip().startswith("["):
            break  # a table header: the value began on the line below it
        match = _KEY_BEFORE.search(text, start, end)
    return line, (match.group(1).strip("\"'") if match else "(unknown key)")


def _long_integer(text: str, shown: str) -> str:
    # A value (after ``=``, ``[``, ``,`` or ``{``, or alone on a line), not digits in a string.
    match = next(
        (m for m in _LONG_DIGITS.finditer(text) if text[: m.start()].rstrip()[-1:] in ("=", "[", ",", "{", "")), None
    )
    if match is None:
        return f"{shown}: an integer of thousands of digits, outside the signed 64-bit range harness reads"
    line, key = _line_and_key(text, match.start())
    digits = len(match.group().lstrip("+-").replace("_", ""))
    return f"{shown}:{line}: {key}: an integer of {digits:,} digits, outside the signed 64-bit range harness reads"


#: What moves nesting in TOML, and what hides brackets from it (strings, comments).
_STRUCTURE = re.compile(r'"""(?:[^\\]|\\.)*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]')


def _too_deep(text: str, shown: str) -> str:
    """Where a document too deep for the parser first nests deeper than :data:`MAX_DEPTH`."""
    depth = 0
    for token in _STRUCTURE.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line, key = _line_and_key(text, token.start())
                return f"{shown}:{line}: {key}: nested deeper than {MAX_DEPTH} levels"
        elif char in "]}":
            depth = max(0, depth - 1)
    return f"{shown}: nested deeper than {MAX_DEPTH} levels"
