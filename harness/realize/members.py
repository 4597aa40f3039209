"""Another member's fixed-output paths, checked against the lock before this user uses them.

In a shared store (``harness/store/trust.py``) a path registered by a member this user does
not trust is not registered for this user, and this user cannot replace it either (the store
is sticky). Where the lock says what the bytes must be, realize checks them instead, once:

* a wheel or an sdist (a folder holding the one file ``<file name>``): that file alone, its
  size and sha256 the lock's;
* a weight set: exactly the lock's files (no other file, no link), each of the lock's size
  and sha256;

and in both cases the record's content hash must be the path's (one NAR hash), since that is
what the launch check later holds the bytes to. A path that passes is vouched for
(:func:`harness.store.trust.vouch`); one that fails is a StoreError naming the path, its
owner, the file and both hashes. Derived paths (interpreters, environments, sources, views,
code) stay refused: only trust says whose build to run.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from harness.store.store import Store, StoreError, user_name

if TYPE_CHECKING:
    from harness.lock.document import Lock


def check_members_paths(store: Store, locks: list[Lock]) -> list[str]:
    """Check and vouch for every fixed-output path of ``locks`` that a member this user does
    not trust registered; returns the names vouched for now. StoreError on the first that
    does not hold what the lock says (nothing is vouched for it)."""
    if not store.trust.shared:
        return []
    vouched: list[str] = []
    for name, expected in _fixed_outputs(locks):
        uid = store.untrusted_owner(name)
        if uid is None:
            continue
        record = store.record(name, any_member=True)
        if record is None:
            continue  # a leftover without a record: add() refuses it by name
        _check(store, name, expected, user_name(uid))
        from harness.store.hashing import nar_digest
        from harness.store.trust import vouch

        found = nar_digest(store.root / name).hash
        if found != record.content:
            raise StoreError(
                f"{store.root / name}, registered by {user_name(uid)}, holds what the lock says, but its record "
                f"claims other content ({record.content}, the path hashes to {found}); harness does not use it"
            )
        vouch(store.root, name, record.content)
        vouched.append(name)
    return vouched


def _fixed_outputs(locks: list[Lock]) -> Iterator[tuple[str, dict[str, tuple[int, str]]]]:
    """Each fixed-output store name of ``locks`` with the files it must hold: relative path →
    (size, sha256)."""
    from harness.lock.objects import chosen_file

    seen: set[str] = set()
    for lock in locks:
        for package in [*lock.packages, *lock.build_packages]:
            file = chosen_file(package, lock)
            if file.store not in seen:
                seen.add(file.store)
                yield file.store, {file.file: (file.size, file.sha256)}
        for weights in lock.weights:
            if weights.store not in seen:
                seen.add(weights.store)
                yield weights.store, {f.path: (f.size, f.sha256) for f in weights.files}


def _check(store: Store, name: str, expected: dict[str, tuple[int, str]], owner: str) -> None:
    from harness.store.hashing import file_sha256

    root = store.root / name
    found: dict[str, os.stat_result] = {}
    for folder, dirs, files in os.walk(root):
        for entry in [*dirs, *files]:
            path = Path(folder, entry)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                continue
            rel = path.relative_to(root).as_posix()
            if not stat.S_ISREG(st.st_mode) or rel not in expected:
                raise StoreError(
                    f"{root}, registered by {owner}, holds {rel!r}, which the lock does not name; harness does not use it"
                )
            found[rel] = st
    for rel, (size, sha256) in sorted(expected.items()):
        held = found.get(rel)
        if held is None:
            raise StoreError(f"{root}, registered by {owner}, lacks {rel}; harness does not use it")
        actual = file_sha256(root / rel) if held.st_size == size else f"a file of {held.st_size} bytes"
        if actual != sha256:
            raise StoreError(
                f"{root}, registered by {owner}: {rel} is not the lock's: expected sha256 {sha256}, found {actual}; "
                "harness does not use it"
            )
