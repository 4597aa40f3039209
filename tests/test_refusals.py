"""The refusals a newcomer meets in the first hour (issue 35, step 3), each through the real
CLI on the built-in example project: a bad name or value is exit 2 naming what is accepted,
a failure says its cause in one line, and a summary says what was done."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize(
    ("command", "wrong", "close"),
    [
        (["realize", "sam4"], "sam4", "sam3"),
        (["install", "kinematcs"], "kinematcs", "kinematics"),
        (["up", "sam4"], "sam4", "sam3"),
        (["run", "--service", "kinematic"], "kinematic", "kinematics"),
        (["run", "--service", "kinematics", "--benchmark", "rech"], "rech", "reach"),
    ],
    ids=["realize", "install", "up", "run-service", "run-benchmark"],
)
def test_an_unknown_name_is_bad_input_naming_the_known_ones(
    command: list[str], wrong: str, close: str, tmp_path: Path, harness_cli
) -> None:
    result = harness_cli("--project", str(REPO), "--home", str(tmp_path / "home"), *command)
    assert result.code == 2, result
    assert f"named {wrong} (did you mean '{close}'?)" in result.err, result.err
    assert close in result.err.split("known: ", 1)[1]
    assert "Traceback" not in result.err + result.out
    assert not (tmp_path / "home" / "store").exists() or not any((tmp_path / "home" / "store").iterdir())


def test_an_unknown_name_far_from_every_known_one_has_no_suggestion(tmp_path: Path, harness_cli) -> None:
    result = harness_cli("--project", str(REPO), "--home", str(tmp_path / "home"), "realize", "zzzz")
    assert result.code == 2, result
    assert "did you mean" not in result.err
    assert "no manifest named zzzz; known: kinematics, molmo2" in result.err
