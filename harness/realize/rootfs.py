"""Rootfs templates realized into the store: Debian packages unpacked, files added, no root.

:func:`realize_template` builds what a template's lock (:mod:`harness.lock.images`) pins into
one store path of kind ``rootfs``, without root and without Docker:

1. every ``.deb`` is downloaded from the archive the settings name (``[debian-archives]``),
   by the size and sha256 the lock pinned (``harness/download.py``: a mismatch names the
   file, the expected and the actual sha256), into ``$HARNESS_HOME/cache/debs/``
   (:mod:`harness.realize.debcache`: what another member of a shared home plants there is
   removed or passed by, and each file's bytes are checked again as they are read);
2. each is read with a pure-Python ``ar`` and ``tar`` reader (no ``dpkg``): its ``data.tar``
   is unpacked in name order, members checked first — an absolute path, a ``..``, a member
   written through a symlink, a symlink whose target climbs above the root, or a file two
   packages give different bytes is refused naming the ``.deb`` and the member. Merged
   ``/usr`` as Debian has it since bookworm: ``bin``, ``sbin`` and ``lib*`` go under
   ``usr/``. An absolute symlink target is made relative (it still means the same path
   inside the root, and nothing on the host). Devices and FIFOs are not made; setuid bits
   are dropped (the store keeps the executable bit only);
3. **maintainer scripts run only for the packages the template names** (``[debian] configure``,
   ``["*"]`` for all): theirs ``preinst install`` then ``postinst configure``, in dependency
   order, in a sandbox over the new root with a fixed environment
   (:mod:`harness.realize.maintscripts`, which says why a template opts in); a machine that
   cannot make the sandbox refuses such a template.
   Every other package's files are as shipped; ``/.harness-rootfs.json`` in the tree names
   every package, what was not made, which scripts ran and which each other package carries
   that did not run;
4. the project's files are copied in, each checked against the sha256 the lock recorded (a
   changed file is a stale lock, never a different root); the template's users are written
   into ``etc/passwd`` and ``etc/group`` (:mod:`harness.realize.rootfs_users`).

The content depends on the lock alone: two empty homes register the same store path with the
same content hash (the store's canonical serialization keeps no times or owners).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import posixpath
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.config import Settings
from harness.download import read_checked
from harness.errors import HarnessError
from harness.lock.images import FORMAT, LockedFile, TemplateLock
from harness.resolve.debian import DebPin
from harness.progress import QUIET, Reporter
from harness.realize.rootfs_users import write_users
from harness.store.store import BuildResult, Record, Store

#: Top-level folders that merged /usr keeps under usr/.
MERGED = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
MAINTAINER_SCRIPTS = ("preinst", "postinst", "prerm", "postrm", "config", "triggers")
MANIFEST = ".harness-rootfs.json"


class RootfsError(HarnessError):
    """A template cannot be realized: a .deb refused, a file changed since the lock."""


@dataclass
class Unpacked:
    """What unpacking the packages did besides writing their files (for the manifest)."""

    owners: dict[str, str] = field(default_factory=dict)  # path in the tree -> package
    skipped: list[str] = field(default_factory=list)
    relinked: int = 0
    scripts: dict[str, list[str]] = field(default_factory=dict)
    bodies: dict[str, dict[str, bytes]] = field(default_factory=dict)  # package -> script -> its bytes
    depends: dict[str, set[str]] = field(default_factory=dict)  # package -> what its control names
    provides: dict[str, set[str]] = field(default_factory=dict)  # package -> the virtual names it provides
    ran: list[str] = field(default_factory=list)  # "package script args", in the order run


def realize_template(
    store: Store, settings: Settings, lock: TemplateLock, project_root: Path, *, progress: Reporter = QUIET
) -> Record:
    """The store path of ``lock``, built now if it is not registered (module doc)."""
    existing = store.record(lock.store)
    if existing is not None:
        return existing
    if lock.configure:
        from harness.realize.maintscripts import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            raise RootfsError(
                f"template {lock.label}: cannot run the maintainer scripts of {', '.join(lock.configure)} "
                f"(its `configure`) here: {reason}",
                hint="realize it where user namespaces can be made and pull it from a binary cache, "
                "or drop `configure` from the template",
            )
    debs = _fetch(store, settings, lock) if lock.packages else []
    for entry in lock.files:  # a stale lock is refused before anything is built
        _checked_source(lock, project_root, entry)

    def build(out: Path) -> BuildResult:
        out.mkdir()
        done = Unpacked()
        for pin, path in zip(lock.packages, debs, strict=True):
            shown = posixpath.basename(pin.filename)
            # Read once and checked again: another member may have changed the download since.
            data = read_checked(path, sha256=pin.sha256, size=pin.size, where=f"template {lock.label}: {shown}")
            unpack_deb(io.BytesIO(data), out, pin.name, done, shown=shown)
        if lock.configure:
            _configure(lock, out, done)
        _add_files(lock, project_root, out)
        write_users(out, lock.users)  # /etc/passwd and /etc/group name the template's users
        _write_manifest(lock, out, done)
        return BuildResult(obtained="built from the template's lock")

    record = store.add(lock.store, "rootfs", build, progress=progress)
    from harness.store.gc import register_project

    register_project(store, project_root, {f"image:{lock.label}": [lock.store]})  # a gc root
    return record


def _fetch(store: Store, settings: Settings, lock: TemplateLock) -> list[Path]:
    from harness.download import download
    from harness.realize.debcache import fetch

    assert lock.archive is not None
    address = settings.debian_archive(lock.archive)
    paths = []
    for pin in lock.packages:
        label = f"{posixpath.basename(pin.filename)} (template {lock.label})"

        def into(dest: Path, pin: DebPin = pin, label: str = label) -> None:
            download(f"{address}/{pin.filename}", dest, sha256=pin.sha256, size=pin.size, label=label)

        paths.append(fetch(store.root.parent, pin.sha256, into))  # what another member planted is gone
    return paths


# ------------------------------------------------------------------------------ .deb reading


def ar_members(data: IO[bytes], where: str) -> dict[str, bytes]:
    """The members of an ``ar`` archive (a ``.deb``), by name."""
    if data.read(8) != b"!<arch>\n":
        raise RootfsError(f"{where}: not a Debian package (no ar header)")
    members: dict[str, bytes] = {}
    while header := data.read(60):
        if len(header) < 60 or header[58:60] != b"`\n":
            raise RootfsError(f"{where}: a truncated or malformed ar member header")
        name = header[:16].decode("ascii", errors="replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise RootfsError(f"{where}: ar member {name!r} has no size") from None
        body = data.read(size)
        if len(body) != size:
            raise RootfsError(f"{where}: ar member {name!r} is truncated")
        if size % 2:
            data.read(1)
        members[name] = body
    return members


def _decompress(name: str, body: bytes, where: str) -> bytes:
    try:
        if name.endswith(".xz"):
            return lzma.decompress(body)
        if name.endswith(".gz"):
            return gzip.decompress(body)
        if name.endswith(".bz2"):
            return bz2.decompress(body)
        if name.endswith(".zst"):
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    except Exception as exc:
        raise RootfsError(f"{where}: {name}: cannot decompress: {exc}") from None
    if name.endswith(".tar"):
        return body
    raise RootfsError(f"{where}: {name}: unknown compression")


def _tar_member(members: dict[str, bytes], prefix: str, where: str) -> tarfile.TarFile:
    for name, body in members.items():
        if name.startswith(prefix + ".tar"):
            return tarfile.open(fileobj=io.BytesIO(_decompress(name, body, where)), mode="r:")
    raise RootfsError(f"{where}: no {prefix}.tar member")


def unpack_deb(deb: IO[bytes], out: Path, package: str, done: Unpacked, *, shown: str) -> None:
    """Unpack the ``.deb`` ``deb``'s ``data.tar`` into ``out`` (checked: module doc, step 2);
    ``shown`` names the file in errors (its name in the archive's pool)."""
    where = f"{shown} ({package})"
    members = ar_members(deb, where)
    with _tar_member(members, "control", where) as control:
        bodies = {}
        for member in control.getmembers():
            name = posixpath.basename(member.name)
            body = control.extractfile(member) if member.isfile() else None
            if body is not None and (name in MAINTAINER_SCRIPTS or name == "control"):
                bodies[name] = body.read()
        done.scripts[package] = sorted(n for n in MAINTAINER_SCRIPTS if n in bodies)
        done.bodies[package] = bodies
        done.depends[package], done.provides[package] = _control_relations(bodies.get("control", b""))
    with _tar_member(members, "data", where) as data:
        entries = sorted(data.getmembers(), key=lambda m: _inside(m.name, where))
        for member in entries:
            _unpack_member(data, member, out, package, where, done)


def _control_relations(control: bytes) -> tuple[set[str], set[str]]:
    """Every name a control file's ``Pre-Depends`` and ``Depends`` mention, and what it ``Provides``."""
    from harness.resolve.deb822 import parse_stanzas
    from harness.resolve.debian import parse_relations

    stanzas = parse_stanzas(control.decode("utf-8", errors="replace"))
    fields = stanzas[0] if stanzas else {}
    depends = {
        name
        for key in ("Pre-Depends", "Depends")
        for group in parse_relations(fields.get(key, ""))
        for name, _ in group
    }
    return depends, {group[0][0] for group in parse_relations(fields.get("Provides", ""))}


def _configure(lock: TemplateLock, out: Path, done: Unpacked) -> None:
    """Run the maintainer scripts of the lock's ``configure`` packages over ``out``:
    every ``preinst install``, then every ``postinst configure``, in dependency order."""
    from harness.realize.maintscripts import ScriptError, configure_order, run_script, tidy

    providers: dict[str, set[str]] = {}
    for package, virtuals in done.provides.items():
        for virtual in virtuals:
            providers.setdefault(virtual, set()).add(package)
    order = configure_order(
        {
            name: {real for dep in done.depends.get(name, set()) for real in providers.get(dep, set()) | {dep}}
            for name in lock.configure
        }
    )
    arch = lock.architecture or ""
    where = f"template {lock.label}"
    for script, args in (("preinst", ("install",)), ("postinst", ("configure", ""))):
        for package in order:
            body = done.bodies.get(package, {}).get(script)
            if body is None:
                continue
            try:
                run_script(out, package, script, body, args, arch, where)
            except ScriptError as exc:
                raise RootfsError(exc.message, hint=exc.hint) from None
            done.ran.append(" ".join((package, script, *args)).strip())
    done.skipped += [f"{what}, made by a maintainer script" for what in tidy(out)]
    _relink(out, done, where)


def _relink(out: Path, done: Unpacked, where: str) -> None:
    """After the scripts: absolute symlinks made relative, one climbing above the root refused."""
    for folder, dirs, files in os.walk(out):
        for name in dirs + files:
            path = Path(folder) / name
            if not path.is_symlink():
                continue
            rel = path.relative_to(out).as_posix()
            target = os.readlink(path)
            fixed = _relative_target(rel, target, where, "/" + rel)
            if fixed != target:
                path.unlink()
                os.symlink(fixed, path)
                done.relinked += 1


def _inside(name: str, where: str) -> str:
    """A member's path inside the root, relative, merged-usr; refuses absolute and ``..`` paths."""
    text = name[2:] if name.startswith("./") else name
    if text.startswith("/"):
        raise RootfsError(f"{where}: member {name!r} has an absolute path")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if ".." in parts or any("\0" in p for p in parts):
        raise RootfsError(f"{where}: member {name!r} escapes the root")
    if parts and parts[0] in MERGED:
        parts = ["usr", *parts]
    return "/".join(parts)


def _relative_target(link: str, target: str, where: str, name: str) -> str:
    """A symlink's target as a relative path that stays inside the root (module doc)."""
    if target.startswith("/"):
        parts = [p for p in target.split("/") if p not in ("", ".")]
        if parts and parts[0] in MERGED:
            parts = ["usr", *parts]
        if ".." in parts:
            raise RootfsError(f"{where}: symlink {name!r} -> {target!r} escapes the root")
        return posixpath.relpath("/" + "/".join(parts), "/" + posixpath.dirname(link))
    depth = 0
    for part in posixpath.join(posixpath.dirname(link), target).split("/"):
        depth += -1 if part == ".." else (0 if part in ("", ".") else 1)
        if depth < 0:
            raise RootfsError(f"{where}: symlink {name!r} -> {target!r} escapes the root")
    return target


def _check_parents(out: Path, rel: str, where: str, name: str) -> None:
    """Every folder above ``rel`` is a real folder of the tree (never a symlink)."""
    current = out
    for part in rel.split("/")[:-1]:
        current = current / part
        if current.is_symlink():
            raise RootfsError(f"{where}: member {name!r} would be written through the symlink {part!r}")
        if current.exists() and not current.is_dir():
            raise RootfsError(f"{where}: member {name!r}: {part!r} is a file, not a folder")
        current.mkdir(exist_ok=True)


def _unpack_member(
    data: tarfile.TarFile, member: tarfile.TarInfo, out: Path, package: str, where: str, done: Unpacked
) -> None:
    rel = _inside(member.name, where)
    if not rel:
        return  # the root itself
    _check_parents(out, rel, where, member.name)
    dest = out / rel
    if member.isdir():
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
            raise RootfsError(f"{where}: folder {member.name!r} is already another kind of file in the root")
        dest.mkdir(exist_ok=True)
        os.chmod(dest, 0o755)
        return
    if member.issym():
        target = _relative_target(rel, member.linkname, where, member.name)
        if target != member.linkname:
            done.relinked += 1
        _place(dest, rel, package, done, where, link=target)
        return
    if member.islnk():
        source = out / _inside(member.linkname, where)
        if source.is_symlink() or not source.is_file():
            raise RootfsError(f"{where}: hard link {member.name!r} -> {member.linkname!r} names no file of the package")
        _place(
            dest, rel, package, done, where, body=source.read_bytes(), executable=bool(source.stat().st_mode & 0o100)
        )
        return
    if not member.isfile():
        done.skipped.append(f"/{rel} ({package}: {'device' if member.ischr() or member.isblk() else 'special file'})")
        return
    handle = data.extractfile(member)
    body = handle.read() if handle is not None else b""
    _place(dest, rel, package, done, where, body=body, executable=bool(member.mode & 0o111))


def _place(
    dest: Path,
    rel: str,
    package: str,
    done: Unpacked,
    where: str,
    *,
    link: str | None = None,
    body: bytes = b"",
    executable: bool = False,
) -> None:
    """Write one file or symlink; a path another package gave different content is refused."""
    if os.path.lexists(dest):
        same = (
            dest.is_symlink() and os.readlink(dest) == link
            if link is not None
            else not dest.is_symlink() and dest.is_file() and dest.read_bytes() == body
        )
        if not same:
            other = done.owners.get(rel, "another member")
            raise RootfsError(f"{where}: /{rel} is already in the root from {other}, with other content")
        return
    if link is not None:
        os.symlink(link, dest)
    else:
        dest.write_bytes(body)
        os.chmod(dest, 0o755 if executable else 0o644)
    done.owners[rel] = package


# ------------------------------------------------------------------------------ the project's files


def _checked_source(lock: TemplateLock, project_root: Path, entry: LockedFile) -> bytes:
    """The bytes of one of the project's files, checked against the lock's sha256."""
    source = project_root / entry.source
    try:
        body = source.read_bytes()
    except OSError as exc:
        raise RootfsError(f"template {lock.label}: file {entry.source}: {exc.strerror}") from None
    actual = hashlib.sha256(body).hexdigest()
    if actual != entry.sha256:
        raise RootfsError(
            f"template {lock.label}: {entry.source} does not match the lock: "
            f"expected sha256 {entry.sha256}, got {actual}",
            hint=f"re-lock it: harness lock image:{lock.label}",
        )
    return body


def _add_files(lock: TemplateLock, project_root: Path, out: Path) -> None:
    for entry in lock.files:
        body = _checked_source(lock, project_root, entry)
        rel = entry.path.lstrip("/")
        first = rel.split("/")[0]
        if first in MERGED:
            rel = "usr/" + rel
        _check_parents(out, rel, f"template {lock.label}", entry.path)
        dest = out / rel
        if os.path.lexists(dest):
            if dest.is_dir() and not dest.is_symlink():
                raise RootfsError(f"template {lock.label}: file {entry.path} would replace a folder")
            dest.unlink()
        dest.write_bytes(body)
        os.chmod(dest, 0o755 if entry.executable else 0o644)


def _write_manifest(lock: TemplateLock, out: Path, done: Unpacked) -> None:
    manifest = {
        "label": lock.label,
        "format": FORMAT,
        "archive": lock.archive,
        "suite": lock.suite,
        "packages": [p.as_json() for p in lock.packages],
        "assumed": list(lock.assumed),
        "files": [f.path for f in lock.files],
        "users": list(lock.users),
        "maintainer_scripts": _scripts_manifest(lock, done),
        "not_made": sorted(done.skipped),
        "absolute_links_made_relative": done.relinked,
    }
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.chmod(path, 0o644)


def _scripts_manifest(lock: TemplateLock, done: Unpacked) -> dict[str, object]:
    """What the manifest says of maintainer scripts (unchanged for a template that runs none)."""
    carried = {k: v for k, v in sorted(done.scripts.items()) if v and k not in lock.configure}
    if not lock.configure:
        return {"run": False, "note": "the packages' files as shipped: no preinst/postinst ran", "carried": carried}
    return {
        "run": list(lock.configure),
        "ran": done.ran,
        "note": "preinst install, then postinst configure, of the template's `configure` packages, "
        "in a sandbox over this root; the other packages' scripts did not run",
        "carried": carried,
    }


@dataclass(frozen=True)
class Realized:
    """One template's outcome of ``harness realize``."""

    label: str
    store: str
    built: bool


def realize_templates(
    home: Path, project_root: Path, labels: list[str] | None, *, offline: bool = False, progress: Reporter = QUIET
) -> list[Realized]:
    """Realize the locked templates ``labels`` (None: every locked one) into ``home``'s store."""
    from harness.config import load_settings
    from harness.errors import InputError
    from harness.lock.images import LOCKS, read, stale_reason
    from harness.realize.debcache import downloaded

    if labels is None:
        folder = project_root / "locks" / LOCKS
        labels = sorted(p.name[: -len(".lock.toml")] for p in folder.glob("*.lock.toml")) if folder.is_dir() else []
    store = Store.in_home(home)
    settings = load_settings(home, project_root)
    out = []
    for label in labels:
        stale = stale_reason(project_root, label)
        if stale:
            raise InputError(f"template {label}: its lock is stale: {stale}", hint=f"run `harness lock image:{label}`")
        lock = read(project_root, label)
        if store.record(lock.store) is not None:
            out.append(Realized(label, lock.store, False))
            continue
        if offline:
            missing = [p.filename for p in lock.packages if not downloaded(home, p.sha256)]
            if missing:
                raise RootfsError(
                    f"template {label}: --offline, and {len(missing)} package(s) are not downloaded: "
                    + ", ".join(posixpath.basename(m) for m in missing)
                )
        realize_template(store, settings, lock, project_root, progress=progress)
        out.append(Realized(label, lock.store, True))
    return out
