"""Integrity at launch: is every file a process is about to run from still what was registered?

``harness store verify --contents`` re-hashes every byte, which for a closure with 10 GB of
weights takes seconds to minutes: too slow before every service start. The launch check
does what git's index does instead. For each registered path the store keeps a
*fingerprint* (``store/.stat/<name>.json``): every entry's inode, size, mode, mtime and
ctime, taken when the path was registered (the store made those times itself, under the
path's lock) or when a later re-hash proved the bytes unchanged. A launch ``lstat``s every
entry and compares:

* all equal → the bytes are the registered ones (``verified = "stat"``). A store file is
  read-only with mtime 1, so changing its bytes means a ``chmod`` or a write, both of which
  set the ctime to *now*; resetting the mtime (``touch -d``) sets it too, and adding or
  removing an entry changes its directory's times;
* anything differs, or there is no fingerprint (a path pulled from a binary cache, a store
  from before fingerprints) → the whole path is re-hashed and compared with the record's
  content hash: equal → ``verified = "hash"`` and the fingerprint is refreshed; different →
  :class:`IntegrityError` naming the files whose metadata changed.

Legitimate operations change ctimes too (a new environment hard-linking an older one's files
into the ``.links`` pool changes their link count): those cost one re-hash of the path, never
a wrong answer. A fingerprint is a per-machine cache (inode numbers mean nothing elsewhere),
never part of a path's content, and one that cannot be written costs only time. A refreshed
fingerprint is not written while any entry changed within ``RACY_NS``
(:mod:`harness.store.fingerprint`: a write in the same clock tick could leave the times
unchanged), as for :mod:`harness.store.statcache`.

:func:`check_closure` is the one entry point: the supervisor calls it before it starts a
service and ``harness run`` before the benchmark's worker; what it returns is what the run
record keeps (``launch-checks.jsonl``), so ``harness audit`` judges a run by the bytes it ran
with, whatever happens to the store later.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError
from harness.store.fingerprint import racy, take_fingerprint
from harness.store.statfile import changed_entries, write_fingerprint

if TYPE_CHECKING:
    from harness.store.store import Store

#: The file (in a service state folder) that keeps each launch's check, one JSON per line.
LAUNCH_CHECKS = "launch-checks.jsonl"

#: How many changed files a refusal names.
_NAMED = 10


class IntegrityError(HarnessError):
    """A store path about to be launched is not what was registered.

    ``path`` is its store name, ``files`` the entries (relative to the store) whose metadata
    changed, ``expected``/``found`` the registered and the actual content hash.
    """

    def __init__(self, path: str, files: list[str], expected: str, found: str) -> None:
        shown = ", ".join(files[:_NAMED]) + (f" and {len(files) - _NAMED} more" if len(files) > _NAMED else "")
        what = f"changed: {shown}" if files else "its content changed"
        super().__init__(
            f"store path {path} is not what was registered ({what}; expected {expected}, found {found})",
            hint="`harness store verify --repair` restores it from its sources; nothing was launched",
        )
        self.path = path
        self.files = files
        self.expected = expected
        self.found = found


@dataclass(frozen=True)
class PathCheck:
    """One verified store path: its registered content hash and how it was verified."""

    path: str
    content: str
    verified: str  # "stat" (fingerprint unchanged) or "hash" (re-hashed, equal)


def check_path(store_root: Path, name: str, content: str) -> PathCheck:
    """Verify one registered path against its content hash ``content`` (see the module doc)."""
    from harness.store.hashing import HashingError, nar_digest

    changed = changed_entries(store_root, name, content)
    if changed == []:
        return PathCheck(name, content, "stat")
    path = store_root / name
    if not os.path.lexists(path):
        raise IntegrityError(name, [name], content, "nothing (the path is gone)")
    before = take_fingerprint(path)
    try:
        found = nar_digest(path).hash
    except HashingError as exc:
        raise IntegrityError(name, changed or [], content, exc.message) from None
    if found != content:
        raise IntegrityError(name, changed or [], content, found)
    after = take_fingerprint(path)
    if after == before and not racy(after[1]):
        write_fingerprint(store_root, name, content, after)
    return PathCheck(name, content, "hash")


def runtime_closure(store: Store, roots: Iterable[str]) -> list[str]:
    """``roots`` and every path they reference, transitively (sorted). A root or reference
    that is not registered is an :class:`IntegrityError`: nothing may launch from it."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        record = store.record(name)
        if record is None:
            untrusted = store.untrusted_owner(name)
            if untrusted is not None:
                from harness.store.store import user_name

                found = f"a path registered by {user_name(untrusted)}, whom you do not trust in this shared store"
                raise IntegrityError(name, [], "a path registered by a member you trust", found)
            raise IntegrityError(name, [], "a registered path", "no registered path of that name")
        todo.extend(record.references)
    return sorted(seen)


def check_closure(store_root: Path, roots: Iterable[str]) -> list[PathCheck]:
    """Check ``roots`` and everything they reference before a launch; raise on the first
    changed path (:class:`IntegrityError`, naming its changed files)."""
    from harness.store.store import Store

    store = Store(store_root)
    checks = []
    for name in runtime_closure(store, roots):
        record = store.record(name)
        assert record is not None  # runtime_closure checked
        checks.append(check_path(store_root, name, record.content))
    return checks


def log_launch(
    state_dir: Path, what: str, checks: list[PathCheck] | None = None, refused: IntegrityError | None = None
) -> None:
    """Append one launch's check to ``<state_dir>/launch-checks.jsonl`` (see :func:`read_launches`)."""
    entry: dict[str, Any] = {"launch": what, "at": time.time()}
    if checks is not None:
        entry["paths"] = {c.path: {"content": c.content, "verified": c.verified} for c in checks}
    if refused is not None:
        entry["refused"] = {
            "path": refused.path,
            "files": refused.files,
            "expected": refused.expected,
            "found": refused.found,
        }
    state_dir.mkdir(parents=True, exist_ok=True)
    # One short line per launch with O_APPEND: concurrent launches never interleave lines.
    with open(state_dir / LAUNCH_CHECKS, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry, sort_keys=True) + "\n")


def read_launches(state_dir: Path) -> Iterator[dict[str, Any]]:
    """The entries :func:`log_launch` wrote, oldest first (a torn last line is skipped)."""
    from harness.store.entries import read_regular

    raw = read_regular(state_dir / LAUNCH_CHECKS)  # never a link, a fifo, a huge file
    for line in raw.decode("utf-8", errors="replace").splitlines() if raw is not None else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


def checked_launch(state_dir: Path, what: str, closure: Iterable[str]) -> list[PathCheck]:
    """:func:`check_closure` of absolute store paths ``closure`` (all in one store), logged
    to ``state_dir`` whichever way it ends. Empty ``closure`` checks and logs nothing."""
    paths = [Path(p) for p in closure]
    if not paths:
        return []
    store_root = paths[0].parent
    try:
        checks = check_closure(store_root, [p.name for p in paths])
    except IntegrityError as exc:
        log_launch(state_dir, what, refused=exc)
        raise
    log_launch(state_dir, what, checks)
    return checks
