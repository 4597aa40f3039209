"""``harness run --cluster slurm`` through a real Slurm: slurmctld and slurmd on loopback.

The one-node cluster (tests/slurmcluster.py) runs as root, as slurmd must; its jobs run as
root, in the head's own home (one node: the head's filesystem is the node's). The runs use the
repository's example, the kinematics-only agent on the reach benchmark (realizing kinematics
reads numpy from the package registry, which CI reaches). Skipped, saying why, without root,
without submitit (``pip install -e '.[slurm]'``) or without Slurm's Debian packages
(``apt-get install slurmctld slurmd slurm-client munge``, as .ci/run does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("submitit", reason="submitit is not installed: pip install -e '.[slurm]'")

from tests.clusters import start_while_realizing
from tests.conftest import REPO
from tests.slurmcluster import SlurmCluster, missing, start_slurm

pytestmark = [pytest.mark.network, pytest.mark.root]

# Shard 0 runs its episodes at once; the others note that they started and wait until the test
# opens the gate, so the test can act on a shard that surely runs.
GATE = r"""
import os, runpy, sys, time
from pathlib import Path
gates = Path(sys.argv[1])
shard = os.environ["HARNESS_SHARD"].replace("/", "-")
# Written whole, then renamed: a reader never sees the marker empty (it holds the run dir).
(gates / f".part-{os.getpid()}").write_text(os.environ.get("HARNESS_RUN_DIR", ""))
os.replace(gates / f".part-{os.getpid()}", gates / f"started-{shard}")
while not shard.startswith("0-") and not (gates / "open").exists():
    time.sleep(0.1)
sys.argv = [sys.argv[2], "--episodes", "20", "--seed", "0"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# Every shard notes that it started, then waits until the test opens its own gate (or all).
GATE_EACH = r"""
import os, runpy, sys, time
from pathlib import Path
gates = Path(sys.argv[1])
shard = os.environ["HARNESS_SHARD"].replace("/", "-")
# Written whole, then renamed: a reader never sees the marker empty (it holds the run dir).
(gates / f".part-{os.getpid()}").write_text(os.environ.get("HARNESS_RUN_DIR", ""))
os.replace(gates / f".part-{os.getpid()}", gates / f"started-{shard}")
while not (gates / f"open-{shard}").exists() and not (gates / "open").exists():
    time.sleep(0.1)
sys.argv = [sys.argv[2], "--episodes", "20", "--seed", "0"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:  # when its episodes were over, for the test to compare
    (gates / f".part-{os.getpid()}").write_text(repr(time.time()))
    os.replace(gates / f".part-{os.getpid()}", gates / f"ended-{shard}")
"""


@dataclass
class Setup:
    slurm: SlurmCluster
    home: Path
    root: Path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    home = root / "home"
    home.mkdir()
    slurm = start_while_realizing(REPO, home, lambda: start_slurm(root), SlurmCluster.stop)
    try:
        yield Setup(slurm, home, root)
    finally:
        slurm.stop()


def _harness(setup: Setup, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--project", str(REPO), *args],
        env=setup.slurm.env({**os.environ, "HARNESS_HOME": str(setup.home)}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _run_dir(stderr: str) -> Path:
    line = [ln for ln in stderr.splitlines() if "; record " in ln][-1]
    return Path(line.rsplit("; record ", 1)[1].strip())


def _array_job(stderr: str) -> str:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("submitted array job "))
    return line.split()[3]


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _gated(
    setup: Setup, name: str, *args: str, gate: str = GATE, waiting: tuple[str, ...] = ("1-2",)
) -> tuple[subprocess.Popen[str], Path]:
    """A ``run --cluster slurm`` of two shards whose shard 1 (or each of ``waiting``) waits at
    a gate; (head, gates)."""
    gates = setup.root / name
    gates.mkdir()
    (gates / "gate.py").write_text(gate)
    shard_cmd = [sys.executable, str(gates / "gate.py"), str(gates), str(REPO / "benchmarks" / "reach" / "episodes.py")]
    head = subprocess.Popen(
        [sys.executable, "-m", "harness", "--project", str(REPO), "run", "--agent", "kinematics-only"]
        + ["--cluster", "slurm", "--shards", "2", *args, "--", *shard_cmd],
        env=setup.slurm.env({**os.environ, "HARNESS_HOME": str(setup.home)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    at_gates = lambda: all((gates / f"started-{w}").exists() for w in waiting)  # noqa: E731
    _wait_for("the shards at their gates", lambda: at_gates() or head.poll() is not None)
    assert head.poll() is None, head.communicate()
    return head, gates


def test_a_slurm_run_scores_as_the_local_run_and_every_shard_is_proven(setup: Setup) -> None:
    """Three shards as one array job on the real scheduler: the same score and episodes as the
    same run on this machine alone, each shard run by its Slurm array task, the audit ok."""
    local = _harness(setup, "run", "--agent", "kinematics-only")
    assert local.returncode == 0, local.stderr
    alone = json.loads((_run_dir(local.stderr) / "result.json").read_text())

    result = _harness(setup, "run", "--agent", "kinematics-only", "--cluster", "slurm", "--shards", "3")
    assert result.returncode == 0, result.stderr + setup.slurm.logs()
    assert "accounting storage is disabled" not in result.stderr and "sacct error" not in result.stderr
    job = _array_job(result.stderr)
    run_dir = _run_dir(result.stderr)
    outcome = json.loads((run_dir / "result.json").read_text())
    assert outcome["score"] == alone["score"] == 1.0, outcome
    assert [s["status"] for s in outcome["shards"]] == ["ok"] * 3, outcome["shards"]
    assert [s["node_id"] for s in outcome["shards"]] == [f"slurm {job}_{i}" for i in range(3)], outcome["shards"]
    merged = json.loads((run_dir / "benchmark.json").read_text())
    single = json.loads((_run_dir(local.stderr) / "benchmark.json").read_text())
    assert merged["episodes"] == single["episodes"] == 20 and merged["successes"] == single["successes"], merged
    assert sorted(merged["episode_results"], key=lambda e: e["episode"]) == single["episode_results"]
    # The head has each result once the task wrote it; Slurm completes the task a moment later.
    done = lambda: all(setup.slurm.job(f"{job}_{i}")["JobState"] == "COMPLETED" for i in range(3))  # noqa: E731
    _wait_for("the array's tasks COMPLETED in Slurm", done, 60)
    assert setup.slurm.job(f"{job}_0")["JobName"] == f"harness-{run_dir.name}"

    audit = _harness(setup, "audit", run_dir.name)
    assert audit.returncode == 0, audit.stdout
    proven = [ln for ln in audit.stdout.splitlines() if ln.startswith("ok") and " shard " in ln]
    assert len(proven) == 3 and all("same 7 store paths" in ln for ln in proven), audit.stdout


def test_the_slurm_options_reach_the_real_sbatch(setup: Setup) -> None:
    """The deploy's ``[slurm]`` and ``--slurm`` over it are what Slurm holds of the array job
    (``scontrol show job``): partition, time limit, memory."""
    deploy = setup.root / "slurm-deploy.toml"
    deploy.write_text('[slurm]\npartition = "debug"\ntime = "0:45:00"\nmem = "512M"\n')
    result = _harness(
        setup,
        "--deploy",
        str(deploy),
        "run",
        "--agent",
        "kinematics-only",
        "--cluster",
        "slurm",
        "--shards",
        "2",
        "--slurm",
        "partition=lab",
        "--slurm",
        "mem=1G",
    )
    assert result.returncode == 0, result.stderr + setup.slurm.logs()
    job = _array_job(result.stderr)
    for task in (0, 1):
        held = setup.slurm.job(f"{job}_{task}")
        assert held["Partition"] == "lab", held
        assert held["TimeLimit"] == "00:45:00", held
        assert held["MinMemoryNode"] == "1G", held
    config = json.loads((_run_dir(result.stderr) / "config.json").read_text())
    assert config["cluster"]["slurm"] == {"partition": "lab", "time": "0:45:00", "mem": "1G"}
    assert setup.slurm.job(f"{job}_0")["Requeue"] == "0", "Slurm must not run a lost shard again itself"
    # A partition the cluster does not have: sbatch refuses the array, the head says which
    # options it asked for (exit 2, no internal error).
    refused = _harness(setup, "run", "--agent", "kinematics-only", "--cluster", "slurm", "--slurm", "partition=nope")
    assert refused.returncode == 2, refused.stderr
    assert "error: Slurm refused the array job (partition=nope): " in refused.stderr, refused.stderr
    assert "Invalid partition name" in refused.stderr and "internal error" not in refused.stderr


def test_task_states_come_from_squeue_where_slurm_keeps_no_accounting(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This cluster has no accounting database, so submitit's ``sacct`` fails; the head's
    watcher reads the states of an array's tasks from ``squeue`` instead (a task that ended
    without a result would otherwise keep the head waiting forever)."""
    from harness.runs.slurmstates import SlurmStates

    monkeypatch.setenv("SLURM_CONF", str(setup.slurm.conf))
    sacct = subprocess.run(["sacct", "-j", "1"], capture_output=True, text=True, timeout=60)
    assert sacct.returncode != 0 and "accounting storage is disabled" in sacct.stdout + sacct.stderr
    out = setup.slurm.command("sbatch", "--parsable", "--array=0-1", "--output=/dev/null", "--wrap", "exit 3")
    job = out.strip().split(";")[0]
    watcher = SlurmStates()
    _wait_for("both tasks to end", lambda: watcher.is_done(f"{job}_0", "force") and watcher.is_done(f"{job}_1"), 60)
    assert watcher.get_state(f"{job}_0", "cache") == watcher.get_state(f"{job}_1", "cache") == "FAILED"
    assert watcher.get_state("999999_0", "force") == "UNKNOWN"


def test_scancel_of_a_running_shard_is_recorded_as_a_cancel_and_resume_runs_it(setup: Setup) -> None:
    """``scancel`` of the array task of a running shard: the shard is recorded ``cancelled``
    naming the SIGTERM (not 'exited with 143'), the other shard is ok, the run exits 1 and the
    audit names the cancel; ``run --resume`` submits that shard alone and the run is whole."""
    head, gates = _gated(setup, "scancel")
    run_dir = Path((gates / "started-1-2").read_text()).parent.parent
    _wait_for("shard 0's record", lambda: (run_dir / "shards" / "0" / "shard.json").is_file())
    job = next(ln for ln in setup.slurm.command("squeue", "--noheader", "--format=%i").split() if ln.endswith("_1"))
    setup.slurm.command("scancel", job)
    _, err = head.communicate(timeout=180)
    assert head.returncode == 1, err
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    assert [s["status"] for s in shards] == ["ok", "cancelled"], shards
    assert "its task got SIGTERM (Slurm's scancel" in shards[1]["reason"], shards[1]["reason"]
    _wait_for("the task CANCELLED in Slurm", lambda: setup.slurm.job(job)["JobState"] == "CANCELLED", 60)
    audit = _harness(setup, "audit", run_dir.name)
    assert audit.returncode == 1, audit.stdout
    assert [ln.split(" ", 1)[0] for ln in audit.stdout.splitlines() if " shard " in ln] == ["ok", "cancelled"]

    (gates / "open").write_text("")
    resumed = _harness(setup, "run", "--resume", run_dir.name)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming 1 of 2 shards on slurm (1)" in resumed.stderr, resumed.stderr
    outcome = json.loads((run_dir / "result.json").read_text())
    assert [s["status"] for s in outcome["shards"]] == ["ok", "ok"] and outcome["exit_status"] == 0
    assert _harness(setup, "audit", run_dir.name).returncode == 0


def test_a_shard_whose_node_fails_is_lost_and_submitted_again_with_retries(setup: Setup) -> None:
    """The node of a running shard set down (as Slurm does to a node that stopped answering):
    Slurm ends the task with ``NODE_FAIL`` and, the array being submitted ``--no-requeue``, does
    not run it again itself; the shard is recorded lost and the head submits it again
    (``--retries 1``), in an array of its own, once the node is back: every shard ok, two
    attempts of shard 1 each naming its Slurm task."""
    head, gates = _gated(setup, "node-fail", "--retries", "1")
    run_dir = Path((gates / "started-1-2").read_text()).parent.parent
    _wait_for("shard 0's record", lambda: (run_dir / "shards" / "0" / "shard.json").is_file())
    job = next(ln for ln in setup.slurm.command("squeue", "--noheader", "--format=%i").split() if ln.endswith("_1"))
    setup.slurm.command("scontrol", "update", "nodename=localhost", "state=down", "reason=harness-test")
    try:
        _wait_for("the task's node failure", lambda: setup.slurm.job(job)["JobState"] == "NODE_FAIL", 60)
    finally:
        # The node answers, so Slurm returns it to service itself (ReturnToService=2); else:
        setup.slurm.command("scontrol", "update", "nodename=localhost", "state=resume", check=False)
    (gates / "open").write_text("")
    _, err = head.communicate(timeout=180)
    assert head.returncode == 0, err + setup.slurm.logs()
    assert "shard 1/2: its node was lost (NODE_FAIL)" in err and "; submitted again" in err, err
    outcome = json.loads((_run_dir(err) / "result.json").read_text())
    assert [s["status"] for s in outcome["shards"]] == ["ok", "ok"], outcome["shards"]
    attempts = outcome["shards"][1]["attempts"]
    assert [a["status"] for a in attempts] == ["lost", "ok"] and attempts[0]["job_id"] == job, attempts
    assert attempts[1]["job_id"].split("_")[0] != job.split("_")[0], "submitted again as an array of its own"


def test_scancel_of_the_shard_that_started_the_nodes_broker_leaves_the_joined_shard_ok(setup: Setup) -> None:
    """Two shards on the one node share its broker, started by one of them as its task's
    child: ``scancel`` of that task ends the broker with it (Slurm ends every process of a
    task). The other shard, joined and waiting at its gate, notices, starts a new broker on
    the same URL and ports and rejoins with its command's token; opened, its episodes run and
    it is ok, its record naming what happened. The cancelled shard is recorded cancelled."""
    head, gates = _gated(setup, "broker-cancel", gate=GATE_EACH, waiting=("0-2", "1-2"))
    run_dir = Path((gates / "started-1-2").read_text()).parent.parent
    node = run_dir / "node"
    starter = json.loads((node / "started-by.json").read_text())
    index = int(starter["run"].split()[1])
    other = 1 - index
    url = json.loads((node / "broker.json").read_text())["url"]
    job = next(
        ln for ln in setup.slurm.command("squeue", "--noheader", "--format=%i").split() if ln.endswith(f"_{index}")
    )
    setup.slurm.command("scancel", job)

    def restarted() -> bool:
        now = json.loads((node / "started-by.json").read_text())
        state = node / "broker.json"
        return now["run"] == f"shard {other}" and state.is_file() and json.loads(state.read_text())["url"] == url

    _wait_for("the other shard's new broker", restarted, 120)
    (gates / f"open-{other}-2").write_text("")
    _, err = head.communicate(timeout=240)
    assert head.returncode == 1, err + setup.slurm.logs()
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    assert shards[index]["status"] == "cancelled", shards[index]
    assert shards[other]["status"] == "ok" and shards[other]["score"] == 1.0, shards[other]
    restarts = shards[other]["broker_restarts"]
    assert [(r["gone_pid"], r["started_by"], r["restarted_by"]) for r in restarts] == [
        (starter["broker_pid"], f"shard {index}", f"shard {other}")
    ], restarts
    assert f"started by shard {index}, was cancelled with it" in restarts[0]["reason"], restarts
    recorded = json.loads((run_dir / "shards" / str(other) / "config.json").read_text())["broker"]
    assert recorded["restarts"] == restarts and recorded["url"] == url
    assert json.loads((run_dir / "shards" / str(other) / "shard.json").read_text())["broker_restarts"] == restarts
    # kinematics-only has no scoped service: the restart lost no reset, and no impurity says so.
    impurities = json.loads((run_dir / "result.json").read_text())["impurities"]
    assert not [i for i in impurities if i.startswith("scoped resets of ")], impurities


def test_the_shard_that_started_the_nodes_broker_keeps_its_task_until_the_joined_shard_is_done(setup: Setup) -> None:
    """Two shards on the one node share its broker. On a Slurm whose process tracking is a
    cgroup, the broker ends with the task of the shard that started it, a normal end too; so
    that shard, its episodes over, hands its result to the head at once (``shard.json`` ok
    while its task still runs) and keeps its task until the other shard's command is over.
    This cluster tracks processes by parentage (no cgroups), where a finished task's broker
    lives on: the test ends it itself as the starter's task leaves ``squeue``, as a cgroup
    would. The joined shard then sees no restart, and the service started once on the node."""
    import signal
    import threading

    head, gates = _gated(setup, "broker-kept", gate=GATE_EACH, waiting=("0-2", "1-2"))
    run_dir, node, starter, index, task = _broker_starter(setup, gates)
    other = 1 - index
    killed: list[int] = []

    def end_with_the_task() -> None:  # what proctrack/cgroup does as the starter's task ends
        while task in setup.slurm.command("squeue", "--noheader", "--format=%i", check=False).split():
            time.sleep(0.2)
        if (node / "broker.json").is_file() and json.loads((node / "broker.json").read_text())["pid"] == starter[
            "broker_pid"
        ]:
            try:
                os.kill(starter["broker_pid"], signal.SIGKILL)
                killed.append(starter["broker_pid"])
            except ProcessLookupError:
                pass

    cgroup = threading.Thread(target=end_with_the_task, daemon=True)
    cgroup.start()
    (gates / f"open-{index}-2").write_text("")
    record = run_dir / "shards" / str(index) / "shard.json"
    _wait_for("the starter's record", lambda: record.is_file(), 120)
    time.sleep(3)  # its task keeps the node's broker for the other shard, at its gate
    early = json.loads(record.read_text())
    assert early["status"] == "ok" and "held_broker_for" not in early, early
    assert cgroup.is_alive(), "the starter's task ended while the other shard was joined to its broker"
    (gates / f"open-{other}-2").write_text("")
    _, err = head.communicate(timeout=240)
    assert head.returncode == 0, err + setup.slurm.logs()
    cgroup.join(timeout=60)
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    assert [s["status"] for s in shards] == ["ok", "ok"], shards
    held = shards[index]
    assert held["held_broker_for"] == [f"shard {other}"] and "held_broker_stopped" not in held, held
    # Its task ended only once the other shard's episodes were over.
    assert held["ended"] + held["held_broker_s"] >= float((gates / f"ended-{other}-2").read_text()), held
    assert "broker_restarts" not in shards[other], shards[other]
    assert json.loads((node / "started-by.json").read_text())["broker_pid"] == starter["broker_pid"]
    starts = [ln for ln in (node / "logs" / "broker.log").read_text().splitlines() if " start kinematics" in ln]
    assert len(starts) == 1, starts
    ended = json.loads((node / "ended.json").read_text())
    assert ended["run"] == f"shard {index}" and ended["finished"] is True, ended


def test_scancel_of_the_shard_keeping_the_nodes_broker_ends_it_at_once(setup: Setup) -> None:
    """The shard that started the node's broker, its episodes over, keeps its task for the
    other shard: ``scancel`` of that task ends its wait at once (well within Slurm's
    KillWait). Its record stays ok, saying the signal cut the wait; the broker goes with the
    task and the joined shard starts it again, naming why, and is ok too."""
    head, gates = _gated(setup, "broker-kept-cancel", gate=GATE_EACH, waiting=("0-2", "1-2"))
    run_dir, node, starter, index, task = _broker_starter(setup, gates)
    other = 1 - index
    (gates / f"open-{index}-2").write_text("")
    _wait_for("the starter's record", lambda: (run_dir / "shards" / str(index) / "shard.json").is_file(), 120)
    setup.slurm.command("scancel", task)
    queued = lambda: task in setup.slurm.command("squeue", "--noheader", "--format=%i").split()  # noqa: E731
    _wait_for("the starter's task to end", lambda: not queued(), 60)
    # Ended by its own handler, not by Slurm's SIGKILL after KillWait: only a task that returned
    # says which signal cut its wait (a killed one is recorded as the engine saw it end).
    _wait_for(
        "the other shard's new broker",
        lambda: json.loads((node / "started-by.json").read_text())["run"] == f"shard {other}",
        120,
    )
    (gates / f"open-{other}-2").write_text("")
    _, err = head.communicate(timeout=240)
    assert head.returncode == 0, err + setup.slurm.logs()
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    assert [s["status"] for s in shards] == ["ok", "ok"], shards
    assert shards[index]["held_broker_for"] == [f"shard {other}"], shards[index]
    assert shards[index]["held_broker_stopped"] == "SIGTERM", shards[index]
    [restart] = shards[other]["broker_restarts"]
    assert f"started by shard {index}, was cancelled with it (SIGTERM while it kept" in restart["reason"], restart


def _broker_starter(setup: Setup, gates: Path) -> tuple[Path, Path, dict[str, Any], int, str]:
    """Of a two-shard run whose shards both wait at their gates: its run folder, its node's
    state folder, that node's ``started-by.json``, the index of the shard that started the
    broker and that shard's Slurm task id."""
    run_dir = Path((gates / "started-1-2").read_text()).parent.parent
    node = run_dir / "node"
    starter = json.loads((node / "started-by.json").read_text())
    index = int(starter["run"].split()[1])
    task = next(
        ln for ln in setup.slurm.command("squeue", "--noheader", "--format=%i").split() if ln.endswith(f"_{index}")
    )
    return run_dir, node, starter, index, task
