"""``harness run --cluster TARGET --shards N``: one run over many nodes, one record.

harness does not schedule; it hands shards to an engine people already operate:

* ``ray://HOST:PORT`` — a Ray cluster through Ray Client; ``ray`` — the cluster that
  ``RAY_ADDRESS`` names (``HOST:PORT`` of the head), else the one running on this machine;
* ``slurm`` — an array job through submitit (one task per shard); ``slurm-local`` runs the
  same array through submitit's local executor on this machine (for trying it out).

The head (this process) first does what a local run does up to the start of services: plan,
realize the closure into its own store, record ``config.json`` and ``lock.json``. Then it
pushes what the binary cache lacks of the closure (the first writable ``[cache]
substituters`` entry of the settings, signed with ``secret-key-file``), so every node can
realize from the cache. Each shard is then one engine task asking for the resources the plan
needs (a CPU, and a GPU for each GPU the plan places services on); on its node it runs
:func:`harness.runs.shard.run_shard` — the same code path as a local ``harness run``,
restricted to the shard — and returns its record.

The run's folder holds one record::

    runs/<id>/config.json          what was asked, the plan, the cluster and the push
    runs/<id>/lock.json            the closure the head realized and pushed
    runs/<id>/shards/<I>/          each shard's own record from its node (config, lock,
                                   result, benchmark.json, logs) and shard.json: node, home,
                                   closure digest, attempts, status and reason
    runs/<id>/benchmark.json       the shards' benchmark results combined
    runs/<id>/result.json          exit status, the combined score, one line per shard

Each node checks the closure it realized against the head's before its shard's first
episode and refuses, naming each difference (:mod:`harness.runs.shard`); a node that runs
another platform or accelerator variant of the locks than the head is checked against that
target's closure instead, computed by the head from the lock files (``config.json``'s
``cluster.targets``, :mod:`harness.runs.groups`), and the record groups the shards by target. ``harness audit
RUN`` judges every shard (:func:`harness.runs.audit.judge_shard`): a shard refused at
launch, refused for another closure, failed, cancelled or lost fails the audit, naming its
node and home; ``harness diff`` compares engines, shard counts, retries and each shard's
status, score, platform and closure. Faults: a shard whose node dies is
retried by the engine on another node and ``shard.json`` lists every attempt; Ctrl-C
cancels every shard (each stops its services and records itself, as a local run does); a
shard whose node cannot realize fails with the node's reason, and the run exits 1.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness.errors import HarnessError, InputError
from harness.runs.closures import closure_digest, expected_closure
from harness.runs.record import make_record_dir, read_json, write_json
from harness.runs.shard import ShardJob, keep_node_broker, node_home, run_shard

if TYPE_CHECKING:
    from submitit import AutoExecutor

    from harness.config import Settings
    from harness.runs.run import RunOutcome
    from harness.runs.slurmstates import SlurmStates
    from harness.runtime.plan import Plan
    from harness.manifests.project import ProjectState
    from harness.runtime.session import Prepared
    from harness.store.store import Store

Echo = Callable[[str], None]

#: How long cancelled shards get to stop their services and record themselves.
CANCEL_GRACE_S = 60.0


@dataclass(frozen=True)
class Target:
    """Where shards run: ``engine`` is ``ray``, ``slurm`` or ``slurm-local``."""

    engine: str
    address: str | None = None

    def describe(self) -> str:
        return f"{self.engine} {self.address}" if self.address else self.engine


def parse_target(text: str) -> Target:
    """``--cluster`` as given; anything else is an :class:`InputError` listing the forms."""
    if text.startswith("ray://"):
        if len(text) <= len("ray://"):
            raise InputError("--cluster ray://: give the head's address, ray://HOST:PORT")
        return Target("ray", text)
    if text == "ray":
        return Target("ray", os.environ.get("RAY_ADDRESS") or None)
    if text in ("slurm", "slurm-local"):
        return Target(text)
    raise InputError(
        f"--cluster {text!r}: unknown cluster",
        hint="use ray://HOST:PORT, ray (RAY_ADDRESS or the local Ray), slurm or slurm-local",
    )


def shard_resources(plan: Plan) -> tuple[float, int]:
    """(CPUs, GPUs) one shard asks its engine for: a CPU for the broker and the worker, and
    each GPU the plan places local services or simulator workers on."""
    gpus = {p.gpu for p in plan.services if p.gpu is not None and p.mode in ("resident", "on_demand")}
    gpus |= {w.gpu for w in plan.sim_workers}
    return 1.0, len(gpus)


#: Called with each shard's result as it comes back, so the head records it at once.
OnResult = Callable[[dict[str, Any]], None]


class Engine(Protocol):
    """What runs the shards (:class:`RayEngine`, :class:`SubmititEngine`): one result per
    shard that reported, each also handed to ``on_result`` as it comes back (the head writes
    it into the run's folder then, so a head that dies leaves every finished shard on disk);
    a ``KeyboardInterrupt`` carrying ``results`` when cancelled."""

    def run(
        self,
        jobs: list[ShardJob],
        *,
        cpus: float,
        gpus: int,
        retries: int,
        folder: Path,
        echo: Echo,
        on_result: OnResult,
    ) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class ClusterAsk:
    """What a cluster run was asked for, as every shard repeats it on its node."""

    command: tuple[str, ...]
    agent: str | None
    sets: tuple[str, ...]
    services: tuple[str, ...]
    benchmark: str | None
    offline: bool


@dataclass(frozen=True)
class HeadClosure:
    """What the head realized for the run: its closure (``lock.json``) and that closure's digest."""

    closure: dict[str, Any]
    digest: str
    #: every target of each lock with its store paths (:func:`harness.runs.groups.expected_targets`)
    targets: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


# ------------------------------------------------------------------------------ the head


def run_on_cluster(
    state: ProjectState,
    command: list[str],
    *,
    cluster: str,
    shards: int,
    retries: int = 3,
    agent: str | None,
    sets: tuple[str, ...],
    services: tuple[str, ...],
    benchmark: str | None,
    gpus: str | None,
    offline: bool,
    echo: Echo = print,
    show_progress: bool = True,
    slurm: tuple[str, ...] = (),
) -> RunOutcome:
    """Run ``command`` (or the benchmark's worker) in ``shards`` shards on ``cluster``.
    ``slurm``: ``--slurm KEY=VALUE`` items (:mod:`harness.runs.slurm`), for a Slurm target.

    Returns a :class:`harness.runs.run.RunOutcome` for the whole run: exit 0 when every
    shard succeeded, 130 when cancelled, else 1; the score combined over the shards.
    """
    from harness.config import load_settings
    from harness.runs.detach import detached_run_id
    from harness.runs.record import new_record_dir, new_run_id, runs_dir
    from harness.runs.run import RunOutcome
    from harness.runs.simulator import simulator_entry, simulator_impurity

    _check_counts(shards, retries)
    target = parse_target(cluster)
    engine = open_engine(target)  # a missing extra is an error before anything is realized
    check_slurm_given(target, slurm)
    ask = ClusterAsk(tuple(command), agent, tuple(sets), tuple(services), benchmark, offline)
    started = time.time()
    run_id = detached_run_id() or new_run_id(started)  # a detached head's was chosen before it started
    run_dir = runs_dir(state.home) / run_id
    # ``gpus``: one node's GPUs (the node kind), which the head plans for; each node still
    # plans its own shard from its own inventory, and proves the same closure.
    # Writable by this user only, before anything goes in; gone again if the run is refused
    # before its record starts (a bad manifest, a cache the closure cannot be pushed to).
    with new_record_dir(run_dir):
        prepared, store, head = prepare_head(state, ask, run_dir, gpus=gpus, show_progress=show_progress)
        note_node_kind(prepared.plan, gpus, echo)
        simulator = simulator_entry(prepared.plan.simulator)  # elsewhere: its address and identity
        if simulator is not None:
            prepared.impurities = sorted({*prepared.impurities, simulator_impurity(simulator)})
        settings = head_settings(load_settings(state.home, prepared.project.root))
        _announce(run_id, shards, target, prepared, echo)
        pushed = push_closure(store, [e["path"] for e in head.closure["store_paths"]], settings, state.home, echo)
        config = _cluster_config(run_id, started, prepared, ask, target, shards, retries, pushed, head.digest)
        config["cluster"]["node_gpus"] = gpus  # what --resume plans the head for again
        use_slurm_options(engine, config, prepared, slurm)
        config["cluster"].update(group_config(head))
        config["cluster"]["cache_gaps"] = note_cache_gaps(head.targets, pushed, echo)
        if simulator is not None:
            config["simulator"] = simulator
        write_json(run_dir / "config.json", config)
        write_json(run_dir / "lock.json", head.closure)
    jobs = shard_jobs(run_id, shards, prepared, ask, settings, pushed, head)
    outcome = run_shards(engine, jobs, config, run_dir, store, head, run_id, echo)
    report_shards(outcome, echo)
    return RunOutcome(run_id, run_dir, outcome["exit_status"], outcome["score"])


def note_node_kind(plan: Plan, gpus: str | None, echo: Echo) -> None:
    """Say so when the head planned the run without a GPU because it has none: its shards
    then ask their engine for no GPU, and services that need one are off."""
    if gpus is None and not plan.gpus:
        echo(
            "note: the head has no GPU, so the run is planned without one (each shard asks its engine "
            "for none; services that need one are off): give --gpus SPEC, one node's GPUs, to plan for the nodes"
        )


def check_slurm_given(target: Target, given: tuple[str, ...]) -> None:
    """``--slurm`` is for a Slurm target, and its items are checked before anything is realized."""
    from harness.runs.slurm import slurm_options

    if given and not target.engine.startswith("slurm"):
        raise InputError(f"--slurm applies to --cluster slurm (or slurm-local), not {target.describe()}")
    slurm_options(None, given)


def use_slurm_options(engine: Engine, config: dict[str, Any], prepared: Prepared, given: tuple[str, ...]) -> None:
    """The deploy's ``[slurm]`` with ``--slurm`` over it, recorded in ``config.json`` and
    handed to a submitit engine (``--resume`` hands it the recorded ones)."""
    from harness.runs.slurm import slurm_options

    if not isinstance(engine, SubmititEngine):
        return
    deploy = getattr(prepared.deploy, "slurm", None)
    options = slurm_options(deploy.model_dump(exclude_none=True) if deploy is not None else None, given)
    config["cluster"]["slurm"] = options
    engine.options = options


def prepare_head(
    state: ProjectState, ask: ClusterAsk, run_dir: Path, *, gpus: str | None, show_progress: bool
) -> tuple[Prepared, Store, HeadClosure]:
    """What the head does of a local run before services start: plan, realize into its own
    store, and name the closure the shards must compute with."""
    from harness.runtime.session import prepare
    from harness.store.store import Store

    prepared = prepare(
        state,
        agent=ask.agent,
        sets=ask.sets,
        services=ask.services,
        benchmark=ask.benchmark,
        gpus=gpus,
        offline=ask.offline,
        state_dir=run_dir / "services",
        show_progress=show_progress,
    )
    store = Store.in_home(state.home)
    return prepared, store, _head_closure(store, prepared, list(ask.command))


def _check_counts(shards: int, retries: int) -> None:
    if shards < 1:
        raise InputError(f"--shards {shards}: need at least 1")
    if retries < 0:
        raise InputError(f"--retries {retries}: need 0 or more")


def _head_closure(store: Store, prepared: Prepared, command: list[str]) -> HeadClosure:
    """The closure the head realized: the services' and the benchmark's locks and the project
    code they run (the benchmark's worker code when no command is given). Raises when there
    is nothing to run."""
    from harness.realize.project_code import benchmark_worker_code
    from harness.runs.record import closure_of

    project = prepared.project
    code = dict(prepared.code)
    if not command and (
        worker_code := benchmark_worker_code(store, project.root, prepared.benchmark, prepared.benchmark_manifest)
    ):
        assert prepared.benchmark is not None
        code[prepared.benchmark] = worker_code
    worker = list(prepared.benchmark_manifest.worker or []) if prepared.benchmark_manifest else []
    if not command and not worker:
        raise HarnessError("nothing to run: give a COMMAND after --, or a benchmark with a worker")
    lock_files = {name: project.locks_dir / f"{name}.lock.toml" for name in prepared.locks}
    closure = closure_of(store, prepared.locks, lock_files, project.root, [], code=code).as_json()
    return HeadClosure(closure, closure_digest(closure), run_targets(lock_files, closure))


def run_targets(lock_files: dict[str, Path], closure: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every target of each of the run's locks (read as written) with the store paths it
    realizes to: what each node is proven against (``harness/runs/groups.py``)."""
    from harness.lock.lockfile import read
    from harness.runs.groups import expected_targets

    return expected_targets({name: read(path, whole=True) for name, path in lock_files.items()}, closure)


def head_settings(settings: Settings) -> Settings:
    """The settings the shards get; a malformed trusted key is the head's error, not N nodes'."""
    from harness.cache.signing import parse_trusted

    parse_trusted(settings.trusted_keys)
    return settings


def _announce(run_id: str, shards: int, target: Target, prepared: Prepared, echo: Echo) -> None:
    echo(
        f"run {run_id}: {shards} shards on {target.describe()}; services "
        f"{', '.join(sorted(prepared.specs)) or '(none)'}"
        + (f", benchmark {prepared.benchmark}" if prepared.benchmark else "")
    )


def _cluster_config(
    run_id: str,
    started: float,
    prepared: Prepared,
    ask: ClusterAsk,
    target: Target,
    shards: int,
    retries: int,
    pushed: dict[str, Any],
    digest: str,
) -> dict[str, Any]:
    """The run's ``config.json``: a local run's, with the deploy's text and the cluster."""
    from harness.runs.record import run_config

    cpus, gpu_count = shard_resources(prepared.plan)
    return {
        **run_config(run_id, started, list(ask.command), prepared, agent=ask.agent, sets=ask.sets),
        "deploy": (
            {"path": str(prepared.deploy_path), "text": prepared.deploy_path.read_text()}
            if prepared.deploy_path
            else None
        ),
        "cluster": {
            "engine": target.engine,
            "address": target.address,
            "shards": shards,
            "retries": retries,
            "resources": {"cpus": cpus, "gpus": gpu_count},
            "push": pushed,
            "closure_digest": digest,
            # what was asked, as ``harness run --resume`` asks it again
            "ask": {
                "command": list(ask.command),
                "agent": ask.agent,
                "sets": list(ask.sets),
                "services": list(ask.services),
                "benchmark": ask.benchmark,
                "offline": ask.offline,
            },
        },
    }


def group_config(head: HeadClosure) -> dict[str, Any]:
    """What ``config.json``'s ``cluster`` says of targets: the table the shards were given
    (``targets``), the head's own group (``group``) and the variant the run forced
    (``variant``: ``--variant``, ``HARNESS_VARIANT`` or the deploy's), which ``--resume`` forces again."""
    from harness.lock.variants import forced_variant
    from harness.runs.groups import group_label, recorded_targets

    return {"targets": head.targets, "group": group_label(recorded_targets(head.closure)), "variant": forced_variant()}


def shard_jobs(
    run_id: str,
    shards: int,
    prepared: Prepared,
    ask: ClusterAsk,
    settings: Settings,
    pushed: dict[str, Any],
    head: HeadClosure,
) -> list[ShardJob]:
    """One job per shard: what the node runs, and the closure it must compute with."""
    from harness.lock.variants import forced_variant

    local = tuple(p.name for p in prepared.plan.services if p.mode in ("resident", "on_demand"))
    return [
        ShardJob(
            run_id=run_id,
            index=i,
            count=shards,
            project_root=str(prepared.project.root),
            deploy_path=str(prepared.deploy_path.resolve()) if prepared.deploy_path else None,
            command=ask.command,
            agent=ask.agent,
            sets=ask.sets,
            services=ask.services,
            benchmark=ask.benchmark,
            gpus=None,
            offline=ask.offline,
            substituters=tuple(settings.substituters) if pushed.get("cache") else (),
            trusted_keys=tuple(settings.trusted_keys),
            local_services=local,
            expected_digest=head.digest,
            expected_closure=expected_closure(head.closure),
            targets=head.targets,
            variant=forced_variant(),
        )
        for i in range(shards)
    ]


def run_shards(
    engine: Engine,
    jobs: list[ShardJob],
    config: dict[str, Any],
    run_dir: Path,
    store: Store,
    head: HeadClosure,
    run_id: str,
    echo: Echo,
) -> dict[str, Any]:
    """Hand the jobs to the engine, record each shard as it comes back and the whole run at
    the end (also when cancelled), the closure rooted against ``harness store gc`` meanwhile,
    as in a local run."""
    from harness.store.roots import TempRoots

    run_roots = TempRoots(store, f"harness run {run_id} (cluster head)")
    run_roots.add(e["path"] for e in head.closure["store_paths"])
    cpus, gpus = config["cluster"]["resources"]["cpus"], config["cluster"]["resources"]["gpus"]
    recorded: set[int] = set()

    def on_result(result: dict[str, Any]) -> None:
        record_shard(run_dir, config, result)
        recorded.add(int(result["index"]))

    interrupted = False
    results: list[dict[str, Any]] = []
    # Ctrl-C must cancel the shards even when this process inherited an ignored SIGINT (as
    # background jobs of a non-interactive shell do), as in a local run.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        results = engine.run(
            jobs,
            cpus=cpus,
            gpus=gpus,
            retries=config["cluster"]["retries"],
            folder=run_dir / "engine",
            echo=echo,
            on_result=on_result,
        )
    except KeyboardInterrupt as exc:  # the engine cancelled what it could; record what came back
        interrupted = True
        results = list(getattr(exc, "results", []))
    finally:
        try:
            for result in results:  # any the engine did not hand over as it came back
                if int(result["index"]) not in recorded:
                    record_shard(run_dir, config, result)
            outcome = record_cluster_run(run_dir, config, interrupted=interrupted)
        finally:
            run_roots.close()
    return outcome


def report_shards(outcome: dict[str, Any], echo: Echo) -> None:
    for shard in outcome["shards"]:
        retried = f", after {len(shard['attempts']) - 1} retries" if len(shard.get("attempts", [])) > 1 else ""
        why = f": {shard['reason']}" if shard.get("reason") else ""
        echo(f"shard {shard['shard']} on {shard.get('hostname') or '?'}: {shard['status']}{retried}{why}")


def push_closure(store: Store, names: Sequence[str], settings: Settings, home: Path, echo: Echo) -> dict[str, Any]:
    """Push what the first writable substituter lacks of ``names``; what was done, as JSON.

    No substituter, or none writable: nodes realize from upstream (noted, not an error).
    """
    from harness.cache.backends import open_backend
    from harness.cache.signing import load_secret
    from harness.cache.transfer import push

    for url in settings.substituters:
        backend = open_backend(url)
        if backend.writable:
            break
    else:
        echo("note: no writable binary cache in the settings ([cache] substituters): every node realizes from upstream")
        return {"cache": None}
    secret = load_secret(settings.secret_key_file) if settings.secret_key_file else None
    if secret is None:
        echo("warning: no [cache] secret-key-file: built paths go up unsigned, and nodes refuse them")
    started = time.time()
    result = push(store, list(names), backend, secret=secret, cache_dir=home / "cache")
    echo(f"pushed {len(result.pushed)} store paths to {backend.url} ({len(result.present)} already there)")
    return {
        "cache": backend.url,
        "pushed": len(result.pushed),
        "present": len(result.present),
        "uploaded_bytes": result.uploaded_bytes,
        "signed": secret is not None,
        "seconds": round(time.time() - started, 3),
    }


def note_cache_gaps(table: dict[str, list[dict[str, Any]]], pushed: dict[str, Any], echo: Echo) -> list[dict[str, Any]]:
    """Before any shard starts: which targets of the run's locks (other variants and platforms
    than the head's) the cache the head pushed to lacks, one note each (``runs/groups.py:
    cache_gaps``); recorded in ``config.json``. Nothing without a cache."""
    from harness.cache.backends import open_backend
    from harness.cache.transfer import present_in
    from harness.runs.groups import cache_gaps, gap_note

    url = pushed.get("cache")
    if not url:
        return []
    paths = [str(p) for entries in table.values() for e in entries for p in e.get("paths") or []]
    try:
        present = present_in(open_backend(url), paths)
    except HarnessError as exc:
        echo(f"note: cannot tell which targets cache {url} holds: {exc.message}")
        return []
    gaps = cache_gaps(table, present)
    for gap in gaps:
        echo(f"note: {gap_note(gap, url)}")
    return gaps


# --------------------------------------------------------------------------- the record


def record_shard(run_dir: Path, config: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Write one shard's record under ``shards/<I>/`` as it comes back: its files and logs,
    then ``shard.json`` (node, home, group, closure digest, attempts, status, reason), each
    file written whole or not at all. A shard that says ``ok`` but recorded another closure
    than its group's (:func:`shard_verdict`) is ``failed``, naming the differences. Returns the
    summary."""
    count = int(config["cluster"]["shards"])
    index = int(result["index"])
    folder = run_dir / "shards" / str(index)
    for rel, text in (result.get("files") or {}).items():
        write_text_atomic(folder / rel, text)
    if result.get("output"):
        write_text_atomic(folder / "logs" / "shard.log", "\n".join(result["output"]) + "\n")
    theirs = read_json(folder / "lock.json") if (folder / "lock.json").is_file() else None
    shard_digest = closure_digest(theirs) if theirs is not None else None
    node = result.get("node") or {}
    head_lock = read_json(run_dir / "lock.json") if (run_dir / "lock.json").is_file() else {}
    group, expected_digest, wrong = shard_verdict(config["cluster"], head_lock, theirs, result.get("targets"))
    summary = {
        "index": index,
        "shard": f"{index}/{count}",
        "status": result.get("status", "lost"),
        "reason": result.get("reason"),
        "exit_status": result.get("exit_status"),
        "score": result.get("score"),
        "hostname": node.get("hostname"),
        "node_id": node.get("node_id"),
        "home": node.get("home"),
        "platform": node.get("platform"),
        # the targets of the run's locks the node ran, and the store paths expected of them
        "group": group,
        "targets": result.get("targets"),
        "expected_digest": expected_digest,
        "closure_digest": shard_digest,
        # the node refused to compute: its closure was not its group's (harness/runs/shard.py)
        "closure_refused": bool(result.get("closure_refused")),
        "same_closure": not wrong if shard_digest else None,
        "attempts": result.get("attempts") or ([node] if node else []),
        "started": result.get("started"),
        "ended": result.get("ended"),
        # the GPUs its engine gave it, those the node's broker ran services on, the rest idle
        "gpus": result.get("gpus"),
    }
    if result.get("broker_restarts"):  # its node's broker went away while it ran (harness/runs/nodebroker.py)
        summary["broker_restarts"] = result["broker_restarts"]
    # Slurm: its task stayed after its run, for the shards joined to the node broker it started
    for key in ("held_broker_for", "held_broker_s", "held_broker_stopped"):
        if result.get(key) is not None:
            summary[key] = result[key]
    if summary["status"] == "ok" and (wrong or shard_digest is None):
        summary.update(
            status="failed",
            reason=(
                f"node {node.get('hostname')} ({node.get('home')}) computed with another closure "
                f"({shard_digest}) than its group's ({group}, expected {expected_digest})"
                + (f": {wrong}" if wrong else "")
            ),
        )
    write_json(folder / "shard.json", summary)
    return summary


def shard_verdict(
    cluster: dict[str, Any], head_lock: dict[str, Any], theirs: dict[str, Any] | None, reported: object
) -> tuple[str, str, str]:
    """(group, digest of the store paths expected of it, what is wrong: "" when nothing) of a
    shard whose ``lock.json`` is ``theirs`` (None: none), judged against the closure of the
    targets it ran (:func:`harness.runs.groups.shard_expectation`). Pure."""
    from harness.lock.targets import paths_digest
    from harness.runs.closures import closure_differences
    from harness.runs.groups import shard_expectation

    expectation = shard_expectation(cluster, head_lock, theirs, reported if isinstance(reported, dict) else None)
    expected_digest = paths_digest(str(e["path"]) for e in expectation.expected.get("store_paths", []))
    if expectation.problems:
        return expectation.group, expected_digest, "; ".join(expectation.problems)
    differences = closure_differences(expectation.expected, theirs) if theirs is not None else []
    named = "; ".join(d.told("expected", "there") for d in differences[:5])
    return expectation.group, expected_digest, named


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a temporary file renamed over it)."""
    import tempfile

    make_record_dir(path.parent)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def record_cluster_run(run_dir: Path, config: dict[str, Any], *, interrupted: bool) -> dict[str, Any]:
    """The run's ``result.json`` and combined ``benchmark.json`` from every shard's
    ``shard.json`` on disk (written by :func:`record_shard` as each came back, this session
    or an earlier one of ``--resume``); a shard with none is recorded ``cancelled`` (when
    interrupted) or ``lost``. ``groups`` gathers the shards by the targets they ran."""
    from harness.runs.groups import shard_groups

    count = int(config["cluster"]["shards"])
    summaries = []
    benches = []
    for index in range(count):
        folder = run_dir / "shards" / str(index)
        if (folder / "shard.json").is_file():
            summary = read_json(folder / "shard.json")
        else:
            summary = {
                "index": index,
                "shard": f"{index}/{count}",
                "status": "cancelled" if interrupted else "lost",
                "reason": "cancelled before it reported" if interrupted else "no result came back",
                "attempts": [],
            }
            write_json(folder / "shard.json", summary)
        summaries.append(summary)
        if (folder / "benchmark.json").is_file() and summary["status"] == "ok":
            benches.append(read_json(folder / "benchmark.json"))
    combined = combine_benchmarks(benches, count)
    if combined is not None:
        write_json(run_dir / "benchmark.json", combined)
    all_ok = all(s["status"] == "ok" for s in summaries)
    exit_status = 130 if interrupted else (0 if all_ok else 1)
    score = combined["success_rate"] if combined is not None and all_ok else None
    if score is None and all_ok:
        scores = [s["score"] for s in summaries if isinstance(s.get("score"), (int, float))]
        score = sum(scores) / len(scores) if len(scores) == len(summaries) and scores else None
    ended = time.time()
    impurities = list(config.get("impurities", []))
    for folder in sorted((run_dir / "shards").glob("*/result.json")):
        impurities += [i for i in read_json(folder).get("impurities", []) if i not in impurities]
    result_json = {
        "id": config["id"],
        "started": config["started"],
        "ended": ended,
        "duration_s": round(ended - config["started"], 3),
        "exit_status": exit_status,
        "score": score,
        "impurities": impurities,
        "shards": summaries,
        "groups": shard_groups(summaries),
    }
    write_json(run_dir / "result.json", result_json)
    return result_json


def combine_benchmarks(benches: list[dict[str, Any]], count: int) -> dict[str, Any] | None:
    """One ``benchmark.json`` from the shards' (all of them, or None): episodes and
    successes summed, episode results merged in episode order."""
    if len(benches) != count or not benches:
        return None
    if not all(isinstance(b.get("episodes"), int) and isinstance(b.get("successes"), int) for b in benches):
        return None
    episodes = sum(b["episodes"] for b in benches)
    successes = sum(b["successes"] for b in benches)
    merged = sorted((e for b in benches for e in b.get("episode_results", [])), key=lambda e: e.get("episode", 0))
    first = benches[0]
    return {
        "benchmark": first.get("benchmark"),
        "seed": first.get("seed"),
        "shards": count,
        "episodes": episodes,
        "successes": successes,
        "success_rate": successes / episodes if episodes else 0.0,
        "episode_results": merged,
    }


# ------------------------------------------------------------------------------ engines


def open_engine(target: Target) -> Engine:
    """The engine for ``target``; a missing optional extra is an error saying what to install."""
    if target.engine == "ray":
        return RayEngine(target.address)
    return SubmititEngine(local=target.engine == "slurm-local")


#: Tries of ``ray.init`` when the cluster's client server fails to start for this driver.
_RAY_CONNECT_TRIES = 3


def ray_reason(exc: BaseException) -> str:
    """Ray's connection error as one or two lines: its own message without the server-side
    traceback Ray appends (``Initialization failure from server:`` and a Python traceback of
    its client server), whose last line is what went wrong. Pure."""
    lines = [line.rstrip() for line in str(exc).strip().splitlines() if line.strip()]
    if "Traceback (most recent call last):" not in (line.strip() for line in lines):
        return " ".join(line.strip() for line in lines) or type(exc).__name__
    start = next(i for i, line in enumerate(lines) if line.strip() == "Traceback (most recent call last):")
    head = " ".join(line.strip() for line in lines[:start])
    return f"{head} {lines[-1].strip()}".strip()


class RayEngine:
    """Shards as Ray tasks: resources per shard, ``max_retries`` for dead nodes, cancel on Ctrl-C."""

    def __init__(self, address: str | None) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise HarnessError(
                "--cluster ray needs Ray, which is not installed",
                hint="pip install -e '.[ray]' from the checkout (on the head and on every node)",
            ) from None
        self.address = address

    def _connect(self, ray: Any, level: int) -> None:
        """``ray.init`` at the address; a few tries when the cluster answered but its client
        server for this driver did not start (Ray starts one process per ``ray://`` client, and
        on a busy head that start can fail once). Anything else is reported at once."""
        import time

        for attempt in range(_RAY_CONNECT_TRIES):
            try:
                ray.init(
                    address=self.address or "auto", log_to_driver=False, logging_level=level, configure_logging=False
                )
                return
            except (ConnectionError, RuntimeError, ValueError) as exc:
                # Ray's proxier failing to start this driver's client server (it reports that
                # server's traceback: a psutil.ZombieProcess on a busy head, seen in CI) is
                # worth the same few tries; a permanent failure costs them 6 s more.
                transient = any(s in str(exc) for s in ("client server failed", "Initialization failure from server"))
                if transient and attempt + 1 < _RAY_CONNECT_TRIES:
                    ray.shutdown()
                    time.sleep(2.0 * (attempt + 1))
                    continue
                raise HarnessError(
                    f"cannot reach the Ray cluster at {self.address or 'RAY_ADDRESS/auto'}: {ray_reason(exc)}",
                    hint="start one with `ray start --head`, or give --cluster ray://HOST:PORT",
                ) from None

    def run(
        self,
        jobs: list[ShardJob],
        *,
        cpus: float,
        gpus: int,
        retries: int,
        folder: Path,
        echo: Echo,
        on_result: OnResult,
    ) -> list[dict[str, Any]]:
        import logging

        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._connect(ray, logging.WARNING)
        try:
            here = ray.get_runtime_context().get_node_id()
            # The ledger of attempts lives on the head's node, so a dying node cannot take it along.
            ledger = (
                ray.remote(num_cpus=0)(Ledger)
                .options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
                .remote()
            )
            # SPREAD: shards go to as many nodes as have room, rather than packing the first.
            task = ray.remote(_ray_shard).options(
                num_cpus=cpus, num_gpus=gpus, max_retries=retries, retry_exceptions=False, scheduling_strategy="SPREAD"
            )
            refs = {task.remote(job, ledger): job.index for job in jobs}
            try:
                return self._wait(refs, ledger, jobs, echo, on_result, folder.parent)
            finally:
                self._keep_output(ledger, folder.parent)
        finally:
            ray.shutdown()

    def _wait(
        self, refs: dict[Any, int], ledger: Any, jobs: list[ShardJob], echo: Echo, on_result: OnResult, run_dir: Path
    ) -> list[dict[str, Any]]:
        import ray

        results: dict[int, dict[str, Any]] = {}
        count = jobs[0].count if jobs else 0
        pending = list(refs)
        seen = 0
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                attempts = ray.get(ledger.attempts.remote())
                for index, start in attempts[seen:]:
                    again = " (retry)" if sum(1 for i, _ in attempts[:seen] if i == index) else ""
                    echo(
                        f"shard {index}/{count} started on {start['hostname']} "
                        f"(node {start['node_id'][:12]}, home {start['home']}){again}"
                    )
                seen = len(attempts)
                self._keep_output(ledger, run_dir)
                for ref in done:  # its attempts all began before it ended: the ledger has them
                    index = refs[ref]
                    results[index] = self._result(ref, index, count)
                    results[index]["attempts"] = [start for i, start in attempts if i == index]
                    on_result(results[index])
        except KeyboardInterrupt:
            echo(f"interrupted: cancelling {len(pending)} shards (each stops its services and records itself)")
            for ref in pending:
                ray.cancel(ref, force=False)
            deadline = time.time() + CANCEL_GRACE_S
            try:
                while pending and time.time() < deadline:
                    done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
                    for ref in done:
                        result = self._result(ref, refs[ref], count)
                        if result.get("status") != "ok":  # stopped by the cancel, whatever its exit
                            result["status"] = "cancelled"
                            result["reason"] = (
                                f"cancelled by Ctrl-C on the head; it stopped its services "
                                f"and recorded itself (exit {result.get('exit_status')})"
                            )
                        results[refs[ref]] = result
            except KeyboardInterrupt:
                pass
            for ref in pending:
                ray.cancel(ref, force=True)
            self._attach(results, ledger)
            raise _Interrupted(list(results.values())) from None
        self._attach(results, ledger)
        return [results[i] for i in sorted(results)]

    @staticmethod
    def _result(ref: Any, index: int, count: int) -> dict[str, Any]:
        import ray

        try:
            result: dict[str, Any] = ray.get(ref)
            return result
        except ray.exceptions.TaskCancelledError:
            return {
                "index": index,
                "shard": f"{index}/{count}",
                "status": "cancelled",
                "reason": "cancelled before it could record itself",
            }
        except ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return {
                "index": index,
                "shard": f"{index}/{count}",
                "status": ray_ending(type(exc).__name__),
                "reason": f"{type(exc).__name__}: {first} (after the retries Ray was allowed)",
            }

    @staticmethod
    def _keep_output(ledger: Any, run_dir: Path) -> None:
        """Append what the shards handed the ledger since the last look to their live logs."""
        import ray

        from harness.runs.livelog import append_lines, live_log

        try:
            output = ray.get(ledger.take_output.remote(), timeout=30)
        except ray.exceptions.RayError:
            return
        for index, lines in output.items():
            append_lines(live_log(run_dir, index), lines)

    @staticmethod
    def _attach(results: dict[int, dict[str, Any]], ledger: Any) -> None:
        import ray

        try:
            attempts = ray.get(ledger.attempts.remote(), timeout=30)
        except ray.exceptions.RayError:
            return
        for index, result in results.items():
            result["attempts"] = [start for i, start in attempts if i == index]


#: Ray's errors for a task whose worker, node or object went away under it.
_RAY_LOSSES = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError", "OwnerDiedError")


def ray_ending(error: str) -> str:
    """A shard's status from the name of the error Ray gave for its task once its retries
    were spent: ``lost`` when its worker or node went away, else ``failed``. Pure."""
    return "lost" if error in _RAY_LOSSES else "failed"


class _Interrupted(KeyboardInterrupt):
    """Ctrl-C, carrying the results of the shards that still recorded themselves."""

    def __init__(self, results: list[dict[str, Any]]) -> None:
        super().__init__()
        self.results = results


class Ledger:
    """A Ray actor on the head's node: every attempt of every shard, in the order they began,
    and the shards' output until the head takes it."""

    def __init__(self) -> None:
        self._attempts: list[tuple[int, dict[str, Any]]] = []
        self._output: dict[int, list[str]] = {}

    def started(self, index: int, facts: dict[str, Any]) -> None:
        self._attempts.append((index, facts))

    def output(self, index: int, lines: list[str]) -> None:
        """Lines a shard wrote (:mod:`harness.runs.livelog`), kept until the head takes them."""
        self._output.setdefault(index, []).extend(lines)

    def take_output(self) -> dict[int, list[str]]:
        taken, self._output = self._output, {}
        return taken

    def attempts(self) -> list[tuple[int, dict[str, Any]]]:
        return list(self._attempts)


def _ray_shard(job: ShardJob, ledger: Any) -> dict[str, Any]:
    """The Ray task: note the attempt with the ledger, then run the shard on this node."""
    import socket

    import ray

    from harness.runs.shard import node_home

    facts = {
        "hostname": socket.gethostname(),
        "home": str(node_home()),
        "node_id": ray.get_runtime_context().get_node_id(),
        "started": time.time(),
    }
    # The head learns of the attempt as the shard begins; the shard does not wait for the actor's
    # answer to go on (a round trip to the head's node, the worker's first call on that actor),
    # only before it ends: the head reads the attempts of every task that ended.
    noted = ledger.started.remote(job.index, facts)

    def send(lines: list[str]) -> None:  # in order: one caller's calls on an actor run in order
        ledger.output.remote(job.index, lines)

    try:
        return run_shard(job, {"node_id": facts["node_id"], "engine": "ray"}, send)
    finally:
        ray.get(noted)


class SubmititEngine:
    """Shards as a submitit array job (Slurm, or submitit's local executor).

    Each task's end is recorded as it comes (polled, not waited on in order). A task Slurm
    ended without a result is judged from its state (:func:`engine_ending`): cancelled
    (``scancel``) is recorded ``cancelled``; a node lost (``NODE_FAIL``, ``PREEMPTED``, ...)
    is ``lost`` and its shard submitted again, in a new array of the lost members, up to
    ``retries`` times. A task that keeps its node's broker for other shards after its own
    shard is over (:func:`harness.runs.shard.keep_node_broker`) hands its result over first
    (:func:`hand_over`, ``engine/handed-over/<I>.json``): it is recorded as it comes, and again
    with what the wait adds once the task ends."""

    def __init__(self, *, local: bool, task: Callable[[ShardJob], dict[str, Any]] | None = None) -> None:
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise HarnessError(
                "--cluster slurm needs submitit, which is not installed",
                hint="pip install -e '.[slurm]' from the checkout",
            ) from None
        if not local and shutil.which("srun") is None:  # submitit's own test for a Slurm machine
            raise HarnessError(
                "--cluster slurm: no srun on this machine's PATH, so it is no Slurm login node",
                hint="run it where sbatch and srun are, or try the array here with --cluster slurm-local",
            )
        self.local = local
        #: what each array task runs: a shard (another function only in the engine's tests)
        self.task = task or _submitit_shard
        #: partition, account, QOS, time, memory, GPUs (:func:`harness.runs.slurm.slurm_options`)
        self.options: dict[str, Any] = {}

    def executor(self, folder: Path, *, cpus: float, gpus: int, count: int) -> AutoExecutor:
        """submitit's executor for an array of ``count`` shards, its parameters set (submitit
        renders them into the sbatch script of each submission). The job is named
        ``harness-<run id>`` (``folder`` is the run's ``engine/``): ``squeue`` shows whose run
        it is, and ``scancel --name`` cancels it."""
        import submitit

        from harness.runs.slurm import submitit_parameters

        executor = submitit.AutoExecutor(folder=folder / "%j", cluster="local" if self.local else "slurm")
        executor.update_parameters(
            name=f"harness-{folder.parent.name}",
            **submitit_parameters(self.options, cpus=cpus, gpus=gpus, local=self.local, count=count),
        )
        return executor

    def run(
        self,
        jobs: list[ShardJob],
        *,
        cpus: float,
        gpus: int,
        retries: int,
        folder: Path,
        echo: Echo,
        on_result: OnResult,
    ) -> list[dict[str, Any]]:
        from harness.runs.livelog import live_log
        from harness.runs.record import private_umask

        # submitit makes its job folders and pickles (each task's result, which this head
        # unpickles) with the process's umask, and a task inherits the umask of its submission:
        # in a shared home that umask lets the group write, so another member could plant a
        # result (their code, run as this user) or a hand-over. Nothing here is the group's.
        make_record_dir(handed_over_path(folder, 0).parent)
        with private_umask():
            executor = self.executor(folder, cpus=cpus, gpus=gpus, count=len(jobs))
            jobs = [
                dataclasses.replace(
                    job,
                    live_log=str(live_log(folder.parent, job.index)),
                    handover=str(handed_over_path(folder, job.index)),
                )
                for job in jobs
            ]
            results: dict[int, dict[str, Any]] = {}
            attempts: dict[int, list[dict[str, Any]]] = {job.index: [] for job in jobs}
            #: results handed over by tasks that then kept their node's broker for other shards
            handed: dict[int, dict[str, Any]] = {}
            todo = list(jobs)
            watcher = None if self.local else _slurm_states()
            while todo:
                for job in todo:  # an earlier attempt's (or session's) hand-over is not this one's
                    Path(str(job.handover)).unlink(missing_ok=True)
                    handed.pop(job.index, None)
                submitted = self._submit(executor, todo)
                if watcher is not None:  # sacct, or squeue where Slurm keeps no accounting
                    for handle in submitted:
                        handle.watcher = watcher
                if submitted:
                    echo(f"submitted array job {submitted[0].job_id.split('_')[0]} ({len(todo)} tasks)")
                handles = {job.index: (job, handle) for job, handle in zip(todo, submitted, strict=True)}
                todo = []
                try:
                    while handles:
                        for index, (job, handle) in list(handles.items()):
                            if not handle.done():
                                self._take_handed_over(job, handle, attempts[index], handed, on_result)
                                continue
                            del handles[index]
                            result = self._ended(job, handle, handed.get(index))
                            attempts[index].append(
                                {"job_id": handle.job_id, **(result.get("node") or {}), "status": result["status"]}
                            )
                            if result.pop("retry", False) and len(attempts[index]) <= retries:
                                echo(f"shard {result['shard']}: {result['reason']}; submitted again")
                                todo.append(job)
                                continue
                            result["attempts"] = attempts[index]
                            results[index] = result
                            on_result(result)
                        if handles:
                            time.sleep(0.5)
                except KeyboardInterrupt:
                    echo(f"interrupted: cancelling {len(handles)} tasks")
                    for _, handle in handles.values():
                        handle.cancel(check=False)
                    raise _Interrupted(list(results.values())) from None
            return [results[i] for i in sorted(results)]

    def _submit(self, executor: AutoExecutor, jobs: list[ShardJob]) -> list[Any]:
        """The array's task handles; sbatch refusing the array (a partition, account, QOS or
        GPU request the cluster does not have) is an error naming what was asked."""
        from submitit.core.utils import FailedJobError

        try:
            handles = list(executor.map_array(self.task, jobs))
        except FailedJobError as exc:
            said = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            asked = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items())) or "no [slurm] options"
            raise InputError(
                f"Slurm refused the array job ({asked}): {said[-1] if said else exc}",
                hint="check --slurm KEY=VALUE and the deploy's [slurm] against what `sinfo` and "
                "`sacctmgr show assoc user=$USER` list, then run again",
            ) from None
        if self.local:
            # submitit waits up to 15 s for the result file of a task that ended without one,
            # in case a shared filesystem shows it late. A local task writes it on this
            # machine before it exits, so one that died (killed, os._exit) would make the
            # head wait that long for nothing before it records or resubmits the shard.
            for handle in handles:
                handle._results_timeout_s = 0
        return handles

    @staticmethod
    def _take_handed_over(
        job: ShardJob,
        handle: Any,
        attempts: list[dict[str, Any]],
        handed: dict[int, dict[str, Any]],
        on_result: OnResult,
    ) -> None:
        """Record the result a running task handed over (:func:`hand_over`) once, as it comes:
        its shard is over, its task keeps the node's broker for other shards a while."""
        if job.index in handed:
            return
        early = read_handed_over(job.handover)
        if early is None:
            return
        handed[job.index] = early
        attempt = {"job_id": handle.job_id, **(early.get("node") or {}), "status": early.get("status")}
        on_result({**early, "attempts": [*attempts, attempt]})

    def _ended(self, job: ShardJob, handle: Any, early: dict[str, Any] | None = None) -> dict[str, Any]:
        """The task's result, or the engine's verdict on a task that returned none; on Slurm, a
        task that recorded a cancel is judged again from the state Slurm ended it with. A task
        that had handed its result over (``early``) keeps it however its wait then ended."""
        try:
            result: dict[str, Any] = handle.result()
        except Exception as exc:  # the engine's failure (a task that died), with its reason
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            status, reason, retry = engine_ending(str(handle.state), message)
            if early is not None:  # its shard was over: only its wait for the others was cut
                return {**early, "held_broker_stopped": f"task {handle.job_id}: {reason}"}
            return {
                "index": job.index,
                "shard": f"{job.index}/{job.count}",
                "status": status,
                "reason": f"task {handle.job_id}: {reason}",
                "retry": retry,
            }
        if result.get("status") == "cancelled" and not self.local:
            result = lost_instead(result, _final_state(handle))
        return result


def _slurm_states() -> SlurmStates:
    from harness.runs.slurmstates import SlurmStates

    return SlurmStates()


#: How long the head waits for Slurm's final state of a task that wrote its result.
FINAL_STATE_S = 30.0


def _final_state(handle: Any) -> str:
    """Slurm's state of a task once it ended (``COMPLETING`` while its processes exit), or the
    last one seen after :data:`FINAL_STATE_S`."""
    deadline = time.monotonic() + FINAL_STATE_S
    while True:
        state = str(handle.watcher.get_state(handle.job_id, mode="force"))
        if (state.split() or ["UNKNOWN"])[0] not in (
            "RUNNING",
            "COMPLETING",
            "PENDING",
            "UNKNOWN",
        ) or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


#: Slurm job states (``sacct``) of a node that went away under its task: the shard is lost
#: and submitted again.
_LOST_STATES = ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "REQUEUED", "REQUEUE_FED", "REVOKED", "DEADLINE")


def engine_ending(state: str, message: str) -> tuple[str, str, bool]:
    """(status, reason, retry) of a submitit task that returned no result, from the state
    Slurm (``sacct``) or the local executor gives it and the last line of submitit's error.
    Pure. ``CANCELLED`` (``scancel``; ``CANCELLED by UID``) is ``cancelled`` and not retried
    (someone meant it; ``--resume`` runs it again); a lost node is ``lost`` and retried; the
    local executor's ``INTERRUPTED`` is a task killed by a signal, its ``scancel``."""
    said = state.strip() or "UNKNOWN"
    word = said.split()[0].upper()
    if word == "CANCELLED":
        return "cancelled", f"cancelled on Slurm ({said}: scancel or an operator)", False
    if word in _LOST_STATES:
        return "lost", f"its node was lost ({said})", True
    if word == "INTERRUPTED":
        return "cancelled", "its task was killed by a signal (submitit's local executor)", False
    if word == "TIMEOUT":
        return "failed", f"it ran past the job's time limit ({said})", False
    if word == "OUT_OF_MEMORY":
        return "failed", f"it ran out of the job's memory ({said})", False
    return "failed", f"{message} (state {said})", False


def _submitit_shard(job: ShardJob) -> dict[str, Any]:
    import socket

    env = submitit_environment()
    from harness.runs.livelog import file_sender
    from harness.store.shared import group_umask

    send = file_sender(Path(job.live_log)) if job.live_log else None
    # The task has its submission's umask (no group write: SubmititEngine.run); the shard's
    # store and caches on a node whose home is shared need the group's, the result submitit
    # writes after the shard does not.
    with _terminations() as terminated, group_umask(node_home()):
        result = run_shard(job, {"node_id": env or socket.gethostname(), "engine": "submitit"}, send)
    result = after_termination(result, terminated)
    if terminated or not on_slurm():
        return result  # cancelled: its task ends now, the broker with it
    # The shard that started its node's broker keeps its task while other shards use that
    # broker (a cgroup Slurm ends every process of a task as it ends), its result handed over
    # first: the head records it now, not when the wait is over.
    return keep_node_broker(job, result, lambda: hand_over(job, result))


def on_slurm() -> bool:
    """Whether this process is a task of a real Slurm job (not submitit's local executor)."""
    return bool(os.environ.get("SLURM_JOB_ID")) and not os.environ.get("SUBMITIT_LOCAL_JOB_ID")


#: Where, in the run's ``engine/`` folder, a shard that keeps its task for other shards hands
#: its result over before it waits (:func:`hand_over`).
HANDED_OVER = "handed-over"


def handed_over_path(folder: Path, index: int) -> Path:
    """The file shard ``index`` hands its result over in, under the engine's ``folder``."""
    return folder / HANDED_OVER / f"{index}.json"


def hand_over(job: ShardJob, result: dict[str, Any]) -> None:
    """Hand ``result`` to the head before the task ends (written whole, then renamed), where
    the head polls for it beside the task's own (:meth:`SubmititEngine.run`)."""
    if job.handover:
        import json

        write_text_atomic(Path(job.handover), json.dumps(result, default=str))


def read_handed_over(path: str | None) -> dict[str, Any] | None:
    """The result a shard handed over early (:func:`hand_over`), or None."""
    import json

    if not path:
        return None
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


@contextmanager
def _terminations() -> Iterator[list[float]]:
    """Note each SIGTERM this process gets in the block (when each came), then pass it on to
    the handler before (submitit's, which lets the task finish and record itself). Slurm's
    ``scancel`` sends SIGTERM to every process of the task: the command dies with 143 while
    the shard, noting it, records a cancel instead of a failed command."""
    seen: list[float] = []
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except ValueError:
        yield seen
        return

    def note(signum: int, frame: Any) -> None:
        seen.append(time.time())
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, note)
    except ValueError:  # not the main thread: nothing to note
        yield seen
        return
    try:
        yield seen
    finally:
        signal.signal(signal.SIGTERM, previous)


def after_termination(result: dict[str, Any], terminated: list[float]) -> dict[str, Any]:
    """A shard's result once its task got SIGTERM (``terminated``: when): a shard that did not
    end ``ok`` was stopped by it, and is ``cancelled`` saying so (the head then asks Slurm
    whether its node was lost instead: :func:`lost_instead`). Pure."""
    if not terminated or result.get("status") == "ok":
        return result
    before = f" ({result['reason']})" if result.get("reason") else ""
    return {
        **result,
        "status": "cancelled",
        "reason": (
            "its task got SIGTERM (Slurm's scancel, or its time limit) and stopped"
            + before
            + "; --resume runs it again"
        ),
    }


def lost_instead(result: dict[str, Any], state: str) -> dict[str, Any]:
    """A task's ``cancelled`` result (it got SIGTERM) judged again from the state Slurm gave
    the task once it ended: a node lost (``NODE_FAIL``: set down or stopped answering) or a
    time limit sends the same SIGTERM as ``scancel``, and makes the shard ``lost``, submitted
    again (``retry``), or ``failed`` naming it. Pure."""
    word = (state.split() or [""])[0].upper()
    if result.get("status") != "cancelled" or word not in (*_LOST_STATES, "TIMEOUT"):
        return result
    status, reason, retry = engine_ending(state, "")
    stopped = str(result.get("reason", "")).split("; --resume", 1)[0]
    return {**result, "status": status, "reason": f"{reason}: {stopped}", "retry": retry}


def submitit_environment() -> str | None:
    """The Slurm job and task of this process (``SLURM_JOB_ID``/``SLURM_ARRAY_TASK_ID``), if any."""
    job, task = (
        os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID"),
        os.environ.get("SLURM_ARRAY_TASK_ID"),
    )
    return f"slurm {job}_{task}" if job else None
