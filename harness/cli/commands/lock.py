"""``harness lock``: pin every input of the project's manifests into locks/."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from harness.cli import State

if TYPE_CHECKING:
    from rich.console import Console

    from harness.lock.outcome import LockOptions, Outcome
    from harness.manifests.project import Project


@click.command(
    help="Pin every input of the named manifests (all when none) into locks/; `image:LABEL` names the "
    "rootfs template harbor/images/LABEL.toml (all are locked when no name is given).\n\n\b\nExamples:\n  harness lock                                # every manifest and template; says what changed\n  harness lock image:kuka-solver-v043         # one rootfs template\n  harness lock --check kinematics reach       # exit 1 if either lock is stale\n  harness lock sam3 --upgrade-package torch"
)
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
    help="Lock for this platform alone, this once (uv's vocabulary, e.g. aarch64-manylinux_2_28); "
    "with --check, a lock not made for it is stale [default: harness.toml [lock] platforms, else this machine].",
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
    images = [n.removeprefix("image:") for n in names if n.startswith("image:")]
    names = tuple(n for n in names if not n.startswith("image:"))
    if check:
        _check(
            state,
            project,
            list(names),
            as_json=as_json,
            platform=platform,
            images=None if not names and not images else images,
        )

    from harness.lock.outcome import LockOptions

    options = LockOptions(
        platform=platform,
        offline=offline,
        upgrade=upgrade,
        upgrade_packages=tuple(upgrade_packages),
        jobs=jobs,
        refresh=refresh,
    )
    shown = _Shown.on_stderr(project.root, as_json=as_json)
    outcomes = _lock(state, project, list(names), options, shown) if names or not images else []
    templates = _lock_images(state, project, images if names or images else None, options, shown)
    if as_json:
        print_json({**_locks_json(outcomes), "images": [t.__dict__ | {"path": str(t.path)} for t in templates]})
    failed = [o.error for o in outcomes if o.error] + [t.error for t in templates if t.error]
    if failed:
        from harness.errors import InputError

        bad_input = not any(o.error for o in outcomes) and all(t.bad_input for t in templates if t.error)
        raise (InputError if bad_input else HarnessError)("\n".join(e or "" for e in failed))


def _lock_images(
    state: State, project: Project, images: list[str] | None, options: LockOptions, shown: _Shown
) -> list[Any]:
    """Lock rootfs templates (None: every one of the project), each reported as it ends."""
    if images is None and not (project.root / "harbor" / "images").is_dir():
        return []  # a project without templates loads nothing more (a no-op lock stays fast)
    from harness.lock.images import lock_templates

    outcomes = lock_templates(
        state.home, project.root, images, offline=options.offline, refresh=options.refresh or options.upgrade
    )
    for t in outcomes:
        if shown.as_json:
            continue
        if t.error:
            shown.say("failed", "red", f"image:{t.label}")
        elif t.changed:
            shown.say("locked", "green", f"image:{t.label} -> {t.path.relative_to(project.root)}")
        else:
            shown.say("unchanged", "dim", f"image:{t.label} ({t.path.relative_to(project.root)})")
    return outcomes


def _check(
    state: State, project: Project, names: list[str], *, as_json: bool, platform: str | None, images: list[str] | None
) -> NoReturn:
    """``lock --check``: print every stale lock (or that none is) and exit 1 if there is one."""
    from harness.cli.output import print_json
    from harness.lock.flow import stale_locks

    stale = stale_locks(state.home, project, names, platform=platform) if names or images is None else []
    if images or (project.root / "harbor" / "images").is_dir():  # else nothing more is imported
        from harness.lock.check import Staleness
        from harness.lock.images import lock_path, stale_reason
        from harness.manifests.template import labels

        for label in labels(project.root) if images is None else images:
            reason = stale_reason(project.root, label)
            if reason:
                stale.append(Staleness(f"image:{label}", lock_path(project.root, label), reason))
    if as_json:
        print_json({"stale": [{"name": s.name, "lock": str(s.lock), "reason": s.reason} for s in stale]})
    else:
        for item in stale:
            click.echo(f"stale  {item.name}: {item.reason} ({item.lock.relative_to(project.root)})")
        if not stale:
            click.echo("every lock is up to date")
        missing = [item.name for item in stale if item.reason == "missing"]
        if missing:
            # A fresh clone of this repository ships only the CPU example's locks: the GPU
            # services' manifests are there to be locked where they run.
            click.echo(
                f"{len(missing)} manifest(s) were never locked here ({', '.join(missing)}): expected for those "
                "you do not use yet; `harness lock NAME` locks one, `harness lock --check NAME...` checks only those",
                err=True,
            )
    raise SystemExit(1 if stale else 0)


@dataclass(frozen=True)
class _Shown:
    """How each manifest's outcome shows on stderr as it comes: colours and a spinner on a
    terminal, plain lines otherwise (without loading rich: 30 ms), nothing with ``--json``."""

    root: Path
    as_json: bool
    console: Console | None

    @classmethod
    def on_stderr(cls, root: Path, *, as_json: bool) -> _Shown:
        import sys

        console = None
        if sys.stderr.isatty():
            from rich.console import Console

            console = Console(stderr=True)
        return cls(root, as_json, console)

    def say(self, word: str, style: str, rest: str) -> None:
        if self.console is not None:
            self.console.print(f"[{style}]{word}[/{style}] {rest}")
        else:
            click.echo(f"{word} {rest}", err=True)

    def report(self, outcome: Outcome) -> None:
        """One manifest's line: failed, locked (with what changed) or unchanged."""
        if self.as_json:
            return
        shown = outcome.path.relative_to(self.root)
        if outcome.error:
            self.say("failed", "red", outcome.name)
        elif outcome.changed:
            self.say("locked", "green", f"{outcome.name} -> {shown}")
            for change in outcome.changes:
                click.echo(f"  {change}", err=True)
        else:
            self.say("unchanged", "dim", f"{outcome.name} ({shown})")

    def status(self) -> contextlib.AbstractContextManager[object]:
        """The spinner shown while the manifests lock (none off a terminal)."""
        if self.console is None:
            return contextlib.nullcontext()
        return self.console.status("locking…", spinner="dots")


def _lock(state: State, project: Project, names: list[str], options: LockOptions, shown: _Shown) -> list[Outcome]:
    """Every outcome, reported as it comes: answered from the stamps when no input changed
    (before loading any model), else by the full path (harness.lock.flow)."""
    from harness.lock.flow import lock_with_early_runs, unchanged_outcomes

    outcomes = unchanged_outcomes(state.home, project, names, options)
    if outcomes is None:
        return lock_with_early_runs(state.home, project, names, options, on_done=shown.report, status=shown.status)
    for outcome in outcomes:
        shown.report(outcome)
    return outcomes


def _locks_json(outcomes: list[Outcome]) -> dict[str, Any]:
    """``lock --json``'s document: every manifest's outcome."""
    return {
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
