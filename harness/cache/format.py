"""The binary cache format: ``harness-cache-info``, ``<hash>.narinfo`` and their fingerprint.

``store/README.md`` ("Binary cache format") is the specification; this module is its
reference implementation. Everything here is pure (text in, objects out, and back).

A cache holds, at its root::

    harness-cache-info          what the cache is (format version, compression, priority)
    <hash>.narinfo              one metadata record per store path (<hash>: its 32 characters)
    nar/<filehash>.nar.zst      the path's NAR serialization, zstd-compressed

Store path names are location-independent (``<hash>-<name>``, the same in every
``HARNESS_HOME``), so unlike Nix's ``nix-cache-info`` there is no ``StoreDir``: a cache
serves stores at any location.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from harness.errors import HarnessError, InputError
from harness.store.hashing import STORE_HASH_CHARS, check_store_name
from harness.store.store import KINDS

#: The only cache format so far; ``harness-cache-info`` says which one a cache uses.
CACHE_FORMAT = "harness-cache-1"
CACHE_INFO_KEY = "harness-cache-info"
#: Nix's default priority; lower numbers are asked first.
DEFAULT_PRIORITY = 50
#: The prefix of every signed fingerprint: a signature made for Nix (``1;…``), or by any
#: other tool with the same key, can never be taken for one over a harness path.
FINGERPRINT_PREFIX = "harness-1"
COMPRESSION = "zstd"

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_BLAKE3 = re.compile(r"^blake3:[0-9a-f]{64}$")
#: An archive's key is derived from its file hash, so a narinfo cannot name any other file
#: of the cache (or ``../`` anything): the key is checked before it is ever used.
_ARCHIVE_KEY = re.compile(r"^nar/([0-9a-f]{64})\.nar\.zst$")
_SINGLE_KEYS = (
    "StorePath",
    "Kind",
    "URL",
    "Compression",
    "FileHash",
    "FileSize",
    "NarHash",
    "NarSize",
    "References",
    "Impure",
    "Obtained",
)


class CacheError(HarnessError):
    """A cache cannot be used for a path: unreachable, malformed, untrusted or corrupt.

    Substitution treats it as "not available here" (it warns and moves on); push and pull
    report it.
    """


class CacheConfigError(InputError):
    """A cache setting is wrong: an unknown URL scheme, a malformed key. Always raised."""


@dataclass(frozen=True)
class CacheInfo:
    """``harness-cache-info``: ``Format: harness-cache-1``, ``Compression``, ``Priority``."""

    format: str = CACHE_FORMAT
    compression: str = COMPRESSION
    priority: int = DEFAULT_PRIORITY

    def render(self) -> str:
        return f"Format: {self.format}\nCompression: {self.compression}\nPriority: {self.priority}\n"

    @classmethod
    def parse(cls, text: str, where: str) -> CacheInfo:
        """Parse and check a cache-info file; a cache in another format is a CacheError."""
        fields = _fields(text, where, single=("Format", "Compression", "Priority"))
        fmt = fields.get("Format")
        if fmt != CACHE_FORMAT:
            raise CacheError(
                f"{where}: cache format {fmt!r} is not {CACHE_FORMAT!r}",
                hint="push to a cache made by this version of harness",
            )
        compression = fields.get("Compression", COMPRESSION)
        priority = fields.get("Priority", str(DEFAULT_PRIORITY))
        if not priority.isdigit():
            raise CacheError(f"{where}: Priority {priority!r} is not a non-negative integer")
        return cls(fmt, compression, int(priority))


@dataclass(frozen=True)
class NarInfo:
    """One store path's metadata in a cache (``<hash>.narinfo``).

    ``content``/``nar_size`` are the path's content hash and NAR length, exactly as in its
    store record; ``file_hash``/``file_size`` describe the compressed archive at ``url``.
    ``signatures`` are ``keyname:base64`` strings over :meth:`fingerprint`.
    """

    store_path: str
    kind: str
    url: str
    file_hash: str
    file_size: int
    content: str
    nar_size: int
    references: tuple[str, ...] = ()
    compression: str = COMPRESSION
    impure: str | None = None
    obtained: str = ""
    signatures: tuple[str, ...] = field(default=())

    @property
    def hash_part(self) -> str:
        return self.store_path[:STORE_HASH_CHARS]

    def fingerprint(self) -> bytes:
        """The bytes a signature covers: everything that becomes part of the store record.

        ``harness-1;<store path>;<content hash>;<nar size>;<ref>,<ref>…;<kind>;<impure>``
        — Nix's ``1;path;hash;size;refs`` with the kind and the impurity note appended (both
        end up in the record) and a prefix of its own. ``obtained`` is provenance for humans
        and is not signed.
        """
        parts = [
            FINGERPRINT_PREFIX,
            self.store_path,
            self.content,
            str(self.nar_size),
            ",".join(self.references),
            self.kind,
            self.impure or "",
        ]
        return ";".join(parts).encode()

    def with_signatures(self, signatures: Iterable[str]) -> NarInfo:
        return replace(self, signatures=tuple(dict.fromkeys([*self.signatures, *signatures])))

    def render(self) -> str:
        lines = [
            f"StorePath: {self.store_path}",
            f"Kind: {self.kind}",
            f"URL: {self.url}",
            f"Compression: {self.compression}",
            f"FileHash: {self.file_hash}",
            f"FileSize: {self.file_size}",
            f"NarHash: {self.content}",
            f"NarSize: {self.nar_size}",
            f"References: {' '.join(self.references)}",
        ]
        if self.impure:
            lines.append(f"Impure: {self.impure}")
        if self.obtained:
            lines.append(f"Obtained: {self.obtained}")
        lines += [f"Sig: {sig}" for sig in self.signatures]
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str, where: str) -> NarInfo:
        """Parse and check a narinfo; anything malformed is a CacheError naming ``where``.

        Unknown keys are ignored (a later format may add some); known keys may appear once,
        except ``Sig``. Every value is checked here, in particular the archive key, so no
        later step ever uses an unchecked name from a cache.
        """
        fields = _fields(text, where, single=_SINGLE_KEYS)
        signatures = tuple(fields.get_all("Sig"))

        def need(key: str) -> str:
            if key not in fields:
                raise CacheError(f"{where}: missing {key}")
            return fields[key]

        def number(key: str) -> int:
            value = need(key)
            if not value.isdigit():
                raise CacheError(f"{where}: {key} {value!r} is not a non-negative integer")
            return int(value)

        def hashed(key: str) -> str:
            value = need(key)
            if not _BLAKE3.match(value):
                raise CacheError(f"{where}: {key} {value!r} is not blake3:<64 hex digits>")
            return value

        store_path = need("StorePath")
        _check_path_name(store_path, where, "StorePath")
        kind = need("Kind")
        if kind not in KINDS:
            raise CacheError(f"{where}: Kind {kind!r} is not one of {', '.join(KINDS)}")
        url = need("URL")
        file_hash = hashed("FileHash")
        match = _ARCHIVE_KEY.match(url)
        if not match or match.group(1) != file_hash.removeprefix("blake3:"):
            raise CacheError(f"{where}: URL {url!r} is not nar/<FileHash hex>.nar.zst")
        compression = need("Compression")
        if compression != COMPRESSION:
            raise CacheError(f"{where}: Compression {compression!r} is not supported (only zstd)")
        references = tuple(fields.get("References", "").split())
        for ref in references:
            _check_path_name(ref, where, "References")
        if list(references) != sorted(set(references)):
            raise CacheError(f"{where}: References must be sorted and unique")
        for sig in signatures:
            if ":" not in sig:
                raise CacheError(f"{where}: Sig {sig!r} is not keyname:base64")
        return cls(
            store_path=store_path,
            kind=kind,
            url=url,
            file_hash=file_hash,
            file_size=number("FileSize"),
            content=hashed("NarHash"),
            nar_size=number("NarSize"),
            references=references,
            compression=compression,
            impure=fields.get("Impure") or None,
            obtained=fields.get("Obtained", ""),
            signatures=signatures,
        )


def narinfo_key(store_path: str) -> str:
    """Where a path's narinfo lives in a cache: ``<its 32-character hash>.narinfo``."""
    return f"{store_path[:STORE_HASH_CHARS]}.narinfo"


def archive_key(file_hash: str) -> str:
    """Where an archive lives in a cache: ``nar/<hex of its blake3>.nar.zst``."""
    return f"nar/{file_hash.removeprefix('blake3:')}.nar.zst"


def _check_path_name(value: str, where: str, key: str) -> None:
    hash_part, dash, rest = value.partition("-")
    ok = (
        dash == "-"
        and len(hash_part) == STORE_HASH_CHARS
        and re.fullmatch(r"[0-9a-df-np-sv-z]{32}", hash_part) is not None
    )
    if ok:
        try:
            check_store_name(rest)
        except ValueError:
            ok = False
    if not ok:
        raise CacheError(f"{where}: {key} {value!r} is not a store path name (<hash>-<name>)")


class _Fields(dict[str, str]):
    """``Key: value`` lines; repeatable keys are kept in ``multi``."""

    def __init__(self) -> None:
        super().__init__()
        self.multi: dict[str, list[str]] = {}

    def get_all(self, key: str) -> list[str]:
        return self.multi.get(key, [])


def _fields(text: str, where: str, *, single: tuple[str, ...]) -> _Fields:
    fields = _Fields()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition(": ")
        if not sep or not key or " " in key:
            if line.endswith(":") and " " not in line:  # "References:" with no references
                key, value = line[:-1], ""
            else:
                raise CacheError(f"{where}: line {number} is not 'Key: value': {line[:80]!r}")
        if key in single:
            if key in fields:
                raise CacheError(f"{where}: {key} appears twice")
            fields[key] = value.strip()
        else:
            fields.multi.setdefault(key, []).append(value.strip())
    return fields


__all__ = [
    "CACHE_FORMAT",
    "CACHE_INFO_KEY",
    "COMPRESSION",
    "DEFAULT_PRIORITY",
    "FINGERPRINT_PREFIX",
    "CacheConfigError",
    "CacheError",
    "CacheInfo",
    "NarInfo",
    "archive_key",
    "narinfo_key",
]
