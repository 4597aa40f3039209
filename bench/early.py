"""Start-up speculation: does starting uv before the models load pay? (issue 27)

``harness lock`` reads each manifest as raw TOML and starts the ``uv pip compile`` run the
validated path will make while pydantic and the lock models load (``harness.lock.early``);
the validated path takes that run over only when it is exactly the same. This bench runs the
same lock with and without that start, in one run, alternating the order every round, as a
user's install runs it (``benchproject.regular_install``), on the requirement sets of
``bench/lock.py``, cold (fresh home and uv cache) and warm (``--refresh`` on the cache the
cold run left), and prints the share of the command's wall time it saves (the median of each
round's paired ratio). Issue 27's rule: keep a path only where it saves at least 20 %.

Two other early paths were measured the same way and deleted (figures in
docs/benchmarks.md, bench/results/history.csv): the entry point's own parse of ``harness lock`` command lines to start
uv before click loaded, and the verify's hashing started before click (with a verify run
without the CLI). Needs the package registry.

    python bench/early.py [--runs 5] [--sets kinematics,medium,vlm,large]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchproject import MEDIUM, VLM, make_project, regular_install  # noqa: E402

SETS = {
    "kinematics": ["numpy==2.2.6"],
    "medium": MEDIUM,
    "vlm": VLM,
    "large": ["torch==2.7.0", "torchvision==0.22.0", "transformers==4.57.1", "accelerate==1.10.1"],
}

#: How each variant enters harness (``python -c``; the same interpreter start for both).
LOCK_VARIANTS = {
    "early": "from harness.cli import console_main; console_main()",
    "none": (
        "import harness.lock.early as l; l.prestart_locks = lambda *a, **k: 0; "
        "from harness.cli import console_main; console_main()"
    ),
}


def _env() -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "UV_")) and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["UV_PYTHON_DOWNLOADS"] = "never"
    return env


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{result.stderr}")
    return elapsed


def lock_rounds(python: str, scratch: Path, name: str, requirements: list[str], runs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    order = list(LOCK_VARIANTS.items())
    for round_ in range(runs):
        variants = order if round_ % 2 == 0 else list(reversed(order))
        for mode in ("cold", "warm"):
            for label, code in variants:
                work = scratch / f"{name}-{round_}-{label}"
                if mode == "cold":
                    make_project(work / "project", {name: requirements})
                argv = [python, "-c", code, "--home", str(work / "home"), "--project", str(work / "project"), "lock"]
                if mode == "warm":
                    argv.append("--refresh")
                samples.setdefault(f"{mode} {label}", []).append(timed(argv, work))
    return samples


def paired_saving(samples: dict[str, list[float]], with_key: str, without_key: str) -> float:
    """The median over rounds of 1 - with/without: the share of the command's time saved."""
    return statistics.median(1 - w / o for w, o in zip(samples[with_key], samples[without_key], strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sets", default=",".join(SETS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="harness-bench-early-") as tmp:
        scratch = Path(tmp)
        python = str(regular_install(scratch / "install").with_name("python"))
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {when}")
        print(f"\n{'set':<11} {'mode':<5} {'early s':>8} {'none s':>8} {'saves':>6}")
        savings = []
        for name in args.sets.split(","):
            s = lock_rounds(python, scratch / "lock", name, SETS[name], args.runs)
            for mode in ("cold", "warm"):
                med = {v: statistics.median(s[f"{mode} {v}"]) for v in LOCK_VARIANTS}
                saved = paired_saving(s, f"{mode} early", f"{mode} none")
                savings.append(saved)
                print(f"{name:<11} {mode:<5} {med['early']:8.3f} {med['none']:8.3f} {saved:6.0%}")
        overall = statistics.median(savings)
        print(f"median saving {overall:.0%}: {'keep' if overall >= 0.2 else 'DELETE'} (keep at >= 20 %)")
        print(f"load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
