"""The store's hash scheme: canonical JSON, store hashes and names, and content hashes.

``store/README.md`` is the specification and holds the golden vectors that
``tests/test_store_hashing.py`` checks; this module is its reference implementation.

* :func:`canonical_json` — the one serialization of an object's inputs.
* :func:`store_hash` — 32 Nix-base32 characters of a domain-separated, 160-bit blake3 over
  ``kind``, ``name`` and the canonical inputs; :func:`store_path_name` joins it to a name.
* :func:`iter_nar` — a path's content as Nix's NAR serialization (sorted entries, no
  timestamps, owners or permissions but the executable bit); :func:`content_hash` is the
  blake3 of that stream, ``"blake3:<hex>"``.

Everything but the file readers is pure (data in, data out).

Light at import (``os``, ``mmap``, ``stat``, blake3): the launch check and every command
that registers a path load it.
"""

from __future__ import annotations

import math
import mmap
import os
import stat

import blake3

from harness.errors import HarnessError

TYPE_CHECKING = False  # not typing's: see the module doc
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

#: Prefix of every store hash preimage; bump the version to change the scheme wholesale.
STORE_HASH_DOMAIN = b"harness-store-v1\0"
#: Nix's base32 alphabet (no e, o, t, u).
NIX_BASE32_ALPHABET = "0123456789abcdfghijklmnpqrsvwxyz"
#: A store hash is 160 bits: 20 bytes, 32 base32 characters.
STORE_HASH_BYTES = 20
STORE_HASH_CHARS = 32
#: Longest name in a store path. 32 + 1 + 200 leaves room under NAME_MAX (255) for the
#: suffixes of records and locks kept beside a path (``.json``, ``.lock``, ``.tmp-…``).
STORE_NAME_MAX = 200

# Character sets, not regular expressions: ``re`` costs start-up, and ``$`` would let a
# trailing newline through.
_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz")
_DIGITS = frozenset("0123456789")
_NAME_CHARS = _LOWER | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ") | _DIGITS | frozenset("+._-")
_KIND_CHARS = _LOWER | _DIGITS | frozenset("-")
_HASH_CHARS = frozenset(NIX_BASE32_ALPHABET)

# Files at least this large are hashed through mmap with blake3's multithreaded update,
# which is about twice as fast as read() into a buffer (no copy); smaller ones are read.
_MMAP_THRESHOLD = 1 << 20
_READ_CHUNK = 1 << 20


class HashingError(HarnessError):
    """A path cannot be serialized: an unsupported file type, or it changed or vanished."""


# --------------------------------------------------------------------------- canonical JSON


def _plain(value: Any, where: str) -> Any:
    """``value`` as plain dict/list/scalars; raise ValueError/TypeError on anything else."""
    from collections.abc import Mapping  # here: see the module doc

    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"canonical JSON has no {value!r} (at {where})")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                # json.dumps would turn 1 into "1" and silently merge it with a key "1".
                raise TypeError(f"canonical JSON keys must be str, got {key!r} (at {where})")
            out[key] = _plain(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise TypeError(f"canonical JSON cannot hold {type(value).__name__} (at {where})")


def canonical_json(value: Any) -> bytes:
    """The canonical serialization of ``value``: the bytes that store hashes cover.

    Objects with keys sorted by code point, no whitespace, UTF-8 (non-ASCII written as is;
    only ``"``, ``\\`` and U+0000–U+001F escaped), ints as ints, finite floats as Python's
    shortest round-trip ``repr``, tuples as arrays. Rejects NaN/±inf (ValueError), non-str
    keys and other types (TypeError) and strings that are not valid Unicode (ValueError).
    """
    import json

    text = json.dumps(
        _plain(value, "$"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate has no UTF-8 form
        raise ValueError(f"canonical JSON strings must be valid Unicode: {exc}") from None


# ------------------------------------------------------------------------- hashes and names


def nix_base32(data: bytes) -> str:
    """Encode ``data`` in Nix's base32, bit order included (``nix hash to-base32`` agrees).

    Nix reads the bytes as one little-endian number and writes its 5-bit digits most
    significant first: character ``k`` of ``n = ceil(8*len/5)`` is bits
    ``5*(n-1-k) .. 5*(n-1-k)+4``. Unlike RFC 4648 there is no padding.
    """
    length = (len(data) * 8 + 4) // 5
    number = int.from_bytes(data, "little")
    return "".join(NIX_BASE32_ALPHABET[(number >> (5 * position)) & 0x1F] for position in range(length - 1, -1, -1))


def check_store_name(name: str) -> str:
    """Return ``name`` if it may follow ``<hash>-`` in a store path, else raise ValueError.

    Allowed: ASCII letters, digits and ``+ - . _``; not starting with ``.``; 1 to
    :data:`STORE_NAME_MAX` characters.
    """
    if not name or name[0] == "." or len(name) > STORE_NAME_MAX or not _NAME_CHARS.issuperset(name):
        raise ValueError(
            f"store name {name!r} must be 1-{STORE_NAME_MAX} of A-Z a-z 0-9 + - . _ and must not start with '.'"
        )
    return name


def sanitize_name(text: str) -> str:
    """A valid store name made from ``text``: each run of other characters becomes ``-``,
    leading dots are dropped, and the result is cut to :data:`STORE_NAME_MAX` characters.

    Raises ValueError when nothing usable is left (e.g. ``""`` or ``"..."``).
    """
    import re  # here: see the module doc

    name = re.sub(r"[^A-Za-z0-9+._-]+", "-", text).lstrip(".")[:STORE_NAME_MAX]
    if not name:
        raise ValueError(f"{text!r} leaves nothing to name a store path with")
    return check_store_name(name)


def store_hash(kind: str, name: str, inputs: Mapping[str, Any]) -> str:
    """The 32-character hash of a store object from its kind, name and inputs.

    ``nix_base32(blake3(STORE_HASH_DOMAIN + kind + b"\\0" + name + b"\\0" +
    canonical_json(inputs)).digest(20))``. ``kind`` is a lowercase word (``source``,
    ``wheel``, ``environment``…); ``name`` must already be a valid store name (see
    :func:`sanitize_name`) so that the hash and the path's name always agree.
    """
    from collections.abc import Mapping  # here: see the module doc

    if not kind or kind[0] not in _LOWER or not _KIND_CHARS.issuperset(kind):
        raise ValueError(f"store kind {kind!r} must be lowercase letters, digits and '-'")
    check_store_name(name)
    if not isinstance(inputs, Mapping):
        raise TypeError(f"store inputs must be a mapping, got {type(inputs).__name__}")
    preimage = b"".join((STORE_HASH_DOMAIN, kind.encode(), b"\0", name.encode(), b"\0", canonical_json(inputs)))
    return nix_base32(blake3.blake3(preimage).digest(length=STORE_HASH_BYTES))


def store_path_name(hash: str, name: str) -> str:
    """``f"{hash}-{name}"``, the final component of a store path, both parts checked."""
    if len(hash) != STORE_HASH_CHARS or not _HASH_CHARS.issuperset(hash):
        raise ValueError(f"store hash {hash!r} must be {STORE_HASH_CHARS} Nix-base32 characters")
    return f"{hash}-{check_store_name(name)}"


# ------------------------------------------------------------------- NAR-like serialization


def _nar_str(data: bytes) -> bytes:
    """A NAR string: u64 little-endian length, the bytes, zero padding to 8."""
    return len(data).to_bytes(8, "little") + data + _padding(len(data))


def _padding(size: int) -> bytes:
    return b"\0" * (-size % 8)


_MAGIC = _nar_str(b"nix-archive-1")
_OPEN, _CLOSE = _nar_str(b"("), _nar_str(b")")
_TYPE = _nar_str(b"type")
_REGULAR = _OPEN + _TYPE + _nar_str(b"regular")
_EXECUTABLE = _nar_str(b"executable") + _nar_str(b"")
_CONTENTS = _nar_str(b"contents")
_SYMLINK = _OPEN + _TYPE + _nar_str(b"symlink") + _nar_str(b"target")
_DIRECTORY = _OPEN + _TYPE + _nar_str(b"directory")
_ENTRY, _NAME_TAG, _NODE = _nar_str(b"entry"), _nar_str(b"name"), _nar_str(b"node")


class _Contents:
    """A placeholder in the walk for a regular file's ``size`` bytes, read by the consumer;
    ``stat`` is the file's ``lstat`` (None where the caller made the placeholder)."""

    __slots__ = ("path", "size", "stat")

    def __init__(self, path: bytes, size: int, st: os.stat_result | None = None) -> None:
        self.path = path
        self.size = size
        self.stat = st


def _kind_of(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a fifo"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return f"an unknown file type (mode {mode:o})"


def _walk(path: bytes, st: os.stat_result, executable: int = stat.S_IXUSR) -> Iterator[bytes | _Contents]:
    """The NAR of the node at ``path`` (already lstat'ed), file contents as placeholders.
    ``executable``: the mode bits that make a file executable (see :func:`nar_digest`)."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        # Nix keeps only the owner's execute bit; everything else about modes is dropped.
        yield _REGULAR + (_EXECUTABLE if mode & executable else b"") + _CONTENTS
        yield st.st_size.to_bytes(8, "little")
        yield _Contents(path, st.st_size, st)
        yield _padding(st.st_size) + _CLOSE
    elif stat.S_ISLNK(mode):
        yield _SYMLINK + _nar_str(os.readlink(path)) + _CLOSE
    elif stat.S_ISDIR(mode):
        yield _DIRECTORY
        with os.scandir(path) as entries:
            names = sorted(entry.name for entry in entries)  # raw bytes order, as Nix
        for name in names:
            child = os.path.join(path, name)
            yield _ENTRY + _OPEN + _NAME_TAG + _nar_str(name) + _NODE
            yield from _walk(child, os.lstat(child), executable)
            yield _CLOSE
        yield _CLOSE
    else:
        shown = os.fsdecode(path)
        raise HashingError(
            f"cannot hash {shown}: it is {_kind_of(mode)}; "
            "only regular files, directories and symlinks can be hashed or stored"
        )


def _nar_pieces(path: str | os.PathLike[str], executable: int = stat.S_IXUSR) -> Iterator[bytes | _Contents]:
    root = os.fsencode(path)
    yield _MAGIC
    yield from _walk(root, os.lstat(root), executable)


def _open_checked(piece: _Contents) -> int:
    """Open the file behind ``piece``, refusing one that is no longer what was listed."""
    fd = os.open(piece.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != piece.size:
        os.close(fd)
        raise HashingError(f"{os.fsdecode(piece.path)} changed while it was being hashed")
    return fd


def _read_contents(piece: _Contents) -> Iterator[bytes]:
    fd = _open_checked(piece)
    try:
        left = piece.size
        while left:
            chunk = os.read(fd, min(left, _READ_CHUNK))
            if not chunk:
                raise HashingError(f"{os.fsdecode(piece.path)} shrank while it was being hashed")
            left -= len(chunk)
            yield chunk
    finally:
        os.close(fd)


def _hash_contents(hasher: Any, piece: _Contents, also: Any = None) -> None:
    """Feed a file's bytes to ``hasher`` (and to ``also``, when given, from the same read):
    mmap for large files, one read for small ones.

    A file truncated by another process while mapped would fault; the store hashes only
    paths it holds locked or has made read-only, so that is a misuse, not a case to handle.
    """
    if piece.size < _MMAP_THRESHOLD:
        for chunk in _read_contents(piece):
            hasher.update(chunk)
            if also is not None:
                also.update(chunk)
        return
    fd = _open_checked(piece)
    try:
        with mmap.mmap(fd, piece.size, access=mmap.ACCESS_READ) as view:
            if hasattr(view, "madvise"):
                view.madvise(mmap.MADV_SEQUENTIAL)
            hasher.update(view)
            if also is not None:
                also.update(view)
    finally:
        os.close(fd)


def _oserror(path: str | os.PathLike[str], exc: OSError) -> HashingError:
    return HashingError(
        f"cannot hash {os.fsdecode(path)}: {exc.strerror or exc} "
        f"({os.fsdecode(exc.filename) if exc.filename else 'unknown file'})"
    )


def iter_nar(path: str | os.PathLike[str]) -> Iterator[bytes]:
    """Stream the NAR serialization of ``path`` (not following a symlink at the root).

    Byte-identical to Nix's ``nix-store --dump``: directory entries sorted by raw name
    bytes, regular files as executable-or-not plus length-prefixed contents, symlinks by
    their target string, nothing else (no times, owners or other mode bits). Raises
    :class:`HashingError` for fifos, sockets and devices, and when a file changes under it.
    """
    try:
        for piece in _nar_pieces(path):
            if isinstance(piece, _Contents):
                yield from _read_contents(piece)
            else:
                yield piece
    except OSError as exc:
        raise _oserror(path, exc) from None


class NarDigest(tuple[str, int]):
    """The content hash of a path (``"blake3:<hex>"``) and the length of its NAR serialization:
    a named pair, as a NamedTuple would be, without importing typing (see the module doc)."""

    __slots__ = ()

    def __new__(cls, hash: str, nar_size: int) -> NarDigest:
        return super().__new__(cls, (hash, nar_size))

    @property
    def hash(self) -> str:
        return self[0]

    @property
    def nar_size(self) -> int:
        return self[1]

    def __repr__(self) -> str:
        return f"NarDigest(hash={self[0]!r}, nar_size={self[1]!r})"

    def __getnewargs__(self) -> tuple[str, int]:  # pickle and copy call __new__ with these
        return (self[0], self[1])


def nar_digest(path: str | os.PathLike[str], *, files: Any = None) -> NarDigest:
    """blake3 of ``iter_nar(path)`` and its length, hashing large files multithreaded.

    ``files`` (the store's file sharing, ``Store._share_and_hash``) sees every regular file
    from the same read: ``files.wants(path, stat)`` says whether it wants the file's own
    blake3, which ``files.add(path, stat, hex digest)`` then receives. With ``files`` the path
    is hashed as :func:`harness.store.store.canonicalize` will leave it, not as it is: a file
    with *any* execute bit is executable (canonicalize makes it 0555), so the digest is the
    one a walk after canonicalizing computes."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    size = 0
    executable = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH if files is not None else stat.S_IXUSR
    try:
        pending: list[bytes] = []
        for piece in _nar_pieces(path, executable):
            if isinstance(piece, _Contents):
                # Small structural pieces are joined so blake3 sees few, larger updates.
                hasher.update(b"".join(pending))
                pending.clear()
                if files is not None and files.wants(piece.path, piece.stat):
                    # Threads only where they pay (as for the path's own hasher's large files).
                    own = blake3.blake3(max_threads=blake3.blake3.AUTO if piece.size >= _MMAP_THRESHOLD else 1)
                    _hash_contents(hasher, piece, own)
                    files.add(piece.path, piece.stat, own.hexdigest())
                else:
                    _hash_contents(hasher, piece)
                size += piece.size
            else:
                pending.append(piece)
                size += len(piece)
        hasher.update(b"".join(pending))
    except OSError as exc:
        raise _oserror(path, exc) from None
    return NarDigest(f"blake3:{hasher.hexdigest()}", size)


def content_hash(path: str | os.PathLike[str]) -> str:
    """``"blake3:<hex>"`` of the NAR serialization of ``path`` (see :func:`iter_nar`)."""
    return nar_digest(path).hash


# ------------------------------------------------------------------------------ flat files


def file_blake3(path: str | os.PathLike[str]) -> str:
    """The blake3 of a regular file's bytes as bare hex, as ``b3sum`` prints it."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise HashingError(f"cannot hash {os.fsdecode(path)}: not a regular file")
        _hash_contents(hasher, _Contents(os.fsencode(os.path.realpath(path)), st.st_size))
    except OSError as exc:
        raise _oserror(path, exc) from None
    return hasher.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes as bare hex, the form locks record (``sha256sum``)."""
    import hashlib  # lazy: loading OpenSSL costs start-up that blake3-only commands (verify) never use

    digest = hashlib.sha256()
    buffer = bytearray(_READ_CHUNK)
    view = memoryview(buffer)
    try:
        with open(path, "rb", buffering=0) as handle:
            while count := handle.readinto(buffer):
                digest.update(view[:count])
    except OSError as exc:
        raise _oserror(path, exc) from None
    return digest.hexdigest()


__all__ = [
    "NIX_BASE32_ALPHABET",
    "STORE_HASH_CHARS",
    "STORE_HASH_DOMAIN",
    "STORE_NAME_MAX",
    "HashingError",
    "NarDigest",
    "canonical_json",
    "check_store_name",
    "content_hash",
    "file_blake3",
    "file_sha256",
    "iter_nar",
    "nar_digest",
    "nix_base32",
    "sanitize_name",
    "store_hash",
    "store_path_name",
]
