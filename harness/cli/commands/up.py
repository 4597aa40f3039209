"""``harness up``: start the resident services (or those named) and the broker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from harness.cli import State
from harness.cli.output import quiet_option

if TYPE_CHECKING:
    from harness.runtime.session import Prepared


@click.command(
    help="Start the resident services (or those named) and the broker.\n\n\b\nExamples:\n  harness up\n  harness up kinematics\n  harness up --agent default"
)
@click.argument("names", nargs=-1)
@click.option("--agent", help="Only the services this agent config needs.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override an agent config key.")
@click.option("--gpus", metavar="SPEC", help="Plan for these GPUs instead of the ones found (e.g. 1x24).")
@click.option("--offline", is_flag=True, help="Never touch the network while realizing.")
@click.option("--json", "as_json", is_flag=True, help="Print the services started and the broker as JSON.")
@quiet_option
@click.pass_obj
def command(
    state: State,
    names: tuple[str, ...],
    agent: str | None,
    sets: tuple[str, ...],
    gpus: str | None,
    offline: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    import dataclasses

    from harness.cli.output import print_json
    from harness.runtime.broker import failed_up, spawn
    from harness.runtime.session import broker_options, prepare

    prepared = prepare(state, agent=agent, sets=sets, gpus=gpus, offline=offline, only=names, show_progress=not quiet)
    for note in prepared.plan.notes:
        click.echo(f"note: {note}", err=True)
    wanted = list(names) or [p.name for p in prepared.plan.services if p.mode == "resident"]
    # The broker serves what was prepared: local services without a launch spec (not named)
    # stay out of its plan, and a run needing them says so.
    plan = dataclasses.replace(
        prepared.plan,
        services=tuple(
            p for p in prepared.plan.services if p.name in prepared.specs or p.mode not in ("resident", "on_demand")
        ),
    )
    status = spawn(
        plan,
        prepared.specs,
        prepared.state_dir,
        names=wanted,
        options={**broker_options(prepared.deploy), "runs_dir": str(state.home / "runs")},
    )
    # Honest start-up: a service that did not come up fails `up`, naming the cause, and what
    # this `up` started is stopped again.
    failure = failed_up(prepared.state_dir, status)
    if failure is None:
        _root_services(state, prepared, status)
    if as_json:
        print_json(status)
    elif failure is None:
        from harness.cli.commands.status import print_status

        print_status(status, prepared.state_dir)
    if failure is not None:
        raise failure


def _root_services(state: State, prepared: Prepared, status: dict[str, Any]) -> None:
    """What the broker's services run from stays a gc root for as long as the broker lives.

    This process has held those paths since it realized them, so handing them to the
    broker's pid (with its start time) leaves no moment unrooted.
    """
    import psutil

    from harness.realize.builder import lock_objects
    from harness.store.roots import hold_for_process
    from harness.store.store import Store

    pid = (status.get("broker") or {}).get("pid")
    if not isinstance(pid, int):
        return
    names = [*(n for lock in prepared.locks.values() for n in lock_objects(lock)), *prepared.code.values()]
    try:
        hold_for_process(Store.in_home(state.home), pid, names, f"services of harness up ({prepared.state_dir})")
    except psutil.NoSuchProcess:
        pass  # the broker is gone already: nothing of it to keep
