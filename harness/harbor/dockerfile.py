"""What of a task's ``environment/Dockerfile`` a harness environment can express.

A harness session's software is a realized environment (an exact CPython and pinned
wheels) on top of the host's read-only ``/usr``; a Dockerfile describes a whole image. The
part that translates is the Python: a ``FROM python:X`` base names the interpreter, and
``pip install`` / ``uv pip install`` lines (packages, or ``-r`` a requirements file the
Dockerfile copies from ``environment/``) name the requirements. Everything else — other
bases, ``apt-get``, files copied in, ``ENV``, ``USER``, ``WORKDIR``, commands — is listed,
step by step, with what to do instead.

Pure: the Dockerfile's text (and a reader for files it names) in, a :class:`Translation` out.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

_PIP = re.compile(r"^(?:(?:python[0-9.]*\s+-m\s+)?pip[0-9.]*|uv\s+pip|python[0-9.]*\s+-m\s+uv\s+pip)\s+install\b")
#: pip/uv options that take no value and change nothing a lock expresses.
_FLAGS = {
    "--no-cache-dir",
    "-U",
    "--upgrade",
    "--system",
    "--break-system-packages",
    "-q",
    "--quiet",
    "--no-input",
    "--disable-pip-version-check",
    "--user",
    "--root-user-action=ignore",
    "--compile",
    "--no-compile",
    "--progress-bar=off",
    "-v",
    "--verbose",
    "--pre",
}
#: options whose value is the next word (and changes nothing a lock expresses, or is refused below).
_WITH_VALUE = {"--root-user-action", "--progress-bar", "--python", "-p", "--prefix", "--target", "-t"}


@dataclass
class Translation:
    """The environment a Dockerfile implies, and every step that did not translate."""

    python: str | None = None
    requirements: list[str] = field(default_factory=list)
    indexes: list[str] = field(default_factory=list)
    untranslated: list[str] = field(default_factory=list)  # "line N: <step>: <what to do>"
    workdir: str | None = None
    user: str | None = None

    def add(self, line: int, step: str, why: str) -> None:
        self.untranslated.append(f"line {line}: {step}: {why}")


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments) of a Dockerfile: continuations joined, comments
    and blank lines dropped."""
    out: list[tuple[int, str, str]] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        word, _, rest = whole.partition(" ")
        out.append((start, word.upper(), rest.strip()))
    if pending.strip():
        word, _, rest = pending.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


def _commands(run: str) -> list[str]:
    """The simple commands of a RUN line, split on ``&&``, ``;`` and ``||`` outside quotes."""
    if run.startswith("["):  # exec form
        try:
            import json

            return [" ".join(shlex.quote(a) for a in json.loads(run))]
        except ValueError:
            return [run]
    parts, current, quote = [], "", ""
    i = 0
    while i < len(run):
        c = run[i]
        if quote:
            current += c
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            current += c
        elif run.startswith("&&", i) or run.startswith("||", i):
            parts.append(current)
            current = ""
            i += 1
        elif c == ";":
            parts.append(current)
            current = ""
        else:
            current += c
        i += 1
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def translate(text: str, read: Callable[[str], str | None] = lambda _name: None) -> Translation:
    """The :class:`Translation` of a Dockerfile's ``text``. ``read(path)`` returns the text of
    a file the Dockerfile copies in from the build context (``environment/``), or None."""
    out = Translation()
    copied: dict[str, str] = {}  # destination in the image -> source in the context
    for line, word, args in instructions(text):
        if word == "FROM":
            image = [a for a in args.split() if not a.startswith("--")][0] if args.split() else ""
            match = re.match(r"^(?:docker\.io/)?(?:library/)?python:(\d+\.\d+(?:\.\d+)?)", image)
            if match and out.python is None:
                out.python = match.group(1)
                rest = image[match.end() :]
                if rest:
                    out.add(
                        line,
                        f"FROM {image}",
                        f"the {rest.lstrip('-')} variant's system libraries are the host's /usr instead",
                    )
            else:
                out.add(
                    line,
                    f"FROM {image}",
                    "not a python:X base: the sandbox's system is the host's /usr (set the manifest's python yourself)",
                )
        elif word == "RUN":
            for command in _commands(args):
                _run(out, line, command, copied, read)
        elif word in ("COPY", "ADD"):
            words = [a for a in args.split() if not a.startswith("--")]
            if len(words) >= 2:
                for source in words[:-1]:
                    dest = (
                        words[-1].rstrip("/") + "/" + source.rsplit("/", 1)[-1]
                        if words[-1].endswith("/")
                        else words[-1]
                    )
                    copied[dest] = source
            out.add(
                line,
                f"{word} {args}",
                "files are not copied into the sandbox: upload them in the task "
                "(e.g. in solution/ or tests/), or keep them in a source of the manifest",
            )
        elif word == "WORKDIR":
            out.workdir = args
            out.add(line, f"WORKDIR {args}", f'set workdir = "{args}" under [environment] in task.toml')
        elif word == "USER":
            out.user = args
            out.add(line, f"USER {args}", f'set user = "{args}" under [agent] in task.toml')
        elif word in ("LABEL", "MAINTAINER", "ARG", "EXPOSE"):
            continue  # nothing a session needs (ARG values are not substituted here)
        else:
            out.add(line, f"{word} {args}", "not translated")
    return out


def _run(out: Translation, line: int, command: str, copied: dict[str, str], read: Callable[[str], str | None]) -> None:
    match = _PIP.match(command)
    if not match:
        if re.match(r"^(apt-get|apt|apk|yum|dnf)\b.*\binstall\b", command):
            out.add(
                line,
                f"RUN {command}",
                "system packages come from the host's /usr: install them there, "
                "or run the task on a host that has them",
            )
        elif re.match(r"^(apt-get|apt)\s+(update|clean)|^rm\s+-rf\s+/var/lib/apt", command):
            return  # housekeeping of a system package install, listed with it
        else:
            out.add(line, f"RUN {command}", "not translated: do it in the task (solution/, tests/) if needed")
        return
    try:
        words = shlex.split(command[match.end() :])
    except ValueError:
        out.add(line, f"RUN {command}", "cannot parse the pip command")
        return
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-r", "--requirement") or word.startswith(("-r", "--requirement=")):
            name = (
                words[i + 1]
                if word in ("-r", "--requirement") and i + 1 < len(words)
                else word.split("=", 1)[1]
                if "=" in word
                else word[2:]
            )
            i += 2 if word in ("-r", "--requirement") else 1
            source = copied.get(name) or copied.get("./" + name) or name
            text = read(source)
            if text is None:
                out.add(line, f"RUN {command}", f"requirements file {name} is not in environment/")
                continue
            for req in text.splitlines():
                req = req.split("#", 1)[0].strip()
                if req and not req.startswith("-"):
                    _add(out, req)
                elif req:
                    out.add(line, f"{name}: {req}", "pip option in a requirements file not translated")
            continue
        if word in ("-i", "--index-url", "--extra-index-url"):
            if i + 1 < len(words):
                out.add(
                    line,
                    f"{word} {words[i + 1]}",
                    "indexes are configuration, not part of the manifest: set one in harness's settings "
                    "or UV_DEFAULT_INDEX when you lock",
                )
            i += 2
            continue
        if word in _FLAGS or word.startswith(("--root-user-action=", "--progress-bar=")):
            i += 1
            continue
        if word in _WITH_VALUE:
            i += 2
            continue
        if word in ("-e", "--editable") or word.startswith("-"):
            out.add(line, f"pip install {word}", "pip option not translated")
            i += 1
            continue
        if word.startswith((".", "/")) or word.endswith((".whl", ".tar.gz")):
            out.add(line, f"pip install {word}", "a local path: make it a source of the manifest instead")
            i += 1
            continue
        _add(out, word)
        i += 1


def _add(out: Translation, requirement: str) -> None:
    if requirement not in out.requirements:
        out.requirements.append(requirement)
