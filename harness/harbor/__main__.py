"""``python -m harness.harbor pin TASK...``: pin tasks to the store path their lock realizes to.

For a task whose ``environment/harness.toml`` names a ``manifest`` (or a ``lock``), writes
``environment = "<the lock's environment store path>"`` into that file (keeping its comments
and other keys), so Harbor's task digest changes exactly when the environment does. Prints
one line per task: the pin, and whether it changed. Needs no Harbor.

``python -m harness.harbor check TASK...`` prints what each task resolves to without
realizing anything (exit 1 when a pin drifted or a path is missing, or when a trial would
refuse a step of the task's Dockerfile or its compose file).

``python -m harness.harbor init TASK [--project DIR] [--name NAME] [--python X.Y]`` gives a
task an environment from its ``environment/Dockerfile`` (:mod:`harness.harbor.dockerfile`):
writes ``benchmarks/<name>.toml`` in the project (a ``FROM python:X`` base and the
``pip``/``uv pip`` ``install`` lines) and ``environment/harness.toml`` naming it, and lists
every step of the Dockerfile it could not translate (also as comments in the manifest).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import HarnessError, InputError

if TYPE_CHECKING:
    from harness.harbor.spec import EnvironmentSpec
    from harness.lock.document import Lock


def _lock_of(task: Path) -> tuple[EnvironmentSpec, Lock | None]:
    from harness.harbor.resolve import _project
    from harness.harbor.spec import read_spec
    from harness.lock.lockfile import lock_path, read

    spec = read_spec(task / "environment", default=_template_spec(task))
    if spec.manifest:
        return spec, read(lock_path(_project(spec, task).locks_dir, spec.manifest))
    if spec.lock:
        return spec, read(spec.lock)
    return spec, None


def _template_spec(task: Path) -> EnvironmentSpec | None:
    """The environment the task's template names (its ``docker_image`` label's, else its
    Dockerfile's ``FROM``'s: harness/harbor/rootfs.py)."""
    from harness.harbor import rootfs

    found = rootfs.task_templates(task)
    return rootfs.environment_spec(*found[0]) if found else None


def _templates(task: Path, home: Path) -> tuple[bool, list[str]]:
    """Whether every template the task names is realized, and a line for each."""
    from harness.harbor import rootfs

    ok, lines = True, list[str]()
    for project, label in rootfs.task_templates(task):
        good, line = rootfs.describe(home, project, label)
        ok, lines = ok and good, [*lines, f"{task}: {line}"]
    return ok, lines


def pin(task: Path) -> str:
    import tomlkit

    from harness.harbor.spec import FILE_NAME

    spec, lock = _lock_of(task)
    if lock is None:
        raise HarnessError(f"{task}: names a bare store path ({spec.environment}); nothing to pin from")
    path = task / "environment" / FILE_NAME
    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    old = doc.get("environment")
    doc["environment"] = lock.environment.store
    path.write_text(tomlkit.dumps(doc), encoding="utf-8")
    state = "unchanged" if old == lock.environment.store else (f"was {old}" if old else "new")
    return f"{task}: environment = {lock.environment.store} ({state})"


def _refused(task: Path) -> str | None:
    """Why a trial of ``task`` would refuse its Dockerfile or compose file (None: it would not)."""
    from harness.harbor import image, rootfs

    try:
        found = rootfs.dockerfile_base(task / "environment", None)
        labelled = rootfs.task_templates(task, dockerfile=False)
        plan = image.read(
            task / "environment",
            {},
            templates=found[1] if found else None,
            label_template=labelled[0][1] if labelled else None,
        )
        projects = {label: project for project, label in rootfs.task_templates(task)}
        if plan is not None and plan.template in projects:
            problems = rootfs.unpinned_packages(projects[plan.template], plan)
            if problems:
                return f"environment/{image.DOCKERFILE}: " + "; ".join(problems)
    except (image.ImageRefused, InputError) as exc:
        return str(exc)
    return None


def check(task: Path, home: Path) -> tuple[bool, str]:

    refused = _refused(task)
    if refused:
        return False, f"{task}: a trial is refused: {refused}"
    templates_ok, template_lines = _templates(task, home)
    ok, line = _check_environment(task, home)
    return ok and templates_ok, "\n".join([line, *template_lines])


def _check_environment(task: Path, home: Path) -> tuple[bool, str]:
    from harness.realize.builder import lock_objects
    from harness.store.store import Store

    spec, lock = _lock_of(task)
    store = Store.in_home(home)
    if lock is None:
        ok = store.is_registered(spec.environment or "")
        return ok, f"{task}: {spec.describe()} ({'realized' if ok else 'not realized'})"
    if spec.environment and spec.environment != lock.environment.store:
        return False, f"{task}: drifted: pins {spec.environment}, the lock realizes to {lock.environment.store}"
    from harness.realize.standin import realized_lock

    here = realized_lock(store, lock)  # a host interpreter may stand in for the lock's
    missing = [n for n in lock_objects(here) if not store.is_registered(n)]
    state = "realized" if not missing else f"{len(missing)} store path(s) not realized (realized on first use)"
    return not missing, f"{task}: {spec.describe()} -> {here.environment.store}: {state}"


def init(task: Path, project: Path | None, name: str | None, python: str | None, force: bool) -> list[str]:
    """Write the task's manifest and ``harness.toml`` (module doc); the lines to print."""
    import platform
    import re

    import tomlkit

    from harness.errors import InputError
    from harness.harbor.dockerfile import translate
    from harness.harbor.spec import FILE_NAME
    from harness.manifests.project import find_project

    env_dir = task / "environment"
    dockerfile = env_dir / "Dockerfile"
    if not (task / "task.toml").is_file():
        raise InputError(f"{task}: not a Harbor task (no task.toml)")
    text = dockerfile.read_text(encoding="utf-8") if dockerfile.is_file() else ""
    if project is None:
        root = find_project(task).root
    else:
        root = project.resolve()
        (root / "services").mkdir(parents=True, exist_ok=True)
    name = name or re.sub(r"[^a-z0-9]+", "-", task.resolve().name.lower()).strip("-") or "task"
    if not re.match(r"^[a-z0-9][a-z0-9._-]*$", name):
        raise InputError(f"--name {name!r}: use lower-case letters, digits, '.', '_' and '-'")

    def read(path: str) -> str | None:
        candidate = (env_dir / path.lstrip("/")).resolve()
        if candidate.is_relative_to(env_dir.resolve()) and candidate.is_file():
            return candidate.read_text(encoding="utf-8")
        return None

    out = translate(text, read)
    if not text:
        out.untranslated.insert(0, "no environment/Dockerfile: an environment with Python only")
    version = python or out.python or ".".join(platform.python_version_tuple()[:2])
    if not (python or out.python):
        out.untranslated.append(
            f"python = {version!r} is this interpreter's version: change it if the task needs another"
        )
    manifest = root / "benchmarks" / f"{name}.toml"
    spec_file = env_dir / FILE_NAME
    for path in (manifest, spec_file):
        if path.exists() and not force:
            raise InputError(f"{path} exists", hint="pass --force to replace it, or --name for another manifest")
    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"From {dockerfile if text else task} by python -m harness.harbor init."))
    for step in out.untranslated:
        doc.add(tomlkit.comment(f"not translated: {step}"))
    doc["kind"] = "benchmark"
    doc["summary"] = f"environment of the Harbor task {task.resolve().name}"
    envt = tomlkit.table()
    envt["python"] = version
    envt["requirements"] = out.requirements
    doc["environment"] = envt
    from harness.manifests.model import BenchmarkManifest

    try:
        BenchmarkManifest.model_validate(doc.unwrap())
    except Exception as exc:  # a requirement pip accepted that a manifest does not
        raise InputError(f"{dockerfile}: does not make a valid manifest: {exc}") from None
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(tomlkit.dumps(doc), encoding="utf-8")
    env_dir.mkdir(exist_ok=True)
    relative = os.path.relpath(root, env_dir.resolve())
    spec_file.write_text(f'manifest = "{name}"\nproject = "{relative}"\n', encoding="utf-8")
    lines = [
        f"{manifest}: python {version}, {len(out.requirements)} requirement(s)",
        f"{spec_file}: manifest = {name!r}, project = {relative!r}",
    ]
    lines += [f"not translated: {step}" for step in out.untranslated]
    from harness.harbor.dockerfile import plan

    lines += [
        f"a trial refuses: line {s.line}: {s.text}: {s.how} (remove the step, or install it on the host)"
        for s in plan(text, {}, read).refused
        if text
    ]
    lines.append(f"next: harness --project {root} lock {name}; python -m harness.harbor pin {task}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.harbor", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("pin", "check"):
        one = sub.add_parser(name)
        one.add_argument("tasks", nargs="+", type=Path)
        one.add_argument("--home", help="HARNESS_HOME (check only)")
    one = sub.add_parser("init", help="a task's environment from its Dockerfile")
    one.add_argument("tasks", nargs=1, type=Path)
    one.add_argument("--project", type=Path, help="the harness project (else the nearest above the task)")
    one.add_argument("--name", help="the benchmark manifest's name (else the task folder's)")
    one.add_argument("--python", help="the Python version (else the Dockerfile's python:X base)")
    one.add_argument("--force", action="store_true", help="replace an existing manifest or harness.toml")
    args = parser.parse_args(argv)
    home = Path(getattr(args, "home", None) or os.environ.get("HARNESS_HOME") or "~/.cache/harness").expanduser()
    status = 0
    for task in args.tasks:
        try:
            if args.command == "init":
                print("\n".join(init(task, args.project, args.name, args.python, args.force)))
            elif args.command == "pin":
                print(pin(task))
            else:
                ok, line = check(task, home)
                print(line)
                status |= 0 if ok else 1
        except HarnessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
