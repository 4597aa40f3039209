"""``harness install``: lock what has no lock, then realize, ahead of a run (seed)."""

from __future__ import annotations

import click

from harness.cli import State
from harness.cli.output import quiet_option, realize_jobs_option


@click.command(
    help="Lock if needed, then realize the named services ahead of a run.\n\n\b\nExamples:\n  harness install kinematics\n  harness install sam3 simate --offline"
)
@click.argument("names", nargs=-1)
@click.option("--offline", is_flag=True, help="Never touch the network; list everything missing.")
@realize_jobs_option
@click.option("--json", "as_json", is_flag=True, help="Print what was built as JSON.")
@quiet_option
@click.pass_obj
def command(state: State, names: tuple[str, ...], offline: bool, jobs: int, as_json: bool, quiet: bool) -> None:
    from harness.realize.install import realize_names
    from harness.cli.commands.realize import _print

    reports = realize_names(state, list(names), offline=offline, jobs=jobs, lock_missing=True, show_progress=not quiet)
    _print(reports, as_json, state)
