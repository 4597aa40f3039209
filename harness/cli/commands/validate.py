"""``harness validate``: check every file of the project, report every problem at once."""

from __future__ import annotations

import click

from harness.cli import State


@click.command(
    help="Check every manifest, agent config and deploy; exit 2 on errors.\n\n\b\nExamples:\n  harness validate\n  harness validate --json"
)
@click.option("--json", "as_json", is_flag=True, help="Print the checked files as JSON.")
@click.pass_obj
def command(state: State, as_json: bool) -> None:
    from harness.cli.output import print_json
    from harness.manifests.validate import validate_project

    report = validate_project(state.project(), extra_deploy=state.deploy_path)
    if as_json:
        print_json(report.as_dict())
    else:
        for path in report.checked:
            click.echo(f"ok  {path}")
    if report.problems:
        from harness.errors import InputError

        raise InputError("\n".join(report.problems))
