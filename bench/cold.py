"""A cold realize beside uv, in one run (issue 30, step 2): empty home, empty uv cache.

For one requirement set (``--set scientific``: numpy, scipy, pandas, a 290 MiB environment;
``medium``; ``vlm``), locked once in a throw-away project, each round times, alternating who
goes first:

* ``harness realize`` into an empty ``HARNESS_HOME`` (its own uv cache empty; Python downloads
  off, so a host copy of the locked CPython stands in and is built too);
* ``uv venv --python <the same host CPython>`` + ``uv pip sync --require-hashes
  --compile-bytecode`` of the lock's hashed requirements export, with an empty ``UV_CACHE_DIR``.

``--baseline DIR`` (repeatable) adds a contender in every round: harness as another commit has it
(``DIR`` holds that commit's ``harness`` package, e.g. ``git archive REV harness | tar -x -C
DIR``), run by the same Python with ``PYTHONPATH=DIR``: before and after a change, in one run.

Prints each round's wall and CPU seconds (of the process and its children), the medians and
their ratio [goal: harness <= 1.2x uv], the load (``uptime``) before and after. ``--profile``
then runs one more cold realize under cProfile and prints the seconds of each phase
(``bench/realize.py:PHASES``; wall, cumulative, phases overlap).

Needs the package registry (uv's default index, or a mirror configured for uv).

    python bench/cold.py [--set scientific] [--runs 3] [--profile] [--first harness|uv] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchproject import MEDIUM, SCIENTIFIC, VLM, harness_command, make_project  # noqa: E402
from bench.realize import PHASES, EnvSet, profile_phases, run, version  # noqa: E402
from harness.resolve.uvtool import uv_bin  # noqa: E402
from harness.store.store import remove_tree  # noqa: E402

SETS = {"scientific": SCIENTIFIC, "medium": MEDIUM, "vlm": VLM}


def load() -> str:
    return (
        subprocess.run(["uptime"], capture_output=True, text=True, check=False)
        .stdout.strip()
        .split("load average:")[-1]
    )


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(env_set: EnvSet, who: str, base: Path) -> tuple[float, float]:
    """Wall and CPU seconds (of the children) of one cold build by ``who`` under ``base``."""
    cpu, start = children_cpu(), time.perf_counter()
    if who != "uv":
        env_set.realize(base / f"home-{who}")
    else:
        env_set.uv(base / "uv-cache", base / "venv", compile_bytecode=True)
    return time.perf_counter() - start, children_cpu() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), default="scientific")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="then one cold realize under cProfile")
    parser.add_argument("--first", choices=("harness", "uv"), default="harness")
    parser.add_argument(
        "--baseline", type=Path, action="append", default=[], help="another commit's harness package, beside"
    )
    args = parser.parse_args()
    harness = harness_command()
    print(
        f"date {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; nproc {os.cpu_count()}; "
        f"{version([uv_bin(), '--version'])}; set {args.set}: {', '.join(SETS[args.set])}; load{load()}"
    )
    samples: dict[str, list[tuple[float, float]]] = {"harness": [], "uv": []}
    baselines = {f"base:{path.name}": path.resolve() for path in args.baseline}
    samples.update({label: [] for label in baselines})
    with tempfile.TemporaryDirectory(prefix="harness-bench-cold-") as tmp:
        scratch = Path(tmp)
        project = make_project(scratch / "project", {args.set: SETS[args.set]})
        run([*harness, "--project", str(project), "--home", str(scratch / "lock-home"), "lock"])
        env_set = EnvSet(args.set, project, scratch, harness)
        sets = {"harness": env_set, "uv": env_set}
        order = ["harness", "uv"] if args.first == "harness" else ["uv", "harness"]
        for label, path in baselines.items():
            # PYTHONSAFEPATH: ``-m`` would otherwise put the working directory first on sys.path,
            # and run from a checkout that is this tree's harness, not the baseline's.
            sets[label] = EnvSet(
                args.set,
                project,
                scratch,
                ["env", f"PYTHONPATH={path}", "PYTHONSAFEPATH=1", sys.executable, "-m", "harness"],
            )
            order.insert(1, label)
        for attempt in range(args.runs):
            base = scratch / f"round-{attempt}"
            for who in order if attempt % 2 == 0 else order[::-1]:
                wall, cpu = measured(sets[who], who.replace(":", "-"), base)
                samples[who].append((wall, cpu))
                print(f"round {attempt + 1} {who:<8} {wall:7.2f} s wall {cpu:7.2f} s cpu   load{load()}", flush=True)
            remove_tree(base)
        ours = statistics.median(w for w, _ in samples["harness"])
        uv = statistics.median(w for w, _ in samples["uv"])
        print(
            f"\nmedian wall: harness {ours:.2f} s ({min(w for w, _ in samples['harness']):.2f}-"
            f"{max(w for w, _ in samples['harness']):.2f}), uv venv + pip sync --compile-bytecode {uv:.2f} s "
            f"({min(w for w, _ in samples['uv']):.2f}-{max(w for w, _ in samples['uv']):.2f}); "
            f"ratio {ours / uv:.2f} [goal <= 1.2x] {'meets' if ours / uv <= 1.2 else 'MISSES'}"
        )
        for label, path in baselines.items():
            before = statistics.median(w for w, _ in samples[label])
            print(
                f"{label} ({path}): median wall {before:.2f} s, cpu "
                f"{statistics.median(c for _, c in samples[label]):.2f} s; ratio to uv {before / uv:.2f}; "
                f"this tree / it {ours / before:.2f}"
            )
        print(
            f"median cpu: harness {statistics.median(c for _, c in samples['harness']):.2f} s, "
            f"uv {statistics.median(c for _, c in samples['uv']):.2f} s; load{load()}"
        )
        if args.profile:
            base = scratch / "profile"
            phases = profile_phases(
                ["--project", str(project), "--home", str(base / "home"), "realize", args.set], scratch / "cold.prof"
            )
            print("\nwhere a cold realize's time goes (cProfile, wall s, cumulative, phases overlap)")
            for label, _, _ in PHASES:
                print(f"  {label:<40} {phases[label]:7.2f}")
            remove_tree(base)
        for child in scratch.iterdir():
            remove_tree(child)
    return 0


if __name__ == "__main__":
    sys.exit(main())
