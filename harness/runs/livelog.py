"""Shard output as it comes: ``harness runs logs RUN [-f]``.

Each shard hands its progress lines (realize, the closure check, the broker) and its
command's output (``logs/command.log`` on the node) to the head as they are written, in
batches a fraction of a second apart (:class:`ShardOutput`), not at the end: through the
run's ledger actor on Ray (:class:`harness.runs.cluster.Ledger`), which the head empties
into the run's folder every second; by appending to the file in the run's folder directly
on Slurm (submitit already needs the run's folder on a filesystem every node mounts). The
head keeps one file per shard, every attempt of it one after the other::

    runs/<id>/live/<I>.log

``harness runs logs RUN`` prints their last lines, prefixed with the shard; ``-f`` then
prints each new line until the run has ended (its ``result.json``) or Ctrl-C. A local run
has one such log, its command's (``logs/command.log``). Apart from the record: the record's
own logs are still each shard's files as it returned them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from harness.errors import InputError

LIVE_DIR = "live"

#: Seconds between two batches a shard hands over.
INTERVAL_S = 0.5

Send = Callable[[list[str]], None]


def live_log(run_dir: Path, index: int) -> Path:
    """The file the head keeps shard ``index``'s output in as it comes."""
    return run_dir / LIVE_DIR / f"{index}.log"


def append_lines(path: Path, lines: list[str]) -> None:
    """Append ``lines`` to ``path`` (made with its folder if missing), each ending in a newline."""
    if not lines:
        return
    from harness.runs.record import open_record_file

    with open_record_file(path, append=True) as sink:  # its folder too: writable by this user only
        sink.write("".join(f"{line}\n" for line in lines).encode("utf-8"))


def file_sender(path: Path) -> Send:
    """A shard's ``send`` that appends to the head's file itself (a filesystem both see)."""
    return lambda lines: append_lines(path, lines)


class ShardOutput:
    """On the node: the shard's progress lines (:meth:`echo`) and the lines its command
    writes to ``command_log``, handed to ``send`` in order, every :data:`INTERVAL_S` and at
    :meth:`close`. A ``send`` that fails drops that batch, never the shard."""

    def __init__(self, send: Send, command_log: Path, header: str, interval: float = INTERVAL_S) -> None:
        from harness.runtime.logs import Follower

        self._send = send
        self._interval = interval
        # A retry on this node writes the log again: its earlier bytes are not this attempt's.
        self._follower = Follower({"command": command_log})
        self._pending: list[str] = [header]
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shard-output", daemon=True)
        self._thread.start()

    def echo(self, line: str) -> None:
        with self._lock:
            self._pending.append(line)

    def _flush(self) -> None:
        with self._lock:
            batch = self._pending + [line for _, line in self._follower.poll()]
            self._pending = []
        if batch:
            try:
                self._send(batch)
            except Exception:  # the output is a view; the shard and its record go on
                pass

    def _loop(self) -> None:
        while not self._done.wait(self._interval):
            self._flush()

    def close(self) -> None:
        """Hand over what is left and stop."""
        self._done.set()
        self._thread.join(timeout=10)
        self._flush()


def run_logs(run_dir: Path, shards: tuple[int, ...] = ()) -> dict[str, Path]:
    """The live logs of a run: ``shard I`` → its file for a cluster run (those of ``shards``
    when given), ``command`` → its command's log for a local one. Raises :class:`InputError`
    for a shard the run does not have."""
    from harness.runs.record import read_json

    config = read_json(run_dir / "config.json") if (run_dir / "config.json").is_file() else {}
    cluster = config.get("cluster")
    if not isinstance(cluster, dict):
        if shards:
            raise InputError(f"run {run_dir.name} is not a cluster run: it has no shards")
        return {"command": run_dir / "logs" / "command.log"}
    count = int(cluster.get("shards") or 0)
    stray = [i for i in shards if not 0 <= i < count]
    if stray:
        raise InputError(f"run {run_dir.name} has shards 0 to {count - 1}, not {', '.join(map(str, stray))}")
    return {f"shard {i}": live_log(run_dir, i) for i in (shards or range(count))}


def run_ended(run_dir: Path) -> bool:
    """Whether the run has recorded its end (its ``result.json``)."""
    return (run_dir / "result.json").is_file()
