"""Debian packages pinned from an archive's Packages index (for rootfs templates).

``harness lock`` reads ``dists/<suite>/<component>/binary-<arch>/Packages{.xz,.gz,}`` of the
archive a template names (its address from the settings' ``[debian-archives]``) and pins each
package the template wants with its ``Pre-Depends`` and ``Depends`` closure: name, version,
architecture, the pool file's path, size and sha256. Honest and simple, not apt:

* versions are chosen, not solved: each package gets the newest version (dpkg's order) that
  meets every constraint (``>=``, ``<<``, ``=``, ``<=``, ``>>``) met on it; a constraint met
  after its package was chosen starts the walk again knowing it; there is no backtracking
  over alternatives, and ``Conflicts``, ``Breaks`` and ``Recommends`` are not read;
* an alternative (``a | b``) takes the first that is already chosen at a version meeting its
  constraint, else the first whose index has a version meeting it, else a package that
  ``Provides`` it (the first by name; a versioned dependency only by a versioned ``Provides``);
* a dependency the template ``assume``s (the host's ``/usr`` stands in for it) is not pinned
  and its constraint not checked; one the index cannot satisfy is an error naming the package
  that needs it, the constraint and the versions the index has.

The index is trusted as apt trusts it: the archive's ``InRelease`` is checked with ``gpgv``
against the keyring the settings name, and the Packages file against the sha256 the signed
Release lists, before it is read (:mod:`harness.resolve.debrelease`; an archive the settings
mark ``allow-unsigned`` is read unchecked, and its locks say so). Every ``.deb`` realize
fetches is checked against the sha256 pinned here.

``closure``, ``satisfies`` and ``compare_versions`` are pure; the index is read with the one
deb822 reader (:mod:`harness.resolve.deb822`) that ``Release`` files and ``control`` files use too.
"""

from __future__ import annotations

import lzma
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError, InputError
from harness.resolve.deb822 import parse_stanzas

if TYPE_CHECKING:
    from harness.resolve.debrelease import Release

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
    """The pins of ``wanted`` and their dependency closure, sorted by name (module doc).

    Each package gets the newest version that satisfies every constraint met on it. A
    constraint met after its package was chosen, which the chosen version fails but another
    would meet, starts the walk again with that constraint known from the start."""
    versions = _versions(stanzas)
    known: dict[str, list[str]] = {}
    for _ in range(1000):
        walk = _Walk(versions, assume, known, where)
        try:
            walk.run(wanted)
        except _Retry as retry:
            known.setdefault(retry.name, []).append(retry.constraint)
            continue
        return [_pin(walk.chosen[n], where) for n in sorted(walk.chosen)]
    raise InputError(f"{where}: the dependency closure did not settle after 1000 walks")


class _Retry(Exception):
    def __init__(self, name: str, constraint: str) -> None:
        super().__init__(name, constraint)
        self.name, self.constraint = name, constraint


class _Walk:
    """One breadth-first walk from ``wanted``, choosing a version of each package (pure)."""

    def __init__(
        self,
        versions: dict[str, list[dict[str, str]]],
        assume: tuple[str, ...],
        known: dict[str, list[str]],
        where: str,
    ) -> None:
        self.versions, self.assume, self.where = versions, assume, where
        self.required = {name: list(constraints) for name, constraints in known.items()}
        self.chosen: dict[str, dict[str, str]] = {}
        self.providers = _providers(versions)

    def run(self, wanted: tuple[str, ...]) -> None:
        queue: list[tuple[str, str | None]] = [(name, None) for name in wanted]
        while queue:
            name, needed_by = queue.pop(0)
            if name in self.chosen or name in self.assume:
                continue
            self.chosen[name] = self._choose(name, needed_by)
            for field in ("Pre-Depends", "Depends"):
                for group in parse_relations(self.chosen[name].get(field, "")):
                    queue.append((self._pick(name, field, group), name))

    def _fitting(self, name: str, constraint: str = "") -> list[dict[str, str]]:
        """The versions of ``name`` that meet ``constraint`` and every constraint required of it."""
        wanted = [*self.required.get(name, []), constraint]
        return [s for s in self.versions.get(name, []) if all(satisfies(s.get("Version", ""), c) for c in wanted)]

    def _choose(self, name: str, needed_by: str | None) -> dict[str, str]:
        by = f" (a dependency of {needed_by})" if needed_by else ""
        if name not in self.versions:
            raise InputError(
                f"{self.where}: package {name!r}{by} is not in the archive's Packages index",
                hint="check the name, the suite and the components; `assume` a dependency the host provides",
            )
        fitting = self._fitting(name)
        if not fitting:
            constraints = ", ".join(f"({c})" for c in self.required.get(name, []))
            raise InputError(
                f"{self.where}: package {name}{by}: no version satisfies {constraints}; "
                f"the index has {_listed(self.versions[name])}",
                hint="pin another suite or component, or `assume` the package (the host provides it)",
            )
        return fitting[0]

    def _pick(self, name: str, field: str, group: list[tuple[str, str]]) -> str:
        """The package that satisfies ``group``: an alternative assumed, or chosen already at a
        version that meets its constraint; else the first alternative the index has a version
        of that meets it (a chosen one is chosen again: :class:`_Retry`); else a provider."""
        for alt, constraint in group:
            chosen = self.chosen.get(alt)
            if alt in self.assume or (chosen is not None and satisfies(chosen.get("Version", ""), constraint)):
                return alt
        for alt, constraint in group:
            if not self._fitting(alt, constraint):
                provider = self._provider(alt, constraint) if alt not in self.versions else None
                if provider is not None:
                    return provider
                continue
            if alt in self.chosen:
                raise _Retry(alt, constraint)
            if constraint:
                self.required.setdefault(alt, []).append(constraint)
            return alt
        raise InputError(
            f"{self.where}: {name} {field}: {_unsatisfied(group, self.versions, self.required)}",
            hint="pin another suite or component, or `assume` the package (the host provides it)",
        )

    def _provider(self, virtual: str, constraint: str) -> str | None:
        """The first package by name that ``Provides`` ``virtual`` (at a version meeting
        ``constraint``: an unversioned ``Provides`` meets no versioned dependency, as in dpkg)."""
        for provider, provided in self.providers.get(virtual, []):
            if constraint and not (provided and satisfies(provided, constraint)):
                continue
            if provider in self.chosen or self._fitting(provider):
                return provider
        return None


def _listed(candidates: list[dict[str, str]]) -> str:
    return ", ".join(s.get("Version", "?") for s in candidates) or "none"


def _unsatisfied(
    group: list[tuple[str, str]], versions: dict[str, list[dict[str, str]]], required: dict[str, list[str]]
) -> str:
    """Each alternative, its constraint, what the index has and what else is required of it."""
    parts = []
    for alt, constraint in group:
        have = f"the index has {_listed(versions[alt])}" if alt in versions else "not in the archive's Packages index"
        others = [c for c in required.get(alt, []) if c != constraint]
        if others:
            have += " (also required: " + ", ".join(f"({c})" for c in others) + ")"
        parts.append(f"{alt}{f' ({constraint})' if constraint else ''}: {have}")
    return "; ".join(parts)


def _providers(versions: dict[str, list[dict[str, str]]]) -> dict[str, list[tuple[str, str]]]:
    """Virtual name -> (package, provided version or "") for the newest version of each package."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name in sorted(versions):
        for provided in parse_relations(versions[name][0].get("Provides", "")):
            virtual, constraint = provided[0]
            version = constraint.removeprefix("=").strip() if constraint.startswith("=") else ""
            out.setdefault(virtual, []).append((name, version))
    return out


def _versions(stanzas: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    """Each package's stanzas, newest first (dpkg's order)."""
    from functools import cmp_to_key

    by_name: dict[str, list[dict[str, str]]] = {}
    for stanza in stanzas:
        if stanza.get("Package"):
            by_name.setdefault(stanza["Package"], []).append(stanza)
    for group in by_name.values():
        group.sort(key=cmp_to_key(lambda a, b: compare_versions(b.get("Version", ""), a.get("Version", ""))))
    return by_name


_OPERATORS = {
    "<<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
    "=": lambda c: c == 0,
    ">=": lambda c: c >= 0,
    ">>": lambda c: c > 0,
    "<": lambda c: c <= 0,  # obsolete spellings, as dpkg reads them
    ">": lambda c: c >= 0,
}


def satisfies(version: str, constraint: str) -> bool:
    """Whether ``version`` meets ``constraint`` (``">= 2.34"``, ``"<< 3"``; empty: any)."""
    constraint = constraint.strip()
    if not constraint:
        return True
    match = re.match(r"^(<<|<=|>=|>>|=|<|>)\s*(\S+)$", constraint)
    if match is None:
        return False
    return bool(_OPERATORS[match.group(1)](compare_versions(version, match.group(2))))


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


def unpacked_index(name: str, data: bytes, where: str) -> bytes:
    """A Packages index's bytes: ``data`` unpacked as its ``name`` says (``.xz``, ``.gz``, or
    plain), one stream after another. Raises :class:`HarnessError` naming ``where`` for
    bytes that are not such a file, one cut short, or one that unpacks to more than
    :data:`_MAX_INDEX` (a small file can unpack to gigabytes: an archive read unsigned, or
    one that signs such a file, must not exhaust the machine's memory)."""
    import zlib

    if not name.endswith((".xz", ".gz")):
        return data
    out = bytearray()
    rest = data
    try:
        while rest:
            unpacker = lzma.LZMADecompressor() if name.endswith(".xz") else zlib.decompressobj(wbits=31)
            out += unpacker.decompress(rest, _MAX_INDEX + 1 - len(out))
            if len(out) > _MAX_INDEX:
                raise HarnessError(f"{where}: unpacks to more than {_MAX_INDEX >> 20} MiB")
            if not unpacker.eof:
                raise HarnessError(f"{where}: not a valid compressed index: it ends before its end")
            rest = unpacker.unused_data
    except (lzma.LZMAError, zlib.error) as exc:
        raise HarnessError(f"{where}: not a valid compressed index: {exc}") from None
    return bytes(out)


# ------------------------------------------------------------------------------ the network


def read_index(
    archive_url: str, suite: str, component: str, architecture: str, release: Release | None = None
) -> list[dict[str, str]]:
    """The stanzas of one component's Packages index: ``.xz``, else ``.gz``, else plain.

    With ``release`` (the archive's checked InRelease, :mod:`harness.resolve.debrelease`) only
    the files it lists are asked for, and each is refused unless its sha256 is the listed one."""
    folder = f"{archive_url.rstrip('/')}/dists/{suite}/{component}/binary-{architecture}"
    problems = []
    names: tuple[str, ...] = INDEX_FILES
    if release is not None:
        names = tuple(n for n in INDEX_FILES if f"{component}/binary-{architecture}/{n}" in release.files)
        if not names:
            raise HarnessError(
                f"the signed Release {release.where} lists no Packages index of {component}/binary-{architecture}",
                hint="check the template's components and architecture",
            )
    for name in names:
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
        if release is not None:
            from harness.resolve.debrelease import checked_index

            checked_index(release, f"{component}/binary-{architecture}/{name}", data, f"{folder}/{name}")
        return parse_stanzas(unpacked_index(name, data, f"{folder}/{name}").decode("utf-8", errors="replace"))
    raise HarnessError(f"no Packages index under {folder} ({'; '.join(problems)})")
