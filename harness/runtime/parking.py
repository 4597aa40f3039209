"""A broker process started ahead of its plan: its start-up overlaps the caller's own work.

Most of a detached broker's start (:func:`harness.runtime.broker.spawn`) is Python's and its
imports'. :func:`park` starts ``python -m harness.runtime.broker STATE_DIR --parked TOKEN``
before the caller knows what it will launch (a cluster shard: before it has proven its
node and checked its closure). The process imports the broker's modules, then waits on its
stdin: it opens no port and starts nothing until :func:`~harness.runtime.broker.spawn`,
given the :class:`Parked` handle, writes its configuration and tells it to serve
(:meth:`Parked.launch`). Closing its stdin unhanded (:meth:`Parked.discard`, or the caller
dying) ends it, having started nothing.

While it waits, ``parked.<TOKEN>`` in the state folder says so: ``spawn`` of another caller
does not take it for a stray broker (:func:`waiting_parked`); ``harness down`` and
``status`` still see and stop it like any broker process of the folder. The marker names the
parked process by its pid and start time; one whose process is gone, or whose pid another
process now has (a shard killed with SIGKILL before it handed its plan or ended it, or the
parked process killed itself), is stale: :func:`park` removes it rather than trust it
(:func:`stale_markers`), and a parked process ended unhanded removes its own.

Light on purpose (the supervisor's helpers, no broker): the caller parks before it imports
anything else.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.runtime import supervisor

#: Marks a parked broker process not yet handed its plan: ``parked.<token>`` in the state
#: folder while it waits, removed when it is handed one or ended.
PARKED_PREFIX = "parked."
#: What :func:`park` does not start beside: a broker serving the folder writes it.
_STATE_FILE = "broker.json"


def broker_env() -> dict[str, str]:
    """The environment a detached broker runs with: the caller's, with harness importable
    (it imports harness from the interpreter and import path the caller runs on)."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@dataclass(eq=False)
class Parked:
    """A broker process of ``state_dir`` started by :func:`park`, waiting for its plan."""

    proc: subprocess.Popen[bytes]
    state_dir: Path
    #: the environment it runs with: the services' environments are told relative to it
    env: dict[str, str]
    python: str
    token: str

    @property
    def marker(self) -> Path:
        return self.state_dir / f"{PARKED_PREFIX}{self.token}"

    def launch(self, handed: Mapping[str, Mapping[str, str]]) -> subprocess.Popen[bytes]:
        """Tell it to read the configuration :func:`~harness.runtime.broker.spawn` wrote and
        serve; ``handed``: the secrets a fresh broker gets in its environment
        (``HARNESS_BROKER_SECRETS``), here through the pipe."""
        self.marker.unlink(missing_ok=True)  # from now on it is a broker like any other
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"serve": True, "secrets": handed}).encode() + b"\n")
            self.proc.stdin.close()
        except OSError:
            pass  # it died: the caller's wait for it to serve reports its exit and its log
        return self.proc

    def discard(self) -> None:
        """End it unhanded: it exits having started nothing."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.marker.unlink(missing_ok=True)


def park(state_dir: Path, python: str = sys.executable) -> Parked | None:
    """Start the broker process of ``state_dir`` ahead of its plan (see the module's
    docstring); None when a broker's ``broker.json`` is there already (it serves, or
    ``spawn`` will find out that it does not), or another caller has one parked there (it
    will start the broker: a second would only be ended). A stale marker (its process gone)
    is removed first, not trusted. The caller :meth:`~Parked.discard`\\ s it if it never
    hands it to ``spawn``."""
    state_dir = supervisor.make_state_dir(Path(state_dir))
    stale_markers(state_dir, remove=True)
    if (state_dir / _STATE_FILE).exists() or any(state_dir.glob(f"{PARKED_PREFIX}*")):
        return None
    token = secrets.token_hex(8)
    env = broker_env()
    marker = state_dir / f"{PARKED_PREFIX}{token}"
    # Its caller first (the process is not started yet), then the process itself.
    supervisor.write_private(marker, json.dumps({"caller": process_identity(os.getpid())}) + "\n")
    proc = start_broker_process(
        python, state_dir, env, state_dir / "logs" / "broker.log", subprocess.PIPE, "--parked", token
    )
    supervisor.write_private(marker, json.dumps({"process": process_identity(proc.pid)}) + "\n")
    return Parked(proc, state_dir, env, python, token)


def start_broker_process(
    python: str, state_dir: Path, env: Mapping[str, str], log: Path, stdin: int, *extra: str
) -> subprocess.Popen[bytes]:
    """``python -m harness.runtime.broker STATE_DIR [EXTRA…]`` in a session of its own (it
    outlives its caller), in ``state_dir``, its output appended to ``log``: the one way a
    detached broker starts, parked (``--parked TOKEN``, ``stdin`` a pipe) or at once
    (:func:`harness.runtime.broker.spawn`, ``stdin`` ``DEVNULL``)."""
    with supervisor.open_private_log(log) as out:
        return subprocess.Popen(
            [python, "-m", "harness.runtime.broker", str(state_dir), *extra],
            cwd=state_dir,
            env=dict(env),
            stdin=stdin,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def process_identity(pid: int) -> dict[str, float]:
    """Process ``pid`` named so that a later reader can tell it from another given the same
    pid (:func:`names_live_process`): its pid and start time."""
    try:
        return {"pid": pid, "create_time": psutil.Process(pid).create_time()}
    except psutil.Error:
        return {"pid": pid, "create_time": 0.0}


def names_live_process(entry: object, token: str | None = None) -> bool:
    """Whether ``entry`` (a marker's ``process`` or ``caller``) is a live process with that
    start time and, given ``token``, the broker process parked under it."""
    if not isinstance(entry, dict):
        return False
    try:
        process = psutil.Process(int(entry["pid"]))
        if abs(process.create_time() - float(entry["create_time"])) > 0.05:
            return False  # the pid is another process's now
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return token is None or token in process.cmdline()
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def stale_markers(state_dir: Path, *, remove: bool = False) -> list[Path]:
    """The ``parked.<token>`` markers of ``state_dir`` whose parked process is gone (or whose
    pid another process has now): a shard or its parked broker killed with SIGKILL leaves
    one. A marker being written (its caller alive, the process not started yet) is not
    stale. ``remove``: delete them (nothing waits on them)."""
    stale = []
    for marker in Path(state_dir).glob(f"{PARKED_PREFIX}*"):
        token = marker.name[len(PARKED_PREFIX) :]
        try:
            data = json.loads(marker.read_text())
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and "process" in data:
            live = names_live_process(data["process"], token)
        else:  # the caller was starting it: stale once that caller is gone
            live = isinstance(data, dict) and names_live_process(data.get("caller"), None)
        if not live:
            stale.append(marker)
    if remove:
        for marker in stale:
            marker.unlink(missing_ok=True)
    return stale


def waiting_parked(cmdline: list[str], state_dir: Path) -> bool:
    """Whether the broker process of ``state_dir`` run as ``cmdline`` is parked and not
    handed its plan yet: it has started nothing and serves nobody."""
    try:
        token = cmdline[cmdline.index("--parked") + 1]
    except (ValueError, IndexError):
        return False
    return (Path(state_dir) / f"{PARKED_PREFIX}{token}").is_file()
