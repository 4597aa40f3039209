"""Rootfs templates: ``harbor/images/<label>.toml``, what a Harbor task's ``docker_image`` names.

A Harbor task names its image by a label (``[environment] docker_image``, and a separate
verifier's ``[verifier.environment] docker_image``). In a harness project the label chooses a
*rootfs template*: a root file system built into the store from

* a base of Debian packages (``[debian]``: the archive by name, whose address comes from the
  settings' ``[debian-archives]``; a suite, components, an architecture, the packages wanted;
  ``harness lock`` pins them and their ``Depends`` closure from the archive's Packages index;
  ``assume`` names dependencies the host's ``/usr`` stands in for, pinned by nobody;
  ``configure`` the pinned packages whose ``preinst``/``postinst`` run in a sandbox over the new
  root at realize time (``["*"]``: every pinned package's; :mod:`harness.realize.maintscripts`);
  the others' are not run);
* files of the project (``[[files]]``: ``path`` inside the root, ``source`` relative to the
  template's file, a file or a folder; a verifier template bundles its ``/tests`` this way, as
  Harbor expects of a verifier image);
* the task users it knows (``users``: written into the root's ``/etc/passwd`` and
  ``/etc/group``, uids from 1000 in the order given) and the harness environment its
  sessions run in (``environment``: a manifest of the project, used when the task names none
  itself);
* the Docker bases it stands in for (``provides``, e.g. ``["debian:bookworm"]``): a task's
  ``environment/Dockerfile`` whose ``FROM`` names one of them (or the label itself) gets this
  template as its root (:mod:`harness.harbor.dockerfile`).

Pure but for reading the file: text in, a :class:`Template` out; errors name file and key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from harness.errors import InputError
from harness.manifests.tomlfile import display_path, read_toml

TEMPLATE_DIR = "harbor/images"
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
_CONFIGURE = re.compile(r"^([a-z0-9][a-z0-9+.-]+|\*)$")
_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
#: A Docker image reference a template may stand in for: name[:tag], no digest, no registry port.
_REFERENCE = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,199}(?::[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?$")
KEYS = ("summary", "environment", "users", "provides", "debian", "files")
DEBIAN_KEYS = ("archive", "suite", "components", "architecture", "packages", "assume", "configure")
FILE_KEYS = ("path", "source", "executable")


@dataclass(frozen=True)
class DebianBase:
    """``[debian]``: which packages of which archive make the template's base."""

    archive: str
    suite: str
    components: tuple[str, ...]
    architecture: str
    packages: tuple[str, ...]
    assume: tuple[str, ...] = ()
    configure: tuple[str, ...] = ()  # packages whose maintainer scripts run (harness/realize/maintscripts.py)


@dataclass(frozen=True)
class TemplateFile:
    """One ``[[files]]`` entry: ``source`` (a file or folder of the project) at ``path``."""

    path: str  # absolute, normalized, inside the root
    source: Path
    executable: bool | None = None  # None: as the source file is


@dataclass(frozen=True)
class Template:
    label: str
    file: Path
    summary: str = ""
    environment: str | None = None
    users: tuple[str, ...] = ()
    debian: DebianBase | None = None
    files: tuple[TemplateFile, ...] = ()
    provides: tuple[str, ...] = ()


def is_label(text: str) -> bool:
    """Whether ``text`` can name a template (a Docker reference with ``:`` or ``/`` cannot)."""
    return bool(_LABEL.match(text))


def template_path(root: Path, label: str) -> Path:
    return root / TEMPLATE_DIR / f"{label}.toml"


def labels(root: Path) -> list[str]:
    """The labels of every template of the project at ``root``, sorted."""
    folder = root / TEMPLATE_DIR
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.toml") if is_label(p.stem))


def load_template(root: Path, label: str) -> Template:
    """The template ``label`` of the project at ``root``; :class:`InputError` naming file and key."""
    if not is_label(label):
        raise InputError(f"{label!r} is not a template label (letters, digits, '.', '_', '-')")
    path = template_path(root, label)
    if not path.is_file():
        raise InputError(
            f"no template {label!r}: {display_path(path)} does not exist",
            hint=f"write {TEMPLATE_DIR}/{label}.toml (docs/src/content/docs/guides/harbor.md)",
        )
    return parse_template(read_toml(path), label, path)


def parse_template(data: dict[str, Any], label: str, path: Path) -> Template:
    where = display_path(path)
    _no_unknown(data, KEYS, where, "")
    summary = _string(data, "summary", where, required=False) or ""
    environment = _string(data, "environment", where, required=False)
    users = _strings(data, "users", where, _USER, "a user name")
    provides = tuple(
        normalize_reference(r)
        for r in _strings(data, "provides", where, _REFERENCE, "a Docker image like debian:bookworm")
    )
    debian = _debian(data.get("debian"), where) if "debian" in data else None
    files = _files(data.get("files", []), where, path.parent)
    if debian is None and not files:
        raise InputError(f"{where}: the template has neither [debian] packages nor [[files]]")
    return Template(label, path, summary, environment, users, debian, files, provides)


def normalize_reference(image: str) -> str:
    """A Docker image reference as templates match it: ``docker.io/`` and ``library/`` dropped,
    ``:latest`` when it names no tag (pure)."""
    text = image.strip().split("@", 1)[0]
    for prefix in ("docker.io/", "index.docker.io/", "library/"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if ":" in text.rsplit("/", 1)[-1]:
        name, tag = text.rsplit(":", 1)
    else:
        name, tag = text, "latest"
    return f"{name}:{tag}"


def bases(root: Path) -> dict[str, str]:
    """Every base the templates of the project at ``root`` stand in for -> its label: each label
    itself, and each reference a template ``provides`` (normalized). Two templates providing one
    reference are an :class:`InputError` naming both files."""
    out: dict[str, str] = {}
    for label in labels(root):
        out[label] = label
    for label in labels(root):
        for reference in load_template(root, label).provides:
            other = out.get(reference)
            if other is not None and other != label:
                raise InputError(
                    f"{display_path(template_path(root, label))}: provides: {reference!r} is provided by "
                    f"{display_path(template_path(root, other))} too",
                    hint="one template per base: remove it from one of them",
                )
            out[reference] = label
    return out


def _debian(table: object, where: str) -> DebianBase:
    if not isinstance(table, dict):
        raise InputError(f"{where}: debian: expected a table")
    _no_unknown(table, DEBIAN_KEYS, where, "debian.")
    for key in ("archive", "suite", "architecture"):
        value = table.get(key)
        if not isinstance(value, str) or not _WORD.match(value):
            raise InputError(f"{where}: debian.{key}: expected a name (letters, digits, '.', '_', '+', '-')")
    components = _strings(table, "components", where, _WORD, "a component", prefix="debian.") or ("main",)
    packages = _strings(table, "packages", where, _PACKAGE, "a Debian package name", prefix="debian.")
    if not packages:
        raise InputError(f"{where}: debian.packages: name at least one package")
    assume = _strings(table, "assume", where, _PACKAGE, "a Debian package name", prefix="debian.")
    configure = _strings(table, "configure", where, _CONFIGURE, 'a Debian package name (or "*")', prefix="debian.")
    if "*" in configure and len(configure) > 1:
        raise InputError(f'{where}: debian.configure: "*" (every pinned package) stands alone')
    return DebianBase(
        table["archive"], table["suite"], components, table["architecture"], packages, assume, tuple(sorted(configure))
    )


def _files(entries: object, where: str, base: Path) -> tuple[TemplateFile, ...]:
    if not isinstance(entries, list):
        raise InputError(f"{where}: files: expected an array of tables ([[files]])")
    out = []
    for i, entry in enumerate(entries):
        key = f"files[{i}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: {key}: expected a table")
        _no_unknown(entry, FILE_KEYS, where, f"{key}.")
        inside = _inside(_string(entry, "path", where, prefix=f"{key}."), where, f"{key}.path")
        source = _string(entry, "source", where, prefix=f"{key}.") or ""
        resolved = (base / source).resolve()
        if PurePosixPath(source).is_absolute() or not resolved.exists():
            raise InputError(f"{where}: {key}.source: {source!r} is not a file or folder beside the template")
        executable = entry.get("executable")
        if executable is not None and not isinstance(executable, bool):
            raise InputError(f"{where}: {key}.executable: expected true or false")
        out.append(TemplateFile(inside, resolved, executable))
    return tuple(out)


def _inside(text: str | None, where: str, key: str) -> str:
    """``text`` as a normalized absolute path inside the root; ``..`` and ``/`` itself refused."""
    if not text or not text.startswith("/"):
        raise InputError(f"{where}: {key}: expected an absolute path inside the root, like /tests")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or any("\0" in p for p in parts):
        raise InputError(f"{where}: {key}: {text!r} is not a path inside the root")
    return "/" + "/".join(parts)


def _no_unknown(table: dict[str, Any], known: tuple[str, ...], where: str, prefix: str) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise InputError(
            f"{where}: unknown key(s) {', '.join(prefix + k for k in unknown)}",
            hint=f"the keys{' of ' + prefix.rstrip('.') if prefix else ''} are {', '.join(known)}",
        )


def _string(table: dict[str, Any], key: str, where: str, *, required: bool = True, prefix: str = "") -> str | None:
    value = table.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise InputError(f"{where}: {prefix}{key}: expected a non-empty string")
    return value


def _strings(
    table: dict[str, Any], key: str, where: str, pattern: re.Pattern[str], what: str, *, prefix: str = ""
) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list):
        raise InputError(f"{where}: {prefix}{key}: expected an array of strings")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not pattern.match(item):
            raise InputError(f"{where}: {prefix}{key}[{i}]: {item!r} is not {what}")
    return tuple(dict.fromkeys(value))
