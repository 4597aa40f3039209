"""``harness status``: what harness runs for this project, from the broker or pid files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from harness.cli import State


def _state_dir(state: State) -> Path:
    from harness.runtime.session import default_state_dir

    project = state.project()
    deploy = project.load_deploy(state.deploy_path) if state.deploy_path else None
    return default_state_dir(state.home, project.root, deploy)


def print_status(status: dict[str, Any], state_dir: Path) -> None:
    from harness.cli.output import print_table

    broker = status.get("broker")
    if broker:
        click.echo(f"broker: {broker.get('url', '?')} (pid {broker.get('pid', '?')}), state {state_dir}")
    else:
        click.echo(f"broker: not running (state {state_dir})")
    # Broker processes of this folder that broker.json does not name (`harness down` stops them).
    others = [pid for pid in status.get("brokers", []) if not broker or pid != broker.get("pid")]
    if others:
        click.echo(f"other broker processes of this state folder: {', '.join(map(str, others))} (harness down)")
    runs = (broker or {}).get("runs") or []
    if runs:
        click.echo("runs joined: " + ", ".join(f"{r.get('run')} (pid {r.get('pid')})" for r in runs))
    rows = []
    now = time.time()
    for service in status.get("services", []):
        uptime = service.get("uptime_s")
        if uptime is None and isinstance(service.get("started"), (int, float)) and service.get("alive"):
            uptime = now - service["started"]  # from a pid file, when the broker is gone
        memory = service.get("memory_bytes")
        gpu_memory = service.get("gpu_memory_bytes")
        state_word = service.get("state") or ("alive" if service.get("alive") else "gone")
        if service.get("foreign"):
            state_word += " (foreign)"
        rows.append(
            [
                service.get("name"),
                service.get("mode"),
                service.get("gpu"),
                state_word,
                service.get("pid"),
                service.get("port"),
                f"{uptime:.0f}s" if isinstance(uptime, (int, float)) else None,
                f"{memory / 2**20:.0f} MiB" if isinstance(memory, (int, float)) else None,
                f"{gpu_memory / 2**20:.0f} MiB" if isinstance(gpu_memory, (int, float)) else None,
            ]
        )
    print_table(None, ["service", "mode", "gpu", "state", "pid", "port", "uptime", "memory", "gpu memory"], rows)


def _watch(state_dir: Path, as_json: bool, interval: float) -> None:
    """``status --watch``: the status every ``interval`` seconds until Ctrl-C."""
    import json
    import sys

    from harness.runtime.broker import status

    in_place = sys.stdout.isatty() and not as_json
    try:
        while True:
            current = status(state_dir)
            if as_json:
                click.echo(json.dumps({"at": time.time(), **current}, sort_keys=True))
            else:
                if in_place:
                    click.clear()
                click.echo(f"--- {time.strftime('%H:%M:%S')} (every {interval:g} s; Ctrl-C to stop)")
                print_status(current, state_dir)
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        pass


def rehearse(state: State, gpus_spec: str) -> dict[str, Any]:
    """The plan of every service under the deploy on the ``--gpus`` machine (a rehearsal)."""
    from harness.runtime.inventory import parse_gpus
    from harness.runtime.placement import plan

    project = state.project()
    deploy = project.load_deploy(state.deploy_path) if state.deploy_path else None
    return plan(project.load_services(), deploy, parse_gpus(gpus_spec)).as_json()


@click.command(
    help="Show the services harness runs: mode, GPU, state, pid, port, uptime, memory (host RSS) and GPU memory "
    "(from NVML, where a driver answers).\n\n\b\nExamples:\n  harness status\n  harness status --watch --interval 5\n  harness status --gpus 4x24     # also where the deploy would put each service"
)
@click.option(
    "--gpus",
    "gpus_spec",
    metavar="SPEC",
    help="Also show where the deploy would put every service on these GPUs: 4x24, 24,24,80, or none.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option(
    "--watch",
    is_flag=True,
    help="Show it again every --interval seconds until Ctrl-C (on a terminal, in place; else one after another, "
    "with --json one line each).",
)
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Seconds between looks."
)
@click.pass_obj
def command(state: State, gpus_spec: str | None, as_json: bool, watch: bool, interval: float) -> None:
    from harness.cli.output import print_json, print_table
    from harness.runtime.broker import status

    state_dir = _state_dir(state)
    if watch:
        if gpus_spec is not None:
            raise click.UsageError("--watch shows what runs; --gpus rehearses a plan: give one of them")
        _watch(state_dir, as_json, interval)
        return
    current = status(state_dir)
    planned = rehearse(state, gpus_spec) if gpus_spec is not None else None
    if as_json:
        print_json(current if planned is None else {**current, "planned": {**planned, "gpus_spec": gpus_spec}})
        return
    print_status(current, state_dir)
    if planned is not None:
        running = {s.get("name") for s in current.get("services", []) if s.get("alive") or s.get("state") == "ready"}
        click.echo(f"with --gpus {gpus_spec}, the deploy would run:")
        print_table(
            None,
            ["service", "mode", "gpu", "swap", "port", "running now", "why"],
            [
                [
                    p["name"],
                    p["mode"],
                    p["gpu"],
                    p["swap"],
                    p["port"],
                    "yes" if p["name"] in running else "",
                    p["reason"],
                ]
                for p in planned["services"]
            ],
            wrap=["why"],
        )
        for note in planned["notes"]:
            click.echo(f"note: {note}")
