"""``harness closure``: which services and benchmark a run of an agent config needs."""

from __future__ import annotations

from typing import Any

import click

from harness.cli import State


@click.command(help="Show the services and benchmark an agent config's run needs.")
@click.option("--agent", "agent", default="default", show_default=True, help="Agent config name or path.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a config key (TOML value).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def command(state: State, agent: str, sets: tuple[str, ...], as_json: bool) -> None:
    from harness.cli.output import print_json
    from harness.manifests.agent import parse_override, services_needed

    project = state.project()
    config = project.load_agent(agent, [parse_override(text) for text in sets])
    services = project.load_services()
    benchmarks = project.load_benchmarks()
    off: frozenset[str] = frozenset()
    if state.deploy_path is not None:
        deploy = project.load_deploy(state.deploy_path)
        off = frozenset(name for name, s in deploy.services.items() if s.mode == "off")
    closure = services_needed(
        config,
        {name: m.kind for name, m in services.items()},
        off=off,
        benchmarks=frozenset(benchmarks),
    )
    data: dict[str, Any] = {
        "services": sorted(closure.services),
        "benchmark": closure.benchmark,
        "skills_on": list(closure.skills_on),
        "skills_dropped": [{"skill": s, "why": why} for s, why in closure.skills_dropped],
    }
    if as_json:
        print_json(data)
        return
    click.echo(f"services:  {', '.join(data['services']) or '(none)'}")
    click.echo(f"benchmark: {closure.benchmark or '(none)'}")
    click.echo(f"skills on: {', '.join(closure.skills_on) or '(none)'}")
    for skill, why in closure.skills_dropped:
        click.echo(f"dropped:   {skill} ({why})")
