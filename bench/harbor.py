"""Trial overhead of ``HarnessEnvironment`` beside a bare subprocess, in one run (issue 8).

One round = what a Harbor trial pays for its environment around the work itself:
``start()`` (resolve the realized closure, build the session root, start the bwrap
sandbox, write the harness record), ``exec("true")`` (nsenter + setpriv + bash inside it)
and ``stop(delete=True)`` (kill the session, delete the root, finish the record). Beside it,
a bare ``true`` started the same way (``asyncio.create_subprocess_exec``, no sandbox), and a
second ``exec("true")`` in an already started sandbox (the cost of each later command).

The environment is a one-file project locked and realized here (offline) with this machine's
CPython of the running version, the same shape as the ``reach`` benchmark (an interpreter
and an empty venv: two store paths), in a throw-away ``HARNESS_HOME``. It is realized before
timing; the first round is a warm-up and not counted. The task asks for no network (a
network namespace per session), as the example task does.

Needs Harbor (Python >= 3.12, ``pip install -e '.[harbor]'``) and bubblewrap.

    python bench/harbor.py [--rounds 30]

``--job`` measures scale instead (issue 18): one ``harbor run`` of the oracle agent on
``tests/harbor/reach-python`` with ``--n-attempts 32 --n-concurrent 4`` (32 trials, 4 at a
time), run by whoever runs the bench (an unprivileged user, as researchers do). It prints the
job's wall time (the ``harbor`` process, start to exit) beside the sum of its trials' agent
and verifier times divided by the concurrency (what a perfectly packed job would take with no
environment at all), and the same with whole trials (environment start and stop included).
``--home DIR`` uses a HARNESS_HOME that already holds the environment (realized by anyone
who may: the bench only locks and realizes what is missing).

    python bench/harbor.py --job [--trials 32] [--concurrent 4] [--home DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# This file is bench/harbor.py: its folder must not shadow the `harbor` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

MANIFEST = """kind = "benchmark"
summary = "bench: an interpreter and an empty environment"
worker = ["{python}", "-c", "pass"]

[environment]
python = "%s"
requirements = []
"""


def harness(home: Path, project: Path, *args: str) -> None:
    env = {**os.environ, "HARNESS_HOME": str(home), "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run(
        [sys.executable, "-m", "harness", "--project", str(project), *args],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )


def make_task(base: Path, project: Path, pin: str) -> Path:
    task = base / "task"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "harness.toml").write_text(
        f'manifest = "bench"\nproject = "{project}"\nenvironment = "{pin}"\n'
    )
    return task


async def rounds(task: Path, home: Path, n: int) -> dict[str, list[float]]:
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from harness.harbor import HarnessEnvironment

    times: dict[str, list[float]] = {k: [] for k in ("bare", "start", "exec", "stop", "exec_warm")}
    for i in range(n + 1):
        trial = TrialPaths(trial_dir=task.parent / "trials" / f"t{i:03d}")
        trial.mkdir()
        env = HarnessEnvironment(
            environment_dir=task / "environment",
            environment_name="bench",
            session_id=f"t{i:03d}__env",
            trial_paths=trial,
            task_env_config=EnvironmentConfig(network_mode="no-network", workdir="/app"),
            home=str(home),
            realize=False,
        )
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec("true")
        await proc.wait()
        t1 = time.perf_counter()
        await env.start(force_build=False)
        t2 = time.perf_counter()
        result = await env.exec("true")
        t3 = time.perf_counter()
        assert result.return_code == 0, result
        await env.exec("true")
        t4 = time.perf_counter()
        await env.stop(delete=True)
        t5 = time.perf_counter()
        if i == 0:
            continue  # warm-up
        times["bare"].append(t1 - t0)
        times["start"].append(t2 - t1)
        times["exec"].append(t3 - t2)
        times["exec_warm"].append(t4 - t3)
        times["stop"].append(t5 - t4)
    return times


def _seconds(timing: dict[str, str | None] | None) -> float:
    from datetime import datetime

    if not timing or not timing.get("started_at") or not timing.get("finished_at"):
        return 0.0
    start, end = (datetime.fromisoformat(str(timing[k])) for k in ("started_at", "finished_at"))
    return (end - start).total_seconds()


def job(trials: int, concurrent: int, home_arg: str | None) -> None:
    """The scale measurement of the module doc."""
    import json
    import shutil

    harbor = Path(sys.executable).parent / "harbor"
    with tempfile.TemporaryDirectory(prefix="harness-bench-harbor-job-") as scratch:
        base = Path(scratch)
        home = Path(home_arg).absolute() if home_arg else base / "home"
        project = base / "project"
        (project / "services").mkdir(parents=True)
        (project / "benchmarks").mkdir()
        (project / "benchmarks" / "bench.toml").write_text(MANIFEST % platform.python_version())
        harness(home, project, "lock", "bench", "--offline")
        harness(home, project, "realize", "bench", "--offline")
        from harness.lock.lockfile import read

        pin = read(project / "locks" / "bench.lock.toml").environment.store
        task = base / "tasks" / "reach-python"
        shutil.copytree(ROOT / "tests" / "harbor" / "reach-python", task)
        (task / "environment" / "harness.toml").write_text(
            f'manifest = "bench"\nproject = "{project}"\nenvironment = "{pin}"\n'
        )
        env = {**os.environ, "HARNESS_HOME": str(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        started = time.perf_counter()
        subprocess.run(
            [
                str(harbor),
                "run",
                "-p",
                str(task),
                "-a",
                "oracle",
                "-e",
                "harness.harbor:HarnessEnvironment",
                "-k",
                str(trials),
                "-n",
                str(concurrent),
                "-o",
                str(base / "jobs"),
                "--job-name",
                "scale",
                "--quiet",
            ],
            check=True,
            env=env,
            cwd=base,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        results = [json.loads(p.read_text()) for p in (base / "jobs" / "scale").glob("*/result.json")]
    rewards = [((r.get("verifier_result") or {}).get("rewards") or {}).get("reward") for r in results]
    work = sum(_seconds(r.get("agent_execution")) + _seconds(r.get("verifier")) for r in results)
    whole = sum(_seconds({"started_at": r.get("started_at"), "finished_at": r.get("finished_at")}) for r in results)
    setup = sum(_seconds(r.get("environment_setup")) for r in results)
    print(
        f"harbor run: {len(results)} oracle trials, {concurrent} concurrent, as uid {os.getuid()}; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    print(f"  rewards 1.0                     {sum(1 for x in rewards if x == 1.0):8d} of {len(results)}")
    print(f"  wall time of the job            {wall:8.2f} s")
    print(f"  sum(agent + verifier) / {concurrent}      {work / concurrent:8.2f} s")
    print(f"  sum(whole trials) / {concurrent}          {whole / concurrent:8.2f} s")
    print(f"  sum(environment setup) / {concurrent}     {setup / concurrent:8.2f} s")
    print(
        f"ratio: wall / (sum(agent + verifier) / {concurrent}) = {wall / max(work / concurrent, 1e-9):.1f}x; "
        f"wall / (sum(whole trials) / {concurrent}) = {wall / max(whole / concurrent, 1e-9):.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--job", action="store_true", help="the 32-trial scale measurement instead")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--home", help="a HARNESS_HOME to use (--job)")
    args = parser.parse_args()
    if args.job:
        job(args.trials, args.concurrent, args.home)
        return
    from harness.harbor.sandbox import unavailable_reason

    reason = unavailable_reason()
    if reason:
        sys.exit(f"cannot run: {reason}")
    with tempfile.TemporaryDirectory(prefix="harness-bench-harbor-") as scratch:
        base = Path(scratch)
        home, project = base / "home", base / "project"
        (project / "services").mkdir(parents=True)
        (project / "benchmarks").mkdir()
        (project / "benchmarks" / "bench.toml").write_text(MANIFEST % platform.python_version())
        harness(home, project, "lock", "bench", "--offline")
        harness(home, project, "realize", "bench", "--offline")
        from harness.lock.lockfile import read

        pin = read(project / "locks" / "bench.lock.toml").environment.store
        task = make_task(base, project, pin)
        times = asyncio.run(rounds(task, home, args.rounds))

    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    trial = med["start"] + med["exec"] + med["stop"]
    print(
        f"HarnessEnvironment overhead, {args.rounds} rounds (+1 warm-up), medians; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    print(f"  bare subprocess `true`          {med['bare']:8.2f} ms")
    print(f"  start()                         {med['start']:8.2f} ms")
    print(f"  exec('true'), first             {med['exec']:8.2f} ms")
    print(f"  exec('true'), later             {med['exec_warm']:8.2f} ms")
    print(f"  stop(delete=True)               {med['stop']:8.2f} ms")
    print(f"  start + exec + stop             {trial:8.2f} ms")
    print(
        f"ratio: start+exec+stop / bare subprocess = {trial / med['bare']:.1f}x; "
        f"exec in a started sandbox / bare subprocess = {med['exec_warm'] / med['bare']:.1f}x"
    )


if __name__ == "__main__":
    main()
