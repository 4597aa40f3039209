"""Garbage collection: ``harness store gc`` and ``harness store why``.

A path is live when a root names it or a live path references it; everything else is
garbage. The kinds of root:

* **project** — ``store/.roots/projects/<key>.json``, written when a project realizes (and
  when its code is registered): where the project was and, per lock, the paths it named.
  While the folder exists, gc keeps the closure of its *current* locks and of the code the
  current checkout would launch; a folder that is gone (moved, deleted) keeps its last
  recorded paths and is reported, until ``store gc --forget-missing`` or a grace period
  (``[gc] missing-project-days``) counted from when gc first found it gone;
* **pin** — ``store/.roots/pins/<name>``, a path pinned by hand (``harness store pin``);
* **run** — the last N runs (``[gc] keep-runs``, default 10) and every pinned run
  (``harness runs pin ID``): what their records' ``lock.json`` name, so they stay auditable;
* **live process** — the temporary roots of every live process that realizes, runs,
  pushes or pulls, and the paths held for ``harness up``'s broker while it lives
  (:mod:`harness.store.roots`).

In a shared store (``harness store init --group``) a member deletes only the paths they
registered; a project folder another member cannot read counts as present and keeps what it
last recorded. Collection runs under the exclusive gc lock, so no root can be added between reading the
roots and deleting (see :mod:`harness.store.roots`). Deletion unregisters first, so a crash
mid-collection leaves only debris that the next ``clean`` removes. Then the pool of shared
files (``.links``) loses the files no path links to any more, and the bytecode index
(:mod:`harness.store.bytecode`) the entries naming them or a gone interpreter.

:func:`discard_unused` is the same collection narrowed to paths a caller registered and now
gives up (a realize that failed after registering some of a lock's paths): it deletes those
of them nobody else has taken into use, under the same lock, by the same roots.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.store.entries import removable
from harness.store.store import Store, StoreError

#: Defaults of the ``[gc]`` settings.
DEFAULT_KEEP_RUNS = 10
DEFAULT_MISSING_PROJECT_DAYS = 30.0


# ------------------------------------------------------------------------- project roots


def _project_file(store: Store, project_root: Path) -> Path:
    """This user's root file for ``project_root``: one per user, so that in a shared store
    (sticky ``.roots``) no member can take another's name first and block it."""
    key = hashlib.sha256(str(project_root.resolve()).encode()).hexdigest()[:32]
    return store.roots_dir / "projects" / f"{key}-{os.geteuid()}.json"


def _read_project(path: Path) -> dict[str, Any] | None:
    """A project root's data; a plain-text root of an older harness reads as its folder.
    Read without following a link; anything that is not a small file of text is no root."""
    from harness.store.entries import BadEntry, read_entry

    try:
        raw, _ = read_entry(path)
        text = raw.decode("utf-8")
    except (OSError, BadEntry, UnicodeDecodeError):
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        # Older harness: the folder on the first line, then the store paths it realized.
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return {"root": lines[0], "locks": {"(recorded)": lines[1:]}, "code": {}} if lines else None
    return _sane_project(data) if isinstance(data, dict) and isinstance(data.get("root"), str) else None


def _sane_project(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each field of the type gc reads it as: what is not (a list for the
    locks, a word for a time, in a root file anyone could have written) counts as absent."""
    locks, code, since = data.get("locks"), data.get("code"), data.get("missing_since")
    data["locks"] = (
        {
            k: [p for p in v if isinstance(p, str)]
            for k, v in locks.items()
            if isinstance(k, str) and isinstance(v, list)
        }
        if isinstance(locks, dict)
        else {}
    )
    data["code"] = (
        {k: v for k, v in code.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(code, dict) else {}
    )
    if not isinstance(since, (int, float)) or isinstance(since, bool) or not math.isfinite(since):
        data.pop("missing_since", None)
    return data


def _update_project(store: Store, project_root: Path, change: Any) -> None:
    """Read-modify-write a project's root file under its lock; writes only on a change."""
    from harness.store.entries import write_entry
    from harness.store.store import lock_file

    target = _project_file(store, project_root)
    target.parent.mkdir(parents=True, exist_ok=True)
    with lock_file(target.with_suffix(".lock")):
        data = _read_project(target) or {}
        old = json.dumps(data, sort_keys=True)
        data.setdefault("locks", {})
        data.setdefault("code", {})
        data["root"] = str(project_root.resolve())
        data.pop("missing_since", None)  # it realized here just now: it exists
        change(data)
        if json.dumps(data, sort_keys=True) == old and target.is_file():
            return
        data["updated"] = time.time()
        write_entry(target, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    # What older harnesses wrote for this project: the plain-text root, and the root file
    # without the user's id (both this user's own, or not ours to remove).
    shared_name = target.with_name(target.name.rsplit("-", 1)[0] + ".json")
    for legacy in (shared_name.with_suffix(""), shared_name):
        try:
            if os.lstat(legacy).st_uid == os.geteuid():
                legacy.unlink()
        except OSError:
            pass


def register_project(store: Store, project_root: Path, locks: dict[str, Iterable[str]] | None = None) -> None:
    """Remember that ``project_root`` realized into ``store``: its locks become roots.

    ``locks`` (lock name -> the store paths it names) is recorded too, so the paths stay
    known (and kept) if the folder later moves or disappears.
    """

    def change(data: dict[str, Any]) -> None:
        for name, paths in (locks or {}).items():
            data["locks"][name] = sorted(set(paths))

    _update_project(store, project_root, change)


def remember_code(store: Store, project_root: Path, label: str, path: str) -> None:
    """Record ``path`` as the project's current code named ``label`` (``svc-code``)."""

    def change(data: dict[str, Any]) -> None:
        data["code"][label] = path

    _update_project(store, project_root, change)


# ----------------------------------------------------------------------------- pins


def pin(store: Store, name: str) -> None:
    from harness.store.entries import write_entry

    folder = store.roots_dir / "pins"
    folder.mkdir(parents=True, exist_ok=True)
    write_entry(folder / name, (name + "\n").encode())


def unpin(store: Store, name: str) -> None:
    (store.roots_dir / "pins" / name).unlink(missing_ok=True)


# ------------------------------------------------------------------------------- runs


def pin_run(run_dir: Path) -> None:
    """Keep what run ``run_dir`` used across every gc (``harness runs pin``)."""
    from harness.store.entries import write_entry

    # Never through a link planted in the run's folder (another member's, in a shared home).
    write_entry(run_dir / "pinned", (json.dumps({"pinned": time.time()}) + "\n").encode())


def unpin_run(run_dir: Path) -> None:
    (run_dir / "pinned").unlink(missing_ok=True)


def _run_paths(run_dir: Path) -> frozenset[str] | None:
    from harness.store.entries import BadEntry, read_entry

    try:
        raw, _ = read_entry(run_dir / "lock.json", limit=64 << 20)
        data = json.loads(raw.decode("utf-8"))
        return frozenset(str(e["path"]) for e in data.get("store_paths", []))
    except (OSError, BadEntry, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _runs(runs_dir: Path | None) -> list[Path]:
    """Run folders (not links to one) with a closure, oldest first (ids sort by start time)."""
    from harness.store.entries import is_regular

    if runs_dir is None or not runs_dir.is_dir():
        return []
    return sorted(p for p in runs_dir.iterdir() if _is_folder(p) and is_regular(p / "lock.json"))


def _is_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _recent(runs: list[Path], keep_runs: int) -> set[str]:
    """The names of each member's last ``keep_runs`` of ``runs`` (oldest first), by who made
    the folder: in a shared home no member's runs, nor folders named for a later date, push
    another member's out of the last N."""
    if keep_runs <= 0:
        return set()
    by_owner: dict[int, list[Path]] = {}
    for run in runs:
        try:
            by_owner.setdefault(os.lstat(run).st_uid, []).append(run)
        except OSError:
            continue
    return {run.name for theirs in by_owner.values() for run in theirs[-keep_runs:]}


# ------------------------------------------------------------------------------ roots


@dataclass(frozen=True)
class Root:
    kind: str  # "project", "pin", "run", "pinned run", "live process", "services"
    label: str
    names: frozenset[str]
    #: per name, what in the root names it (``code of svc``, ``lock svc``), for ``why``
    detail: tuple[tuple[str, str], ...] = ()

    def describe(self, name: str) -> str:
        what = dict(self.detail).get(name)
        return f"root {self.kind} {self.label}" + (f" ({what})" if what else "")


@dataclass(frozen=True)
class MissingProject:
    """A registered project whose folder is gone."""

    root: str
    since: float
    paths: int
    forgotten: bool  # dropped by this collection (--forget-missing or past the grace period)


@dataclass
class Roots:
    roots: list[Root] = field(default_factory=list)
    missing: list[MissingProject] = field(default_factory=list)
    forgotten_files: list[Path] = field(default_factory=list)
    #: paths of runs beyond the last N, newest run first: why such a path may go
    old_runs: list[tuple[str, frozenset[str]]] = field(default_factory=list)


def lock_store_paths(lock: Any) -> set[str]:
    """Every store path a lock names, the wheels its sdists build included."""
    from harness.lock.objects import built_wheels

    names = {lock.python.store, lock.environment.store}
    for package in [*lock.packages, *lock.build_packages]:
        names |= {w.store for w in package.wheels}
        if package.sdist is not None:
            names.add(package.sdist.store)
    names |= {name for _, name in built_wheels(lock)}
    names |= {s.store for s in lock.sources}
    names |= {w.store for w in lock.weights}
    from harness.lock.storepaths import view_paths

    names |= set(view_paths(lock))
    return {n for n in names if n}


def standin_paths(store: Store, lock: Any) -> set[str]:
    """The host interpreter copy standing in for ``lock``'s own here and the environment built
    on it (harness/realize/standin.py): live while they stand in, garbage once the lock's own
    interpreter is registered."""
    from harness.lock.storepaths import with_interpreter
    from harness.store.standins import standin_for

    host = standin_for(store, lock.python.store)
    own = store.record(lock.python.store)
    if host is None or (lock.python.source == "uv-managed" and own is not None and not own.impure):
        return set()
    return lock_store_paths(with_interpreter(lock, host))


def _realized_here(store: Store, lock: Any) -> Any:
    """``lock`` as this store realizes it: on the host copy standing in, where one does
    (:func:`standin_paths`; ``harness/realize/standin.py:realized_lock``)."""
    from harness.lock.storepaths import with_interpreter
    from harness.store.standins import standin_for

    host = standin_for(store, lock.python.store)
    own = store.record(lock.python.store)
    if host is None or (lock.python.source == "uv-managed" and own is not None and not own.impure):
        return lock
    return with_interpreter(lock, host)


def lock_roots(store: Store, lock: Any, *, keep_wheel_files: bool = True) -> set[str]:
    """The store paths a project's ``lock`` keeps alive: every path it names and the host copy
    standing in with the environment on it (:func:`standin_paths`). With ``keep_wheel_files``
    false (``[gc] keep-wheel-files``) the files it downloads (every wheel and sdist it lists)
    only while the environment as realized here is not registered: then a realize needs them.
    The wheels built from its sdists stay either way: making one again takes a build, and a
    second environment installing the same sdist takes it (``builder.py:_drop_package_files``)."""
    paths = lock_store_paths(lock) | standin_paths(store, lock)
    if keep_wheel_files:
        return paths
    from harness.lock.objects import needed_build_inputs

    files = {
        w.store for p in [*lock.packages, *lock.build_packages] for w in [*p.wheels, *([p.sdist] if p.sdist else [])]
    }
    return (paths - files) | set(needed_build_inputs(_realized_here(store, lock), store.is_registered))


#: Project folder -> the code store paths its checkout would launch, by manifest name. The
#: realize stage knows how (``harness.realize.project_code.checkout_code_paths``); gc is below
#: it, so the caller hands it in.
CheckoutCode = Callable[[Path], Mapping[str, str]]


def _add_recorded(detail: dict[str, str], locks: Mapping[str, list[str]], code: Mapping[str, str]) -> None:
    """Add to ``detail`` (path → why kept) the paths a project's file recorded: its locks'
    and its code's, as of its last realize."""
    for lock_name, named in sorted(locks.items()):
        for path in named:
            detail.setdefault(path, f"lock {lock_name}, recorded")
    for label, path in sorted(code.items()):
        detail.setdefault(path, f"{label}, recorded")


def _project_root(
    store: Store,
    data: dict[str, Any],
    entry: Path,
    now: float,
    *,
    forget_missing: bool,
    grace_days: float,
    out: Roots,
    write: bool,
    checkout_code: CheckoutCode | None,
    recorded: bool = False,
    keep_wheel_files: bool = True,
) -> None:
    from harness.errors import HarnessError
    from harness.lock.lockfile import read

    project = Path(data["root"])
    recorded_locks: dict[str, list[str]] = data.get("locks") or {}
    recorded_code: dict[str, str] = data.get("code") or {}
    detail: dict[str, str] = {}
    if recorded:  # what the project took into use, whatever its folder holds now
        _add_recorded(detail, recorded_locks, recorded_code)
        out.roots.append(Root("project", f"{project} (as recorded)", frozenset(detail), tuple(sorted(detail.items()))))
        return
    try:
        present = project.is_dir()
        if present:
            locks = project / "locks"
            for lock_file in sorted(locks.glob("*.lock.toml")) if locks.is_dir() else []:
                lock_name = lock_file.name[: -len(".lock.toml")]
                try:
                    lock = read(lock_file)
                    paths = lock_roots(store, lock, keep_wheel_files=keep_wheel_files)
                except HarnessError:
                    paths = set(recorded_locks.get(lock_name, ()))  # unreadable now: keep what it named
                for path in sorted(paths):
                    detail.setdefault(path, f"lock {lock_name}")
            _add_template_locks(project, detail, recorded_locks)
            if checkout_code is not None:
                for manifest, path in checkout_code(project).items():
                    detail.setdefault(path, f"code of {manifest}")
            else:  # without the realize stage's help: the code it last registered
                _add_recorded(detail, {}, recorded_code)
    except PermissionError:
        # Another member's project this user cannot read (a shared store): it is there, so
        # it is not missing; keep what it last recorded.
        _add_recorded(detail, recorded_locks, recorded_code)
        out.roots.append(Root("project", f"{project} (unreadable)", frozenset(detail), tuple(sorted(detail.items()))))
        return
    if present:
        if write and data.get("missing_since") is not None:
            data.pop("missing_since", None)
            _write_project_file(entry, data)
        out.roots.append(Root("project", str(project), frozenset(detail), tuple(sorted(detail.items()))))
        return
    # The folder is gone: keep what it last named, say so, and drop it only when asked.
    _add_recorded(detail, recorded_locks, recorded_code)
    since = float(data.get("missing_since") or now)
    # Another member's missing project stays a root until they forget it (a shared store's
    # projects/ is sticky: its file is not this user's to remove).
    forgotten = (forget_missing or (grace_days > 0 and now - since > grace_days * 86400)) and removable(entry)
    out.missing.append(MissingProject(str(project), since, len(detail), forgotten))
    if forgotten:
        out.forgotten_files.append(entry)
        return
    if write and data.get("missing_since") is None:
        data["missing_since"] = since
        _write_project_file(entry, data)
    out.roots.append(Root("project", f"{project} (missing)", frozenset(detail), tuple(sorted(detail.items()))))


def _add_template_locks(project: Path, detail: dict[str, str], recorded: Mapping[str, list[str]]) -> None:
    """The store paths the project's rootfs templates lock to (``locks/images/``)."""
    from harness.errors import HarnessError
    from harness.lock.images import LOCKS, read

    folder = project / "locks" / LOCKS
    for lock_file in sorted(folder.glob("*.lock.toml")) if folder.is_dir() else []:
        label = lock_file.name[: -len(".lock.toml")]
        try:
            paths = [read(project, label).store]
        except HarnessError:
            paths = list(recorded.get(f"image:{label}", ()))
        for path in paths:
            detail.setdefault(path, f"lock image:{label}")


def _write_project_file(entry: Path, data: dict[str, Any]) -> None:
    """Rewrite a project root (when gc first finds it missing, or back); another member's
    root in a shared store may not be ours to rewrite, and then stays as it is."""
    from harness.store.entries import BadEntry, write_entry

    try:
        write_entry(entry, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    except (OSError, BadEntry):
        pass


def gather_roots(
    store: Store,
    *,
    runs_dir: Path | None = None,
    keep_runs: int = DEFAULT_KEEP_RUNS,
    forget_missing: bool = False,
    grace_days: float = DEFAULT_MISSING_PROJECT_DAYS,
    now: float | None = None,
    write: bool = False,
    checkout_code: CheckoutCode | None = None,
    recorded: bool = False,
    skip_holder: Path | None = None,
    keep_wheel_files: bool = True,
) -> Roots:
    """Every root and the store paths it names directly.

    ``write`` lets it record when a project was first found missing (a real collection
    does; ``--dry-run`` and ``why`` do not). ``checkout_code`` says which code paths a
    present project's checkout would launch (without it: the code it last registered).
    ``recorded`` takes each project's paths from what it recorded when it last realized
    rather than from its current locks (:func:`discard_unused`); ``skip_holder`` leaves out
    the temporary roots in that file (the caller's own). ``keep_wheel_files`` false: a
    project's locks keep their package files only while a realize needs them (:func:`lock_roots`).
    """
    from harness.store.roots import live_holders

    now = time.time() if now is None else now
    out = Roots()
    folder = store.roots_dir / "projects"
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        if entry.name.startswith(".") or entry.suffix == ".lock":
            continue
        data = _read_project(entry)
        if data is not None:
            _project_root(
                store,
                data,
                entry,
                now,
                forget_missing=forget_missing,
                grace_days=grace_days,
                out=out,
                write=write,
                checkout_code=checkout_code,
                recorded=recorded,
                keep_wheel_files=keep_wheel_files,
            )
    folder = store.roots_dir / "pins"
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        out.roots.append(Root("pin", entry.name, frozenset({entry.name})))
    runs = _runs(runs_dir)
    recent = _recent(runs, keep_runs)
    for run in reversed(runs):
        paths = _run_paths(run)
        if paths is None:
            continue
        if (run / "pinned").is_file():
            out.roots.append(Root("pinned run", run.name, paths))
        elif run.name in recent:
            out.roots.append(Root("run", f"{run.name} (one of the last {keep_runs} runs)", paths))
        else:
            out.old_runs.append((run.name, paths))
    skipped = os.path.abspath(skip_holder) if skip_holder is not None else None
    for holder in live_holders(store):
        if skipped is not None and holder.file is not None and os.path.abspath(holder.file) == skipped:
            continue
        kind = "live process" if holder.kind == "process" else "services"
        out.roots.append(Root(kind, f"{holder.pid}: {holder.label}", holder.names))
    return out


def roots(store: Store, **options: Any) -> list[Root]:
    """Every root and the store paths it names directly (see :func:`gather_roots`)."""
    return gather_roots(store, **options).roots


def closure_of(store: Store, names: Iterable[str]) -> set[str]:
    """``names`` and everything they reference, transitively."""
    live: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name in live:
            continue
        live.add(name)
        try:
            # Every member's records: a path another member's path references stays alive
            # whether or not this user would use it.
            record = store.record(name, even_if_gone=True, any_member=True)
        except StoreError:
            continue  # not a record harness wrote (a planted entry): it names nothing
        if record is not None:
            pending.extend(record.references)
    return live


def live_paths(store: Store, **options: Any) -> set[str]:
    """The closure of every root under references."""
    return closure_of(store, [n for root in roots(store, **options) for n in root.names])


# ---------------------------------------------------------------------------- collect


@dataclass
class GcResult:
    """What a collection deleted (or would), and why; and the projects found missing."""

    dead: list[tuple[str, str]] = field(default_factory=list)  # (name, why it goes)
    missing_projects: list[MissingProject] = field(default_factory=list)
    kept: int = 0

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.dead]


def collect(
    store: Store,
    *,
    dry_run: bool,
    runs_dir: Path | None = None,
    keep_runs: int = DEFAULT_KEEP_RUNS,
    forget_missing: bool = False,
    grace_days: float = DEFAULT_MISSING_PROJECT_DAYS,
    now: float | None = None,
    checkout_code: CheckoutCode | None = None,
    keep_wheel_files: bool = True,
) -> GcResult:
    """Delete every registered path no root reaches (module docstring); returns them sorted,
    each with the reason it goes. ``dry_run`` deletes and writes nothing."""
    from harness.store.roots import gc_lock

    with gc_lock(store, exclusive=True):
        found = gather_roots(
            store,
            runs_dir=runs_dir,
            keep_runs=keep_runs,
            forget_missing=forget_missing,
            grace_days=grace_days,
            now=now,
            write=not dry_run,
            checkout_code=checkout_code,
            keep_wheel_files=keep_wheel_files,
        )
        live = closure_of(store, [n for root in found.roots for n in root.names])
        # A record whose path was deleted behind the store's back is dead weight too.
        dead = sorted(r.name for r in store.records(even_if_gone=True, any_member=True) if r.name not in live)
        # In a shared store only the member who registered a path (or root) deletes it.
        dead = [name for name in dead if store.may_remove(name)]
        result = GcResult(missing_projects=found.missing, kept=len(live))
        reasons = _reasons(store, dead, found, keep_runs)
        result.dead = [(name, reasons[name]) for name in dead]
        if not dry_run:
            for entry in found.forgotten_files:
                entry.unlink(missing_ok=True)
            for name in dead:
                store.delete(name)
            store.clean()
            _tidy(store)
    return result


def _tidy(store: Store) -> None:
    """After deleting paths (under the exclusive gc lock): drop the pool files no path links to
    any more, and the bytecode index entries whose pool file went or whose interpreter did."""
    from harness.store.bytecode import prune

    store.collect_links()
    prune(store.root, [r.name for r in store.records() if r.kind == "python"])


def discard_unused(
    store: Store,
    names: Iterable[str],
    *,
    own_roots: Path | None = None,
    runs_dir: Path | None = None,
    before_delete: Callable[[str], None] | None = None,
) -> list[str]:
    """Delete those of ``names`` that nobody else has taken into use; return them, sorted.

    For paths the caller itself registered and now gives up: a realize that failed after
    registering some of a lock's paths. A path is kept when it is live by :func:`collect`'s
    roots, with two differences: a project keeps what it *recorded* when it last realized
    (its current locks still name the paths of a lock that failed to realize; a lock that
    realized, here or in another process, recorded what it uses), and ``own_roots`` (the
    caller's temporary-roots file) counts for nothing, since the caller is the one giving the
    paths up. So a path another live process roots (a realize or a launch that found it
    registered), one a completed realize recorded, a pin, a run record (of any age), or one a
    kept path references, stays. Runs are looked for in ``runs_dir`` (default: ``runs`` beside
    the store, as in ``$HARNESS_HOME``).

    Decided and deleted under the exclusive gc lock, as a collection is: a process that roots
    one of the paths afterwards finds it unregistered and builds or fetches it again (the
    contract of :mod:`harness.store.roots`). Referrers go before what they reference, so a
    crash midway leaves no registered path whose reference is gone; ``before_delete(name)``
    runs just before each deletion. In a shared store only the caller's own paths go.
    """
    from harness.store.roots import gc_lock

    wanted = sorted(set(names))
    if not wanted:
        return []
    with gc_lock(store, exclusive=True):
        found = gather_roots(
            store,
            runs_dir=store.root.parent / "runs" if runs_dir is None else runs_dir,
            recorded=True,
            skip_holder=own_roots,
        )
        named = [n for root in found.roots for n in root.names]
        named += [n for _, paths in found.old_runs for n in paths]
        live = closure_of(store, named)
        dead = [name for name in wanted if name not in live and store.is_registered(name) and store.may_remove(name)]
        for name in _referrers_first(store, dead):
            if before_delete is not None:
                before_delete(name)
            store.delete(name)
        if dead:
            _tidy(store)
    return dead


def _referrers_first(store: Store, names: list[str]) -> list[str]:
    """``names`` ordered so that each comes before every one of them it references."""
    references = {}
    for name in names:
        record = store.record(name, even_if_gone=True)
        references[name] = set(record.references) & set(names) if record is not None else set()
    ordered: list[str] = []
    pending = sorted(names)
    while pending:
        # Not referenced by any name still pending (a cycle cannot occur: references point at
        # paths registered earlier; the fallback only guards against a damaged record).
        free = [n for n in pending if not any(n in references[m] for m in pending if m != n)] or pending[:1]
        ordered += free
        pending = [n for n in pending if n not in free]
    return ordered


def _reasons(store: Store, dead: list[str], found: Roots, keep_runs: int) -> dict[str, str]:
    """Why each dead path goes: the root that last named it, where one did."""
    reasons = {name: "no root reaches it" for name in dead}
    todo = set(dead)
    for entry in found.forgotten_files:
        data = _read_project(entry) or {}
        named = {p for paths in (data.get("locks") or {}).values() for p in paths}
        named |= set((data.get("code") or {}).values())
        for name in closure_of(store, named) & todo:
            reasons[name] = f"its project {data.get('root')} is gone and is forgotten now"
            todo.discard(name)
    for run, paths in found.old_runs:  # newest first
        for name in closure_of(store, paths) & todo:
            reasons[name] = f"last used by run {run}, older than the last {keep_runs} runs"
            todo.discard(name)
    return reasons


def why(store: Store, name: str, **options: Any) -> list[str]:
    """Why ``name`` is alive: the paths that reference it and every root that names it."""
    reasons = [f"referenced by {r.name}" for r in store.records(any_member=True) if name in r.references]
    for root in roots(store, **options):
        if name in root.names:
            reasons.append(root.describe(name))
    return reasons
