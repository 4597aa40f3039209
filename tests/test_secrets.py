"""Secrets stay with their owner (DESIGN invariant 12, issue 29 part 4).

The runtime's state folder is its owner's only (0700; 0770 in a group-shared home), every
file harness writes there is 0600, and ``broker-config.json`` names the caller's secret-like
variables without holding their values, while the services still start with exactly the
environment they are given. Run records name secrets, never hold them.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import psutil
import pytest

from harness.runs.record import command_launch
from harness.runtime import supervisor
from harness.runtime.broker import CONFIG_FILE, HANDED_SECRETS, down, spawn, status
from harness.runtime.launch import env_as_delta, env_from_delta, is_secret_name
from harness.runtime.plan import Plan
from tests.test_broker import fake, placement

TOKEN = "hf_thisIsTheCallersToken0123456789"
OTHER = "sk-handedOnlyToThisService987654321"


def _modes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): stat.S_IMODE(p.lstat().st_mode) for p in folder.rglob("*")}


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("HUGGING_FACE_HUB_TOKEN", True),
        ("HARNESS_BROKER_TOKEN", True),
        ("OPENAI_API_KEY", True),
        ("AWS_ACCESS_KEY_ID", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("PGPASSWORD", True),
        ("DB_PASS", True),
        ("PATH", False),
        ("PWD", False),
        ("HF_HOME", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("KEYBOARD", False),
    ],
)
def test_secret_like_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_an_environment_is_told_relative_to_the_inherited_one() -> None:
    base = {"PATH": "/venv/bin:/usr/bin", "HF_TOKEN": TOKEN, "PYTHONPATH": "/x", "HOME": "/home/a"}
    env = {"PATH": "/usr/bin", "HF_TOKEN": TOKEN, "HOME": "/home/a", "OPENAI_API_KEY": OTHER, "PYTHONUNBUFFERED": "1"}
    delta, private = env_as_delta(env, base)
    assert TOKEN not in json.dumps(delta) and OTHER not in json.dumps(delta)
    assert delta == {
        "unset": ["PYTHONPATH"],
        "set": {"PATH": "/usr/bin", "PYTHONUNBUFFERED": "1"},
        "secrets": ["HF_TOKEN", "OPENAI_API_KEY"],
    }
    assert private == {"OPENAI_API_KEY": OTHER}
    assert env_from_delta(delta, base, private) == env


def test_the_state_folder_and_the_broker_config_keep_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HARNESS_TEST_PLAIN", "plain-value")
    state = tmp_path / "state"
    ours = fake(f"{tmp_path.name}-env", state)
    # A service given a secret the caller's environment does not hold: handed over privately.
    handed = fake(f"{tmp_path.name}-handed", state)
    handed = type(handed)(**{**handed.__dict__, "env": {**handed.env, "OPENAI_API_KEY": OTHER}})
    plan = Plan((placement(ours, mode="resident"), placement(handed, mode="resident")))
    try:
        spawn(plan, {ours.name: ours, handed.name: handed}, state, options={"tick": 0.05})
        config = (state / CONFIG_FILE).read_text()
        assert TOKEN not in config and OTHER not in config and "plain-value" not in config
        specs = json.loads(config)["specs"]
        assert "HF_TOKEN" in specs[ours.name]["env"]["secrets"]
        assert "OPENAI_API_KEY" in specs[handed.name]["env"]["secrets"]
        # The services run with exactly the environment they were given, secrets included.
        pids = {row["name"]: row["pid"] for row in status(state)["services"]}
        for spec in (ours, handed):
            environ = psutil.Process(pids[spec.name]).environ()
            assert environ.pop("HARNESS_BROKER") and environ.pop("HARNESS_BROKER_TOKEN")
            assert environ == dict(spec.env)
            assert HANDED_SECRETS not in environ
        assert psutil.Process(pids[ours.name]).environ()["HF_TOKEN"] == TOKEN
        # Every folder its owner's only, every file 0600.
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        modes = _modes(state)
        assert {"broker.json", "broker.token", CONFIG_FILE, "launch-checks.jsonl", "logs/broker.log"} <= set(modes)
        assert f"logs/{ours.name}.log" in modes and f"pids/{ours.name}.json" in modes
        wide = {p: oct(m) for p, m in modes.items() if not (state / p).is_dir() and m & 0o077}
        assert wide == {}
        assert modes["logs"] == 0o700
    finally:
        down(state, grace=(0.5, 0.5))


def test_a_state_folder_made_wide_before_is_narrowed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True, mode=0o755)
    os.chmod(state, 0o755)
    (state / "logs" / "old.log").write_text("x")
    os.chmod(state / "logs" / "old.log", 0o644)
    supervisor.make_state_dir(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "logs").stat().st_mode) == 0o700
    with supervisor.open_private_log(state / "logs" / "old.log") as log:
        log.write(b"more\n")
    assert stat.S_IMODE((state / "logs" / "old.log").stat().st_mode) == 0o600


def test_in_a_group_shared_home_the_state_folder_is_the_groups_to_enter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "store").mkdir(parents=True)
    os.chmod(home / "store", 0o2775)  # what `store init --group` leaves: setgid marks a shared home
    state = supervisor.make_state_dir(home / "state" / "project-0123")
    assert stat.S_IMODE(state.stat().st_mode) & 0o777 == 0o770
    supervisor.write_private(state / "broker.token", "t\n")
    assert stat.S_IMODE((state / "broker.token").stat().st_mode) == 0o600


def test_a_run_record_names_secret_variables_without_their_values(tmp_path: Path) -> None:
    env = {
        "HARNESS_BROKER": "http://127.0.0.1:1",
        "HARNESS_BROKER_TOKEN": "tok",
        "HARNESS_HF_TOKEN": TOKEN,
        "HF_TOKEN": TOKEN,
        "HARNESS_RUN_DIR": str(tmp_path),
    }
    recorded = command_launch(["true"], tmp_path, env, tmp_path)
    assert TOKEN not in json.dumps(recorded) and "tok" not in json.dumps(recorded["env"])
    assert recorded["env"]["HARNESS_HF_TOKEN"] == "(secret)"
    assert recorded["env"]["HARNESS_BROKER"] == "http://127.0.0.1:1"
