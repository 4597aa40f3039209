"""The errors harness reports to its users.

Every failure a user can cause (bad input, a missing file, a hash that disagrees) is raised
as a :class:`HarnessError`; the CLI prints its message and exits with its ``exit_code``,
never a traceback. Anything else that escapes is a bug in harness.
"""

from __future__ import annotations


class HarnessError(Exception):
    """A failure with a message fit for a user; the CLI exits with ``exit_code``."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\nhint: {self.hint}"
        return self.message


class InputError(HarnessError):
    """Malformed user input: a manifest, a deploy, an agent config or a command-line value."""

    exit_code = 2


class ProjectNotFound(InputError):
    """No directory holding ``services/`` was found."""


#: OSError numbers a user can act on, and how to say them.
_OS_REASONS = {
    28: "no space left on the device",  # ENOSPC
    122: "disk quota exceeded",  # EDQUOT
    30: "read-only file system",  # EROFS
    13: "permission denied",  # EACCES
    1: "operation not permitted",  # EPERM
}


def os_failure(exc: OSError) -> HarnessError | None:
    """A short HarnessError for an OSError the user can fix (a full disk, a read-only or
    unwritable folder), naming the path; None for anything else (a bug).

    ``shutil.copytree`` gathers one error per file into one huge ``shutil.Error``: only the
    first is told (a full disk fails every file after it the same way).
    """
    import re
    import shutil

    number, path = exc.errno, exc.filename
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        first = exc.args[0][0]
        found = re.match(r"\[Errno (\d+)\]", str(first[-1])) if isinstance(first, tuple) else None
        if found is None:
            return None
        number, path = int(found.group(1)), first[1] if len(first) > 2 else first[0]
    if number not in _OS_REASONS:
        return None
    where = f": {path}" if path else ""
    if number in (28, 122):
        hint = (
            "free space there (`df -h`), or point --home / HARNESS_HOME at a larger filesystem; "
            "nothing half-written was registered (`harness store verify` checks)"
        )
    else:
        hint = "make it writable for you, or point --home / HARNESS_HOME at a folder you own"
    failure = HarnessError(f"{_OS_REASONS[number]}{where}", hint=hint)
    return failure


def unknown_names(what: str, unknown: list[str], known: list[str] | tuple[str, ...] | set[str]) -> InputError:
    """The refusal of names that are not among ``known`` (bad input, exit 2): each one
    named, the known names listed, and a "did you mean" where one is close."""
    import difflib

    choices = sorted(known)
    close = [match for name in unknown for match in difflib.get_close_matches(name, choices, n=1)]
    suggestion = f" (did you mean {', '.join(repr(c) for c in dict.fromkeys(close))}?)" if close else ""
    listed = ", ".join(choices) if choices else "none"
    return InputError(f"no {what} named {', '.join(unknown)}{suggestion}; known: {listed}")
