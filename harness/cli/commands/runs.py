"""``harness runs``: the recorded runs, newest first; ``runs pin`` keeps one's paths across gc;
``runs prune`` removes old records (:mod:`harness.runs.prune`); ``runs logs`` shows a run's
output as it comes (:mod:`harness.runs.livelog`)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from harness.cli import State
from harness.cli.output import follow_interval_option, log_lines_option


#: How many runs `harness runs` lists unless told otherwise.
DEFAULT_LAST = 20


@click.group(
    invoke_without_command=True,
    help=f"List recorded runs, newest first (the last {DEFAULT_LAST} unless --last N or --all); "
    "pin or unpin one (`runs pin ID`); remove old records (`runs prune`); show a run's output as it comes "
    "(`runs logs ID -f`).\n\n\b\nExamples:\n  harness runs\n  harness runs --last 5 --json\n  harness runs pin latest",
)
@click.option(
    "--last",
    "last",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help=f"List the newest N runs (default {DEFAULT_LAST}).",
)
@click.option("--all", "show_all", is_flag=True, help="List every run.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON (the same runs: --last, --all).")
@click.pass_context
def command(ctx: click.Context, last: int | None, show_all: bool, as_json: bool) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from harness.cli.output import print_json, print_table
    from harness.runs.record import list_runs

    if show_all and last is not None:
        raise click.UsageError("give --last N or --all, not both")
    state: State = ctx.obj
    rows = list_runs(state.home, None if show_all else last or DEFAULT_LAST)
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


@command.command(
    "pin",
    help="Keep every store path run ID used across `harness store gc` (ID, prefix or latest).\n\n\b\nExamples:\n  harness runs pin latest\n  harness runs pin 20261205-074512 --remove",
)
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


@command.command(
    "logs",
    help="Show the output of run ID (ID, prefix or latest) as it comes: each shard's of a cluster run, "
    "prefixed with the shard, or a local run's command's; with -f, keep printing new lines until the "
    "run ends or Ctrl-C.\n\n\b\nExamples:\n  harness runs logs latest -f\n  harness runs logs 20261205-074512 --shard 3",
)
@click.argument("run_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run has ended.")
@click.option(
    "--shard", "shards", multiple=True, type=click.IntRange(min=0), metavar="I", help="Only shard I (repeatable)."
)
@log_lines_option
@follow_interval_option
@click.pass_obj
def logs(state: State, run_id: str, follow: bool, shards: tuple[int, ...], count: int, interval: float) -> None:
    from harness.runs.livelog import run_ended, run_logs
    from harness.runs.record import find_run
    from harness.runtime.logs import Follower, last_lines

    run_dir = find_run(state.home, run_id)
    files = run_logs(run_dir, tuple(dict.fromkeys(shards)))
    width = max(len(n) for n in files)

    def show(name: str, line: str) -> None:
        click.echo(f"{name.ljust(width)} | {line}" if len(files) > 1 else line)

    ended_before = _mtime(run_dir / "result.json")
    follower = Follower(files) if follow else None  # from before the last lines: none is missed
    for name, path in files.items():
        for line in last_lines(path, count):
            show(name, line)
    if follower is None:
        return
    try:
        while True:
            ended = _mtime(run_dir / "result.json") != ended_before and run_ended(run_dir)
            for name, line in follower.poll():
                show(name, line)
            if ended:  # its last lines were written before its result: all shown now
                click.echo(f"run {run_dir.name} has ended", err=True)
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        pass


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


@command.command(
    "prune",
    help="Remove old run records: those beyond the newest N (--keep N) and/or started DAYS or more "
    "ago (--older-than DAYS; with both, only records both select). Never a pinned run, never one in "
    "progress, and a record without result.json only with --older-than. Then `harness store gc` "
    "can collect what only removed runs used.\n\n\b\nExamples:\n  harness runs prune --keep 100 --dry-run     # what would go, and the bytes it would free\n  harness runs prune --older-than 30",
)
@click.option("--keep", type=click.IntRange(min=0), default=None, metavar="N", help="Keep the newest N runs.")
@click.option(
    "--older-than",
    "older_than",
    type=click.FloatRange(min=0),
    default=None,
    metavar="DAYS",
    help="Remove runs started at least DAYS days ago (fractions allowed: 0.5 is 12 hours).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.pass_obj
def prune(state: State, keep: int | None, older_than: float | None, dry_run: bool) -> None:
    from harness.runs.prune import empty_trash, plan_prune, remove_runs, tree_bytes

    if keep is None and older_than is None:
        raise click.UsageError("say which runs go: --keep N, --older-than DAYS, or both")
    plan = plan_prune(state.home, keep=keep, older_than=older_than)
    going = plan.to_remove
    if dry_run:
        freed = 0
        for candidate in going:
            size = tree_bytes(candidate.path)
            freed += size
            click.echo(f"would remove run {candidate.id} ({_size(size)})")
        removed_count = len(going)
    else:
        freed = empty_trash(state.home)
        removed = remove_runs(state.home, going)
        for item in removed:
            click.echo(f"removed run {item.id} ({_size(item.bytes)})")
        removed_count, freed = len(removed), freed + sum(item.bytes for item in removed)
    kept = [
        f"{plan.kept(verdict)} {label}"
        for verdict, label in (
            ("pinned", "pinned"),
            ("in progress", "in progress"),
            ("no result", "without result.json"),
            ("another member's", "another member's (a shared home)"),
        )
        if plan.kept(verdict)
    ]
    verb = "would remove" if dry_run else "removed"
    click.echo(
        f"{verb} {removed_count} of {len(plan.records)} run(s)"
        + f", {'would free' if dry_run else 'freed'} {freed} bytes ({_size(freed)})"
        + (f"; kept despite the options: {', '.join(kept)}" if kept else "")
    )


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"
