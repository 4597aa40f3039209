"""``harness run --resume RUN``: finish a cluster run whose head stopped, or whose shards failed.

The head writes each shard's record into the run's folder as the shard ends
(:func:`harness.runs.cluster.record_shard`), so a head that was killed, lost its shell or
ran out of time leaves every finished shard on disk. Resuming the run:

1. reads what was asked (``config.json``'s ``cluster.ask``) and judges every shard as the
   audit does (:func:`harness.runs.audit.audit_shards`); a shard is kept only when its
   verdict is ``ok`` (:func:`shards_to_resume`, pure);
2. plans and realizes again what the run asked, and refuses, naming each difference, when
   the project's locks and code no longer give the run's recorded closure
   (:func:`closure_refusal`, pure): a run's shards compute with one closure;
3. moves each rerun shard's earlier record aside (``superseded/<I>.<N>/``), runs those
   shards on the run's engine with its retries, and records the whole run again
   (``result.json``, ``benchmark.json``), every shard included. ``config.json`` lists each
   resume under ``cluster.resumes``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError, InputError
from harness.runs.cluster import ClusterAsk, Echo, Target
from harness.runs.record import make_record_dir, read_json, write_json

if TYPE_CHECKING:
    from harness.manifests.project import ProjectState
    from harness.runs.run import RunOutcome


def shards_to_resume(count: int, verdicts: Mapping[int, str]) -> list[int]:
    """The shards of ``count`` to run again: every one whose audit verdict (``ok``,
    ``modified``, ``failed``, ``cancelled``, ``missing``) is not ``ok``, or that has none. Pure."""
    return [index for index in range(count) if verdicts.get(index) != "ok"]


def recorded_ask(config: dict[str, Any], run: str) -> tuple[ClusterAsk, Target, int, int]:
    """What a cluster run's ``config.json`` says was asked: (the ask, the engine, shards,
    retries). Pure; a record that is no cluster run's, or one written before runs could be
    resumed, is an :class:`InputError` naming the file and key."""
    where = f"run {run}: config.json"
    cluster = config.get("cluster")
    if not isinstance(cluster, dict):
        raise InputError(f"{where} has no [cluster]: only a cluster run (--cluster) can be resumed")
    ask = cluster.get("ask")
    if not isinstance(ask, dict):
        raise InputError(
            f"{where} has no cluster.ask: it was recorded before runs could be resumed",
            hint="start it again with harness run --cluster",
        )
    try:
        return (
            ClusterAsk(
                tuple(str(c) for c in ask["command"]),
                ask["agent"],
                tuple(str(s) for s in ask["sets"]),
                tuple(str(s) for s in ask["services"]),
                ask["benchmark"],
                bool(ask["offline"]),
            ),
            Target(str(cluster["engine"]), cluster.get("address")),
            int(cluster["shards"]),
            int(cluster["retries"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{where}: cluster.ask or cluster is incomplete ({exc})") from None


def closure_refusal(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each way the closure the project gives now differs from the run's recorded one
    (``lock.json``), told; empty when they are the same. Pure."""
    from harness.runs.closures import closure_differences

    return [d.told("in the run", "now") for d in closure_differences(recorded, now)]


def resume_on_cluster(state: ProjectState, run: str, *, echo: Echo = print, show_progress: bool = True) -> RunOutcome:
    """Run again the shards of cluster run ``run`` that have no good record, on its engine and
    with its closure, and record the whole run (see the module docstring)."""
    from harness.config import load_settings
    from harness.runs.audit import audit_shards
    from harness.runs.cluster import (
        head_settings,
        SubmititEngine,
        open_engine,
        prepare_head,
        push_closure,
        record_cluster_run,
        report_shards,
        run_shards,
        shard_jobs,
    )
    from harness.runs.record import find_run
    from harness.runs.run import RunOutcome

    run_dir = find_run(state.home, run)
    config = read_json(run_dir / "config.json")
    ask, target, count, _ = recorded_ask(config, run_dir.name)
    recorded_closure = read_json(run_dir / "lock.json")
    verdicts = {i: item.status for i, item in enumerate(audit_shards(run_dir, recorded_closure))}
    todo = shards_to_resume(count, verdicts)
    if not todo:
        echo(f"run {run_dir.name}: every one of its {count} shards has a good record; nothing to run")
        outcome = record_cluster_run(run_dir, config, interrupted=False)
        return RunOutcome(run_dir.name, run_dir, outcome["exit_status"], outcome["score"])
    engine = open_engine(target)
    if isinstance(engine, SubmititEngine):  # the partition, account, QOS, time... it was asked with
        engine.options = dict(config["cluster"].get("slurm") or {})
    if config["cluster"].get("variant"):  # the run forced one: so does its resume
        os.environ["HARNESS_VARIANT"] = str(config["cluster"]["variant"])
    node_gpus = config["cluster"].get("node_gpus")  # the node kind the head planned for
    prepared, store, head = prepare_head(
        state, ask, run_dir, gpus=str(node_gpus) if node_gpus else None, show_progress=show_progress
    )
    if head.digest != config["cluster"]["closure_digest"]:
        differences = closure_refusal(recorded_closure, head.closure)
        raise HarnessError(
            f"run {run_dir.name}: the project no longer gives the run's closure "
            f"({config['cluster']['closure_digest']}), so its shards cannot be resumed: " + "; ".join(differences[:10]),
            hint="restore the locks and code the run was made with (its lock.json names them), or start a new run",
        )
    settings = head_settings(load_settings(state.home, prepared.project.root))
    echo(
        f"run {run_dir.name}: resuming {len(todo)} of {count} shards on {target.describe()} "
        f"({', '.join(str(i) for i in todo)}); the others' records stand"
    )
    pushed = push_closure(store, [e["path"] for e in head.closure["store_paths"]], settings, state.home, echo)
    config["cluster"].setdefault("resumes", []).append({"at": time.time(), "shards": todo, "push": pushed})
    write_json(run_dir / "config.json", config)
    for index in todo:
        supersede(run_dir, index)
    jobs = [job for job in shard_jobs(run_dir.name, count, prepared, ask, settings, pushed, head) if job.index in todo]
    outcome = run_shards(engine, jobs, config, run_dir, store, head, run_dir.name, echo)
    report_shards(outcome, echo)
    return RunOutcome(run_dir.name, run_dir, outcome["exit_status"], outcome["score"])


def supersede(run_dir: Path, index: int) -> Path | None:
    """Move shard ``index``'s earlier record to ``superseded/<index>.<N>/`` (kept for the
    asking, outside what audit and the combined record read); None when it had none."""
    folder = run_dir / "shards" / str(index)
    if not folder.exists():
        return None
    aside = make_record_dir(run_dir / "superseded")
    number = 1
    while (aside / f"{index}.{number}").exists():
        number += 1
    target = aside / f"{index}.{number}"
    os.rename(folder, target)
    return target
