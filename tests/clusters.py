"""What the local clusters of the tests share (tests/raycluster.py, tests/slurmcluster.py, and
the fixtures of tests/test_cluster.py and tests/test_slurm.py): the head's store realized
while a cluster starts, and processes ended by pid.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")

#: What the repository's example runs need realized on the head: the kinematics-only agent's
#: service and the reach benchmark.
EXAMPLE = ("kinematics", "reach")


def start_while_realizing(
    project: Path, home: Path, start: Callable[[], T], stop: Callable[[T], None], targets: tuple[str, ...] = EXAMPLE
) -> T:
    """``start()`` a cluster while ``harness realize TARGETS`` fills ``home`` (both take a
    while on busy cores); what ``start`` returned, once both are done. A start that fails
    kills the realize; a realize that fails ``stop``\\ s the cluster; either raises."""
    realize = subprocess.Popen(
        [sys.executable, "-m", "harness", "--project", str(project), "--home", str(home), "realize", *targets],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        started = start()
    except BaseException:
        realize.kill()
        realize.wait()
        raise
    try:
        out, _ = realize.communicate(timeout=600)
        assert realize.returncode == 0, out.decode()
    except BaseException:
        realize.kill()
        realize.wait()
        stop(started)
        raise
    return started


def end_processes(procs: list[psutil.Process], grace: float = 15.0) -> None:
    """SIGTERM each of ``procs`` (by pid, never by name), then SIGKILL what is left after
    ``grace`` seconds, and wait for those too."""
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=15)
