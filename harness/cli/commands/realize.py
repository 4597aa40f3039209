"""``harness realize``: build what the locks name into the store."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from harness.cli import State
from harness.cli.output import quiet_option, realize_jobs_option, variant_option

if TYPE_CHECKING:
    from harness.realize.builder import Report
    from harness.realize.rootfs import Realized


@click.command(
    help="Build what the locks name into the store (all when none named).\n\n\b\nExamples:\n  harness realize\n  harness realize kinematics reach --offline\n  harness realize --variant cu128 robodojo   # for a cache, on a machine without a GPU"
)
@click.argument("names", nargs=-1)
@click.option("--offline", is_flag=True, help="Never touch the network; list everything missing.")
@realize_jobs_option
@click.option(
    "--fail-fast",
    is_flag=True,
    help="Stop at the first lock that fails [default: realize every other one, then list each failure].",
)
@click.option(
    "--refresh",
    is_flag=True,
    help="Ask uv again now for a lock's interpreter whose download failed recently "
    "[default: a failure is trusted for [python] download-retry-minutes].",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was built as JSON.")
@variant_option
@quiet_option
@click.pass_obj
def command(
    state: State,
    names: tuple[str, ...],
    offline: bool,
    jobs: int,
    fail_fast: bool,
    refresh: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    from harness.realize.builder import RealizeFailed
    from harness.realize.install import realize_names

    images = [n.removeprefix("image:") for n in names if n.startswith("image:")]
    names = tuple(n for n in names if not n.startswith("image:"))
    if images or not names:
        templates = _realize_images(state, images or None, offline=offline, as_json=as_json)
        if images and not names:
            if as_json:
                from harness.cli.output import print_json

                print_json(
                    [
                        {"name": f"image:{t.label}", "store": str(state.home / "store" / t.store), "built": t.built}
                        for t in templates
                    ]
                )
            return
        if not names and templates and not any(state.project().locks_dir.glob("*.lock.toml")):
            return
    try:
        reports = realize_names(
            state,
            list(names),
            offline=offline,
            jobs=jobs,
            lock_missing=False,
            show_progress=not quiet,
            fail_fast=fail_fast,
            refresh=refresh,
        )
    except RealizeFailed as exc:
        _print(exc.reports, as_json, state, failures=exc.failures)
        raise
    _print(reports, as_json, state)


def _realize_images(state: State, images: list[str] | None, *, offline: bool, as_json: bool) -> list[Realized]:
    """Realize rootfs templates (None: every locked one), one line each."""
    if images is None and not (state.project().root / "locks" / "images").is_dir():
        return []  # nothing more is imported where no template is locked
    from harness.realize.rootfs import realize_templates

    root = state.home / "store"
    done = realize_templates(state.home, state.project().root, images, offline=offline)
    for t in done:
        if as_json:
            continue
        click.echo(f"image:{t.label}: {'built' if t.built else 'up to date'} -> {root / t.store}")
    return done


def _print(reports: list[Report], as_json: bool, state: State, failures: dict[str, str] | None = None) -> None:
    from harness.cli.output import print_json

    root = state.home / "store"
    if as_json:
        print_json(
            [
                {
                    "name": r.name,
                    "environment": str(root / r.environment),
                    "built": r.built,
                    "impure": r.impure,
                    "error": None,
                }
                for r in reports
            ]
            + [
                {"name": name, "environment": None, "built": [], "impure": [], "error": message}
                for name, message in (failures or {}).items()
            ]
        )
        return
    for report in reports:
        state_word = f"built {len(report.built)}" if report.built else "up to date"
        click.echo(f"{report.name}: {state_word} -> {root / report.environment}")
        for note in report.impure:
            click.echo(f"  impure: {note}")
