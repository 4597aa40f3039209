"""The seed's own environments end to end: lock and realize sam3's and SmolVLA's requirement sets
into an empty home beside uv, in one run (issue 28, step 7; a benchmark, not CI: several GB).

For each set a throw-away project gets one manifest holding the set (the manifest's
``[environment]`` without its GitHub source), and then, in an empty ``HARNESS_HOME`` (its own
uv cache empty too; ``UV_CACHE_DIR`` also points at a fresh folder, though harness ignores it):

* ``harness lock NAME`` and ``harness realize NAME``, each timed (wall and CPU seconds of the
  process); ``harness store path NAME`` names the environment, whose ``bin/python`` must
  ``import`` the set's check (``import torch, timm, ftfy, iopath, pycocotools`` /
  ``import lerobot, torch, h5py``);
* the anchor, as a user types it: ``uv venv --python <the same host CPython>`` and
  ``uv pip install --compile-bytecode <the same requirements>`` with an empty ``UV_CACHE_DIR``,
  and the same import in that venv; also ``uv pip compile --generate-hashes`` (the lock
  alone, its own empty cache) beside ``harness lock``.

Harness and uv alternate which goes first, across sets and repetitions. Printed per set:
seconds of each phase, harness / uv (lock + realize against venv + install; realize alone;
lock against compile), and disk (``du -sb``: the home, its store and its cache, against the
venv and uv's cache; hard links counted once within each; the home's environment and the
wheel files it keeps as store paths). The CUDA wheels of the default
index are what the seed's users get, so they are what is installed: several GB per set and
tool. Each set's folders are deleted once it is measured (``--keep`` keeps them); the logs
and each lock stay under ``SCRATCH/logs``. ``--sets tiny`` (``docopt`` and ``iopath``, both
sdist-only) tries the script in a minute.

A failure of harness on a real package is the finding this bench exists for: it prints the
command, its exit status and the end of its output, goes on with the anchor, and the summary
names it (exit status 1).

Needs the package registry (uv's default index, or a mirror given to both tools the way
harness takes it: ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL``). Python downloads are off for both
sides (``UV_PYTHON_DOWNLOADS=never``): uv's venv uses the host CPython and harness realizes a
host copy of the same one. SmolVLA wants Python 3.10: ``--python310 PATH`` names one (default:
pyenv's newest 3.10), put first on ``PATH`` for both tools, and the project's harness.toml
gets a pin for it.

    python bench/seed_sets.py [--sets sam3,smolvla|tiny] [--runs 1] [--scratch /tmp/seedbench]
                              [--lock-only smolvla] [--first harness|uv] [--keep] [--timeout 2400]
"""

from __future__ import annotations

import argparse
import functools
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchproject import SCIENTIFIC, harness_command  # noqa: E402
from harness.resolve.uvtool import uv_bin  # noqa: E402
from harness.store.store import remove_tree  # noqa: E402


@dataclass
class SeedSet:
    name: str
    python: str
    requirements: list[str]
    check: str


#: The seed's sets, as its manifests give them (without their GitHub sources). sam3: the five
#: requirements of the seed's services/sam3.toml; its check imports the two sdist-only or
#: compiled ones too. SmolVLA: services/smolvla.toml's requirements, on the Python 3.10 its
#: install.sh uses. ``tiny`` is not the seed's: two sdist-only packages of the seed's sets
#: (issue 28's smallest case), a few MB, to try the script with in a minute or two.
SETS = {
    "sam3": SeedSet(
        "sam3",
        "3.11",
        ["torch==2.7.0", "timm==1.0.30", "ftfy==6.1.1", "iopath==0.1.10", "pycocotools==2.0.11"],
        "import torch, timm, ftfy, iopath, pycocotools.mask; "
        "print('torch', torch.__version__, 'timm', timm.__version__, 'cuda build', torch.version.cuda)",
    ),
    "smolvla": SeedSet(
        "smolvla",
        "3.10",
        ["lerobot[smolvla]==0.4.4", "torch==2.7.1", "torchvision==0.22.1", "torchcodec==0.5", "h5py==3.14.0"],
        "import lerobot, torch, h5py; "
        "print('lerobot', getattr(lerobot, '__version__', '?'), 'torch', torch.__version__)",
    ),
    # Not the seed's either: the mid-size scientific set of bench/benchproject.py (issue 30,
    # step 3: disk against uv's venv and cache without the CUDA wheels' gigabytes).
    "scientific": SeedSet(
        "scientific",
        "3.11",
        list(SCIENTIFIC),
        "import numpy, scipy.linalg, pandas; print('numpy', numpy.__version__, 'pandas', pandas.__version__)",
    ),
    "tiny": SeedSet(
        "tiny",
        "3.11",
        ["docopt==0.6.2", "iopath==0.1.10"],
        "import docopt, iopath; print('docopt', docopt.__version__, 'iopath', iopath.__version__)",
    ),
}
#: Variables that only say where bytes come from: given to both tools alike (harness keeps them).
INDEX_ENV = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_HTTP_TIMEOUT", "UV_CONCURRENT_DOWNLOADS")


@dataclass
class Step:
    """One command's outcome."""

    argv: list[str]
    seconds: float
    cpu: float
    rc: int
    log: Path
    tail: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass
class Outcome:
    name: str
    order: str
    figures: dict[str, float] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------- helpers


def base_env(extra_path: Path | None, **extra: str) -> dict[str, str]:
    """The caller's environment without harness, uv or pip settings, but with the index ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "UV_", "PIP_"))}
    env.pop("VIRTUAL_ENV", None)
    env.update({k: os.environ[k] for k in INDEX_ENV if k in os.environ})
    if extra_path is not None:
        env["PATH"] = f"{extra_path}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "UV_PYTHON_DOWNLOADS": "never", **extra}


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def step(argv: list[str], log: Path, *, env: dict[str, str], cwd: Path, timeout: float) -> Step:
    """Run ``argv`` with its output in ``log``; time it; never raise on its failure. What
    the step before wrote (gigabytes of environment and cache) is flushed to disk first and,
    where this runs as root, the page cache dropped, outside the timing: otherwise whoever
    runs second pays the first one's writeback and memory reclaim (uv measured 27 s first and
    49 s second, at 83 s of CPU instead of 44; a sync alone did not even it out)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        pass  # not root: the flush alone
    before, start = cpu_of_children(), time.perf_counter()
    with log.open("w") as out:
        out.write("$ " + " ".join(map(str, argv)) + "\n")
        out.flush()
        try:
            rc = subprocess.run(
                argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
            out.write(f"\n[seed_sets] timed out after {timeout:.0f} s\n")
    result = Step(argv, time.perf_counter() - start, cpu_of_children() - before, rc, log)
    if rc != 0:
        lines = log.read_text(errors="replace").splitlines()
        result.tail = "\n".join(lines[-60:])
    return result


def du(*paths: Path) -> int:
    """Apparent bytes (``du -sb``) of ``paths`` together, each hard-linked inode counted once."""
    present = [str(p) for p in paths if p.exists()]
    if not present:
        return 0
    out = subprocess.run(["du", "-sbc", *present], capture_output=True, text=True, check=False).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def default_python310() -> Path | None:
    versions = sorted(Path.home().glob(".pyenv/versions/3.10.*/bin/python3.10"))
    found = shutil.which("python3.10")
    return versions[-1] if versions else (Path(found) if found else None)


def manifest(seed: SeedSet) -> str:
    reqs = ",\n  ".join(json.dumps(r) for r in seed.requirements)
    return (
        f"# The seed's {seed.name} environment without its GitHub source (bench/seed_sets.py).\n"
        f'kind = "{seed.name}"\nsummary = "bench: the seed\'s {seed.name} set"\n'
        f'command = ["{{python}}", "-c", "pass"]\nport = 9000\n\n'
        f'[environment]\npython = "{seed.python}"\nrequirements = [\n  {reqs},\n]\n'
    )


def make_project(root: Path, seed: SeedSet, python_pins: dict[str, str]) -> Path:
    """A project with the repository's harness.toml (platform, pins) plus ``python_pins``."""
    (root / "services").mkdir(parents=True)
    text = (ROOT / "harness.toml").read_text()
    for minor, full in python_pins.items():
        if f'"{minor}" =' in text:
            continue
        if "[lock.python]\n" not in text:
            text += "\n[lock.python]\n"
        text = text.replace("[lock.python]\n", f'[lock.python]\n"{minor}" = "{full}"\n', 1)
    (root / "harness.toml").write_text(text)
    (root / "services" / f"{seed.name}.toml").write_text(manifest(seed))
    return root


def lock_summary(lock: Path) -> dict[str, object]:
    """Counts from a lock: packages, wheels' bytes, sdists, build requirements."""
    import tomllib

    data = tomllib.loads(lock.read_text())
    packages = data.get("packages", [])
    wheel_bytes = sum(w.get("size", 0) for p in packages for w in p.get("wheels", []))
    sdists = sorted(p["name"] for p in packages if p.get("sdist"))
    builds = sorted({p["name"] for p in data.get("build-packages", [])})
    return {
        "packages": len(packages),
        "wheel_bytes": wheel_bytes,
        "sdists": sdists,
        "build_packages": builds,
        "python": data.get("python", {}).get("version"),
    }


# ----------------------------------------------------------------------------------- the run


def report_failure(out: Outcome, what: str, result: Step) -> None:
    text = (
        f"{out.name}: {what} failed (exit {result.rc}, {result.seconds:.1f} s)\n"
        f"  command: {' '.join(map(str, result.argv))}\n"
        f"  log: {result.log}\n" + "\n".join(f"  | {line}" for line in result.tail.splitlines())
    )
    out.failures.append(text)
    print("\n" + text, flush=True)


def run_harness(
    seed: SeedSet,
    base: Path,
    env: dict[str, str],
    out: Outcome,
    *,
    lock_only: bool,
    timeout: float,
    keep_wheel_files: bool = False,
) -> None:
    harness = harness_command()
    project, home = base / "project", base / "home"
    pins = {"3.10": python_version_of(env, "3.10")} if seed.python == "3.10" else {}
    make_project(project, seed, pins)
    henv = {**env, "HARNESS_HOME": str(home), "UV_CACHE_DIR": str(base / "uv-cache-ignored")}
    # `[gc] keep-wheel-files`: false (harness's default) streams an index's wheels into the
    # environment and keeps no package file (issue 30, step 3); true stores each one first.
    henv["HARNESS_GC_KEEP_WHEEL_FILES"] = "1" if keep_wheel_files else "0"
    cmd = [*harness, "--project", str(project), "--home", str(home)]
    print(f"  harness lock {seed.name} …", flush=True)
    lock = step([*cmd, "lock", seed.name], base / "logs" / "harness-lock.log", env=henv, cwd=base, timeout=timeout)
    out.figures["harness lock s"], out.figures["harness lock cpu"] = lock.seconds, lock.cpu
    if not lock.ok:
        report_failure(out, "harness lock", lock)
        return
    summary = lock_summary(project / "locks" / f"{seed.name}.lock.toml")
    out.notes.append(
        f"lock: {summary['packages']} packages, wheel files listed (every tag) {gib(summary['wheel_bytes'])}, "
        f"sdists {summary['sdists'] or 'none'}, build packages {summary['build_packages'] or 'none'}, "
        f"python {summary['python']}"
    )
    print(f"    {lock.seconds:.1f} s; {out.notes[-1]}", flush=True)
    shutil.copy(project / "locks" / f"{seed.name}.lock.toml", base / "logs" / f"{seed.name}.lock.toml")
    if lock_only:
        out.notes.append("realize not run (--lock-only)")
        return
    print(f"  harness realize {seed.name} …", flush=True)
    realize = step(
        [*cmd, "realize", seed.name], base / "logs" / "harness-realize.log", env=henv, cwd=base, timeout=timeout
    )
    out.figures["harness realize s"], out.figures["harness realize cpu"] = realize.seconds, realize.cpu
    out.figures["harness home bytes"] = du(home)
    out.figures["harness store bytes"] = du(home / "store")
    out.figures["harness cache bytes"] = du(home / "cache")
    if not realize.ok:
        report_failure(out, "harness realize", realize)
        return
    print(f"    {realize.seconds:.1f} s; home {gib(out.figures['harness home bytes'])}", flush=True)
    path = subprocess.run(
        [*cmd, "store", "path", seed.name], env=henv, cwd=base, capture_output=True, text=True, check=False
    )
    if path.returncode != 0:
        out.failures.append(f"{seed.name}: harness store path failed: {path.stderr.strip()}")
        return
    environment = Path(path.stdout.strip().splitlines()[-1])
    # Where the home's bytes are: the environment, and the downloaded wheel files kept as store
    # paths of their own (uv keeps no wheel file, only its unpacked copy, linked into the venv).
    out.figures["harness env bytes"] = du(environment)
    out.figures["harness wheel files bytes"] = du(*(home / "store").glob("*.whl"))
    out.figures["harness interpreter bytes"] = du(*(home / "store").glob("*-cpython-*"))
    fetched = re.findall(r"^fetching \d+ file\(s\): ([\d.]+ [KMG]iB), done", realize_log(base), re.M)
    if fetched:
        out.notes.append(f"realize fetched {fetched[-1]}")
    check_import(seed, environment / "bin" / "python", base / "logs" / "harness-import.log", env, out, "harness")


def realize_log(base: Path) -> str:
    log = base / "logs" / "harness-realize.log"
    return log.read_text(errors="replace") if log.exists() else ""


def python_version_of(env: dict[str, str], minor: str) -> str:
    found = subprocess.run(
        [uv_bin(), "--no-config", "python", "find", minor], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    return subprocess.run(
        [found, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True, check=True
    ).stdout.strip()


def run_uv(seed: SeedSet, base: Path, env: dict[str, str], out: Outcome, *, lock_only: bool, timeout: float) -> None:
    uv = uv_bin()
    python = subprocess.run(
        [uv, "--no-config", "python", "find", python_version_of(env, seed.python)],
        env=env,
        cwd=base,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # The lock's anchor: resolution with hashes, from an empty cache of its own.
    compile_env = {**env, "UV_CACHE_DIR": str(base / "uv-compile-cache")}
    reqs = base / "requirements.in"
    reqs.write_text("\n".join(seed.requirements) + "\n")
    print(f"  uv pip compile {seed.name} …", flush=True)
    compiled = step(
        [
            uv,
            "--no-config",
            "pip",
            "compile",
            "--quiet",
            "--generate-hashes",
            "--python",
            python,
            "-o",
            str(base / "requirements.txt"),
            str(reqs),
        ],
        base / "logs" / "uv-compile.log",
        env=compile_env,
        cwd=base,
        timeout=timeout,
    )
    out.figures["uv compile s"] = compiled.seconds
    if not compiled.ok:
        report_failure(out, "uv pip compile (anchor)", compiled)
    remove_tree(base / "uv-compile-cache")
    if lock_only:
        return
    uenv = {**env, "UV_CACHE_DIR": str(base / "uv-cache")}
    venv = base / "venv"
    print(f"  uv venv + uv pip install --compile-bytecode {seed.name} …", flush=True)
    made = step(
        [uv, "--no-config", "venv", "--quiet", "--python", python, str(venv)],
        base / "logs" / "uv-venv.log",
        env=uenv,
        cwd=base,
        timeout=timeout,
    )
    installed = (
        step(
            [
                uv,
                "--no-config",
                "pip",
                "install",
                "--compile-bytecode",
                "--python",
                str(venv / "bin" / "python"),
                *seed.requirements,
            ],
            base / "logs" / "uv-install.log",
            env=uenv,
            cwd=base,
            timeout=timeout,
        )
        if made.ok
        else made
    )
    out.figures["uv venv s"] = made.seconds
    out.figures["uv install s"] = installed.seconds if made.ok else 0.0
    out.figures["uv install cpu"] = installed.cpu + made.cpu if made.ok else made.cpu
    out.figures["uv venv bytes"] = du(venv)
    out.figures["uv cache bytes"] = du(base / "uv-cache")
    out.figures["uv venv+cache bytes"] = du(venv, base / "uv-cache")
    if not installed.ok:
        report_failure(out, "uv venv + uv pip install (anchor)", installed)
        return
    print(
        f"    {made.seconds + installed.seconds:.1f} s; venv+cache {gib(out.figures['uv venv+cache bytes'])}",
        flush=True,
    )
    check_import(seed, venv / "bin" / "python", base / "logs" / "uv-import.log", env, out, "uv")


def check_import(seed: SeedSet, python: Path, log: Path, env: dict[str, str], out: Outcome, who: str) -> None:
    result = step([str(python), "-c", seed.check], log, env=env, cwd=log.parent, timeout=600)
    if result.ok:
        out.checks[who] = log.read_text().splitlines()[-1]
        out.figures[f"{who} import s"] = result.seconds
        print(f"    import in {who}'s environment: {out.checks[who]} ({result.seconds:.1f} s)", flush=True)
    else:
        out.checks[who] = "FAILED"
        report_failure(out, f"import check in {who}'s environment", result)


def print_outcome(out: Outcome) -> None:
    f = out.figures
    print(f"\n{out.name} (first: {out.order}); load {load()}")
    for note in out.notes:
        print(f"  {note}")
    rows = [
        ("harness lock", f.get("harness lock s"), f.get("harness lock cpu")),
        ("harness realize", f.get("harness realize s"), f.get("harness realize cpu")),
        ("uv pip compile --generate-hashes", f.get("uv compile s"), None),
        ("uv venv", f.get("uv venv s"), None),
        ("uv pip install --compile-bytecode", f.get("uv install s"), f.get("uv install cpu")),
    ]
    for label, seconds, cpu in rows:
        if seconds is not None:
            print(f"  {label:<36} {seconds:8.1f} s" + (f"  (CPU {cpu:.1f} s)" if cpu is not None else ""))
    if "harness realize s" in f and f.get("uv install s"):
        uv_total = f["uv venv s"] + f["uv install s"]
        ours = f["harness lock s"] + f["harness realize s"]
        f["ratio total"], f["ratio realize"] = ours / uv_total, f["harness realize s"] / uv_total
        print(f"  harness lock+realize / uv venv+install: {ours:.1f} / {uv_total:.1f} s = {f['ratio total']:.2f}x")
        print(f"  harness realize alone / uv venv+install: {f['ratio realize']:.2f}x")
    if "harness lock s" in f and f.get("uv compile s"):
        f["ratio lock"] = f["harness lock s"] / f["uv compile s"]
        print(f"  harness lock / uv pip compile: {f['ratio lock']:.2f}x")
    if "harness home bytes" in f:
        print(
            f"  disk: home {gib(f['harness home bytes'])} (store {gib(f['harness store bytes'])}, "
            f"cache {gib(f['harness cache bytes'])}"
            + (
                f"; environment {gib(f['harness env bytes'])}, wheel files {gib(f['harness wheel files bytes'])}, "
                f"interpreter {gib(f.get('harness interpreter bytes', 0))}"
                if "harness env bytes" in f
                else ""
            )
            + ")"
            + (
                f"; uv venv {gib(f['uv venv bytes'])} + cache {gib(f['uv cache bytes'])} = {gib(f['uv venv+cache bytes'])}"
                if "uv venv bytes" in f
                else ""
            )
        )
        if f.get("uv venv+cache bytes"):
            f["ratio disk"] = f["harness home bytes"] / f["uv venv+cache bytes"]
            print(f"  disk, harness home / uv venv+cache: {f['ratio disk']:.2f}x")
    for who, text in out.checks.items():
        print(f"  import, {who}: {text}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="sam3,smolvla", help=f"comma-separated, of {', '.join(SETS)}")
    parser.add_argument("--runs", type=int, default=1, help="repetitions of each set (several GB each)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/seedbench"))
    parser.add_argument("--lock-only", default="", help="sets to lock (and uv pip compile) but not realize or install")
    parser.add_argument("--python310", type=Path, default=None, help="a CPython 3.10 for SmolVLA")
    parser.add_argument("--keep", action="store_true", help="keep each set's homes, venvs and caches")
    parser.add_argument("--timeout", type=float, default=2400, help="seconds any one command may take")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--first", choices=("harness", "uv"), default="harness", help="who goes first in the first set")
    parser.add_argument(
        "--keep-wheel-files",
        action="store_true",
        help="realize with `[gc] keep-wheel-files = true`: each package file is stored first and kept "
        "(the default, false, streams an index's wheels into the environment and keeps none)",
    )
    parser.add_argument("--drop-wheel-files", action="store_true", help="the default (kept for older command lines)")
    args = parser.parse_args()
    names = [n for n in args.sets.split(",") if n]
    lock_only = {n for n in args.lock_only.split(",") if n}
    py310 = args.python310 or default_python310()
    import harness as package

    args.scratch.mkdir(parents=True, exist_ok=True)
    print(
        f"date {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {platform.machine()}, "
        f"nproc {os.cpu_count()}, {platform.system()} {platform.release()}; harness {package.__version__} "
        f"({subprocess.run(['git', '-C', str(ROOT), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()}); "
        f"{subprocess.run([uv_bin(), '--version'], capture_output=True, text=True).stdout.strip()}; "
        f"index: {'configured (' + ', '.join(k for k in INDEX_ENV[:2] if k in os.environ) + ')' if any(k in os.environ for k in INDEX_ENV[:2]) else 'uv default'}; "
        f"load {load()}; free disk {gib(shutil.disk_usage(args.scratch).free)}",
        flush=True,
    )
    outcomes: list[Outcome] = []
    turn = 0 if args.first == "harness" else 1
    for name in names:
        seed = SETS[name]
        extra = py310.parent if seed.python == "3.10" and py310 else None
        for rep in range(args.runs):
            base = args.scratch / f"{name}-{rep}"
            if base.exists():
                remove_tree(base)
            base.mkdir(parents=True)
            env = base_env(extra)
            harness_first = turn % 2 == 0
            turn += 1
            out = Outcome(name if args.runs == 1 else f"{name} #{rep + 1}", "harness" if harness_first else "uv")
            print(
                f"\n== {out.name}: {len(seed.requirements)} requirements, Python {seed.python}; {out.order} first; load {load()}",
                flush=True,
            )
            harness_side = functools.partial(run_harness, keep_wheel_files=args.keep_wheel_files)
            sides = [("harness", harness_side), ("uv", run_uv)]
            for who, side in sides if harness_first else sides[::-1]:
                (base / who).mkdir()
                side(seed, base / who, env, out, lock_only=name in lock_only, timeout=args.timeout)
            print_outcome(out)
            outcomes.append(out)
            if not args.keep:
                logs = args.scratch / "logs" / base.name
                for who in ("harness", "uv"):
                    if (base / who / "logs").is_dir():
                        shutil.copytree(base / who / "logs", logs / who, dirs_exist_ok=True)
                remove_tree(base)
    print("\nsummary")
    for out in outcomes:
        f = out.figures
        bits = [f"lock {f['harness lock s']:.1f} s" if "harness lock s" in f else "lock —"]
        if "harness realize s" in f:
            bits.append(f"realize {f['harness realize s']:.1f} s")
        if f.get("uv install s"):
            bits.append(f"uv {f['uv venv s'] + f['uv install s']:.1f} s")
        if "ratio total" in f:
            bits.append(f"ratio {f['ratio total']:.2f}x (realize alone {f['ratio realize']:.2f}x)")
        bits.append(
            "imports: " + ", ".join(f"{k} {'ok' if v != 'FAILED' else 'FAILED'}" for k, v in out.checks.items())
            if out.checks
            else "imports: not checked"
        )
        print(
            f"  {out.name:<12} " + "; ".join(bits) + ("; FAILURES: " + str(len(out.failures)) if out.failures else "")
        )
    if args.json:
        args.json.write_text(json.dumps([out.__dict__ for out in outcomes], indent=2, default=str))
    failed = [text for out in outcomes for text in out.failures]
    for text in failed:
        print("\n" + text)
    print(f"\nload at the end: {load()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
