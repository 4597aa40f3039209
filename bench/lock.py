"""Locking: `harness lock` beside `uv pip compile` on the same requirement sets, and `lock --check`.

For each requirement set, in one run and interleaved (so machine noise hits both alike):

* uv: ``uv pip compile req.in -o pylock.toml`` with the flags harness passes it (one target:
  ``--python-version 3.11.7 --python-platform x86_64-manylinux_2_28``, ``--no-config``, the
  environment harness gives uv);
* harness: ``harness lock`` of a temporary project holding one manifest with those requirements
  (the project's own ``harness.toml`` target and interpreter pin).

harness hands uv its own interpreter (``--python``) where its minor version is the target's;
the anchor, as a user types it, leaves uv to search ``PATH`` (behind pyenv's shims: 0.1 s or
more). ``--uv-python`` hands the anchor the same interpreter, to compare the two without it.

Cold: empty caches in fresh temporary folders and no previous output. Warm: the same command
again on the caches and the output (uv's hashed requirements, harness's lock) that the cold
run left; harness with ``--refresh``, so that it resolves again like uv does instead of
answering from its no-op stamp. No-op: ``harness lock`` once more, nothing changed (answered
from the stamp, without resolving). Each round runs every command of a set once, harness and
uv alternating which goes first. Then ``harness lock --check`` on a temporary project of 10
locked manifests (5 of them copies of the kinematics example, whose path weight the check
re-hashes). Goals (issues 3 and 17): harness at most 1.3x uv, cold and warm; the no-op
re-lock under 0.2 s; ``--check`` under 0.3 s, timed twice: in the home that locked (every
stamp holds, so it answers from the stamps) and in a home without stamps (the full check).

Several platforms (issues 13 and 30, ``--part platforms``): ``harness lock`` of one manifest for
two platforms (``[lock] platforms = [x86_64-manylinux_2_28, aarch64-manylinux_2_28]``) beside
``uv lock`` of a project with the same two environments (``[tool.uv] environments``, one
universal resolution) and beside harness's lock of the first platform alone, cold and warm
(uv's lock file removed; harness with ``--refresh``), harness and uv alternating which goes
first. Sets: medium, large and the seed's sam3 set (``--platform-sets``). Goal (issue 30): two
platforms at most 1.2x ``uv lock``.

Where that time goes (``--part breakdown``), cold, interleaved, every command handed the same
interpreter: ``uv lock``; the two ``uv pip compile`` runs harness makes, side by side, without
harness; harness in a process that imported a lock's modules before the clock starts (what is
left is its own work beside uv's); and harness as a user runs it.

harness runs as a user's install has it (a wheel of this checkout in a new venv:
``benchproject.regular_install``); ``--editable`` runs this checkout's editable install
instead, whose import finder adds to every start-up.

Needs the package registry (uv's default index, or the mirror configured for uv).

    python bench/lock.py [--runs 5]
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.resolve.uvtool import uv_bin, uv_env  # noqa: E402
from bench.benchproject import MEDIUM, VLM, harness_command, make_project, regular_install  # noqa: E402

PYTHON, TARGET = "3.11.7", "x86_64-manylinux_2_28"
SETS = {
    "kinematics": ["numpy==2.2.6"],
    "medium": MEDIUM,
    # A VLM-like service (issue 17).
    "vlm": VLM,
    # A GPU service's stack (the example manifests' torch and transformers pins).
    "large": ["torch==2.7.0", "torchvision==0.22.0", "transformers==4.57.1", "accelerate==1.10.1"],
}


def _env() -> dict[str, str]:
    """The caller's environment without harness settings that would point at another index."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "UV_"))}


#: CPU seconds (user + system, the command and every process it waited for) of the last
#: :func:`timed` run: on a machine whose cores are all busy, wall time follows CPU time.
LAST_CPU = 0.0


def timed(argv: list[str], *, cwd: Path, env: dict[str, str]) -> float:
    global LAST_CPU
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAST_CPU = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{result.stderr}")
    return elapsed


def _compile_argv(work: Path, output: str, *flags: str) -> list[str]:
    """``uv pip compile req.in -o OUTPUT FLAGS`` in ``work``, its cache there, for harness's Python."""
    return [
        uv_bin(), "--no-config", "--cache-dir", str(work / "cache"), "pip", "compile", "req.in", "-o", output,
        *flags, "--python-version", PYTHON, "--no-header", "--quiet", "--index-strategy", "first-index",
    ]  # fmt: skip


#: ``--uv-python``: the interpreter the anchor is handed (``--python``), as harness hands uv its
#: own; None leaves uv to search ``PATH`` as a user's plain ``uv pip compile`` does.
UV_PYTHON: str | None = None


def uv_compile(work: Path, requirements: list[str]) -> tuple[list[str], Path]:
    """``uv pip compile --generate-hashes`` for harness's one target (issue 17's anchor)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "req.in").write_text("".join(r + "\n" for r in requirements))
    python = ["--python", UV_PYTHON] if UV_PYTHON else []
    argv = _compile_argv(work, "requirements.txt", "--generate-hashes", "--python-platform", TARGET, *python)
    return argv, work


def one_round(
    scratch: Path, name: str, requirements: list[str], harness: list[str], harness_first: bool
) -> dict[str, float]:
    """Cold then warm, for uv and for harness, in fresh folders; then harness's no-op."""
    times: dict[str, float] = {}
    uv_argv, uv_work = uv_compile(scratch / "uv", requirements)
    env_uv = uv_env(base=_env())
    project = make_project(scratch / "project", {name: requirements})
    argv = [*harness, "--home", str(scratch / "home"), "--project", str(project), "lock"]
    # A harness from before issue 17 (no stamp, no --refresh) resolves on every lock.
    refresh = ["--refresh"] if HAS_REFRESH else []
    for mode, extra in (("cold", []), ("warm", refresh)):
        runs = [("uv", uv_argv, uv_work, env_uv), ("harness", argv + extra, project, _env())]
        for label, command, cwd, env in reversed(runs) if harness_first else runs:
            times[f"{label} {mode}"] = timed(command, cwd=cwd, env=env)
            times[f"{label} {mode} cpu"] = LAST_CPU
    times["harness no-op"] = timed(argv, cwd=project, env=_env())
    times["harness no-op cpu"] = LAST_CPU
    return times


HAS_REFRESH = False


PLATFORMS = [TARGET, "aarch64-manylinux_2_28"]
#: uv's names of PLATFORMS as ``[tool.uv] environments`` markers (the anchor's two environments).
UV_ENVIRONMENTS = [
    "sys_platform == 'linux' and platform_machine == 'x86_64'",
    "sys_platform == 'linux' and platform_machine == 'aarch64'",
]
#: The sets locked for two platforms: the seed's sam3 set has an sdist-only package (iopath),
#: whose backend harness asks and whose build set it resolves per platform.
PLATFORM_SETS = {
    "medium": MEDIUM,
    "large": SETS["large"],
    "sam3": ["torch==2.7.0", "timm==1.0.30", "ftfy==6.1.1", "iopath==0.1.10", "pycocotools==2.0.11"],
}


def _uv_lock_project(work: Path, requirements: list[str]) -> list[str]:
    """A uv project in ``work`` whose environments are PLATFORMS; returns the ``uv lock`` argv."""
    work.mkdir(parents=True)
    deps = ", ".join(f'"{r}"' for r in requirements)
    envs = ", ".join(f'"{e}"' for e in UV_ENVIRONMENTS)
    minor = ".".join(PYTHON.split(".")[:2])
    (work / "pyproject.toml").write_text(
        f'[project]\nname = "bench"\nversion = "0"\nrequires-python = "=={minor}.*"\ndependencies = [{deps}]\n\n'
        f"[tool.uv]\nenvironments = [{envs}]\n"
    )
    python = ["--python", UV_PYTHON] if UV_PYTHON else ["--python", minor]
    return [uv_bin(), "--no-config", "--cache-dir", str(work / "cache"), "lock", "--quiet", *python]


def platforms_round(
    scratch: Path, name: str, requirements: list[str], harness: list[str], harness_first: bool
) -> dict[str, float]:
    """``uv lock`` of the two environments, harness's lock of one and of two platforms, each
    cold (empty caches) then warm (uv's lock file removed; harness with --refresh), harness and
    uv alternating which goes first."""
    times: dict[str, float] = {}
    work = scratch / "uv-lock"
    uv_argv = _uv_lock_project(work, requirements)
    env_uv = uv_env(base=_env())
    refresh = ["--refresh"] if HAS_REFRESH else []
    commands: list[tuple[str, list[str], Path, dict[str, str]]] = [("uv lock", uv_argv, work, env_uv)]
    for label, platforms in (("two", PLATFORMS), ("one", PLATFORMS[:1])):
        project = make_project(scratch / label, {name: requirements})
        listed = ", ".join(f'"{p}"' for p in platforms)
        (project / "harness.toml").write_text(f'[lock]\nplatforms = [{listed}]\n\n[lock.python]\n"3.11" = "{PYTHON}"\n')
        argv = [*harness, "--home", str(scratch / f"home-{label}"), "--project", str(project), "lock"]
        commands.append((label, argv, project, _env()))
    if harness_first:
        commands = commands[1:] + commands[:1]
    for mode in ("cold", "warm"):
        for label, argv, cwd, env in commands:
            if label == "uv lock":
                (work / "uv.lock").unlink(missing_ok=True)
            times[f"{label} {mode}"] = timed(
                argv + (refresh if mode == "warm" and label != "uv lock" else []), cwd=cwd, env=env
            )
    return times


def bench_platforms(runs: int, harness: list[str], names: list[str]) -> None:
    sets = {k: PLATFORM_SETS[k] for k in names}
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in sets}
    with tempfile.TemporaryDirectory(prefix="harness-bench-platforms-") as tmp:
        for run in range(runs):
            for name, requirements in sets.items():
                scratch = Path(tmp) / f"{name}-{run}"
                for key, value in platforms_round(scratch, name, requirements, harness, run % 2 == 1).items():
                    samples[name].setdefault(key, []).append(value)
                shutil.rmtree(scratch)
    print(
        f"\n{'set':<8} {'mode':<5} {'uv lock s':>10} {'one platform s':>15} {'two platforms s':>16} {'two/uv lock':>12} "
        f"{'paired':>7} {'two/one':>8}   (min-max two, uv lock)"
    )
    verdicts = []
    for name, by_key in samples.items():
        for mode in ("cold", "warm"):
            uv, one, two = (statistics.median(by_key[f"{k} {mode}"]) for k in ("uv lock", "one", "two"))
            paired = statistics.median(
                t / u for t, u in zip(by_key[f"two {mode}"], by_key[f"uv lock {mode}"], strict=True)
            )
            verdicts.append(two / uv <= 1.2)
            spread = (
                f"{min(by_key[f'two {mode}']):.2f}-{max(by_key[f'two {mode}']):.2f}, "
                f"{min(by_key[f'uv lock {mode}']):.2f}-{max(by_key[f'uv lock {mode}']):.2f}"
            )
            print(
                f"{name:<8} {mode:<5} {uv:10.3f} {one:15.3f} {two:16.3f} {two / uv:12.2f} {paired:7.2f} "
                f"{two / one:8.2f}   ({spread})"
            )
    print(
        f"two platforms / uv lock <= 1.2: {'meets' if all(verdicts) else 'MISSES'} (met in {sum(verdicts)} of {len(verdicts)})"
    )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


#: What the preloaded harness runs once its parent says go: the modules a cold lock imports are
#: already loaded, so the time left is harness's own work beside uv's.
_PRELOADED = """
import sys
import harness.cli, harness.lock.generate, harness.manifests.project
sys.stdout.write("ready\\n"); sys.stdout.flush(); sys.stdin.readline()
sys.argv = ["harness", *sys.argv[1:]]
harness.cli.console_main()
"""


def _preloaded(python: str, argv: list[str], *, cwd: Path, env: dict[str, str]) -> float:
    """``harness ARGV`` in a process that imported a lock's modules first, timed from go to exit."""
    process = subprocess.Popen(
        [python, "-c", _PRELOADED, *argv], cwd=cwd, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise SystemExit(f"the preloaded harness did not start:\n{process.communicate()[1]}")
    start = time.perf_counter()
    process.stdin.write("go\n")
    process.stdin.flush()
    _, err = process.communicate()
    elapsed = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"the preloaded harness failed:\n{err}")
    return elapsed


def breakdown_round(
    scratch: Path, requirements: list[str], harness: list[str], python: str, turn: int
) -> dict[str, float]:
    """One cold round of the four commands, in an order that turns with ``turn``."""
    project = make_project(scratch / "project", {"set": requirements})
    listed = ", ".join(f'"{p}"' for p in PLATFORMS)
    (project / "harness.toml").write_text(f'[lock]\nplatforms = [{listed}]\n\n[lock.python]\n"3.11" = "{PYTHON}"\n')
    uv_work = scratch / "uv-lock"
    uv_lock = _uv_lock_project(uv_work, requirements)
    uv_lock[uv_lock.index("--python") + 1] = python
    compiles = scratch / "compiles"
    compiles.mkdir()
    (compiles / "req.in").write_text("".join(r + "\n" for r in requirements))
    side_by_side = " & ".join(
        " ".join(shlex.quote(a) for a in _compile_argv(compiles, f"pylock.{i}.toml", "--python-platform", p, "--python", python))
        for i, p in enumerate(PLATFORMS)
    )  # fmt: skip
    env_uv = uv_env(base=_env())
    times: dict[str, float] = {}
    home = iter(range(2))

    def lock_argv() -> list[str]:
        """A cold lock: a fresh home, and no previous lock to take pins from."""
        shutil.rmtree(project / "locks", ignore_errors=True)
        return ["--home", str(scratch / f"home-{next(home)}"), "--project", str(project), "lock"]

    steps = {
        "uv lock": lambda: timed(uv_lock, cwd=uv_work, env=env_uv),
        "compiles": lambda: timed(["bash", "-c", f"{side_by_side} & wait"], cwd=compiles, env=env_uv),
        "preloaded": lambda: _preloaded(python, lock_argv(), cwd=project, env=_env()),
        "harness": lambda: timed([*harness, *lock_argv()], cwd=project, env=_env()),
    }
    order = list(steps)
    for label in order[turn % 4 :] + order[: turn % 4]:
        times[label] = steps[label]()
    return times


def bench_breakdown(runs: int, harness: list[str], python: str, names: list[str]) -> None:
    """Where a cold two-platform lock's time goes beside ``uv lock`` (issue 30, step 4)."""
    print(f"\nbreakdown, cold, every command handed {python} (no interpreter search on either side):")
    print(
        f"{'set':<8} {'uv lock s':>10} {'two compiles s':>15} {'preloaded s':>12} {'harness s':>10}   (each / uv lock)"
    )
    for name in names:
        samples: dict[str, list[float]] = {}
        with tempfile.TemporaryDirectory(prefix="harness-bench-breakdown-") as tmp:
            for run in range(runs):
                scratch = Path(tmp) / str(run)
                for key, value in breakdown_round(scratch, PLATFORM_SETS[name], harness, python, run).items():
                    samples.setdefault(key, []).append(value)
                shutil.rmtree(scratch)
        uv, compiles, preloaded, whole = (
            statistics.median(samples[k]) for k in ("uv lock", "compiles", "preloaded", "harness")
        )
        print(
            f"{name:<8} {uv:10.3f} {compiles:15.3f} {preloaded:12.3f} {whole:10.3f}   "
            f"({compiles / uv:.2f}, {preloaded / uv:.2f}, {whole / uv:.2f})"
        )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _interpreter(harness: list[str]) -> str:
    """The harness command's own interpreter: its script's shebang, else the command itself."""
    first = Path(harness[0])
    line = first.read_text(errors="replace").partition("\n")[0] if first.is_file() else ""
    return line[2:].strip() if line.startswith("#!") else harness[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--part",
        choices=("all", "single", "platforms", "breakdown"),
        default="all",
        help="single: harness beside uv for one target; platforms: one lock for two platforms; breakdown: where "
        "a cold two-platform lock's time goes (uv lock, the two compiles alone, harness with its modules loaded)",
    )
    parser.add_argument(
        "--harness", help="the harness command to run (default: a regular install of this checkout), e.g. a baseline's"
    )
    parser.add_argument("--editable", action="store_true", help="run this Python's harness (the editable install)")
    parser.add_argument("--sets", default=",".join(SETS), help=f"requirement sets to run (of {', '.join(SETS)})")
    parser.add_argument(
        "--platform-sets",
        default="medium,large,sam3",
        help=f"sets locked for two platforms (of {', '.join(PLATFORM_SETS)})",
    )
    parser.add_argument(
        "--uv-python",
        action="store_true",
        help="hand the uv anchor harness's interpreter (--python), as harness hands it to uv: no PATH search on "
        "either side",
    )
    args = parser.parse_args()
    installed = tempfile.TemporaryDirectory(prefix="harness-bench-install-")
    if args.harness:
        harness = args.harness.split()
    elif args.editable:
        harness = harness_command()
    else:
        harness = [str(regular_install(Path(installed.name)))]
    global HAS_REFRESH, UV_PYTHON
    if args.uv_python:
        UV_PYTHON = _interpreter(harness)
    HAS_REFRESH = (
        "--refresh"
        in subprocess.run(
            [*harness, "lock", "--help"], capture_output=True, text=True, cwd=tempfile.gettempdir()
        ).stdout
    )
    # Bytecode as an installed harness has it (PYTHONDONTWRITEBYTECODE would leave harness's
    # own modules compiled from source on every run of an editable install).
    compileall.compile_dir(str(ROOT / "harness"), quiet=1)
    print(f"harness: {' '.join(harness)}{'' if HAS_REFRESH else ' (no --refresh: warm and no-op both resolve)'}")
    if UV_PYTHON:
        print(f"uv anchor: --python {UV_PYTHON}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
        f"{platform.release()}, CPython {platform.python_version()}; {args.runs} runs; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if args.part in ("all", "platforms"):
        bench_platforms(args.runs, harness, args.platform_sets.split(","))
    if args.part == "breakdown":
        bench_breakdown(args.runs, harness, _interpreter(harness), args.platform_sets.split(","))
    if args.part in ("platforms", "breakdown"):
        return
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="harness-bench-lock-") as tmp:
        scratch_root = Path(tmp)
        sets = {name: SETS[name] for name in args.sets.split(",")}
        samples: dict[str, dict[str, list[float]]] = {n: {} for n in sets}
        for run in range(args.runs):
            for name, requirements in sets.items():
                scratch = scratch_root / f"{name}-{run}"
                for key, value in one_round(scratch, name, requirements, harness, run % 2 == 1).items():
                    samples[name].setdefault(key, []).append(value)
                shutil.rmtree(scratch)
        print(
            f"\n{'set':<12} {'mode':<5} {'uv s':>7} {'harness s':>10} {'ratio':>6} {'paired':>7}   {'CPU s uv':>8} "
            f"{'harness':>8} {'ratio':>6}   (min-max harness, uv)"
        )
        noops = []
        for name, by_key in samples.items():
            for mode in ("cold", "warm"):
                uv = statistics.median(by_key[f"uv {mode}"])
                ours = statistics.median(by_key[f"harness {mode}"])
                ratio = ours / uv
                verdicts.append(ratio <= 1.3)
                spread = (
                    f"{min(by_key[f'harness {mode}']):.3f}-{max(by_key[f'harness {mode}']):.3f}, "
                    f"{min(by_key[f'uv {mode}']):.3f}-{max(by_key[f'uv {mode}']):.3f}"
                )
                uv_cpu = statistics.median(by_key[f"uv {mode} cpu"])
                our_cpu = statistics.median(by_key[f"harness {mode} cpu"])
                # Each round's harness/uv ratio: both ran back to back, so the index's answer
                # times (most of uv's wall time) drift less between them than between rounds.
                rounds = zip(by_key[f"harness {mode}"], by_key[f"uv {mode}"], strict=True)
                paired = statistics.median(h / u for h, u in rounds)
                print(
                    f"{name:<12} {mode:<5} {uv:7.3f} {ours:10.3f} {ratio:6.2f} {paired:7.2f}   {uv_cpu:8.3f} "
                    f"{our_cpu:8.3f} {our_cpu / uv_cpu:6.2f}   ({spread})"
                )
            noop = statistics.median(by_key["harness no-op"])
            noops.append(noop)
            print(
                f"{name:<12} no-op {'':>7} {noop:10.3f}          {'':>8} {statistics.median(by_key['harness no-op cpu']):8.3f}"
                f"          (re-lock, nothing changed: no resolver)"
            )

        # lock --check on 10 locked manifests: 5 copies of the kinematics example (its path
        # weight is re-hashed by the check) and 5 of the medium set.
        project = make_project(scratch_root / "check", {f"medium{i}": SETS["medium"] for i in range(5)})
        shutil.copytree(ROOT / "services" / "assets", project / "services" / "assets")
        kinematics = (ROOT / "services" / "kinematics.toml").read_text()
        for i in range(5):
            (project / "services" / f"kinematics{i}.toml").write_text(kinematics)
        # Files changed within 2 s of a lock get no stamp (harness.lock.stamp): a checkout's
        # assets are older than that, so the copies made above are left to age first.
        time.sleep(2.1)
        home = scratch_root / "check-home"
        timed([*harness, "--home", str(home), "--project", str(project), "lock"], cwd=project, env=_env())
        checks: dict[str, float] = {}
        # The home that locked (stamps hold: a pre-commit hook's case), and a home without
        # stamps (a fresh clone's: the full check, manifests validated, path weights re-hashed).
        for label, check_home in (("from the stamps", home), ("full check", scratch_root / "check-fresh-home")):
            argv = [*harness, "--home", str(check_home), "--project", str(project), "lock", "--check"]
            checks[label] = statistics.median(timed(argv, cwd=project, env=_env()) for _ in range(max(10, args.runs)))
    print()
    for label, value in checks.items():
        print(
            f"harness lock --check, 10 manifests, {label}: median {value:.3f} s "
            f"({'meets' if value < 0.3 else 'MISSES'} < 0.3 s)"
        )
    print(f"harness/uv <= 1.3: {'meets' if all(verdicts) else 'MISSES'} (met in {sum(verdicts)} of {len(verdicts)})")
    print(f"no-op re-lock < 0.2 s: {'meets' if max(noops) < 0.2 else 'MISSES'} (slowest median {max(noops):.3f} s)")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
