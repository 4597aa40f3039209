"""``harness runs prune``: remove old run records, like ``nix-collect-garbage --delete-older-than``.

Which records go (:func:`plan_prune`, which deletes nothing):

* ``keep`` N: the newest N records (by id, which sorts by start time) stay; older ones may go;
* ``older_than`` DAYS: a record whose run started DAYS or more ago may go;
* given both, a record goes only when both say so (it is beyond the newest N *and* old).

Whatever the options, a record never goes when it is

* **pinned** (``harness runs pin``): its owner asked to keep it;
* **in progress**: a live process holds its closure as temporary gc roots labelled
  ``harness run <id>`` (:mod:`harness.store.roots`; ``harness run`` takes them before it
  writes ``config.json`` and drops them after ``result.json``), told by the holder's
  ``flock``, which the kernel drops however the process ends;
* **another member's**, in a home a lab shares: ``runs/`` is sticky there
  (:mod:`harness.store.shared`), so only a record's owner (or root) can move it;
* **without ``result.json``** unless ``older_than`` is given, the run is that old, and no live
  process holds it: such a record is a run still starting (before its roots are taken) or
  one killed with SIGKILL, and an age is the only safe way to tell the two apart.

Removing a record is atomic (:func:`remove_runs`): the folder is renamed into
``runs/.trash/`` (one ``rename``: the record is whole or gone, never half there for
``harness audit`` or ``harness diff`` to misread), then deleted there. A crash mid-delete
leaves only trash, which the next prune empties. Nothing here touches the store: the store
paths that only removed runs used become collectable by ``harness store gc``, whose
``[gc] keep-runs`` counts the records that exist.
"""

from __future__ import annotations

import calendar
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.runs.record import run_folders, runs_dir

#: Where records are moved to be deleted: inside ``runs/`` so the rename never crosses a
#: file system; its leading dot keeps it out of every listing.
TRASH = ".trash"


@dataclass(frozen=True)
class Candidate:
    """One run record, as prune judges it."""

    id: str
    path: Path
    started: float | None  # the run's start (from its id), None when the id is not a run id
    verdict: str  # "remove", or why it stays: "newest", "recent", "pinned", "in progress", ...


@dataclass
class PrunePlan:
    """What a prune would do: each record's verdict, newest first."""

    records: list[Candidate] = field(default_factory=list)

    @property
    def to_remove(self) -> list[Candidate]:
        return [c for c in self.records if c.verdict == "remove"]

    def kept(self, verdict: str) -> int:
        return sum(1 for c in self.records if c.verdict == verdict)


@dataclass(frozen=True)
class Removed:
    id: str
    bytes: int


def started_from_id(run_id: str) -> float | None:
    """A run's start time from its id (``20261201-034512-123-ab12``, UTC; see
    :func:`harness.runs.record.new_run_id`), or None when ``run_id`` is not of that form."""
    parts = run_id.split("-")
    if len(parts) < 3 or not parts[2].isdigit():
        return None
    try:
        stamp = time.strptime(f"{parts[0]}-{parts[1]}", "%Y%m%d-%H%M%S")
    except ValueError:
        return None
    return calendar.timegm(stamp) + int(parts[2]) / 1000


def _started(run: Path) -> float | None:
    """When the run started: its id says so without reading anything; a folder named
    otherwise falls back to its modification time."""
    started = started_from_id(run.name)
    if started is not None:
        return started
    try:
        return run.stat().st_mtime
    except OSError:
        return None


def live_runs(home: Path) -> set[str]:
    """The ids of the runs some live process holds (``harness run``'s temporary roots,
    labelled ``harness run <id>``; a cluster's head and shards alike)."""
    from harness.store.roots import live_holders
    from harness.store.store import Store

    store = Store.in_home(home)
    if not store.roots_dir.is_dir():
        return set()
    ids: set[str] = set()
    for holder in live_holders(store):
        words = holder.label.split()
        if len(words) >= 3 and words[:2] == ["harness", "run"]:
            ids.add(words[2])
    return ids


def plan_prune(home: Path, *, keep: int | None, older_than: float | None, now: float | None = None) -> PrunePlan:
    """Each run record's verdict under ``keep`` (newest N stay) and ``older_than`` (days).

    At least one of the two must be given (the caller checks; with neither nothing goes).
    Reads each folder's listing, ``pinned`` and ``result.json`` presence, never a record's
    JSON: judging thousands of records costs a few stats each.
    """
    now = time.time() if now is None else now
    cutoff = now - older_than * 86400 if older_than is not None else None
    live = live_runs(home)
    others = _others_records(home)
    plan = PrunePlan()
    for index, run in enumerate(run_folders(home)):
        started = _started(run)
        old = cutoff is not None and started is not None and started <= cutoff
        if keep is None and older_than is None:
            verdict = "kept"
        elif keep is not None and index < keep:
            verdict = "newest"
        elif older_than is not None and not old:
            verdict = "recent"
        elif (run / "pinned").is_file():
            verdict = "pinned"
        elif run.name in live:
            verdict = "in progress"
        elif others(run):
            verdict = "another member's"
        elif older_than is None and not (run / "result.json").is_file():
            # Still starting, or killed: only an age given explicitly lets it go.
            verdict = "no result"
        else:
            verdict = "remove"
        plan.records.append(Candidate(run.name, run, started, verdict))
    return plan


def _others_records(home: Path) -> Callable[[Path], bool]:
    """Whether a record is one this user cannot move: another user's in a sticky ``runs/``
    (a shared home's) where this user is not root; none elsewhere."""
    me = os.geteuid()
    try:
        sticky = bool(os.stat(runs_dir(home)).st_mode & stat.S_ISVTX)
    except OSError:
        sticky = False
    if not sticky or me == 0:
        return lambda _run: False

    def theirs(run: Path) -> bool:
        try:
            return os.lstat(run).st_uid != me
        except OSError:
            return False

    return theirs


def tree_bytes(path: Path) -> int:
    """The bytes of every file under ``path`` (apparent sizes; links counted, not followed)."""
    total = 0
    for folder, dirs, files in os.walk(path):
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        for name in [*files, *links]:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def _delete(path: Path) -> None:
    """Delete a record in the trash, read-only folders included: a benchmark worker's
    ``work/`` (``workdir = "run"``) holds whatever the worker wrote, such as assets copied
    with their read-only modes from the store. What still cannot go stays in the trash for
    the next prune."""
    from harness.store.store import remove_tree

    try:
        remove_tree(path)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _own_trash(home: Path) -> list[Path]:
    """This user's trash folders in ``runs/``: ``.trash-<uid>`` (and ``-*`` where another
    member took that name first), and an older harness's ``.trash`` when this user made it.
    Never a link nor another member's folder: what is in them is deleted."""
    from harness.store.shared import is_own_folder, own_folders_in

    legacy = runs_dir(home) / TRASH
    return [*own_folders_in(runs_dir(home), TRASH), *([legacy] if is_own_folder(legacy) else [])]


def empty_trash(home: Path) -> int:
    """Delete what an interrupted prune left in this user's trash; the bytes freed."""
    freed = 0
    for trash in _own_trash(home):
        for entry in sorted(trash.iterdir()):
            freed += tree_bytes(entry)
            _delete(entry)
    return freed


def remove_runs(home: Path, candidates: list[Candidate]) -> list[Removed]:
    """Remove each record atomically: rename into ``runs/.trash/``, then delete there.

    A record pinned in the meantime (its ``pinned`` file appeared after the plan) is put
    back; a record already gone (a second prune) is skipped. Returns what went, with the
    bytes each freed.
    """
    from harness.store.shared import own_folder_in

    trash = own_folder_in(runs_dir(home), TRASH)
    removed: list[Removed] = []
    for candidate in candidates:
        target = trash / f"{candidate.id}.{secrets.token_hex(4)}"
        try:
            os.rename(candidate.path, target)
        except FileNotFoundError:
            continue  # removed by another prune since the plan
        except PermissionError:
            continue  # another member's, in a shared home's sticky runs/ (plan_prune passes them by)
        if (target / "pinned").is_file():  # pinned between the plan and the rename
            os.rename(target, candidate.path)
            continue
        size = tree_bytes(target)
        _delete(target)
        removed.append(Removed(candidate.id, size))
    try:
        trash.rmdir()
    except OSError:
        pass  # not empty: something could not be deleted; the next prune tries again
    return removed
