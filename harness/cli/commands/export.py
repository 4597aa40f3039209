"""``harness export``: a lock in a standard format."""

from __future__ import annotations

from pathlib import Path

import click

from harness.cli import State


@click.command(
    help="Write a lock as hashed requirements.txt or PEP 751 pylock.toml.\n\n\b\nExamples:\n  harness export kinematics -o requirements.txt\n  harness export kinematics --format pylock -o pylock.toml"
)
@click.argument("name")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["requirements", "pylock"]),
    default="requirements",
    show_default=True,
    help="requirements: hashed requirements.txt for pip/uv; pylock: PEP 751 pylock.toml.",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
@click.pass_obj
def command(state: State, name: str, fmt: str, output: Path | None) -> None:
    from harness.config import load_settings
    from harness.errors import HarnessError
    from harness.lock.lockfile import lock_path, read

    project = state.project()
    path = lock_path(project.locks_dir, name)
    if not path.is_file():
        raise HarnessError(f"no lock for {name!r} at {path}", hint=f"run `harness lock {name}` first")
    lock = read(path)
    settings = load_settings(state.home, project.root)
    if fmt == "requirements":
        from harness.lock.export import to_requirements

        text = to_requirements(lock, settings)
    else:
        from harness.lock.export import to_pylock

        text = to_pylock(lock, settings, cache_dir=state.home / "cache")
    from harness.lock.export import unexported

    for note in unexported(lock, fmt):
        click.echo(f"note: {name}: {note}", err=True)
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        click.echo(f"wrote {output}", err=True)
