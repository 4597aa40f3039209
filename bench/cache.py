"""Binary cache: pull of a ~500 MB closure vs ``cp -r``, and push of an unchanged closure.

A synthetic closure is registered in home A: wheel-like files and weight sets of random
bytes (incompressible, like real wheels and weights), plus an environment of a few thousand
small files. It is pushed to a directory cache once; then, interleaved, for ``--runs`` runs:

* **pull**: an empty home B pulls the closure from the cache with every check on (archive
  blake3, NAR content hash re-computed by the store, each wheel's and weight file's sha256
  against the lock's, the environment's signature);
* **cp -r**: the same store paths copied with ``cp -r`` into an empty folder;
* **cp -r + sha256sum**: the same, then ``sha256sum`` of every copied file (what checking a
  plain copy against a lock costs);
* **push (unchanged)**: ``harness store push`` of the whole closure again, as a process
  (start-up included) and as a call.

Each measurement starts after ``sync`` (no dirty pages left by the previous one), the first
round is a warm-up, and the table shows medians of the other ``--runs`` rounds.

Goals (issue 7): pull at most 1.5x ``cp -r``; unchanged push under 1 s. Everything lives in
one temporary folder (``--tmp``, default /tmp), removed at the end.

    python bench/cache.py [--size-mb 500] [--runs 3] [--jobs 8]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.cache.backends import open_backend  # noqa: E402
from harness.cache.signing import generate, parse_trusted, render_secret  # noqa: E402
from harness.cache.transfer import ExpectedContent, open_substituters, pull, push  # noqa: E402
from harness.store.hashing import store_hash, store_path_name  # noqa: E402
from harness.store.store import BuildResult, Store, remove_tree  # noqa: E402

MB = 1 << 20


def _name(kind: str, name: str, inputs: dict) -> str:
    return store_path_name(store_hash(kind, name, inputs), name)


def _random_file(path: Path, size: int) -> str:
    """Write ``size`` random bytes; return their sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        left = size
        while left:
            chunk = os.urandom(min(left, 8 * MB))
            out.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def populate(store: Store, size_mb: int) -> tuple[list[str], dict[str, ExpectedContent]]:
    """Register ~``size_mb`` MB: 40% wheels, 60% weights, and a 3000-file environment."""
    names: list[str] = []
    expected: dict[str, ExpectedContent] = {}
    wheel_total = int(size_mb * 0.4 * MB)
    wheel_sizes = [wheel_total * share // 100 for share in (40, 25, 15, 10, 5, 5)]
    for i, size in enumerate(wheel_sizes):
        file = f"pkg{i}-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
        name = _name("file", file, {"i": i})
        sha: dict[str, str] = {}

        def build_wheel(out: Path, file: str = file, size: int = size, sha: dict[str, str] = sha) -> BuildResult:
            out.mkdir()
            sha[file] = _random_file(out / file, size)
            return BuildResult(obtained="bench")

        store.add(name, "file", build_wheel)
        names.append(name)
        expected[name] = ExpectedContent("file", files=dict(sha))
    weight_total = int(size_mb * 0.6 * MB)
    for j, shares in enumerate(((50, 25), (15, 10))):
        name = _name("weights", f"model{j}", {"j": j})
        sha = {}

        def build_weights(out: Path, shares: tuple[int, ...] = shares, sha: dict[str, str] = sha) -> BuildResult:
            out.mkdir()
            for k, share in enumerate(shares):
                sha[f"model-{k:05d}.safetensors"] = _random_file(
                    out / f"model-{k:05d}.safetensors", weight_total * share // 100
                )
            (out / "config.json").write_text('{"hidden": 1024}\n')
            sha["config.json"] = hashlib.sha256(b'{"hidden": 1024}\n').hexdigest()
            return BuildResult(obtained="bench")

        store.add(name, "weights", build_weights)
        names.append(name)
        expected[name] = ExpectedContent("weights", files=dict(sha))
    env = _name("environment", "bench-env", {})

    def build_env(out: Path) -> BuildResult:
        for p in range(100):
            package = out / "lib" / "python3.11" / "site-packages" / f"package{p}"
            package.mkdir(parents=True)
            for m in range(30):
                (package / f"module{m}.py").write_bytes(os.urandom(600).hex().encode())
        return BuildResult(obtained="bench")

    store.add(env, "environment", build_env)
    names.append(env)
    return names, expected


def _time(fn) -> float:  # type: ignore[no-untyped-def]
    # Start every measurement with no dirty pages: writeback of an earlier step's 500 MB
    # would otherwise land on whichever step comes next (observed: 2-3x swings).
    os.sync()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--tmp", default="/tmp")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="harness-bench-cache-", dir=args.tmp))
    try:
        run(work, args)
    finally:
        for folder in work.glob("**/store"):
            remove_tree(folder)
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, args: argparse.Namespace) -> None:
    key = generate("bench-1")
    (work / "bench-1.secret").write_text(render_secret(key) + "\n")
    home_a = work / "a"
    a = Store.in_home(home_a)
    print(f"populating {args.size_mb} MB ...", flush=True)
    names, expected = populate(a, args.size_mb)
    total = sum(a.record(n).nar_size for n in names)  # type: ignore[union-attr]
    files = sum(len(fs) for n in names for _, _, fs in os.walk(a.root / n))
    cache = work / "cache"
    first_push = _time(
        lambda: push(a, names, open_backend(str(cache)), secret=key, cache_dir=home_a / "cache", jobs=args.jobs)
    )
    trusted = parse_trusted([key.public().render()])
    times: dict[str, list[float]] = {
        "pull (all checks)": [],
        "cp -r": [],
        "cp -r + sha256sum": [],
        "push unchanged (process)": [],
        "push unchanged (in-process)": [],
    }
    harness = [sys.executable, "-m", "harness"]
    # Run 0 is a warm-up (page cache, imports, first writeback), not counted.
    for r in range(args.runs + 1):
        home_b = work / f"b{r}"
        b = Store.in_home(home_b)

        def do_pull(b: Store = b, home_b: Path = home_b) -> None:
            subs, _ = open_substituters([str(cache)])
            result = pull(
                b, names, subs, trusted=trusted, expected=expected, cache_dir=home_b / "cache", jobs=args.jobs
            )
            assert not result.failed and len(result.registered) == len(names), result.failed

        times["pull (all checks)"].append(_time(do_pull))
        remove_tree(b.root)

        dest = work / f"cp{r}"
        sources = [str(a.root / n) for n in names]

        def do_cp(dest: Path = dest, sources: list[str] = sources) -> None:
            dest.mkdir()
            subprocess.run(["cp", "-r", *sources, str(dest)], check=True)

        times["cp -r"].append(_time(do_cp))
        remove_tree(dest)

        def do_cp_check(dest: Path = dest, sources: list[str] = sources) -> None:
            dest.mkdir()
            subprocess.run(["cp", "-r", *sources, str(dest)], check=True)
            listed = [str(p) for p in dest.rglob("*") if p.is_file() and not p.is_symlink()]
            subprocess.run(
                ["xargs", "-0", "sha256sum"], input="\0".join(listed).encode(), check=True, stdout=subprocess.DEVNULL
            )

        times["cp -r + sha256sum"].append(_time(do_cp_check))
        remove_tree(dest)

        argv = [
            *harness,
            "--home",
            str(home_a),
            "store",
            "push",
            str(cache),
            *names,
            "--key",
            str(work / "bench-1.secret"),
        ]
        times["push unchanged (process)"].append(
            _time(lambda argv=argv: subprocess.run(argv, check=True, cwd=work, stdout=subprocess.DEVNULL))
        )
        times["push unchanged (in-process)"].append(
            _time(
                lambda: push(a, names, open_backend(str(cache)), secret=key, cache_dir=home_a / "cache", jobs=args.jobs)
            )
        )

    times = {label: samples[1:] for label, samples in times.items()}
    cp = statistics.median(times["cp -r"])
    print(
        f"\nmachine: nproc {os.cpu_count()}, {platform.machine()}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; {time.strftime('%Y-%m-%d')}"
    )
    print(
        f"closure: {len(names)} paths, {total / MB:.0f} MiB NAR, {files} files; runs {args.runs}; "
        f"first push {first_push:.2f} s"
    )
    print("\n| operation | median s | min–max s | × cp -r |\n|---|---|---|---|")
    for label, samples in times.items():
        median = statistics.median(samples)
        print(f"| {label} | {median:.3f} | {min(samples):.3f}–{max(samples):.3f} | {median / cp:.2f} |")


if __name__ == "__main__":
    main()
