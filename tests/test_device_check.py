"""The GPU check script (issue 31, step 6) on a machine without a GPU: ``--host`` runs its
whole flow (a throwaway project locked offline, realized into an empty home, planned, a start
and a swap through the broker of `harness up`, down) with host memory in place of GPU memory,
and without ``--host`` it says there is nothing to check. On a GPU machine the same script
checks the GPU figures (CI has none)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.runtime.inventory import detect_gpus
from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "device_check.py"


def test_the_device_check_runs_its_whole_flow_on_host_memory(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--host", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "device-check.json").read_text())
    lines = "\n".join(report["lines"])
    assert "FAIL" not in lines
    for expected in (
        "lock --offline",
        "realize into an empty home",
        "acquire hog-a: started",
        "a swap in",
        "every hog process gone (2/2)",
    ):
        assert expected in lines, lines
    assert "hog-a stopped, hog-b ready" in lines
    assert report["figures"]["swap_s"] > 0 and report["figures"]["start_a_s"] > 0


@pytest.mark.skipif(bool(detect_gpus()), reason="this machine has a GPU: the check would run")
def test_without_a_gpu_the_device_check_says_there_is_nothing_to_check(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "no NVIDIA GPU here (NVML found none): nothing to check" in done.stdout


def test_the_hog_refuses_clearly_without_a_cuda_driver(tmp_path: Path) -> None:
    """Where libcuda.so.1 cannot be loaded, the hog exits with one line saying so."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("a CUDA driver is here")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "device" / "hog.py"), "--port", "1", "--gb", "0.01"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "hog: no CUDA driver here" in done.stderr
