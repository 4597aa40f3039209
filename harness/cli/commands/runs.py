"""``harness runs``: the recorded runs, newest first; ``runs pin`` keeps one's paths across gc."""

from __future__ import annotations

import time

import click

from harness.cli import State


@click.group(invoke_without_command=True, help="List recorded runs; pin or unpin one (`runs pin ID`).")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
@click.pass_context
def command(ctx: click.Context, as_json: bool) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from harness.cli.output import print_json, print_table
    from harness.runs.record import list_runs

    state: State = ctx.obj
    rows = list_runs(state.home)
    if as_json:
        print_json(rows)
        return

    def when(value: object) -> str | None:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value)) if isinstance(value, (int, float)) else None

    print_table(
        None,
        ["id", "started", "exit", "score", "agent", "pinned", "command"],
        [
            [
                r["id"],
                when(r["started"]),
                r["exit_status"],
                r["score"],
                r["agent"],
                "yes" if r.get("pinned") else "",
                " ".join(r["command"] or [])[:60],
            ]
            for r in rows
        ],
    )


@command.command("pin", help="Keep every store path run ID used across `harness store gc` (ID, prefix or latest).")
@click.argument("run_id")
@click.option("--remove", is_flag=True, help="Unpin instead: the run is kept only while among the last N.")
@click.pass_obj
def pin(state: State, run_id: str, remove: bool) -> None:
    from harness.runs.record import find_run
    from harness.store.gc import pin_run, unpin_run

    run_dir = find_run(state.home, run_id)
    if remove:
        unpin_run(run_dir)
        click.echo(f"unpinned run {run_dir.name}")
    else:
        pin_run(run_dir)
        click.echo(f"pinned run {run_dir.name}: `harness store gc` keeps what it used")
