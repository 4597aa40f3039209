"""``harness ui [--open]``: a one-time URL of the broker's web UI (:mod:`harness.runtime.webui`)."""

from __future__ import annotations

import click

from harness.cli import State


@click.command(
    help="Print a one-time URL of the web UI of the running broker (services, live events, logs, "
    "start/stop per service, recent runs); with --open, open it in a browser. The broker listens on "
    "loopback only: from another machine, forward its port through SSH first (ssh -L PORT:127.0.0.1:PORT "
    "HOST, PORT the URL's) and open the URL on your own machine.\n\n\b\nExamples:\n"
    "  harness ui\n  harness ui --open"
)
@click.option("--open", "open_browser", is_flag=True, help="Open the URL in a browser instead of printing it.")
@click.pass_obj
def command(state: State, open_browser: bool) -> None:
    from harness.cli.commands.status import _state_dir
    from harness.runtime.broker import ui_login_url
    from harness.runtime.webui import CODE_SECONDS

    url = ui_login_url(_state_dir(state))
    if open_browser:
        import webbrowser

        if webbrowser.open(url):
            click.echo(f"opened the web UI in a browser (the link works once, within {CODE_SECONDS:g} s)", err=True)
            return
        click.echo("no browser to open here; open this URL yourself:", err=True)
    click.echo(url)
    click.echo(f"(works once, within {CODE_SECONDS:g} s; it sets a cookie for this broker)", err=True)
