"""The CLI shell: version, help, global options, and a light start-up."""

from __future__ import annotations

import subprocess
import sys

from harness import __version__
from tests.conftest import REPO, run_harness_process

HEAVY = (
    "pydantic",
    "rich",
    "huggingface_hub",
    "modelscope",
    "tomlkit",
    "blake3",
    "numpy",
    "psutil",
    "packaging.requirements",
    "harness.manifests.model",
)


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from harness.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "LOADED []" in out, out
    assert "services" in out and "validate" in out


def test_version_and_help_as_a_process() -> None:
    result = run_harness_process("--version")
    assert result.returncode == 0 and __version__ in result.stdout
    result = run_harness_process("--help")
    assert result.returncode == 0
    for option in ("--home", "--deploy", "--project"):
        assert option in result.stdout


def test_unknown_command_is_a_usage_error(harness_cli) -> None:
    result = harness_cli("frobnicate")
    assert result.code == 2 and "No such command" in result.err


def test_a_mistyped_command_is_answered_with_the_closest(harness_cli) -> None:
    result = harness_cli("realise")
    assert result.code == 2 and "Did you mean 'realize'?" in result.err
    result = harness_cli("servics", "--json")
    assert result.code == 2 and "'services'" in result.err
    result = harness_cli("qqqqqq")
    assert result.code == 2 and "Did you mean" not in result.err


def test_completion_scripts_and_what_they_complete() -> None:
    """`harness completion SHELL` prints click's script; the completion it drives offers the
    commands and subcommands (asked the way bash's script asks)."""
    import os

    for shell, marker in (("bash", "complete -o nosort -F"), ("zsh", "compdef"), ("fish", "complete --no-files")):
        result = run_harness_process("completion", shell)
        assert result.returncode == 0 and marker in result.stdout and "_HARNESS_COMPLETE" in result.stdout, shell
    asked = subprocess.run(
        [sys.executable, "-m", "harness"],
        env={**os.environ, "_HARNESS_COMPLETE": "bash_complete", "COMP_WORDS": "harness store ver", "COMP_CWORD": "2"},
        capture_output=True,
        text=True,
    )
    assert "plain,verify" in asked.stdout.splitlines(), asked.stdout + asked.stderr
    assert run_harness_process("completion", "tcsh").returncode == 2


def test_home_and_deploy_from_environment(monkeypatch, tmp_path) -> None:
    from harness.cli import State

    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("HARNESS_DEPLOY", str(tmp_path / "d.toml"))
    state = State(None, None, None)
    assert state.home == tmp_path / "h" and state.deploy_path == tmp_path / "d.toml"
    assert State(str(tmp_path / "x"), None, None).home == tmp_path / "x"
    monkeypatch.delenv("HARNESS_HOME")
    assert str(State(None, None, None).home).endswith(".cache/harness")


def test_project_found_from_a_subdirectory() -> None:
    result = run_harness_process("services", "--json", cwd=REPO / "services" / "servers")
    assert result.returncode == 0, result.stderr
