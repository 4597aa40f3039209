"""What of a task's ``environment/Dockerfile`` a harness environment can express.

A harness session's software is a realized environment (an exact CPython and pinned
wheels) on top of the host's read-only ``/usr``; a Dockerfile describes a whole image. The
part that translates is the Python: a ``FROM python:X`` base names the interpreter, and
``pip install`` / ``uv pip install`` lines (packages, or ``-r`` a requirements file the
Dockerfile copies from ``environment/``) name the requirements. ``COPY``, ``ENV``,
``WORKDIR`` and ``USER`` need no translation: each trial applies them (:func:`plan`).
Everything else — other bases, ``apt-get``, commands — is listed, step by step, with what
to do instead: a trial refuses those steps. At trial time a ``FROM`` may also name a rootfs
template (its label, or a base it ``provides``), and ``RUN apt-get install`` then names
packages that template's lock must pin (:func:`plan`, :func:`unpinned`).

Pure: the Dockerfile's text (and a reader for files it names) in, a :class:`Translation` out.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
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
        if pending:
            line = line.lstrip()
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
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
        import json

        try:
            words = json.loads(run)
        except (ValueError, RecursionError):  # not JSON (or nested past the parser): shell form
            return [run]
        if isinstance(words, list) and all(isinstance(w, str) for w in words):
            return [" ".join(shlex.quote(w) for w in words)]
        return [run]  # JSON, but not the exec form's list of strings: left to the step's own checks
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
        elif word == "WORKDIR":
            out.workdir = args
        elif word == "USER":
            out.user = args
        elif word in ("LABEL", "MAINTAINER", "ARG", "EXPOSE", "ENV"):
            continue  # nothing a session needs (ARG values are not substituted here)
        else:
            out.add(line, f"{word} {args}", "not translated")
    return out


def _run(out: Translation, line: int, command: str, copied: dict[str, str], read: Callable[[str], str | None]) -> None:
    match = _PIP.match(command)
    if not match:
        if re.match(r"^(apt-get|apt)\b.*\binstall\b", command):
            out.add(
                line,
                f"RUN {command}",
                "system packages come from a rootfs template: a trial applies this line when FROM names one "
                "(its label, or a base it provides) whose lock pins these packages",
            )
        elif re.match(r"^apk\s+add\b|^(yum|dnf|microdnf|zypper)\b.*\binstall\b", command):
            out.add(
                line,
                f"RUN {command}",
                "a trial refuses this: name these packages in a rootfs template (Debian packages) and FROM that "
                "template instead",
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


# ------------------------------------------------------------------ applied at trial time
#
# A trial applies what of a Dockerfile a sandbox can hold, and refuses the rest by name
# (never a warning and a trial that runs on): :func:`plan` says which is which, purely;
# :mod:`harness.harbor.image` applies it to a session's root.

#: Folders of the sandbox that are the host's, read-only, or the kernel's: nothing is copied there.
HOST_PATHS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/dev", "/sys")
#: Harbor's own folders, made afresh by the trial (tests and logs are uploaded, not baked in).
HARBOR_PATHS = ("/tests", "/logs", "/solution")
#: Bases the host's system stands in for (Debian, and the Debian-based python images).
BASES = ("python", "debian")
_ARCHIVE = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tar.zst")
#: Installer tooling an unpinned `pip install -U pip` names: nothing is installed at trial time.
_TOOLING = {"pip", "setuptools", "wheel", "uv"}
_VAR = re.compile(r"\\\$|\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass
class Step:
    """One instruction of the Dockerfile and what a trial does with it."""

    line: int
    text: str  # the instruction as written (continuations joined)
    action: str  # "applied", "accepted" (nothing to do), "ignored" (harmless) or "refused"
    how: str

    def as_json(self) -> dict[str, object]:
        return {"line": self.line, "step": self.text, "action": self.action, "how": self.how}


@dataclass
class CopyStep:
    """``COPY``/``ADD`` of build-context files: ``sources`` (relative to ``environment/``, may
    hold wildcards) to ``dest`` (absolute inside the sandbox; a folder when it ends in ``/``)."""

    line: int
    sources: list[str]
    dest: str
    owner: str | None = None  # COPY --chown=USER[:GROUP]: the user


@dataclass
class ImagePlan:
    """What a trial does with a Dockerfile: the image's variables, workdir, user, files,
    folders and the requirements its ``pip install`` lines name (each with its line)."""

    base: str | None = None
    python: str | None = None  # X.Y[.Z] of a python:X base
    template: str | None = None  # the rootfs template that is the root's base (FROM, else docker_image)
    base_is_template: bool = False  # FROM named the template (else the host's system stands in for FROM)
    packages: list[tuple[int, str]] = field(default_factory=list)  # RUN apt-get install: NAME or NAME=VERSION
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    workdirs: list[str] = field(default_factory=list)
    user: str | None = None
    users: list[str] = field(default_factory=list)  # made by RUN useradd/adduser
    dirs: list[str] = field(default_factory=list)  # made by RUN mkdir
    copies: list[CopyStep] = field(default_factory=list)
    requirements: list[tuple[int, str]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    writable: tuple[str, ...] = ()  # Harbor's folders this image may fill (a verifier's /tests)

    @property
    def refused(self) -> list[Step]:
        return [s for s in self.steps if s.action == "refused"]

    def note(self, line: int, text: str, action: str, how: str) -> None:
        self.steps.append(Step(line, text, action, how))


def substitute(text: str, variables: Mapping[str, str]) -> str:
    """``$NAME``, ``${NAME}``, ``${NAME:-word}`` and ``${NAME:+word}`` of ``text`` replaced as
    ``docker build`` does (unset: empty; ``\\$``: a dollar)."""

    def value(match: re.Match[str]) -> str:
        if match.group(0) == "\\$":
            return "$"
        name = match.group(1) or match.group(4)
        got = variables.get(name, "")
        if match.group(2) == ":-":
            return got or match.group(3)
        if match.group(2) == ":+":
            return match.group(3) if got else ""
        return got

    return _VAR.sub(value, text)


def plan(
    text: str,
    base_env: Mapping[str, str],
    read: Callable[[str], str | None] = lambda _name: None,
    *,
    tests_bundled: bool = False,
    templates: Mapping[str, str] | None = None,
    label_template: str | None = None,
) -> ImagePlan:
    """What a trial does with each step of a Dockerfile's ``text`` (see :class:`ImagePlan`).
    ``base_env`` holds the sandbox's own variables (``PATH``, ``HOME``) that ``$VAR`` may name;
    ``read(path)`` the text of a build-context file (a requirements file), or None;
    ``tests_bundled``: a separate verifier's image, which may put its tests in ``/tests``;
    ``templates``: the bases the project's rootfs templates stand in for, each -> its label
    (:func:`harness.manifests.template.bases`); ``label_template``: the template the task's
    ``docker_image`` names, if any."""
    out = ImagePlan(writable=("/tests",) if tests_bundled else ())
    state = _State(dict(base_env), templates=dict(templates or {}), label_template=label_template)
    for line, word, args in instructions(text):
        handler = _HANDLERS.get(word)
        if handler is None:
            out.note(line, f"{word} {args}", "refused", _UNSUPPORTED.get(word, "an instruction harness does not apply"))
            continue
        handler(out, state, line, args, read)
    if state.froms == 0:
        out.note(0, "FROM", "refused", "the Dockerfile has no FROM")
    return out


@dataclass
class _State:
    variables: dict[str, str]  # ARGs and ENVs so far over the sandbox's variables
    froms: int = 0
    templates: dict[str, str] = field(default_factory=dict)  # base -> template label
    label_template: str | None = None
    copied: dict[str, str] = field(default_factory=dict)  # absolute destination -> context source

    def cwd(self, out: ImagePlan) -> str:
        return out.workdir or "/"

    def absolute(self, out: ImagePlan, path: str) -> str:
        joined = path if path.startswith("/") else self.cwd(out).rstrip("/") + "/" + path
        trailing = "/" if path.endswith("/") and joined != "/" else ""
        return _normpath(joined) + trailing


def _normpath(path: str) -> str:
    import posixpath

    return posixpath.normpath("/" + path.lstrip("/")).replace("//", "/")


_UNSUPPORTED = {
    "HEALTHCHECK": "health checks of a container are not run",
    "SHELL": "RUN's shell cannot be changed",
    "ONBUILD": "triggers for images built FROM this one are not applied",
    "ENTRYPOINT": "Harbor's containers run their own command; an entrypoint wrapping every start is not applied",
}


def _from(out: ImagePlan, state: _State, line: int, args: str, _read: object) -> None:
    state.froms += 1
    words = [substitute(a, state.variables) for a in args.split() if not a.startswith("--")]
    image = words[0] if words else ""
    text = f"FROM {args}"
    if state.froms > 1:
        out.note(line, text, "refused", "a multi-stage build: only one stage, on a Debian or python base, is applied")
        return
    match = re.match(
        r"^(?:docker\.io/)?(?:library/)?([a-z0-9._-]+)(?::([A-Za-z0-9._-]+))?(?:@sha256:[0-9a-f]+)?$", image
    )
    name, tag = (match.group(1), match.group(2) or "latest") if match else ("", "")
    label = template_for(image, state.templates) if image else None
    if label is not None:
        _from_template(out, state, line, text, image, label, name, tag)
        return
    if name not in BASES or re.search(r"alpine|windows|nanoserver", tag):
        known = sorted(set(state.templates.values()))
        out.note(
            line,
            text,
            "refused",
            f"{image or 'no image'}: no rootfs template provides it ("
            + (f"the project's templates: {', '.join(known)}" if known else "the project has no templates")
            + f'; a template stands in for it with provides = ["{image or "IMAGE"}"]), and only a Debian or '
            "python (Debian) base can have the host's system stand in",
        )
        return
    out.base = image
    out.template = state.label_template
    if name == "python":
        version = re.match(r"^(\d+\.\d+(?:\.\d+)?)", tag)
        out.python = version.group(1) if version else None
    out.note(
        line,
        text,
        "accepted",
        f"{image}: the host's Debian system (/usr, /etc, read-only) stands in for it"
        + (f"; Python {out.python} is the environment's interpreter" if out.python else ""),
    )


def base_image(text: str) -> str | None:
    """The image the first ``FROM`` of a Dockerfile's ``text`` names (``ARG`` defaults before it
    substituted), or None (pure)."""
    variables: dict[str, str] = {}
    for _line, word, args in instructions(text):
        if word == "ARG":
            for item in args.split():
                name, has, default = item.partition("=")
                variables[name] = default.strip("\"'") if has else ""
        elif word == "FROM":
            words = [substitute(a, variables) for a in args.split() if not a.startswith("--")]
            return words[0] if words else None
    return None


def template_for(image: str, templates: Mapping[str, str]) -> str | None:
    """The label of the template that stands in for ``image`` (its label, or a reference it
    ``provides``), or None."""
    from harness.manifests.template import normalize_reference

    return templates.get(image) or templates.get(normalize_reference(image))


def _from_template(
    out: ImagePlan, state: _State, line: int, text: str, image: str, label: str, name: str, tag: str
) -> None:
    if state.label_template and state.label_template != label:
        out.note(
            line,
            text,
            "refused",
            f"{image} is template {label}, but task.toml's docker_image names template {state.label_template}",
        )
        return
    out.base, out.template, out.base_is_template = image, label, True
    version = re.match(r"^(\d+\.\d+(?:\.\d+)?)", tag) if name == "python" else None
    out.python = version.group(1) if version else None
    out.note(
        line,
        text,
        "accepted",
        f"{image}: the root of rootfs template {label} (harbor/images/{label}.toml, "
        f"pinned by locks/images/{label}.lock.toml)",
    )


def _arg(out: ImagePlan, state: _State, line: int, args: str, _read: object) -> None:
    for word in shlex.split(args):
        name, has, default = word.partition("=")
        value = substitute(default, state.variables) if has else ""
        state.variables[name] = value
        out.note(
            line,
            f"ARG {word}",
            "applied",
            f"substituted: {name}={value!r}" if has else f"substituted: {name} is empty (no build arguments are given)",
        )


def _env(out: ImagePlan, state: _State, line: int, args: str, _read: object) -> None:
    words = shlex.split(args)
    pairs: list[tuple[str, str]] = []
    if words and "=" not in words[0]:  # the legacy form: ENV NAME value with spaces
        pairs.append((words[0], args.split(None, 1)[1] if len(words) > 1 else ""))
    else:
        for word in words:
            name, has, value = word.partition("=")
            if not has or not name:
                out.note(line, f"ENV {args}", "refused", f"{word!r} is not NAME=value")
                return
            pairs.append((name, value))
    for name, value in pairs:
        value = substitute(value, state.variables)
        state.variables[name] = out.env[name] = value
    out.note(line, f"ENV {args}", "applied", "set for every command: " + ", ".join(n for n, _ in pairs))


def _workdir(out: ImagePlan, state: _State, line: int, args: str, _read: object) -> None:
    path = state.absolute(out, substitute(args.strip().strip("\"'"), state.variables)).rstrip("/") or "/"
    out.workdir = path
    if path not in out.workdirs:
        out.workdirs.append(path)
    refused = protected(path, out.writable)
    if refused:
        out.note(line, f"WORKDIR {args}", "refused", refused)
        return
    out.note(line, f"WORKDIR {args}", "applied", f"{path} made; commands run there unless task.toml names a workdir")


def _user(out: ImagePlan, state: _State, line: int, args: str, _read: object) -> None:
    user, _, group = substitute(args.strip(), state.variables).partition(":")
    out.user = None if user in ("root", "0") else user
    how = f"commands run as {user} unless task.toml names a user"
    out.note(line, f"USER {args}", "applied", how + (f" (group {group}: the user's own)" if group else ""))


def _copy(out: ImagePlan, state: _State, line: int, args: str, _read: object, word: str = "COPY") -> None:
    text = f"{word} {args}"
    flags = [a for a in args.split() if a.startswith("--")]
    owner = None
    for flag in flags:
        if flag.startswith("--chown="):
            owner = substitute(flag.split("=", 1)[1], state.variables).partition(":")[0] or None
            owner = None if owner in ("root", "0") else owner
        elif not flag.startswith("--link"):
            out.note(line, text, "refused", f"{flag.split('=')[0]}: not applied (copied files keep their modes)")
            return
    rest = " ".join(a for a in args.split() if not a.startswith("--"))
    try:
        words = __import__("json").loads(rest) if rest.startswith("[") else shlex.split(rest)
    except ValueError:
        out.note(line, text, "refused", "cannot parse its arguments")
        return
    words = [substitute(w, state.variables) for w in words]
    if len(words) < 2:
        out.note(line, text, "refused", "needs a source and a destination")
        return
    sources, dest = words[:-1], words[-1]
    for source in sources:
        if "://" in source:
            out.note(
                line, text, "refused", f"{source}: files from the network are not fetched (put it in environment/)"
            )
            return
        if word == "ADD" and source.endswith(_ARCHIVE):
            out.note(line, text, "refused", f"{source}: ADD unpacks archives; that is not applied (COPY its contents)")
            return
        inside = _normpath(source).lstrip("/")
        if source.startswith("..") or inside.startswith(".."):
            out.note(line, text, "refused", f"{source}: outside the build context (environment/)")
            return
    if len(sources) > 1 and not dest.endswith("/"):
        dest += "/"
    target = state.absolute(out, dest)
    for landing in _landings(target, sources):
        refused = protected(landing, out.writable)
        if refused:
            out.note(line, text, "refused", refused)
            return
    for source in sources:
        state.copied[target + source.rsplit("/", 1)[-1] if target.endswith("/") else target] = _normpath(source)[1:]
    out.copies.append(CopyStep(line, [_normpath(s)[1:] or "." for s in sources], target, owner))
    given = f", given to {owner}" if owner else ""
    out.note(line, text, "applied", f"copied from environment/ to {target} in the session's root{given}")


def _add_step(out: ImagePlan, state: _State, line: int, args: str, read: object) -> None:
    _copy(out, state, line, args, read, word="ADD")


def _landings(target: str, sources: list[str]) -> list[str]:
    """Where a COPY to ``target`` puts things that must not be protected: the target, or for
    the root folder itself, each source's name (a folder's contents spread over it: refused)."""
    if target.rstrip("/"):
        return [target.rstrip("/")]
    return ["/" if s.endswith("/") or _normpath(s) == "/" else "/" + s.rstrip("/").rsplit("/", 1)[-1] for s in sources]


def protected(path: str, writable: tuple[str, ...] = ()) -> str | None:
    """Why nothing may be put at ``path`` of a sandbox, or None; ``writable``: those of
    Harbor's folders that may be filled here."""
    for prefix in HOST_PATHS:
        if path == prefix or path.startswith(prefix + "/"):
            return (
                f"{path}: {prefix} is the host's (read-only) in the sandbox; a rootfs template will hold it (not yet)"
            )
    for prefix in HARBOR_PATHS:
        if prefix not in writable and (path == prefix or path.startswith(prefix + "/")):
            return f"{path}: {prefix} is Harbor's, made afresh by each trial"
    if path == "/":
        return "/: a folder's contents spread over the session's root (copy it into a folder)"
    return None


def _ignored(word: str, why: str) -> Callable[[ImagePlan, _State, int, str, object], None]:
    def note(out: ImagePlan, state: _State, line: int, args: str, _read: object) -> None:
        out.note(line, f"{word} {args}", "ignored", why)

    return note


def _run_step(out: ImagePlan, state: _State, line: int, args: str, read: Callable[[str], str | None]) -> None:
    text = f"RUN {args}"
    if args.startswith("--") or "<<" in args:
        out.note(line, text, "refused", "RUN options and here-documents are not applied")
        return
    hows: list[str] = []
    for command in _commands(substitute(args, state.variables)):
        why = _run_command(out, state, line, command, read, hows)
        if why:
            out.note(line, text, "refused", why if command == args.strip() else f"{command}: {why}")
            return
    out.note(line, text, "applied", "; ".join(hows))


def _run_command(
    out: ImagePlan, state: _State, line: int, command: str, read: Callable[[str], str | None], hows: list[str]
) -> str | None:
    """Apply one simple command of a RUN line; why it is refused, or None."""
    if _PIP.match(command):
        scratch = Translation()
        _run(scratch, line, command, _resolved_copies(state, out), read)
        refused = [u for u in scratch.untranslated if "indexes are configuration" not in u]
        if refused:
            return refused[0].split(": ", 1)[1]
        wanted = [r for r in scratch.requirements if _name(r) not in _TOOLING or re.search(r"[<>=~!@]", r)]
        out.requirements.extend((line, r) for r in wanted)
        hows.append(
            "pip install: "
            + (", ".join(wanted) + " checked against the locked environment" if wanted else "installer tooling only")
        )
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return "cannot parse the command"
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) and len(words) > 1:
        words = words[1:]  # DEBIAN_FRONTEND=noninteractive apt-get ...: nothing asks at trial time
    if words and words[0] in ("apt-get", "apt"):
        return _apt(out, line, words, hows)
    if words and words[0] in ("apk", "yum", "dnf", "microdnf", "aptitude", "dpkg"):
        return (
            f"{words[0]}: system packages come from a rootfs template's lock: "
            "only `apt-get install` of packages the trial's template pins is applied"
        )
    if words[:2] == ["rm", "-rf"] and all(w.rstrip("/*") == "/var/lib/apt/lists" for w in words[2:]) and words[2:]:
        hows.append("rm -rf /var/lib/apt/lists: nothing was fetched")
        return None
    if (
        words
        and words[0] == "mkdir"
        and all(w.startswith("-") and set(w[1:]) <= {"p"} for w in words[1:] if w[0] == "-")
    ):
        for path in (state.absolute(out, w) for w in words[1:] if not w.startswith("-")):
            why = protected(path.rstrip("/") or "/", out.writable)
            if why:
                return why
            out.dirs.append(path.rstrip("/"))
            hows.append(f"mkdir {path.rstrip('/')}")
        return None
    if words and words[0] in ("useradd", "adduser"):
        names = [w for w in words[1:] if not w.startswith("-")]
        if any(w in ("-u", "--uid", "-g", "--gid") or w.startswith(("--uid=", "--gid=")) for w in words[1:]):
            return "fixed ids are not applied: the sandbox gives task users ids of its own"
        if not names:
            return "names no user"
        out.users.append(names[-1])
        hows.append(f"user {names[-1]} made by the sandbox (ids of its own)")
        return None
    return "an arbitrary command is not run at trial time (do it in the task, or in a rootfs template: not yet)"


#: apt-get options that change nothing a template's lock pins.
_APT_FLAGS = {
    "-y",
    "--yes",
    "--assume-yes",
    "-q",
    "-qq",
    "--quiet",
    "--no-install-recommends",
    "--no-install-suggests",
    "--no-upgrade",
    "--fix-missing",
    "--fix-broken",
    "-f",
}
_APT_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9.+~:-]+)?$")


def _apt(out: ImagePlan, line: int, words: list[str], hows: list[str]) -> str | None:
    """``apt-get update|clean|install PKG...``: an install is of packages the trial's rootfs
    template pins (checked against its lock by :func:`unpinned`); why it is refused, or None."""
    rest, i, sub = [], 1, None
    while i < len(words):
        word = words[i]
        if word in ("-o", "--option", "-t", "--target-release"):
            if word in ("-t", "--target-release"):
                return f"{word}: a release other than the template's suite is not pinned"
            i += 2
            continue
        if word.startswith("-"):
            if word not in _APT_FLAGS and not word.startswith("-o"):
                return f"{words[0]} option {word} is not applied"
        elif sub is None:
            sub = word
        else:
            rest.append(word)
        i += 1
    if sub in ("update", "clean", "autoclean"):
        hows.append(f"{words[0]} {sub}: nothing is fetched at trial time (the packages come from the lock)")
        return None
    if sub != "install":
        return f"{words[0]} {sub or ''}".strip() + ": only install, update and clean are applied"
    bad = [p for p in rest if not _APT_PACKAGE.match(p)]
    if bad or not rest:
        return f"{', '.join(bad) or 'no package'}: not a package name (NAME or NAME=VERSION)"
    if out.template is None:
        return (
            f"{', '.join(rest)}: no rootfs template is the base"
            + (f" ({out.base} is the host's system, which no lock pins)" if out.base else "")
            + ": FROM a template whose lock pins them (harbor/images/<label>.toml; provides = [...] for a base)"
        )
    out.packages += [(line, p) for p in rest]
    hows.append(f"{words[0]} install {' '.join(rest)}: from template {out.template}'s lock (pinned by sha256)")
    return None


def unpinned(out: ImagePlan, pinned: Mapping[str, str]) -> list[str]:
    """The ``apt-get install`` packages of ``out`` that ``pinned`` (the trial's template lock:
    package -> version) does not hold, each as a refusal naming its line (pure)."""
    problems = []
    for line, package in out.packages:
        name, _, version = package.partition("=")
        have = pinned.get(name)
        if have is None or (version and version != have):
            problems.append(
                f"line {line}: apt-get install {package}: template {out.template}'s lock pins "
                + (f"{name} {have}" if have else f"no {name}")
                + f" (add it to harbor/images/{out.template}.toml's debian.packages and run "
                f"`harness lock image:{out.template}`)"
            )
    return problems


def _resolved_copies(state: _State, out: ImagePlan) -> dict[str, str]:
    """Requirements-file lookups: destination (absolute, and relative to the workdir) -> source."""
    found = dict(state.copied)
    cwd = state.cwd(out).rstrip("/") + "/"
    for dest, source in state.copied.items():
        if dest.startswith(cwd):
            found[dest[len(cwd) :]] = source
            found["./" + dest[len(cwd) :]] = source
    return found


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=~!@;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


_HANDLERS: dict[str, Callable[..., None]] = {
    "FROM": _from,
    "ARG": _arg,
    "ENV": _env,
    "WORKDIR": _workdir,
    "USER": _user,
    "COPY": _copy,
    "ADD": _add_step,
    "RUN": _run_step,
}
for _word, _why in (
    ("EXPOSE", "ports need no publishing: a task with network shares the host's"),
    ("LABEL", "metadata"),
    ("MAINTAINER", "metadata"),
    ("CMD", "Harbor replaces the container's command (it keeps the container up and execs into it)"),
    ("STOPSIGNAL", "the session's processes are killed when it stops"),
    ("VOLUME", "the session's root is a folder of the trial already"),
):
    _HANDLERS[_word] = _ignored(_word, _why)
