"""Maintainer scripts of a rootfs template's packages, run in a sandbox over the new root.

A template lists the packages whose scripts run (``[debian] configure``; ``["*"]``: every
pinned package, resolved to their names at lock time): realize runs, after every package is
unpacked, each one's ``preinst install`` and then each one's ``postinst configure`` (with the
empty "previously configured version" of a fresh install), both in dependency order
(:func:`configure_order`: a package after what it ``Pre-Depends`` and ``Depends`` on among the
pinned ones, a virtual name standing for its providers, ties and cycles by name). Unlike dpkg,
``preinst`` runs after the files are unpacked (the shell it needs is one of them), triggers
are not run (``libc-bin``'s ``postinst`` runs ``ldconfig`` over every library anyway), and no
dpkg database is written: a script asking ``dpkg`` about installed packages gets no answer.

Each script runs with ``bwrap`` in fresh user, mount, PID, network, IPC and UTS namespaces, as
uid 0 of its own user namespace (files it makes belong to the user realizing), with the new
root bound writable at ``/`` — the template's own files and nothing of the host's: a script's
shell and tools must be pinned packages (``dash``, ``libc6``, ``coreutils``...) — merged-``/usr``
links, a fresh ``/proc``, ``/dev`` and ``/tmp``, no network, umask 022 and a fixed environment:
``PATH``, ``SOURCE_DATE_EPOCH``, ``LC_ALL=C``, ``TZ=UTC``, ``HOME=/root``,
``DEBIAN_FRONTEND=noninteractive`` and dpkg's ``DPKG_MAINTSCRIPT_NAME``,
``DPKG_MAINTSCRIPT_PACKAGE``, ``DPKG_MAINTSCRIPT_ARCH``, ``DPKG_MAINTSCRIPT_PACKAGE_REFCOUNT``,
``DPKG_ROOT``, ``DPKG_ADMINDIR``. ``chown`` and ``chgrp`` change nothing there (a store path
keeps no owners, and the namespace maps no id but 0). What the sandbox itself put into the root
(mount points, the merged-/usr links) is removed afterwards, and so are the files scripts write
that differ on every run and nothing reads back (:data:`UNREPRODUCIBLE`: ldconfig's
``aux-cache``, the alternatives log); a symlink a script made absolute is made relative, one
that climbs above the root is refused. Measured with a 30-package bookworm base
(``base-files``, ``base-passwd``, ``dash``, ``coreutils``, ``dpkg``, ``libc6``... 13 scripts):
every script succeeds and two empty homes get the same content hash.

Why a declared list, and none by default: a template that runs scripts needs user namespaces
to be realized, and a machine without them (the seed's: no Docker, no user namespaces) must
refuse it rather than skip the scripts — one store name, one content — so a template opts in;
and a script may compute with the time or with randomness (host keys, a machine id), which
only the template's author can rule out. The packages not listed keep their scripts unrun, and
the root's manifest lists them.

``configure_order`` is pure.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from harness.errors import HarnessError

SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the first time zip can hold
TIMEOUT = 600
_MERGED_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
_MOUNTS = ("proc", "dev", "tmp", "run", ".harness-maintscripts")
SCRIPTS_INSIDE = "/.harness-maintscripts"
#: Bound over by a script that changes nothing: a store path keeps no owners, and uid 0 is the
#: only id of the sandbox's user namespace (``chown root:mail`` would fail there).
OWNER_TOOLS = ("usr/bin/chown", "usr/bin/chgrp")
#: What scripts write that differs on every run and nothing reads back (caches of inode
#: numbers and times, logs with timestamps): removed after the scripts, named in the manifest,
#: as reproducible bootstrappers (mmdebstrap) do.
UNREPRODUCIBLE = (
    "var/cache/ldconfig/aux-cache",
    "var/log/alternatives.log",
    "var/log/dpkg.log",
    "var/log/bootstrap.log",
    "var/cache/debconf/config.dat-old",
    "var/cache/debconf/templates.dat-old",
    "var/lib/dpkg/status-old",
)


class ScriptError(HarnessError):
    """A maintainer script could not run, or failed."""


def configure_order(depends: dict[str, set[str]]) -> list[str]:
    """The packages of ``depends`` (name -> the names it depends on) so that each comes after
    what it depends on; names outside the map are ignored, ties and cycles go by name (pure)."""
    done: list[str] = []
    placed: set[str] = set()
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in placed or name in visiting:
            return  # placed, or a cycle: broken here
        visiting.add(name)
        for dep in sorted(depends.get(name, set())):
            if dep in depends:
                visit(dep)
        visiting.discard(name)
        placed.add(name)
        done.append(name)

    for name in sorted(depends):
        visit(name)
    return done


def script_env(package: str, script: str, architecture: str) -> dict[str, str]:
    """The whole environment a maintainer script sees (module doc)."""
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
        "LC_ALL": "C",
        "TZ": "UTC",
        "HOME": "/root",
        "DEBIAN_FRONTEND": "noninteractive",
        "DPKG_MAINTSCRIPT_NAME": script,
        "DPKG_MAINTSCRIPT_PACKAGE": package,
        "DPKG_MAINTSCRIPT_ARCH": architecture,
        "DPKG_MAINTSCRIPT_PACKAGE_REFCOUNT": "1",
        "DPKG_ROOT": "",
        "DPKG_ADMINDIR": "/var/lib/dpkg",
    }


def unavailable_reason() -> str | None:
    """Why scripts cannot run in a sandbox on this machine (None: they can)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap is not installed (Debian package bubblewrap)"
    try:
        probe = subprocess.run(
            [bwrap, "--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0", "--ro-bind", "/", "/", "true"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed: {exc}"
    if probe.returncode != 0:
        return f"bwrap cannot make a user namespace here: {probe.stderr.strip() or probe.returncode}"
    return None


def run_script(
    root: Path, package: str, script: str, body: bytes, args: tuple[str, ...], architecture: str, where: str
) -> None:
    """Run one maintainer script over ``root`` (module doc); :class:`ScriptError` naming the
    package, the script and its last output lines when it fails."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ScriptError(f"{where}: cannot run {package}'s {script}: bwrap is not installed")
    if not body.startswith(b"#!"):
        raise ScriptError(f"{where}: {package}'s {script} does not start with #! (dpkg runs it as a program)")
    shebang = body[2:].split(b"\n", 1)[0].decode(errors="replace").strip().split(None, 1)
    interpreter = shebang[0] if shebang else ""
    if not os.path.lexists(root / interpreter.lstrip("/")) and not _via_merged(root, interpreter):
        raise ScriptError(
            f"{where}: {package}'s {script} runs {interpreter}, which no pinned package provides",
            hint="add the package that provides it (dash for /bin/sh, with libc6) to the template's packages",
        )
    for folder in ("etc", "var"):
        (root / folder).mkdir(exist_ok=True)
    made = [name for name in (*_MOUNTS, *_MERGED_LINKS) if not os.path.lexists(root / name)]
    with tempfile.TemporaryDirectory(prefix="harness-maintscript-") as scratch:
        path = Path(scratch) / f"{package}.{script}"
        path.write_bytes(body)
        path.chmod(0o755)
        shim = Path(scratch) / "owners-not-kept"
        shim.write_text("#!/bin/sh\n# harness: owners are not part of a store path; nothing to change\nexit 0\n")
        shim.chmod(0o755)
        command = [bwrap, "--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0", "--die-with-parent"]
        command += ["--new-session", "--hostname", "harness", "--clearenv", "--bind", str(root), "/"]
        for name, target in _MERGED_LINKS.items():
            if name in made:
                command += ["--symlink", target, f"/{name}"]
        command += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]
        command += ["--ro-bind", scratch, SCRIPTS_INSIDE, "--chdir", "/"]
        for tool in OWNER_TOOLS:  # only over a file the root has: a bind makes no new file there
            if (root / tool).is_file() and not (root / tool).is_symlink():
                command += ["--ro-bind", str(shim), f"/{tool}"]
        for key, value in script_env(package, script, architecture).items():
            command += ["--setenv", key, value]
        # As the kernel reads a #! line (the script's folder may be mounted noexec).
        command += [*shebang, f"{SCRIPTS_INSIDE}/{path.name}", *args]
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                stdin=subprocess.DEVNULL,
                errors="replace",
                umask=0o022,
            )
        except subprocess.TimeoutExpired:
            raise ScriptError(f"{where}: {package}'s {script} ran longer than {TIMEOUT} s") from None
        finally:
            _remove_made(root, made)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        missing = result.returncode == 127  # the shell's "command not found"
        raise ScriptError(
            f"{where}: {package}'s {' '.join((script, *args)).strip()} failed (exit {result.returncode}):\n{tail}",
            hint="pin the package of the missing command: scripts take Debian's Essential packages "
            "(sed, grep, coreutils, dash...) for granted"
            if missing
            else None,
        )


def _via_merged(root: Path, interpreter: str) -> bool:
    parts = interpreter.lstrip("/").split("/")
    return bool(parts) and parts[0] in _MERGED_LINKS and (root / _MERGED_LINKS[parts[0]] / "/".join(parts[1:])).exists()


def _remove_made(root: Path, made: list[str]) -> None:
    """Remove the mount points and links the sandbox made in ``root`` (empty, or links)."""
    for name in made:
        path = root / name
        if path.is_symlink():
            path.unlink()
        elif path.is_dir():
            try:
                path.rmdir()
            except OSError:
                pass  # a script wrote into it through the root (not a mount): kept


def tidy(root: Path) -> list[str]:
    """After the scripts: every file and folder readable and writable by its owner, special
    files (FIFOs, sockets) and the :data:`UNREPRODUCIBLE` files removed and named."""
    removed = []
    for rel in UNREPRODUCIBLE:
        if (root / rel).is_file() and not (root / rel).is_symlink():
            (root / rel).unlink()
            removed.append(f"/{rel} (differs on every run: removed)")
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                continue
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                path.unlink()
                removed.append("/" + path.relative_to(root).as_posix() + " (special file)")
                continue
            path.chmod(stat.S_IMODE(mode) | (0o700 if stat.S_ISDIR(mode) else 0o600))
    return sorted(removed)
