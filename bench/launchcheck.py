"""The launch check (issue 14, item 5) on a 10 GB closure, beside a plain stat walk.

Builds a store holding a closure the size of a real service's: a weight set of ``--files``
sparse files totalling ``--size-gb`` GB (sparse, so the bench needs no disk; the store reads
and hashes every byte of them all the same) and an environment-like tree of ``--small``
small files, which references the interpreter-like path. Then times, interleaved:

* ``check (stat)``: :func:`harness.store.launchcheck.check_closure` with the fingerprints
  written at registration: what every launch costs when nothing changed. Goal: under 0.5 s.
* ``find -printf``: GNU find printing inode, size, ctime and mtime of every entry of the same
  paths (``> /dev/null``): the anchor, a plain stat walk in C.
* ``check (re-hash)`` once, with the fingerprints removed: what a launch costs after a
  mismatch (or a store without fingerprints), i.e. ``store verify --check-contents`` of the
  closure.

    python bench/launchcheck.py [--size-gb 10] [--files 10] [--small 20000] [--runs 11]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.store.launchcheck import check_closure  # noqa: E402
from harness.store.statfile import fingerprint_path  # noqa: E402
from harness.store.store import Store  # noqa: E402


def build_store(root: Path, size_gb: float, files: int, small: int) -> list[str]:
    store = Store(root)
    each = int(size_gb * 1e9) // files

    def weights(out: Path) -> None:
        out.mkdir()
        for i in range(files):
            with open(out / f"model-{i:05d}.safetensors", "wb") as handle:
                handle.truncate(each)

    def python(out: Path) -> None:
        (out / "bin").mkdir(parents=True)
        (out / "bin" / "python3").write_bytes(b"\x7fELF" + b"\0" * 4096)

    def environment(out: Path) -> None:
        out.mkdir()
        (out / "pyvenv.cfg").write_text("home = ../python/bin\n")
        per_dir = 50
        for i in range(small):
            folder = out / "lib" / "site-packages" / f"pkg{i // per_dir:04d}"
            if i % per_dir == 0:
                folder.mkdir(parents=True)
            (folder / f"mod{i % per_dir:02d}.py").write_bytes(b"# module %d\n" % i + b"x" * 900)

    started = time.perf_counter()
    w = store.add("w" * 32 + "-weights", "weights", weights)
    p = store.add("p" * 32 + "-python", "python", python)
    e = store.add("e" * 32 + "-env", "source", environment, references=(p.name,))
    print(
        f"registered the closure in {time.perf_counter() - started:.1f} s "
        f"({size_gb:g} GB in {files} files, {small} small files)",
        flush=True,
    )
    return [e.name, w.name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=10.0)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--small", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-launchcheck-") as temp:
        root = Path(temp) / "store"
        roots = build_store(root, args.size_gb, args.files, args.small)
        closure = [str(root / name) for name in ["p" * 32 + "-python", *roots]]
        check_closure(root, roots)  # warm the dentry and inode caches, as a second launch finds them
        times: dict[str, list[float]] = {"check (stat)": [], "find -printf": []}
        for _ in range(args.runs):
            started = time.perf_counter()
            checks = check_closure(root, roots)
            times["check (stat)"].append(time.perf_counter() - started)
            assert all(c.verified == "stat" for c in checks), checks
            started = time.perf_counter()
            subprocess.run(["find", *closure, "-printf", "%i %s %C@ %T@ %p\n"], stdout=subprocess.DEVNULL, check=True)
            times["find -printf"].append(time.perf_counter() - started)
        for name in roots + ["p" * 32 + "-python"]:
            fingerprint_path(root, name).unlink()
        started = time.perf_counter()
        checks = check_closure(root, roots)
        rehash = time.perf_counter() - started
        assert all(c.verified == "hash" for c in checks)
    anchor = statistics.median(times["find -printf"])
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )
    print(f"{'what':<18} {'median s':>9} {'p90 s':>7} {'× find':>7}")
    for what, values in times.items():
        values.sort()
        p90 = values[min(len(values) - 1, int(len(values) * 0.9))]
        print(f"{what:<18} {statistics.median(values):>9.3f} {p90:>7.3f} {statistics.median(values) / anchor:>7.2f}")
    print(f"{'check (re-hash)':<18} {rehash:>9.3f} {'':>7} {rehash / anchor:>7.2f}  (once, fingerprints removed)")


if __name__ == "__main__":
    main()
