"""Debian packages pinned from an archive's Packages index (for rootfs templates).

``harness lock`` reads ``dists/<suite>/<component>/binary-<arch>/Packages{.xz,.gz,}`` of the
archive a template names (its address from the settings' ``[debian-archives]``) and pins each
package the template wants with its ``Pre-Depends`` and ``Depends`` closure: name, version,
architecture, the pool file's path, size and sha256. Honest and simple, not apt:

* an alternative (``a | b``) takes the first that the index has (as a package, else as the
  ``Provides`` of one: the first such package by name);
* version constraints are not solved: a suite's index holds one version of each package,
  and where it holds several the newest (dpkg's order) is taken;
* a dependency the template ``assume``s (the host's ``/usr`` stands in for it) is not pinned;
  one the index cannot satisfy is an error naming the package that needs it.

The index is read as an upstream (like a package index's pages), not trusted for anything but
the pins: every ``.deb`` realize fetches is checked against the sha256 pinned here. The
InRelease signature is not checked (record the archive you trust in the settings).

``parse_packages``, ``closure`` and ``compare_versions`` are pure.
"""

from __future__ import annotations

import gzip
import lzma
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from harness.errors import HarnessError, InputError

INDEX_FILES = ("Packages.xz", "Packages.gz", "Packages")
_MAX_INDEX = 512 * 1024 * 1024
_DEP = re.compile(r"^\s*([a-z0-9][a-z0-9+.-]+)(?::[a-z0-9-]+)?\s*(?:\(([^)]*)\))?\s*(?:\[[^]]*\])?\s*(?:<[^>]*>)?\s*$")


@dataclass(frozen=True)
class DebPin:
    """One package as a lock pins it."""

    name: str
    version: str
    architecture: str
    filename: str  # the pool path, relative to the archive's address
    size: int
    sha256: str

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "architecture": self.architecture,
            "filename": self.filename,
            "size": self.size,
            "sha256": self.sha256,
        }


def parse_packages(text: str) -> list[dict[str, str]]:
    """The stanzas of a Packages index, each a field -> value mapping (continuation lines joined)."""
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


def parse_relations(text: str) -> list[list[tuple[str, str]]]:
    """``Depends``-style text as a list of alternatives, each ``(name, constraint)``."""
    out = []
    for group in (g for g in text.split(",") if g.strip()):
        alternatives = []
        for alt in group.split("|"):
            match = _DEP.match(alt)
            if match:
                alternatives.append((match.group(1), (match.group(2) or "").strip()))
        if alternatives:
            out.append(alternatives)
    return out


def closure(
    stanzas: list[dict[str, str]], wanted: tuple[str, ...], assume: tuple[str, ...], where: str
) -> list[DebPin]:
    """The pins of ``wanted`` and their dependency closure, sorted by name (module doc)."""
    newest = _newest(stanzas)
    providers: dict[str, list[str]] = {}
    for name, stanza in sorted(newest.items()):
        for provided in parse_relations(stanza.get("Provides", "")):
            providers.setdefault(provided[0][0], []).append(name)
    chosen: dict[str, DebPin] = {}
    queue: list[tuple[str, str | None]] = [(name, None) for name in wanted]
    while queue:
        name, needed_by = queue.pop(0)
        if name in chosen or name in assume:
            continue
        found = newest.get(name)
        if found is None:
            by = f" (a dependency of {needed_by})" if needed_by else ""
            raise InputError(
                f"{where}: package {name!r}{by} is not in the archive's Packages index",
                hint="check the name, the suite and the components; `assume` a dependency the host provides",
            )
        chosen[name] = _pin(found, where)
        for field in ("Pre-Depends", "Depends"):
            for group in parse_relations(found.get(field, "")):
                pick = _pick(group, newest, providers, assume, chosen)
                if pick is None:
                    raise InputError(
                        f"{where}: {name} {field}: "
                        + " | ".join(n + (f" ({c})" if c else "") for n, c in group)
                        + ": not in the archive's Packages index",
                        hint="add the missing package's component, or `assume` it (the host provides it)",
                    )
                queue.append((pick, name))
    return [chosen[n] for n in sorted(chosen)]


def _pick(
    group: list[tuple[str, str]],
    newest: dict[str, dict[str, str]],
    providers: dict[str, list[str]],
    assume: tuple[str, ...],
    chosen: dict[str, DebPin],
) -> str | None:
    names = [n for n, _ in group]
    for name in names:  # already satisfied, or the host's
        if name in chosen or name in assume:
            return name
    for name in names:
        if name in newest:
            return name
        if providers.get(name):
            return providers[name][0]
    return None


def _newest(stanzas: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    from functools import cmp_to_key

    by_name: dict[str, list[dict[str, str]]] = {}
    for stanza in stanzas:
        if stanza.get("Package"):
            by_name.setdefault(stanza["Package"], []).append(stanza)
    out = {}
    for name, group in by_name.items():
        group.sort(key=cmp_to_key(lambda a, b: compare_versions(a.get("Version", ""), b.get("Version", ""))))
        out[name] = group[-1]
    return out


def _pin(stanza: dict[str, str], where: str) -> DebPin:
    name = stanza["Package"]
    try:
        size = int(stanza.get("Size", ""))
    except ValueError:
        raise InputError(f"{where}: package {name}: the index gives no Size") from None
    sha = stanza.get("SHA256", "").lower()
    filename = stanza.get("Filename", "")
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise InputError(f"{where}: package {name}: the index gives no SHA256")
    if not filename or filename.startswith("/") or ".." in filename.split("/"):
        raise InputError(f"{where}: package {name}: Filename {filename!r} is not a path in the archive")
    return DebPin(name, stanza.get("Version", ""), stanza.get("Architecture", ""), filename, size, sha)


# ------------------------------------------------------------------------- dpkg's version order


def compare_versions(a: str, b: str) -> int:
    """dpkg's order of two versions: negative, zero or positive."""

    def split(v: str) -> tuple[int, str, str]:
        epoch, _, rest = v.rpartition(":") if ":" in v else ("0", "", v)
        upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
        return int(epoch or 0), upstream, revision

    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _compare_part(a: str, b: str) -> int:
    while a or b:
        na = re.match(r"^[^0-9]*", a).group(0)  # type: ignore[union-attr]
        nb = re.match(r"^[^0-9]*", b).group(0)  # type: ignore[union-attr]
        for i in range(max(len(na), len(nb))):
            oa = _order(na[i]) if i < len(na) else 0
            ob = _order(nb[i]) if i < len(nb) else 0
            if oa != ob:
                return -1 if oa < ob else 1
        a, b = a[len(na) :], b[len(nb) :]
        da = re.match(r"^[0-9]*", a).group(0)  # type: ignore[union-attr]
        db = re.match(r"^[0-9]*", b).group(0)  # type: ignore[union-attr]
        if int(da or 0) != int(db or 0):
            return -1 if int(da or 0) < int(db or 0) else 1
        a, b = a[len(da) :], b[len(db) :]
    return 0


# ------------------------------------------------------------------------------ the network


def read_index(archive_url: str, suite: str, component: str, architecture: str) -> list[dict[str, str]]:
    """The stanzas of one component's Packages index: ``.xz``, else ``.gz``, else plain."""
    folder = f"{archive_url.rstrip('/')}/dists/{suite}/{component}/binary-{architecture}"
    problems = []
    for name in INDEX_FILES:
        try:
            with urllib.request.urlopen(f"{folder}/{name}", timeout=60) as response:
                data = response.read(_MAX_INDEX + 1)
        except urllib.error.HTTPError as exc:
            problems.append(f"{name}: HTTP {exc.code}")
            continue
        except (OSError, ValueError) as exc:
            raise HarnessError(f"cannot read the Packages index {folder}/{name}: {exc}") from None
        if len(data) > _MAX_INDEX:
            raise HarnessError(f"{folder}/{name}: larger than {_MAX_INDEX >> 20} MiB")
        try:
            if name.endswith(".xz"):
                data = lzma.decompress(data)
            elif name.endswith(".gz"):
                data = gzip.decompress(data)
        except (lzma.LZMAError, OSError, EOFError) as exc:
            raise HarnessError(f"{folder}/{name}: not a valid compressed index: {exc}") from None
        return parse_packages(data.decode("utf-8", errors="replace"))
    raise HarnessError(f"no Packages index under {folder} ({'; '.join(problems)})")
