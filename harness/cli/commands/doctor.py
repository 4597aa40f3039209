"""``harness doctor``: what is installed, what a run would still install, GPUs, health."""

from __future__ import annotations

import click

from harness.cli import State
from harness.cli.commands.plan import GPUS_HELP


@click.command(
    help="What is installed, what a run would install, GPUs, stale locks, store health.\n\n\b\nExamples:\n  harness doctor\n  harness doctor --agent default --gpus 1x24"
)
@click.option("--agent", help="Say what a run of this agent config would still install.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override an agent config key.")
@click.option("--gpus", "gpus_spec", metavar="SPEC", help=GPUS_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.pass_obj
def command(state: State, agent: str | None, sets: tuple[str, ...], gpus_spec: str | None, as_json: bool) -> None:
    from harness.cli.output import print_json
    from harness.runtime.doctor import diagnose

    report = diagnose(state, agent=agent, sets=sets, gpus=gpus_spec)
    if as_json:
        print_json(report)
        return
    gpus = report["gpus"]
    click.echo(
        f"GPUs ({report['gpus_from']}): "
        + (
            ", ".join(f"{g['index']}: {g['name']} {g['free_gb']:.1f}/{g['total_gb']:.1f} GB free" for g in gpus)
            or "none found (CPU-only services still run)"
        )
    )
    for name, item in sorted(report["manifests"].items()):
        click.echo(f"{name:<14} {item['state']:<12} {item.get('detail', '')}")
    if report.get("run_would_install") is not None:
        pending = report["run_would_install"]
        click.echo("a run would install: " + (", ".join(pending) if pending else "nothing (all realized)"))
        for name, why in sorted(report["run_skips"].items()):
            click.echo(f"  not installed: {name} ({why})")
        simulator = report.get("run_simulator")
        if simulator:
            where = f"at {simulator['url']}" if simulator["url"] else "no deploy gives its address yet"
            click.echo(
                f"  not installed: the simulator of {simulator['benchmark']} (elsewhere, {where}); "
                f"only its client, {simulator['benchmark']}, is"
            )
    store = report["store"]
    click.echo(f"store: {store['paths']} paths, {store['problems']} problem(s) at {store['root']}")
    for line in store["details"]:
        click.echo(f"  {line}")
    if report["problems"]:
        raise SystemExit(1)
