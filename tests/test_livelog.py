"""A shard hands its output to the head as it comes (:mod:`harness.runs.livelog`): its progress
lines and what its command writes to ``logs/command.log``, in order, while the command still
runs. The command here is a real subprocess writing its log a line at a time; the head side
is the file sender Slurm shards use. The whole path on Ray and Slurm is in test_cluster.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness.runs.livelog import ShardOutput, file_sender, live_log

WRITER = r"""
import sys, time
from pathlib import Path
log = Path(sys.argv[1])
stop = Path(sys.argv[2])
with open(log, "w") as out:
    out.write("episode 0: ok\n"); out.flush()
    while not stop.exists():
        time.sleep(0.05)
    out.write("episode 1: ok\n"); out.flush()
"""


def _wait_for(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def test_output_reaches_the_head_while_the_command_runs(tmp_path: Path) -> None:
    command_log = tmp_path / "node" / "logs" / "command.log"
    command_log.parent.mkdir(parents=True)
    command_log.write_text("an earlier attempt's line\n")  # a retry on this node: not this attempt's
    head = live_log(tmp_path / "head-run", 3)
    output = ShardOutput(file_sender(head), command_log, "--- shard 3/4 on node-a (/home)", interval=0.05)
    output.echo("closure: the head's 8 store paths, same content hashes")
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(command_log), str(stop)])
    try:
        _wait_for(lambda: head.is_file() and "episode 0: ok" in head.read_text())
        assert writer.poll() is None, "the line came while the command still ran"
        stop.write_text("")
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
    _wait_for(lambda: "episode 1: ok" in head.read_text())
    output.echo("the shard's last line")
    output.close()
    assert head.read_text().splitlines() == [
        "--- shard 3/4 on node-a (/home)",
        "closure: the head's 8 store paths, same content hashes",
        "episode 0: ok",
        "episode 1: ok",
        "the shard's last line",
    ]


def test_a_failing_sender_never_fails_the_shard(tmp_path: Path) -> None:
    def broken(lines: list[str]) -> None:
        raise OSError("the head's folder is gone")

    output = ShardOutput(broken, tmp_path / "command.log", "--- shard 0/1", interval=0.01)
    output.echo("a line")
    time.sleep(0.05)
    output.close()  # no exception
