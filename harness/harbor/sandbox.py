"""A native sandbox for one Harbor session: its own root, the host's /usr and the store read-only.

No Docker. Linux namespaces through two standard tools:

* **bubblewrap** (``bwrap``, Debian package ``bubblewrap``) starts the session: an
  unprivileged user namespace (the sandbox's root is the invoking user), mount, PID, IPC
  and UTS namespaces, and a network namespace of its own (loopback only) when the task
  asks for no network. The session folder is bound as ``/``; ``/usr`` and ``/etc`` (and
  ``/sys``) are bound read-only, ``/bin``, ``/lib*`` mirror the host's (symlinks into
  ``/usr`` on merged-usr systems), every store path of the closure is bound read-only at
  its own absolute path, ``/proc`` and a minimal ``/dev`` are fresh. Its first process is
  a ``cat`` reading a pipe this process holds: the session lives exactly as long as we
  hold it (and ``--die-with-parent`` covers a crash).
* **nsenter** and **setpriv** (util-linux) run each command inside that session: join its
  namespaces (the network one only when the session made its own: a task with network stays
  in the host's, which only the host's root may join) and root, switch to the task user,
  drop capabilities (every one, or all but :data:`ROOT_CAPS` for root where task users have
  ids; bounding, inheritable and ambient sets, and ``no_new_privs``) so nothing can remount
  the read-only binds, ``cd`` to the working folder, ``bash -c`` the command. Commands run in a new process group; a timeout or a
  cancellation kills the whole group. Background processes survive between commands, as
  in a container, until :meth:`Sandbox.stop` kills the namespace's init and with it every
  process of the session.

Phases (``guarded``: the verifier's folders, ``/tests`` and ``/logs/verifier``): in the agent
phase they are bound read-only over themselves, so no command can write them, whoever it
runs as. :meth:`Sandbox.begin_verifier_phase` restarts bubblewrap over the same root, so the
agent phase's PID namespace ends with every process in it (nothing survives by
double-forking), then makes them afresh, writable; :meth:`Sandbox.begin_agent_phase` guards
them again (a multi-step task). Memory without a cgroup: a
:class:`~harness.harbor.limits.MemoryWatchdog` over :meth:`Sandbox.command_pids` kills the
commands of a session over its limit.

Everything a sandboxed process can write is under the session folder (the root) or the
kernel's memory (``/dev/shm``); :meth:`Sandbox.stop` can delete the folder. File transfers
run *inside* the sandbox (``cat``, ``tar`` through pipes), so the kernel resolves every
path against the sandbox's root and its read-only binds: a symlink planted by an agent
cannot redirect a transfer to the host, and a path that climbs above ``/`` is refused
before anything runs.

Services: with no network the sandbox cannot reach the host's loopback. For each port in
``forward_ports`` (the broker's, and its services'), a listening socket is created *inside*
the sandbox's network namespace by a short helper (``nsenter -U -n``) and handed back over
a Unix socket (SCM_RIGHTS); this process accepts on it and relays to the same port on the
host's loopback. Only those ports are reachable; nothing else leaves the namespace.

Users (:mod:`harness.harbor.ids`): the sandbox's root is the invoking user. Where the
user namespace can hold more ids (Harbor runs as root, or the user has a subordinate id
range and ``newuidmap``), the namespace is made first (``unshare --user``, its maps written
by us or by ``newuidmap``) and bubblewrap is started inside it (``--userns``); each task
user then runs under its own uid and gid (``setpriv --reuid``), and ``/etc/passwd`` and
``/etc/group`` inside name them. The sandbox's root then keeps Docker's default capabilities
(:data:`ROOT_CAPS`: it owns every file of the session, as a container's root does, but can
never remount); task users have none. Harness's own setup (owners and modes of the session's
folders) runs as the sandbox's root. When the session stops, everything under its root is
given back to the sandbox's root (the invoking user), so it can be deleted or kept.

Limits (:mod:`harness.harbor.limits`): each command joins the session's cgroup before it
enters the sandbox, and runs under the per-process limits where no cgroup could be made.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from harness.errors import HarnessError
from harness.harbor.ids import IdMap, TaskUser, UserTable
from harness.harbor.ids import probe as probe_ids
from harness.harbor.limits import Enforcement, MemoryWatchdog

#: Mirrored from the host: a directory is bound read-only, a symlink recreated.
TOP_LEVEL_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Always bound read-only.
READ_ONLY = ("/usr", "/etc")
#: Made as real (writable) folders of every root.
BASE_DIRS = ("tmp", "root", "run", "var/tmp", "home")
#: Of the read-only binds, those whose files only some users may read are masked (/usr is not
#: walked: its files are the system's, readable by all, and there are too many of them).
MASKED_IN = ("/etc",)


def host_secrets(folders: Iterable[str], *, reachable_only: bool = False) -> list[str]:
    """The regular files under ``folders`` (those in :data:`MASKED_IN`) that a user with no
    particular rights could not read: not readable by others, or in a folder others cannot
    enter or list (``/etc/shadow``, ``/etc/ssh/ssh_host_*_key``, ``/etc/munge/munge.key``).

    The sandbox binds the host's ``/etc`` read-only, and its root is the host's root when
    harness runs as root: each of these files is masked with ``/dev/null`` (bubblewrap's
    ``--ro-bind``, PRoot's ``-b``), so an agent sees what any unprivileged user would, not
    the host's secrets. ``reachable_only``: only those in folders this user may enter by
    their modes alone, as the root of a user namespace maps it (bubblewrap can neither reach
    the others to mask them nor let the sandbox read them). Links are not followed. Walked
    once per process (0.1 s for /etc here)."""
    return list(_host_secrets(tuple(folders), reachable_only))


def _enterable(st: os.stat_result) -> bool:
    """Whether this user may enter a folder by its modes (no capability counted)."""
    if st.st_uid == os.geteuid():
        return bool(st.st_mode & 0o100)
    if st.st_gid == os.getegid() or st.st_gid in os.getgroups():
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


@functools.cache
def _host_secrets(folders: tuple[str, ...], reachable_only: bool) -> tuple[str, ...]:
    found: list[str] = []
    for top in folders:
        if not any(top == masked or top.startswith(masked + "/") for masked in MASKED_IN):
            continue
        closed: set[str] = set()  # folders others cannot list or enter, and what is under them
        for folder, dirs, files in os.walk(top):
            try:
                st = os.stat(folder)
            except OSError:
                continue
            if reachable_only and not _enterable(st):
                dirs.clear()
                continue
            hidden = os.path.dirname(folder) in closed or (st.st_mode & 0o005) != 0o005
            if hidden:
                closed.add(folder)
            for name in files:
                path = os.path.join(folder, name)
                try:
                    mode = os.lstat(path).st_mode
                except OSError:
                    continue
                if stat.S_ISREG(mode) and (hidden or not mode & 0o004):
                    found.append(path)
    return tuple(sorted(found))


#: What the sandbox's root may do where task users have ids of their own: Docker's default
#: capabilities (own any file, change owners and modes, switch users, signal), never
#: CAP_SYS_ADMIN (so nothing can remount the read-only binds) nor ptrace. Task users have none.
ROOT_CAPS = (
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "setfcap",
    "net_bind_service",
    "net_raw",
    "sys_chroot",
    "mknod",
    "audit_write",
)
#: Paths that belong to the kernel, never to transfers.
SPECIAL = ("/proc", "/dev", "/sys")

OutputCallback = Callable[[str, str], Awaitable[None]]


class SandboxError(HarnessError):
    """The sandbox could not be started, or refused an operation."""


class SandboxPathError(SandboxError, ValueError):
    """A path given for a transfer is not an absolute path inside the sandbox."""


# --------------------------------------------------------------------------- the host's tools


@dataclass(frozen=True)
class Tools:
    bwrap: str
    nsenter: str
    setpriv: str
    shell: str  # inside: the host's /usr is the sandbox's
    cat: str
    tar: str
    unshare: str
    prlimit: str | None = None
    taskset: str | None = None
    newuidmap: str | None = None
    newgidmap: str | None = None

    def versions(self) -> dict[str, str]:
        return dict(_versions(self.bwrap, self.nsenter))


@functools.cache
def _versions(bwrap: str, nsenter: str) -> tuple[tuple[str, str], ...]:
    """``--version`` of the tools, asked once per process."""
    out: dict[str, str] = {}
    for name, path in (("bwrap", bwrap), ("nsenter", nsenter)):
        try:
            text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5).stdout
            out[name] = text.strip().splitlines()[0] if text.strip() else "unknown"
        except (OSError, subprocess.SubprocessError):
            out[name] = "unknown"
    return tuple(out.items())


_PROBE: dict[str, Any] = {}
_PROBE_LOCK = threading.Lock()


def find_tools(*, namespaces: bool = True) -> Tools:
    """The tools a sandbox needs (``namespaces=False``: those of the Landlock + PRoot
    confinement, which needs no bubblewrap), or :class:`SandboxError` naming what is missing."""
    needed = ("bwrap", "nsenter", "setpriv", "cat", "tar", "unshare") if namespaces else ("cat", "tar")
    found = {
        name: shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin:" + os.environ.get("PATH", ""))
        for name in ("bwrap", "nsenter", "setpriv", "cat", "tar", "unshare")
    }
    missing = [name for name in needed if not found[name]]
    if missing:
        hint = "apt-get install bubblewrap" if "bwrap" in missing else "install util-linux"
        raise SandboxError(f"the native sandbox needs {', '.join(missing)} on PATH", hint=hint)
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    resolved = {k: str(v or "") for k, v in found.items()}
    for name in ("cat", "tar", "setpriv") if namespaces else ("cat", "tar"):
        if not resolved[name].startswith(("/usr/", "/bin/", "/sbin/")):
            raise SandboxError(f"{name} is at {resolved[name]}, outside /usr: the sandbox cannot run it")
    optional = {
        name: shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
        for name in ("prlimit", "taskset", "newuidmap", "newgidmap")
    }
    return Tools(
        bwrap=resolved["bwrap"],
        nsenter=resolved["nsenter"],
        setpriv=resolved["setpriv"],
        shell=shell,
        cat=resolved["cat"],
        tar=resolved["tar"],
        unshare=resolved["unshare"],
        **optional,
    )


def unavailable_reason() -> str | None:
    """Why sandboxes cannot start on this machine (None when they can); probed once."""
    with _PROBE_LOCK:
        if "reason" in _PROBE:
            return _PROBE["reason"]
        reason: str | None = None
        try:
            tools = find_tools()
            args = [
                tools.bwrap,
                "--unshare-user",
                "--uid",
                "0",
                "--gid",
                "0",
                "--unshare-pid",
                "--unshare-net",
                "--die-with-parent",
                "--ro-bind",
                "/usr",
                "/usr",
                *_top_level_args(),
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--",
                tools.cat,
                "/dev/null",
            ]
            result = subprocess.run(args, capture_output=True, text=True, timeout=30)
            if result.returncode != 0:
                reason = f"bwrap cannot create namespaces here: {result.stderr.strip() or result.returncode}"
        except SandboxError as exc:
            reason = str(exc)
        except (OSError, subprocess.SubprocessError) as exc:
            reason = f"bwrap failed: {exc}"
        _PROBE["reason"] = reason
        return reason


def _top_level_args() -> list[str]:
    args: list[str] = []
    for name in TOP_LEVEL_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    return args


# ------------------------------------------------------------------------------- paths


def inside_path(path: str | PurePosixPath) -> str:
    """``path`` normalized as an absolute path inside the sandbox; refuses ``..`` above ``/``
    and relative paths (:class:`SandboxPathError`)."""
    text = str(path)
    if not text.startswith("/"):
        raise SandboxPathError(f"{text!r} is not an absolute path inside the sandbox")
    parts: list[str] = []
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise SandboxPathError(f"{text!r} escapes the sandbox root")
            parts.pop()
            continue
        if "\0" in part:
            raise SandboxPathError(f"{text!r} contains a NUL byte")
        parts.append(part)
    return "/" + "/".join(parts)


# ----------------------------------------------------------------------------- sandbox


@dataclass
class SandboxConfig:
    """Everything a session's sandbox is made of."""

    root: Path  # the session folder, bound as /
    store_paths: list[Path] = field(default_factory=list)  # bound read-only at their own paths
    read_only: list[str] = field(default_factory=lambda: list(READ_ONLY))
    # Host folders bound read-only elsewhere inside (host path -> inside): a rootfs template's
    # root merges its /usr with the host's, which then lives at /.host/usr (harbor/rootfs.py).
    host_binds: dict[str, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)  # e.g. /dev/nvidia0, bound read-write
    dirs: list[str] = field(default_factory=list)  # made as real folders (logs, tests, workdir)
    network: bool = True  # False: a network namespace of its own (loopback only)
    forward_ports: list[int] = field(default_factory=list)  # host loopback ports reachable inside
    hostname: str = "harness"
    users: list[str | int] = field(default_factory=list)  # task users (names or uids) besides root
    fixed_ids: dict[str, int] = field(default_factory=dict)  # user -> the uid its root's /etc/passwd gives it
    etc_base: dict[str, str] = field(default_factory=dict)  # "passwd"/"group": the root's own (a template's)
    owners: dict[str, str | int] = field(default_factory=dict)  # folder of `dirs` -> the task user owning it
    idmap: IdMap | None = None  # None: what this process can have (ids.probe())
    limits: Enforcement | None = None  # joined by every command (limits.enforce())
    # Folders of `dirs` no command of the agent phase may write (the verifier's: /tests,
    # /logs/verifier); begin_verifier_phase() lifts that, after every process is gone.
    guarded: list[str] = field(default_factory=list)


@dataclass
class ExecOutcome:
    return_code: int
    stdout: str | None
    stderr: str | None


class StreamedOutput:
    """The stdout and stderr of one command, collected while they stream.

    Every sandbox's ``exec`` reads the command's pipes the same way whatever wraps it
    (bubblewrap or PRoot), so one reader serves them all: ``pump`` keeps every piece and
    hands its text to ``on_output`` as it arrives, ``outcome`` joins the pieces."""

    def __init__(self, on_output: OutputCallback | None) -> None:
        self.on_output = on_output
        self.chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}

    async def pump(self, stream: asyncio.StreamReader | None, name: str) -> None:
        """Read ``stream`` to its end in pieces of up to 64 KiB, keeping each under ``name``
        (``"stdout"`` or ``"stderr"``) and passing it, decoded with undecodable bytes
        replaced, to ``on_output`` before the next read; a None stream reads nothing."""
        while stream is not None and (data := await stream.read(65536)):
            self.chunks[name].append(data)
            if self.on_output is not None:
                await self.on_output(data.decode(errors="replace"), name)

    def outcome(self, return_code: int) -> ExecOutcome:
        """``return_code`` with everything pumped so far, decoded; an empty stream is None."""
        out = b"".join(self.chunks["stdout"]).decode(errors="replace")
        err = b"".join(self.chunks["stderr"]).decode(errors="replace")
        return ExecOutcome(return_code, out or None, err or None)


class Sandbox:
    """One running session; see the module doc. Async: call from one event loop."""

    namespaces = True  # False: harness.harbor.confine's Landlock + PRoot session

    def __init__(self, config: SandboxConfig, *, log: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.tools = find_tools(namespaces=self.namespaces)
        self._log = log or (lambda _line: None)
        self._outer: asyncio.subprocess.Process | None = None
        self._init_pid: int | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._relays: set[asyncio.Task[None]] = set()
        self._running: set[int] = set()  # process groups of commands in flight
        self._userns: int | None = None  # fd of the session's user namespace (mapped ids only)
        self.forwarded: list[int] = []
        self.phase = "agent" if config.guarded else "verifier"
        self._infra: set[int] = set()  # the session's own processes (bubblewrap, its init)
        self._restarting = False  # start() again over a root the session's commands wrote
        watch = config.limits.watch_bytes if config.limits is not None else None
        self.watchdog = MemoryWatchdog(watch, self.command_pids, self.kill_commands) if watch else None
        self.idmap = config.idmap or probe_ids()
        try:
            self.users = UserTable.plan(config.users, self.idmap, config.fixed_ids)
        except ValueError as exc:
            raise SandboxError(f"task users: {exc}") from None

    @property
    def started(self) -> bool:
        return self._init_pid is not None

    # ---------------------------------------------------------------- lifecycle

    def bwrap_args(self, info_fd: int, userns_fd: int | None = None) -> list[str]:
        c = self.config
        user = ["--userns", str(userns_fd)] if userns_fd is not None else ["--unshare-user"]
        args = [
            self.tools.bwrap,
            *user,
            "--uid",
            "0",
            "--gid",
            "0",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            c.hostname,
            "--unshare-cgroup-try",
        ]
        if not c.network:
            args.append("--unshare-net")
        args += ["--die-with-parent", "--cap-drop", "ALL", "--bind", str(c.root), "/"]
        for path in c.read_only:
            args += ["--ro-bind", path, path]
        for secret in host_secrets(c.read_only, reachable_only=True):
            args += ["--ro-bind", str(self._empty_file()), secret]  # /dev/null: a device, refused there
        for host, inside in sorted(c.host_binds.items()):
            args += ["--ro-bind", host, inside]
        for path in self.guarded_now:  # the verifier's folders, read-only to the agent phase
            args += ["--ro-bind", str(_real_folder(c.root, path)), inside_path(path)]
        if self.idmap.multi:  # task users get names inside
            args += [
                "--ro-bind",
                str(self.etc_dir / "passwd"),
                "/etc/passwd",
                "--ro-bind",
                str(self.etc_dir / "group"),
                "/etc/group",
            ]
        args += ["--ro-bind-try", "/sys", "/sys", *_top_level_args(), "--proc", "/proc", "--dev", "/dev"]
        for device in c.devices:
            args += ["--dev-bind", device, device]
        # The folders above the store paths, made readable by every user of the session (bwrap
        # would otherwise make them 0700, leaving the environment to the sandbox's root alone).
        made: set[str] = set()
        for store_path in c.store_paths:
            for parent in reversed(PurePosixPath(store_path).parents[:-1]):
                text = str(parent)
                if text not in made and not (c.root / text.lstrip("/")).exists():
                    args += ["--perms", "0755", "--dir", text]
                made.add(text)
        for store_path in c.store_paths:
            args += ["--ro-bind", str(store_path), str(store_path)]
        # The init: says it is ready (the root is built), then lives while we hold its stdin.
        args += [
            "--chdir",
            "/",
            "--info-fd",
            str(info_fd),
            "--",
            self.tools.shell,
            "-c",
            f"echo ready && exec {self.tools.cat}",
        ]
        return args

    @property
    def guarded_now(self) -> list[str]:
        """The folders commands may not write now: the guarded ones in the agent phase."""
        return list(self.config.guarded) if self.phase == "agent" else []

    def _empty_file(self) -> Path:
        """An empty read-only file beside the root, bound over the host's secrets in ``/etc``
        (bubblewrap's binds are ``nodev``: ``/dev/null`` there could not be opened)."""
        empty = self.etc_dir / "masked"
        if not empty.is_file():
            self.etc_dir.mkdir(parents=True, exist_ok=True)
            empty.write_bytes(b"")
            empty.chmod(0o444)
        return empty

    @property
    def etc_dir(self) -> Path:
        """``/etc/passwd`` and ``/etc/group`` of the session, beside (not inside) its root."""
        return self.config.root.parent / f"{self.config.root.name}.etc"

    async def _make_userns(self) -> tuple[asyncio.subprocess.Process, int]:
        """A user namespace with the id map (``ids``), held by a ``cat``; (holder, fd of the ns)."""
        holder = await asyncio.create_subprocess_exec(
            self.tools.unshare,
            "--user",
            "--",
            self.tools.shell,
            "-c",
            f"echo ok && exec {self.tools.cat}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=_host_env(),
        )
        try:
            assert holder.stdout is not None
            line = await asyncio.wait_for(holder.stdout.readline(), timeout=30)
            if line.strip() != b"ok":
                raise SandboxError("unshare --user could not create a user namespace")
            m = self.idmap
            if m.mode == "root":
                for name, text in (("uid_map", m.uid_lines()), ("gid_map", m.gid_lines())):
                    with open(f"/proc/{holder.pid}/{name}", "w", encoding="ascii") as handle:
                        handle.write(text)
            else:
                for tool, own, base in (
                    (self.tools.newuidmap, m.uid, m.uid_base),
                    (self.tools.newgidmap, m.gid, m.gid_base),
                ):
                    result = await asyncio.to_thread(
                        subprocess.run,
                        [str(tool), str(holder.pid), "0", str(own), "1", "1", str(base), str(m.count)],
                        capture_output=True,
                        text=True,
                        timeout=30,
                    )
                    if result.returncode != 0:
                        raise SandboxError(
                            f"{tool} failed: {result.stderr.strip() or result.returncode}",
                            hint="check /etc/subuid and /etc/subgid",
                        )
            return holder, os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY)
        except BaseException:
            _killpg(holder.pid)
            await holder.wait()
            raise

    async def start(self) -> None:
        """Make the root's folders and start the session; :class:`SandboxError` if it cannot."""
        if self.started:
            return
        root = self.config.root
        if not self._restarting:  # a restart's root is the agent's: nothing here follows its links
            for folder in (*BASE_DIRS, *(d.lstrip("/") for d in self.config.dirs)):
                (root / inside_path("/" + folder).lstrip("/")).mkdir(parents=True, exist_ok=True)
            os.chmod(root / "tmp", 0o1777)
        if self.idmap.multi:
            self._write_etc()
        holder: asyncio.subprocess.Process | None = None
        userns_fd: int | None = None
        if self.idmap.multi:
            holder, userns_fd = await self._make_userns()
        read_end, write_end = os.pipe()
        try:
            self._outer = await asyncio.create_subprocess_exec(
                *self.bwrap_args(write_end, userns_fd),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(write_end,) if userns_fd is None else (write_end, userns_fd),
                start_new_session=True,
                env=_host_env(),
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
            if userns_fd is not None:
                os.close(userns_fd)
        try:
            info = await asyncio.wait_for(asyncio.to_thread(_read_info, read_end), timeout=60)
            # bwrap reports the pid before it has built the root: wait for the init to say so.
            assert self._outer.stdout is not None
            ready = await asyncio.wait_for(self._outer.stdout.readline(), timeout=60) if info else b""
        except TimeoutError:
            info, ready = None, b""
        finally:
            os.close(read_end)
            if holder is not None:  # bwrap holds the namespace now
                _killpg(holder.pid)
                await holder.wait()
        if not info or "child-pid" not in info or ready.strip() != b"ready":
            stderr = b""
            if self._outer.stderr is not None:
                try:
                    stderr = await asyncio.wait_for(self._outer.stderr.read(), timeout=5)
                except TimeoutError:
                    pass
            await self._kill_outer()
            raise SandboxError(f"bwrap could not start the sandbox: {stderr.decode(errors='replace').strip()}")
        self._init_pid = int(info["child-pid"])
        self._infra = descendants({self._outer.pid, self._init_pid})
        if self.watchdog is not None:
            self.watchdog.start()
        if self.idmap.multi:
            self._userns = os.open(f"/proc/{self._init_pid}/ns/user", os.O_RDONLY)
            await self._setup()
        if not self.config.network and self.config.forward_ports:
            await self._forward(self.config.forward_ports)

    def _write_etc(self) -> None:
        # Written in place: the bind mounts inside see the new contents.
        self.etc_dir.mkdir(parents=True, exist_ok=True)
        base = self.config.etc_base
        (self.etc_dir / "passwd").write_text(self.users.passwd(base.get("passwd", "")), encoding="utf-8")
        (self.etc_dir / "group").write_text(self.users.group(base.get("group", "")), encoding="utf-8")

    async def ensure_user(self, user: str | int) -> TaskUser | None:
        """The task user ``user`` (a name or uid), added to the session (ids, ``/etc/passwd``,
        home) if it is new; None where the namespace holds one id (commands run as root)."""
        if not self.idmap.multi or user in (None, "root", 0, "0"):
            return None
        known = self.users.get(user)
        if known is not None:
            return known
        names: list[str | int] = [u.name for u in self.users.users.values() if u.uid != 0]
        try:
            self.users = UserTable.plan([*names, user], self.idmap, self.config.fixed_ids)
        except ValueError as exc:
            raise SandboxError(f"task user {user!r}: {exc}") from None
        self._write_etc()
        added = self.users.get(user)
        await self._setup(only=added)
        return added

    async def give(self, path: str, user: str | int) -> TaskUser | None:
        """``path`` (inside) and everything below it to task user ``user`` (added if new), as
        ``COPY --chown`` does; None where the namespace holds one id (nothing changes)."""
        owner = await self.ensure_user(user)
        if owner is None:
            return None
        inside = self._check_transfer(path, write=True)
        script = 'exec chown -R -- "$1" "$2"'
        rc, err = await self._run_io(
            [self.tools.shell, "-c", script, "give", f"{owner.uid}:{owner.gid}", inside], privileged=True
        )
        if rc != 0:
            raise SandboxError(f"giving {inside} to {user} failed: {err}")
        return owner

    async def _setup(self, only: TaskUser | None = None) -> None:
        """As the sandbox's root: task users' homes, and the folders ``owners`` gives them."""
        lines = ["set -e"]
        for user in self.users.users.values():
            if user.uid != 0 and (only is None or user is only):
                lines.append(
                    f"mkdir -p {shlex.quote(user.home)} && chown {user.uid}:{user.gid} "
                    f"{shlex.quote(user.home)} && chmod 0750 {shlex.quote(user.home)}"
                )
        for folder, name in self.config.owners.items() if only is None else ():
            owner = self.users.get(name)
            if inside_path(folder) in map(inside_path, self.guarded_now):
                continue  # read-only until the verifier phase, which gives it its owner
            if owner is not None:
                lines.append(f"chown {owner.uid}:{owner.gid} {shlex.quote(inside_path(folder))}")
        if len(lines) == 1:
            return
        rc, err = await self._run_io([self.tools.shell, "-c", "\n".join(lines)], privileged=True)
        if rc != 0:
            raise SandboxError(f"setting up the session's users failed: {err}")

    async def _give_back(self) -> None:
        """Everything under the root back to the sandbox's root (the invoking user)."""
        fd, self._userns = self._userns, None
        if fd is None:
            return
        try:
            process = await asyncio.create_subprocess_exec(
                self.tools.nsenter,
                f"--user=/proc/self/fd/{fd}",
                "--",
                "chown",
                "-hR",
                "0:0",
                "--",
                str(self.config.root),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(fd,),
                env=_host_env(),
            )
            _, err = await process.communicate()
            if process.returncode != 0:
                self._log(f"harness: giving the session's files back failed: {err.decode(errors='replace')}")
        finally:
            os.close(fd)

    async def _halt(self) -> None:
        """Kill every process of the session: its PID namespace dies with its init."""
        for server in self._servers:
            server.close()
        for task in list(self._relays):
            task.cancel()
        self._servers.clear()
        self.forwarded.clear()
        for pgid in list(self._running):
            _killpg(pgid)
        if self._init_pid is not None:
            try:
                os.kill(self._init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await self._kill_outer()
        self._init_pid = None

    def session_pids(self) -> set[int]:
        """Every live process of the session: the descendants of bubblewrap (the PID
        namespace's init adopts every orphan inside it) and of the commands' wrappers."""
        roots = set(self._running)
        if self._outer is not None:
            roots.add(self._outer.pid)
        if self._init_pid is not None:
            roots.add(self._init_pid)
        return descendants(roots)

    def command_pids(self) -> set[int]:
        """The processes of the session's commands (every one but bubblewrap's own)."""
        return self.session_pids() - self._infra

    async def kill_commands(self) -> None:
        """SIGKILL every process of the session's commands; the session itself stays."""
        for _ in range(200):
            victims = self.command_pids()
            for pgid in list(self._running):
                _killpg(pgid)
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if not victims:
                return
            await asyncio.sleep(0.02)

    async def begin_verifier_phase(self) -> dict[str, Any]:
        """End the agent phase: kill every process of the session (bubblewrap restarts it
        over the same root, so the PID namespace of the agent phase dies with every process
        in it, double-forked or not), then make ``/tests`` and ``/logs/verifier`` afresh
        (empty, owned as planned), writable from now on. What held, for the record."""
        before = self.session_pids()
        await self._halt()
        survivors = await asyncio.to_thread(wait_gone, sorted(before - {os.getpid()}), 5.0)
        self._before_restart()
        guarded, self.phase = list(self.config.guarded), "verifier"
        await self._restart()
        await self._fresh_guarded(guarded)
        return {
            "agent_processes_killed": not survivors,
            "survivors": len(survivors),
            "how": "the agent phase's PID namespace ended (bubblewrap restarted over the same root)",
            "fresh": guarded,
        }

    async def _restart(self) -> None:
        self._restarting = True
        try:
            await self.start()
        finally:
            self._restarting = False

    def _before_restart(self) -> None:
        """Ready the root for bubblewrap again: the links it made at the top (``/bin`` …), or
        what replaced them, removed (it makes them afresh), the user namespace's fd closed;
        and what an agent put in place of the folders above the store paths or of a store
        path's mount point (a link, a file), removed, so that bubblewrap makes them again
        instead of failing to start the verifier's session over them."""
        if self._userns is not None:
            os.close(self._userns)
            self._userns = None
        for name in TOP_LEVEL_LINKS:
            made = self.config.root / name
            if (Path("/") / name).is_symlink() and (made.is_symlink() or made.exists()):
                if made.is_symlink() or not made.is_dir():
                    made.unlink()
                else:
                    remove_root(made)
        for store_path in self.config.store_paths:
            for inside in [*reversed(PurePosixPath(store_path).parents[:-1]), PurePosixPath(store_path)]:
                made = self.config.root / str(inside).lstrip("/")
                if not made.is_symlink() and (not made.exists() or made.is_dir() == Path(store_path).is_dir()):
                    continue
                if made.is_symlink() or not made.is_dir():
                    made.unlink()
                else:
                    remove_root(made)

    async def begin_agent_phase(self) -> None:
        """Guard the verifier's folders again (a multi-step task's next agent phase): made
        afresh, then the session restarted with them read-only."""
        if self.phase == "agent" or not self.config.guarded:
            return
        await self._fresh_guarded(list(self.config.guarded))
        await self._halt()
        self._before_restart()
        self.phase = "agent"
        await self._restart()

    async def _fresh_guarded(self, folders: list[str]) -> None:
        """``folders`` (and a parent an agent replaced by a link or a file) made again, empty,
        mode 0755, owned by the task user ``owners`` names, as the sandbox's root."""
        lines = ["set -e"]
        for folder in map(inside_path, folders):
            parent = str(PurePosixPath(folder).parent)
            if parent != "/":
                q = shlex.quote(parent)
                lines.append(f"if [ -L {q} ] || [ ! -d {q} ]; then rm -rf -- {q}; mkdir -p -- {q}; fi")
            q = shlex.quote(folder)
            lines.append(f"rm -rf -- {q}; mkdir -m 0755 -- {q}")
            owner = next((self.users.get(n) for f, n in self.config.owners.items() if inside_path(f) == folder), None)
            if owner is not None and self.idmap.multi:
                lines.append(f"chown {owner.uid}:{owner.gid} -- {q}")
        rc, err = await self._run_io([self.tools.shell, "-c", "\n".join(lines)], privileged=True)
        if rc != 0:
            raise SandboxError(f"making {', '.join(folders)} afresh failed: {err}")

    async def stop(self, *, delete: bool) -> None:
        """Kill every process of the session; delete the root when ``delete``."""
        if self.watchdog is not None:
            await self.watchdog.cancel()
        await self._halt()
        await self._give_back()
        if self.config.limits is not None:
            await asyncio.to_thread(self.config.limits.release)
        if delete:
            await asyncio.to_thread(remove_root, self.config.root)
        shutil.rmtree(self.etc_dir, ignore_errors=True)

    async def _kill_outer(self) -> None:
        outer, self._outer = self._outer, None
        if outer is None:
            return
        if outer.stdin is not None:
            outer.stdin.close()
        if outer.returncode is None:
            try:
                await asyncio.wait_for(outer.wait(), timeout=5)
            except TimeoutError:
                _killpg(outer.pid)
                await outer.wait()

    # ------------------------------------------------------------------------ exec

    def _enter(self, *, user: TaskUser | None = None, privileged: bool = False, limited: bool = False) -> list[str]:
        """argv that runs what follows inside the session: joined namespaces (the network one
        only when the session made its own: the host's belongs to the host's root), as
        ``user`` (else the sandbox's root), with no capabilities unless ``privileged``."""
        if self._init_pid is None:
            raise SandboxError("the sandbox is not running")
        outer: list[str] = []
        inner: list[str] = []
        if limited and self.config.limits is not None:
            outer, inner = self.config.limits.wrap(self.tools.shell, self.tools.prlimit, self.tools.taskset)
        spaces = [
            "-U",
            "--preserve-credentials",
            "-m",
            "-u",
            "-i",
            *([] if self.config.network else ["-n"]),
            "-p",
            "-r",
            "-w",
        ]
        argv = [*outer, self.tools.nsenter, "-t", str(self._init_pid), *spaces, "--", *inner]
        if privileged:
            return argv
        switch = (
            ["--reuid", str(user.uid), "--regid", str(user.gid), "--clear-groups"]
            if user is not None and self.idmap.multi
            else []
        )
        # Root keeps Docker's default set where other users exist to own files (module doc);
        # a task user loses every capability with its uid.
        bounding = "-all" + ("".join(f",+{c}" for c in ROOT_CAPS) if self.idmap.multi and not switch else "")
        return [
            *argv,
            self.tools.setpriv,
            *switch,
            "--bounding-set",
            bounding,
            "--inh-caps",
            "-all",
            "--ambient-caps",
            "-all",
            "--no-new-privs",
            "--",
        ]

    def command_args(self, command: str, cwd: str, user: TaskUser | None = None) -> list[str]:
        shell = self.tools.shell
        return [
            *self._enter(user=user, limited=True),
            shell,
            "-c",
            'cd -- "$1" && exec "$2" -c "$3"',
            "harness-exec",
            inside_path(cwd),
            shell,
            command,
        ]

    async def exec(
        self,
        command: str,
        *,
        cwd: str,
        env: dict[str, str],
        timeout: float | None = None,
        on_output: OutputCallback | None = None,
        user: str | int | None = None,
    ) -> ExecOutcome:
        """Run ``command`` with ``bash -c`` in ``cwd`` as ``user`` (a task user's name or uid;
        None or root: the sandbox's root); on timeout kill its process group and raise
        ``RuntimeError("Command timed out after N seconds")`` (Harbor's Docker backend's words)."""
        process = await asyncio.create_subprocess_exec(
            *self.command_args(command, cwd, self.users.get(user)),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self._running.add(process.pid)
        output = StreamedOutput(on_output)

        async def run() -> None:
            await asyncio.gather(output.pump(process.stdout, "stdout"), output.pump(process.stderr, "stderr"))
            await process.wait()

        try:
            if timeout:
                await asyncio.wait_for(run(), timeout=timeout)
            else:
                await run()
        except TimeoutError:
            await self._kill(process)
            raise RuntimeError(f"Command timed out after {timeout} seconds") from None
        except BaseException:
            await self._kill(process)
            raise
        finally:
            self._running.discard(process.pid)
        return output.outcome(process.returncode or 0)

    async def _kill(self, process: asyncio.subprocess.Process) -> None:
        """SIGKILL ``process``'s session (its process group: it starts a new session) and wait
        up to 10 s for it; one already gone, or no longer ours to signal, is not an error."""
        _killpg(process.pid)
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            pass

    async def _run_io(
        self,
        argv: list[str],
        *,
        stdin: int | IO[bytes] | None = None,
        stdout: int | IO[bytes] | None = None,
        timeout: float = 600,
        privileged: bool = False,
    ) -> tuple[int, str]:
        """Run ``argv`` inside as the sandbox's root (no shell wrapper) with raw stdin/stdout;
        returns (rc, stderr)."""
        process = await asyncio.create_subprocess_exec(
            *self._enter(privileged=privileged),
            *argv,
            stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=stdout if stdout is not None else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=_transfer_env(),
            start_new_session=True,
        )
        self._running.add(process.pid)
        try:
            _, err = await asyncio.wait_for(process.communicate(), timeout=timeout)
        except BaseException:
            await self._kill(process)
            raise
        finally:
            self._running.discard(process.pid)
        return process.returncode or 0, err.decode(errors="replace").strip()

    # -------------------------------------------------------------------- transfers

    def _check_transfer(self, path: str, *, write: bool) -> str:
        inside = inside_path(path)
        for special in SPECIAL:
            if inside == special or inside.startswith(special + "/"):
                raise SandboxPathError(f"{inside} belongs to the kernel, not to file transfers")
        if write:
            for ro in [*self.config.read_only, *map(str, self.config.store_paths)]:
                if inside == ro or inside.startswith(ro.rstrip("/") + "/"):
                    raise SandboxPathError(f"{inside} is read-only in the sandbox (bound from {ro})")
        return inside

    async def upload_file(self, source: Path, target: str) -> None:
        inside = self._check_transfer(target, write=True)
        with open(source, "rb") as handle:
            rc, err = await self._run_io(
                [self.tools.shell, "-c", 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"', "upload", inside],
                stdin=handle,
            )
        if rc != 0:
            raise RuntimeError(f"upload to {inside} failed: {err}")

    async def upload_dir(self, source: Path, target: str) -> None:
        inside = self._check_transfer(target, write=True)
        if not source.is_dir():
            raise FileNotFoundError(f"Source directory not found: {source}")
        read_end, write_end = os.pipe()
        writer = threading.Thread(target=_tar_into, args=(source, write_end), daemon=True)
        writer.start()
        try:
            rc, err = await self._run_io(
                [
                    self.tools.shell,
                    "-c",
                    'mkdir -p -- "$1" && exec "$2" -x -f - -C "$1" --no-same-owner',
                    "upload",
                    inside,
                    self.tools.tar,
                ],
                stdin=read_end,
            )
        finally:
            os.close(read_end)
            await asyncio.to_thread(writer.join)
        if rc != 0:
            raise RuntimeError(f"upload of {source} to {inside} failed: {err}")

    async def download_file(self, source: str, target: Path) -> None:
        inside = self._check_transfer(source, write=False)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.part")
        with open(partial, "wb") as handle:
            rc, err = await self._run_io([self.tools.cat, "--", inside], stdout=handle)
        if rc != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"download of {inside} failed: {err}")
        os.replace(partial, target)

    async def download_dir(self, source: str, target: Path) -> None:
        inside = self._check_transfer(source, write=False)
        target.mkdir(parents=True, exist_ok=True)
        read_end, write_end = os.pipe()
        problems: list[str] = []
        reader = threading.Thread(target=_untar_from, args=(read_end, target, problems), daemon=True)
        reader.start()
        try:
            rc, err = await self._run_io([self.tools.tar, "-c", "-f", "-", "-C", inside, "."], stdout=write_end)
        finally:
            os.close(write_end)
            await asyncio.to_thread(reader.join)
        if rc != 0:
            raise RuntimeError(f"download of {inside} failed: {err}")
        if problems:
            self._log("harness: skipped in download of " + inside + ": " + "; ".join(problems[:5]))

    # ------------------------------------------------------------------ forwarding

    async def _forward(self, ports: list[int]) -> None:
        """Listen on ``ports`` on the sandbox's loopback and relay to the host's (module doc)."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [
            self.tools.nsenter,
            "-t",
            str(self._init_pid),
            "-U",
            "-n",
            "--",
            sys.executable,
            "-I",
            "-S",
            "-c",
            _FORWARD_HELPER,
            str(child.fileno()),
            *map(str, ports),
        ]
        try:
            result = await asyncio.to_thread(
                subprocess.run, argv, pass_fds=(child.fileno(),), capture_output=True, timeout=30, env=_host_env()
            )
            child.close()
            if result.returncode != 0:
                raise SandboxError(
                    "could not open the forwarded ports inside the sandbox: "
                    + result.stderr.decode(errors="replace").strip()
                )
            parent.settimeout(10)
            _, fds, _, _ = socket.recv_fds(parent, 1024, len(ports))
        finally:
            child.close()
            parent.close()
        for port, fd in zip(ports, fds, strict=True):
            listener = socket.socket(fileno=fd)
            listener.setblocking(False)

            async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int = port) -> None:
                task = asyncio.current_task()
                if task is not None:
                    self._relays.add(task)
                try:
                    await _relay(reader, writer, port)
                finally:
                    if task is not None:
                        self._relays.discard(task)

            self._servers.append(await asyncio.start_server(relay, sock=listener))
            self.forwarded.append(port)


_FORWARD_HELPER = r"""
import socket, sys
channel = socket.socket(fileno=int(sys.argv[1]))
listeners = []
for port in sys.argv[2:]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(port)))
    s.listen(64)
    listeners.append(s)
socket.send_fds(channel, [b"ok"], [s.fileno() for s in listeners])
"""


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        writer.close()
        return

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            try:
                if dst.can_write_eof():
                    dst.write_eof()
            except (OSError, RuntimeError):
                pass

    try:
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
    finally:
        for w in (writer, up_writer):
            w.close()


# ----------------------------------------------------------------------------- helpers


def _read_info(fd: int) -> dict[str, Any] | None:
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        try:
            return json.loads(data)
        except ValueError:
            continue
    return None


def _tar_into(source: Path, fd: int) -> None:
    try:
        with os.fdopen(fd, "wb") as handle, tarfile.open(fileobj=handle, mode="w|") as archive:
            for entry in sorted(source.iterdir()):
                archive.add(entry, arcname=entry.name)
    except (BrokenPipeError, OSError):
        pass


def _untar_from(fd: int, target: Path, problems: list[str]) -> None:
    """Extract a tar stream into ``target``, skipping what could land outside it (absolute or
    climbing names, links pointing out, devices): each skip is noted in ``problems``."""

    def safe(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        if member.isdev() or member.isfifo():
            return None
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
            try:
                return tarfile.data_filter(member, dest)
            except tarfile.FilterError as exc:
                problems.append(f"{member.name}: {exc}")
                return None
        name = PurePosixPath(member.name)
        link = PurePosixPath(member.linkname) if (member.issym() or member.islnk()) else None
        climbs = name.is_absolute() or ".." in name.parts
        if link is not None:
            resolved = (name.parent / link) if member.issym() else link
            climbs = climbs or link.is_absolute() or _climbs(resolved)
        if climbs:
            problems.append(f"{member.name}: would land outside the download")
            return None
        member.mode &= 0o777 & ~0o6000
        return member

    try:
        with os.fdopen(fd, "rb") as handle, tarfile.open(fileobj=handle, mode="r|") as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(target, filter=safe)
            else:
                for member in archive:
                    kept = safe(member, str(target))
                    if kept is not None:
                        archive.extract(kept, target, set_attrs=not kept.issym())
    except (tarfile.TarError, OSError) as exc:
        problems.append(str(exc))


def _climbs(path: PurePosixPath) -> bool:
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else (0 if part in (".", "") else 1)
        if depth < 0:
            return True
    return False


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _host_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


def _transfer_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}


def remove_root(root: Path) -> None:
    """Delete a session folder, even one whose folders an agent made unwritable."""

    def onerror(func: Any, path: str, _exc: Any) -> None:
        try:
            parent = os.path.dirname(path)
            os.chmod(parent, 0o700)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
            func(path)
        except OSError:
            pass

    if root.exists():
        shutil.rmtree(root, onerror=onerror)


def wait_gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    """The pids of ``pids`` still alive (not zombies) after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.02)
    return alive


def _real_folder(root: Path, path: str) -> Path:
    """``path`` of the sandbox as a folder of ``root``, refused (:class:`SandboxError`) where
    any part of it is a link or not a folder: a bind's source is resolved on the host."""
    at = root
    for part in inside_path(path).strip("/").split("/"):
        at = at / part
        try:
            st = os.lstat(at)
        except OSError as exc:
            raise SandboxError(f"{path} is missing from the session's root ({exc.strerror})") from None
        if not stat.S_ISDIR(st.st_mode):
            raise SandboxError(f"{path} is no longer a folder of the session's root (a link or a file)")
    return at


def process_parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process this process can see."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[0] not in (b"Z", b"X"):
            out[int(entry)] = int(fields[1])
    return out


_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def _by_children(roots: set[int]) -> set[int] | None:
    """:func:`descendants` from ``/proc/PID/task/TID/children`` (visiting only the session's
    processes, not the whole host's); None where those files cannot be read."""
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
            tids = os.listdir(f"/proc/{pid}/task")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # gone
        except OSError:
            return None
        if state in (b"Z", b"X"):
            continue
        found.add(pid)
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                    todo.extend(int(child) for child in handle.read().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
            except (OSError, ValueError):
                return None
    return found


def descendants(roots: set[int], parents: dict[int, int] | None = None) -> set[int]:
    """``roots`` (those alive) and every live process below them."""
    if parents is None and _CHILDREN:
        found = _by_children(roots)
        if found is not None:
            return found
    parents = process_parents() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found = {pid for pid in roots if pid in parents}
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def quote(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
