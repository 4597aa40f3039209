"""``harness services``: the project's manifests at a glance."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from harness.cli import State
from harness.cli.output import print_json, print_table

if TYPE_CHECKING:
    from harness.manifests.project import Project


@click.command(
    help="List the project's service and benchmark manifests.\n\n\b\nExamples:\n  harness services\n  harness services --json"
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def command(state: State, as_json: bool) -> None:
    from harness.manifests.catalog import catalog

    project = state.project()
    entries = catalog(project)
    _add_states(entries, project, state.home)
    if as_json:
        print_json({"services": entries})
        return
    columns = ["name", "kind", "summary", "protocol", "port", "vram_gb", "state"]
    rows = [[entry[c] for c in columns[:-1]] + [_state_word(entry)] for entry in entries]
    print_table(None, columns, rows, wrap=("summary",))


def _state_word(entry: dict) -> str:
    if entry["lock"] != "ok":
        return f"lock {entry['lock']}"
    return "realized" if entry["realized"] else "locked"


def _add_states(entries: list[dict[str, Any]], project: Project, home: Path) -> None:
    """Each manifest's lock state (ok, stale, missing) and whether its store paths are all
    registered in this home. No network: path weights are re-hashed through a stat cache."""
    from harness.realize.builder import missing
    from harness.config import load_settings
    from harness.lock.check import check_locks
    from harness.lock.lockfile import lock_path, read
    from harness.store.store import Store

    stale = {s.name: s.reason for s in check_locks(project, [], settings=load_settings(home, project.root))}
    store = Store.in_home(home)
    for entry in entries:
        name = entry["name"]
        if name in stale:
            entry["lock"] = "missing" if stale[name] == "missing" else "stale"
            entry["realized"] = False
            continue
        entry["lock"] = "ok"
        entry["realized"] = not missing(store, read(lock_path(project.locks_dir, name)))
