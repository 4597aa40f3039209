"""``harness completion bash|zsh|fish``: the shell's completion script (click's own).

\b
Examples:
  harness completion bash > ~/.local/share/bash-completion/completions/harness
  harness completion zsh > "${fpath[1]}/_harness"
  harness completion fish > ~/.config/fish/completions/harness.fish
  eval "$(harness completion bash)"        # this shell only
"""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")


HELP = """Print the completion script for SHELL: commands, options and arguments complete as the
CLI defines them.

\b
Examples:
  harness completion bash > ~/.local/share/bash-completion/completions/harness
  harness completion zsh > "${fpath[1]}/_harness"
  harness completion fish > ~/.config/fish/completions/harness.fish
  eval "$(harness completion bash)"        # this shell only
"""


@click.command(help=HELP)
@click.argument("shell", type=click.Choice(SHELLS))
def command(shell: str) -> None:
    """Print the completion script for ``shell``: commands, options and arguments complete
    as the CLI defines them (``_HARNESS_COMPLETE`` is the variable the script sets)."""
    from click.shell_completion import get_completion_class

    from harness.cli import cli

    completion_class = get_completion_class(shell)
    assert completion_class is not None  # one of click's three, by the choice above
    click.echo(completion_class(cli, {}, "harness", "_HARNESS_COMPLETE").source())
