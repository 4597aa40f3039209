"""``harness logs [-f] [NAMES]``: the last lines of the services' logs (and the broker's), and
with ``-f`` every line written after them, until Ctrl-C."""

from __future__ import annotations

import click

from harness.cli import State
from harness.cli.output import follow_interval_option, log_lines_option


@click.command(
    help="Show the last lines of the services' logs (all of them and the broker's when no NAMES are given); "
    "with -f, keep printing the lines written after them until Ctrl-C.\n\n\b\nExamples:\n  harness logs\n  harness logs -f kinematics     # its last 20 lines, then every new one"
)
@click.argument("names", nargs=-1)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines as they are written.")
@log_lines_option
@follow_interval_option
@click.pass_obj
def command(state: State, names: tuple[str, ...], follow: bool, count: int, interval: float) -> None:
    import time

    from harness.cli.commands.status import _state_dir
    from harness.runtime.logs import Follower, last_lines, log_files

    state_dir = _state_dir(state)
    files = log_files(state_dir, list(dict.fromkeys(names)))
    if not files:
        click.echo(f"no logs yet in {state_dir / 'logs'}", err=True)
        return
    width = max(len(n) for n in files)

    def show(name: str, line: str) -> None:
        click.echo(f"{name.ljust(width)} | {line}" if len(files) > 1 else line)

    # Follow from before the last lines are read: a line written meanwhile may show twice, none is missed.
    follower = Follower(files) if follow else None
    for name, path in files.items():
        for line in last_lines(path, count):
            show(name, line)
    if follower is None:
        return
    try:
        while True:
            for name, line in follower.poll():
                show(name, line)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
