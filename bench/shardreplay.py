"""A cluster run's first shard on its node, replayed in fresh processes: two checkouts alternating.

``bench/cluster.py`` measures a shard on a real Ray cluster; this isolates the shard's own
part, without Ray, so two versions of harness's code can be compared in alternation on a
busy machine. It makes a head home (signed into a directory cache, kinematics and reach
realized) and a node home, then, for each checkout given (``--tree``, default this one):

* **capture**: the head of ``harness run --agent kinematics-only --cluster ray --shards 1 -- true``
  runs with that checkout's code, its engine replaced by one that keeps the shard's job (as
  the head made it: plain data) and runs it once on the node's home in a subprocess (the
  node pulls the closure from the cache then: not measured);
* **replay**, rounds alternating the checkouts: a fresh Python (Ray and the module of Ray's
  task imported first, as a Ray worker has them before the task starts) runs
  :func:`harness.runs.shard.run_shard` on the job under a new run id, so it is the first
  shard of its run on the node (it parks and starts the node's broker and the kinematics
  service). It prints the shard's wall time, its process's CPU time (its own: the broker's
  and the service's are other processes) and the load.

``--later`` measures a later shard instead: each round first replays the job under a new run
id (not measured: it starts the node's broker), then again under the same id while that
broker lingers (measured: it finds ``ports.json``'s ports held by the run's live broker and
joins it, as every shard after a node's first does); the broker is then stopped by its pid
(``harness.runtime.broker.down``).

``--profile`` prints one replay's cProfile of each checkout, ``--importtime`` the modules the
shard imported, slowest first. Every process it starts ends by itself or by its pid.

    python bench/shardreplay.py [--tree OTHER_CHECKOUT] [--rounds 8] [--later] [--profile] [--importtime]
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
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CAPTURE = r"""
import dataclasses, json, os, subprocess, sys
import harness.runs.cluster as engines
from harness.cli import main

out, node_home, replay = sys.argv[1], sys.argv[2], sys.argv[3]

class Capture:
    def run(self, jobs, *, on_result, **_):
        results = []
        for job in jobs:
            with open(out, "w") as sink:
                json.dump(dataclasses.asdict(job), sink)
            env = {**os.environ, "HARNESS_HOME": node_home}
            done = subprocess.run([sys.executable, replay, "--child", out, job.run_id], env=env,
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(done.stdout + done.stderr)
            result = json.loads(done.stdout.strip().splitlines()[-1])["result"]
            on_result(result)
            results.append(result)
        return results

engines.open_engine = lambda target: Capture()
try:
    main(sys.argv[4:])
except SystemExit as exc:
    if exc.code:
        raise
"""


def _child(job_file: str, run_id: str, mode: str) -> None:
    """One replay: the job of ``job_file`` as run ``run_id``; prints its timings as JSON."""
    import dataclasses
    import resource

    import ray  # noqa: F401  (a Ray worker has it loaded before its task starts)

    import harness.runs.cluster  # noqa: F401  (the module of Ray's task, loaded with the task)
    from harness.runs.shard import ShardJob, run_shard

    data = json.loads(Path(job_file).read_text())
    kinds = {f.name: str(f.type) for f in dataclasses.fields(ShardJob)}
    job = ShardJob(
        **{
            k: tuple(v) if kinds[k].startswith("tuple") and isinstance(v, list) else v
            for k, v in data.items()
            if k in kinds
        }
    )
    job = dataclasses.replace(job, run_id=run_id)
    profile = None
    if mode == "profile":
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    cpu, began = time.process_time(), time.perf_counter()
    result = run_shard(job, {"engine": "replay"})
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    if profile is not None:
        import io
        import pstats

        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(60)
        print(text.getvalue(), file=sys.stderr)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "wall": wall,
                "cpu": cpu,
                "children_cpu": children.ru_utime + children.ru_stime,
                "status": result.get("status"),
                "reason": result.get("reason"),
                "result": result,
            }
        )
    )


def _env(tree: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "RAY_ADDRESS")}
    env.update(PYTHONPATH=str(tree), HARNESS_HOME=str(home))
    return env


def _setup(root: Path) -> tuple[Path, Path]:
    head, node = root / "home-head", root / "home-node"
    if not (head / "config.toml").is_file():  # a scratch folder of an earlier call is reused
        sys.path.insert(0, str(REPO))
        from tests.raycluster import sign_into_lab_cache

        head.mkdir(parents=True)
        node.mkdir(parents=True, exist_ok=True)
        sign_into_lab_cache(root, head)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "--project",
            str(REPO),
            "--home",
            str(head),
            "realize",
            "kinematics",
            "reach",
        ],
        check=True,
        capture_output=True,
        timeout=1800,
    )
    return head, node


def _capture(tree: Path, head: Path, node: Path, job_file: Path) -> None:
    args = ["--project", str(REPO), "run", "--agent", "kinematics-only", "--cluster", "ray", "--shards", "1"]
    done = subprocess.run(
        [sys.executable, "-c", _CAPTURE, str(job_file), str(node), __file__, *args, "--", "true"],
        env=_env(tree, head),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        raise SystemExit(f"capture with {tree} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _replay(tree: Path, node: Path, job_file: Path, mode: str = "time", run_id: str | None = None) -> dict[str, object]:
    run_id = run_id or f"replay-{uuid.uuid4().hex[:12]}"
    command = [sys.executable, *(["-X", "importtime"] if mode == "importtime" else [])]
    done = subprocess.run(
        [*command, __file__, "--child", str(job_file), run_id, "--mode", mode],
        env=_env(tree, node),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        raise SystemExit(f"replay with {tree} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    if answer["status"] != "ok":
        raise SystemExit(f"replay with {tree}: {answer['status']}: {answer['reason']}")
    answer["stderr"] = done.stderr
    answer["run_id"] = run_id
    return answer


def _later(tree: Path, node: Path, job_file: Path, mode: str = "time") -> dict[str, object]:
    """A later shard of a run on the node: the first one replayed (its broker started, not
    measured), then the measured one under the same run id while that broker lingers; the
    broker is stopped after."""
    first = _replay(tree, node, job_file)
    try:
        return _replay(tree, node, job_file, mode, run_id=str(first["run_id"]))
    finally:
        state = node / "runs" / str(first["run_id"]) / "node"
        subprocess.run(
            [sys.executable, "-c", f"from harness.runtime.broker import down; down({str(state)!r})"],
            env=_env(tree, node),
            capture_output=True,
            timeout=120,
        )


def _importtime(stderr: str, began_after: str = "harness.runs.cluster") -> str:
    """The modules the shard imported (those after the task's module; Ray's, which it imports
    as the process exits, left out), slowest first by their own time, and their sum."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            own, _, name = line[len("import time:") :].split("|")
            if own.strip().isdigit():
                rows.append((int(own), name.rstrip()))
    names = [name.strip() for _, name in rows]
    inside = [r for r in rows[names.index(began_after) + 1 :] if not r[1].strip().startswith("ray")]
    total = sum(own for own, _ in inside) / 1e6
    return f"modules the shard imported: {total:.3f} s\n" + "\n".join(
        f"{own / 1e6:8.3f} s {name}" for own, name in sorted(inside, reverse=True)[:30]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, action="append", help="a checkout to compare (default: this one)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument("--later", action="store_true", help="measure a later shard of a run on the node")
    parser.add_argument("--scratch", type=Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="time", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child, args.mode)
        return
    trees = [t.resolve() for t in (args.tree or [])] or [REPO]
    if REPO not in trees:
        trees.insert(0, REPO)
    for tree in trees:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "harness")], capture_output=True)
    root = args.scratch or Path(tempfile.mkdtemp(prefix="shardreplay-"))
    try:
        head, node = _setup(root)
        jobs = {}
        for n, tree in enumerate(trees):
            jobs[tree] = root / f"job-{n}.json"
            _capture(tree, head, node, jobs[tree])
        replay = _later if args.later else _replay
        if args.profile or args.importtime:
            for tree in trees:
                answer = replay(tree, node, jobs[tree], "profile" if args.profile else "importtime")
                print(f"== {tree}: {answer['wall']:.3f} s wall, {answer['cpu']:.3f} s CPU")
                text = str(answer["stderr"])
                print(text if args.profile else _importtime(text))
            return
        samples: dict[Path, dict[str, list[float]]] = {t: {"wall": [], "cpu": [], "load": []} for t in trees}
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else trees[::-1]
            for tree in order:
                load = os.getloadavg()[0]
                answer = replay(tree, node, jobs[tree])
                for key, value in (("wall", answer["wall"]), ("cpu", answer["cpu"]), ("load", load)):
                    samples[tree][key].append(float(value))  # type: ignore[arg-type]
                print(f"round {r + 1} {tree}: {answer['wall']:.3f} s wall, {answer['cpu']:.3f} s CPU, load {load:.1f}")
        print()
        for tree in trees:
            s = samples[tree]
            print(
                f"{str(tree):40} wall median {statistics.median(s['wall']):.3f} s ({min(s['wall']):.3f}..{max(s['wall']):.3f}),"
                f" CPU median {statistics.median(s['cpu']):.3f} s ({min(s['cpu']):.3f}..{max(s['cpu']):.3f}),"
                f" load {min(s['load']):.1f}..{max(s['load']):.1f}"
            )
    finally:
        if args.scratch is None:
            time.sleep(35)  # the node's brokers end themselves 30 s after their shard
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
