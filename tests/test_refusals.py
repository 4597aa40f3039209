"""The refusals a newcomer meets in the first hour (issue 35, step 3), each through the real
CLI on the built-in example project: a bad name or value is exit 2 naming what is accepted,
a failure says its cause in one line, and a summary says what was done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_harness_process
from tests.ports import free_port


@pytest.fixture(scope="module")
def example_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home with the example's kinematics and reach realized (a host copy of the
    interpreter stands in here: an impurity) and one run of the kinematics-only agent."""
    home = tmp_path_factory.mktemp("example-home")
    realized = run_harness_process("--home", str(home), "realize", "kinematics", "reach", timeout=600)
    assert realized.returncode == 0, realized.stderr
    deploy = home / "deploy.toml"  # the service on a free port: never the manifest's fixed one
    deploy.write_text(f"[services.kinematics]\nport = {free_port()}\n")
    ran = run_harness_process(
        "--home", str(home), "--deploy", str(deploy), "run", "--agent", "kinematics-only", timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    return home


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


def test_the_small_machine_guides_plan_runs_as_written(harness_cli) -> None:
    """`--deploy` is a global option: the guide gives it before the command, and so it plans
    with that deploy (tests/test_docs.py refuses a global option after a command)."""
    guide = (REPO / "docs/src/content/docs/guides/small-machine.md").read_text()
    line = "harness --deploy configs/deploy/example-one-gpu.toml plan"
    assert line in guide and "harness plan --deploy" not in guide
    result = harness_cli("--project", str(REPO), *line.split()[1:], "--gpus", "1x24")
    assert result.code == 0, result
    assert "sam3" in result.out
    wrong = harness_cli("--project", str(REPO), "plan", "--deploy", "configs/deploy/example-one-gpu.toml")
    assert wrong.code == 2 and "--deploy" in wrong.err


@pytest.mark.parametrize("name", ["sam4", "kinematics", "0000000000000000000000000000000a-nothing"])
def test_store_why_of_a_name_that_is_no_store_path_is_bad_input(name: str, tmp_path: Path, harness_cli) -> None:
    """Not "the next gc deletes it" (exit 0): gc has nothing of that name to delete."""
    result = harness_cli("--project", str(REPO), "--home", str(tmp_path / "home"), "store", "why", name)
    assert result.code == 2, result
    assert f"{name} is not a registered store path" in result.err
    assert "harness store ls" in result.err
    assert "next gc" not in result.out + result.err


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (
            'agent.services.world_models=["openwam4"]',
            "--set agent.services.world_models: no manifest services/openwam4",
        ),
        ('agent.services={world_models=["openwam4"]}', "--set agent.services.world_models: no manifest"),
        ('agent.benchmark="rech"', "--set agent.benchmark: no manifest benchmarks/rech.toml"),
    ],
)
def test_a_set_naming_an_unknown_manifest_is_blamed_on_set(given: str, expected: str, harness_cli) -> None:
    for command in (["closure"], ["plan", "--agent", "default", "--gpus", "1x24"]):
        result = harness_cli("--project", str(REPO), *command, "--set", given)
        assert result.code == 2, result
        assert expected in result.err, result.err


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("agent.services.bogus=1", "--set agent.services.bogus: Input should be a valid list"),
        ("agent.bogus=1", "--set agent.bogus: unknown key"),
        ("agent.skills=3", "--set agent.skills: Input should be a valid dictionary"),
        ("agent.services={bogus=1}", "--set agent.services.bogus: Input should be a valid list"),
    ],
)
def test_a_bad_set_is_blamed_on_set_not_the_agent_file(given: str, expected: str, harness_cli) -> None:
    for command in (
        ["closure"],
        ["closure", "--agent", "kinematics-only"],
        ["plan", "--agent", "default", "--gpus", "1x24"],
    ):
        result = harness_cli("--project", str(REPO), *command, "--set", given)
        assert result.code == 2, result
        assert expected in result.err, result.err
        assert "configs/agents/" not in result.err


def test_lock_check_refuses_an_unknown_platform_naming_the_accepted_ones(tmp_path: Path, harness_cli) -> None:
    home = str(tmp_path / "home")
    result = harness_cli("--project", str(REPO), "--home", home, "lock", "--check", "--platform", "bogus")
    assert result.code == 2, result
    assert "--platform: platform 'bogus' is not one harness locks for" in result.err
    assert "x86_64|aarch64-manylinux_2_N" in result.err and "aarch64-apple-darwin" in result.err
    assert "up to date" not in result.out
    # A platform it knows is checked: the committed locks are for x86_64-manylinux_2_28 only.
    for platform, code in (("x86_64-manylinux_2_28", 0), ("aarch64-manylinux_2_28", 1)):
        checked = harness_cli(
            "--project", str(REPO), "--home", home, "lock", "--check", "--platform", platform, "kinematics", "reach"
        )
        assert checked.code == code, checked
    assert "kinematics: not locked for aarch64-manylinux_2_28 (locked for x86_64-manylinux_2_28)" in checked.out


def test_audit_strict_says_it_fails_and_why(example_home: Path, harness_cli) -> None:
    plain = harness_cli("--home", str(example_home), "audit")
    assert plain.code == 0, plain
    assert ": ok (" in plain.out.splitlines()[-1]
    impurities = plain.out.count("\nimpure ")
    assert impurities >= 1, "a host copy stands in for the lock's interpreter here"
    strict = harness_cli("--home", str(example_home), "audit", "--strict")
    assert strict.code == 1, strict
    last = strict.out.splitlines()[-1]
    many = "impurity" if impurities == 1 else "impurities"
    assert f": impure: {impurities} {many} (--strict fails on them);" in last, last
    assert " ok" not in last
    report = json.loads(harness_cli("--home", str(example_home), "audit", "--json").out)
    assert report["ok"] is True and report["ok_strict"] is False


@pytest.fixture
def held_port(example_home: Path, tmp_path: Path):
    """A deploy whose kinematics port a process of this user holds without answering; yields
    (deploy, holder)."""
    import socket
    import subprocess
    import sys

    port = free_port()
    code = (
        "import socket, sys, time; s = socket.socket(); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); print('held', flush=True); time.sleep(300)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        deploy = tmp_path / "deploy.toml"
        deploy.write_text(f"[services.kinematics]\nport = {port}\n")
        yield deploy, holder
    finally:
        holder.kill()
        holder.wait()


def _brokers(home: Path) -> list[int]:
    """The pids of every broker process of ``home``'s state folders."""
    from harness.runtime.broker import find_brokers

    return [p.pid for state in (home / "state").glob("*") for p in find_brokers(state)]


def test_run_with_a_held_port_says_who_holds_it_in_one_line(example_home: Path, held_port) -> None:
    deploy, holder = held_port
    result = run_harness_process(
        "--home", str(example_home), "--deploy", str(deploy), "run", "--agent", "kinematics-only", timeout=300
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout and "HTTP Error" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "1 service(s) did not start: kinematics: port" in errors[0]
    assert f"is held by pid {holder.pid}" in errors[0] and "does not answer" in errors[0]
    assert "kinematics: kinematics:" not in result.stderr
    assert "the command was not started" in result.stderr
    assert holder.poll() is None, "never signalled: harness did not start it"
    records = sorted((example_home / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    assert json.loads((records[-1] / "result.json").read_text())["exit_status"] == 1


def test_a_failed_up_stops_the_broker_it_started(example_home: Path, held_port) -> None:
    deploy, holder = held_port
    home = ["--home", str(example_home), "--deploy", str(deploy)]
    try:
        result = run_harness_process(*home, "up", "kinematics", timeout=300)
        assert result.returncode == 1, result.stderr
        assert f"kinematics: port {deploy.read_text().split('= ')[1].strip()} is held by pid {holder.pid}" in (
            result.stderr
        )
        assert "kinematics: kinematics:" not in result.stderr
        assert "stopped the broker it started" in result.stderr
        status = json.loads(run_harness_process(*home, "status", "--json").stdout)
        assert status["broker"] is None and status["brokers"] == [], status
        assert _brokers(example_home) == []
        assert holder.poll() is None, "never signalled: harness did not start it"
    finally:
        run_harness_process(*home, "down")


@pytest.mark.parametrize(
    ("gpus", "extra"),
    [("none", ()), ("1x24", ()), ("2x80", ()), ("1x24", ("--agent", "kinematics-only"))],
    ids=["no-gpu", "one-small", "two-large", "agent"],
)
def test_deploy_writes_summary_says_what_it_wrote(
    gpus: str, extra: tuple[str, ...], tmp_path: Path, harness_cli
) -> None:
    from harness.manifests.project import Project

    out = tmp_path / "box.toml"
    result = harness_cli(
        "--project",
        str(REPO),
        "--home",
        str(tmp_path / "home"),
        "deploy",
        "write",
        "-o",
        str(out),
        "--gpus",
        gpus,
        *extra,
    )
    assert result.code == 0, result
    written = Project(REPO).load_deploy(out).services
    said = result.out.splitlines()[0].split(": ", 1)[1]
    expected = {
        label: sorted(n for n, s in written.items() if s.mode == mode)
        for mode, label in (("resident", "resident"), ("on_demand", "on demand"), ("off", "off"))
    }
    assert said == "; ".join(f"{label}: {', '.join(names)}" for label, names in expected.items() if names)
    assert "all on demand" not in result.out
    if gpus == "none":  # the case: every model off, and the summary says so
        assert said.startswith("resident: kinematics; off: ") and "on demand" not in said
