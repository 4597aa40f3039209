"""Resets of scoped services during a run: the one way a swap changes what a run computes.

A ``scoped`` service (a policy with memory of past frames) that is swapped out, stopped
for idleness or restarted after a crash comes back with its memory empty; the broker tells
the caller with ``fresh: true`` on the lease (DESIGN invariant 5's documented exception).
:class:`ResetLog` watches a run's leases and writes one line per reset to
``<run>/scoped-resets.jsonl``::

    {"service": "simate", "at": <unix time>, "client": "agent-1", "lease": "<id>",
     "incarnation": 2, "previous_incarnation": 1}

A reset is a lease on a scoped service for a client that an earlier incarnation of the
service had served: a client's first lease is fresh without anything being lost.

A run's own broker is a :class:`RecordingBroker`. A run that joins ``harness up``'s
broker registers with it (``POST /runs``) and hands its command a token of its own: the
broker watches the leases taken with that token by the same rule and gives the run its
resets when it ends (``POST /runs/end``), which the run appends here.
``harness run`` copies the lines into ``result.json`` (``scoped_resets``); ``audit`` shows
them and ``diff`` compares them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.runtime.broker import Broker
from harness.runtime.scheduling import ResetTracker

#: Where a run's resets are kept, beside its other record files.
RESETS_FILE = "scoped-resets.jsonl"


class ResetLog:
    """Notices resets in a stream of leases (thread-safe); appends each to ``path``.

    The rule is :class:`harness.runtime.scheduling.ResetTracker`'s."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tracker = ResetTracker()
        self._lock = threading.Lock()

    def observe(self, lease: Mapping[str, Any], client: str) -> dict[str, Any] | None:
        """Record ``lease`` (an acquire's answer) for ``client``; return the reset it shows, if any."""
        with self._lock:
            reset = self._tracker.observe(lease, client, time.time())
            if reset is not None:
                write_resets(self.path, [reset])
            return reset


def write_resets(path: Path, resets: list[dict[str, Any]]) -> None:
    """Append ``resets`` to ``path`` (one JSON line each), as :class:`ResetLog` does."""
    if not resets:
        return
    from harness.runs.record import open_record_file

    with open_record_file(path, append=True) as handle:  # a run record's: writable by this user only
        handle.write("".join(json.dumps(reset, sort_keys=True) + "\n" for reset in resets).encode("utf-8"))


def read_resets(path: Path) -> list[dict[str, Any]]:
    """The resets a :class:`ResetLog` wrote, in order ([] when none; a torn line is skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


class RecordingBroker(Broker):
    """A :class:`Broker` whose every granted lease is shown to a :class:`ResetLog`."""

    def __init__(self, *args: Any, resets: ResetLog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resets = resets

    def acquire(
        self,
        service: str,
        client: str = "anonymous",
        *,
        client_pid: int | None = None,
        timeout: float | None = None,
        run: str | None = None,
    ) -> dict[str, Any]:
        lease = super().acquire(service, client, client_pid=client_pid, timeout=timeout, run=run)
        self.resets.observe(lease, client)
        return lease
