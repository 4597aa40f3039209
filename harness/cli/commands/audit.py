"""``harness audit RUN``: re-check every store path and project file a run used."""

from __future__ import annotations

import click

from harness.cli import State


@click.command(
    help="Re-check every store path a run used, and every shard of a cluster run; exit 1 if any "
    "path changed or a shard was refused, failed, cancelled or is missing.\n\n\b\nExamples:\n  harness audit                    # the newest run (latest)\n  harness audit latest --strict    # also fail on impurities (host copies)\n  harness audit 20261205-074512 --json"
)
@click.argument("run_id", default="latest")
@click.option("--strict", is_flag=True, help="Also fail when the run had impurities or a scoped service was reset.")
@click.option("--json", "as_json", is_flag=True, help="Print the audit as JSON.")
@click.pass_obj
def command(state: State, run_id: str, strict: bool, as_json: bool) -> None:
    from harness.cli.output import print_json
    from harness.runs.audit import audit_run
    from harness.runs.record import find_run

    run_dir = find_run(state.home, run_id)
    report = audit_run(run_dir, state.home / "store", None)
    if as_json:
        print_json(report.as_json())
    else:
        for item in report.items:
            detail = f": {item.detail}" if item.detail else ""
            click.echo(f"{item.status:<9} {item.path}{detail}")
            if item.store_now:  # the run is judged as it ran; today's copy differs
                click.echo(f"{'':<9} the store's copy now: {item.store_now}")
        for impurity in report.impurities:
            click.echo(f"impure    {impurity}")
        from harness.runs.audit import describe_reset

        for reset in report.scoped_resets:  # not a failure without --strict: the seed's documented exception
            click.echo(f"reset     {describe_reset(reset)}")
        gone = [item.path for item in report.items if item.status == "missing"]
        if gone:
            click.echo(f"{len(gone)} path(s) of this run are gone from the store: {', '.join(gone)}")
        click.echo(f"audit of run {report.run}: {report.verdict(strict=strict)}")
    if report.fails(strict=strict):
        raise SystemExit(1)
