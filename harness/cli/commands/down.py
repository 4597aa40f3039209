"""``harness down [NAMES]``: stop what ``harness up`` started (or only the services named), and nothing else."""

from __future__ import annotations

import click

from harness.cli import State


@click.command(
    help="Stop what harness up started (SIGINT/SIGTERM, then SIGKILL), nothing else. With NAMES, stop only those "
    "services: the broker and the others stay, and a named service starts again when a caller asks for it.\n\n\b\nExamples:\n  harness down                # everything harness up started\n  harness down molmo2         # that one service; the broker and the others stay"
)
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print what was stopped as JSON.")
@click.pass_obj
def command(state: State, names: tuple[str, ...], as_json: bool) -> None:
    from harness.cli.commands.status import _state_dir
    from harness.cli.output import print_json
    from harness.runtime.broker import down, down_services

    if names:
        result = down_services(_state_dir(state), list(dict.fromkeys(names)))
    else:
        result = down(_state_dir(state))
    if as_json:
        print_json(result)
        return
    pids = ", ".join(map(str, result.get("brokers", [])))
    click.echo(f"broker: {result['broker']}" + (f" (pid {pids})" if pids else ""))
    for service in result["services"]:
        pid = f" (pid {service['pid']})" if service.get("pid") else ""
        click.echo(f"{service['name']}: {service['outcome']}{pid}")
