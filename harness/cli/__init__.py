"""The ``harness`` command: a thin shell over the pipeline.

Start-up must stay light (``harness --help`` well under a quarter second), so subcommands
live in :mod:`harness.cli.commands`, one module each, imported only when invoked. Their
one-line help is kept here so ``--help`` lists them without importing anything.

Errors: a :class:`~harness.errors.HarnessError` prints ``error: …`` and exits with its code;
anything else is a bug and prints one line asking for a report (set ``HARNESS_DEBUG=1`` for
the traceback). No traceback reaches a user.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from harness.manifests.project import Project

from harness import __version__

#: Subcommand name → (module under harness.cli.commands, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "services": ("services", "List the project's service and benchmark manifests."),
    "validate": ("validate", "Check every manifest, agent config and deploy; exit 2 on errors."),
    "closure": ("closure", "Show the services and benchmark an agent config's run needs."),
    "lock": ("lock", "Pin every input of the named manifests (all when none) into locks/."),
    "export": ("export", "Write a lock as hashed requirements.txt or PEP 751 pylock.toml."),
    "realize": ("realize", "Build what the locks name into the store (all when none named)."),
    "install": ("install", "Lock if needed, then realize the named services ahead of a run."),
    "store": ("store", "Store: init, ls, path, verify, gc, why, pin, keygen, push, pull, export, import."),
    "up": ("up", "Start the resident services (or those named) and the broker."),
    "status": ("status", "Show the services harness runs: mode, GPU, state, pid, port, uptime."),
    "down": ("down", "Stop what harness up started (or the services named), nothing else."),
    "logs": ("logs", "Show the services' last log lines; -f keeps printing new ones."),
    "ui": ("ui", "Print (or --open) a one-time URL of the broker's web UI."),
    "doctor": ("doctor", "What is installed, what a run would install, GPUs, stale locks, store health."),
    "run": ("run", "Realize, place and start what a run needs, run COMMAND, record the run."),
    "runs": ("runs", "List recorded runs."),
    "audit": ("audit", "Re-check every store path a run used; exit 1 if any changed."),
    "diff": ("diff", "Say what differs between two runs."),
    "report": ("report", "Write a run's report: one self-contained HTML page."),
    "plan": ("plan", "Show where and how each service would run: mode, GPU, swap group, port."),
    "deploy": ("deploy", "Write a deploy for the GPUs this machine sees (deploy write)."),
    "completion": ("completion", "Print the shell completion script: harness completion bash|zsh|fish."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(f"harness.cli.commands.{COMMANDS[cmd_name][0]}")
        command: click.Command = module.command
        command.name = cmd_name
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """As click's, but a mistyped command is answered with the closest ones
        (``harness realise`` → "did you mean 'realize'?"), exit status 2 as any usage error."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            import difflib

            close = difflib.get_close_matches(name, self.list_commands(ctx), n=3, cutoff=0.6)
            if close:
                ctx.fail(f"No such command {name!r}. Did you mean {' or '.join(repr(c) for c in close)}?")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in sorted(COMMANDS)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _variant_from_deploy(path: Path | None) -> None:
    """The deploy's ``variant`` key, as ``HARNESS_VARIANT`` (module doc of lock/variants.py).
    A deploy that cannot be read is left to the command, which reports it by file and key."""
    if path is None:
        return
    try:
        import tomllib

        value = tomllib.loads(path.read_text(encoding="utf-8")).get("variant")
    except (OSError, ValueError):
        return
    if isinstance(value, str) and value:
        os.environ["HARNESS_VARIANT"] = value


class State:
    """Global options, resolved lazily so commands that need no project don't look for one."""

    def __init__(self, home: str | None, deploy: str | None, project: str | None) -> None:
        self._home = home
        self._deploy = deploy
        self._project = project

    @property
    def home(self) -> Path:
        """``--home``, else ``$HARNESS_HOME``, else ``~/.cache/harness`` (``~`` expanded)."""
        return Path(self._home or os.environ.get("HARNESS_HOME") or "~/.cache/harness").expanduser()

    @property
    def deploy_path(self) -> Path | None:
        """``--deploy``, else ``$HARNESS_DEPLOY``, else none."""
        raw = self._deploy or os.environ.get("HARNESS_DEPLOY")
        return Path(raw).expanduser() if raw else None

    def project(self) -> Project:
        """``--project DIR`` (which must hold ``services/``), else the nearest folder above the
        working directory holding ``services/``. Raises ProjectNotFound."""
        from harness.manifests.project import Project, find_project

        if self._project:
            root = Path(self._project).expanduser()
            if not (root / "services").is_dir():
                from harness.errors import ProjectNotFound

                raise ProjectNotFound(f"--project {self._project}: no services/ folder there")
            return Project(root.resolve())
        return find_project(Path.cwd())


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="harness")
@click.option("--home", metavar="DIR", help="Store and state folder [env HARNESS_HOME; default ~/.cache/harness].")
@click.option("--deploy", metavar="PATH", help="Deploy file for this machine [env HARNESS_DEPLOY].")
@click.option("--project", metavar="DIR", help="Project folder [default: nearest folder holding services/].")
@click.option(
    "--variant",
    metavar="NAME",
    help="Accelerator variant of locks that have them (cpu, cu128) [env HARNESS_VARIANT; default: the deploy's "
    "variant, else what this machine's driver runs].",
)
@click.pass_context
def cli(ctx: click.Context, home: str | None, deploy: str | None, project: str | None, variant: str | None) -> None:
    """harness: lock, realize and run model services reproducibly.

    \b
    services/*.toml --lock--> locks/ --realize--> store --launch--> run record

    \b
    Examples:
      harness services                                 # the project's manifests
      harness lock kinematics && harness realize kinematics
      harness run --agent kinematics-only              # realize, place, start, run, record
    """
    ctx.obj = State(home, deploy, project)
    if variant:  # read where every lock is (lock/variants.py), and inherited by services and shards
        os.environ["HARNESS_VARIANT"] = variant
    elif ctx.invoked_subcommand is not None and not os.environ.get("HARNESS_VARIANT"):
        _variant_from_deploy(ctx.obj.deploy_path)
    if ctx.invoked_subcommand is not None:
        # A home shared by a group (``store init --group``: its store is setgid) must stay
        # usable by the group whatever this member's umask. One stat; an import only there.
        try:
            shared = bool(os.stat(ctx.obj.home / "store").st_mode & 0o2000)
        except OSError:
            shared = False
        if shared:
            from harness.store.shared import apply_group_umask

            apply_group_umask(ctx.obj.home)


def console_main() -> None:
    """The ``harness`` console entry point (and ``python -m harness``): :func:`main`, then a
    process exit that spares the interpreter's final collection of everything the command
    loaded (pydantic's schemas, tomlkit's documents: 30-60 ms of a lock). Objects are still
    freed by reference counting, so files are closed; only garbage in reference cycles is
    left to the exit. Not for in-process callers (tests), which would keep that garbage."""
    import gc

    try:
        main()
    except SystemExit as exc:
        gc.freeze()
        _exit_past_running_threads(exc.code)
        raise
    gc.freeze()
    _exit_past_running_threads(0)


def _exit_past_running_threads(code: object) -> None:
    """End the process now, as the interpreter would but without its finalization, when
    threads the command started are still running: daemon threads (a download's writer and
    hasher, an index lookup, a fetch's workers) that an interrupt or an error left behind.
    CPython tears modules and objects down while such threads may still run, and that ended
    harness with SIGSEGV after "aborted" (a realize interrupted while fetching: 2 times in 12,
    with no Python traceback even under ``-X faulthandler``). What a normal exit does first is
    still done, as :mod:`multiprocessing` does for a child: non-daemon threads are joined
    (``threading._shutdown``, which also shuts thread pools down), atexit handlers run, and
    standard output and error are flushed. Returns, changing nothing, when no such thread runs."""
    import threading

    main_thread = threading.main_thread()
    if not any(t.daemon and t.is_alive() and t is not main_thread for t in threading.enumerate()):
        return
    import atexit

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        status = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI on ``argv`` (default: the command line) and turn errors into messages and
    exit codes."""
    try:
        _main(argv)
    finally:
        # The command is done: the store paths it rooted may go (held, at the latest, until
        # this process exits). Only when it rooted any: the CLI stays light.
        roots = sys.modules.get("harness.store.roots")
        if roots is not None:
            roots.release_process_roots()


#: The arguments of this invocation (``run --detach`` starts the head again with them).
_ARGS: list[str] = []


def invoked_args() -> list[str]:
    """The arguments ``harness`` was given (without the program name)."""
    return list(_ARGS)


def _main(argv: list[str] | None) -> None:
    from harness.errors import HarnessError

    _ARGS[:] = list(sys.argv[1:] if argv is None else argv)
    try:
        # standalone_mode=False returns ctx.exit()'s code instead of exiting, so errors
        # raised below reach the handlers here rather than click's own printing.
        result = cli.main(args=argv, prog_name="harness", standalone_mode=False)
    except HarnessError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # a bug in harness: say so in one line, keep the trace opt-in
        from harness.errors import os_failure

        failure = os_failure(exc) if isinstance(exc, OSError) else None
        if failure is not None:  # a full disk, a read-only home: the user's to fix
            click.echo(f"error: {failure}", err=True)
            sys.exit(failure.exit_code)
        if os.environ.get("HARNESS_DEBUG"):
            raise
        click.echo(
            f"internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in harness; rerun with HARNESS_DEBUG=1 for the traceback and report it.",
            err=True,
        )
        sys.exit(70)
    sys.exit(result if isinstance(result, int) else 0)
