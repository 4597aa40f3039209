"""Debian's control-file syntax (deb822), read one way for all: a Packages index, a ``.deb``'s
``control`` and an archive's ``Release`` are stanzas of ``Field: value`` lines, separated by
blank lines, a line starting with a space or tab continuing the field above. Pure."""

from __future__ import annotations


def parse_stanzas(text: str) -> list[dict[str, str]]:
    """The stanzas of ``text``, each a field -> value mapping (continuation lines joined with
    a newline, each stripped)."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line.strip():
            if current:
                stanzas.append(current)
            current, last = {}, ""
        elif line[0] in " \t":
            if last:
                current[last] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            last = key.strip()
            current[last] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas
