"""``harness deploy write``: a deploy for the GPUs this process sees (seed: "A deploy written
for you"). The layout is :func:`harness.runtime.deploywrite.write_deploy`'s; this module
picks the inventory, the services and the output path.
"""

from __future__ import annotations

from pathlib import Path

import click

from harness.cli import State
from harness.cli.commands.plan import GPUS_HELP, inventory, select_services


@click.group(
    help="Deploys for this machine: `harness deploy write` writes one for its GPUs.\n\n\b\nExamples:\n  harness deploy write"
)
def command() -> None:
    """The ``deploy`` group; its subcommands do the work."""


@command.command(
    "write",
    help="Write a deploy for the GPUs this machine sees (or --gpus).\n\n\b\nExamples:\n  harness deploy write                     # configs/deploy/<hostname>.toml\n  harness deploy write --gpus 2x24 -o -    # rehearse a machine with two 24 GB GPUs, to stdout",
)
@click.option(
    "-o", "--output", metavar="PATH", help="Where to write ('-' for stdout) [default: configs/deploy/<hostname>.toml]."
)
@click.option("--gpus", "gpus_spec", metavar="SPEC", help=GPUS_HELP)
@click.option("--agent", metavar="CONFIG", help="Cover only this agent config's services (the others are written off).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override an agent config key (TOML value).")
@click.option("--service", "names", multiple=True, metavar="NAME", help="Cover only this service (repeatable).")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.pass_obj
def write(
    state: State,
    output: str | None,
    gpus_spec: str | None,
    agent: str | None,
    sets: tuple[str, ...],
    names: tuple[str, ...],
    force: bool,
) -> None:
    import socket
    import tomllib

    from harness.errors import InputError
    from harness.manifests.loading import display_path
    from harness.runtime.deploywrite import default_path, instance_state, port_in_use, write_deploy
    from harness.runtime.portregistry import reserve

    project = state.project()
    services = project.load_services()
    selection = select_services(project, services, None, agent=agent, sets=sets, names=names, benchmark=None)
    why = f"not needed by agent {agent}" if agent is not None else "not selected with --service"
    left_out = {n: why for n in services if n not in selection.names}
    gpus = inventory(gpus_spec)
    machine = socket.gethostname() if gpus_spec is None else f"a machine with --gpus {gpus_spec}"
    path = Path(output).expanduser() if output and output != "-" else default_path(project.deploy_dir)
    if output != "-" and path.exists() and not force:
        raise InputError(f"{display_path(path)} exists; pass --force to overwrite it")
    # Ports are probed on this machine even with --gpus: the file is written here, for here.
    # Ports another written deploy reserved are taken too, running or not (one port per instance).
    with reserve(state.home, path) as reservation:
        text, layout = write_deploy(
            services,
            gpus,
            taken=reservation.taken(port_in_use),
            machine=machine,
            left_out=left_out,
            preferred=reservation.previous,
            state=instance_state(state.home, project.root, path),
        )
        if output == "-":
            click.echo(text, nl=False)
            reservation.keep(reservation.previous)  # printing reserves nothing new
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write beside and rename, so a reader never sees half a deploy.
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
        written = tomllib.loads(text).get("services", {})
        reservation.keep({n: t["port"] for n, t in written.items() if isinstance(t.get("port"), int)})
    click.echo(f"wrote {display_path(path)}: {layout.described()}")
    click.echo(f"check it with: harness --deploy {display_path(path)} plan")
