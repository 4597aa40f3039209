"""The states of a Slurm array's tasks for submitit, also where Slurm keeps no accounting.

submitit learns that a task ended without a result (its node lost, killed past ``scancel``'s
grace) from ``sacct``. A Slurm without an accounting database (no slurmdbd: common on a lab's
own cluster) answers "Slurm accounting storage is disabled": the task stays ``UNKNOWN`` and the
head would wait for it forever. :class:`SlurmStates` asks ``sacct`` first and, when it fails,
``squeue --states=all``, which knows every job slurmctld still holds (``MinJobAge`` seconds
after its end, 300 by default), and polls at least every 30 s (submitit's own watcher waits up to
10 minutes between calls).
"""

from __future__ import annotations

import subprocess
import time

from submitit.slurm.slurm import SlurmInfoWatcher

#: The most seconds between two questions to Slurm while tasks run.
POLL_S = 30


def _ask(command: list[str]) -> str | None:
    """A Slurm command's output, or None where it failed."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def squeue_command(jobs: list[str]) -> list[str]:
    """``squeue`` asked for the jobs, in the form of submitit's ``sacct`` call (no header)."""
    return ["squeue", "--noheader", "--states=all", "--format=%i|%T|%N", f"--jobs={','.join(jobs)}"]


class SlurmStates(SlurmInfoWatcher):
    """submitit's watcher of Slurm jobs, falling back to ``squeue`` where ``sacct`` fails."""

    def __init__(self, delay_s: int = POLL_S) -> None:
        super().__init__(delay_s=delay_s)

    def update(self) -> None:
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        text = _ask(command)
        if text is None:
            jobs = [command[i + 1] for i, word in enumerate(command[:-1]) if word == "-j"]
            queued = _ask(squeue_command(jobs))
            text = None if queued is None else "JobID|State|NodeList\n" + queued
        if text is not None:
            self._output = text.encode()
            self._info_dict.update(self.read_info(text))
        self._last_status_check = time.time()
        for job_id in self._registered - self._finished:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)
