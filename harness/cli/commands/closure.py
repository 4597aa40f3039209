"""``harness closure``: which services and benchmark a run of an agent config needs."""

from __future__ import annotations

from typing import Any

import click

from harness.cli import State


@click.command(
    help="Show the services and benchmark an agent config's run needs.\n\n\b\nExamples:\n  harness closure --agent default\n  harness closure --agent kinematics-only --set agent.benchmark=reach-remote"
)
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
    deploy = None
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
        "simulator": _simulator(closure.benchmark, benchmarks, deploy),
    }
    if as_json:
        print_json(data)
        return
    click.echo(f"services:  {', '.join(data['services']) or '(none)'}")
    click.echo(f"benchmark: {closure.benchmark or '(none)'}")
    simulator = data["simulator"]
    if simulator is not None:
        if simulator["runs"] == "elsewhere":
            where = f"at {simulator['url']}" if simulator["url"] else "no deploy gives its address yet"
            click.echo(f"simulator: elsewhere ({where}); only its client is installed here")
        else:
            click.echo("simulator: here (its environment and workers are installed and run here)")
        env = simulator["environment"]
        label = "client env:" if simulator["runs"] == "elsewhere" else "environment:"
        click.echo(
            f"{label} python {env['python']}; requirements: {', '.join(env['requirements']) or '(none)'}"
            + (f"; sources: {', '.join(env['sources'])}" if env["sources"] else "")
        )
    click.echo(f"skills on: {', '.join(closure.skills_on) or '(none)'}")
    for skill, why in closure.skills_dropped:
        click.echo(f"dropped:   {skill} ({why})")


def _simulator(name: str | None, benchmarks: dict[str, Any], deploy: Any) -> dict[str, Any] | None:
    """Where the benchmark's simulator runs and the environment installed here for it: the
    whole simulator's, or, for one that runs elsewhere, its client's alone."""
    from harness.runtime.placement import remote_simulator

    manifest = benchmarks.get(name) if name is not None else None
    if manifest is None:
        return None
    remote = remote_simulator(name, manifest, deploy)
    env = manifest.environment
    return {
        "runs": "elsewhere" if remote is not None else "here",
        "url": remote.url if remote is not None else None,
        "environment": {
            "python": env.python,
            "requirements": list(env.requirements),
            "sources": [f"{source.name}@{source.rev}" for source in env.sources],
        },
    }
