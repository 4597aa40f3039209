"""``harness run``: realize, place and start what a run needs, run COMMAND, record the run."""

from __future__ import annotations

from typing import Any

import click

from harness.cli import State


@click.command(
    help="Realize, place and start what a run needs, run COMMAND, record the run.\n\n\b\nExamples:\n  harness run --agent kinematics-only\n  harness run --agent kinematics-only --set agent.benchmark=reach-remote\n  harness run --resume 20261205-074512     # a cluster run's missing shards",
    context_settings={"ignore_unknown_options": True},
)
@click.option("--agent", help="Agent config: its enabled skills decide the services.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override an agent config key.")
@click.option("--service", "services", multiple=True, metavar="NAME", help="Run with these services.")
@click.option("--benchmark", metavar="NAME", help="Benchmark environment (default: the agent's).")
@click.option(
    "--gpus",
    metavar="SPEC",
    help="Plan for these GPUs instead of the ones found; with --cluster, one node's GPUs (each node still plans its own).",
)
@click.option("--offline", is_flag=True, help="Never touch the network while realizing.")
@click.option(
    "--cluster",
    metavar="TARGET",
    help="Run in shards on a cluster: ray://HOST:PORT, ray (RAY_ADDRESS), slurm, slurm-local.",
)
@click.option("--shards", type=int, metavar="N", help="Split the episodes into N shards [default with --cluster: 1].")
@click.option(
    "--retries",
    type=int,
    default=3,
    show_default=True,
    help="With --cluster: times a shard whose node died is run again (Ray: elsewhere; Slurm: submitted again).",
)
@click.option(
    "--slurm",
    "slurm",
    multiple=True,
    metavar="KEY=VALUE",
    help="With --cluster slurm: partition, account, qos, time, mem or gpus (per shard) of the array job; "
    "over the deploy's [slurm].",
)
@click.option(
    "--resume",
    metavar="RUN",
    help="Run again the shards of cluster run RUN that have no good record, with its closure.",
)
@click.option(
    "--detach",
    is_flag=True,
    help="With --cluster: once the run is recorded, print its id and return, its head going on in a session "
    "of its own (log in the run's head.log); follow it with `harness runs logs ID -f`.",
)
# --quiet without -q: the command's own arguments follow, and a short flag is easily theirs.
@click.option("--quiet", is_flag=True, help="Show no progress on stderr while realizing (the run's lines still print).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def command(
    state: State,
    agent: str | None,
    sets: tuple[str, ...],
    services: tuple[str, ...],
    benchmark: str | None,
    gpus: str | None,
    offline: bool,
    cluster: str | None,
    shards: int | None,
    retries: int,
    slurm: tuple[str, ...],
    resume: str | None,
    detach: bool,
    quiet: bool,
    command: tuple[str, ...],
) -> None:
    from harness.errors import InputError

    # What a run needs, wherever it runs: one set of arguments for a local run and a cluster's.
    common: dict[str, Any] = dict(
        agent=agent,
        sets=sets,
        services=services,
        benchmark=benchmark,
        offline=offline,
        echo=lambda line: click.echo(line, err=True),
        show_progress=not quiet,
    )
    if detach:
        if cluster is None:
            raise InputError("--detach runs the head of a cluster run on its own: give --cluster")
        _detach(state)
    if resume is not None:
        _check_resume(agent, sets, services, benchmark, gpus, offline, cluster, shards, slurm, command)
        from harness.runs.resume import resume_on_cluster

        outcome = resume_on_cluster(state, resume, echo=common["echo"], show_progress=not quiet)
    elif cluster is not None:
        from harness.runs.cluster import run_on_cluster

        outcome = run_on_cluster(
            state,
            list(command),
            cluster=cluster,
            shards=1 if shards is None else shards,
            retries=retries,
            gpus=gpus,  # one node's GPUs: the head plans for the node kind
            slurm=slurm,
            **common,
        )
    else:
        if shards is not None:
            raise InputError("--shards splits a run over a cluster: give --cluster too")
        if slurm:
            raise InputError("--slurm is for a run over a cluster: give --cluster too")
        from harness.runs.run import run

        outcome = run(state, list(command), gpus=gpus, **common)
    score = f", score {outcome.score:.2f}" if outcome.score is not None else ""
    click.echo(f"run {outcome.run_id}: exit {outcome.exit_status}{score}; record {outcome.run_dir}", err=True)
    raise SystemExit(outcome.exit_status)


def _detach(state: State) -> None:
    """Start this command's head in a session of its own, print the run id once it has
    recorded the run, and exit (:mod:`harness.runs.detach`)."""
    from harness.cli import invoked_args
    from harness.runs.detach import detach_head

    detached = detach_head(state.home, invoked_args())
    click.echo(
        f"run {detached.run_id}: detached, its head is pid {detached.pid} (log {detached.log}); "
        f"follow it with `harness runs logs {detached.run_id} -f`, stop it with `kill -INT {detached.pid}`",
        err=True,
    )
    click.echo(detached.run_id)
    raise SystemExit(0)


def _check_resume(
    agent: str | None,
    sets: tuple[str, ...],
    services: tuple[str, ...],
    benchmark: str | None,
    gpus: str | None,
    offline: bool,
    cluster: str | None,
    shards: int | None,
    slurm: tuple[str, ...],
    command: tuple[str, ...],
) -> None:
    """--resume asks again what the run recorded: anything else given with it is refused."""
    from harness.errors import InputError

    given = [
        name
        for name, value in (
            ("--agent", agent),
            ("--set", sets),
            ("--service", services),
            ("--benchmark", benchmark),
            ("--gpus", gpus),
            ("--offline", offline),
            ("--cluster", cluster),
            ("--shards", shards is not None),
            ("--slurm", slurm),
            ("COMMAND", command),
        )
        if value
    ]
    if given:
        raise InputError(
            f"--resume runs the shards as the run recorded them: give no {', '.join(given)}",
            hint="start a new run for another ask",
        )
