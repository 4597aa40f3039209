"""The ``harness`` console entry point: start what can start before click is loaded, then run
the CLI (:func:`harness.cli.main`).

Today that is ``harness lock``'s resolutions. uv needs 0.3–0.7 s to resolve a set, and
importing click, the CLI and the lock models takes the first 0.1–0.3 s of a lock; starting uv
first lets the two overlap (:mod:`harness.lock.early`). This module reads the command line
with the standard library only and, when it names ``harness lock`` in a shape it fully
understands, starts those runs; anything else (an option it does not know, ``--check``,
``--help``, another command) starts nothing. It is a guess and can only save time: the CLI
parses the command line again with click, and :mod:`harness.resolve.uvtool` hands a run
started here to the lock only when the lock asks for exactly that command, environment and
input files; the rest are stopped unused. So this module never decides anything, and it
never raises: whatever goes wrong here, the CLI reports.

``harness store verify --check-contents`` (or ``--repair``) starts its hashing the same way
(:func:`parse_verify_call`, :mod:`harness.store.early`): the verify takes a digest over
only while the path is unchanged. A verify without ``--repair`` is then run here, without
click or the CLI (:func:`verify_without_cli`: the same functions, the same words, and the
CLI again for anything that goes wrong), since loading them beside the hashing slows it.

Kept light (``harness --help`` goes through it): the standard library, and harness modules
only inside :func:`start_early` and :func:`verify_without_cli`.
"""

from __future__ import annotations

import gc
import os
import sys

# Not typing.TYPE_CHECKING: importing typing (and pathlib, collections.abc) here would delay
# every command's start, the early verify's hashing and the early lock's uv by milliseconds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from harness.manifests.project import Project

#: The CLI group's options that take a value (harness.cli.cli); its others stop the guess.
GLOBAL_VALUE_OPTIONS = ("--home", "--deploy", "--project")
#: ``harness lock``'s options (harness.cli.commands.lock): flags, and those taking a value.
#: ``--check`` and ``--help`` are left out on purpose: neither resolves anything.
LOCK_FLAGS = ("--upgrade", "--refresh", "--offline", "--json")
LOCK_VALUE_OPTIONS = ("--upgrade-package", "--platform", "--jobs", "-j")


class LockCall:
    """A ``harness lock`` command line, as far as starting its resolutions needs it."""

    def __init__(self, globals: dict[str, str]) -> None:
        self.globals = globals
        self.options: dict[str, list[str]] = {}
        self.flags: set[str] = set()
        self.names: list[str] = []


def split_globals(argv: Sequence[str]) -> tuple[dict[str, str], list[str]] | None:
    """``argv`` (without the program name) split into the group's options (name → value) and
    the rest, which starts with the command; None when it holds a group option this reader
    does not know (``--help``, ``--version``) or no command."""
    options: dict[str, str] = {}
    args = list(argv)
    while args and args[0].startswith("-"):
        name, value = _take_option(args, GLOBAL_VALUE_OPTIONS)
        if name is None or value is None:
            return None
        options[name] = value
    return (options, args) if args else None


def parse_lock_call(argv: Sequence[str]) -> LockCall | None:
    """``argv`` (without the program name) read as ``[GLOBAL OPTIONS] lock [OPTIONS] [NAMES]``;
    None for any other command line, or one holding something this reader does not know."""
    split = split_globals(argv)
    if split is None or split[1][0] != "lock":
        return None
    call = LockCall(split[0])
    args = split[1][1:]
    names_only = False
    while args:
        if names_only or not args[0].startswith("-") or args[0] == "-":
            call.names.append(args.pop(0))
        elif args[0] == "--":
            args.pop(0)
            names_only = True
        elif args[0] in LOCK_FLAGS:
            call.flags.add(args.pop(0))
        else:
            name, value = _take_option(args, LOCK_VALUE_OPTIONS)
            if name is None or value is None:
                return None
            call.options.setdefault("--jobs" if name == "-j" else name, []).append(value)
    return call


def _take_option(args: list[str], known: Sequence[str]) -> tuple[str | None, str | None]:
    """Pop one ``--name value``, ``--name=value`` (or ``-jN``) off ``args``; (None, None) for
    an option not in ``known`` or one missing its value."""
    head = args.pop(0)
    if "=" in head and head.startswith("--"):
        name, value = head.split("=", 1)
        return (name, value) if name in known else (None, None)
    if head in known:
        return (head, args.pop(0)) if args else (None, None)
    if head.startswith("-j") and "-j" in known and head[2:].isdigit():
        return "-j", head[2:]
    return None, None


def start_early(argv: Sequence[str]) -> int:
    """Start what ``harness ARGV`` will do first, when it is a command line this module
    understands; returns how many things were started. Never raises."""
    try:
        call = parse_lock_call(argv)
        if call is not None:
            return _start_lock(call)
        return _start_verify(argv)
    except Exception:  # only a guess: the CLI decides and reports
        pass
    return 0


def home_folder(option: str | None) -> str:
    """The home's folder: ``--home``, else ``$HARNESS_HOME``, else ``~/.cache/harness``, with
    ``~`` expanded; as a string, without importing pathlib (the early verify's hashing starts
    sooner)."""
    return os.path.expanduser(option or os.environ.get("HARNESS_HOME") or "~/.cache/harness")


def resolve_home(option: str | None) -> Path:
    """The home (:func:`home_folder`) as a path; the CLI's :attr:`harness.cli.State.home` too."""
    from pathlib import Path

    return Path(home_folder(option))


def resolve_project(option: str | None) -> Project:
    """The project: ``--project DIR`` (which must hold ``services/``), else the nearest folder
    above the working directory holding ``services/`` (the CLI's
    :meth:`harness.cli.State.project` too). Raises ProjectNotFound."""
    from pathlib import Path

    from harness.manifests.project import Project, find_project

    if option:
        root = Path(option).expanduser()
        if not (root / "services").is_dir():
            from harness.errors import ProjectNotFound

            raise ProjectNotFound(f"--project {option}: no services/ folder there")
        return Project(root.resolve())
    return find_project(Path.cwd())


def _start_lock(call: LockCall) -> int:
    from harness.lock.early import prestart_locks
    from harness.lock.outcome import LockOptions
    from harness.store.shared import apply_group_umask

    home = resolve_home(call.globals.get("--home"))
    # No project: start_early gives up, and the CLI reports it in its own words.
    project = resolve_project(call.globals.get("--project"))
    jobs = call.options.get("--jobs", ["4"])[-1]
    platforms = call.options.get("--platform")
    options = LockOptions(
        platform=platforms[-1] if platforms else None,
        offline="--offline" in call.flags,
        upgrade="--upgrade" in call.flags,
        upgrade_packages=tuple(call.options.get("--upgrade-package", [])),
        jobs=int(jobs),
        refresh="--refresh" in call.flags,
    )
    # uv writes into the home's cache: in a group-shared home, with the group's umask, as the
    # CLI would set it before locking.
    apply_group_umask(home)
    return prestart_locks(home, project, call.names, options, ahead=True)


#: ``harness store verify``'s flags (harness.cli.commands.store); it has no option taking a value.
#: ``--help`` is left out: it hashes nothing.
VERIFY_FLAGS = ("--check-contents", "--repair", "--json")


def parse_verify_call(argv: Sequence[str]) -> tuple[dict[str, str], set[str], list[str]] | None:
    """``argv`` (without the program name) read as ``[GLOBAL OPTIONS] store verify [FLAGS]
    [NAMES]``: (the group's options, the flags, the names); None for any other command line,
    or one holding something this reader does not know."""
    split = split_globals(argv)
    if split is None or split[1][:2] != ["store", "verify"]:
        return None
    flags: set[str] = set()
    names: list[str] = []
    names_only = False
    for arg in split[1][2:]:
        if names_only or not arg.startswith("-") or arg == "-":
            names.append(arg)
        elif arg == "--":
            names_only = True
        elif arg in VERIFY_FLAGS:
            flags.add(arg)
        else:
            return None
    return split[0], flags, names


def _start_verify(argv: Sequence[str]) -> int:
    """Start hashing what ``harness store verify --check-contents`` (or ``--repair``) will hash
    (:mod:`harness.store.early`); the CLI's verify takes each digest over, or hashes itself."""
    call = parse_verify_call(argv)
    if call is None or not call[1] & {"--check-contents", "--repair"}:
        return 0
    from harness.store.early import start_hashing

    return start_hashing(home_folder(call[0].get("--home")), call[2])


def verify_without_cli(argv: Sequence[str]) -> int | None:
    """Run ``harness [GLOBAL OPTIONS] store verify [--check-contents] [--json] [NAMES]``
    without loading click or the CLI, and return its exit status; None when the CLI must run
    the command line: any other command, ``--repair`` (it realizes), or anything that went
    wrong here, which the CLI then does again and reports in its own words (a verify only
    reads). Prints what the CLI's verify prints (:func:`harness.store.verify.report`: one
    function for both).

    Why: a verify of 1 GiB hashes for ≈ 0.2 s on two cores, and loading click and the CLI
    beside it (≈ 45 ms of CPU) slows that hashing by ≈ 25 ms."""
    call = parse_verify_call(argv)
    if call is None or "--repair" in call[1]:
        return None
    try:
        from harness.store.store import Store
        from harness.store.verify import report, verify_store

        store = Store.in_home(resolve_home(call[0].get("--home")))
        findings = verify_store(store, check_contents="--check-contents" in call[1], names=call[2] or None)
        text, status = report(findings, [], as_json="--json" in call[1])
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except Exception:  # the CLI does it again and says what went wrong
        return None
    try:
        if text:
            sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # as the CLI: a reader that stopped early is not an error
        return 0
    return status


def main() -> None:
    """Console entry point (``harness``, ``python -m harness``)."""
    start_early(sys.argv[1:])
    status = verify_without_cli(sys.argv[1:])
    if status is not None:
        # Done, and it only read: nothing is left to clean up (no files, locks, children or
        # atexit handlers; the output was flushed). Skip the interpreter's finalization, which
        # unloads every module one by one (≈ 10–15 ms on two cores, measured beside b3sum).
        sys.stderr.flush()
        os._exit(status)
    from harness.cli import main as cli_main

    try:
        cli_main()
    except SystemExit as done:
        if parse_lock_call(sys.argv[1:]) is not None:
            exit_without_teardown(done.code)
        raise
    finally:
        # The command is done and the process is about to exit: spare the interpreter's final
        # collection of everything the command loaded (pydantic's schemas, tomlkit's
        # documents: 30-60 ms on a lock). Objects are still freed by reference counting, so
        # files are closed; only garbage in reference cycles is left to the exit.
        gc.freeze()


def exit_without_teardown(code: object) -> None:
    """End the process with ``code`` (a ``SystemExit``'s) at once, after what a normal exit
    must still do here: the ``atexit`` handlers (uv runs started ahead and not taken over are
    stopped and their folders removed) and flushing the output. What is skipped is the
    interpreter's teardown, which unloads every module one by one: after a lock (pydantic,
    click, tomlkit, packaging) ≈ 20 ms, measured beside uv on two cores.

    Returns, leaving the exit to the interpreter, when that would not be the same: a status
    that is not a number (Python prints it), another thread still running (a normal exit
    waits for it), or output that cannot be flushed. Used for ``harness lock``, whose files
    are all written and closed, or renamed into place, before its command returns."""
    import threading

    if not (code is None or isinstance(code, int)) or threading.active_count() != 1:
        return
    import atexit

    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        return
    os._exit(code or 0)
