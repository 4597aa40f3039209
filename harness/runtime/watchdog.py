"""Stop a broker's services when the process that owns the broker dies, however it dies.

A ``harness run`` serves its services from a broker inside its own process; if that process
is killed with SIGKILL nothing in it runs again, so the services it started would keep
listening and serve the next run with stale weights. The broker therefore starts this
watchdog (``python -m harness.runtime.watchdog STATE_DIR INT TERM``) in a session of its
own, holding the only write end of a pipe that is the watchdog's stdin:

* ``exit`` on the pipe: the broker shut down cleanly (it stopped its services); the
  watchdog exits.
* end of file without it: the owner is gone (the kernel closes a dead process's
  descriptors, SIGKILL included). The watchdog stops every service process group that the
  state folder's pid files name — only those still matching their recorded create time
  (:func:`harness.runtime.supervisor.stop_recorded`) — with the usual SIGINT, SIGTERM,
  SIGKILL escalation (grace periods INT and TERM seconds), and exits.

Unlike a parent-death signal (``PR_SET_PDEATHSIG``), this reaches a service's whole process
group, and it does not depend on which of the broker's threads started the service (the
kernel sends that signal when the creating *thread* exits).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLEAN_EXIT = b"exit\n"


def spawn(state_dir: Path, grace: tuple[float, float]) -> subprocess.Popen[bytes]:
    """Start the watchdog of ``state_dir``; the caller keeps ``proc.stdin`` open while it lives
    and writes :data:`CLEAN_EXIT` when it has stopped its services itself."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    from harness.runtime.supervisor import open_private_log

    with open_private_log(state_dir / "logs" / "watchdog.log") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "harness.runtime.watchdog", str(state_dir), str(grace[0]), str(grace[1])],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=state_dir,
            start_new_session=True,  # no Ctrl-C of the owner's terminal reaches it
        )


def main(argv: list[str]) -> int:
    state_dir, grace = Path(argv[0]), (float(argv[1]), float(argv[2]))
    data = b""
    while chunk := sys.stdin.buffer.read(64):
        data += chunk
    if data.endswith(CLEAN_EXIT):
        return 0
    from harness.runtime import supervisor

    for record in supervisor.read_pidfiles(state_dir):
        outcome = supervisor.stop_recorded(record, grace=grace)
        print(f"watchdog: the broker's owner died; {record.name} (pid {record.pid}): {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
