"""One shard of a cluster run, on its node: the same path a local ``harness run`` takes.

:func:`run_shard` is what a cluster engine (Ray, Slurm) executes on a node. It takes the
node's ``HARNESS_HOME`` from the node's own environment, points realize at the binary
caches the head pushed to (``HARNESS_SUBSTITUTERS``/``HARNESS_TRUSTED_KEYS`` for the
duration of the shard), takes the ports of the run's local services on this node (chosen
once per node: the run's shards there share them), and calls :func:`harness.runs.run.run`
restricted to its shard: realize the closure into the node's store (substituters first), start the services through
the broker the run's shards share on the node (:mod:`harness.runs.nodebroker`: one model
load per node), run the shard's episodes, record. The record is written on the node
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError
from harness.runs.groups import NodeTarget, group_label, standins_of

if TYPE_CHECKING:
    from harness.manifests.project import Project
    from harness.runs.livelog import ShardOutput

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
    #: the head's closure (:func:`harness.runs.closures.expected_closure`): the node checks
    #: its own against it before the first episode, and pulls the head's stand-ins
    expected_closure: dict[str, Any] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    #: where the shard appends its output as it comes (the head's run folder, on a filesystem
    #: both see: Slurm's), when the engine has no channel of its own (:mod:`harness.runs.livelog`)
    live_log: str | None = None
    #: where the shard hands its result to the head before its task waits for the other shards
    #: joined to the node broker it started (Slurm: :func:`keep_node_broker`), on that filesystem
    handover: str | None = None
    #: every target of each of the run's locks with its store paths
    #: (:func:`harness.runs.groups.expected_targets`): the node is proven against its own
    targets: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: the variant the run forced (``--variant`` on the head), else None: each node chooses
    variant: str | None = None


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


def run_shard(
    job: ShardJob, node: dict[str, Any] | None = None, send: Callable[[list[str]], None] | None = None
) -> dict[str, Any]:
    """Run ``job`` on this node and return its record (see the module docstring).

    ``node`` names the node as the engine knows it (Ray's node id, a Slurm host); the
    host name and ``HARNESS_HOME`` are added here.
    """
    from harness.runs.nodebroker import node_ports, node_state_dir, park_broker, unpark_broker

    home = node_home()
    facts = {
        "hostname": socket.gethostname(),
        "home": str(home),
        "pid": os.getpid(),
        "platform": node_platform(),
        **(node or {}),
    }
    folder = shard_dir(home, job.run_id, job.index)
    started = time.time()
    result: dict[str, Any] = {
        "index": job.index,
        "shard": f"{job.index}/{job.count}",
        "node": facts,
        "started": started,
        "record_dir": str(folder),
    }
    env = _shard_environment(job)
    lines: list[str] = []
    echo, output = _shard_echo(
        lines, send, folder, f"--- shard {job.index}/{job.count} on {facts['hostname']} ({home})"
    )
    # One broker per node for the run's shards there, on ports chosen once per node.
    shared = node_state_dir(home, job.run_id) if job.local_services else None
    try:
        with _environment(env), _sigint_unblocked():
            if shared is not None:  # the first shard here: its start-up overlaps what follows,
                park_broker(shared)  # and it starts nothing before the closure is checked
            ports = node_ports(shared, job.local_services) if shared is not None else {}
            from harness.runs.run import run

            state = NodeState(home, Path(job.deploy_path) if job.deploy_path else None, Path(job.project_root))
            job, targets = proven_against(job, f"node {facts['hostname']} ({home})", echo)
            if targets:
                result.update(targets={n: t.as_json() for n, t in targets.items()}, group=group_label(targets))
            take_head_standins(job, home, echo)
            refuse_foreseen(job, home)
            outcome = run(
                state,
                list(job.command),
                agent=job.agent,
                sets=job.sets,
                services=job.services,
                benchmark=job.benchmark,
                gpus=job.gpus,
                offline=job.offline,
                echo=echo,
                shard=(job.index, job.count),
                run_id=job.run_id,
                run_dir=folder,
                ports=ports,
                expected_closure=job.expected_closure or None,
                node_broker=shared,
            )
        result.update(_verdict(job, folder, outcome.exit_status, outcome.score))
        result["gpus"] = _gpus_of(folder)
        _note_broker_restarts(result, folder)
    except HarnessError as exc:
        from harness.runs.groups import TargetRefused
        from harness.runs.run import ClosureMismatch

        result["closure_refused"] = isinstance(exc, (ClosureMismatch, TargetRefused))
        hint = f" ({exc.hint})" if getattr(exc, "hint", None) else ""
        result.update(
            status="failed", exit_status=exc.exit_code, reason=f"on {facts['hostname']} ({home}): {exc.message}{hint}"
        )
    except KeyboardInterrupt:
        result.update(status="cancelled", exit_status=130, reason="interrupted before the command started")
    finally:
        if shared is not None:  # refused before it joined: the parked broker ends, having started nothing
            unpark_broker(shared)
    if output is not None:
        output.close()
    result["ended"] = time.time()
    result["output"] = lines
    result["files"] = _collect(folder)
    return result


def keep_node_broker(job: ShardJob, result: dict[str, Any], hand_over: Callable[[], None]) -> dict[str, Any]:
    """On Slurm, once the shard's run is over and recorded: while it started its node's broker
    and other shards of the run are joined to it, its task stays (its end would end the
    broker on a cgroup Slurm: :func:`harness.runs.nodebroker.hold_node_broker`), having first
    handed ``result`` to the head (``hand_over``). The result with what the record keeps of
    the wait (``held_broker_for``, ``held_broker_s``)."""
    if not job.local_services:
        return result  # no node broker
    from harness.runs.nodebroker import hold_node_broker, node_state_dir

    # The name the shard joined the broker under (harness/runs/run.py:_joined_name).
    held = hold_node_broker(
        node_state_dir(node_home(), job.run_id), f"shard {job.index}", os.getpid(), before=hand_over
    )
    return {**result, **held}


def _gpus_of(folder: Path) -> dict[str, Any] | None:
    """The GPUs the shard's engine gave it and those the node's broker used, as its run
    recorded them (:func:`harness.runs.nodebroker.gpu_use`); None without a node broker."""
    from harness.runs.record import read_json

    try:
        gpus = read_json(folder / "config.json").get("broker", {}).get("gpus")
    except HarnessError:
        return None
    return gpus if isinstance(gpus, dict) else None


def _note_broker_restarts(result: dict[str, Any], folder: Path) -> None:
    """The times the node's broker went away while the shard ran and the one it joined
    instead (:class:`harness.runs.nodebroker.BrokerWatch`), as its run recorded them; a shard
    that failed then names that as the cause."""
    from harness.runs.record import read_json

    try:
        restarts = read_json(folder / "config.json").get("broker", {}).get("restarts")
    except HarnessError:
        return
    if not isinstance(restarts, list) or not restarts:
        return
    result["broker_restarts"] = restarts
    if result.get("status") == "failed":
        told = "; ".join(str(r.get("reason")) for r in restarts if isinstance(r, dict))
        result["reason"] = f"{result.get('reason')}, after {told}"


def _shard_environment(job: ShardJob) -> dict[str, str]:
    """The variables the shard's run sees besides the node's: the run's forced variant and
    the head's caches and keys."""
    env = dict(job.extra_env)
    if job.variant:
        env["HARNESS_VARIANT"] = job.variant
    if job.substituters:
        env["HARNESS_SUBSTITUTERS"] = " ".join(job.substituters)
    if job.trusted_keys:
        env["HARNESS_TRUSTED_KEYS"] = " ".join(job.trusted_keys)
    return env


def _verdict(job: ShardJob, folder: Path, exit_status: int, score: float | None) -> dict[str, Any]:
    """The status, exit status, score and reason of a shard whose command ran: ``ok`` only if
    it exited 0 and, in a run of several shards, its benchmark said it ran this shard."""
    from harness.runs.record import read_json

    verdict: dict[str, Any] = {
        "exit_status": exit_status,
        "score": score,
        "status": "ok" if exit_status == 0 else "failed",
    }
    if exit_status == 130:
        verdict.update(status="cancelled", reason="interrupted")
    elif exit_status != 0:
        verdict["reason"] = f"the shard's command exited with {exit_status}"
    bench = folder / "benchmark.json"
    if verdict["status"] == "ok" and bench.is_file() and job.count > 1:
        said = read_json(bench).get("shard")
        if said != f"{job.index}/{job.count}":
            verdict.update(
                status="failed",
                reason=(
                    f"the benchmark ignored its shard (asked {job.index}/{job.count}, its benchmark.json "
                    f"says {said!r}): its worker must read --shard or HARNESS_SHARD"
                ),
            )
    return verdict


def _shard_echo(
    lines: list[str], send: Callable[[list[str]], None] | None, folder: Path, header: str
) -> tuple[Callable[[str], None], ShardOutput | None]:
    """Where the shard's progress lines go: its result's ``output``, and, given ``send``, the
    head as they come with the command's output (:mod:`harness.runs.livelog`)."""
    if send is None:
        return lines.append, None
    from harness.runs.livelog import ShardOutput

    output = ShardOutput(send, folder / "logs" / "command.log", header)

    def echo(line: str) -> None:
        lines.append(line)
        output.echo(line)

    return echo, output


def proven_against(job: ShardJob, here: str, echo: Callable[[str], None]) -> tuple[ShardJob, dict[str, NodeTarget]]:
    """The target of each of the run's locks this node runs (its platform, and the variant its
    driver, ``HARNESS_VARIANT`` or the run's forced one chooses: as realize chooses), and the
    job with the closure of those targets expected (:func:`harness.runs.groups.group_closure`).
    :class:`harness.runs.groups.TargetRefused` at once when a lock holds nothing for this node.
    A job without the table (a head before it) is the head's closure, unchanged."""
    from dataclasses import replace

    from packaging import tags

    from harness.lock.variants import driver_cuda, forced_variant
    from harness.runs.groups import choose_targets, group_closure

    if not job.targets:
        return job, {}
    chosen = choose_targets(
        job.targets,
        host_tags=[str(t) for t in tags.platform_tags()],
        driver=driver_cuda(),
        forced=forced_variant(),
        here=here,
    )
    expected = group_closure(job.expected_closure, job.targets, chosen)
    why = "; ".join(f"{name} {t.variant}: {t.reason}" for name, t in sorted(chosen.items()) if t.variant)
    echo(f"target: {group_label(chosen)}" + (f" ({why})" if why else ""))
    return replace(job, expected_closure=expected), chosen


def node_platform() -> str:
    """This node's operating system and machine (``linux-x86_64``), as the record keeps it."""
    import platform
    import sys

    return f"{sys.platform}-{platform.machine()}"


def head_standins(expected: dict[str, Any]) -> dict[str, str]:
    """Lock interpreter → the host copy that stood in for it on the head, from the head's
    closure (:func:`harness.runs.closures.expected_closure`). Pure."""
    return standins_of(expected)


def take_head_standins(job: ShardJob, home: Path, echo: Callable[[str], None]) -> list[str]:
    """Make the head's stand-in interpreters this node's, before anything is realized here.

    Where a host copy stood in for a lock's interpreter on the head, realize here would copy
    this node's own host interpreter (another content, so another name) and build every
    environment again on it: another closure, refused before the first episode. Instead the
    head's copy is pulled from the run's caches — an interpreter is a built path, so only
    with a signature by a trusted key — and noted as this store's stand-in
    (:func:`harness.store.standins.remember_standin`); realize then finds the environments
    built on it under the head's names, and pulls them too. The lock's own interpreter,
    once registered here, still wins (``harness/realize/standin.py``). Returns the lock
    interpreters whose stand-in is now the head's."""
    wanted = head_standins(job.expected_closure)
    urls = [
        url
        for url in job.substituters
        if not job.offline or not url.split("?", 1)[0].startswith(("http://", "https://", "s3://"))
    ]
    if not wanted or not urls:
        return []
    from harness.store.standins import remember_standin, standin_for
    from harness.store.store import Store

    store = Store.in_home(home)
    todo = {}
    for own, host in wanted.items():
        record = store.record(own)
        if (record is not None and not record.impure) or standin_for(store, own) == host:
            continue  # the lock's own interpreter is here (it wins), or the head's copy stands in already
        todo[own] = host
    if not todo:
        return []
    # The cache's code (its signatures, archives, backends) loads only when there is something
    # to pull: on a node that has the head's stand-ins already, the lookup above is all.
    from harness.cache.substitute import substitute

    substitute(
        store,
        sorted(set(todo.values())),
        substituters=urls,
        trusted_keys=list(job.trusted_keys),
        expected={},
        cache_dir=home / "cache",
        warn=lambda line: echo(f"warning: {line}"),
    )
    taken = []
    for own, host in sorted(todo.items()):
        if store.is_registered(host):
            remember_standin(
                store, own, host, f"the host copy the head of cluster run {job.run_id} computed with, from its cache"
            )
            echo(f"stand-in: the head's {host} stands in for {own} here (pulled from the run's cache)")
            taken.append(own)
    return taken


def refuse_foreseen(job: ShardJob, home: Path) -> None:
    """Refuse the shard before anything is realized when this node certainly cannot compute
    with the head's closure (:func:`harness.runs.closures.foreseen_differences`: another
    interpreter registered or standing in here, another lock file): nothing is built for a
    closure that would be refused after. Raises :class:`harness.runs.run.ClosureMismatch`."""
    from harness.runs.closures import NodeInterpreter, foreseen_differences
    from harness.runs.run import ClosureMismatch
    from harness.store.hashing import file_blake3
    from harness.store.standins import standin_for
    from harness.store.store import Store

    expected = job.expected_closure
    if not expected:
        return
    store = Store.in_home(home)
    interpreters = {}
    for own in head_standins(expected):
        record = store.record(own)
        interpreters[own] = NodeInterpreter(record is not None and not record.impure, standin_for(store, own))
    hashes = {}
    for name, info in (expected.get("locks") or {}).items():
        lock = Path(job.project_root) / str(info.get("lock") or f"locks/{name}.lock.toml")
        if info.get("lock") and lock.is_file():
            hashes[name] = file_blake3(lock)
    differences = foreseen_differences(expected, interpreters, hashes)
    if differences:
        raise ClosureMismatch(differences)


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
