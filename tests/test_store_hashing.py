"""The store's hash scheme: every golden vector in store/README.md, and content hash laws.

The vectors are read from the README itself (the specification), so the two cannot drift.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

from harness.store.hashing import (
    STORE_HASH_DOMAIN,
    STORE_NAME_MAX,
    HashingError,
    canonical_json,
    check_store_name,
    content_hash,
    file_blake3,
    file_sha256,
    iter_nar,
    nar_digest,
    nix_base32,
    sanitize_name,
    store_hash,
    store_path_name,
)
from tests.conftest import REPO

SPEC = REPO / "store" / "README.md"
_BLOCK = re.compile(r"^```vector (\w+)\n(.*?)^```$", re.S | re.M)


def _parse_vectors() -> list[tuple[str, dict[str, list[Any]]]]:
    """Every ``vector`` block of the spec as (kind, {key: [values in order]})."""
    vectors = []
    for kind, body in _BLOCK.findall(SPEC.read_text(encoding="utf-8")):
        fields: dict[str, list[Any]] = {}
        for line in body.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            key, _, raw = line.partition(": ")
            value = raw if key == "canonical" else json.loads(raw)
            fields.setdefault(key, []).append(value)
        vectors.append((kind, fields))
    return vectors


VECTORS = _parse_vectors()


def _of(kind: str) -> list[dict[str, list[Any]]]:
    return [fields for k, fields in VECTORS if k == kind]


def test_spec_has_every_kind_of_vector() -> None:
    counts = {
        kind: len(_of(kind))
        for kind in (
            "canonical_json",
            "canonical_json_rejects",
            "nix_base32",
            "store_hash",
            "store_name",
            "content_hash",
            "file_hashes",
        )
    }
    assert all(counts.values()), counts
    assert len(VECTORS) == sum(counts.values()), "a vector block of an unknown kind"


@pytest.mark.parametrize("vector", _of("canonical_json"))
def test_canonical_json_vectors(vector: dict[str, list[Any]]) -> None:
    assert canonical_json(vector["input"][0]) == vector["canonical"][0].encode("utf-8")


@pytest.mark.parametrize("value", _of("canonical_json_rejects")[0]["input"])
def test_canonical_json_rejects_vectors(value: Any) -> None:
    with pytest.raises(ValueError):
        canonical_json(value)


@pytest.mark.parametrize("vector", _of("nix_base32"))
def test_nix_base32_vectors(vector: dict[str, list[Any]]) -> None:
    assert nix_base32(bytes.fromhex(vector["hex"][0])) == vector["base32"][0]


@pytest.mark.parametrize("vector", _of("store_hash"))
def test_store_hash_vectors(vector: dict[str, list[Any]]) -> None:
    kind, name, inputs = vector["kind"][0], vector["name"][0], vector["inputs"][0]
    preimage = STORE_HASH_DOMAIN + f"{kind}\0{name}\0".encode() + canonical_json(inputs)
    assert preimage == vector["preimage"][0].encode("utf-8")
    digest = store_hash(kind, name, inputs)
    assert digest == vector["hash"][0]
    assert len(digest) == 32
    assert store_path_name(digest, name) == vector["path_name"][0]


@pytest.mark.parametrize("vector", _of("store_name"))
def test_store_name_vectors(vector: dict[str, list[Any]]) -> None:
    assert sanitize_name(vector["text"][0]) == vector["name"][0]


def _build(root: Path, vector: dict[str, list[Any]]) -> None:
    """Create the file, symlink or tree a content_hash vector describes at ``root``."""
    node = vector["root"][0]
    if node["type"] == "symlink":
        root.symlink_to(node["target"])
    elif node["type"] in ("file", "executable"):
        _write(root, node)
    else:
        root.mkdir()
        for entry in vector.get("entry", []):
            path = root / entry["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            if entry["type"] == "directory":
                path.mkdir(exist_ok=True)
            elif entry["type"] == "symlink":
                path.symlink_to(entry["target"])
            else:
                _write(path, entry)


def _write(path: Path, node: dict[str, Any]) -> None:
    path.write_bytes(node["contents"].encode("utf-8"))
    path.chmod(0o755 if node["type"] == "executable" else 0o644)


@pytest.mark.parametrize("vector", _of("content_hash"))
def test_content_hash_vectors(vector: dict[str, list[Any]], tmp_path: Path) -> None:
    root = tmp_path / "root"
    _build(root, vector)
    nar = b"".join(iter_nar(root))
    assert len(nar) == vector["nar_size"][0]
    if "nar_hex" in vector:
        assert nar.hex() == vector["nar_hex"][0]
    assert content_hash(root) == vector["hash"][0]
    assert nar_digest(root).nar_size == len(nar)


@pytest.mark.parametrize("vector", _of("file_hashes"))
def test_file_hash_vectors(vector: dict[str, list[Any]], tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(vector["contents"][0].encode("utf-8"))
    assert file_sha256(path) == vector["sha256"][0]
    assert file_blake3(path) == vector["blake3"][0]


# ----------------------------------------------------------------------- canonical JSON


def test_canonical_json_refuses_what_it_cannot_represent_exactly() -> None:
    with pytest.raises(TypeError):
        canonical_json({1: "a"})  # json.dumps would merge it with the key "1"
    with pytest.raises(TypeError):
        canonical_json({"a": {1, 2}})
    with pytest.raises(TypeError):
        canonical_json({"a": b"bytes"})
    with pytest.raises(ValueError):
        canonical_json({"a": "\ud800"})  # a lone surrogate has no UTF-8
    with pytest.raises(ValueError):
        canonical_json([math.inf])


def test_canonical_json_treats_tuples_as_arrays_and_bools_as_bools() -> None:
    assert canonical_json({"a": (1, True, False)}) == b'{"a":[1,true,false]}'


# --------------------------------------------------------------------- hashes and names


def test_store_hash_separates_kind_name_and_inputs() -> None:
    base = store_hash("source", "x", {"a": 1})
    assert store_hash("source", "x", {"a": 1}) == base
    assert store_hash("wheel", "x", {"a": 1}) != base
    assert store_hash("source", "y", {"a": 1}) != base
    assert store_hash("source", "x", {"a": 2}) != base
    assert store_hash("source", "x", {"a": "1"}) != base
    assert set(base) <= set("0123456789abcdfghijklmnpqrsvwxyz")


@pytest.mark.parametrize(
    "kind,name",
    [
        ("Source", "x"),
        ("", "x"),
        ("source", ".x"),
        ("source", "a/b"),
        ("source", ""),
        ("source", "x" * (STORE_NAME_MAX + 1)),
        # A trailing newline, which a regular expression's ``$`` would let through.
        ("source\n", "x"),
        ("source", "x\n"),
        ("-source", "x"),
    ],
)
def test_store_hash_refuses_bad_kind_or_name(kind: str, name: str) -> None:
    with pytest.raises(ValueError):
        store_hash(kind, name, {})


def test_store_names() -> None:
    assert check_store_name("numpy-2.1.0+cpu_x") == "numpy-2.1.0+cpu_x"
    assert len(sanitize_name("y" * 500)) == STORE_NAME_MAX
    for bad in ("", "..."):
        with pytest.raises(ValueError):
            sanitize_name(bad)
    with pytest.raises(ValueError):
        check_store_name("a/b")
    with pytest.raises(ValueError):
        store_path_name("E" * 32, "x")  # 'e' is not in Nix's alphabet, nor are capitals
    with pytest.raises(ValueError):
        store_path_name("0" * 31, "x")
    for bad_hash in ("0" * 31 + "\n", "0" * 32 + "\n", "0" * 33):
        with pytest.raises(ValueError):
            store_path_name(bad_hash, "x")
    for bad_name in ("x\n", "x y", ".x", "x\u00e9"):
        with pytest.raises(ValueError):
            check_store_name(bad_name)
    assert sanitize_name("torch 2.7 (cu128)\n") == "torch-2.7-cu128-"


def test_nix_base32_matches_nix_reference_loop() -> None:
    """Nix's own encoder (libutil), transcribed, agrees on assorted lengths and bytes."""
    alphabet = "0123456789abcdfghijklmnpqrsvwxyz"

    def nix(data: bytes) -> str:
        length = (len(data) * 8 - 1) // 5 + 1
        out = []
        for n in range(length - 1, -1, -1):
            i, j = n * 5 // 8, n * 5 % 8
            c = data[i] >> j | (0 if i >= len(data) - 1 else data[i + 1] << (8 - j))
            out.append(alphabet[c & 0x1F])
        return "".join(out)

    for size in (1, 2, 3, 5, 19, 20, 32, 64):
        for seed in range(8):
            data = bytes((seed * 37 + k * 101 + size) % 256 for k in range(size))
            assert nix_base32(data) == nix(data)


# ------------------------------------------------------------------------ content hash


def _tree(root: Path) -> Path:
    root.mkdir()
    (root / "a").write_bytes(b"hello\n")
    (root / "bin").mkdir()
    (root / "bin" / "run").write_bytes(b"#!/bin/sh\necho run\n")
    (root / "bin" / "run").chmod(0o755)
    (root / "link").symlink_to("a")
    return root


def test_content_hash_ignores_times_modes_and_creation_order(tmp_path: Path) -> None:
    first = _tree(tmp_path / "first")
    second = tmp_path / "second"
    second.mkdir()
    (second / "link").symlink_to("a")
    (second / "bin").mkdir(mode=0o700)
    (second / "bin" / "run").write_bytes(b"#!/bin/sh\necho run\n")
    (second / "bin" / "run").chmod(0o500)  # other bits differ, the owner-x bit is the same
    (second / "a").write_bytes(b"hello\n")
    (second / "a").chmod(0o600)
    os.utime(second / "a", (1, 1))
    os.utime(second / "bin", (2_000_000_000, 2_000_000_000))
    assert content_hash(first) == content_hash(second)
    # The root's own name is not part of its content.
    assert content_hash(first / "a") == content_hash(second / "a")


def test_content_hash_changes_with_one_byte(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    before = content_hash(root)
    (root / "a").write_bytes(b"hellp\n")
    assert content_hash(root) != before


def test_content_hash_changes_with_the_executable_bit(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    before = content_hash(root)
    (root / "a").chmod(0o744)
    assert content_hash(root) != before
    (root / "a").chmod(0o644)
    assert content_hash(root) == before


def test_content_hash_changes_with_a_symlink_target_and_a_name(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    before = content_hash(root)
    (root / "link").unlink()
    (root / "link").symlink_to("bin/run")
    assert content_hash(root) != before
    (root / "link").unlink()
    (root / "link").symlink_to("a")
    assert content_hash(root) == before
    (root / "a").rename(root / "b")
    assert content_hash(root) != before


def test_content_hash_keeps_an_empty_directory(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    before = content_hash(root)
    (root / "empty").mkdir()
    assert content_hash(root) != before


def test_content_hash_refuses_a_fifo(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    os.mkfifo(root / "bin" / "pipe")
    with pytest.raises(HashingError, match=r"pipe: it is a fifo"):
        content_hash(root)
    with pytest.raises(HashingError, match="fifo"):
        b"".join(iter_nar(root))


def test_content_hash_of_a_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HashingError, match="cannot hash"):
        content_hash(tmp_path / "absent")


def test_large_files_hash_the_same_through_mmap_and_stream(tmp_path: Path) -> None:
    """Files past the mmap threshold take the multithreaded path; both agree with the NAR."""
    import blake3

    root = tmp_path / "t"
    root.mkdir()
    payload = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB, not a multiple of 8
    (root / "big").write_bytes(payload)
    (root / "small").write_bytes(payload[:1000])
    nar = b"".join(iter_nar(root))
    assert content_hash(root) == "blake3:" + blake3.blake3(nar).hexdigest()
    assert nar_digest(root).nar_size == len(nar)
    assert file_blake3(root / "big") == blake3.blake3(payload).hexdigest()


def test_a_nar_digest_is_a_named_pair_that_pickles_and_copies(tmp_path: Path) -> None:
    """NarDigest is a plain named pair (not typing's NamedTuple, to keep the early verify
    light): unpacked, compared, printed, pickled and copied as one would be."""
    import copy
    import pickle

    (tmp_path / "f").write_bytes(b"x" * 10)
    digest = nar_digest(tmp_path / "f")
    content, size = digest
    assert (digest.hash, digest.nar_size) == (content, size) and digest == (content, size)
    assert repr(digest) == f"NarDigest(hash={content!r}, nar_size={size!r})"
    for again in (pickle.loads(pickle.dumps(digest)), copy.deepcopy(digest), copy.copy(digest)):
        assert type(again) is type(digest) and again == digest and again.hash == content
