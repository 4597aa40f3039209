"""``harness down``: stop what ``harness up`` started, and nothing else."""

from __future__ import annotations

import click

from harness.cli import State


@click.command(help="Stop what harness up started (SIGINT/SIGTERM, then SIGKILL), nothing else.")
@click.option("--json", "as_json", is_flag=True, help="Print what was stopped as JSON.")
@click.pass_obj
def command(state: State, as_json: bool) -> None:
    from harness.cli.commands.status import _state_dir
    from harness.cli.output import print_json
    from harness.runtime.broker import down

    result = down(_state_dir(state))
    if as_json:
        print_json(result)
        return
    pids = ", ".join(map(str, result.get("brokers", [])))
    click.echo(f"broker: {result['broker']}" + (f" (pid {pids})" if pids else ""))
    for service in result["services"]:
        click.echo(f"{service['name']}: {service['outcome']} (pid {service['pid']})")
