"""TOML text for the documents harness writes itself: values and keys, as tomlkit writes them.

A lock is written on every ``harness lock``; building it as a tomlkit document and dumping it
took 35–50 ms for a 45-package lock on two cores (and importing tomlkit ≈ 15 ms more), where
these few functions take about a millisecond. The output is byte for byte what tomlkit writes
for the same values (``tests/test_lockfile.py`` checks it against tomlkit), so no existing
lock changes when it is re-locked. Pure: strings in, strings out.

What is covered is what harness's documents hold: strings, integers, booleans, arrays of them,
inline tables of them; the caller lays out tables (``[name]``, ``[[name]]``) and blank lines.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: this module is imported on every lock
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    Value = str | bool | int | Sequence["Value"] | Mapping[str, "Value"]

#: The short escapes of TOML 1.0's basic strings; every other control character is written
#: as \\uXXXX (as tomlkit does: its \\e is TOML 1.1 only).
_SHORT = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}
_ESCAPES = {chr(c): _SHORT.get(chr(c), f"\\u{c:04x}") for c in (*range(0x20), 0x7F)} | _SHORT
_TRANSLATION = str.maketrans(_ESCAPES)
_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def string(text: str) -> str:
    """``text`` as a TOML basic string (double-quoted, escaped)."""
    return f'"{text.translate(_TRANSLATION)}"'


def key(name: str) -> str:
    """``name`` as a TOML key: bare when it can be, quoted otherwise."""
    return name if name and _BARE.issuperset(name) else string(name)


def value(item: Value) -> str:
    """``item`` as a TOML value on one line: arrays and tables inline."""
    if isinstance(item, bool):  # before int: a bool is an int
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, dict):
        return "{" + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()) + "}"
    if isinstance(item, (list, tuple)):
        return "[" + ", ".join(value(v) for v in item) + "]"
    raise TypeError(f"no TOML text for {type(item).__name__}")


def multiline_array(items: Sequence[Value]) -> str:
    """An array with one item per line, each indented by four spaces and followed by a comma
    (``[]`` when empty)."""
    if not items:
        return "[]"
    return "[\n" + "".join(f"    {value(v)},\n" for v in items) + "]"


def assignment(name: str, item: Value) -> str:
    """``name = value`` (one line, no newline)."""
    return f"{key(name)} = {value(item)}"
