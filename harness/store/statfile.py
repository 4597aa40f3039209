"""The fingerprint a registered path keeps in the store (``.stat/<name>.json``): written when
the path is registered (:meth:`harness.store.store.Store.commit`) and after a re-hash that
found it unchanged, read by the launch check (:mod:`harness.store.launchcheck`) to name the
entries whose stat figures moved since.

Below both the store and the launch check, so neither imports the other for it; the
fingerprint itself (what is taken) is :mod:`harness.store.fingerprint`.
"""

from __future__ import annotations

import array
import base64
import json
import os
import sys
import tempfile
from pathlib import Path

from harness.store.fingerprint import Entry, take_fingerprint

#: Folder of fingerprints inside the store (beside ``.meta``; never globbed as records).
FINGERPRINT_DIR = ".stat"
FINGERPRINT_VERSION = 2


def fingerprint_path(store_root: Path, name: str) -> Path:
    return store_root / FINGERPRINT_DIR / f"{name}.json"


def own_fingerprint_path(store_root: Path, name: str) -> Path:
    """This user's fingerprint of ``name``: the path's own (``.stat/<name>.json``) when this
    user registered it, else one of this user's (``.stat/<name>.<uid>.json``). Only a
    fingerprint this user (or root) took is ever believed: another member's path is theirs
    to change (its files are theirs to ``chmod``), and a fingerprint its owner took after a
    change would pass the change off as the bytes this user checked."""
    try:
        mine = os.lstat(store_root / name).st_uid == os.geteuid()
    except OSError:
        mine = True
    return fingerprint_path(store_root, name) if mine else store_root / FINGERPRINT_DIR / f"{name}.{os.geteuid()}.json"


def write_fingerprint(
    store_root: Path, name: str, content: str, taken: tuple[int, dict[str, Entry]] | None = None
) -> bool:
    """Remember ``name``'s fingerprint (taken now unless given); False when it cannot be
    written (a read-only or group store: the next launch re-hashes instead).

    The file is JSON with the entries' relative paths as one list and their stat figures as
    one base64 string of native 64-bit integers (five per entry): an environment has tens of
    thousands of entries, and parsing that many small JSON arrays would cost more than
    ``lstat``-ing them.
    """
    device, entries = taken if taken is not None else take_fingerprint(store_root / name)
    paths = sorted(entries)
    figures = array.array("q", (value for rel in paths for value in entries[rel]))
    target = own_fingerprint_path(store_root, name)
    temp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{name[:40]}.", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "version": FINGERPRINT_VERSION,
                    "name": name,
                    "content": content,
                    "device": device,
                    "byteorder": sys.byteorder,
                    "paths": paths,
                    "stats": base64.b64encode(figures.tobytes()).decode("ascii"),
                },
                handle,
                separators=(",", ":"),
            )
        os.replace(temp, target)
        return True
    except OSError:
        if temp is not None:
            Path(temp).unlink(missing_ok=True)
        return False


def changed_entries(store_root: Path, name: str, content: str) -> list[str] | None:
    """Entries whose stat differs from the fingerprint ([] = none), or None without a usable one.

    Usable means: a regular file (not followed through a link) that this user (or root) wrote,
    at :func:`own_fingerprint_path`: in a shared store another member could plant one for a
    path they did not register, or take one of their own path after changing it."""
    from harness.store.entries import BadEntry, read_entry

    try:
        raw, st = read_entry(own_fingerprint_path(store_root, name), limit=1 << 28)
        if st.st_uid not in (os.geteuid(), 0):
            return None
        data = json.loads(raw.decode("utf-8"))
        if (
            not isinstance(data, dict)
            or data.get("version") != FINGERPRINT_VERSION
            or data.get("content") != content
            or data.get("byteorder") != sys.byteorder
        ):
            return None
        paths = data["paths"]
        expected = array.array("q")
        expected.frombytes(base64.b64decode(data["stats"]))
    except (OSError, BadEntry, UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(paths, list) or len(expected) != 5 * len(paths) or "" not in paths:
        return None
    root = os.fspath(store_root / name)
    try:
        if os.lstat(root).st_dev != data.get("device"):
            return None  # another filesystem (a copied store): inodes say nothing
    except FileNotFoundError:
        return [name]
    # The fast path is one lstat per entry and one comparison of two arrays in C.
    actual = array.array("q")
    missing: set[int] = set()
    lstat = os.lstat
    for index, rel in enumerate(paths):
        try:
            st = lstat(f"{root}/{rel}" if rel else root)
        except OSError:
            missing.add(index)
            actual.extend((-1, -1, -1, -1, -1))
            continue
        actual.extend((st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns))
    if actual == expected and not missing:
        return []
    return [
        f"{name}/{rel}" if rel else name
        for index, rel in enumerate(paths)
        if index in missing or actual[5 * index : 5 * index + 5] != expected[5 * index : 5 * index + 5]
    ]
