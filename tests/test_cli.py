"""The CLI shell: version, help, global options, and a light start-up."""

from __future__ import annotations

import subprocess
from pathlib import Path
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


# -- every command's --help shows examples that run ---------------------------------------

SHELL_OPERATORS = set("();<>|&")


def _command_tree() -> list[tuple[tuple[str, ...], object]]:
    """Every command of ``harness`` with its path of names, the root group first."""
    import click

    from harness.cli import cli

    found: list[tuple[tuple[str, ...], object]] = []

    def walk(command: click.Command, ctx: click.Context, path: tuple[str, ...]) -> None:
        found.append((path, command))
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None, f"harness {' '.join(path)}: {name} is listed but not found"
                walk(sub, click.Context(sub, info_name=name, parent=ctx), (*path, name))

    walk(cli, click.Context(cli, info_name="harness"), ())
    return found


def _examples(help_text: str) -> list[str]:
    """The lines of a help text's ``Examples:`` paragraph (indented, up to a blank line)."""
    lines = help_text.splitlines()
    if "Examples:" not in [line.strip() for line in lines]:
        return []
    start = [line.strip() for line in lines].index("Examples:") + 1
    examples = []
    for line in lines[start:]:
        if not line.strip():
            break
        examples.append(line.strip())
    return examples


def _harness_command_lines(example: str) -> list[list[str]]:
    """The ``harness …`` command lines in one shell example line, in order: split at shell
    operators (``&&``, ``|``, ``>``…), with leading ``VAR=value`` assignments dropped, and
    ``$(harness …)`` substitutions taken as command lines of their own."""
    import shlex

    lexer = shlex.shlex(example, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments: list[list[str]] = [[]]
    for token in lexer:
        if token and set(token) <= SHELL_OPERATORS:
            segments.append([])
        else:
            segments[-1].append(token)
    found: list[list[str]] = []
    for segment in segments:
        while segment and "=" in segment[0] and segment[0].split("=")[0].isidentifier():
            segment = segment[1:]
        if segment and segment[0] == "harness":
            found.append(segment)
        for token in segment:
            if token.startswith("$(") and token.endswith(")"):
                found.extend(_harness_command_lines(token[2:-1]))
    return found


def _parse(argv: list[str]) -> tuple[str, ...]:
    """Parse ``harness ARGS`` with each command's own click parser, the way click would run
    it, without running anything: an unknown command or option, a missing value or a value of
    the wrong type raises a UsageError. Returns the path of the command it reaches."""
    import click

    from harness.cli import cli

    command: click.Command = cli
    ctx = cli.make_context("harness", argv[1:])
    path: tuple[str, ...] = ()
    while isinstance(command, click.Group):
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            break
        name, sub, rest = command.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        command, path = sub, (*path, name)
    return path


def test_every_command_help_has_examples_that_parse() -> None:
    """Every command and subcommand's --help ends with an ``Examples:`` paragraph; each
    example's command lines parse with the CLI's own parsers (a misspelt option or a command
    that does not exist fails here) and the first reaches the command whose help it is in."""
    import click

    tree = _command_tree()
    assert len(tree) > 30
    missing = []
    for path, command in tree:
        assert isinstance(command, click.Command)
        examples = _examples(command.help or "")
        if not examples:
            missing.append(" ".join(("harness", *path)))
            continue
        for example in examples:
            lines = _harness_command_lines(example)
            assert lines, f"harness {' '.join(path)}: example runs no harness command: {example}"
            for argv in lines:
                try:
                    _parse(argv)
                except click.UsageError as exc:
                    raise AssertionError(f"harness {' '.join(path)}: {example!r}: {exc.format_message()}") from exc
            assert _parse(lines[0])[: len(path)] == path, f"harness {' '.join(path)}: {example!r} is another command's"
    assert not missing, f"commands whose --help has no Examples: {missing}"


def test_examples_show_unwrapped_in_help_output() -> None:
    """The examples are a ``\\b`` paragraph: each prints on its own line, as written."""
    from click.testing import CliRunner

    from harness.cli import cli

    runner = CliRunner()
    for path, command in _command_tree():
        result = runner.invoke(cli, [*path, "--help"], prog_name="harness", terminal_width=60)
        assert result.exit_code == 0, result.output
        printed = [line.strip() for line in result.output.splitlines()]
        for example in _examples(command.help or ""):  # type: ignore[attr-defined]
            assert example in printed, f"harness {' '.join(path)} --help rewraps {example!r}:\n{result.output}"


def test_an_example_with_an_unknown_option_fails_to_parse() -> None:
    """The check above can fail: a misspelt option, a missing value and a command that does
    not exist are refused by the parse it uses."""
    import click
    import pytest

    assert _parse(["harness", "--home", "/tmp/h", "store", "ls", "--closure", "kinematics"]) == ("store", "ls")
    for argv in (
        ["harness", "store", "ls", "--closur", "kinematics"],
        ["harness", "store", "ls", "--closure"],
        ["harness", "completion", "tcsh"],
        ["harness", "stor", "ls"],
        ["harness", "lock", "--jobs", "many"],
    ):
        with pytest.raises(click.UsageError):
            _parse(argv)
    assert _harness_command_lines('eval "$(harness completion bash)"  # this shell') == [
        ["harness", "completion", "bash"]
    ]
    assert _harness_command_lines("A=1 harness lock && harness realize > out.json") == [
        ["harness", "lock"],
        ["harness", "realize"],
    ]


def test_an_exit_with_threads_still_running_skips_only_the_interpreters_teardown(tmp_path: Path) -> None:
    """``console_main`` ends a process whose command left daemon threads running (an
    interrupted fetch's workers) without CPython's finalization, which crashed such exits with
    SIGSEGV: the status is kept, atexit handlers run, a thread pool's pending work is finished
    (non-daemon threads are joined) and buffered output is flushed."""
    marker = tmp_path / "atexit-ran"
    script = f"""
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from harness.cli import _exit_past_running_threads
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
pool = ThreadPoolExecutor(1)
pool.submit(lambda: (time.sleep(0.2), open({str(marker)!r} + ".pool", "w").close()))
atexit.register(lambda: open({str(marker)!r}, "w").close())
sys.stdout.write("buffered, not yet flushed")
_exit_past_running_threads(3)
print("never reached")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, not yet flushed"
    assert marker.exists() and Path(f"{marker}.pool").exists()
    # Without such a thread nothing happens: the caller goes on to exit as usual.
    quiet = "from harness.cli import _exit_past_running_threads\n_exit_past_running_threads(3)\nprint('went on')"
    done = subprocess.run([sys.executable, "-c", quiet], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "went on\n"
