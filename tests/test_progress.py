"""Progress on stderr (issue 17): every long phase of realize and of cache push and pull says
when it starts and ends, as plain lines when stderr is not a terminal; ``--quiet`` says
nothing; stdout keeps only results.

The reporter itself is checked on a string stream; the phases through real ``harness``
processes (their stderr is a pipe) on tests/upstreams.py's locked project.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

from harness import progress as progress_module
from harness.progress import Stopped, reporter
from tests.conftest import ctrl_c_at, run_harness_process
from tests.upstreams import Upstreams

# -- the reporter ---------------------------------------------------------------------------


def test_plain_phase_says_start_and_end_with_counts() -> None:
    out = io.StringIO()
    shown = reporter(stream=out)
    assert shown.mode == "plain"  # a StringIO is no terminal
    with shown.phase("compiling bytecode", unit="files") as phase:
        phase.update(0, 40)
        phase.advance(40)
    with shown.phase("fetching 2 file(s)", total=3 << 20, unit="bytes") as phase:
        phase.advance(3 << 20)
        phase.summary = "2 servers"
    with shown.phase("installing"):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0] == "compiling bytecode ..."
    assert re.fullmatch(r"compiling bytecode: 40 files, done in \d+\.\d s", lines[1]), lines
    assert lines[2] == "fetching 2 file(s) ..."
    assert re.fullmatch(r"fetching 2 file\(s\): 3\.0 MiB, 2 servers, done in \d+\.\d s", lines[3]), lines
    assert re.fullmatch(r"installing: done in \d+\.\d s", lines[5]), lines
    assert len(lines) == 6


def test_plain_in_between_lines_are_occasional(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    shown = reporter(stream=out)
    monkeypatch.setattr(progress_module, "PLAIN_INTERVAL", 3600.0)
    with shown.phase("compiling", unit="files") as phase:
        for done in range(1, 1001):
            phase.update(done, 1000)
    assert len(out.getvalue().splitlines()) == 2  # start and end: no line per update

    out = io.StringIO()
    shown = reporter(stream=out)
    monkeypatch.setattr(progress_module, "PLAIN_INTERVAL", 0.0)
    with shown.phase("compiling", unit="files") as phase:
        phase.update(3, 10)
        phase.update(10, 10)  # the end says it: no "10 of 10" line
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"compiling: 3 of 10 files, \d+\.\d s", lines[1]), lines
    assert re.fullmatch(r"compiling: 10 files, done in \d+\.\d s", lines[2]), lines
    assert len(lines) == 3


def test_a_failed_phase_says_so_and_quiet_says_nothing() -> None:
    out = io.StringIO()
    with pytest.raises(ValueError), reporter(stream=out).phase("copying CPython"):
        raise ValueError("boom")
    assert re.fullmatch(r"copying CPython: failed after \d+\.\d s", out.getvalue().splitlines()[-1])
    with pytest.raises(ValueError), reporter(stream=out).phase("installing CPython") as phase:
        phase.failure = "unavailable"  # a fallback follows: not a failure of the whole
        raise ValueError("no download")
    assert re.fullmatch(r"installing CPython: unavailable after \d+\.\d s", out.getvalue().splitlines()[-1])

    out = io.StringIO()
    quiet = reporter(False, stream=out)
    with quiet.phase("copying", total=3) as phase:
        phase.advance(3)
    assert out.getvalue() == ""


def test_a_reporter_until_a_stop_refuses_new_phases_once_stopped() -> None:
    """realize's builds beside the fetch end at their next phase once the fetch failed."""
    out = io.StringIO()
    stop = threading.Event()
    until = reporter(stream=out).until(stop)
    with until.phase("copying CPython"):
        stop.set()  # a phase already running ends at its next update or check
    with pytest.raises(Stopped):
        until.phase("compiling bytecode")
    assert out.getvalue().splitlines()[0] == "copying CPython ..."
    assert "compiling" not in out.getvalue() and "failed" not in out.getvalue()


def test_a_running_phase_stops_at_its_next_update_once_stopped() -> None:
    """An interrupt must not wait for a long phase (a copy, a compile) to end: its next
    update or check raises, and a plain reporter's phases never do."""
    stop = threading.Event()
    until = reporter(stream=io.StringIO()).until(stop)
    with pytest.raises(Stopped), until.phase("compiling bytecode", unit="files") as phase:
        phase.update(1, 10)
        stop.set()
        phase.update(2, 10)
    with pytest.raises(Stopped):
        until.check()
    plain = reporter(stream=io.StringIO())
    plain.check()
    with plain.phase("copying") as phase:
        phase.check()
        phase.advance(1)


#: The phases of a cold realize of the svc project, by the start of their progress line, in
#: the order they start (the interpreter's host copy is made beside the fetch).
PHASES = (
    "fetching",
    "copying CPython",
    "compiling bytecode of CPython",
    "hashing python",
    "installing",
    "compiling bytecode of environment",
    "hashing and registering environment",
)


@pytest.mark.parametrize("phase", PHASES)
def test_ctrl_c_in_each_phase_of_realize_ends_it_within_a_second(svc: Path, tmp_path: Path, phase: str) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) the moment a phase of a
    cold realize starts: realize ends at once (the issue measured 12 s; goal 1 s, asserted
    loosely for a loaded machine) with exit 130, no traceback, a store that verifies, and the
    next realize finishes the work, fetching nothing it had already fetched."""
    import os

    home = tmp_path / "home"
    done = ctrl_c_at(
        ["--project", str(svc), "--home", str(home), "realize"],
        lambda line: line.startswith(phase) and line.rstrip().endswith("..."),
        env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"},
    )
    err = done.stderr
    assert done.took is not None, f"{phase!r} never started:\n{err}"
    assert done.returncode == 130, err
    assert "Traceback" not in err and "aborted" in err
    assert done.took < 3, f"{phase}: {done.took:.2f} s after SIGINT\n{err}"
    if phase == "copying CPython":  # stopped, not run to its end (the 12 s)
        assert not re.search(r"standard library: \d+ files, done", err), err
    verify = _harness(svc, home, "store", "verify")
    assert verify.returncode == 0
    again = _harness(svc, home, "realize")
    # What the interrupt left in scratch (deleting a big build takes seconds) is gone now.
    assert list((home / "store" / ".tmp").iterdir()) == []
    fetched_before = re.search(r"^fetching \d+ file\(s\): .*done in", err, re.M) is not None
    if fetched_before:  # the downloads a stopped realize finished are kept for the next
        assert not re.search(r"^fetching \d+ file\(s\)", again.stderr, re.M), again.stderr
    assert _harness(svc, home, "store", "verify", "--check-contents").returncode == 0


def test_ctrl_c_while_uv_downloads_the_interpreter_is_not_remembered_as_unreachable(svc: Path, tmp_path: Path) -> None:
    """Ctrl-C while `uv python install` waits on a mirror that accepts connections and never
    answers: realize ends at once, and the interrupted download is not noted as a failed one
    (harness/realize/unreachable.py), so the next realize asks uv again instead of standing
    a host copy in for an hour."""
    import os
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel accepts; nobody ever answers
    mirror = f"http://127.0.0.1:{silent.getsockname()[1]}/python-build-standalone"
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("UV_PYTHON_DOWNLOADS", "HARNESS_PYTHON_DOWNLOADS_JSON_URL")}
    try:
        done = ctrl_c_at(
            ["--project", str(svc), "--home", str(home), "realize"],
            lambda line: "(uv python install) ..." in line,
            env={**env, "UV_PYTHON_INSTALL_MIRROR": mirror, "UV_PYTHON_DOWNLOADS": "automatic"},
            pause=0.5,  # uv is connecting, then waiting on the silent mirror
        )
    finally:
        silent.close()
    assert done.took is not None, done.stderr
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert done.took < 3, f"{done.took:.2f} s after SIGINT\n{done.stderr}"
    assert list((home / "cache").glob("python-unreachable/*.json")) == [], "an interrupt is no failed download"
    assert _harness(svc, home, "store", "verify").returncode == 0


def test_live_display_on_a_terminal_leaves_one_line_per_phase() -> None:
    from rich.console import Console

    out = io.StringIO()
    shown = reporter(console=Console(file=out, force_terminal=True, width=120))
    assert shown.mode == "live"
    with shown.phase("realizing svc"):  # phases nest: one display, a line each
        with shown.phase("compiling bytecode", total=5, unit="files") as phase:
            phase.advance(5)
    text = out.getvalue()
    assert "compiling bytecode: 5 files, done in" in text
    assert "realizing svc: done in" in text


# -- through the CLI ------------------------------------------------------------------------


def _phases(stderr: str) -> list[str]:
    """The lines that progress wrote (a start "… ..." or an end "…: …done in …" or
    "…: failed after …")."""
    return [
        line
        for line in stderr.splitlines()
        if line.endswith(" ...") or re.search(r"(done in|failed after|unavailable after) \d", line)
    ]


def _harness(project: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # No interpreter download can succeed here: say so, rather than let uv try for seconds.
    result = run_harness_process(
        "--project", str(project), "--home", str(home), *args, timeout=600, env={"UV_PYTHON_DOWNLOADS": "never"}
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result


def test_realize_push_and_pull_show_their_phases_and_quiet_hides_them(svc: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = _harness(svc, home, "realize", "--json")
    assert json.loads(result.stdout)[0]["name"] == "svc"  # stdout: the results only
    err = result.stderr
    expected = [
        r"^fetching \d+ file\(s\): [\d.]+ [KM]iB, done in",
        r"^registering (\d+) package file\(s\): \1 files?, done in",
        r"^exporting source toolkit at [0-9a-f]{12} \(git\): done in",
        # Staged while the files download (hashed there), committed after: no second hash.
        r"^hashing source \S+: [\d.]+ [KM]iB, done in",
        r"^hashing and registering weights \S+: [\d.]+ [KM]iB, done in",
        # No interpreter download here: a host copy stands in.
        r"^copying CPython 3\.\d+\.\d+ from \S+: done in",
        r"^compiling bytecode of CPython 3\.\d+\.\d+'s standard library: \d{3,} files, done in",
        r"^hashing python \S+: [\d.]+ MiB, done in",
        r"^installing \d+ package\(s\) and 1 source\(s\) into environment svc \(uv(, downloading \d+ of them)?\): done in",
        r"^compiling bytecode of environment svc: \d+ files, done in",
        r"^hashing and registering environment \S+: [\d.]+ [KM]iB, done in",
        r"^realizing svc: done in",
    ]
    for pattern in expected:
        assert re.search(pattern, err, re.MULTILINE), f"{pattern!r} not in:\n{err}"
    phases = _phases(err)
    starts = [line for line in phases if line.endswith(" ...")]
    assert len(starts) * 2 == len(phases), err  # every phase that starts ends
    assert "realizing svc ..." in starts

    keys = tmp_path / "keys"
    assert run_harness_process("store", "keygen", "lab", "--dir", str(keys)).returncode == 0
    public = (keys / "lab.public").read_text().strip()
    cache = tmp_path / "cache"
    pushed = _harness(svc, home, "store", "push", str(cache), "svc", "--key", str(keys / "lab.secret"))
    assert re.search(rf"^pushing (\d+) path\(s\) to \S*{cache.name}: [\d.]+ MiB, done in", pushed.stderr, re.M), (
        pushed.stderr
    )
    pulled = _harness(svc, tmp_path / "home-b", "store", "pull", str(cache), "--all", "--trusted-key", public)
    assert re.search(r"^pulling (\d+) path\(s\) from \S+: [\d.]+ [KM]iB, done in", pulled.stderr, re.M), pulled.stderr
    assert pulled.stdout.startswith("pulled ")

    # --quiet: the same work, not a line of progress.
    quiet = _harness(svc, tmp_path / "home-q", "realize", "--quiet")
    assert quiet.stdout.startswith("svc: built ")
    assert _phases(quiet.stderr) == [], quiet.stderr
    quiet_push = _harness(
        svc,
        tmp_path / "home-q",
        "store",
        "push",
        str(tmp_path / "cache-q"),
        "svc",
        "-q",
        "--key",
        str(keys / "lab.secret"),
    )
    assert quiet_push.stderr == "" and quiet_push.stdout.startswith("pushed ")
    quiet_pull = _harness(
        svc, tmp_path / "home-r", "store", "pull", str(tmp_path / "cache-q"), "--all", "-q", "--trusted-key", public
    )
    assert quiet_pull.stderr == "" and quiet_pull.stdout.startswith("pulled ")


def test_run_and_up_realize_with_progress_and_quiet_hides_it(up: Upstreams, tmp_path: Path) -> None:
    import sys

    from tests.ports import free_port
    from tests.test_runs import _project

    project = _project(tmp_path / "p", "alpha==1.0", free_port())
    assert run_harness_process("--project", str(project), "--home", str(up.home), "lock").returncode == 0
    command = ("run", "--service", "svc", "--", sys.executable, "caller.py")
    shown = run_harness_process("--project", str(project), "--home", str(tmp_path / "a"), *command, cwd=project)
    assert shown.returncode == 0 and "service answered svc" in shown.stdout, shown.stderr
    assert "realizing svc ..." in _phases(shown.stderr), shown.stderr
    quiet = run_harness_process(
        "--project", str(project), "--home", str(tmp_path / "b"), "run", "--quiet", *command[1:], cwd=project
    )
    assert quiet.returncode == 0 and "service answered svc" in quiet.stdout, quiet.stderr
    assert _phases(quiet.stderr) == [], quiet.stderr
    assert re.search(r"^run \S+: exit 0", quiet.stderr, re.M)  # the run's own lines still print
    # `up` in a third home: realized quietly, then taken down.
    up_home = tmp_path / "c"
    started = run_harness_process("--project", str(project), "--home", str(up_home), "up", "-q", cwd=project)
    try:
        assert started.returncode == 0, started.stderr
        assert _phases(started.stderr) == [], started.stderr
    finally:
        run_harness_process("--project", str(project), "--home", str(up_home), "down", cwd=project)
