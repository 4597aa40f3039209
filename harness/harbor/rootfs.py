"""A task's ``docker_image`` label as a rootfs template: found, realized, laid as the root's base.

Harbor tasks name images by label (``[environment] docker_image``; a separate verifier's
``[verifier.environment] docker_image``, whose image Harbor takes to bundle its tests). In a
harness project the label names ``harbor/images/<label>.toml``
(:mod:`harness.manifests.template`), locked by ``harness lock image:<label>`` and realized to
a store path of kind ``rootfs`` (:mod:`harness.realize.rootfs`). A session of such a task:

1. finds the template: in ``--ek project``, the task's ``environment/harness.toml``'s
   ``project``, else the nearest folder above the task holding ``harbor/images/<label>.toml``;
2. realizes it on first use (as the environment is; ``--ek realize=false`` refuses instead),
   checking that the lock is current first;
3. lays it as the base of the session's root (:func:`lay`): every top-level entry of the
   template but ``usr`` and ``etc`` is copied into the fresh root (writable, as an image's
   layer is in a container); the template's ``usr`` and ``etc`` are merged with the host's:
   the host's folder is bound read-only at ``/.host/usr`` (``/.host/etc``), and the root's
   ``/usr`` is a real folder whose entries are links — into ``/.host`` for the host's, into
   the template's store path (bound read-only at its own path, like the environment's) for
   the template's, a folder both have being merged one level down — so ``/usr/bin`` holds
   both the host's ``bash`` and the template's ``hello``, the template's winning, and laying
   a root costs a link per entry, never a copy of the template's ``/usr``. A template
   without ``usr``/``etc`` leaves the host's binds as they are.

A task whose label names no template keeps the host's ``/usr`` (warned of, as before).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError
from harness.harbor.dockerfile import ImagePlan
from harness.harbor.spec import EnvironmentSpec
from harness.lock.images import TemplateLock
from harness.manifests.template import is_label, template_path

HOST = "/.host"
#: Folders of a template merged with the host's rather than copied.
MERGED_WITH_HOST = ("usr", "etc")


@dataclass(frozen=True)
class Laid:
    """What :func:`lay` did: host folders bound elsewhere, counts for the record."""

    host_binds: dict[str, str] = field(default_factory=dict)  # host path -> path inside
    copied: int = 0
    linked: int = 0


def find_project(task_dir: Path, label: str, hint: Path | None) -> Path | None:
    """The project whose ``harbor/images/<label>.toml`` the task's label names (module doc, 1)."""
    if not label or not is_label(label):
        return None
    if hint is not None:
        return hint.resolve() if template_path(hint, label).is_file() else None
    start = task_dir.resolve()
    for candidate in (start, *start.parents):
        if template_path(candidate, label).is_file():
            return candidate
    return None


def task_labels(task_dir: Path) -> list[str]:
    """The ``docker_image`` labels of a task's ``task.toml``: the agent's, then a separate
    verifier's (``[verifier.environment]``), each once."""
    from harness.manifests.tomlfile import loads_bounded

    path = task_dir / "task.toml"
    try:
        data = loads_bounded(path.read_text(encoding="utf-8"), str(path))
    except (OSError, ValueError, HarnessError):
        return []
    found = [
        (data.get("environment") or {}).get("docker_image"),
        ((data.get("verifier") or {}).get("environment") or {}).get("docker_image"),
    ]
    return [label for label in dict.fromkeys(found) if isinstance(label, str) and label]


def dockerfile_base(environment_dir: Path, hint: Path | None) -> tuple[Path, dict[str, str], str | None] | None:
    """For a task with an ``environment/Dockerfile``: the project whose templates it may name
    (``hint``, else the nearest folder above the task holding ``harbor/images/``), those
    templates by the bases they stand in for (:func:`harness.manifests.template.bases`), and the
    label of the one its ``FROM`` names (None: none does). None without a Dockerfile or a project.
    :class:`~harness.errors.InputError` for a template that cannot be read."""
    from harness.harbor.dockerfile import base_image, template_for
    from harness.harbor.image import DOCKERFILE
    from harness.manifests.template import TEMPLATE_DIR, bases

    path = environment_dir / DOCKERFILE
    if not path.is_file():
        return None
    project = None
    if hint is not None:
        project = hint.resolve() if (hint / TEMPLATE_DIR).is_dir() else None
    else:
        start = environment_dir.parent.resolve()
        project = next((c for c in (start, *start.parents) if (c / TEMPLATE_DIR).is_dir()), None)
    if project is None:
        return None
    try:
        image = base_image(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None  # refused by name when the Dockerfile is read for the plan
    known = bases(project)
    return project, known, template_for(image, known) if image else None


def task_templates(task_dir: Path, *, dockerfile: bool = True) -> list[tuple[Path, str]]:
    """(project, label) of each template a task names: its ``docker_image`` labels' (module
    doc, 1), then its Dockerfile's ``FROM``'s (:func:`dockerfile_base`) unless ``dockerfile`` is
    False; each once."""
    out: list[tuple[Path, str]] = []
    for label in task_labels(task_dir):
        project = find_project(task_dir, label, None)
        if project is not None:
            out.append((project, label))
    if dockerfile:
        found = dockerfile_base(task_dir / "environment", None)
        if found is not None and found[2] is not None and (found[0], found[2]) not in out:
            out.append((found[0], found[2]))
    return out


def unpinned_packages(project: Path, plan: ImagePlan) -> list[str]:
    """The Dockerfile's ``apt-get install`` packages that the lock of its template (``plan.template``
    of ``project``) does not pin, each a refusal naming its line; empty when it pins them all,
    or when the template is not locked (realizing it is refused then, naming the fix)."""
    from harness.harbor.dockerfile import unpinned
    from harness.lock.images import read

    if not plan.packages or plan.template is None:
        return []
    try:
        lock = read(project, plan.template)
    except HarnessError:
        return []
    return unpinned(plan, {p.name: p.version for p in lock.packages})


def environment_spec(project: Path, label: str) -> EnvironmentSpec | None:
    """The environment template ``label``'s lock names, as a task's spec (None: it names none)."""
    from harness.lock.images import lock_path, read

    lock = read(project, label)
    if not lock.environment:
        return None
    return EnvironmentSpec(
        manifest=lock.environment,
        project=project,
        environment=lock.environment_store,
        source=f"{lock_path(project, label)} (docker_image = {label!r})",
    )


def describe(home: Path, project: Path, label: str) -> tuple[bool, str]:
    """One line saying whether template ``label`` is locked, current and realized in ``home``."""
    from harness.lock.images import read, stale_reason
    from harness.store.store import Store

    stale = stale_reason(project, label)
    if stale:
        return False, f"template {label}: {stale}"
    lock = read(project, label)
    realized = Store.in_home(home).is_registered(lock.store)
    return realized, f"template {label} -> {lock.store}: " + (
        "realized" if realized else "not realized (realized on first use)"
    )


def ensure(home: Path, project: Path, label: str, *, realize: bool, offline: bool) -> tuple[Path, TemplateLock]:
    """The realized store path of template ``label`` (built now unless ``realize`` is False)."""
    from harness.config import load_settings
    from harness.lock.images import read, stale_reason
    from harness.realize.debcache import downloaded
    from harness.realize.rootfs import realize_template
    from harness.store.store import Store

    stale = stale_reason(project, label)
    if stale:
        raise HarnessError(f"template {label}: its lock is stale: {stale}", hint=f"run `harness lock image:{label}`")
    lock = read(project, label)
    store = Store.in_home(home)
    if store.record(lock.store) is None:
        if not realize:
            raise HarnessError(
                f"template {label} ({lock.store}) is not realized in {home}",
                hint=f"run `harness realize image:{label}`, or drop --ek realize=false",
            )
        if offline and lock.packages:
            missing = [p for p in lock.packages if not downloaded(home, p.sha256)]
            if missing:
                raise HarnessError(f"template {label}: offline, and {len(missing)} package(s) are not downloaded")
        realize_template(store, load_settings(home, project), lock, project)
    return store.path(lock.store), lock


def lay(template: Path, root: Path) -> Laid:
    """Lay the realized ``template`` as the base of the session root ``root`` (module doc, 3)."""
    host_binds: dict[str, str] = {}
    copied = linked = 0
    for entry in sorted(os.listdir(template)):
        source = template / entry
        if entry in MERGED_WITH_HOST and source.is_dir() and not source.is_symlink():
            host = Path("/") / entry
            if host.is_dir():
                host_binds[str(host)] = f"{HOST}/{entry}"
                point = root / HOST.lstrip("/") / entry  # the mount point, readable by every task user
                point.mkdir(parents=True, exist_ok=True)
                os.chmod(point.parent, 0o755)
                c, n = _merge(source, root / entry, host, f"{HOST}/{entry}")
                copied, linked = copied + c, linked + n
                continue
        copied += _copy(source, root / entry)
    return Laid(host_binds, copied, linked)


def add_users(root: Path, names: list[str]) -> dict[str, int]:
    """The task users ``names`` written into the session root's ``/etc/passwd`` and
    ``/etc/group`` where the laid template gave it its own (the links into the template's store
    path become files of the session, the template's lines and then these); the uid of every user
    those files name after it (the template's users, then these). Empty where the template has
    no ``etc/passwd`` (the host's, or the sandbox's own, serves)."""
    from harness.realize.rootfs_users import add_users as added

    etc = root / "etc"
    passwd, group = etc / "passwd", etc / "group"
    if etc.is_symlink() or not etc.is_dir() or not os.path.lexists(passwd):
        return {}
    texts: list[str | None] = []
    for path in (passwd, group):
        try:
            texts.append(path.read_text(encoding="utf-8"))  # a link into the template's store path
        except OSError:
            texts.append(None)
    passwd_text, group_text, _ = added(texts[0], texts[1], names)
    for path, text in ((passwd, passwd_text), (group, group_text)):
        # Always the session's own file, never the link into the store: the sandbox binds its
        # table over /etc/passwd before the store paths are bound, and a link there has no target yet.
        if os.path.lexists(path):
            path.unlink()
        path.write_text(text, encoding="utf-8")
        os.chmod(path, 0o644)
    return {
        f[0]: int(f[2])
        for f in (line.split(":") for line in passwd_text.splitlines())
        if len(f) > 3 and f[2].isdigit() and f[2] != "0"
    }


def _merge(template: Path, dest: Path, host: Path, inside: str) -> tuple[int, int]:
    """``dest`` as the template's folder plus symlinks to each host entry it does not have."""
    dest.mkdir(parents=True, exist_ok=True)
    os.chmod(dest, 0o755)
    copied = linked = 0
    names = set(os.listdir(template))
    for name in sorted(names):
        source, target = template / name, dest / name
        host_entry = host / name
        if source.is_dir() and not source.is_symlink() and host_entry.is_dir():
            c, n = _merge(source, target, host_entry, f"{inside}/{name}")
            copied, linked = copied + c, linked + n
        else:  # the template's own: a link into its store path, bound read-only at its own path
            os.symlink(str(source), target)
            linked += 1
    try:
        host_names = os.listdir(host)
    except OSError:
        host_names = []
    for name in sorted(set(host_names) - names):
        os.symlink(f"{inside}/{name}", dest / name)
        linked += 1
    return copied, linked


def _copy(source: Path, dest: Path) -> int:
    """Copy one entry of the store into the root, writable by the root's owner."""
    if source.is_symlink():
        if os.path.lexists(dest):
            _remove(dest)
        os.symlink(os.readlink(source), dest)
        return 1
    if source.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        os.chmod(dest, 0o755)
        return sum(_copy(source / name, dest / name) for name in sorted(os.listdir(source)))
    if os.path.lexists(dest):
        _remove(dest)
    shutil.copyfile(source, dest, follow_symlinks=False)
    os.chmod(dest, 0o755 if os.stat(source).st_mode & 0o100 else 0o644)
    return 1


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
