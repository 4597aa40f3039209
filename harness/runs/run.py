"""``harness run``: realize, place and start what a run needs, run its command, record it.

Order matters for the audit: the record's ``config.json`` and ``lock.json`` are written
before the command starts, ``result.json`` in a ``finally`` after it ends, so a run that
fails, or is interrupted with SIGINT, still leaves a record with its exit status. The
broker runs in this process and stops every service it started when the run ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError
from harness.runs.record import (
    closure_of,
    command_launch,
    make_record_dir,
    new_record_dir,
    new_run_id,
    open_record_file,
    private_umask,
    read_json,
    run_config,
    runs_dir,
    service_launch,
    work_dir,
    write_json,
)

if TYPE_CHECKING:  # the models and the broker load only when a run starts
    from harness.runs.closures import Difference
    from harness.runs.nodebroker import BrokerWatch
    from harness.manifests.model import BenchmarkManifest
    from harness.runs.resets import RecordingBroker
    from harness.runtime.broker import SharedBroker
    from harness.runtime.launch import LaunchSpec
    from harness.runtime.session import Prepared, ProjectState
    from harness.store.roots import TempRoots
    from harness.store.store import Store

#: Where a run's progress lines go (``print``, ``click.echo`` to stderr, a shard's list).
Echo = Callable[[str], None]


@dataclass
class RunOutcome:
    run_id: str
    run_dir: Path
    exit_status: int
    score: float | None


@dataclass(frozen=True)
class _Command:
    """What the run starts once its services are up: the user's command or the worker."""

    argv: list[str]
    cwd: Path
    #: manifest name -> store path of the project code it runs, the benchmark worker's included
    code: dict[str, str]
    #: the benchmark's worker runs (no command was given)
    worker: bool


def run(
    state: ProjectState,
    command: list[str],
    *,
    agent: str | None,
    sets: tuple[str, ...],
    services: tuple[str, ...],
    benchmark: str | None,
    gpus: str | None,
    offline: bool,
    echo: Echo = print,
    shard: tuple[int, int] | None = None,
    run_id: str | None = None,
    run_dir: Path | None = None,
    ports: dict[str, int] | None = None,
    show_progress: bool = True,
    expected_closure: dict[str, Any] | None = None,
    node_broker: Path | None = None,
) -> RunOutcome:
    """Run ``command`` (or the benchmark's worker) with the closure's services; record it.

    A cluster shard (:mod:`harness.runs.cluster`) takes this same path with ``shard``
    (I, N), exported to the command as ``HARNESS_SHARD=I/N``, its record written to
    ``run_dir`` under the cluster run's id, and its services on ``ports`` free on its node,
    through the broker its run shares on the node (``node_broker``, its state folder:
    :mod:`harness.runs.nodebroker`), never the one of ``harness up``, whose ports are its own.
    With ``expected_closure`` (the head's, :func:`harness.runs.closures.expected_closure`),
    the closure realized here is compared with it before any service or the command starts:
    a difference is :class:`ClosureMismatch`, naming each one, and nothing is computed.
    """
    from harness.runtime.session import prepare
    from harness.store.store import Store

    started = time.time()
    run_id = run_id or new_run_id(started)
    run_dir = run_dir or runs_dir(state.home) / run_id
    # Writable by this user only, before anything goes in; gone again if the run is refused
    # before its record starts (a bad manifest, a simulator that does not answer).
    with new_record_dir(run_dir):
        prepared = prepare(
            state,
            agent=agent,
            sets=sets,
            services=services,
            benchmark=benchmark,
            gpus=gpus,
            offline=offline,
            state_dir=run_dir / "services",
            ports=ports,
            show_progress=show_progress,
        )
        simulator = _remote_simulator(prepared, echo)
        _announce(run_id, prepared, echo)
        store = Store.in_home(state.home)
        broker = _RunBroker(_shared_broker(state.home, prepared, shard, echo), node=node_broker)
        what = _what_to_run(prepared, store, command, run_dir)
        run_roots = _root_closure(store, prepared, what, run_id)
        config, closure = _record_start(
            run_dir, run_id, started, command, prepared, store, what, broker, agent, sets, shard, simulator
        )
    _let_sigint_interrupt()
    make_record_dir(run_dir / "logs")
    exit_status = 1  # if the launch check refuses, the run failed before anything started
    try:
        if expected_closure is not None:
            _check_expected(expected_closure, closure, echo)  # what lock.json now says
        exit_status = _start_and_run(prepared, store, what, broker, run_dir, config, shard, echo)
    except KeyboardInterrupt:
        exit_status = 130
        echo("interrupted: recording the run")
    finally:
        foreign = broker.foreign(prepared.specs)
        unknown = broker.stop(interrupted=exit_status == 130)
        if broker.restarts:  # the node's broker went away while the shard ran: the record says so
            config["broker"]["restarts"] = broker.restarts
            write_json(run_dir / "config.json", config)
        score = _record_result(run_dir, run_id, started, exit_status, [*prepared.impurities, *unknown], foreign)
        run_roots.close()  # the record's lock.json roots it now (the last N runs are kept)
    return RunOutcome(run_id, run_dir, exit_status, score)


class ClosureMismatch(HarnessError):
    """A shard's node realized another closure than the head's: refused before anything
    starts. ``differences`` names each one (:func:`harness.runs.closures.closure_differences`)."""

    def __init__(self, differences: list[Difference]) -> None:
        from harness.runs.closures import mismatch_message

        super().__init__(
            f"refusing to compute: {mismatch_message(differences)}",
            hint=(
                "nothing was started; the node must realize the head's exact store paths: push them to a "
                "cache it reads ([cache] substituters, signed by a key it trusts), or give it the same "
                "interpreter"
            ),
        )
        self.differences = differences


def _check_expected(expected: dict[str, Any], actual: dict[str, Any], echo: Echo) -> None:
    """Refuse (:class:`ClosureMismatch`) when ``actual`` (this run's ``lock.json``) is not
    ``expected`` (the head's); say so when it is."""
    from harness.runs.closures import closure_differences

    differences = closure_differences(expected, actual)
    if differences:
        raise ClosureMismatch(differences)
    echo(
        f"closure: the {len(expected.get('store_paths', []))} store paths expected of this node, "
        "with the head's content hashes where it has them"
    )


def _announce(run_id: str, prepared: Prepared, echo: Echo) -> None:
    """The run's services and benchmark, and the plan's notes."""
    echo(
        f"run {run_id}: services {', '.join(sorted(prepared.specs)) or '(none)'}"
        + (f", benchmark {prepared.benchmark}" if prepared.benchmark else "")
    )
    for note in prepared.plan.notes:
        echo(f"note: {note}")


def _remote_simulator(prepared: Prepared, echo: Echo) -> dict[str, Any] | None:
    """The record of the benchmark's simulator when it runs elsewhere (its address and what
    it reports itself to be, asked now), also named among the run's impurities; None when
    it runs here. Refuses a simulator without an address or one that does not answer."""
    from harness.runs.simulator import simulator_entry, simulator_impurity

    entry = simulator_entry(prepared.plan.simulator)
    if entry is not None:
        prepared.impurities = sorted({*prepared.impurities, simulator_impurity(entry)})
        reported = f", reporting {json.dumps(entry['reported'], sort_keys=True)}" if entry["reported"] else ""
        echo(f"simulator of {entry['benchmark']}: elsewhere, at {entry['url']}{reported}")
    return entry


def _shared_broker(home: Path, prepared: Prepared, shard: tuple[int, int] | None, echo: Echo) -> SharedBroker | None:
    """The broker of ``harness up`` for this project, when one runs (never for a shard).

    One broker per state folder: when `harness up` runs one for this project, the run uses
    its services (harness-managed, launched from the same store paths) instead of starting
    its own beside them."""
    from harness.runtime.broker import SharedBroker
    from harness.runtime.session import default_state_dir

    shared_dir = default_state_dir(home, prepared.project.root, prepared.deploy)
    shared = SharedBroker.find(shared_dir) if shard is None else None
    if shared is not None:
        shared.check_serves(prepared.specs, list(prepared.specs))
        echo(f"using the broker of harness up ({shared.url}, state {shared_dir})")
    return shared


def _what_to_run(prepared: Prepared, store: Store, command: list[str], run_dir: Path) -> _Command:
    """The command given, else the benchmark's worker (its project code realized as a store
    path), and where it starts: a command of the user's where they are, the worker where
    its manifest says."""
    from harness.realize.project_code import benchmark_worker_code

    project = prepared.project
    code = dict(prepared.code)
    benchmark, benchmark_manifest = prepared.benchmark, prepared.benchmark_manifest
    worker_code = None if command else benchmark_worker_code(store, project.root, benchmark, benchmark_manifest)
    if worker_code is not None:
        assert benchmark is not None
        code[benchmark] = worker_code
    argv = command or _benchmark_command(prepared, store, run_dir, worker_code)
    if not argv:
        raise HarnessError("nothing to run: give a COMMAND after --, or a benchmark with a worker")
    cwd = project.root if command else _worker_cwd(benchmark_manifest, project.root, store, run_dir, worker_code)
    return _Command(argv, cwd, code, worker=prepared.benchmark is not None and not command)


def _root_closure(store: Store, prepared: Prepared, what: _Command, run_id: str) -> TempRoots:
    """The run's closure rooted before it is read, for the whole run (however it ends: the
    kernel drops a dead process's roots). Realizing already rooted it for this process."""
    from harness.realize.builder import lock_objects
    from harness.store.roots import TempRoots

    run_roots = TempRoots(store, f"harness run {run_id}")
    run_roots.add([*(n for lock in prepared.locks.values() for n in lock_objects(lock)), *what.code.values()])
    return run_roots


def _record_start(
    run_dir: Path,
    run_id: str,
    started: float,
    command: list[str],
    prepared: Prepared,
    store: Store,
    what: _Command,
    broker: _RunBroker,
    agent: str | None,
    sets: tuple[str, ...],
    shard: tuple[int, int] | None,
    simulator: dict[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the record's ``config.json`` (what was asked, planned and launched, and the
    simulator elsewhere, :mod:`harness.runs.simulator`) and
    ``lock.json`` (the closure) before anything starts; return the config, whose command
    launch is filled in once the broker's address is known, and the closure as written."""
    project = prepared.project
    lock_files = {name: project.locks_dir / f"{name}.lock.toml" for name in prepared.locks}
    closure = closure_of(store, prepared.locks, lock_files, project.root, [], code=what.code)
    deploy_text = prepared.deploy_path.read_text() if prepared.deploy_path else None
    shared = broker.shared
    services = {name: service_launch(spec, store.root) for name, spec in sorted(prepared.specs.items())}
    if shared is not None:  # its services run with the environment `harness up` gave them
        for name, launch in services.items():
            seen = (shared.launches.get(name) or {}).get("environment")
            if isinstance(seen, dict):
                launch["environment"] = seen
    config = {
        **run_config(run_id, started, command, prepared, agent=agent, sets=sets),
        "argv": what.argv,
        "deploy": {"path": str(prepared.deploy_path), "text": deploy_text} if deploy_text else None,
        # Everything that shapes what the services and the command compute, as launched.
        "launch": {
            "services": services,
            "command": None,  # filled in by _start_and_run, once the broker's address is known
        },
        "broker": {
            "shared": shared is not None,
            "state_dir": str(shared.state_dir if shared else broker.node or run_dir / "services"),
        },
    }
    if broker.node is not None:  # the broker the run's shards share on this node
        config["broker"]["node"] = True
    if shard is not None:
        config["shard"] = f"{shard[0]}/{shard[1]}"
    if simulator is not None:
        config["simulator"] = simulator
    write_json(run_dir / "config.json", config)
    written = closure.as_json()
    write_json(run_dir / "lock.json", written)
    return config, written


def _let_sigint_interrupt() -> None:
    """Ctrl-C must stop the run and still record it, even when this process inherited an
    ignored SIGINT (background jobs of a non-interactive shell do)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _start_and_run(
    prepared: Prepared,
    store: Store,
    what: _Command,
    broker: _RunBroker,
    run_dir: Path,
    config: dict[str, Any],
    shard: tuple[int, int] | None,
    echo: Echo,
) -> int:
    """Check the launches, start the resident services, record the command's launch and
    run it; its exit status."""
    _check_launches(
        prepared,
        store,
        what.code.get(prepared.benchmark or "") if what.worker else None,
        run_dir / "services",
        worker=what.worker,
    )
    address, broker_env = broker.start(prepared, run_dir)
    if broker.node is not None and broker.shared is not None:  # which incarnation served the shard
        config["broker"].update(url=broker.shared.url, pid=broker.shared.pid, gpus=_node_gpus(broker.shared, echo))
    env = _command_env(broker_env, prepared, run_dir)
    if shard is not None:
        env["HARNESS_SHARD"] = f"{shard[0]}/{shard[1]}"
    config["launch"]["command"] = command_launch(what.argv, what.cwd, env, store.root)
    write_json(run_dir / "config.json", config)
    echo(f"broker {address}; running: {' '.join(what.argv)}")
    return _run_command(what.argv, env, what.cwd, run_dir / "logs" / "command.log", echo)


def _node_gpus(shared: SharedBroker, echo: Echo) -> dict[str, list[str]]:
    """The GPUs a cluster shard's engine gave it, and which of them the node's broker runs
    services on (:func:`harness.runs.nodebroker.gpu_use`); says so when some stay idle."""
    from harness.runs.nodebroker import gpu_use
    from harness.runtime.inventory import visible_devices

    use = gpu_use(visible_devices(os.environ), shared.launches)
    if use["idle"]:
        echo(
            f"note: GPU {', '.join(use['idle'])} given to this shard by its engine stay idle: the node's "
            f"broker serves the run's services on {', '.join(use['used']) or 'no GPU'} (placed by its first shard)"
        )
    return use


@dataclass
class _RunBroker:
    """The broker that serves the run: ``harness up``'s (``shared``), or one of the run's own,
    in this process, made by :meth:`start` and stopped by :meth:`stop`."""

    shared: SharedBroker | None
    own: RecordingBroker | None = None
    joined: Path | None = None  # the run's folder, once it joined the shared broker
    #: the state folder of the broker a cluster run's shards share on this node
    node: Path | None = None
    #: the shard's watch on that broker while its command runs, joining a new one should it go
    watch: BrokerWatch | None = None
    #: what the watch saw: each time the node's broker went away, and the one joined instead
    restarts: list[dict[str, Any]] = field(default_factory=list)

    def start(self, prepared: Prepared, run_dir: Path) -> tuple[str, dict[str, str]]:
        """Start the resident services (before the command starts); the broker's address
        and the variables that tell a client where it is."""
        from harness.runtime.broker import start_failure

        # A resident service that did not come up fails the run before its command starts,
        # naming the cause (a port's holder, an exit, a timeout): the command would only
        # meet the broker's refusal.
        hint = f"the command was not started; the run's record: {run_dir}"
        if self.node is not None:
            from harness.runs.nodebroker import COMMAND_WAIT_S, BrokerWatch, join_node_broker

            self.shared, env = join_node_broker(self.node, prepared, _joined_name(run_dir), os.getpid())
            self.joined = run_dir
            # Should the broker go (on Slurm, with the task of the shard that started it), the
            # shard joins a new one on the same URL, keeping its command's token.
            self.watch = BrokerWatch(
                self.node, prepared, _joined_name(run_dir), os.getpid(), self.shared, env["HARNESS_BROKER_TOKEN"]
            )
            # harness.client's acquires wait that long for it rather than fail meanwhile
            return self.shared.url, {**env, "HARNESS_BROKER_WAIT": f"{COMMAND_WAIT_S:g}"}
        if self.shared is not None:
            specs = prepared.specs
            residents = [p.name for p in prepared.plan.services if p.mode == "resident" and p.name in specs]
            # The command's leases are the run's: the broker watches them for scoped resets.
            env = self.shared.join_run(_joined_name(run_dir), os.getpid())
            self.joined = run_dir
            status = self.shared.start(residents, timeout=30.0 + sum(s.load_seconds for s in specs.values()))
            if status["broker"].get("up_errors"):
                raise start_failure(status["broker"]["up_errors"], hint=hint)
            return self.shared.url, env
        from harness.runs.resets import RESETS_FILE, RecordingBroker, ResetLog
        from harness.runtime.session import broker_options

        limits = broker_options(prepared.deploy)
        # Its leases are watched for resets of scoped services (harness/runs/resets.py).
        self.own = RecordingBroker(
            prepared.plan,
            prepared.specs,
            run_dir / "services",
            die_with_owner=True,
            lease_seconds=limits.get("lease_seconds"),
            gpu_wait_seconds=limits.get("gpu_wait_seconds", 120.0),
            resets=ResetLog(run_dir / RESETS_FILE),
        )
        address = self.own.serve_in_thread()
        results = self.own.start()  # resident services up before the command starts
        failed = {name: error for name, error in results.items() if error is not None}
        if failed:
            raise start_failure(failed, hint=hint)
        return address, self.own.client_env()

    def foreign(self, specs: Mapping[str, LaunchSpec]) -> list[str]:
        """The run's services whose port a foreign process answered on (never raises: the
        record matters more than this detail)."""
        try:
            shared = self.shared
            current = (
                self.own.status() if self.own is not None else shared.request("GET", "/status") if shared else None
            )
            return [s["name"] for s in (current or {}).get("services", []) if s.get("foreign") and s["name"] in specs]
        except Exception:  # the record matters more than this detail
            return []

    def stop(self, *, interrupted: bool = False) -> list[str]:
        """Stop the run's own broker and every service it started (``harness up``'s stays);
        a run that joined ``harness up``'s broker writes the resets it saw there. A node's
        broker stays for the run's next shard there, unless the run was interrupted and no
        shard is joined any more (:mod:`harness.runs.nodebroker`). Returns the impurities
        to record: resets that could not be read back, or went with a node's broker that
        went away while the shard was joined (:func:`harness.runs.nodebroker.lost_resets`)."""
        from harness.runs.report import EVENTS_FILE, write_events

        if self.own is not None:
            self.own.shutdown()
            try:  # the timeline of the run's report (harness report)
                write_events(self.own.state_dir.parent / EVENTS_FILE, self.own.events_since(0))
            except OSError:
                pass  # the record matters more than its timeline
        lost: list[str] = []
        if self.watch is not None:
            self.shared = self.watch.stop()
            self.restarts = list(self.watch.restarts)
            if self.restarts:  # the resets the node's old broker saw went with it
                from harness.runs.nodebroker import lost_resets

                lost = lost_resets(self.restarts, [p.name for p in self.watch.prepared.plan.services if p.scoped])
        if self.shared is None or self.joined is None:
            return lost
        from harness.runs.resets import RESETS_FILE, write_resets

        try:
            resets, events = self.shared.end_run(_joined_name(self.joined))
        except HarnessError as exc:
            return [*lost, f"the scoped resets of this run are unknown: {exc.message}"]
        finally:
            if self.node is not None and interrupted:
                from harness.runs.nodebroker import stop_if_unjoined

                stop_if_unjoined(self.shared)
        write_resets(self.joined / RESETS_FILE, resets)
        try:  # the timeline of the run's report: the shared broker's events while the run was joined
            write_events(self.joined / EVENTS_FILE, events)
        except OSError:
            pass  # the record matters more than its timeline
        return lost


def _joined_name(run_dir: Path) -> str:
    """The name a run joins a broker under: its id, or ``shard I`` of a cluster run's shard
    (one node's broker serves one run's shards)."""
    return f"shard {run_dir.name}" if run_dir.parent.name == "shards" else run_dir.name


def _record_result(
    run_dir: Path, run_id: str, started: float, exit_status: int, impurities: list[str], foreign: list[str]
) -> float | None:
    """Write the record's ``result.json`` (how the run ended); the benchmark's score."""
    from harness.runs.resets import RESETS_FILE, read_resets

    ended = time.time()
    score = _score(run_dir)
    impurities = list(impurities) + [
        f"{name}: its port answered before harness started it; a foreign process served the run" for name in foreign
    ]
    write_json(
        run_dir / "result.json",
        {
            "id": run_id,
            "started": started,
            "ended": ended,
            "duration_s": round(ended - started, 3),
            "exit_status": exit_status,
            "score": score,
            "impurities": impurities,
            "scoped_resets": read_resets(run_dir / RESETS_FILE),
        },
    )
    return score


def _check_launches(
    prepared: Prepared, store: Store, worker_code: str | None, state_dir: Path, *, worker: bool
) -> None:
    """Check every store path the run's services and benchmark worker start from before
    anything starts (:func:`harness.store.launchcheck.checked_launch`, logged in the run's
    ``services/launch-checks.jsonl``), so a changed path fails the run at once, naming its
    files. The supervisor checks a service again right before each start of its process."""
    from harness.runtime.session import launch_closure
    from harness.runtime.supervisor import make_state_dir
    from harness.store.launchcheck import IntegrityError, checked_launch

    make_state_dir(state_dir)  # the run's broker state: its owner's only, from the first file
    launches = {name: spec.closure for name, spec in sorted(prepared.specs.items())}
    if worker:
        assert prepared.benchmark is not None
        launches[prepared.benchmark] = launch_closure(store.root, prepared.locks[prepared.benchmark], worker_code)
    for name, closure in launches.items():
        try:
            checked_launch(state_dir, name, closure)
        except IntegrityError as exc:
            raise HarnessError(f"{name}: refusing to start the run: {exc.message}", hint=exc.hint) from None


def _worker_cwd(
    manifest: BenchmarkManifest | None, project_root: Path, store: Store, run_dir: Path, worker_code: str | None
) -> Path:
    """Where the benchmark's worker starts (its manifest's ``workdir``).

    ``"project"``: the store copy of the project files it names (the project's layout, so
    its relative paths resolve as in the project), else the project folder. ``"run"``: the
    run record's ``work/`` folder, made here, before the worker starts, by the user who runs
    it, so whatever the worker writes by relative path (a simulator client's results,
    videos, resume files) stays with the record and no two runs write into one folder.
    """
    if manifest is not None and manifest.workdir == "run":
        folder = work_dir(run_dir)
        # A retried cluster shard runs again in its record's folder on that node.
        return make_record_dir(folder)
    return store.root / worker_code if worker_code is not None else project_root


def _benchmark_command(prepared: Prepared, store: Store, run_dir: Path, worker_code: str | None) -> list[str]:
    """The benchmark's worker, its templates filled from its realized environment and
    ``{run}`` with the run record's folder. Started outside its code's store path
    (``workdir = "run"``), the project files it names by relative path are named there by
    absolute path instead, so it runs the same code from any folder."""
    manifest, benchmark = prepared.benchmark_manifest, prepared.benchmark
    if manifest is None or benchmark is None or not manifest.worker:
        return []
    lock = prepared.locks[benchmark]
    from harness.lock.storepaths import source_folders, weights_view_path
    from harness.runtime.launch import _expand, source_values

    view = weights_view_path(lock)
    remote = prepared.plan.simulator
    values = {
        "python": str(store.root / lock.environment.store / "bin" / "python"),
        "weights": str(store.root / view) if view else "",
        "port": "0",
        # A benchmark whose simulator runs elsewhere: its worker is the client, given the
        # simulator's address.
        "url": (remote.url or "") if remote is not None else "",
        "run": str(run_dir),
    }
    values.update(source_values(manifest, {i: store.root / f for i, f in enumerate(source_folders(lock))}))
    argv = [_expand(part, values, benchmark) for part in manifest.worker]
    if manifest.workdir == "run" and worker_code is not None:
        from harness.realize.project_code import project_file_parts

        for index in project_file_parts(prepared.project.root, list(manifest.worker)):
            argv[index] = str(store.root / worker_code / manifest.worker[index])
    return argv


def _command_env(broker_env: dict[str, str], prepared: Prepared, run_dir: Path) -> dict[str, str]:
    """The caller's environment plus where the broker (and its token), the run record, a
    simulator that runs elsewhere (``HARNESS_SIMULATOR_URL``) and each service are: ``HARNESS_SERVICE_<NAME>_URL`` and, for the same services,
    ``HARNESS_SERVICE_<NAME>_CLIENT``, the manifest's client table rendered as a lease
    carries it (JSON, sorted keys; ``{}`` when the manifest has none)."""
    env = dict(os.environ)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)  # the benchmark's own environment must not see ours
    env.update(broker_env)
    env["HARNESS_RUN_DIR"] = str(run_dir)
    if prepared.plan.simulator is not None and prepared.plan.simulator.url:
        env["HARNESS_SIMULATOR_URL"] = prepared.plan.simulator.url
    if prepared.skills:  # the skills on and their text: a dropped skill is absent from the prompt
        env["HARNESS_SKILLS"] = json.dumps(prepared.skills.get("text", {}), sort_keys=True)
    for placement in prepared.plan.services:
        prefix = "HARNESS_SERVICE_" + placement.name.upper().replace("-", "_").replace(".", "_")
        if placement.url:
            env[prefix + "_URL"] = placement.url
            # As the broker's lease gives it: a local service's from its launch spec, an
            # external one's from the plan (filled from its url alone).
            spec = prepared.specs.get(placement.name)
            client = spec.client if spec is not None else placement.client
            env[prefix + "_CLIENT"] = json.dumps(dict(client), sort_keys=True)
    return env


def _run_command(argv: list[str], env: dict[str, str], cwd: Path, log: Path, echo: Echo) -> int:
    """Run the command in its own process group, teeing its output to ``log``.

    The main thread only ever waits with a timeout, so SIGINT is handled at once even when
    the kernel delivers it to one of the broker's threads. SIGINT is passed on to the
    child's group and the run waits for it to end (a second SIGINT kills it), so its exit
    status is recorded either way.
    """
    import threading

    with open_record_file(log) as sink:
        try:
            # What the command writes into the record (``HARNESS_RUN_DIR``: its result, the
            # benchmark's files) is not the group's to change in a shared home either.
            with private_umask():
                proc = subprocess.Popen(
                    argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
                )
        except OSError as exc:
            sink.write(f"cannot start {argv[0]}: {exc}\n".encode())
            echo(f"cannot start {argv[0]}: {exc.strerror or exc}")
            return 127

        def tee() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                sink.write(line)
                sink.flush()
                sys.stdout.write(line.decode(errors="replace"))
                sys.stdout.flush()

        reader = threading.Thread(target=tee, name="command-output", daemon=True)
        reader.start()
        interrupted = False
        while True:
            try:
                code = proc.wait(timeout=0.2)
                reader.join(timeout=5)
                return _status(code) if not interrupted else (_status(code) or 130)
            except subprocess.TimeoutExpired:
                continue
            except KeyboardInterrupt:
                signal_to_send = signal.SIGKILL if interrupted else signal.SIGINT
                interrupted = True
                try:
                    os.killpg(proc.pid, signal_to_send)
                except ProcessLookupError:
                    pass


def _status(code: int) -> int:
    """A shell's exit status: 128 + N for a child killed by signal N."""
    return 128 - code if code < 0 else code


def _score(run_dir: Path) -> float | None:
    path = run_dir / "benchmark.json"
    if not path.is_file():
        return None
    try:
        value = read_json(path).get("success_rate")
    except HarnessError:
        return None
    return float(value) if isinstance(value, (int, float)) else None
