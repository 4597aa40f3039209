"""``harness plan``: where and how each service would run on this machine (or another).

The planner itself is :func:`harness.runtime.placement.plan`; this module only gathers its
inputs (manifests, the global ``--deploy``, an inventory from ``--gpus`` or NVML) and prints
the result. :func:`select_services` is shared with ``harness deploy write``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from harness.cli import State

if TYPE_CHECKING:
    from harness.manifests.deploy import Deploy
    from harness.manifests.model import ServiceManifest


@dataclass(frozen=True)
class Selection:
    """The services a command covers, the benchmark sizing simulator workers, and why."""

    names: tuple[str, ...]
    benchmark: str | None
    notes: tuple[str, ...] = ()


def select_services(
    project: Any,
    services: dict[str, ServiceManifest],
    deploy: Deploy | None,
    *,
    agent: str | None,
    sets: tuple[str, ...],
    names: tuple[str, ...],
    benchmark: str | None,
) -> Selection:
    """Resolve ``--agent``/``--set``, ``--service`` and ``--benchmark`` into a selection.

    ``--agent``: the agent config's closure (skills off, or whose services the deploy turns
    off, drop out) and its benchmark. ``--service``: exactly the named services. Neither:
    every manifest. The benchmark is ``--benchmark``, else the agent's; when the deploy runs
    simulator workers and neither names one, the default agent's benchmark, else the
    project's only benchmark (so the workers' memory is counted).
    """
    from harness.errors import InputError
    from harness.manifests.agent import parse_override, services_needed

    if agent is not None and names:
        raise click.UsageError("use --agent or --service, not both")
    if sets and agent is None:
        raise click.UsageError("--set applies to an agent config: add --agent NAME")
    benchmarks = project.load_benchmarks()
    if benchmark is not None and benchmark not in benchmarks:
        raise InputError(f"--benchmark {benchmark}: no manifest benchmarks/{benchmark}.toml")
    notes: list[str] = []
    if agent is not None:
        config = project.load_agent(agent, [parse_override(text) for text in sets])
        off = frozenset(n for n, s in (deploy.services.items() if deploy is not None else ()) if s.mode == "off")
        closure = services_needed(
            config, {n: m.kind for n, m in services.items()}, off=off, benchmarks=frozenset(benchmarks)
        )
        chosen = tuple(sorted(closure.services))
        benchmark = benchmark or closure.benchmark
    elif names:
        unknown = [n for n in names if n not in services]
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], sorted(services), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise InputError(f"--service {unknown[0]}: no manifest services/{unknown[0]}.toml{hint}")
        chosen = tuple(sorted(set(names)))
    else:
        chosen = tuple(sorted(services))
    has_workers = deploy is not None and deploy.sim is not None and bool(deploy.sim.gpus)
    if benchmark is None and has_workers:
        # Size the workers as a run would: the default agent's benchmark, else the only one.
        benchmark, why = _default_benchmark(project, benchmarks)
        if benchmark is not None:
            notes.append(f"simulator workers sized by benchmarks/{benchmark}.toml ({why}; --benchmark to change)")
    return Selection(chosen, benchmark, tuple(notes))


def _default_benchmark(project: Any, benchmarks: dict[str, Any]) -> tuple[str | None, str]:
    """The benchmark a plain ``harness run`` would use: ``configs/agents/default.toml``'s,
    else the project's only benchmark manifest; ``(None, "")`` when neither says."""
    from harness.errors import InputError

    if project.agent_path("default").is_file():
        try:
            name = project.load_agent("default").agent.benchmark
        except InputError:
            name = None  # a broken default agent is `harness validate`'s to report, not plan's
        if name in benchmarks:
            return name, "the default agent's benchmark"
    if len(benchmarks) == 1:
        return next(iter(benchmarks)), "the project's only benchmark"
    return None, ""


def inventory(gpus_spec: str | None) -> tuple[Any, ...]:
    """``--gpus SPEC`` when given, else what NVML reports (empty without a GPU)."""
    from harness.runtime.inventory import detect_gpus, parse_gpus

    return parse_gpus(gpus_spec) if gpus_spec is not None else detect_gpus()


GPUS_HELP = "Plan for these GPUs instead of the ones seen: 4x24, 24,24,80, or none."


@click.command(
    help="Show where and how each service would run: mode, GPU, swap group, port.\n\n\b\nExamples:\n  harness plan\n  harness plan --gpus 1x24 --agent default    # rehearse another machine"
)
@click.option("--gpus", "gpus_spec", metavar="SPEC", help=GPUS_HELP)
@click.option("--agent", metavar="CONFIG", help="Only the services this agent config's run needs.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override an agent config key (TOML value).")
@click.option("--service", "names", multiple=True, metavar="NAME", help="Only this service (repeatable).")
@click.option("--benchmark", metavar="NAME", help="Benchmark whose workers [sim] runs [default: the agent's].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def command(
    state: State,
    gpus_spec: str | None,
    agent: str | None,
    sets: tuple[str, ...],
    names: tuple[str, ...],
    benchmark: str | None,
    as_json: bool,
) -> None:
    from dataclasses import replace

    from harness.cli.output import print_json, print_table
    from harness.runtime.inventory import describe
    from harness.runtime.placement import gb, plan

    project = state.project()
    services = project.load_services()
    deploy = project.load_deploy(state.deploy_path) if state.deploy_path is not None else None
    selection = select_services(project, services, deploy, agent=agent, sets=sets, names=names, benchmark=benchmark)
    gpus = inventory(gpus_spec)
    bench = project.load_benchmarks().get(selection.benchmark) if selection.benchmark else None
    result = plan(
        {n: services[n] for n in selection.names}, deploy, gpus, benchmark=bench, benchmark_name=selection.benchmark
    )
    result = replace(
        result, notes=selection.notes + result.notes + tuple(_variant_notes(project, selection, gpus_spec))
    )

    if as_json:
        data = result.as_json()
        data["benchmark"] = selection.benchmark
        data["deploy"] = str(state.deploy_path) if state.deploy_path is not None else None
        print_json(data)
        return
    click.echo(f"deploy: {state.deploy_path if state.deploy_path is not None else '(none)'}")
    for i, line in enumerate(describe(result.gpus).split("; ")):
        click.echo(f"{'GPUs:' if i == 0 else '':<8}{line}")
    _print_services(result)
    if result.sim_workers:
        per = f" ({gb(bench.vram_gb)} GB each, {selection.benchmark})" if bench is not None else ""
        click.echo(f"simulator workers{per}:")
        print_table(
            None,
            ["worker", "gpu", "port"],
            [[w.index, w.gpu, w.port] for w in result.sim_workers],
        )
    for note in result.notes:
        click.echo(f"note: {note}")


def _variant_notes(project: Any, selection: Selection, gpus_spec: str | None) -> list[str]:
    """Which accelerator variant each planned manifest's lock takes here (``--gpus none``:
    as on a machine without a GPU), and why (``harness/lock/variants.py``)."""
    from harness.lock.lockfile import lock_path
    from harness.runtime.doctor import variant_notes

    names = [*selection.names, *([selection.benchmark] if selection.benchmark else [])]
    locks = {name: lock_path(project.locks_dir, name) for name in names}
    no_gpu = gpus_spec is not None and gpus_spec.strip().lower() == "none"
    return variant_notes({n: p for n, p in locks.items() if p.is_file()}, no_gpu=no_gpu)


def _print_services(result: Any) -> None:
    """The plan's table. Short columns never wrap and only ``reason`` folds; piped output
    gets a wide console rather than rich's 80 columns, so a plan saved to a file reads as
    one line per service."""
    import sys

    from rich.console import Console
    from rich.table import Table

    from harness.runtime.placement import gb

    table = Table(title_justify="left")
    for column in ("service", "mode", "gpu", "swap", "vram_gb", "port", "url"):
        table.add_column(column, no_wrap=True)
    table.add_column("reason", overflow="fold")
    for p in result.services:
        cells = [p.name, p.mode, p.gpu, p.swap, gb(p.vram_gb), p.port, p.url, p.reason]
        table.add_row(*("-" if cell is None or cell == "" else str(cell) for cell in cells))
    Console(width=None if sys.stdout.isatty() else 200).print(table)
