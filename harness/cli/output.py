"""Printing for the CLI: JSON for machines, rich tables for people (rich imported lazily)."""

from __future__ import annotations

import json
import os
from typing import Any
from collections.abc import Sequence

import click


#: ``--quiet``: the commands with long phases show progress on stderr (live on a terminal,
#: plain lines otherwise: ``harness/progress.py``) unless told not to.
quiet_option = click.option(
    "--quiet", "-q", is_flag=True, help="Show no progress on stderr (results, warnings and errors still print)."
)


def _use_variant(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:  # over the global --variant and the deploy's: read where every lock is (lock/variants.py)
        os.environ["HARNESS_VARIANT"] = value


#: ``--variant`` of ``realize``, ``store push`` and ``store pull``: the same as ``harness
#: --variant``, said where it matters most (another variant's closure, for a binary cache).
variant_option = click.option(
    "--variant",
    metavar="NAME",
    expose_value=False,
    callback=_use_variant,
    help="This accelerator variant of locks that have them (cpu, cu128), whatever this machine's driver runs: "
    "a machine without a GPU realizes and pushes cu128 for the nodes that run it [as harness --variant].",
)

#: ``--jobs``/``-j`` of the commands that realize (``realize``, ``install``).
realize_jobs_option = click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Parallel downloads and registrations; bytecode compile workers (at most the CPUs).",
)


#: ``-n``/``--lines`` and the hidden ``--interval`` of the commands that print logs' last
#: lines and follow them (``logs``, ``runs logs``).
log_lines_option = click.option(
    "-n",
    "--lines",
    "count",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="How many of each log's last lines to print first.",
)
follow_interval_option = click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=0.25,
    show_default=True,
    hidden=True,
    help="Seconds between looks at the files with -f.",
)


def print_json(data: Any) -> None:
    """Stable, sorted JSON on stdout: the machine-readable face of every listing."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False))


def print_table(
    title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], wrap: Sequence[str] = ()
) -> None:
    """A table for people; empty cells print as '-'. Only the ``wrap`` columns (long text
    such as a summary) wrap on a narrow terminal; others fold only as a last resort."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        table.add_column(column, overflow="fold", ratio=1 if column in wrap else None)
    for row in rows:
        table.add_row(*("-" if cell is None or cell == "" else str(cell) for cell in row))
    console = Console()
    if not console.is_terminal:
        # Piped or logged: no terminal width to honour, and folded words break greps.
        console = Console(width=200)
    console.print(table)
