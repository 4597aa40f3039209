"""A task's ``environment/Dockerfile`` applied to a session, or refused by name.

:func:`harness.harbor.dockerfile.plan` says, purely, what a trial does with each step; this
module does it: :func:`read` plans the task's Dockerfile (and refuses a compose file, naming
its sidecar services), :func:`check` refuses what the session cannot honour (a base the host
cannot stand in for, an interpreter of another version, a ``pip install`` the locked
environment does not satisfy), and :func:`copy_into` puts ``COPY``'d files into the
session's root before the sandbox starts. Every refusal is an :class:`ImageRefused` naming
the file, the line and the step; the environment raises it to Harbor as
``SandboxBuildFailedError``, the error of an image that cannot be built.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from harness.errors import HarnessError
from harness.harbor.dockerfile import ImagePlan, protected, plan

DOCKERFILE = "Dockerfile"
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


class ImageRefused(HarnessError):
    """The task's environment definition has a step a session cannot apply."""


def read(
    environment_dir: Path,
    base_env: Mapping[str, str],
    *,
    tests_bundled: bool = False,
    templates: Mapping[str, str] | None = None,
    label_template: str | None = None,
) -> ImagePlan | None:
    """The plan of ``environment_dir``'s Dockerfile (None without one); :class:`ImageRefused`
    for a compose file, or for the Dockerfile's refused steps (all of them, by line).
    ``tests_bundled``: a separate verifier's image, which may COPY its tests into ``/tests``;
    ``templates`` and ``label_template``: the project's rootfs templates by the bases they stand
    in for, and the one the task's ``docker_image`` names (:func:`plan`)."""
    _refuse_compose(environment_dir)
    path = environment_dir / DOCKERFILE
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ImageRefused(f"environment/{DOCKERFILE}: cannot be read: {exc}") from None
    out = plan(
        text,
        base_env,
        lambda name: _context_text(environment_dir, name),
        tests_bundled=tests_bundled,
        templates=templates,
        label_template=label_template,
    )
    if out.refused:
        raise ImageRefused(
            f"environment/{DOCKERFILE}: "
            + "; ".join(f"line {s.line}: {s.text}: {s.how}" for s in out.refused)
            + " (harness applies FROM a rootfs template or a Debian or python base, ARG, ENV, WORKDIR, COPY, "
            "USER, and RUN apt-get install of packages the template pins, pip/uv pip install, mkdir, useradd)"
        )
    return out


def _refuse_compose(environment_dir: Path) -> None:
    for name in COMPOSE_FILES:
        path = environment_dir / name
        if not path.is_file():
            continue
        try:
            services = _services(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):  # unreadable: refused all the same, without the names
            services = []
        sidecars = [s for s in services if s != "main"]
        what = (
            f"sidecar service(s) {', '.join(sidecars)} cannot be served"
            if sidecars
            else "compose settings of the main service are not applied"
        )
        raise ImageRefused(
            f"environment/{name}: {what}: a harness session runs no containers "
            "(serving sidecars as harness services is not built yet)"
        )


def _services(text: str) -> list[str]:
    """The service names of a compose file's top-level ``services:`` (the keys one level in)."""
    import re

    names: list[str] = []
    indent: str | None = None
    inside = False
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            inside = re.match(r"^services:\s*(#.*)?$", line) is not None
            indent = None
            continue
        match = re.match(r"^(\s+)[\"']?([A-Za-z0-9._-]+)[\"']?\s*:", line)
        if inside and match and (indent is None or match.group(1) == indent):
            indent = match.group(1)
            names.append(match.group(2))
    return names


def _context_text(environment_dir: Path, name: str) -> str | None:
    candidate = (environment_dir / name.lstrip("/")).resolve()
    if candidate.is_relative_to(environment_dir.resolve()) and candidate.is_file():
        try:
            return candidate.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    return None


def check(out: ImagePlan, environment: Path, os_release: Mapping[str, str]) -> list[str]:
    """Why the session cannot be the image ``out`` describes (empty: it can): the host is
    not Debian, the environment's Python is not the base's, a ``pip install`` requirement is
    not in the locked environment."""
    problems = []
    line = next((s.line for s in out.steps if s.text.startswith("FROM")), 0)
    family = {os_release.get("id", ""), *os_release.get("id_like", "").split()}
    if "debian" not in family and not out.base_is_template:
        problems.append(
            f"line {line}: FROM {out.base}: this host is {os_release.get('pretty_name') or 'not Debian'}, "
            "which cannot stand in for a Debian base"
        )
    version, site = _python_of(environment)
    if out.python and version and not (version + ".").startswith(out.python + "."):
        problems.append(
            f"line {line}: FROM {out.base}: the environment's Python is {version}: "
            f"lock the task's manifest for python = {out.python!r}"
        )
    problems += _unmet(out, site, version)
    return problems


def _python_of(environment: Path) -> tuple[str | None, Path | None]:
    """The environment's Python version (as its ``pyvenv.cfg`` says) and site-packages."""
    version = None
    try:
        for raw in (environment / "pyvenv.cfg").read_text(encoding="utf-8").splitlines():
            key, _, value = raw.partition("=")
            if key.strip() in ("version_info", "version"):
                version = value.strip()
    except OSError:
        pass
    sites = sorted(glob.glob(str(environment / "lib" / "python3*" / "site-packages")))
    return version, Path(sites[0]) if sites else None


def _unmet(out: ImagePlan, site: Path | None, version: str | None) -> list[str]:
    """The ``pip install`` requirements of ``out`` the environment at ``site`` does not meet."""
    from importlib.metadata import distributions

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    installed: dict[str, str] = {}
    if site is not None:
        for dist in distributions(path=[str(site)]):
            name = dist.metadata["Name"]
            if name:
                installed.setdefault(canonicalize_name(name), dist.version)
    problems = []
    for line, text in out.requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            problems.append(f"line {line}: pip install {text}: not a requirement ({exc})")
            continue
        if (
            req.marker is not None
            and version
            and not req.marker.evaluate(
                {"python_version": ".".join(version.split(".")[:2]), "python_full_version": version}
            )
        ):
            continue
        have = installed.get(canonicalize_name(req.name))
        if have is None or not req.specifier.contains(have, prereleases=True):
            problems.append(
                f"line {line}: pip install {text}: the locked environment has "
                + (f"{req.name} {have}" if have else f"no {req.name}")
                + " (add it to the task's manifest and lock again: python -m harness.harbor init --force)"
            )
    return problems


def copy_into(out: ImagePlan, environment_dir: Path, root: Path) -> list[tuple[str, str | None]]:
    """Copy the plan's ``COPY`` files from ``environment_dir`` into the session folder
    ``root`` (fresh and empty: nothing there can redirect a write); the paths made, inside,
    each with the user ``--chown`` gives it to (None: root's). Sources never leave
    ``environment_dir`` (a link out of it is refused)."""
    context = environment_dir.resolve()
    made = []
    for step in out.copies:
        for pattern in step.sources:
            matches = sorted(glob.glob(str(context / pattern))) if glob.has_magic(pattern) else [str(context / pattern)]
            if not matches or not all(os.path.lexists(m) for m in matches):
                raise ImageRefused(
                    f"environment/{DOCKERFILE}: line {step.line}: COPY {pattern}: no such file in environment/"
                )
            for match in matches:
                source = Path(match)
                if not source.resolve().is_relative_to(context):
                    raise ImageRefused(
                        f"environment/{DOCKERFILE}: line {step.line}: COPY {pattern}: leads outside environment/"
                    )
                made.append((_copy_one(source, step.dest, root, context, step.line, out.writable), step.owner))
    return made


def _copy_one(source: Path, dest: str, root: Path, context: Path, line: int, writable: tuple[str, ...]) -> str:
    """``source`` to ``dest`` (inside) as ``COPY`` does: a folder's contents into the
    destination folder, a file to the destination (into it when it ends in ``/``)."""
    inside = dest.rstrip("/") or "/"
    if source.resolve().is_dir():
        target = root / inside.lstrip("/")
        for child in sorted(os.listdir(source.resolve())):
            why = protected(inside.rstrip("/") + "/" + child, writable)
            if why:
                raise ImageRefused(f"environment/{DOCKERFILE}: line {line}: COPY {source.name}/{child}: {why}")
        for below in source.resolve().rglob("*"):
            if below.is_symlink() and not below.resolve().is_relative_to(context):
                raise ImageRefused(f"environment/{DOCKERFILE}: line {line}: COPY {below}: a link out of environment/")
        shutil.copytree(source.resolve(), target, symlinks=True, dirs_exist_ok=True)
        return inside
    if dest.endswith("/") or (root / inside.lstrip("/")).is_dir():
        inside = inside.rstrip("/") + "/" + source.name
    target = root / inside.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source.resolve(), target)
    return inside
