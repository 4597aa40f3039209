"""The store core: registration is atomic, records come last, crashes leave no half paths."""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.store.gc import collect, pin, why
from harness.store.hashing import content_hash
from harness.store.launchcheck import check_closure
from harness.store.store import FIXED_MTIME, BuildResult, Store, StoreError
from harness.store.verify import verify_store

NAME = "0" * 32 + "-demo"


def _tree(out: Path) -> BuildResult:
    (out / "bin").mkdir(parents=True)
    (out / "data.txt").write_text("hello\n")
    run = out / "bin" / "run"
    run.write_text("#!/bin/sh\necho hi\n")
    run.chmod(0o755)
    (out / "link").symlink_to("data.txt")
    return BuildResult(obtained="test")


def test_add_registers_a_canonical_read_only_path(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    record = store.add(NAME, "source", _tree)
    path = store.path(NAME)
    assert store.is_registered(NAME) and record.content == content_hash(path)
    assert stat.S_IMODE(os.lstat(path / "data.txt").st_mode) == 0o444
    assert stat.S_IMODE(os.lstat(path / "bin" / "run").st_mode) == 0o555
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o555
    assert os.lstat(path / "data.txt").st_mtime == FIXED_MTIME
    assert record.obtained == "test" and record.nar_size > 0
    assert list(store.tmp_dir.iterdir()) == []
    # A second add is a no-op that returns the same record.
    assert store.add(NAME, "source", lambda out: pytest.fail("rebuilt")) == record


def test_failed_build_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")

    def broken(out: Path) -> None:
        out.mkdir()
        (out / "half").write_text("x")
        raise StoreError("download failed")

    with pytest.raises(StoreError, match="download failed"):
        store.add(NAME, "source", broken)
    assert not os.path.lexists(store.root / NAME) and store.record(NAME) is None
    assert list(store.tmp_dir.iterdir()) == []


def test_expected_content_is_enforced(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    with pytest.raises(StoreError, match="content hash mismatch: expected blake3:00"):
        store.add(NAME, "source", _tree, expected_content="blake3:" + "0" * 64)
    assert not store.is_registered(NAME) and not os.path.lexists(store.root / NAME)


def _rewrite(path: Path, data: bytes) -> None:
    """Change a canonical (read-only, mtime 1) file's bytes and put its mode and mtime back:
    only its ctime (which no user can set) tells."""
    path.chmod(0o644)
    path.write_bytes(data)
    path.chmod(0o444)
    os.utime(path, (FIXED_MTIME, FIXED_MTIME))


def test_commit_registers_what_was_staged_with_its_launch_fingerprint(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    staged = store.stage("source", _tree, label=NAME)
    assert not os.path.lexists(store.root / NAME)  # staged: nothing registered yet
    record = store.commit(staged, NAME, expected_content=staged.digest.hash)
    assert store.is_registered(NAME) and record.content == content_hash(store.path(NAME))
    assert list(store.tmp_dir.iterdir()) == []
    # The fingerprint written at registration describes the path as it is: the launch check
    # passes on stat alone, with no re-hash.
    assert [(c.path, c.verified) for c in check_closure(store.root, [NAME])] == [(NAME, "stat")]


def test_commit_refuses_a_staged_build_changed_after_it_was_hashed(tmp_path: Path) -> None:
    """Mode, mtime and size as hashed, other bytes: the staged hash no longer describes them."""
    store = Store(tmp_path / "store")
    staged = store.stage("source", _tree, label=NAME)
    _rewrite(staged.out / "data.txt", b"HELLO\n")
    with pytest.raises(StoreError, match="changed after it was hashed"):
        store.commit(staged, NAME)
    assert not store.is_registered(NAME) and not os.path.lexists(store.root / NAME)
    assert list(store.tmp_dir.iterdir()) == []


def test_commit_of_a_staged_build_with_only_new_times_registers_it(tmp_path: Path) -> None:
    """A changed ctime alone (the same bytes written again) costs a re-hash, not a refusal."""
    store = Store(tmp_path / "store")
    staged = store.stage("source", _tree, label=NAME)
    digest = staged.digest
    time.sleep(0.01)  # a later ctime than the stage's fingerprint, even on a coarse clock
    _rewrite(staged.out / "data.txt", b"hello\n")
    record = store.commit(staged, NAME)
    assert record.content == digest.hash == content_hash(store.path(NAME))
    assert [c.verified for c in check_closure(store.root, [NAME])] == ["stat"]


def test_unregistered_leftover_is_rebuilt(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    leftover = store.root / NAME
    leftover.mkdir(parents=True)
    (leftover / "partial").write_text("crash")
    assert not store.is_registered(NAME)
    store.add(NAME, "source", _tree)
    assert not (store.path(NAME) / "partial").exists()
    assert store.clean() == []


def test_clean_removes_debris(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.add(NAME, "source", _tree)
    (store.root / ("1" * 32 + "-debris")).mkdir()
    (store.tmp_dir / "x.abc").mkdir()
    removed = store.clean()
    assert "1" * 32 + "-debris" in removed and ".tmp/x.abc" in removed
    assert store.is_registered(NAME)


def test_verify_finds_modified_and_missing(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    store.add(NAME, "source", _tree)
    other = "2" * 32 + "-other"
    store.add(other, "source", _tree)
    assert {f.status for f in verify_store(store, check_contents=True)} == {"ok"}
    data = store.path(NAME) / "data.txt"
    data.chmod(0o644)
    data.write_text("hellO\n")
    os.utime(data, (FIXED_MTIME, FIXED_MTIME))
    findings = {f.name: f for f in verify_store(store, check_contents=True)}
    assert findings[NAME].status == "modified" and "expected blake3:" in findings[NAME].detail
    assert findings[other].status == "ok"
    # Without --check-contents the stat fingerprint finds it too (the write moved its ctime).
    quick = {f.name: f for f in verify_store(store, check_contents=False)}
    assert quick[NAME].status == "modified" and f"{NAME}/data.txt" in quick[NAME].detail
    assert quick[other].status == "ok"
    os.chmod(store.path(other), 0o755)
    os.chmod(store.path(other) / "bin", 0o755)
    import shutil

    shutil.rmtree(store.path(other))
    assert store.record(other) is None
    assert verify_store(store, check_contents=False, names=[other])[0].status == "missing"


def test_gc_keeps_pins_and_references(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    leaf = "3" * 32 + "-leaf"
    top = "4" * 32 + "-top"
    junk = "5" * 32 + "-junk"
    for name in (leaf, junk):
        store.add(name, "source", _tree)
    store.add(top, "environment", _tree, references=(leaf,))
    pin(store, top)
    assert collect(store, dry_run=True).names == [junk]
    assert store.is_registered(junk)
    assert collect(store, dry_run=False).names == [junk]
    assert not os.path.lexists(store.root / junk)
    assert store.is_registered(leaf) and store.is_registered(top)
    assert why(store, leaf) == [f"referenced by {top}"]
    assert why(store, top) == [f"root pin {top}"]


ADDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from harness.store.store import Store, BuildResult
    store = Store(Path(sys.argv[1]))
    log = Path(sys.argv[2])
    names = sys.argv[3:]
    def build(out):
        with log.open("a") as f:
            f.write("build\\n")
        out.mkdir()
        for i in range(40):
            (out / f"f{i}").write_bytes(bytes(range(256)) * 64)
            time.sleep(0.002)
        return BuildResult(obtained="child")
    for name in names:
        store.add(name, "source", build)
    print("done")
""")


def test_concurrent_adds_build_once(tmp_path: Path) -> None:
    store_root = tmp_path / "store"
    log = tmp_path / "builds.log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ADDER, str(store_root), str(log), NAME], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs) and all("done" in o for o in outputs)
    assert log.read_text().count("build") == 1
    assert verify_store(Store(store_root), check_contents=True)[0].status == "ok"


def test_sigkill_at_random_moments_never_leaves_a_half_registered_path(tmp_path: Path) -> None:
    store_root = tmp_path / "store"
    log = tmp_path / "builds.log"
    names = [f"{i:032d}-obj{i}" for i in range(6)]
    rng = random.Random(7)
    for _ in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-c", ADDER, str(store_root), str(log), *names], stdout=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        store = Store(store_root)
        for finding in verify_store(store, check_contents=True):
            assert finding.status == "ok", finding
    store = Store(store_root)
    store.clean()
    subprocess.run(
        [sys.executable, "-c", ADDER, str(store_root), str(log), *names], check=True, stdout=subprocess.DEVNULL
    )
    assert sorted(r.name for r in store.records()) == sorted(names)
    assert all(f.status == "ok" for f in verify_store(store, check_contents=True))
    assert list(store.tmp_dir.iterdir()) == []


def test_a_pooled_file_changed_behind_the_stores_back_is_not_registered_again(tmp_path: Path) -> None:
    """uv installs a second environment by hard-linking its cache, whose files are the pool's
    inodes: one that was changed in place (mode opened, bytes written) is refused, naming it,
    rather than registered as the new environment's content."""
    store = Store(tmp_path / "store")
    cache = tmp_path / "uv-cache"
    cache.mkdir()
    (cache / "module.py").write_text("VALUE = 1\n")

    def environment(out: Path) -> BuildResult:
        (out / "lib").mkdir(parents=True)
        os.link(cache / "module.py", out / "lib" / "module.py")  # as uv installs from its cache
        return BuildResult(obtained="test")

    first = "1" * 32 + "-first-env"
    store.add(first, "environment", environment)
    shared = store.path(first) / "lib" / "module.py"
    assert shared.stat().st_ino == (cache / "module.py").stat().st_ino  # one inode: env, pool, cache
    # A second environment of the same cache file reuses the pooled inode unread.
    second = "2" * 32 + "-second-env"
    store.add(second, "environment", environment)
    assert store.record(second).content == store.record(first).content  # type: ignore[union-attr]

    shared.chmod(0o644)
    shared.write_text("VALUE = 2\n")  # pip into the environment, an editor, ...
    third = "3" * 32 + "-third-env"
    with pytest.raises(StoreError, match=r"lib/module.py: the file installed here was changed behind the store's back"):
        store.add(third, "environment", environment)
    assert not store.is_registered(third)


def test_an_environment_is_shared_and_hashed_in_one_read_as_canonicalized(tmp_path: Path) -> None:
    """Store.add reads an environment's files once, for the pool and the content hash
    together, before canonicalizing: the hash must be the one of the registered (canonical)
    path, a file with only a group execute bit counting as executable, as canonicalize leaves it."""
    store = Store(tmp_path / "store")
    big = random.Random(7).randbytes(3 << 20)  # the mmap path

    def environment(out: Path) -> BuildResult:
        (out / "bin").mkdir(parents=True)
        (out / "lib").mkdir()
        for name, data, mode in (
            ("lib/a.py", b"A = 1\n", 0o644),
            ("lib/same-as-a.py", b"A = 1\n", 0o600),
            ("lib/big.so", big, 0o755),
            ("bin/group-exec", b"#!/bin/sh\n", 0o650),
            ("bin/tool", b"#!/bin/sh\necho\n", 0o700),
        ):
            (out / name).write_bytes(data)
            (out / name).chmod(mode)
        (out / "bin" / "python").symlink_to("../lib/a.py")
        return BuildResult(obtained="test")

    name = "4" * 32 + "-one-read-env"
    record = store.add(name, "environment", environment)
    path = store.path(name)
    assert record.content == content_hash(path)  # the registered, canonical bytes and modes
    assert stat.S_IMODE((path / "bin" / "group-exec").stat().st_mode) == 0o555
    assert (path / "lib" / "a.py").stat().st_ino == (path / "lib" / "same-as-a.py").stat().st_ino
    assert (path / "lib" / "big.so").stat().st_nlink == 2  # the path's and the pool's
    # A second environment of the same files takes every inode from the pool.
    again = store.add("5" * 32 + "-one-read-env", "environment", environment)
    assert again.content == record.content
    assert (store.path(again.name) / "lib" / "big.so").stat().st_ino == (path / "lib" / "big.so").stat().st_ino
    assert all(f.status == "ok" for f in verify_store(store, check_contents=True))
