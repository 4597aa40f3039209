"""``harness diff RUN_A RUN_B``: what differs between two runs."""

from __future__ import annotations

import click

from harness.cli import State


@click.command(
    help="Say what differs between two runs: closure, placement, configuration and, for cluster "
    "runs, engine, shard count, retries and each shard's status, score, platform and closure.\n\n\b\nExamples:\n  harness diff 20261205-074512 latest\n  harness diff 20261205-074512 latest --json"
)
@click.argument("run_a")
@click.argument("run_b")
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON.")
@click.pass_obj
def command(state: State, run_a: str, run_b: str, as_json: bool) -> None:
    from harness.cli.output import print_json
    from harness.runs.audit import diff_runs
    from harness.runs.record import find_run

    lines = diff_runs(find_run(state.home, run_a), find_run(state.home, run_b))
    if as_json:
        print_json({"differences": lines})
        return
    for line in lines:
        click.echo(line)
    if not lines:
        click.echo("the runs computed with the same closure, placement and configuration")
