"""``harness run --cluster`` on a real local Ray cluster: a head and a second node on loopback.

The nodes are two ``ray start`` processes with their own temporary folders and their own
``HARNESS_HOME`` (tests/raycluster.py): the head's home is realized and signs its pushes to
a directory cache; the second node's home starts empty and realizes the run's closure from
that cache. Runs use the repository's own example: the kinematics-only agent on the reach
benchmark (realizing kinematics reads numpy from the package registry, which CI reaches).

Skipped, saying why, where Ray is not installed (``pip install -e '.[ray]'``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' to run the cluster tests")

from harness.runs.shard import ShardJob
from harness.runtime.broker import find_brokers
from harness.store.store import remove_tree
from tests.clusters import start_while_realizing
from tests.conftest import REPO
from tests.raycluster import Cluster, sign_into_lab_cache, start_cluster

pytestmark = pytest.mark.network

# Waits for the shards of a command, then runs the reach episodes of its shard. It notes where
# it started, so a test can act (kill a node, press Ctrl-C) while shards are surely running.
GATE = r"""
import os, runpy, sys, time
from pathlib import Path
gates = Path(sys.argv[1])
shard = os.environ["HARNESS_SHARD"].replace("/", "-")
# Written whole, then renamed: a reader never sees the marker empty (it holds the run dir).
(gates / f".part-{os.getpid()}").write_text(os.environ.get("HARNESS_RUN_DIR", ""))
os.replace(gates / f".part-{os.getpid()}", gates / f"started-{shard}-{os.getpid()}")
while not (gates / "open").exists():
    time.sleep(0.1)
episodes = sys.argv[2]
sys.argv = [episodes, "--episodes", "20", "--seed", "0"]
runpy.run_path(episodes, run_name="__main__")
"""


@dataclass
class Setup:
    cluster: Cluster
    cache: Path
    gates: Path


def _harness(
    setup: Setup, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "HARNESS_HOME": str(setup.cluster.head.home),
        "RAY_ADDRESS": setup.cluster.address,
        **(env or {}),
    }
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--project", str(REPO), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _run_dir(setup: Setup, stderr: str) -> Path:
    line = [ln for ln in stderr.splitlines() if "; record " in ln][-1]
    return Path(line.rsplit("; record ", 1)[1].strip())


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("cluster")
    head_home = root / "home-head"
    head_home.mkdir()
    _, cache = sign_into_lab_cache(root, head_home)
    cluster = start_while_realizing(REPO, head_home, lambda: start_cluster(root), Cluster.stop)
    try:
        gates = root / "gates"
        gates.mkdir()
        (gates / "gate.py").write_text(GATE)
        yield Setup(cluster, cache, gates)
    finally:
        cluster.stop()


def test_node_that_cannot_realize_fails_its_shard_with_the_reason(setup: Setup) -> None:
    """No cache and --offline: the second node's empty home cannot realize; its shards fail
    naming the node's home and what is missing; the head's shards still run; exit 1."""
    # Empty whatever another test of this module realized there first.
    remove_tree(setup.cluster.second.home / "store")
    result = _harness(
        setup,
        "run",
        "--agent",
        "kinematics-only",
        "--cluster",
        "ray",
        "--shards",
        "2",
        "--offline",
        env={"HARNESS_SUBSTITUTERS": ""},
    )
    assert result.returncode == 1, result.stderr
    outcome = json.loads((_run_dir(setup, result.stderr) / "result.json").read_text())
    second = str(setup.cluster.second.home)
    on_second = [s for s in outcome["shards"] if s["home"] == second]
    assert on_second, f"shards are spread over both nodes: {outcome['shards']}"
    for shard in on_second:
        assert shard["status"] == "failed"
        assert second in shard["reason"] and "offline, and the store lacks" in shard["reason"], shard["reason"]
    assert not (setup.cluster.second.home / "store").is_dir() or not any(
        p.name.endswith("-kinematics-env") for p in (setup.cluster.second.home / "store").iterdir()
    )


def test_four_shards_on_two_nodes_equal_one_shard_and_audit(setup: Setup) -> None:
    """4 shards over both nodes (the second realizing from the head's signed cache) run the
    same episodes with the same targets and score as 1 shard; the audit proves every shard
    ran the lock's store paths and names a node whose record says otherwise."""
    four = _harness(setup, "run", "--agent", "kinematics-only", "--cluster", setup.cluster.client, "--shards", "4")
    assert four.returncode == 0, four.stderr
    assert "note: the head has no GPU, so the run is planned without one" in four.stderr
    run4 = _run_dir(setup, four.stderr)
    config = json.loads((run4 / "config.json").read_text())
    # The whole closure is in the head's cache: pushed now, or already there from another
    # test of this module that ran first.
    push = config["cluster"]["push"]
    assert push["cache"] and push["pushed"] + push["present"] > 0, push
    outcome = json.loads((run4 / "result.json").read_text())
    shards = outcome["shards"]
    assert [s["status"] for s in shards] == ["ok"] * 4
    assert {s["home"] for s in shards} == {str(setup.cluster.head.home), str(setup.cluster.second.home)}
    assert len({s["closure_digest"] for s in shards}) == 1 and all(s["same_closure"] for s in shards)
    for shard in shards:
        record = run4 / "shards" / str(shard["index"])
        assert json.loads((record / "benchmark.json").read_text())["shard"] == f"{shard['index']}/4"
        assert (record / "logs" / "command.log").is_file()
        # No GPU here: none given by Ray, none used by the node's CPU-only service, none idle.
        assert shard["gpus"] == {"given": [], "used": [], "idle": []}, shard
    # The second node realized from the cache into its own store.
    second_store = setup.cluster.second.home / "store"
    assert any(p.name.endswith("-kinematics-env") for p in second_store.iterdir())
    _one_broker_and_one_start_per_node(run4, shards)

    one = _harness(setup, "run", "--agent", "kinematics-only", "--cluster", "ray", "--shards", "1")
    assert one.returncode == 0, one.stderr
    run1 = _run_dir(setup, one.stderr)
    again = json.loads((run1 / "config.json").read_text())["cluster"]["push"]
    assert again["pushed"] == 0, "a second push of the same closure transfers nothing"
    b4 = json.loads((run4 / "benchmark.json").read_text())
    b1 = json.loads((run1 / "benchmark.json").read_text())
    assert b4["episodes"] == b1["episodes"] == 20
    assert [e["target"] for e in b4["episode_results"]] == [e["target"] for e in b1["episode_results"]]
    assert b4["successes"] == b1["successes"] and outcome["score"] == b1["success_rate"]

    audit = _harness(setup, "audit", run4.name)
    assert audit.returncode == 0, audit.stdout
    assert audit.stdout.count("same ") == 4 and str(setup.cluster.second.home) in audit.stdout
    # A node whose record says it computed with other bits is named.
    tampered = next(s for s in shards if s["home"] == str(setup.cluster.second.home))
    lock_file = run4 / "shards" / str(tampered["index"]) / "lock.json"
    closure = json.loads(lock_file.read_text())
    entry = next(e for e in closure["store_paths"] if e["path"].endswith("-kinematics-env"))
    entry["content"] = "blake3:" + "0" * 64
    lock_file.write_text(json.dumps(closure))
    audit = _harness(setup, "audit", run4.name)
    assert audit.returncode == 1
    bad = [ln for ln in audit.stdout.splitlines() if ln.startswith("modified")]
    assert len(bad) == 1 and str(setup.cluster.second.home) in bad[0] and entry["path"] in bad[0], audit.stdout


def _one_broker_and_one_start_per_node(run_dir: Path, shards: list[dict[str, object]]) -> None:
    """The shards on one node shared one broker there (the same process served each) and the
    kinematics service started once per node, not once per shard; the broker and the service
    then end, leaving nothing running on the node."""
    from harness.runs.nodebroker import LINGER_S

    by_home: dict[str, list[dict[str, object]]] = {}
    for shard in shards:
        by_home.setdefault(str(shard["home"]), []).append(shard)
    assert any(len(on) >= 2 for on in by_home.values()), f"two shards share a node: {by_home}"
    for home, on in by_home.items():
        brokers = {
            json.loads((run_dir / "shards" / str(s["index"]) / "config.json").read_text())["broker"]["pid"] for s in on
        }
        assert len(brokers) == 1, f"{len(on)} shards on {home} were served by brokers {brokers}"
        state = Path(home) / "runs" / run_dir.name / "node"
        starts = [ln for ln in (state / "logs" / "broker.log").read_text().splitlines() if " start kinematics " in ln]
        assert len(starts) == 1, f"{len(on)} shards on {home}, kinematics started {len(starts)} times: {starts}"
        # It ends once no shard is joined (LINGER_S later, or with the Ray job, which kills the
        # processes of its workers): either way the service it started is stopped with it.
        pid, port = brokers.pop(), json.loads((state / "ports.json").read_text())["kinematics"]
        _wait_for(f"the broker of {home} to end", lambda pid=pid: not _alive(pid), LINGER_S + 60)
        _wait_for(f"the kinematics service of {home} to stop", lambda port=port: not _answers(port), 60)


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _audit_lines(setup: Setup, run_dir: Path) -> tuple[int, list[str]]:
    audit = _harness(setup, "audit", run_dir.name)
    return audit.returncode, [ln for ln in audit.stdout.splitlines() if ln.split(" ", 1)[0] != "ok"]


def test_a_tampered_node_environment_is_refused_and_fails_the_audit_and_diff(setup: Setup) -> None:
    """A file changed in the second node's copy of the environment: its shards are refused
    at launch; ``audit`` exits 1 naming node, home and the changed file for each of them
    (though their lock.json, written before the launch check, is the head's), and ``diff``
    against a good run names the shards that failed."""
    good = _harness(setup, "run", "--agent", "kinematics-only", "--cluster", "ray", "--shards", "4")
    assert good.returncode == 0, good.stderr
    second = setup.cluster.second.home
    env = next(p for p in (second / "store").iterdir() if p.name.endswith("-kinematics-env"))
    cfg = env / "pyvenv.cfg"
    original = cfg.read_bytes()
    cfg.chmod(0o644)
    cfg.write_bytes(original + b"# changed on this node\n")
    try:
        bad = _harness(setup, "run", "--agent", "kinematics-only", "--cluster", "ray", "--shards", "4")
    finally:
        cfg.write_bytes(original)
        cfg.chmod(0o444)
        os.utime(cfg, (1, 1))
    assert bad.returncode == 1, bad.stderr
    run_dir = _run_dir(setup, bad.stderr)
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    refused = [s for s in shards if s["home"] == str(second)]
    assert refused and all(s["status"] == "failed" for s in refused), shards
    # Its shards parked the node's broker ahead of the check (its start-up overlaps the
    # proof): refused, they ended it having started nothing, and no broker is left there.
    node = second / "runs" / run_dir.name / "node"
    assert "start kinematics" not in (node / "logs" / "broker.log").read_text()
    assert not list((second / "runs" / run_dir.name).rglob("kinematics.log"))
    assert find_brokers(node) == [] and not list(node.glob("parked.*"))
    code, lines = _audit_lines(setup, run_dir)
    assert code == 1
    named = [ln for ln in lines if ln.startswith("modified  shard ")]
    assert len(named) == len(refused), lines
    for line in named:
        assert str(second) in line and "refused at launch" in line and "pyvenv.cfg" in line, line
    diff = _harness(setup, "diff", _run_dir(setup, good.stderr).name, run_dir.name)
    assert diff.returncode == 0 and "→ failed" in diff.stdout, diff.stdout


def _plant_other_host_copy(head: Path, second: Path) -> tuple[str, str, str]:
    """Register in the second node's (emptied) store a host copy of the lock's interpreter
    that differs from the head's by one stdlib file, noted as its stand-in, as realize would
    on a node whose host Python differs: (lock interpreter, the head's copy, this one)."""
    import shutil

    from harness.lock.lockfile import read
    from harness.lock.storepaths import host_interpreter_path
    from harness.store.hashing import nar_digest
    from harness.store.standins import remember_standin, standin_for
    from harness.store.store import BuildResult, Store

    python = read(REPO / "locks" / "kinematics.lock.toml").python
    theirs = standin_for(Store.in_home(head), python.store)
    if theirs is None:
        pytest.skip("the head runs the lock's own interpreter: no host copy stands in to differ from")
    remove_tree(second / "store")
    copy = second / "other-python"
    shutil.copytree(Store.in_home(head).root / theirs, copy, symlinks=True)
    stdlib = next(copy.glob("lib/python3.*"))
    stdlib.chmod(0o755)
    (stdlib / "this_node_only.py").write_text("# a stdlib file the head's interpreter lacks\n")
    digest = nar_digest(copy).hash
    mine = host_interpreter_path(python, digest)
    store = Store.in_home(second)

    def build(out: Path) -> BuildResult:
        shutil.copytree(copy, out, symlinks=True)
        return BuildResult(obtained="a test's copy", impure="host: a test's copy")

    store.add(mine, "python", build, expected_content=digest)
    remove_tree(copy)
    remember_standin(store, python.store, mine, "the test: this node's host Python differs by one stdlib file")
    return python.store, theirs, mine


def test_a_node_with_another_interpreter_refuses_at_once_then_pulls_the_heads(setup: Setup) -> None:
    """The second node's host Python differs from the head's by one stdlib file. Without a
    cache its shards refuse before anything is realized or started there, naming the
    interpreters (the head's shards run; audit names the node). With the head's signed
    cache the node pulls the head's stand-in and the environments on it and computes with
    the head's exact closure."""
    second = setup.cluster.second.home
    own, theirs, mine = _plant_other_host_copy(setup.cluster.head.home, second)
    result = _harness(
        setup,
        "run",
        "--agent",
        "kinematics-only",
        "--cluster",
        "ray",
        "--shards",
        "4",
        env={"HARNESS_SUBSTITUTERS": ""},
    )
    assert result.returncode == 1, result.stderr
    run_dir = _run_dir(setup, result.stderr)
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    on_second = [s for s in shards if s["home"] == str(second)]
    assert on_second and all(s["status"] == "failed" and s["closure_refused"] for s in on_second), shards
    for shard in on_second:
        reason = shard["reason"]
        assert "refusing to compute: this node's closure is not the head's" in reason, reason
        told = f"kinematics: interpreter (a host copy standing in for {own}): {theirs} on the head, {mine} here"
        assert told in reason, reason
        record = run_dir / "shards" / str(shard["index"])  # nothing was computed there
        assert not (record / "benchmark.json").exists() and not (record / "logs" / "command.log").exists()
    assert all(s["status"] == "ok" for s in shards if s["home"] != str(second)), shards
    assert not any(p.name.endswith("-env") for p in (second / "store").iterdir()), "nothing was built there"
    code, lines = _audit_lines(setup, run_dir)
    shard_lines = [ln for ln in lines if " shard " in ln]
    assert code == 1 and len(shard_lines) == len(on_second), lines
    assert all(str(second) in ln and "refused before its first episode" in ln for ln in shard_lines), lines

    again = _harness(setup, "run", "--agent", "kinematics-only", "--cluster", "ray", "--shards", "4")
    assert again.returncode == 0, again.stderr
    run_dir = _run_dir(setup, again.stderr)
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    assert all(s["same_closure"] for s in shards) and any(s["home"] == str(second) for s in shards), shards
    logs = [(run_dir / "shards" / str(s["index"]) / "logs" / "shard.log") for s in shards if s["home"] == str(second)]
    assert any(f"stand-in: the head's {theirs} stands in for {own}" in log.read_text() for log in logs)


def _gated(setup: Setup, tag: str, shards: int) -> tuple[subprocess.Popen[str], Path]:
    gates = setup.gates / tag
    gates.mkdir()
    env = {**os.environ, "HARNESS_HOME": str(setup.cluster.head.home), "RAY_ADDRESS": setup.cluster.address}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "--project",
            str(REPO),
            "run",
            "--agent",
            "kinematics-only",
            "--cluster",
            "ray",
            "--shards",
            str(shards),
            "--",
            sys.executable,
            str(setup.gates / "gate.py"),
            str(gates),
            str(REPO / "benchmarks" / "reach" / "episodes.py"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, gates


def _wait_started(proc: subprocess.Popen[str], gates: Path, count: int, home: Path | None = None) -> list[Path]:
    """Until ``count`` shards wait at the gate (on ``home``'s node, when given)."""
    deadline = time.time() + 300
    while time.time() < deadline:
        started = [p for p in gates.glob("started-*") if home is None or str(home) in p.read_text()]
        if len(started) >= count:
            return started
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.communicate()}")
        time.sleep(0.2)
    raise AssertionError("shards did not start")


def test_ctrl_c_cancels_every_shard_and_stops_their_services(setup: Setup) -> None:
    proc, gates = _gated(setup, "cancel", 2)
    _wait_started(proc, gates, 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    run_dir = _run_dir(setup, err)
    outcome = json.loads((run_dir / "result.json").read_text())
    assert [s["status"] for s in outcome["shards"]] == ["cancelled"] * 2, outcome["shards"]
    # Every service a shard started was stopped: nothing answers on the ports its plan gave them.
    ports = []
    for shard in outcome["shards"]:
        config = json.loads((run_dir / "shards" / str(shard["index"]) / "config.json").read_text())
        ports += [s["port"] for s in config["plan"]["services"] if s["port"]]
    assert len(ports) == 2
    for port in ports:
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"a service still answers on port {port}"


def test_runs_logs_follows_the_shards_output_as_it_comes(setup: Setup) -> None:
    """While both shards wait at the gate, ``harness runs logs RUN -f`` already shows each
    one's progress (the closure check, the command started), from both nodes; once the gate
    opens it shows the command's own output and ends with the run."""
    proc, gates = _gated(setup, "logs", 2)
    started = _wait_started(proc, gates, 2)
    run_id = Path(started[0].read_text()).parts[-3]  # HARNESS_RUN_DIR: <home>/runs/<id>/shards/<I>
    env = {**os.environ, "HARNESS_HOME": str(setup.cluster.head.home)}
    follow = subprocess.Popen(
        [sys.executable, "-m", "harness", "--project", str(REPO), "runs", "logs", run_id, "-f"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        live = setup.cluster.head.home / "runs" / run_id / "live"
        _wait_for(
            "both shards' progress in their live logs",
            lambda: (
                all("running:" in p.read_text() for p in (live / "0.log", live / "1.log") if p.is_file())
                and len(list(live.glob("*.log"))) == 2
            ),
            120,
        )
        assert proc.poll() is None, "the shards still wait at the gate: the output came as it was written"
        (gates / "open").write_text("")
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        out, follow_err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0 and "has ended" in follow_err, follow_err
    for index in (0, 1):
        mine = [ln for ln in out.splitlines() if ln.startswith(f"shard {index} | ")]
        assert any("--- shard" in ln for ln in mine), out
        assert any("store paths expected of this node" in ln for ln in mine), out
        assert any("success" in ln.lower() or "episode" in ln.lower() for ln in mine), out
    homes = {str(setup.cluster.head.home), str(setup.cluster.second.home)}
    assert {h for h in homes if h in out} == homes, "both nodes' shards reported"


def test_a_detached_run_goes_on_without_the_shell_that_started_it(setup: Setup) -> None:
    """``--detach`` returns the run id once the run is recorded, while its shards still wait
    at the gate: the head runs on in a session of its own (no terminal's hangup reaches it),
    drives the Ray job to its end and records the run; its log is in the run's folder."""
    gates = setup.gates / "detach"
    gates.mkdir()
    result = _harness(
        setup,
        "run",
        "--agent",
        "kinematics-only",
        "--cluster",
        "ray",
        "--shards",
        "2",
        "--detach",
        "--",
        sys.executable,
        str(setup.gates / "gate.py"),
        str(gates),
        str(REPO / "benchmarks" / "reach" / "episodes.py"),
    )
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    pid = int(result.stderr.split("its head is pid ", 1)[1].split()[0])
    run_dir = setup.cluster.head.home / "runs" / run_id
    try:
        assert (run_dir / "config.json").is_file() and not (run_dir / "result.json").exists()
        assert _alive(pid) and os.getsid(pid) == pid != os.getsid(0), "the head leads a session of its own"
        _wait_for("both shards at the gate", lambda: len(list(gates.glob("started-*"))) == 2)
        (gates / "open").write_text("")
        _wait_for("the detached head to record the run", lambda: (run_dir / "result.json").is_file())
        _wait_for("the detached head to end", lambda: not _alive(pid), 60)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    outcome = json.loads((run_dir / "result.json").read_text())
    assert outcome["exit_status"] == 0 and [s["status"] for s in outcome["shards"]] == ["ok", "ok"], outcome
    log = (run_dir / "head.log").read_text()
    assert f"run {run_id}: 2 shards on ray" in log and f"run {run_id}: exit 0" in log, log


def test_slurm_array_through_submitit_local(setup: Setup) -> None:
    """``--cluster slurm-local``: the same shards as one submitit array job, on this machine
    (submitit's local executor; a real Slurm takes ``--cluster slurm``)."""
    pytest.importorskip("submitit", reason="submitit is not installed: pip install -e '.[slurm]'")
    # --gpus: the GPUs of one node, which the GPU-less head plans for; each node plans its own.
    result = _harness(
        setup, "run", "--agent", "kinematics-only", "--cluster", "slurm-local", "--shards", "2", "--gpus", "1x24"
    )
    assert result.returncode == 0, result.stderr
    assert "submitted array job" in result.stderr
    assert "the head has no GPU" not in result.stderr
    run_dir = _run_dir(setup, result.stderr)
    outcome = json.loads((run_dir / "result.json").read_text())
    assert [s["status"] for s in outcome["shards"]] == ["ok", "ok"]
    assert json.loads((run_dir / "benchmark.json").read_text())["episodes"] == 20
    config = json.loads((run_dir / "config.json").read_text())
    assert config["cluster"]["node_gpus"] == "1x24"
    assert [g["total_gb"] for g in config["plan"]["gpus"]] == [24.0], config["plan"]["gpus"]
    for index in (0, 1):  # this machine has no GPU: the shard's own plan has none
        assert json.loads((run_dir / "shards" / str(index) / "config.json").read_text())["plan"]["gpus"] == []
    # Both tasks ran on this machine: they shared its broker, which ended itself once neither
    # was joined any more (nothing kills it here, unlike Ray at the end of its job).
    from harness.runs.nodebroker import linger_seconds

    brokers = {json.loads((run_dir / "shards" / str(i) / "config.json").read_text())["broker"]["pid"] for i in (0, 1)}
    assert len(brokers) == 1, brokers
    pid = brokers.pop()
    _wait_for("the node's broker to end itself", lambda: not _alive(pid), linger_seconds() + 60)
    log = (setup.cluster.head.home / "runs" / run_dir.name / "node" / "logs" / "broker.log").read_text()
    assert f"no run joined for {linger_seconds():g} s: shutting down" in log and "broker: stopped" in log, log
    # Each task appended its output to the run's folder as it went (a filesystem both see).
    for index in (0, 1):
        live = (run_dir / "live" / f"{index}.log").read_text()
        assert f"--- shard {index}/2" in live and "store paths expected of this node" in live, live


# Shard 0 runs its episodes at once; the others wait at the gate as GATE's do.
FIRST_FREE = GATE.replace(
    'while not (gates / "open").exists():',
    'while not os.environ["HARNESS_SHARD"].startswith("0/") and not (gates / "open").exists():',
)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_for(
    what: str, check: Callable[[], bool], timeout: float = 300, context: Callable[[], str] | None = None
) -> None:
    """Wait until ``check()``; on timeout fail naming ``what``, with ``context()`` (logs) appended."""
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f"\n{context()}" if context else ""))
        time.sleep(0.2)


def _run_state(head_log: Path, run_dir: Path | None = None) -> str:
    """The head's log and the run folder's files with the shards' live logs: what a timeout shows."""
    parts = [f"--- {head_log}:\n{head_log.read_text(errors='replace')[-6000:]}"]
    if run_dir is not None and run_dir.is_dir():
        files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
        parts.append(f"--- files of {run_dir}: {files[:200]}")
        for live in sorted((run_dir / "live").glob("*.log")):
            parts.append(f"--- {live}:\n{live.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


def test_a_killed_head_leaves_a_run_that_resume_completes(setup: Setup, tmp_path: Path) -> None:
    """The head (``--cluster slurm-local``) is SIGKILLed once shard 0 is recorded while shard
    1 waits: shard 0's record is already in the run's folder. ``run --resume`` runs shard 1
    alone, with the run's closure; the run then holds both shards and its audit passes.
    A second resume has nothing to run."""
    pytest.importorskip("submitit", reason="submitit is not installed: pip install -e '.[slurm]'")
    gates = setup.gates / "resume"
    gates.mkdir()
    (gates / "gate.py").write_text(FIRST_FREE)
    env = {**os.environ, "HARNESS_HOME": str(setup.cluster.head.home)}
    argv = [sys.executable, "-m", "harness", "--project", str(REPO), "run", "--agent", "kinematics-only"]
    shard_cmd = [sys.executable, str(gates / "gate.py"), str(gates), str(REPO / "benchmarks" / "reach" / "episodes.py")]
    with open(tmp_path / "head.log", "w") as log:
        head = subprocess.Popen(
            [*argv, "--cluster", "slurm-local", "--shards", "2", "--", *shard_cmd],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    tasks: list[int] = []
    try:
        _wait_for(
            "shard 1 at its gate",
            lambda: any(gates.glob("started-1-2-*")) or head.poll() is not None,
            context=lambda: _run_state(tmp_path / "head.log"),
        )
        assert head.poll() is None, (tmp_path / "head.log").read_text()
        run_dir = Path(next(gates.glob("started-1-2-*")).read_text()).parent.parent
        _wait_for(
            "shard 0's record",
            lambda: (run_dir / "shards" / "0" / "shard.json").is_file(),
            context=lambda: _run_state(tmp_path / "head.log", run_dir),
        )
        tasks = [int(p.name) for p in (run_dir / "engine").iterdir() if p.name.isdigit()]
        head.kill()
        head.wait()
        first = json.loads((run_dir / "shards" / "0" / "shard.json").read_text())
        assert first["status"] == "ok" and not (run_dir / "result.json").exists()
        # Shard 1's task outlives its head (as a Slurm job does) and ends on its own.
        (gates / "open").write_text("")
        _wait_for("the orphaned tasks to end", lambda: not any(_alive(pid) for pid in tasks))
    finally:
        if head.poll() is None:
            head.kill()
        for pid in tasks:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)
    assert not (run_dir / "shards" / "1" / "shard.json").exists(), "the head died before it recorded shard 1"

    resumed = _harness(setup, "run", "--resume", run_dir.name)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming 1 of 2 shards on slurm-local (1)" in resumed.stderr, resumed.stderr
    outcome = json.loads((run_dir / "result.json").read_text())
    assert [s["status"] for s in outcome["shards"]] == ["ok", "ok"] and outcome["exit_status"] == 0
    assert json.loads((run_dir / "shards" / "0" / "shard.json").read_text()) == first, "shard 0 was not run again"
    assert (run_dir / "superseded" / "1.1").is_dir(), "shard 1's earlier record is kept aside"
    assert json.loads((run_dir / "benchmark.json").read_text())["episodes"] == 20
    config = json.loads((run_dir / "config.json").read_text())
    assert [r["shards"] for r in config["cluster"]["resumes"]] == [[1]]
    audit = _harness(setup, "audit", run_dir.name)
    assert audit.returncode == 0, audit.stdout
    assert audit.stdout.count("same ") == 2, audit.stdout
    again = _harness(setup, "run", "--resume", run_dir.name)
    assert again.returncode == 0 and "has a good record; nothing to run" in again.stderr, again.stderr
    # A run whose recorded closure the project no longer gives is refused, naming the path.
    from harness.runs.closures import closure_digest

    lock = json.loads((run_dir / "lock.json").read_text())
    entry = next(e for e in lock["store_paths"] if e["path"].endswith("-kinematics-env"))
    entry["content"] = "blake3:" + "0" * 64
    (run_dir / "lock.json").write_text(json.dumps(lock))
    config["cluster"]["closure_digest"] = closure_digest(lock)
    (run_dir / "config.json").write_text(json.dumps(config))
    refused = _harness(setup, "run", "--resume", run_dir.name)
    assert refused.returncode == 1, refused.stderr
    assert "the project no longer gives the run's closure" in refused.stderr and entry["path"] in refused.stderr
    assert not (run_dir / "superseded" / "0.1").exists(), "nothing was moved aside before the refusal"


def _task_of(pid: int) -> int:
    """The submitit task process (``submitit.core._submit``) above process ``pid``."""
    while pid > 1:
        if b"submitit.core._submit" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no submitit task above the shard's command")


def test_a_sigterm_to_a_slurm_task_is_recorded_as_a_cancel(setup: Setup, tmp_path: Path) -> None:
    """What ``scancel`` does to a running task — SIGTERM to each of its processes, here the
    shard's task process and its command, on submitit's local executor — is recorded as a
    cancel naming the SIGTERM (not 'exited with 143'), as soon as the task ends; the other
    shard is ok, the run exits 1 and the audit names the cancelled shard."""
    pytest.importorskip("submitit", reason="submitit is not installed: pip install -e '.[slurm]'")
    gates = setup.gates / "scancel"
    gates.mkdir()
    (gates / "gate.py").write_text(FIRST_FREE)
    shard_cmd = [sys.executable, str(gates / "gate.py"), str(gates), str(REPO / "benchmarks" / "reach" / "episodes.py")]
    env = {**os.environ, "HARNESS_HOME": str(setup.cluster.head.home)}
    argv = [sys.executable, "-m", "harness", "--project", str(REPO), "run", "--agent", "kinematics-only"]
    with open(tmp_path / "head.log", "w") as log:
        head = subprocess.Popen(
            [*argv, "--cluster", "slurm-local", "--shards", "2", "--", *shard_cmd],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for("shard 1 at its gate", lambda: any(gates.glob("started-1-2-*")) or head.poll() is not None)
        assert head.poll() is None, (tmp_path / "head.log").read_text()
        started = next(gates.glob("started-1-2-*"))
        run_dir = Path(started.read_text()).parent.parent
        command = int(started.name.rsplit("-", 1)[1])
        task = _task_of(command)
        os.kill(task, signal.SIGTERM)
        os.kill(command, signal.SIGTERM)
        assert head.wait(timeout=300) == 1, (tmp_path / "head.log").read_text()
    finally:
        if head.poll() is None:
            head.kill()
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    assert [s["status"] for s in shards] == ["ok", "cancelled"], shards
    assert "its task got SIGTERM (Slurm's scancel" in shards[1]["reason"], shards[1]["reason"]
    code, lines = _audit_lines(setup, run_dir)
    assert code == 1 and [ln.split(" ", 1)[0] for ln in lines if " shard " in ln] == ["cancelled"], lines


def _dies_once(job: ShardJob) -> dict[str, object]:
    """An array task that dies without a result on its first try (as on a node that went
    away) and reports ok on the next; its marker file lives in the job's project folder."""
    marker = Path(job.project_root) / f"tried-{job.index}"
    if job.index == 1 and not marker.exists():
        marker.write_text("")
        os._exit(1)
    return {"index": job.index, "shard": f"{job.index}/{job.count}", "status": "ok", "node": {"pid": os.getpid()}}


def test_a_lost_slurm_task_is_submitted_again_up_to_the_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resubmission of lost array members, on submitit's local executor: the engine
    takes the task that died for a lost node (the local executor cannot lose one; its state
    is read as Slurm's NODE_FAIL), submits it again in an array of its own, and records
    each shard once, as it ends, with every attempt; with no retries left it is lost."""
    pytest.importorskip("submitit", reason="submitit is not installed: pip install -e '.[slurm]'")
    import harness.runs.cluster as cluster

    judge = cluster.engine_ending
    monkeypatch.setattr(cluster, "engine_ending", lambda state, message: judge("NODE_FAIL", message))
    monkeypatch.chdir(REPO)  # the tasks import this module
    jobs = [ShardJob("r", i, 2, str(tmp_path), None, (), None, (), (), None, None, False) for i in range(2)]
    lines: list[str] = []
    recorded: list[dict[str, object]] = []
    engine = cluster.SubmititEngine(local=True, task=_dies_once)
    kwargs = dict(cpus=1.0, gpus=0, folder=tmp_path / "engine", echo=lines.append, on_result=recorded.append)
    results = engine.run(jobs, retries=1, **kwargs)
    assert [r["status"] for r in results] == ["ok", "ok"] and len(recorded) == 2
    assert [len(r["attempts"]) for r in results] == [1, 2], results
    assert results[1]["attempts"][0]["status"] == "lost" and results[1]["attempts"][1]["status"] == "ok"
    assert sum("submitted array job" in ln for ln in lines) == 2
    assert any(ln.startswith("shard 1/2: task ") and "its node was lost" in ln for ln in lines), lines
    (tmp_path / "tried-1").unlink()
    lost = engine.run(jobs, retries=0, **kwargs)
    assert [r["status"] for r in lost] == ["ok", "lost"] and "its node was lost (NODE_FAIL)" in lost[1]["reason"]


def _hands_over(job: ShardJob) -> dict[str, object]:
    """An array task whose shard is over and that keeps its node's broker a while after
    (as :func:`harness.runs.shard.keep_node_broker` does on Slurm): it hands its result over,
    waits until the head has recorded it (the test's ``recorded-<I>`` marker), then returns
    with what the wait adds (shard 0) or dies without a result (shard 1: its node lost)."""
    from harness.runs.cluster import hand_over

    result: dict[str, object] = {"index": job.index, "shard": f"{job.index}/{job.count}", "status": "ok", "node": {}}
    hand_over(job, result)
    marker, deadline = Path(job.project_root) / f"recorded-{job.index}", time.time() + 60
    while not marker.exists():
        if time.time() > deadline:
            return {**result, "status": "failed", "reason": "the head did not record the result handed over"}
        time.sleep(0.1)
    if job.index == 1:
        os._exit(1)
    return {**result, "held_broker_for": ["shard 1"], "held_broker_s": 1.5}


def test_a_slurm_task_that_keeps_its_nodes_broker_has_its_result_recorded_before_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's side of a shard that keeps its node's broker for others on Slurm
    (submitit's local executor): the result it hands over is recorded while its task still
    runs; once the task ends its result is recorded again with what the wait added, and a
    task that died during the wait (read as a lost node) keeps the result it had handed over,
    noting how the wait ended, rather than being lost and submitted again."""
    pytest.importorskip("submitit", reason="submitit is not installed: pip install -e '.[slurm]'")
    import harness.runs.cluster as cluster

    judge = cluster.engine_ending
    monkeypatch.setattr(cluster, "engine_ending", lambda state, message: judge("NODE_FAIL", message))
    monkeypatch.chdir(REPO)  # the tasks import this module
    jobs = [ShardJob("r", i, 2, str(tmp_path), None, (), None, (), (), None, None, False) for i in range(2)]
    (tmp_path / "engine" / "handed-over").mkdir(parents=True)
    (tmp_path / "engine" / "handed-over" / "0.json").write_text('{"index": 0, "status": "stale"}')
    recorded: list[dict[str, object]] = []

    def on_result(result: dict[str, object]) -> None:
        recorded.append(result)
        (tmp_path / f"recorded-{result['index']}").write_text("")

    engine = cluster.SubmititEngine(local=True, task=_hands_over)
    results = engine.run(
        jobs, cpus=1.0, gpus=0, retries=1, folder=tmp_path / "engine", echo=lambda _: None, on_result=on_result
    )
    assert [r["status"] for r in results] == ["ok", "ok"], results
    assert results[0]["held_broker_for"] == ["shard 1"] and results[0]["held_broker_s"] == 1.5, results[0]
    assert "stale" not in [r["status"] for r in recorded], "an earlier attempt's hand-over is not taken"
    firsts = {int(str(r["index"])): r for r in reversed(recorded)}  # each index's first record
    assert all("held_broker_for" not in r and len(r["attempts"]) == 1 for r in firsts.values()), recorded
    assert len(recorded) == 4, recorded  # each shard: handed over, then ended
    assert len(results[1]["attempts"]) == 1, "not submitted again: its shard was over"
    assert "its node was lost (NODE_FAIL)" in results[1]["held_broker_stopped"], results[1]


@pytest.mark.last
def test_second_node_killed_mid_run_is_retried_on_the_head(setup: Setup) -> None:
    """Runs last (marked so): it kills the second node while one of its shards waits at the gate."""
    proc, gates = _gated(setup, "kill", 4)
    _wait_started(proc, gates, 1, home=setup.cluster.second.home)
    setup.cluster.second.kill()
    (gates / "open").write_text("")
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    outcome = json.loads((_run_dir(setup, err) / "result.json").read_text())
    assert [s["status"] for s in outcome["shards"]] == ["ok"] * 4, outcome["shards"]
    retried = [s for s in outcome["shards"] if len(s["attempts"]) > 1]
    assert retried, outcome["shards"]
    for shard in retried:
        assert shard["attempts"][0]["home"] == str(setup.cluster.second.home)
        assert shard["attempts"][-1]["home"] == str(setup.cluster.head.home) == shard["home"]
    assert "retries" in err
    combined = json.loads((_run_dir(setup, err) / "benchmark.json").read_text())
    assert combined["episodes"] == 20
