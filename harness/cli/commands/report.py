"""``harness report RUN``: one self-contained HTML page of a run (:mod:`harness.runs.report`)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.cli import State


@click.command(
    help="Write a run's report: one HTML page with no external files (outcome, audit verdict, placement "
    "on the GPUs, service timeline, closure with sizes, impurities, scoped resets, scores per episode or "
    "shard). It goes to the run's folder as report.html, where `harness ui` lists it, unless -o names "
    "another file.\n\n\b\nExamples:\n  harness report                       # the newest run\n"
    "  harness report latest --diff 20261205-074512\n  harness report latest -o /tmp/run.html"
)
@click.argument("run_id", default="latest")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the page here instead.")
@click.option("--diff", "other", metavar="RUN", help="Also show what differs from this run (harness diff).")
@click.option("--no-audit", is_flag=True, help="Do not re-hash the closure (the verdict is left out).")
@click.pass_obj
def command(state: State, run_id: str, output: Path | None, other: str | None, no_audit: bool) -> None:
    from harness.runs.record import find_run
    from harness.runs.report import write_report

    run_dir = find_run(state.home, run_id)
    diff_with = find_run(state.home, other) if other else None
    path = write_report(run_dir, state.home / "store", output, audit=not no_audit, diff_with=diff_with)
    click.echo(str(path))
