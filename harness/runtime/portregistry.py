"""Ports reserved by the deploys ``harness deploy write`` wrote on this machine.

"Not listening right now" is not enough to give a port to a new instance of the project:
the first instance's on-demand services hold their ports only while they run, so a second
deploy written while they are stopped would get the same ports, and its policy would then
be served by the first instance's process. Each written deploy therefore reserves its
ports in ``$HARNESS_HOME/state/ports.json``::

    {"version": 1, "deploys": {"/abs/path/of/deploy.toml": {"sam3": 8831, ...}}}

under a file lock (two ``deploy write`` at once serialize). A reservation lasts as long as
its deploy file exists; rewriting the same file keeps its ports where it can.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REGISTRY_VERSION = 1


def registry_path(home: Path) -> Path:
    """The machine's (this home's) port registry."""
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


def _load(path: Path) -> dict[str, dict[str, int]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # a missing or damaged registry is an empty one: the in-use probe remains
    deploys = data.get("deploys") if isinstance(data, dict) and data.get("version") == REGISTRY_VERSION else None
    if not isinstance(deploys, dict):
        return {}
    return {
        str(k): {str(n): int(p) for n, p in v.items() if isinstance(p, int)}
        for k, v in deploys.items()
        if isinstance(v, dict)
    }


@contextmanager
def reserve(home: Path, deploy: Path) -> Iterator[Reservation]:
    """Hold the registry's lock; yield a :class:`Reservation` for ``deploy``; on a normal
    exit save what it kept (reservations of deploy files that are gone are dropped)."""
    from filelock import FileLock

    path = registry_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = str(deploy.expanduser().resolve())
    with FileLock(str(path) + ".lock"):
        deploys = {k: v for k, v in _load(path).items() if k == key or os.path.exists(k)}
        reservation = Reservation(key, {k: v for k, v in deploys.items() if k != key}, deploys.get(key, {}))
        yield reservation
        deploys = dict(reservation.others)
        if reservation.kept:
            deploys[key] = reservation.kept
        fd, temp = tempfile.mkstemp(prefix=".ports.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"version": REGISTRY_VERSION, "deploys": deploys}, handle, indent=1, sort_keys=True)
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
