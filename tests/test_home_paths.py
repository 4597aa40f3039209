"""Any home path works (issue 12): spaces, non-ASCII, a symlinked home, a long path, and a
home on another filesystem than the temporary folder.

Each test realizes tests/upstreams.py's locked project (interpreter, wheels, a git source,
hub and path weights) into such a home, runs the environment's Python, and verifies the store.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.lock.lockfile import read
from harness.realize.standin import realized_lock
from harness.store.store import Store
from harness.store.verify import verify_store
from tests.conftest import run_harness_process


def _realize_and_run(project: Path, home: Path, env: dict[str, str] | None = None) -> None:
    result = run_harness_process("--project", str(project), "--home", str(home), "realize", env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    store = Store.in_home(home)
    # As realized here: without interpreter downloads a host copy stands in for the lock's.
    lock = realized_lock(store, read(project / "locks" / "svc.lock.toml"))
    python = store.root / lock.environment.store / "bin" / "python"
    ran = subprocess.run(
        [str(python), "-c", "import alpha, gamma, toolkit, sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert all(f.status == "ok" for f in verify_store(store, check_contents=True))


def test_home_with_spaces_non_ascii_a_symlink_and_a_long_path(svc: Path, tmp_path: Path) -> None:
    # ~180 characters before the store's own names: long, but under every file-name limit.
    real = tmp_path / "Lab Data" / "ロボット données" / ("deep-" * 20).rstrip("-") / "harness home"
    real.mkdir(parents=True)
    link = tmp_path / "home link"
    link.symlink_to(real, target_is_directory=True)
    assert len(str(link / "store")) > 60 and len(str(real)) > 150
    _realize_and_run(svc, link)
    assert (real / "store").is_dir()  # the link was followed, not replaced


def test_home_on_another_filesystem_than_the_temporary_folder(svc: Path, tmp_path: Path) -> None:
    """Build folders live in the home's store (``.tmp``), scratch files in TMPDIR: nothing may
    rename across the two."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no writable /dev/shm on another filesystem than the home here")
    scratch = shm / f"harness-test-{os.getpid()}"
    scratch.mkdir()
    try:
        _realize_and_run(svc, tmp_path / "home", env={"TMPDIR": str(scratch)})
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
