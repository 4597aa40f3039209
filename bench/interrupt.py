"""How long Ctrl-C takes to end a cold realize, phase by phase, beside uv (issue 30, step 5).

A cold ``harness realize`` of the medium set (``--set scientific``: numpy, scipy, pandas; an empty home; the interpreter from a download
list that cannot be reached, so a host copy stands in, as on an offline cluster) is timed once;
then, for each of ``--points`` moments spread over that time, a fresh realize is started in its
own process group and sent SIGINT there (what a terminal's Ctrl-C does), and the seconds until
it exits are measured. The anchor is the same for ``uv venv`` + ``uv pip install
--compile-bytecode`` of the same set with an empty cache. Harness and uv alternate which goes
first at each moment. Printed: per moment, the phase harness was in and both latencies; then
the worst of each and their ratio. Goal: harness ≤ 1 s at every moment.

    python bench/interrupt.py [--points 12] [--set medium|scientific] [--scratch /tmp/interruptbench]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchproject import MEDIUM, SCIENTIFIC, harness_command, make_project  # noqa: E402

SETS = {"medium": MEDIUM, "scientific": SCIENTIFIC}
from harness.resolve.uvtool import uv_bin  # noqa: E402

UNREACHABLE = "http://127.0.0.1:9/python-downloads.json"


def _harness(project: Path, home: Path) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "HARNESS_HOME": str(home), "HARNESS_PYTHON_DOWNLOADS_JSON_URL": UNREACHABLE}
    env.pop("UV_PYTHON_DOWNLOADS", None)
    return [*harness_command(), "--project", str(project), "realize", "bench"], env


def _uv(scratch: Path, requirements: list[str]) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "UV_CACHE_DIR": str(scratch / "uv-cache"), "UV_PYTHON_DOWNLOADS": "never"}
    script = (
        f"{uv_bin()} venv -q --python {sys.executable} {scratch / 'venv'} && "
        f"{uv_bin()} pip install -q --compile-bytecode --python {scratch / 'venv'} {' '.join(requirements)}"
    )
    return ["bash", "-c", script], env


def _interrupt(command: list[str], env: dict[str, str], after: float | None) -> tuple[float, str]:
    """Run ``command``; SIGINT its group ``after`` seconds in (None: let it finish). Returns
    the seconds from the signal to its exit (or the whole run's) and its last stderr line."""
    started = time.monotonic()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    if after is None:
        _, err = process.communicate()
        return time.monotonic() - started, (err.strip().splitlines() or [""])[-1]
    try:
        process.wait(timeout=after)
        return 0.0, "(already done)"
    except subprocess.TimeoutExpired:
        pass
    sent = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate()
    lines = [line for line in err.splitlines() if line.strip() and "interrupted" not in line and line != "aborted"]
    return time.monotonic() - sent, (lines[-1] if lines else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=12)
    parser.add_argument("--set", choices=sorted(SETS), default="medium")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/interruptbench"))
    args = parser.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    project = make_project(args.scratch / "project", {"bench": SETS[args.set]})
    subprocess.run([*harness_command(), "--project", str(project), "lock", "bench"], check=True, capture_output=True)

    def fresh(kind: str) -> tuple[list[str], dict[str, str]]:
        for folder in ("home", "venv", "uv-cache"):
            shutil.rmtree(args.scratch / folder, ignore_errors=True)
        return _harness(project, args.scratch / "home") if kind == "harness" else _uv(args.scratch, SETS[args.set])

    whole = {kind: _interrupt(*fresh(kind), None)[0] for kind in ("harness", "uv")}
    print(f"cold realize: harness {whole['harness']:.1f} s, uv venv + pip install {whole['uv']:.1f} s")
    worst = {"harness": 0.0, "uv": 0.0}
    for index in range(args.points):
        at = whole["harness"] * (index + 0.5) / args.points
        order = ("harness", "uv") if index % 2 == 0 else ("uv", "harness")
        seen: dict[str, tuple[float, str]] = {}
        for kind in order:
            seen[kind] = _interrupt(*fresh(kind), min(at, whole[kind] * (index + 0.5) / args.points))
            worst[kind] = max(worst[kind], seen[kind][0])
        print(
            f"at {at:5.1f} s: harness exits in {seen['harness'][0]:.2f} s ({seen['harness'][1][:70]}), "
            f"uv in {seen['uv'][0]:.2f} s"
        )
    ratio = worst["harness"] / worst["uv"] if worst["uv"] else float("inf")
    print(f"worst: harness {worst['harness']:.2f} s, uv {worst['uv']:.2f} s ({ratio:.2f}x); goal harness <= 1 s")
    shutil.rmtree(args.scratch, ignore_errors=True)
    return 0 if worst["harness"] <= 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
