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
    rows = []
    now = time.time()
    for service in status.get("services", []):
        uptime = service.get("uptime_s")
        if uptime is None and isinstance(service.get("started"), (int, float)) and service.get("alive"):
            uptime = now - service["started"]  # from a pid file, when the broker is gone
        memory = service.get("memory_bytes")
        state_word = service.get("state") or ("alive" if service.get("alive") else "gone")
        if service.get("foreign"):
            state_word += " (foreign)"
        rows.append([service.get("name"), service.get("mode"), service.get("gpu"), state_word,
                     service.get("pid"), service.get("port"),
                     f"{uptime:.0f}s" if isinstance(uptime, (int, float)) else None,
                     f"{memory / 2**20:.0f} MiB" if isinstance(memory, (int, float)) else None])
    print_table(None, ["service", "mode", "gpu", "state", "pid", "port", "uptime", "memory"], rows)


@click.command(help="Show the services harness runs: mode, GPU, state, pid, port, uptime, memory.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def command(state: State, as_json: bool) -> None:
    from harness.cli.output import print_json
    from harness.runtime.broker import status

    state_dir = _state_dir(state)
    current = status(state_dir)
    if as_json:
        print_json(current)
    else:
        print_status(current, state_dir)
