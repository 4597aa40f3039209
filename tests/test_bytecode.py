"""Bytecode: parallel compiles are bit-reproducible, and pycs are reused from the store safely.

The compiled sources are real code: modules of the standard library of the interpreter
running the tests, copied into trees (or wheels) of their own. The last test is issue 17's
reproducibility goal end to end: one environment realized in two independent homes, with
different numbers of workers, one home reusing the pycs of an earlier environment that shares
a package and the other compiling everything, gives the same store paths and content hashes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.lock.lockfile import read
from harness.realize.bytecode import CompileReport, ReuseFrom, compile_tree, cpu_count, fresh_entries, pyc_name
from harness.realize.standin import realized_lock
from harness.store.bytecode import BytecodeIndex, entry_key, prune
from harness.store.gc import collect, pin
from harness.store.hashing import file_blake3
from harness.store.store import BuildResult, Store
from tests.conftest import run_harness_process
from tests.upstreams import Upstreams, make_project, service

PYTHON = Path(sys.executable)
TAG = sys.implementation.cache_tag
STDLIB = Path(sysconfig.get_path("stdlib"))
#: Varied real code: string and frozenset constants, one-character strings, nested code,
#: f-strings, big integers, classes; and a file that does not compile.
MODULES = [
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "json/scanner.py",
    "textwrap.py",
    "string.py",
    "fractions.py",
    "shlex.py",
    "csv.py",
    "ipaddress.py",
    "email/_header_value_parser.py",
    "email/utils.py",
    "email/feedparser.py",
    "tomllib/_parser.py",
    "argparse.py",
    "colorsys.py",
]
BROKEN = "def broken(:\n"


def tree(root: Path, package: str = "pkg") -> Path:
    """``root/lib/<package>/...``: the modules above (plus a broken one), as installed."""
    for rel in MODULES:
        target = root / "lib" / package / rel.replace("/", "_")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STDLIB / rel, target)
    (root / "lib" / package / "sub" / "a").mkdir(parents=True)
    (root / "lib" / package / "sub" / "a" / "b.py").write_text('x = "/"\ny = ("a", "/", "b")\nz = {"a", "b"}\n')
    (root / "lib" / package / "broken.py").write_text(BROKEN)
    return root / "lib"


def pycs(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.pyc"))}


def test_bytes_do_not_depend_on_workers_order_or_location(tmp_path: Path) -> None:
    one, three = tmp_path / "one" / "x", tmp_path / "three" / "elsewhere" / "deeper"
    calls: list[tuple[int, int]] = []
    report = compile_tree(PYTHON, [tree(one)], root=one, jobs=1, progress=lambda d, n: calls.append((d, n)))
    assert report.total == len(MODULES) + 2 and report.compiled == len(MODULES) + 1
    assert report.failed == ["lib/pkg/broken.py"] and report.fresh == []
    assert calls[0] == (0, report.total) and calls[-1] == (report.total, report.total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    compile_tree(PYTHON, [tree(three)], root=three, jobs=3)
    first, second = pycs(one), pycs(three)
    assert len(first) == len(MODULES) + 1 and first == second
    pyc = first[f"lib/pkg/__pycache__/json_decoder.{TAG}.pyc"]
    assert pyc[4:8] == b"\x01\x00\x00\x00"  # unchecked hash-based (PEP 552)
    assert str(one).encode() not in pyc and b"lib/pkg/json_decoder.py" in pyc  # the relative name only
    # A fresh interpreter per file (nothing compiled before it in the process) agrees too.
    for rel in ("lib/pkg/json_decoder.py", "lib/pkg/sub/a/b.py", "lib/pkg/shlex.py"):
        solo = tmp_path / "solo" / rel.replace("/", "-")
        (solo / rel).parent.mkdir(parents=True)
        shutil.copyfile(one / rel, solo / rel)
        compile_tree(PYTHON, [solo / "lib"], root=solo, jobs=1)
        assert (solo / pyc_name(rel, TAG)).read_bytes() == first[pyc_name(rel, TAG)]
    # The environment imports them: python -B would not write, so a stale or unusable pyc
    # would show as a missing module attribute, not silently.
    probe = subprocess.run(
        [str(PYTHON), "-B", "-c", "import pkg.json_decoder as m; print(m.__cached__)"],
        cwd=one / "lib",
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip().endswith(f"json_decoder.{TAG}.pyc")


def env_builder(reuse: ReuseFrom, reports: list[CompileReport]) -> Callable[[Path], BuildResult]:
    """A Store builder that lays out the test tree and compiles it with reuse, as realize does."""

    def build(out: Path) -> BuildResult:
        tree(out)
        reports.append(compile_tree(PYTHON, [out / "lib"], root=out, jobs=2, reuse=reuse))
        return BuildResult(obtained="test")

    return build


def test_reuse_takes_verified_pycs_from_the_pool_and_gc_keeps_the_index_consistent(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    interpreter = "0" * 32 + "-cpython-test"

    def interpreter_build(out: Path) -> BuildResult:
        out.write_text("stands for an interpreter")
        return BuildResult(obtained="test")

    store.add(interpreter, "python", interpreter_build)
    reuse = ReuseFrom(store.root, interpreter)
    reports: list[CompileReport] = []
    first = "1" * 32 + "-first-env"
    digests: dict[str, str] = {}
    store.add(first, "environment", env_builder(reuse, reports), digests=digests)
    assert reports[0].reused == 0 and len(reports[0].fresh) == len(MODULES) + 1
    # Each fresh pyc's digest is the one the seal read it for: its bytes' blake3, as registered.
    entries = fresh_entries(reports[0], digests)
    assert sorted(pyc for _, pyc in entries) == sorted(
        file_blake3(store.root / first / name) for _, name in reports[0].fresh
    )
    assert reuse.index.record(first, entries) == len(MODULES) + 1

    second = "2" * 32 + "-second-env"
    store.add(second, "environment", env_builder(reuse, reports))
    assert reports[1].reused == len(MODULES) + 1 and reports[1].compiled == 0 and reports[1].fresh == []
    assert pycs(store.root / first) == pycs(store.root / second)
    rel = pyc_name("lib/pkg/shlex.py", TAG)
    pooled = os.stat(store.root / ".links" / file_blake3(store.root / first / rel))
    assert os.stat(store.root / second / rel).st_ino == pooled.st_ino  # linked, not copied
    assert store.record(first).content == store.record(second).content  # type: ignore[union-attr]

    # A damaged pool file is never placed; a damaged entry counts as absent. Both compile.
    index = BytecodeIndex(store.root, interpreter)
    source = (store.root / first / "lib/pkg/shlex.py").read_bytes()
    key = entry_key(interpreter, "lib/pkg/shlex.py", file_blake3(store.root / first / "lib/pkg/shlex.py"))
    assert index.lookup(key) == file_blake3(store.root / first / rel) and source
    pool = store.root / ".links" / index.lookup(key)  # type: ignore[operator]
    os.chmod(pool, 0o644)
    good = pool.read_bytes()
    pool.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    key2 = entry_key(interpreter, "lib/pkg/csv.py", file_blake3(store.root / first / "lib/pkg/csv.py"))
    entry = index.folder / first
    os.chmod(entry, 0o644)
    damaged = [
        line[:-1] + ("0" if line[-1] != "0" else "1") if line.startswith(key2) else line
        for line in entry.read_text().splitlines()
    ]
    entry.write_text("\n".join(damaged) + "\n")
    assert BytecodeIndex(store.root, interpreter).lookup(key2) is None
    third = "3" * 32 + "-third-env"
    store.add(third, "environment", env_builder(ReuseFrom(store.root, interpreter), reports))
    assert reports[2].reused == len(MODULES) - 1 and reports[2].compiled == 2
    assert (store.root / third / rel).read_bytes() == good
    assert store.record(third).content == store.record(first).content  # type: ignore[union-attr]

    # gc: the environments go, so do their pool files, so do the entries naming them; the
    # interpreter is pinned, so its folder stays (empty of live entries).
    pin(store, interpreter)
    collect(store, dry_run=False, runs_dir=tmp_path / "runs", keep_runs=0)
    assert not store.is_registered(first) and store.is_registered(interpreter)
    assert index.folder.is_dir() and not [p for p in index.folder.rglob("*") if p.is_file()]
    assert BytecodeIndex(store.root, interpreter).lookup(key) is None
    # No entry for a pool file that does not exist.
    assert reuse.index.record(third, [(key, file_blake3(store.root / interpreter))]) == 0
    # Entries of an interpreter no longer registered go with their folder.
    (store.root / ".bytecode" / ("9" * 32 + "-cpython-gone")).mkdir()
    assert prune(store.root, [interpreter]) == 0
    assert not (store.root / ".bytecode" / ("9" * 32 + "-cpython-gone")).exists()


# ------------------------------------------------------------------------ two homes, end to end


def wheel_modules(package: str, names: list[str]) -> dict[str, str]:
    return {f"{package}/{rel.replace('/', '_')}": (STDLIB / rel).read_text() for rel in names}


@pytest.fixture(scope="module")
def project(up: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two services on one interpreter sharing a package: ``first`` = shared, ``second`` =
    shared + extra. Their wheels hold real standard-library code."""
    from harness.cli import main

    up.index.add_wheel("sharedpkg", "1.0", modules=wheel_modules("sharedpkg", MODULES[:10]))
    up.index.add_wheel("extrapkg", "1.0", modules=wheel_modules("extrapkg", MODULES[10:]))
    root = make_project(
        tmp_path_factory.mktemp("bytecode"),
        {
            "first": service(["sharedpkg==1.0"]),
            "second": service(["sharedpkg==1.0", "extrapkg==1.0"]),
        },
    )
    with pytest.raises(SystemExit) as exit_:
        main(["--project", str(root), "lock"])
    assert exit_.value.code == 0
    return root


def realize(project: Path, home: Path, *args: str) -> None:
    result = run_harness_process("--project", str(project), "--home", str(home), "realize", *args, timeout=600)
    assert result.returncode == 0, result.stderr


def entries(store: Store) -> dict[str, int]:
    """How many bytecode index entries each file of the store's index holds."""
    top = store.root / ".bytecode"
    return {p.name: len(p.read_text().splitlines()) for p in top.rglob("*") if p.is_file()}


def test_one_environment_in_two_homes_is_bit_identical_whatever_the_workers_and_reuse(
    project: Path, tmp_path: Path
) -> None:
    reusing, fresh = tmp_path / "reusing", tmp_path / "fresh"
    realize(project, reusing, "--jobs", "1", "first")
    before = entries(Store.in_home(reusing))
    assert list(before.values()) == [11]  # sharedpkg's modules and its __init__, from `first`
    realize(project, reusing, "--jobs", "1", "second")
    after = entries(Store.in_home(reusing))
    # `second` compiled (and recorded) only extrapkg's 6 modules and its __init__: sharedpkg's
    # pycs were placed from the pool.
    assert sorted(after.values()) == [7, 11]
    realize(project, fresh, "--jobs", str(max(2, cpu_count())), "second")

    lock = read(project / "locks" / "second.lock.toml")
    a, b = Store.in_home(reusing), Store.in_home(fresh)
    env_a, env_b = realized_lock(a, lock), realized_lock(b, lock)
    assert env_a.environment.store == env_b.environment.store
    assert env_a.python.store == env_b.python.store  # the stdlib compiled with 1 and N workers
    for name in (env_a.environment.store, env_a.python.store):
        assert a.record(name).content == b.record(name).content, name  # type: ignore[union-attr]
    pyc_a, pyc_b = pycs(a.root / env_a.environment.store), pycs(b.root / env_b.environment.store)
    assert pyc_a == pyc_b and any("sharedpkg" in k for k in pyc_a) and any("extrapkg" in k for k in pyc_a)
    assert pycs(a.root / env_a.python.store) == pycs(b.root / env_b.python.store)
    code = "import sharedpkg.json_decoder, extrapkg.argparse; print(sharedpkg.json_decoder.__cached__)"
    run = subprocess.run(
        [str(b.root / env_b.environment.store / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip().endswith(f"json_decoder.{TAG}.pyc")
