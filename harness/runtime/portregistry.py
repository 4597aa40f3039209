"""Ports reserved by the deploys ``harness deploy write`` wrote on this machine.

"Not listening right now" is not enough to give a port to a new instance of the project:
the first instance's on-demand services hold their ports only while they run, so a second
deploy written while they are stopped would get the same ports, and its policy would then
be served by the first instance's process. Each written deploy therefore reserves its
ports in the home's registry, ``$HARNESS_HOME/state/ports/``: one file per user,
``<uid>.json``, holding that user's deploys::

    {"version": 1, "deploys": {"/abs/path/of/deploy.toml": {"sam3": 8831, ...}}}

A ``deploy write`` holds the registry's lock (``state/ports/.lock``: two at once serialize),
reads every user's file and rewrites only its own. A reservation lasts as long as its deploy
file exists; rewriting the same file keeps its ports where it can. The single
``state/ports.json`` of earlier versions is still read, and its owner's reservations move
into their own file at their next write.

In a home a group shares, ``state/`` and ``state/ports/`` are sticky (``store init --group``,
:mod:`harness.store.shared`): no member can rename, replace or delete another's file, so
each member writes a file of their own rather than one they would all replace. What a member
plants there is never followed nor written through (:mod:`harness.store.entries`): a link,
a fifo or garbage reserves nothing; a file under another's name is read as its maker's
reservations, and the user whose name it took writes ``<uid>-<random>.json`` instead; a
planted lock file makes each member lock a file of their own, so only two members' writes
at the same moment could then pick one free port twice (as they could bind it anyway).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REGISTRY_VERSION = 1


def registry_dir(home: Path) -> Path:
    """The machine's (this home's) port registry: a folder of one file per user."""
    return home / "state" / "ports"


def _legacy_path(home: Path) -> Path:
    """Where versions before the per-user files kept every reservation."""
    return home / "state" / "ports.json"


@dataclass
class Reservation:
    """One deploy write's view of the registry while it holds the lock."""

    deploy: str
    others: dict[str, dict[str, int]]  # every other live deploy's ports
    previous: dict[str, int]  # this deploy's ports from an earlier write, if any
    kept: dict[str, int] = field(default_factory=dict)

    def reserved_elsewhere(self) -> set[int]:
        return {port for ports in self.others.values() for port in ports.values()}

    def taken(self, in_use: Callable[[int], bool]) -> Callable[[int], bool]:
        """``in_use``, plus every port another live deploy reserved."""
        elsewhere = self.reserved_elsewhere()
        return lambda port: port in elsewhere or in_use(port)

    def keep(self, ports: Mapping[str, int]) -> None:
        """Reserve ``ports`` for this deploy (saved when the lock is released)."""
        self.kept = dict(ports)


def parse(data: bytes) -> dict[str, dict[str, int]]:
    """The deploys one registry file reserves ports for; a damaged or foreign file reserves
    nothing (the in-use probe remains)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    deploys = doc.get("deploys") if isinstance(doc, dict) and doc.get("version") == REGISTRY_VERSION else None
    if not isinstance(deploys, dict):
        return {}
    return {
        str(k): {str(n): p for n, p in v.items() if isinstance(p, int) and 0 < p < 65536}
        for k, v in deploys.items()
        if isinstance(v, dict)
    }


def _gone(deploy: str) -> bool:
    """Whether the deploy file ``deploy`` no longer exists (its reservation lapses). One this
    user cannot look at (another member's private folder) still stands."""
    try:
        os.stat(deploy)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


@dataclass
class _Files:
    """The registry as this user reads it: their own file (where it is or will be) and
    reservations, and every other user's."""

    own_path: Path
    own: dict[str, dict[str, int]]
    others: dict[str, dict[str, int]]
    legacy_own: bool  # the earlier single file is this user's: removed once their own is written


def _read_all(home: Path) -> _Files:
    from harness.store.entries import BadEntry, read_entry

    folder, me = registry_dir(home), os.geteuid()
    own_path: Path | None = None
    own: dict[str, dict[str, int]] = {}
    others: dict[str, dict[str, int]] = {}
    legacy_own = False
    candidates = [_legacy_path(home), *sorted(folder.glob("*.json"))]
    for path in candidates:
        try:
            data, st = read_entry(path)
        except (OSError, BadEntry):
            continue  # none, or something planted: it reserves nothing
        deploys = parse(data)
        mine = st.st_uid == me and (path.parent != folder or _own_name(path.name, me))
        if mine and path.parent != folder:
            legacy_own = True
        elif mine and own_path is None:
            own_path = path
        (own if mine else others).update(deploys)
    return _Files(own_path or _free_own_path(folder, me), own, others, legacy_own)


def _own_name(name: str, uid: int) -> bool:
    return name == f"{uid}.json" or (name.startswith(f"{uid}-") and name.endswith(".json"))


def _free_own_path(folder: Path, uid: int) -> Path:
    """``<uid>.json`` unless something else has that name (another member made it first):
    then a name of this user's own, ``<uid>-<random>.json``, found again by the next read."""
    import secrets

    first = folder / f"{uid}.json"
    return first if not os.path.lexists(first) else folder / f"{uid}-{secrets.token_hex(6)}.json"


@contextmanager
def _registry_lock(folder: Path) -> Iterator[None]:
    """The registry's lock; a lock file another member planted (a link, a fifo, one this user
    cannot open) is passed by for one of this user's own."""
    from harness.store.entries import BadEntry, PathLock

    try:
        lock = PathLock(folder / ".lock")
        lock.acquire()
    except BadEntry:
        lock = PathLock(folder / f".lock-{os.geteuid()}", mode=0o644)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextmanager
def reserve(home: Path, deploy: Path) -> Iterator[Reservation]:
    """Hold the registry's lock; yield a :class:`Reservation` for ``deploy``; on a normal
    exit save what it kept in this user's file (reservations of deploy files that are gone are
    dropped)."""
    from harness.store.entries import write_entry

    folder = registry_dir(home)
    folder.mkdir(parents=True, exist_ok=True)
    key = str(deploy.expanduser().resolve())
    with _registry_lock(folder):
        files = _read_all(home)
        own = {k: v for k, v in files.own.items() if k == key or not _gone(k)}
        others = {k: v for k, v in files.others.items() if k != key and not _gone(k)}
        reservation = Reservation(key, {**others, **{k: v for k, v in own.items() if k != key}}, own.get(key, {}))
        yield reservation
        own = {k: v for k, v in own.items() if k != key}
        if reservation.kept:
            own[key] = reservation.kept
        document = {"version": REGISTRY_VERSION, "deploys": own}
        write_entry(files.own_path, json.dumps(document, indent=1, sort_keys=True).encode(), mode=0o644)
        if files.legacy_own:
            _legacy_path(home).unlink(missing_ok=True)
