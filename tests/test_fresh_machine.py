"""A fresh machine: its distribution's own CPython of the lock's series, nothing else.

The committed locks pin CPython 3.11.7; a fresh Debian 12 has 3.11.2 at /usr/bin/python3.11
and no pyenv. Offline (no interpreter download), realize copies that one to stand in: the
copy is named by its own version and content, recorded as an impurity that says which
release stands in for which, and the lock's wheels (same ABI) install on it. Run with HOME
in a fresh folder and only /usr/bin and /bin on PATH, so no version manager is seen.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.lock.lockfile import read
from harness.store.store import Store

DISTRIBUTION = Path("/usr/bin/python3.11")


def _distribution_version() -> str | None:
    if not DISTRIBUTION.is_file():
        return None
    probe = subprocess.run(
        [str(DISTRIBUTION), "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    )
    return probe.stdout.strip() or None


VERSION = _distribution_version()

pytestmark = pytest.mark.skipif(
    VERSION is None or sys.platform != "linux",
    reason="needs the distribution's own CPython 3.11 at /usr/bin/python3.11 (Linux)",
)


def test_the_distributions_own_release_of_the_series_stands_in(svc: Path, tmp_path: Path) -> None:
    lock = read(svc / "locks" / "svc.lock.toml")
    if lock.python.version == VERSION:
        pytest.skip(f"the distribution's CPython is the lock's own {VERSION}: nothing stands in for it")
    fresh_home = tmp_path / "user"
    fresh_home.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYENV", "UV_PYTHON_INSTALL"))},
        "HOME": str(fresh_home),
        "PATH": "/usr/bin:/bin",
        "UV_PYTHON_DOWNLOADS": "never",
    }
    home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--project", str(svc), "--home", str(home), "realize"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    store = Store.in_home(home)
    [python] = [r for r in store.records() if r.kind == "python"]
    assert python.name.endswith(f"-cpython-{VERSION}-host"), python.name
    assert python.impure is not None and f"CPython {VERSION}: no {lock.python.version} on this machine" in python.impure
    assert f"stands in for the lock's {lock.python.store}" in result.stdout, result.stdout
    [venv] = [p for p in store.root.iterdir() if p.name.endswith("-svc-env")]
    ran = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert ran.stdout.strip() == VERSION, ran.stderr
