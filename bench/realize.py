"""Realizing: `harness realize` and the store beside uv, b3sum, sha256sum and curl, in one run.

Goals (issue 4), each printed with its ratio:

a. realize of an environment vs ``uv venv`` + ``uv pip sync`` of the same pins (the lock's
   hashed requirements export), cold and warm [harness <= 1.2x uv]. Sets: the kinematics
   example's lock (numpy) and a medium set locked here (requests, rich, pydantic).
   uv: ``uv venv --python <the host CPython the lock names>`` then ``uv pip sync
   --require-hashes``, with its own cache. Cold: empty caches (uv's; harness's home), so both
   download every wheel; harness is measured twice, from an empty home (it also builds the
   interpreter: a relocatable copy of the host CPython, which ``uv venv`` links to instead)
   and from a home holding only the realized interpreter. Warm: caches kept, the environment
   deleted (uv: the venv folder; harness: its store path), then built again.
b. a second environment with the same wheels under another name [<= 5% more store disk,
   ``du`` counting hard links once].
c. a no-op realize of every example that is locked (and realizable without a GPU) here
   [< 0.5 s]; also without the no-op stamp (the full decision: manifests validated, digests
   compared, path weights checked, store paths looked up).
d. ``harness store verify --check-contents`` of a synthetic 1 GiB weight set (4 random files,
   registered with Store.add) vs ``b3sum`` and ``sha256sum`` of the same files, page cache warm
   [>= 0.8x their throughput]. harness as a user's install runs it (a wheel of this checkout
   in a new venv: benchproject.regular_install), and also this checkout's editable install.
e. downloading those files from a local HTTP server (127.0.0.1, sendfile) through
   harness's downloader (``harness.download.download``: streamed, sha256-checked,
   resumable) vs ``curl`` [>= 0.8x its throughput]; also ``curl`` then ``sha256sum``, which
   is what the downloader's check amounts to.

f. issue 17, a VLM-like set (:data:`VLM`, 30+ packages): realize of a *second* environment of
   the same set with everything warm (another name; the first environment's pycs are in the
   store) vs ``uv venv`` + ``uv pip sync --compile-bytecode`` into a new venv with uv's cache
   warm [<= 1.0x, aim 0.5x]; and realize from an empty home (interpreter included) vs the
   same uv commands from an empty cache [<= 2x]. Then one run of each under cProfile, printed
   as seconds per phase (where the time goes).

Needs the package registry for (a)-(c) and (f) (uv's default index, or a mirror configured for uv;
``--offline-only`` skips them). A comparison whose anchor tool is missing is skipped. Python
downloads are switched off (``UV_PYTHON_DOWNLOADS=never``) for both sides: uv's venv uses the
host CPython, and harness copies the same one.

    python bench/realize.py [--runs 3] [--gib 1] [--offline-only | --only-vlm | --only-verify]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.resolve.uvtool import uv_bin  # noqa: E402
from bench.benchproject import MEDIUM, VLM, harness_command, make_project, regular_install  # noqa: E402
from harness.store.hashing import store_hash, store_path_name  # noqa: E402
from harness.store.store import BuildResult, Store, remove_tree  # noqa: E402

#: Phases of a realize, by the functions that do them (cumulative time in a cProfile).
PHASES = [
    ("realize, all of it", "realize/builder.py", "realize_locks"),
    ("fetch (downloads, index pages)", "realize/builder.py", "_fetch"),
    ("register fetched files", "realize/builder.py", "_register"),
    ("interpreter: all (built while fetching)", "realize/builder.py", "_prepare_interpreter"),
    ("  copy the files", "realize/interpreter.py", "_copy_host"),
    ("  compile the stdlib", "realize/interpreter.py", "_finish"),
    ("environment: store add, all", "realize/builder.py", "_add_environment"),
    ("  uv venv + pip sync", "resolve/uvtool.py", "run_uv"),
    ("  bytecode: all", "realize/bytecode.py", "compile_tree"),
    ("  bytecode: look up, check, link", "realize/bytecode.py", "_place_all"),
    ("  bytecode: compile workers", "realize/bytecode.py", "_run_workers"),
    ("  path check", "realize/environment.py", "_check_paths"),
    ("  share files (pool)", "store/store.py", "_share_files"),
    ("  canonicalize", "store/store.py", "canonicalize"),
    ("  content hash", "store/hashing.py", "nar_digest"),
    ("  record bytecode entries", "store/bytecode.py", "record"),
]
SERVER = r"""
import http.server, os, sys
root = sys.argv[1]
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        path = os.path.join(root, os.path.basename(self.path))
        try:
            handle = open(path, "rb")
        except OSError:
            self.send_error(404)
            return
        with handle:
            size = os.fstat(handle.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            self.wfile.flush()
            offset = 0
            while offset < size:
                offset += os.sendfile(self.connection.fileno(), handle.fileno(), offset, size - offset)
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
DOWNLOADER = r"""
import json, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from harness.download import download
jobs, workers = json.loads(sys.argv[1]), int(sys.argv[2])
with ThreadPoolExecutor(workers) as pool:  # workers > 1: as realize's fetch phase runs them
    for _ in pool.map(lambda j: download(j[0], Path(j[1]), sha256=j[2], size=j[3]), jobs):
        pass
"""


# ----------------------------------------------------------------------------------- helpers


#: ``[gc] keep-wheel-files`` for harness's runs (``--keep-wheel-files``; harness's default, false,
#: streams an index's wheels into the environment and keeps no downloaded package file).
KEEP_WHEEL_FILES = {"HARNESS_GC_KEEP_WHEEL_FILES": "0"}


def _env(**extra: str) -> dict[str, str]:
    """The caller's environment without harness or uv settings that would change the result
    (but the ``[gc] keep-wheel-files`` this run measures)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "UV_"))}
    return {**env, "UV_PYTHON_DOWNLOADS": "never", **KEEP_WHEEL_FILES, **extra}


def run(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    result = subprocess.run(argv, env=env or _env(), cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv))} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def timed(argv: list[str], **kwargs: object) -> float:
    start = time.perf_counter()
    run(argv, **kwargs)  # type: ignore[arg-type]
    return time.perf_counter() - start


def cpu_of_children() -> float:
    """CPU seconds (user + system) of every waited-for child so far: a figure that load inflates less than wall time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def du(*paths: Path) -> int:
    """Bytes of disk used by ``paths`` together, each hard-linked inode counted once."""
    out = run(["du", "-s", "-c", "-B1", *map(str, paths)])
    return int(out.strip().splitlines()[-1].split()[0])


def median(values: list[float]) -> float:
    return statistics.median(values)


def version(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None and not Path(argv[0]).exists():
        return None
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    return (result.stdout or result.stderr).strip().splitlines()[0] if result.returncode == 0 else None


def verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def lock_of(project: Path, name: str) -> dict:
    import tomllib

    return tomllib.loads((project / "locks" / f"{name}.lock.toml").read_text())


# ------------------------------------------------------------------------------ (a) and (b)


class EnvSet:
    """One requirement set: its project, lock, hashed requirements and host interpreter."""

    def __init__(self, name: str, project: Path, work: Path, harness: list[str]) -> None:
        self.name, self.project, self.work, self.harness = name, project, work, harness
        self.lock = lock_of(project, name)
        self.requirements = work / f"{name}.txt"
        run([*harness, "--project", str(project), "export", name, "-o", str(self.requirements)])
        version = self.lock["python"]["version"]
        self.python = run([uv_bin(), "--no-config", "python", "find", version]).strip()

    def realize(self, home: Path) -> float:
        return timed([*self.harness, "--project", str(self.project), "--home", str(home), "realize", self.name])

    def uv(self, cache: Path, venv: Path, *, compile_bytecode: bool = False) -> float:
        env = _env(UV_CACHE_DIR=str(cache))
        start = time.perf_counter()
        run([uv_bin(), "--no-config", "venv", "--quiet", "--python", self.python, str(venv)], env=env)
        sync = [
            uv_bin(),
            "--no-config",
            "pip",
            "sync",
            "--quiet",
            "--require-hashes",
            "--python",
            str(venv / "bin" / "python"),
            str(self.requirements),
        ]
        run(sync + (["--compile-bytecode"] if compile_bytecode else []), env=env)
        return time.perf_counter() - start


def bench_environments(sets: list[EnvSet], runs: int, scratch: Path) -> list[tuple[str, float, str]]:
    results: list[tuple[str, float, str]] = []
    print("\n(a) realize an environment vs uv venv + uv pip sync (median s)")
    print(f"{'set':<11} {'mode':<22} {'uv':>7} {'uv+pyc':>7} {'harness':>8} {'h/uv':>6} {'h/uv+pyc':>8}")
    # A home holding only the interpreter, rsynced into each "interpreter present" home.
    seed = scratch / "seed-home"
    sets[0].realize(seed)
    # The interpreter as realized there: a host copy standing in has a name of its own, and
    # the store's note of what it stands in for (.standins) goes along with it.
    python_name = realized_interpreter(sets[0].project, seed, sets[0].name)
    for env_set in sets:
        samples: dict[str, list[float]] = {}

        def add(key: str, value: float, samples: dict[str, list[float]] = samples) -> None:
            samples.setdefault(key, []).append(value)

        for attempt in range(runs):
            base = scratch / f"{env_set.name}-{attempt}"
            # cold: empty caches everywhere
            for flag, key in ((False, "uv"), (True, "uv+pyc")):
                add(f"cold {key}", env_set.uv(base / f"uv-cache-{key}", base / f"venv-{key}", compile_bytecode=flag))
            add("cold harness empty", env_set.realize(base / "home-empty"))
            home = base / "home"
            (home / "store" / ".meta").mkdir(parents=True)
            run(["cp", "-a", str(seed / "store" / python_name), str(home / "store")])
            run(["cp", "-a", str(seed / "store" / ".meta" / f"{python_name}.json"), str(home / "store" / ".meta")])
            if (seed / "store" / ".standins").is_dir():
                run(["cp", "-a", str(seed / "store" / ".standins"), str(home / "store")])
            add("cold harness", env_set.realize(home))
            # warm: caches kept, the environment deleted
            for key in ("uv", "uv+pyc"):
                shutil.rmtree(base / f"venv-{key}")
                add(
                    f"warm {key}",
                    env_set.uv(base / f"uv-cache-{key}", base / f"venv-{key}", compile_bytecode=key == "uv+pyc"),
                )
            Store.in_home(home).delete(realized_environment(env_set.project, home, env_set.name))
            add("warm harness", env_set.realize(home))
            remove_tree(base)
        for mode, key in (
            ("cold, empty home", "cold harness empty"),
            ("cold, interpreter in", "cold harness"),
            ("warm", "warm harness"),
        ):
            phase = mode.split(",")[0]
            uv, uvpyc, ours = (median(samples[f"{phase} uv"]), median(samples[f"{phase} uv+pyc"]), median(samples[key]))
            print(
                f"{env_set.name:<11} {mode:<22} {uv:7.2f} {uvpyc:7.2f} {ours:8.2f} {ours / uv:6.2f} {ours / uvpyc:8.2f}"
            )
            results.append((f"(a) {env_set.name} {mode}", ours / uv, "<= 1.2"))
    remove_tree(seed)
    return results


def bench_disk(project: Path, harness: list[str], scratch: Path) -> list[tuple[str, float, str]]:
    home = scratch / "disk-home"
    store = home / "store"
    realize = [*harness, "--project", str(project), "--home", str(home), "realize"]
    run([*realize, "medium"])
    one, one_all = du(store), du(store, home / "cache")
    run([*realize, "medium-twin"])
    two, two_all = du(store), du(store, home / "cache")
    twin_env = store / lock_of(project, "medium-twin")["environment"]["store"]
    own = du(twin_env)
    growth = (two - one) / one
    print("\n(b) a second environment with the same wheels (du, hard links once)")
    print(
        f"store: {one / 2**20:.1f} MiB -> {two / 2**20:.1f} MiB (+{growth:.1%}); "
        f"store+cache: {one_all / 2**20:.1f} -> {two_all / 2**20:.1f} MiB; "
        f"the twin environment alone: {own / 2**20:.1f} MiB"
    )
    remove_tree(home)
    return [("(b) second environment, store disk growth", growth, "<= 0.05")]


# ------------------------------------------------------------------------------------- (f)


def realized_interpreter(project: Path, home: Path, name: str) -> str:
    """The interpreter store path ``name``'s environment is built on in ``home`` (a host copy
    standing in for the lock's has a name of its own)."""
    from harness.lock.lockfile import read
    from harness.realize.standin import realized_lock

    return realized_lock(Store.in_home(home), read(project / "locks" / f"{name}.lock.toml")).python.store


def realized_environment(project: Path, home: Path, name: str) -> str:
    """The environment store path ``name`` realized to in ``home`` (a host interpreter copy
    standing in for the lock's gives it a path of its own)."""
    from harness.lock.lockfile import read
    from harness.realize.standin import realized_lock

    return realized_lock(Store.in_home(home), read(project / "locks" / f"{name}.lock.toml")).environment.store


def profile_phases(argv: list[str], out: Path) -> dict[str, float]:
    """Run ``harness ARGV`` under cProfile; seconds per phase (:data:`PHASES`), wall clock."""
    import pstats

    run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "harness", *argv], cwd=ROOT)
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    totals = dict.fromkeys((label for label, _, _ in PHASES), 0.0)
    for (filename, _, func), (_, _, _, cumulative, _) in stats.items():
        for label, module, name in PHASES:
            if func == name and filename.endswith(f"harness/{module}"):
                totals[label] += cumulative
    return totals


def bench_vlm(harness: list[str], scratch: Path, runs: int) -> list[tuple[str, float, str]]:
    project = make_project(scratch / "vlm-project", {"vlm": VLM, "vlm-twin": VLM})
    run([*harness, "--project", str(project), "--home", str(scratch / "vlm-lock-home"), "lock"])
    env_set = EnvSet("vlm", project, scratch, harness)
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    # Second environment, warm: a home holding the first environment; uv's cache warm.
    home, uv_cache = scratch / "vlm-home", scratch / "vlm-uv-cache"
    run([*harness, "--project", str(project), "--home", str(home), "realize", "vlm", "vlm-twin"])
    twin = realized_environment(project, home, "vlm-twin")
    env_set.uv(uv_cache, scratch / "vlm-venv-first", compile_bytecode=True)
    realize_twin = [*harness, "--project", str(project), "--home", str(home), "realize", "vlm-twin"]
    packages = len(lock_of(project, "vlm")["packages"])
    for attempt in range(runs):
        add("second uv", env_set.uv(uv_cache, scratch / f"vlm-venv-{attempt}", compile_bytecode=True))
        remove_tree(scratch / f"vlm-venv-{attempt}")
        Store.in_home(home).delete(twin)
        add("second harness", timed(realize_twin))
    Store.in_home(home).delete(twin)
    warm_phases = profile_phases(
        ["--project", str(project), "--home", str(home), "realize", "vlm-twin"], scratch / "vlm-warm.prof"
    )
    # Empty home / empty cache.
    for attempt in range(runs):
        base = scratch / f"vlm-empty-{attempt}"
        add("empty uv", env_set.uv(base / "uv-cache", base / "venv", compile_bytecode=True))
        add("empty harness", env_set.realize(base / "home"))
        remove_tree(base)
    base = scratch / "vlm-empty-profile"
    empty_phases = profile_phases(
        ["--project", str(project), "--home", str(base / "home"), "realize", "vlm"], scratch / "vlm-empty.prof"
    )
    remove_tree(base)
    remove_tree(home)

    print(f"\n(f) VLM-like set ({packages} packages: {', '.join(VLM)}), median of {runs} s")
    print(f"{'case':<44} {'uv+pyc':>7} {'harness':>8} {'h/uv':>6}")
    results = []
    for label, key, goal in (
        ("second environment, caches warm", "second", "<= 1.0"),
        ("empty home vs empty uv cache", "empty", "<= 2.0"),
    ):
        uv, ours = median(samples[f"{key} uv"]), median(samples[f"{key} harness"])
        print(
            f"{label:<44} {uv:7.2f} {ours:8.2f} {ours / uv:6.2f}   "
            f"(harness {', '.join(f'{v:.2f}' for v in samples[f'{key} harness'])}; "
            f"uv {', '.join(f'{v:.2f}' for v in samples[f'{key} uv'])})"
        )
        results.append((f"(f) vlm {label}", ours / uv, goal))
    print("\nwhere a realize's time goes (one run under cProfile; wall s, cumulative, phases overlap)")
    print(f"{'phase':<36} {'second env, warm':>17} {'empty home':>11}")
    for label, _, _ in PHASES:
        print(f"{label:<36} {warm_phases[label]:17.2f} {empty_phases[label]:11.2f}")
    return results


# ------------------------------------------------------------------------------------- (c)


def bench_noop(harness: list[str], scratch: Path, runs: int) -> list[tuple[str, float, str]]:
    examples = sorted(p.name[: -len(".lock.toml")] for p in (ROOT / "locks").glob("*.lock.toml"))
    home = scratch / "noop-home"
    argv = [*harness, "--project", str(ROOT), "--home", str(home), "realize", *examples]
    run(argv)
    time.sleep(2.1)  # inputs touched in the last 2 s get no stamp (racy stat): let them age
    run(argv)
    baseline = median([timed([sys.executable, "-c", "pass"]) for _ in range(runs)])
    stamped, full = [], []
    for _ in range(runs):
        stamped.append(timed(argv))
        shutil.rmtree(home / "cache" / "up-to-date")
        full.append(timed(argv))
        run(argv)  # the stamp back
    print(f"\n(c) no-op realize of {', '.join(examples)} (median of {runs}; python -c pass {baseline:.3f} s)")
    print(f"with its stamp: {median(stamped):.3f} s; full decision (no stamp): {median(full):.3f} s")
    remove_tree(home)
    return [
        ("(c) no-op realize, s", median(stamped), "< 0.5"),
        ("(c) no-op realize without the stamp, s", median(full), "< 0.5"),
    ]


# ------------------------------------------------------------------------------ (d) and (e)


def make_weights(scratch: Path, gib: float) -> tuple[Store, str, list[Path], list[tuple[str, int]]]:
    source = scratch / "weights-src"
    source.mkdir()
    count = 4
    size = int(gib * 2**30) // count
    files, pins = [], []
    for i in range(count):
        path = source / f"model-{i:05d}-of-{count:05d}.safetensors"
        digest = hashlib.sha256()
        with open(path, "wb") as handle:
            left = size
            while left:
                chunk = os.urandom(min(left, 1 << 24))
                handle.write(chunk)
                digest.update(chunk)
                left -= len(chunk)
        files.append(path)
        pins.append((digest.hexdigest(), size))
    store = Store(scratch / "verify-home" / "store")
    inputs = {"files": [{"path": p.name, "sha256": s, "size": n} for p, (s, n) in zip(files, pins, strict=True)]}
    name = store_path_name(store_hash("weights", "bench-weights", inputs), "bench-weights")

    def build(out: Path) -> BuildResult:
        out.mkdir()
        for path in files:
            os.link(path, out / path.name)
        return BuildResult(obtained="bench")

    store.add(name, "weights", build)
    return store, name, [store.path(name) / p.name for p in files], pins


def bench_verify(
    harness: list[str], store: Store, name: str, files: list[Path], runs: int, installed: Path
) -> list[tuple[str, float, str]]:
    """``installed``: the ``harness`` of a regular install (benchproject.regular_install), as
    users run it; ``harness``: this checkout's (the editable install of scripts/bootstrap.sh)."""
    total = sum(p.stat().st_size for p in files)
    args = ["--home", str(store.root.parent), "store", "verify", "--check-contents", name]
    argv = [str(installed), *args]
    tools = {
        "harness verify": argv,
        "... editable install": [*harness, *args],
    }
    for tool in ("b3sum", "sha256sum"):
        if shutil.which(tool):
            tools[tool] = [tool, *map(str, files)]
        else:
            print(f"(d) {tool} is not installed: that comparison is skipped")
    for path in files:  # page cache warm for everyone
        with open(path, "rb") as handle:
            while handle.read(1 << 24):
                pass
    # An installed harness has its bytecode; PYTHONDONTWRITEBYTECODE (set in some shells) would
    # make every timed run compile the CLI's modules again, so a warm-up run writes them.
    env = {k: v for k, v in _env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    run(argv, env=env)
    run([*harness, *args], env=env)
    # A path changed less than 2 s ago is not hashed early (its fingerprint could hide a second
    # change in the same clock tick): wait that out, as for any path registered a while ago.
    time.sleep(max(0.0, 2.1 - (time.time() - max(p.stat().st_ctime for p in files))))
    samples: dict[str, list[float]] = {key: [] for key in tools}
    samples["harness, hashing only"] = []  # in this process: verify without the CLI's start-up
    cpu: dict[str, list[float]] = {key: [] for key in tools}
    from harness.store.verify import verify_store

    for round_ in range(runs):
        # Every other round in reverse: whatever a command leaves behind (a hot core after
        # sha256sum's six seconds, the page cache's state) falls on each tool alike.
        order = list(tools.items())
        for key, command in order if round_ % 2 == 0 else reversed(order):
            before = cpu_of_children()
            samples[key].append(timed(command, env=env))
            cpu[key].append(cpu_of_children() - before)
        start = time.perf_counter()
        assert verify_store(store, check_contents=True, names=[name])[0].status == "ok"
        samples["harness, hashing only"].append(time.perf_counter() - start)
    print(
        f"\n(d) verify {total / 2**30:.2f} GiB ({len(files)} files), page cache warm (median s, GB/s, CPU s); "
        f"load {os.getloadavg()[0]:.1f}"
    )
    ours = median(samples["harness verify"])
    results = []
    hashing = median(samples["harness, hashing only"])
    for key, values in samples.items():
        t = median(values)
        used = f"{median(cpu[key]):7.3f} CPU s" if key in cpu else ""
        print(f"{key:<22} {t:7.3f} s {total / t / 1e9:6.2f} GB/s {used}  {[round(v, 3) for v in values]}")
        if key in ("b3sum", "sha256sum"):
            results.append((f"(d) verify throughput vs {key}", t / ours, ">= 0.8"))
            if key == "b3sum":
                results.append(
                    (f"(d) ... editable install vs {key}", t / median(samples["... editable install"]), ">= 0.8")
                )
            results.append((f"(d) ... hashing only (no start-up) vs {key}", t / hashing, ">= 0.8"))
    return results


def bench_download(
    harness: list[str], files: list[Path], pins: list[tuple[str, int]], scratch: Path, runs: int
) -> list[tuple[str, float, str]]:
    if not shutil.which("curl"):
        print("\n(e) curl is not installed: the download comparison is skipped")
        return []
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(files[0].parent)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        dest = scratch / "downloads"
        total = sum(size for _, size in pins)
        jobs = [[f"{base}/{p.name}", str(dest / p.name), sha, size] for p, (sha, size) in zip(files, pins, strict=True)]
        ours: list[str] = [sys.executable, "-c", DOWNLOADER, json.dumps(jobs)]
        curl = ["curl", "-sS", "--fail"] + [str(a) for j in jobs for a in ("-o", j[1], j[0])]
        commands: dict[str, list[list[str]]] = {
            "harness download": [[*ours, "1"]],
            "harness, 4 in parallel": [[*ours, "4"]],
            "curl": [curl],
            "curl + sha256sum": [curl, ["sha256sum", *(str(j[1]) for j in jobs)]],
        }
        samples: dict[str, list[float]] = {key: [] for key in commands}
        cpu: dict[str, list[float]] = {key: [] for key in commands}
        for _ in range(runs):
            for key, steps in commands.items():
                dest.mkdir()
                before = cpu_of_children()
                start = time.perf_counter()
                for argv in steps:
                    run(argv, cwd=ROOT)
                samples[key].append(time.perf_counter() - start)
                cpu[key].append(cpu_of_children() - before)
                shutil.rmtree(dest)
    finally:
        server.terminate()
        server.wait()
    print(
        f"\n(e) download {total / 2**30:.2f} GiB from 127.0.0.1 (median s, GB/s, CPU s of the client; "
        f"the server's is not counted); load {os.getloadavg()[0]:.1f}"
    )
    for key, values in samples.items():
        t = median(values)
        print(
            f"{key:<22} {t:7.3f} s {total / t / 1e9:6.2f} GB/s {median(cpu[key]):7.3f} CPU s  "
            f"{[round(v, 3) for v in values]}"
        )
    ours_t = median(samples["harness download"])
    return [
        ("(e) download throughput vs curl", median(samples["curl"]) / ours_t, ">= 0.8"),
        (
            "(e) ... 4 files in parallel vs curl",
            median(samples["curl"]) / median(samples["harness, 4 in parallel"]),
            ">= 0.8",
        ),
        ("(e) download throughput vs curl + sha256sum", median(samples["curl + sha256sum"]) / ours_t, ">= 0.8"),
    ]


# ------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gib", type=float, default=1.0, help="size of the synthetic weight set")
    parser.add_argument("--offline-only", action="store_true", help="only (d) and (e): no registry")
    parser.add_argument("--only-vlm", action="store_true", help="only (f), the VLM-like set of issue 17")
    parser.add_argument(
        "--keep-wheel-files",
        action="store_true",
        help="harness with `[gc] keep-wheel-files = true` (each package file stored first and kept)",
    )
    parser.add_argument("--only-verify", action="store_true", help="only (d): no registry, no download")
    args = parser.parse_args()
    KEEP_WHEEL_FILES["HARNESS_GC_KEEP_WHEEL_FILES"] = "1" if args.keep_wheel_files else "0"
    harness = harness_command()
    import harness as package

    print(
        f"date {datetime.date.today()}; machine {platform.machine()}, nproc {os.cpu_count()}, "
        f"{platform.system()} {platform.release()}; CPython {platform.python_version()}; "
        f"harness {package.__version__}; {version([uv_bin(), '--version'])}; "
        f"{version(['b3sum', '--version']) or 'no b3sum'}; {version(['sha256sum', '--version']) or 'no sha256sum'}; "
        f"{(version(['curl', '--version']) or 'no curl').split(' (')[0]}; {args.runs} runs"
    )
    results: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="harness-bench-realize-") as tmp:
        scratch = Path(tmp)
        try:
            if args.only_vlm:
                results += bench_vlm(harness, scratch, args.runs)
            elif not (args.offline_only or args.only_verify):
                results += bench_vlm(harness, scratch, args.runs)
                medium = make_project(scratch / "medium-project", {"medium": MEDIUM, "medium-twin": MEDIUM})
                run([*harness, "--project", str(medium), "--home", str(scratch / "lock-home"), "lock"])
                sets = [EnvSet("kinematics", ROOT, scratch, harness), EnvSet("medium", medium, scratch, harness)]
                results += bench_environments(sets, args.runs, scratch)
                results += bench_disk(medium, harness, scratch)
                results += bench_noop(harness, scratch, max(args.runs, 7))
            if not args.only_vlm:
                store, name, files, pins = make_weights(scratch, args.gib)
                installed = regular_install(scratch / "regular-install")
                results += bench_verify(harness, store, name, files, args.runs, installed)
                if not args.only_verify:
                    results += bench_download(harness, files, pins, scratch, args.runs)
        finally:
            for child in scratch.iterdir():
                remove_tree(child)
    _summary(results)


def _summary(results: list[tuple[str, float, str]]) -> None:
    print("\nsummary")
    for label, value, goal in results:
        bound = float(goal.split()[1])
        ok = value <= bound if goal.startswith("<=") else value < bound if goal.startswith("<") else value >= bound
        print(f"  {label:<48} {value:7.3f}  [{goal}]  {verdict(ok)}")


if __name__ == "__main__":
    main()
