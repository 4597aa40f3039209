"""``harness lock``: pin every input of the project's manifests into locks/."""

from __future__ import annotations

from typing import Any

import click

from harness.cli import State


@click.command(help="Pin every input of the named manifests (all when none) into locks/.")
@click.argument("names", nargs=-1)
@click.option("--check", is_flag=True, help="Exit 1 naming every lock that is missing or stale; no network.")
@click.option("--upgrade", is_flag=True, help="Allow every pin to move to the newest allowed version.")
@click.option(
    "--upgrade-package",
    "upgrade_packages",
    multiple=True,
    metavar="NAME",
    help="Allow this package to move (repeatable).",
)
@click.option(
    "--refresh",
    is_flag=True,
    help="Resolve again even when no input changed since the last lock (pins stay unless upgrading).",
)
@click.option("--offline", is_flag=True, help="Use only what is cached; fail clearly for what is not.")
@click.option(
    "--platform",
    metavar="PLATFORM",
    help="Lock for this platform alone, this once (uv's vocabulary, e.g. aarch64-manylinux_2_28) "
    "[default: harness.toml [lock] platforms, else this machine].",
)
@click.option(
    "--jobs", "-j", type=click.IntRange(1, 64), default=4, show_default=True, help="Manifests locked in parallel."
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_obj
def command(
    state: State,
    names: tuple[str, ...],
    check: bool,
    upgrade: bool,
    upgrade_packages: tuple[str, ...],
    refresh: bool,
    offline: bool,
    platform: str | None,
    jobs: int,
    as_json: bool,
) -> None:
    from harness.cli.output import print_json
    from harness.errors import HarnessError

    project = state.project()
    if check:
        from harness.lock.stamp import LockStamps

        stale: list[Any] = []
        # Every named lock is as the last lock in this home wrote it, from inputs none of which
        # changed since (harness.lock.stamp): up to date, answered without loading any model.
        if LockStamps(state.home / "cache", project, platform=None).quick(list(names)) is None:
            from harness.config import load_settings
            from harness.lock.check import check_locks

            stale = check_locks(project, list(names), settings=load_settings(state.home, project.root))
        if as_json:
            print_json({"stale": [{"name": s.name, "lock": str(s.lock), "reason": s.reason} for s in stale]})
        else:
            for item in stale:
                click.echo(f"stale  {item.name}: {item.reason} ({item.lock.relative_to(project.root)})")
            if not stale:
                click.echo("every lock is up to date")
        raise SystemExit(1 if stale else 0)

    import sys

    from harness.lock.outcome import LockOptions, Outcome

    options = LockOptions(
        platform=platform,
        offline=offline,
        upgrade=upgrade,
        upgrade_packages=tuple(upgrade_packages),
        jobs=jobs,
        refresh=refresh,
    )
    # Colours and a spinner on a terminal; plain lines otherwise, without loading rich (30 ms).
    console = None
    if sys.stderr.isatty():
        from rich.console import Console

        console = Console(stderr=True)

    def say(word: str, style: str, rest: str) -> None:
        if console is not None:
            console.print(f"[{style}]{word}[/{style}] {rest}")
        else:
            click.echo(f"{word} {rest}", err=True)

    def report(outcome: Outcome) -> None:
        if as_json:
            return
        shown = outcome.path.relative_to(project.root)
        if outcome.error:
            say("failed", "red", outcome.name)
        elif outcome.changed:
            say("locked", "green", f"{outcome.name} -> {shown}")
            for change in outcome.changes:
                click.echo(f"  {change}", err=True)
        else:
            say("unchanged", "dim", f"{outcome.name} ({shown})")

    # No input changed since the last lock: answer from the stamp, before loading any model.
    outcomes = None
    if not options.resolves_anyway:
        from harness.lock.stamp import LockStamps

        outcomes = LockStamps(state.home / "cache", project, platform=platform).quick(list(names))
    if outcomes is not None:
        for outcome in outcomes:
            report(outcome)
    else:
        outcomes = _lock(state, project, list(names), options, report, console)
    if as_json:
        print_json(
            {
                "locks": [
                    {
                        "name": o.name,
                        "lock": str(o.path),
                        "changed": o.changed,
                        "resolved": o.resolved,
                        "error": o.error,
                        "environment": o.environment,
                        "changes": [c.as_json() for c in o.changes],
                    }
                    for o in outcomes
                ]
            }
        )
    failed = [o for o in outcomes if o.error]
    if failed:
        raise HarnessError("\n".join(o.error or "" for o in failed))


def _lock(state: State, project: Any, names: list[str], options: Any, report: Any, console: Any) -> list[Any]:
    """The full path: start uv's resolutions from the raw manifests (harness.lock.early), then
    load the models, validate, and lock, taking over those runs where they match."""
    import contextlib

    from harness.lock.early import prestart_locks
    from harness.resolve.uvtool import discard_prestarted

    try:
        prestart_locks(state.home, project, names, options)
        from harness.config import load_settings
        from harness.lock.generate import lock_project

        settings = load_settings(state.home, project.root)
        status: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if console is not None:
            status = console.status("locking…", spinner="dots")
        with status:
            return lock_project(
                project, names, settings=settings, cache_dir=state.home / "cache", options=options, on_done=report
            )
    finally:
        discard_prestarted()
