"""``harness run --cluster ... --detach``: the head goes on without the shell that started it.

The command runs again as a head process of its own session (``python -m harness`` with the
same arguments, less ``--detach``), its stdin closed and its output in the run's folder
(``runs/<id>/head.log``), under a run id chosen here (:data:`RUN_ID_VARIABLE`), so closing
the terminal, logging out or losing the SSH connection ends neither the head nor, with it,
the Ray job or the Slurm array it drives. This process waits until the head has realized and
recorded the run (its ``config.json``: the shards are being handed to the engine) and then
returns the run id; a head that fails before that fails this command too, with the end of
its log. The run is then watched with ``harness runs logs ID -f``, stopped with ``kill -INT
PID`` (the head cancels every shard and records the run, as on Ctrl-C), and resumed with
``harness run --resume ID`` should the head itself be lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError

#: The run id a detached head takes instead of choosing one.
RUN_ID_VARIABLE = "HARNESS_DETACHED_RUN_ID"

HEAD_LOG = "head.log"


@dataclass(frozen=True)
class Detached:
    run_id: str
    run_dir: Path
    pid: int
    log: Path


def without_detach(argv: list[str]) -> list[str]:
    """``argv`` less its first ``--detach`` before a ``--`` (after it, it is the command's). Pure."""
    end = argv.index("--") if "--" in argv else len(argv)
    for i in range(end):
        if argv[i] == "--detach":
            return argv[:i] + argv[i + 1 :]
    return list(argv)


def detach_head(home: Path, argv: list[str], *, timeout: float | None = None) -> Detached:
    """Start the head of a cluster run as its own session (see the module docstring) and wait
    until it has recorded the run. Raises :class:`HarnessError` with the end of its log when
    it ends before that."""
    from harness.runs.record import make_record_dir, new_run_id, open_record_file, refuse_foreign_dir, runs_dir

    run_id = new_run_id()
    run_dir = runs_dir(home) / run_id
    make_record_dir(run_dir.parent)
    try:
        run_dir.mkdir(mode=0o755)  # a new id: writable by this user only, as a run record is
    except FileExistsError:
        refuse_foreign_dir(run_dir)  # another member made it first, to write into the record
    log = run_dir / HEAD_LOG
    env = {**os.environ, RUN_ID_VARIABLE: run_id}
    with open_record_file(log) as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness", *without_detach(argv)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # no SIGHUP or terminal Ctrl-C reaches it
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    while not (run_dir / "config.json").is_file():
        code = proc.poll()
        if code is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-15:]
            raise HarnessError(
                f"the detached head of run {run_id} ended with exit {code} before the run started:\n  "
                + "\n  ".join(tail),
                hint=f"its log: {log}",
            )
        if deadline is not None and time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return Detached(run_id, run_dir, proc.pid, log)


def detached_run_id() -> str | None:
    """The run id this head was started with by :func:`detach_head`, if any (taken once)."""
    return os.environ.pop(RUN_ID_VARIABLE, None) or None
