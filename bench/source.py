"""Realizing one git source: export, hash, register (``harness realize``'s source path).

Makes a ``file://`` git repository of ``--files`` files (mostly small text files, like a
model's code, plus a few binaries: ``--mb`` MB in all), locks it (:func:`lock_source`, which
gives the lock's tree hash), then times, ``--runs`` times each into a fresh store with the
git mirror warm:

* ``stage+commit``: what realize does per source (:func:`_stage_source`, then
  :meth:`Store.commit`): export the commit's files into the store's scratch, check them
  against the tree hash, register them;
* ``nar_digest``: one content hash of the registered tree (page cache warm): what each pass
  over every byte costs, so ``stage+commit`` shows how many of them realize makes.

Each also as this process's CPU time (``cpu``: hashing threads and file writes, not git's
own processes), which a busy machine disturbs less than the wall clock.

``--part export`` times the export alone, interleaved with its anchor, and prints the ratio:

* ``export_source``: the commit's files into a new folder (``check_tree=False``, offline,
  from the warm mirror), as realize's builder calls it;
* ``git archive | tar -x``: the anchor, ``git archive COMMIT`` from the same mirror piped
  into ``tar -x -C DIR``, a plain way to write a commit's files;
* ``lock``: what ``harness lock`` does per installed source: pin, export, hash, and keep the
  files for reading its build requirements (``lock_source(keep=…)``; on code without
  ``keep``, ``lock_source`` then ``export_source`` as the lock did).

    python bench/source.py [--part all|realize|export] [--files 4000] [--mb 40] [--runs 7]
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.config import Settings  # noqa: E402
from harness.progress import QUIET  # noqa: E402
from harness.realize.builder import Context, _stage_source  # noqa: E402
from harness.resolve.git import export_source, lock_source, mirror_path  # noqa: E402
from harness.resolve.pins import GitSource  # noqa: E402
from harness.store.hashing import nar_digest, store_hash, store_path_name  # noqa: E402
from harness.manifests.model import Source  # noqa: E402
from harness.store.store import Store, remove_tree  # noqa: E402

IDENTITY = {
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}


def make_repo(repo: Path, files: int, mb: float) -> None:
    """``files`` files: all but 8 small (≈ 2 KB of text), the 8 others share the rest of ``mb``."""
    small = files - 8
    text = b"".join(b"def f%d(x):\n    return x * %d\n" % (i, i) for i in range(70))
    big = max(0, int(mb * 1e6) - small * len(text)) // 8
    for i in range(small):
        folder = repo / "src" / f"pkg{i // 40:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i % 40:02d}.py").write_bytes(b"# %d\n" % i + text)
    (repo / "assets").mkdir()
    for i in range(8):
        (repo / "assets" / f"blob{i}.bin").write_bytes(os.urandom(big))
    env = {**os.environ, **IDENTITY}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "bench"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=env)


def anchor_export(mirror: Path, commit: str, dest: Path) -> None:
    """``git archive COMMIT | tar -x -C DEST``: the plain way to write a commit's files."""
    dest.mkdir()
    archive = subprocess.Popen(["git", f"--git-dir={mirror}", "archive", commit], stdout=subprocess.PIPE)
    assert archive.stdout is not None
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise RuntimeError("git archive failed")


def lock_and_keep(source: Source, cache: Path, dest: Path) -> GitSource:
    """``harness lock``'s per-source work: pin and hash, the files left at ``dest``."""
    if "keep" in inspect.signature(lock_source).parameters:
        return lock_source(source, cache, offline=True, keep=dest)
    pin = lock_source(source, cache, offline=True)  # code before keep: export a second time
    export_source(pin, cache, dest, offline=True)
    return pin


def export_part(work: Path, cache: Path, pin: GitSource, runs: int, files: int) -> None:
    """Time export_source, its anchor and the lock's per-source work, interleaved."""
    mirror = mirror_path(cache, pin.repo)
    source = Source(repo=pin.repo, rev="main")
    times: dict[str, list[float]] = {"export_source": [], "git archive | tar -x": [], "lock": []}
    for run in range(runs):
        for label, action in (
            ("export_source", lambda d: export_source(pin, cache, d, offline=True, check_tree=False)),
            ("git archive | tar -x", lambda d: anchor_export(mirror, pin.commit, d)),
            ("lock", lambda d: lock_and_keep(source, cache, d)),
        ):
            dest = work / f"export-{run}-{len(times[label])}-{label.split()[0]}"
            start = time.perf_counter()
            result = action(dest)
            times[label].append(time.perf_counter() - start)
            if label == "lock":
                assert result == pin, "the lock's pin changed"
            remove_tree(dest)
    median = {label: statistics.median(values) for label, values in times.items()}
    print(f"export of {files} files, {runs} runs, median:")
    for label, value in median.items():
        ratio = value / median["git archive | tar -x"]
        print(f"  {label:22s} {value * 1000:8.1f} ms   (min {min(times[label]) * 1000:.1f})   {ratio:5.2f}x anchor")


def realize_part(work: Path, cache: Path, pin: GitSource, runs: int, files: int) -> None:
    """Time realize's per-source work (stage+commit) and one content hash of its result."""
    name = store_path_name(store_hash("source", "bench", {"tree": pin.tree}), "bench")
    source = SimpleNamespace(**{f: getattr(pin, f) for f in GitSource.__dataclass_fields__}, store=name)
    times: dict[str, list[float]] = {
        label: [] for label in ("stage+commit", "stage+commit cpu", "nar_digest", "nar_digest cpu")
    }
    size = 0
    for run in range(runs):
        store = Store(work / f"store{run}")
        ctx = Context(store=store, project_root=work, settings=Settings(), cache_dir=cache, show_progress=False)
        start, cpu = time.perf_counter(), time.process_time()
        staged = _stage_source(ctx, source, QUIET)
        store.commit(staged, name, expected_content=pin.tree)
        times["stage+commit"].append(time.perf_counter() - start)
        times["stage+commit cpu"].append(time.process_time() - cpu)
        assert store.is_registered(name)
        start, cpu = time.perf_counter(), time.process_time()
        size = nar_digest(store.path(name)).nar_size
        times["nar_digest"].append(time.perf_counter() - start)
        times["nar_digest cpu"].append(time.process_time() - cpu)
        remove_tree(store.root)
    print(f"{files} files, NAR {size / 1e6:.1f} MB, {runs} runs, median:")
    for label, values in times.items():
        print(f"  {label:18s} {statistics.median(values) * 1000:8.1f} ms   (min {min(values) * 1000:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "realize", "export"), default="all")
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--mb", type=float, default=40)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-source-") as temp:
        work = Path(temp)
        repo = work / "repo"
        repo.mkdir()
        make_repo(repo, args.files, args.mb)
        cache = work / "cache"
        pin = lock_source(Source(repo=repo.as_uri(), rev="main"), cache)
        if args.part in ("all", "realize"):
            realize_part(work, cache, pin, args.runs, args.files)
        if args.part in ("all", "export"):
            export_part(work, cache, pin, args.runs, args.files)


if __name__ == "__main__":
    main()
