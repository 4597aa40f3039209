"""``harness run --detach``: what the detached head is started with, and what is refused. The
detached head itself runs on the real local cluster in test_cluster.py."""

from __future__ import annotations

from pathlib import Path

from harness.runs.detach import without_detach
from tests.conftest import REPO


def test_the_head_gets_the_same_arguments_less_detach() -> None:
    assert without_detach(["--home", "h", "run", "--cluster", "ray", "--detach", "--", "x"]) == [
        "--home",
        "h",
        "run",
        "--cluster",
        "ray",
        "--",
        "x",
    ]
    # After --, a --detach is the command's own.
    assert without_detach(["run", "--cluster", "ray", "--", "tool", "--detach"]) == [
        "run",
        "--cluster",
        "ray",
        "--",
        "tool",
        "--detach",
    ]


def test_detach_needs_a_cluster_and_starts_nothing_without_one(tmp_path: Path, harness_cli) -> None:
    home = tmp_path / "home"
    result = harness_cli("--home", str(home), "--project", str(REPO), "run", "--detach", "--", "true")
    assert result.code == 2 and "--detach runs the head of a cluster run on its own" in result.err, result
    assert "Traceback" not in result.err
    assert not (home / "runs").exists()
