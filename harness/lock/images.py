"""Locks of rootfs templates: ``locks/images/<label>.lock.toml`` (``harness lock image:LABEL``).

A template (:mod:`harness.manifests.template`) is locked into exact pins: every Debian package
of its base with its ``Depends`` closure (:mod:`harness.resolve.debian`: name, version, the
pool file, size, sha256), every file it takes from the project (path inside the root, sha256,
size, executable bit), its users, the store path of the harness environment it names (as the
project's lock of that manifest pins it), and the store path the whole realizes to. The
archive is named, never addressed: realize reads the address from ``[debian-archives]``.
``[debian] release`` says how the index was trusted (its InRelease verified with ``gpgv``
against the settings' keyring, ``signed-by`` the keys whose signatures held; or not verified,
the archive being marked ``allow-unsigned``).

``document``, ``dumps``, ``store_name`` and ``parse`` are pure; ``lock_template`` reads the
template, its files and the archive's index, and writes the lock (unchanged bytes when
nothing changed: a re-lock of unchanged inputs is byte-identical).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config import DebianTrust
from harness.errors import InputError
from harness.manifests.template import Template, load_template
from harness.manifests.tomlfile import display_path, read_toml
from harness.resolve.debian import DebPin

LOCK_VERSION = 1
#: What realize does to every template's tree, part of each store hash: merged /usr (bin, sbin,
#: lib* moved under usr/), absolute symlinks made relative, maintainer scripts not run, the
#: template's users in etc/passwd and etc/group (rootfs/2).
FORMAT = "rootfs/2: merged-usr, relative links, no maintainer scripts, users in etc/passwd and etc/group"
#: How the maintainer scripts of a template's ``configure`` packages run: part of the store
#: hash of a template that runs any (``harness/realize/maintscripts.py``).
MAINTSCRIPTS = "maintscripts/1: bwrap, root at /, preinst install then postinst configure, dependency order"
LOCKS = "images"
_FILE_LIMIT = 20000


@dataclass(frozen=True)
class LockedFile:
    path: str
    source: str  # relative to the project's root, posix
    sha256: str
    size: int
    executable: bool


@dataclass(frozen=True)
class TemplateLock:
    label: str
    template_sha256: str
    store: str
    users: tuple[str, ...]
    environment: str | None
    environment_store: str | None
    archive: str | None
    suite: str | None
    components: tuple[str, ...]
    architecture: str | None
    assumed: tuple[str, ...]
    packages: tuple[DebPin, ...]
    files: tuple[LockedFile, ...]
    #: How the archive's index was trusted (:mod:`harness.resolve.debrelease`: ``VERIFIED`` or
    #: ``UNVERIFIED``), and the fingerprints of the keys whose signatures held.
    release: str | None = None
    signed_by: tuple[str, ...] = ()
    #: The packages whose maintainer scripts realize runs (the template's ``configure``).
    configure: tuple[str, ...] = ()


def lock_path(root: Path, label: str) -> Path:
    return root / "locks" / LOCKS / f"{label}.lock.toml"


def store_name(
    label: str,
    packages: tuple[DebPin, ...],
    files: tuple[LockedFile, ...],
    users: tuple[str, ...],
    configure: tuple[str, ...] = (),
) -> str:
    """The store path name a template's pins realize to (pure); the scripts run are an input
    where there are any (so a template that runs none keeps the name it always had)."""
    from harness.store.hashing import sanitize_name, store_hash, store_path_name

    name = sanitize_name(f"rootfs-{label}")
    inputs: dict[str, object] = {
        "format": FORMAT,
        "packages": [{"name": p.name, "filename": p.filename, "sha256": p.sha256} for p in packages],
        "files": [{"path": f.path, "sha256": f.sha256, "executable": f.executable} for f in files],
        "users": list(users),
    }
    if configure:
        inputs["configure"] = {"packages": list(configure), "runner": MAINTSCRIPTS}
    return store_path_name(store_hash("rootfs", name, inputs), name)


def dumps(lock: TemplateLock) -> str:
    """The lock's bytes: fixed key order, entries sorted (pure)."""
    q = json.dumps
    lines = [
        "# Written by `harness lock image:" + lock.label + "`; do not edit.",
        f"lock-version = {LOCK_VERSION}",
        f"label = {q(lock.label)}",
        f"template-sha256 = {q(lock.template_sha256)}",
        f"format = {q(FORMAT)}",
        f"store = {q(lock.store)}",
        f"users = {q(list(lock.users))}",
    ]
    if lock.environment:
        lines.append(f"environment = {q(lock.environment)}")
    if lock.environment_store:
        lines.append(f"environment-store = {q(lock.environment_store)}")
    if lock.archive:
        lines += [
            "",
            "[debian]",
            f"archive = {q(lock.archive)}",
            f"suite = {q(lock.suite)}",
            f"components = {q(list(lock.components))}",
            f"architecture = {q(lock.architecture)}",
            f"assumed = {q(list(lock.assumed))}",
            f"release = {q(lock.release or '')}",
            f"signed-by = {q(list(lock.signed_by))}",
        ]
        if lock.configure:
            lines.append(f"configure = {q(list(lock.configure))}")
        for p in lock.packages:
            lines += ["", "[[debian.package]]", *(f"{k} = {q(v)}" for k, v in p.as_json().items())]
    for f in lock.files:
        lines += [
            "",
            "[[file]]",
            f"path = {q(f.path)}",
            f"source = {q(f.source)}",
            f"sha256 = {q(f.sha256)}",
            f"size = {f.size}",
            f"executable = {'true' if f.executable else 'false'}",
        ]
    return "\n".join(lines) + "\n"


def read(root: Path, label: str) -> TemplateLock:
    """The lock of template ``label``; :class:`InputError` naming the file (and key) if missing or bad."""
    path = lock_path(root, label)
    if not path.is_file():
        raise InputError(
            f"template {label!r} is not locked: {display_path(path)} does not exist",
            hint=f"run `harness lock image:{label}` in the project",
        )
    return parse(read_toml(path), display_path(path))


def parse(data: dict[str, Any], where: str) -> TemplateLock:
    """A lock's data, checked (pure): every key's type, the store name against the pins."""
    if data.get("lock-version") != LOCK_VERSION:
        raise InputError(f"{where}: lock-version: expected {LOCK_VERSION}")
    try:
        debian = data.get("debian") or {}
        packages = tuple(
            DebPin(
                _text(p["name"]),
                _text(p["version"]),
                _text(p["architecture"]),
                _text(p["filename"]),
                _number(p["size"]),
                _text(p["sha256"]),
            )
            for p in debian.get("package", [])
        )
        files = tuple(
            LockedFile(
                _text(f["path"]), _text(f["source"]), _text(f["sha256"]), _number(f["size"]), _flag(f["executable"])
            )
            for f in data.get("file", [])
        )
        lock = TemplateLock(
            label=_text(data["label"]),
            template_sha256=_text(data["template-sha256"]),
            store=_text(data["store"]),
            users=tuple(str(u) for u in data.get("users", [])),
            environment=data.get("environment"),
            environment_store=data.get("environment-store"),
            archive=debian.get("archive"),
            suite=debian.get("suite"),
            components=tuple(debian.get("components", [])),
            architecture=debian.get("architecture"),
            assumed=tuple(debian.get("assumed", [])),
            packages=packages,
            files=files,
            release=debian.get("release"),
            signed_by=tuple(_text(k) for k in debian.get("signed-by", [])),
            configure=tuple(_text(k) for k in debian.get("configure", [])),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(f"{where}: malformed template lock ({type(exc).__name__}: {exc})") from None
    for f in lock.files:
        parts = f.path.split("/")
        if not f.path.startswith("/") or ".." in parts or ".." in f.source.split("/") or f.source.startswith("/"):
            raise InputError(f"{where}: file {f.path!r}: a path outside the root or the project")
        if not _SHA256.fullmatch(f.sha256):
            raise InputError(f"{where}: file {f.path!r}: sha256: not 64 hexadecimal digits: {f.sha256!r}")
    for p in lock.packages:  # names of files realize makes (cache/debs/<sha256>.deb) and asks for
        if not _SHA256.fullmatch(p.sha256):
            raise InputError(f"{where}: debian.package {p.name!r}: sha256: not 64 hexadecimal digits: {p.sha256!r}")
        if not _POOL_PATH.fullmatch(p.filename) or ".." in p.filename.split("/"):
            raise InputError(
                f"{where}: debian.package {p.name!r}: filename: not a path in the archive's pool: {p.filename!r}"
            )
    if lock.packages and not lock.archive:
        raise InputError(f"{where}: debian.archive: packages are pinned but no archive is named")
    unpinned = sorted(set(lock.configure) - {p.name for p in lock.packages})
    if unpinned:
        raise InputError(f"{where}: debian.configure: {', '.join(unpinned)} not pinned")
    expected = store_name(lock.label, lock.packages, lock.files, lock.users, lock.configure)
    if lock.store != expected:
        raise InputError(f"{where}: store: {lock.store} does not match its pins ({expected}): re-lock it")
    return lock


_SHA256 = re.compile(r"[0-9a-f]{64}")
#: A file of an archive, relative to its root (``pool/main/t/tool/tool_1.0-1_amd64.deb``).
_POOL_PATH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~%-]*(/[A-Za-z0-9._+~%-]+)*\.deb")


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _number(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def template_digest(template: Template) -> str:
    return hashlib.sha256(template.file.read_bytes()).hexdigest()


def locked_files(template: Template, root: Path) -> tuple[LockedFile, ...]:
    """Every file the template takes from the project, hashed; a folder gives each file in it."""
    out: dict[str, LockedFile] = {}
    for entry in template.files:
        sources = [(entry.path, entry.source)]
        if entry.source.is_dir():
            sources = []
            for folder, dirs, names in os.walk(entry.source):
                dirs.sort()
                for name in sorted(names):
                    full = Path(folder) / name
                    sources.append((entry.path + "/" + full.relative_to(entry.source).as_posix(), full))
        for inside, source in sources:
            if source.is_symlink() or not source.is_file():
                raise InputError(f"{display_path(template.file)}: files: {source} is not a regular file")
            try:
                shown = source.resolve().relative_to(root.resolve()).as_posix()
            except ValueError:
                raise InputError(
                    f"{display_path(template.file)}: files: {source} is outside the project {root}"
                ) from None
            data = source.read_bytes()
            executable = entry.executable if entry.executable is not None else bool(source.stat().st_mode & 0o111)
            out[inside] = LockedFile(inside, shown, hashlib.sha256(data).hexdigest(), len(data), executable)
            if len(out) > _FILE_LIMIT:
                raise InputError(f"{display_path(template.file)}: files: more than {_FILE_LIMIT} files")
    return tuple(out[k] for k in sorted(out))


def lock_template(
    root: Path, label: str, archive_url: str | None, trust: DebianTrust | None = None
) -> tuple[Path, bool]:
    """Lock template ``label`` of the project at ``root``; (the lock's path, whether it changed).

    ``archive_url`` is the address of the archive the template names (None: it names none);
    ``trust`` how its InRelease is checked (``Settings.debian_trust``), required with it."""
    template = load_template(root, label)
    packages: tuple[DebPin, ...] = ()
    base = template.debian
    release_note: str | None = None
    signers: tuple[str, ...] = ()
    configure: tuple[str, ...] = ()
    if base is not None:
        from harness.resolve.debian import closure, read_index
        from harness.resolve.debrelease import UNVERIFIED, VERIFIED, fetch_release

        if archive_url is None or trust is None:
            raise InputError(f"{display_path(template.file)}: debian.archive: no address or keyring given to lock it")
        release = fetch_release(archive_url, base.suite, trust.keyring) if trust.keyring is not None else None
        release_note = VERIFIED if release is not None else UNVERIFIED
        signers = release.signed_by if release is not None else ()
        stanzas: list[dict[str, str]] = []
        for component in base.components:
            stanzas += read_index(archive_url, base.suite, component, base.architecture, release)
        packages = tuple(closure(stanzas, base.packages, base.assume, display_path(template.file)))
        configure = tuple(p.name for p in packages) if base.configure == ("*",) else base.configure
        unpinned = sorted(set(configure) - {p.name for p in packages})
        if unpinned:
            raise InputError(
                f"{display_path(template.file)}: debian.configure: {', '.join(unpinned)} is not one of the "
                "packages the template pins",
                hint="name packages of `packages` or of their dependencies; an assumed one is the host's",
            )
    files = locked_files(template, root)
    env_store = _environment_store(root, template)
    lock = TemplateLock(
        label=label,
        template_sha256=template_digest(template),
        store=store_name(label, packages, files, template.users, configure),
        users=template.users,
        environment=template.environment,
        environment_store=env_store,
        archive=base.archive if base else None,
        suite=base.suite if base else None,
        components=base.components if base else (),
        architecture=base.architecture if base else None,
        assumed=base.assume if base else (),
        packages=packages,
        files=files,
        release=release_note,
        signed_by=signers,
        configure=configure,
    )
    return _write(lock_path(root, label), dumps(lock))


def _environment_store(root: Path, template: Template) -> str | None:
    """The store path the project's lock of the template's ``environment`` pins."""
    if not template.environment:
        return None
    from harness.lock.lockfile import lock_path as manifest_lock, read

    path = manifest_lock(root / "locks", template.environment)
    if not path.is_file():
        raise InputError(
            f"{display_path(template.file)}: environment: {template.environment!r} is not locked",
            hint=f"run `harness lock {template.environment}` first",
        )
    return read(path).environment.store


def _write(path: Path, text: str) -> tuple[Path, bool]:
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)
    return path, True


def stale_reason(root: Path, label: str) -> str | None:
    """Why template ``label``'s lock no longer matches its inputs (None: it does); offline."""
    try:
        lock = read(root, label)
        template = load_template(root, label)
    except InputError as exc:
        return str(exc)
    if template_digest(template) != lock.template_sha256:
        return f"{display_path(template.file)} changed since it was locked"
    if locked_files(template, root) != lock.files:
        return "a file the template takes changed since it was locked"
    return None


def _checkable_now(home: Path, root: Path, label: str) -> bool:
    """Whether template ``label``'s lock was made without checking the archive's InRelease
    (``allow-unsigned``, or before harness checked it) and the settings now name a keyring:
    then ``harness lock`` locks it again, checked."""
    from harness.config import load_settings
    from harness.resolve.debrelease import VERIFIED

    lock = read(root, label)
    if lock.archive is None or lock.release == VERIFIED:
        return False
    try:
        return load_settings(home, root).debian_trust(lock.archive).keyring is not None
    except InputError:
        return False


@dataclass(frozen=True)
class Locked:
    """One template's outcome of ``harness lock``."""

    label: str
    path: Path
    changed: bool = False
    error: str | None = None
    bad_input: bool = False  # the error is the template's (exit 2), not the archive's


def lock_templates(
    home: Path, root: Path, wanted: list[str] | None, *, offline: bool = False, refresh: bool = False
) -> list[Locked]:
    """Lock the templates ``wanted`` (None: every template of the project); each failure is
    its outcome's ``error``, so one bad template does not stop the others.

    A lock whose template and files are unchanged is kept as it is, without reading the
    archive (its pins stay, as a manifest's do), unless ``refresh`` (``--refresh``,
    ``--upgrade``) asks to resolve again, or the lock was made from an unchecked index and the
    settings now name the archive's keyring; ``offline`` refuses a lock that would need the
    archive (and keeps an unchecked one as it is)."""
    from harness.config import load_settings
    from harness.errors import HarnessError
    from harness.manifests.template import labels

    names = labels(root) if wanted is None else wanted
    out = []
    for label in names:
        try:
            current = lock_path(root, label).is_file() and stale_reason(root, label) is None
            if current and not refresh and (offline or not _checkable_now(home, root, label)):
                out.append(Locked(label, lock_path(root, label)))
                continue
            if offline:
                raise InputError(
                    f"template {label} needs its archive's Packages index, and --offline forbids reading it",
                    hint=f"run `harness lock image:{label}` with network",
                )
            template = load_template(root, label)
            url, trust = None, None
            if template.debian is not None:
                settings = load_settings(home, root)
                url = settings.debian_archive(template.debian.archive)
                trust = settings.debian_trust(template.debian.archive)
            path, changed = lock_template(root, label, url, trust)
            out.append(Locked(label, path, changed))
        except HarnessError as exc:
            bad = isinstance(exc, InputError)
            out.append(Locked(label, lock_path(root, label), error=f"image:{label}: {exc}", bad_input=bad))
    return out
