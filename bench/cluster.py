"""The cost of a shard: `harness run --cluster` beside bare Ray tasks on a real local cluster.

Starts a Ray head and a second node on loopback as tests/raycluster.py does (each its own
``ray start --block`` process, temp folder and ``HARNESS_HOME``; here with one CPU each, so
a node's shards queue behind its first, though Ray lends a task's CPU to the next while the
task waits in ``ray.get``, so they overlap some). The head's home is realized (kinematics,
reach) and signs its pushes to a directory cache the second node pulls from; harness's
modules are compiled first, as an installed wheel's are. Then, per round, in alternating
order:

* **bare no-op**: a ``ray.remote`` no-op pinned to the second node, submit to result: as a
  new Ray job's first task (a fresh driver, so Ray starts a worker for it, as it does for each
  ``harness run``'s shards) and from a driver connected throughout (a warm worker);
* **bare service start**: a Ray task on the second node that starts the kinematics service
  from its realized store path (the argv a harness run recorded) and waits for ``/health``,
  then stops it; twice in a row (``first``, ``again``: the same task on the same node, warm);
* **harness**: ``harness run --agent kinematics-only --cluster ray --shards 1 -- true``, then
  the same with ``--shards N``. The shards run no episodes (``true`` in place of the
  benchmark's worker) but start the agent's kinematics service on their node as every run
  does, so a shard's time is harness's per-shard cost plus the node's service start. Each
  shard's span on its node is read from its record (``shards/<I>/shard.json``: the task's
  start on the node, after Ray started its worker, to the shard's end). The one shard of
  ``--shards 1`` is alone on its node, as the bare task is: it starts the node's broker and
  service. Of ``--shards N``, the first on each node does the same beside the other shards
  (on this one machine, both nodes' shards share its cores), and the later ones join it.

It prints medians and the goal of issue 32: a no-op shard (bare task + the lone shard's span)
≤ 1.5× (bare task + the bare service start), with the bare task as a new job's first task
(the goal's reading) and as a warm worker's; and a later shard beside a bare task.
Profile a shard with ``--profile``: one run's head in this process, its shards one after
another on the second node under cProfile, each profile printed. Every process it starts is ended by its pid (never ``ray stop``).

    python bench/cluster.py [--rounds 5] [--shards 4] [--scratch DIR] [--keep] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.raycluster import Cluster, sign_into_lab_cache, start_cluster  # noqa: E402
from tests.ports import free_port  # noqa: E402


def _harness(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "HARNESS_HOME": str(home), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "harness", "--project", str(REPO), *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _setup(root: Path) -> tuple[Cluster, Path]:
    """Keys, the head's cache settings, its realized store and the cluster (realize runs while
    the cluster starts)."""
    head_home = root / "home-head"
    head_home.mkdir(parents=True)
    _, cache = sign_into_lab_cache(root, head_home)
    realize = subprocess.Popen(
        [sys.executable, "-m", "harness", "--project", str(REPO), "--home", str(head_home), "realize"]
        + ["kinematics", "reach"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        cluster = start_cluster(root, num_cpus=1)  # one CPU each
    except BaseException:
        realize.kill()
        realize.wait()
        raise
    out, _ = realize.communicate(timeout=900)
    if realize.returncode != 0:
        cluster.stop()
        raise SystemExit(f"realize failed:\n{out.decode()[-3000:]}")
    return cluster, cache


# --------------------------------------------------------------------------- bare Ray tasks


def _noop() -> None:
    return None


def _home() -> str:
    return os.environ.get("HARNESS_HOME", "")


def _start_service(argv: list[str], cwd: str, env: dict[str, str], port: int) -> dict[str, float]:
    """Start the service as a bare subprocess, wait for its /health, stop it: seconds of each."""
    import urllib.request

    began = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the service exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.01)
        healthy = time.perf_counter()
    finally:
        proc.terminate()
        proc.wait(30)
    return {"start": healthy - began, "stop": time.perf_counter() - healthy}


def _node_ids(ray: Any, cluster: Cluster) -> dict[str, str]:
    """HARNESS_HOME → Ray node id, asked of a task pinned to each alive node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ids = {}
    for node in ray.nodes():
        if node["Alive"]:
            pin = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ids[ray.get(ray.remote(_home).options(scheduling_strategy=pin).remote())] = node["NodeID"]
    return ids


def _service_launch(cluster: Cluster, run_dir: Path) -> tuple[list[str], str, dict[str, str], int]:
    """The kinematics service's argv, cwd and variables as a shard on the second node
    launched it (its record's ``config.json``), moved to a fresh port."""
    for config in sorted(run_dir.glob("shards/*/config.json")):
        shard = json.loads((config.parent / "shard.json").read_text())
        if shard["home"] == str(cluster.second.home):
            launch = json.loads(config.read_text())["launch"]["services"]["kinematics"]
            old = launch["argv"][launch["argv"].index("--port") + 1]
            port = free_port()
            argv = [str(port) if a == old else a for a in launch["argv"]]
            env = dict(launch.get("env") or {})
            return argv, launch["cwd"], env, port
    raise SystemExit(f"no shard of {run_dir} ran on the second node: cannot take the service's launch")


_FRESH_DRIVER = """
import json, sys, time, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
pin = NodeAffinitySchedulingStrategy(sys.argv[2], soft=False)
began = time.perf_counter()
ray.get(ray.remote(lambda: None).options(scheduling_strategy=pin).remote())
print(json.dumps({"noop": time.perf_counter() - began}))
"""


def _fresh_noop(cluster: Cluster, node_id: str) -> float:
    """A bare no-op as a new Ray job's first task: submit to result, a worker started for it
    (as each ``harness run``, a new job, starts its shards' workers)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", _FRESH_DRIVER, cluster.address, node_id],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["noop"])


# --------------------------------------------------------------------------- harness shards


def _shard_spans(run_dir: Path) -> tuple[list[float], list[float], list[float]]:
    """(first shard on each node, later shards, gaps between a node's shards): seconds from the
    task's start on the node to the shard's end, read from the shards' records."""
    by_home: dict[str, list[dict[str, Any]]] = {}
    for path in run_dir.glob("shards/*/shard.json"):
        shard = json.loads(path.read_text())
        if shard["status"] != "ok":
            raise SystemExit(f"shard {shard['shard']} of {run_dir}: {shard['status']}: {shard['reason']}")
        by_home.setdefault(shard["home"], []).append(shard)
    first, later, gaps = [], [], []
    for shards in by_home.values():
        shards.sort(key=lambda s: s["attempts"][0]["started"])
        for n, shard in enumerate(shards):
            span = shard["ended"] - shard["attempts"][0]["started"]
            (first if n == 0 else later).append(span)
            if n:
                gaps.append(shard["attempts"][0]["started"] - shards[n - 1]["ended"])
    return first, later, gaps


def _harness_run(cluster: Cluster, shards: int) -> tuple[float, Path]:
    began = time.perf_counter()
    result = _harness(
        cluster.head.home,
        "run",
        "--agent",
        "kinematics-only",
        "--cluster",
        "ray",
        "--shards",
        str(shards),
        "--",
        "true",
        env={"RAY_ADDRESS": cluster.address},
    )
    wall = time.perf_counter() - began
    if result.returncode != 0:
        raise SystemExit(f"harness run exited {result.returncode}:\n{result.stderr[-3000:]}")
    line = [ln for ln in result.stderr.splitlines() if "; record " in ln][-1]
    return wall, Path(line.rsplit("; record ", 1)[1].strip())


# --------------------------------------------------------------------------- the rounds


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _spread(values: list[float]) -> str:
    return f"{min(values):.3f}..{max(values):.3f}" if values else "-"


def _measure(cluster: Cluster, rounds: int, shards: int) -> dict[str, list[float]]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # The first run realizes the closure on the second node (pulled from the cache): not measured.
    print("warm-up run (the second node pulls the closure) ...", flush=True)
    _, warm = _harness_run(cluster, shards)
    argv, cwd, env, port = _service_launch(cluster, warm)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        print(f"cluster: {ray.cluster_resources()}", flush=True)
        second_id = _node_ids(ray, cluster)[str(cluster.second.home)]
        pin = NodeAffinitySchedulingStrategy(second_id, soft=False)
        noop = ray.remote(_noop).options(scheduling_strategy=pin)
        service = ray.remote(_start_service).options(scheduling_strategy=pin)
        ray.get(noop.remote())  # a worker on the node, as the harness runs' tasks find one after the first
        samples: dict[str, list[float]] = {
            k: []
            for k in ("noop", "fresh noop", "service first", "service again", "start first", "start again", "run wall")
        }
        samples.update({"shard alone": [], "run wall 1": [], "shard first": [], "shard later": [], "gap": []})

        def bare() -> None:
            samples["fresh noop"].append(_fresh_noop(cluster, second_id))
            for _ in range(3):
                began = time.perf_counter()
                ray.get(noop.remote())
                samples["noop"].append(time.perf_counter() - began)
            for label in ("first", "again"):
                began = time.perf_counter()
                times = ray.get(service.remote(argv, cwd, env, port))
                samples[f"service {label}"].append(time.perf_counter() - began - times["stop"])
                samples[f"start {label}"].append(times["start"])

        def shard_run() -> None:
            wall, run_dir = _harness_run(cluster, 1)  # one shard: alone on its node, as the bare task is
            samples["shard alone"] += _shard_spans(run_dir)[0]
            samples["run wall 1"].append(wall)
            wall, run_dir = _harness_run(cluster, shards)
            first, later, gaps = _shard_spans(run_dir)
            samples["run wall"].append(wall)
            samples["shard first"] += first
            samples["shard later"] += later
            samples["gap"] += gaps

        for r in range(rounds):
            order = (bare, shard_run) if r % 2 == 0 else (shard_run, bare)
            for step in order:
                step()
            print(
                f"round {r + 1}/{rounds}: noop {samples['noop'][-1]:.3f} s, fresh {samples['fresh noop'][-1]:.3f} s, service start {samples['service first'][-1]:.3f}"
                f" / {samples['service again'][-1]:.3f} s, shard alone {samples['shard alone'][-1]:.3f} s",
                flush=True,
            )
        return samples
    finally:
        ray.shutdown()


def _report(samples: dict[str, list[float]], shards: int) -> None:
    rows = [
        ("bare no-op task, submit to result (worker warm)", "noop"),
        ("bare no-op task, a new job's first (worker started)", "fresh noop"),
        ("bare task: start kinematics + /health (first)", "service first"),
        ("  of which start to /health on the node", "start first"),
        ("bare task: the same again on the node (warm)", "service again"),
        ("  of which start to /health on the node", "start again"),
        ("harness shard, --shards 1: alone on its node (task start to end)", "shard alone"),
        (f"harness shard, --shards {shards}: first on its node, beside others", "shard first"),
        ("harness shard, later on its node (joins the broker)", "shard later"),
        ("gap between a node's shards (Ray dispatch)", "gap"),
        ("harness run --shards 1 -- true, whole command", "run wall 1"),
        (f"harness run --shards {shards} -- true, whole command", "run wall"),
    ]
    print(f"\n{'what':58} {'median s':>9}  {'min..max':>13}  n")
    for label, key in rows:
        values = samples[key]
        print(f"{label:58} {_median(values):9.3f}  {_spread(values):>13}  {len(values)}")
    start = _median(samples["start first"])
    span, later = _median(samples["shard alone"]), _median(samples["shard later"])
    for label, key in (("a new job's first task", "fresh noop"), ("a warm worker's task", "noop")):
        noop = _median(samples[key])
        ratio = (noop + span) / (noop + start)
        print(
            f"\nbare task as {label} ({noop:.3f} s): no-op shard alone on a node {noop + span:.3f} s vs bare task + "
            f"the node's first service start {noop + start:.3f} s: {ratio:.2f}x "
            f"(goal <= 1.5x: {'met' if ratio <= 1.5 else 'MISSED'}); a later shard on the node "
            f"{noop + later:.3f} s, {(noop + later) / noop:.1f}x the bare task, +{later:.3f} s"
        )
    print(f"load: {os.getloadavg()}")


def _profiled_shard(job: Any) -> tuple[dict[str, Any], str]:
    """The Ray task of a shard (:func:`harness.runs.cluster._ray_shard` without the ledger)
    under cProfile: its result and the profile, by cumulative time."""
    import cProfile
    import io
    import pstats

    from harness.runs.shard import run_shard

    began = time.perf_counter()
    profile = cProfile.Profile()
    profile.enable()
    result = run_shard(job, {"engine": "ray"})
    profile.disable()
    text = io.StringIO()
    text.write(f"shard {job.index}: {time.perf_counter() - began:.3f} s in the task\n")
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(45)
    return result, text.getvalue()


class _ProfileEngine:
    """Runs a cluster run's shards one after another on the second node, each profiled."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def run(self, jobs: list[Any], *, on_result: Any, **_: Any) -> list[dict[str, Any]]:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray.init(address=self.cluster.address, logging_level="ERROR", log_to_driver=False)
        try:
            pin = NodeAffinitySchedulingStrategy(
                _node_ids(ray, self.cluster)[str(self.cluster.second.home)], soft=False
            )
            task = ray.remote(_profiled_shard).options(scheduling_strategy=pin)
            results = []
            for job in jobs:
                result, text = ray.get(task.remote(job))
                print(text, flush=True)
                on_result(result)
                results.append(result)
            return results
        finally:
            ray.shutdown()


def _profile(cluster: Cluster, shards: int) -> None:
    """One cluster run, its head in this process, its shards profiled on the second node."""
    import harness.runs.cluster as engines
    from harness.cli import main as harness_main

    _harness_run(cluster, shards)  # the second node pulls the closure first
    engines.open_engine = lambda target: _ProfileEngine(cluster)  # type: ignore[assignment,return-value]
    os.environ["HARNESS_HOME"] = str(cluster.head.home)
    try:
        harness_main(
            ["--project", str(REPO), "run", "--agent", "kinematics-only", "--cluster", "ray"]
            + ["--shards", str(shards), "--", "true"]
        )
    except SystemExit as exc:
        if exc.code:
            raise


def _bytecode() -> None:
    """Compiled modules, as an installed wheel has them: under ``PYTHONDONTWRITEBYTECODE``
    (this machine's shells set it) an editable checkout has none, and every fresh Ray worker
    compiles harness's sources on import (0.35 s of a shard, measured). They are written
    beside the sources (``__pycache__``, git-ignored); the variable is dropped for the nodes
    and harness processes this script starts."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "harness")], check=False, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shards", type=int, default=4, help="shards per harness run (two nodes, one CPU each)")
    parser.add_argument("--scratch", type=Path, help="folder for the homes, keys and cache (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--profile", action="store_true", help="profile the shards of one run on the second node")
    args = parser.parse_args()
    root = args.scratch or Path(tempfile.mkdtemp(prefix="clusterbench-"))
    root.mkdir(parents=True, exist_ok=True)
    _bytecode()
    print(f"load before: {os.getloadavg()}; scratch {root}", flush=True)
    cluster, _ = _setup(root)
    try:
        if args.profile:
            _profile(cluster, args.shards)
            return
        samples = _measure(cluster, args.rounds, args.shards)
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    _report(samples, args.shards)


if __name__ == "__main__":
    main()
