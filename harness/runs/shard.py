"""One shard of a cluster run, on its node: the same path a local ``harness run`` takes.

:func:`run_shard` is what a cluster engine (Ray, Slurm) executes on a node. It takes the
node's ``HARNESS_HOME`` from the node's own environment, points realize at the binary
caches the head pushed to (``HARNESS_SUBSTITUTERS``/``HARNESS_TRUSTED_KEYS`` for the
duration of the shard), picks ports free on the node for the run's local services (several
shards may share a node), and calls :func:`harness.runs.run.run` restricted to its shard:
realize the closure into the node's store (substituters first), start the services through
a node-local broker, run the shard's episodes, record. The record is written on the node
under ``$HARNESS_HOME/runs/<run id>/shards/<I>/`` and returned whole (JSON and logs), so the
head can keep it under the run's own folder.

A shard never raises for a run that went wrong: a node that cannot realize, a benchmark
that ignores its shard, a command that fails, a Ctrl-C — each comes back as a result with a
``status`` and a ``reason``. Only the node itself dying (the engine's business) is left to
the engine, which retries the shard elsewhere.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness.manifests.project import Project

#: Files of a shard's record larger than this come back truncated (their tail is kept).
MAX_RETURNED_BYTES = 1 << 20


@dataclass(frozen=True)
class ShardJob:
    """Everything a node needs to run shard ``index`` of ``count`` (plain data: it travels)."""

    run_id: str
    index: int
    count: int
    project_root: str
    deploy_path: str | None
    command: tuple[str, ...]
    agent: str | None
    sets: tuple[str, ...]
    services: tuple[str, ...]
    benchmark: str | None
    gpus: str | None
    offline: bool
    #: the head's binary caches and trusted keys: where this node realizes from
    substituters: tuple[str, ...] = ()
    trusted_keys: tuple[str, ...] = ()
    #: local services of the plan, each moved to a port free on the node
    local_services: tuple[str, ...] = ()
    #: the closure digest the head recorded (the shard's is compared in the record and audit)
    expected_digest: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class NodeState:
    """What :func:`harness.runs.run.run` needs of the CLI's state, built on the node."""

    home: Path
    deploy_path: Path | None
    project_root: Path

    def project(self) -> Project:
        from harness.manifests.project import Project

        if not (self.project_root / "services").is_dir():
            raise HarnessError(
                f"project folder {self.project_root} is not on node {socket.gethostname()}",
                hint="put the project on a filesystem every node mounts at the same path",
            )
        return Project(self.project_root)


def node_home() -> Path:
    """This node's ``HARNESS_HOME`` (its own environment), else ``~/.cache/harness``."""
    return Path(os.environ.get("HARNESS_HOME") or "~/.cache/harness").expanduser()


def shard_dir(home: Path, run_id: str, index: int) -> Path:
    return home / "runs" / run_id / "shards" / str(index)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on loopback now (the kernel picks them)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in this process's environment for the block, then restore it.

    A Ray worker process runs many tasks: nothing of one shard may leak into the next.
    """
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _sigint_unblocked() -> Iterator[None]:
    """SIGINT deliverable in this thread, and so in the processes and threads it starts.

    A Ray worker blocks SIGINT, and a blocked mask survives fork and exec: without this the
    services and the command of a cancelled shard could not be interrupted, only killed.
    """
    import signal

    previous = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def run_shard(job: ShardJob, node: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``job`` on this node and return its record (see the module docstring).

    ``node`` names the node as the engine knows it (Ray's node id, a Slurm host); the
    host name and ``HARNESS_HOME`` are added here.
    """
    from harness.runs.record import read_json

    home = node_home()
    facts = {"hostname": socket.gethostname(), "home": str(home), "pid": os.getpid(), **(node or {})}
    folder = shard_dir(home, job.run_id, job.index)
    started = time.time()
    result: dict[str, Any] = {
        "index": job.index,
        "shard": f"{job.index}/{job.count}",
        "node": facts,
        "started": started,
        "record_dir": str(folder),
    }
    env = dict(job.extra_env)
    if job.substituters:
        env["HARNESS_SUBSTITUTERS"] = " ".join(job.substituters)
    if job.trusted_keys:
        env["HARNESS_TRUSTED_KEYS"] = " ".join(job.trusted_keys)
    lines: list[str] = []
    try:
        from harness.runs.run import run

        state = NodeState(home, Path(job.deploy_path) if job.deploy_path else None, Path(job.project_root))
        ports = dict(zip(job.local_services, free_ports(len(job.local_services)), strict=True))
        with _environment(env), _sigint_unblocked():
            outcome = run(
                state,
                list(job.command),
                agent=job.agent,
                sets=job.sets,
                services=job.services,
                benchmark=job.benchmark,
                gpus=job.gpus,
                offline=job.offline,
                echo=lines.append,
                shard=(job.index, job.count),
                run_id=job.run_id,
                run_dir=folder,
                ports=ports,
            )
        result.update(
            exit_status=outcome.exit_status, score=outcome.score, status="ok" if outcome.exit_status == 0 else "failed"
        )
        if outcome.exit_status == 130:
            result.update(status="cancelled", reason="interrupted")
        elif outcome.exit_status != 0:
            result["reason"] = f"the shard's command exited with {outcome.exit_status}"
        bench = folder / "benchmark.json"
        if result["status"] == "ok" and bench.is_file() and job.count > 1:
            said = read_json(bench).get("shard")
            if said != f"{job.index}/{job.count}":
                result.update(
                    status="failed",
                    reason=(
                        f"the benchmark ignored its shard (asked {job.index}/{job.count}, its benchmark.json "
                        f"says {said!r}): its worker must read --shard or HARNESS_SHARD"
                    ),
                )
    except HarnessError as exc:
        hint = f" ({exc.hint})" if getattr(exc, "hint", None) else ""
        result.update(
            status="failed", exit_status=exc.exit_code, reason=f"on {facts['hostname']} ({home}): {exc.message}{hint}"
        )
    except KeyboardInterrupt:
        result.update(status="cancelled", exit_status=130, reason="interrupted before the command started")
    result["ended"] = time.time()
    result["output"] = lines
    result["files"] = _collect(folder)
    return result


def _collect(folder: Path) -> dict[str, str]:
    """The shard's record files, relative path → text (large logs keep their tail).

    Its worker's ``work/`` folder (``workdir = "run"``) stays on the node, where
    ``record_dir`` names it: it holds whatever the worker wrote (videos among them), which
    would come back as text here, cut to its tail."""
    from harness.runs.record import work_dir

    files: dict[str, str] = {}
    if not folder.is_dir():
        return files
    work = work_dir(folder)
    entries = [p for top in folder.iterdir() if top != work for p in (top, *(top.rglob("*") if top.is_dir() else ()))]
    for path in sorted(entries):
        if not path.is_file() or path.name.startswith("."):
            continue
        size = path.stat().st_size
        with open(path, "rb") as handle:
            if size > MAX_RETURNED_BYTES:
                handle.seek(size - MAX_RETURNED_BYTES)
            data = handle.read()
        files[path.relative_to(folder).as_posix()] = data.decode("utf-8", "replace")
    return files
