"""Shared fixtures: the repository root, and running the real CLI in-process or as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

# Fixtures that start local counterparts of upstreams (hub server, package index).
pytest_plugins = ["tests.conftest_hub", "tests.upstreams"]

REPO = Path(__file__).resolve().parent.parent

# No interpreter download source is reachable from the test machines, and uv retries an
# unreachable one for seconds before realize falls back to a host copy: every realize in an
# empty home paid that. Tests of the download path serve their own list and drop this
# (tests/test_python_downloads.py); the fallback's reason is still checked there.
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")

# A cluster node's broker waits 30 s for the run's next shard before it ends itself; the
# cluster tests wait for it to end. The tests' shards arrive together, so 10 s is plenty.
os.environ.setdefault("HARNESS_NODE_LINGER", "10")

# A suite started in the background of a non-interactive shell (`.ci/run &`, a cron job)
# inherits SIGINT ignored, and an ignored signal stays ignored across exec: every child a
# test interrupts (Ctrl-C in realize, `logs -f`, `status --watch`) would ignore it too. A
# handler of our own is reset to the default in each child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def harness_cli(capsys: pytest.CaptureFixture[str]):
    """Run ``harness ARGS`` in-process through the CLI (:func:`harness.cli.main`, what the
    console entry point runs, :func:`harness.cli.console_main`); returns code/out/err."""
    from harness.cli import main

    def run(*args: str) -> Result:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def run_harness_process(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m harness ARGS`` as a real subprocess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd or REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass(frozen=True)
class Interrupted:
    """What :func:`ctrl_c_at` saw: the exit status, everything printed on stderr, and the
    seconds from the SIGINT to the exit (None: the line never came, no SIGINT was sent)."""

    returncode: int
    stderr: str
    took: float | None


def ctrl_c_at(
    args: list[str], at: Callable[[str], bool], *, env: dict[str, str], pause: float = 0.0, timeout: float = 120
) -> Interrupted:
    """Run ``python -m harness ARGS`` in a session of its own and send its process group a
    SIGINT (a terminal's Ctrl-C) ``pause`` seconds after the first stderr line ``at`` accepts;
    wait for it to end."""
    import time

    process = subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stderr is not None
    seen, sent = [], None
    for line in process.stderr:
        seen.append(line)
        if at(line):
            time.sleep(pause)
            os.killpg(process.pid, signal.SIGINT)
            sent = time.monotonic()
            break
    _, rest = process.communicate(timeout=timeout)
    took = None if sent is None else time.monotonic() - sent
    return Interrupted(process.returncode, "".join(seen) + rest, took)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Say which order the tests ran in (pytest-randomly shuffles every run; its header line
    is hidden by ``-q``), so a failure that depends on the order can be repeated."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(f"tests ran in a random order: repeat it with -p randomly --randomly-seed={seed}")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """After pytest-randomly's shuffle: a module's tests marked ``last`` (they end state the
    module's other tests share, as killing a cluster node does) run after its other tests."""
    positions: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        positions.setdefault(item.nodeid.split("::")[0], []).append(index)
    for places in positions.values():
        members = [items[i] for i in places]
        ordered = [m for m in members if m.get_closest_marker("last") is None]
        ordered += [m for m in members if m.get_closest_marker("last") is not None]
        for index, item in zip(places, ordered, strict=True):
            items[index] = item
