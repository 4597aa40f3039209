"""The second confinement, for machines where bubblewrap cannot create namespaces: Landlock
plus PRoot, with the same session layout as :class:`~harness.harbor.sandbox.Sandbox`.

Some workers (the seed's: no Docker daemon, a read-only cgroup v2, no user namespaces) let no
unprivileged process make a namespace. There, each command runs as::

    python -I -S -c <helper> RULES -- proot -r ROOT -b /usr -b /etc ... bash -c CMD

* **A subreaper** first: the helper marks itself ``PR_SET_CHILD_SUBREAPER`` and forks; the
  parent, outside the session's Landlock domain, adopts every orphan of the command
  (double-forked, ``setsid``, or left when PRoot exits) and lives until the last is gone, so
  the session's processes are always the descendants of its commands' helpers
  (:meth:`ConfinedSandbox.session_pids`); from Landlock ABI 6 the session cannot signal it.
* **Landlock** (Linux >= 5.13, through its three system calls with ``ctypes``): the child
  restricts itself, then execs PRoot, so the command and every process it starts inherit the
  ruleset, which no process can lift: the session root (and PRoot's scratch folder) may be
  written — in the agent phase all of it but the guarded folders (``/tests``,
  ``/logs/verifier``), granted folder by folder, so ``/`` itself is not; Harbor's transfers
  may write all of it —; ``/usr``, ``/etc``, the store paths of the closure, ``/proc`` and
  ``/sys`` only read and executed; ``/dev`` only its harmless nodes; nothing else on the host
  is reachable at all. With ABI >= 4 and a task without network, outgoing TCP is refused
  except to the broker's ports; with ABI >= 6, signals and abstract Unix sockets are scoped
  to the session.
* **seccomp** (:func:`_seccomp`): ``statx`` answers ENOSYS (for PRoot 5.1), and without
  network UDP, ICMP and raw sockets and ``io_uring`` are refused (Landlock has no UDP rules).
* **PRoot** (Debian package ``proot``; ptrace, no privilege) makes the session root ``/``
  and binds the host's ``/usr``, ``/etc``, ``/proc``, ``/dev`` and the store paths at their
  own paths, so commands see the layout a bubblewrap session has.

Differences, recorded by the environment: no PID namespace (``ps`` shows the host's
processes; :meth:`ConfinedSandbox.stop` and :meth:`ConfinedSandbox.begin_verifier_phase`
kill the subreapers' descendants, and whatever carries the session's random marker in its
environment), one user (task users are not enforced), the host's network namespace
(Landlock's TCP rules and the seccomp filter instead), and PRoot's ptrace overhead.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import platform
import secrets
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from harness.harbor.ids import IdMap
from harness.harbor.sandbox import (
    BASE_DIRS,
    TOP_LEVEL_LINKS,
    host_secrets,
    ExecOutcome,
    OutputCallback,
    Sandbox,
    SandboxConfig,
    SandboxError,
    StreamedOutput,
    descendants,
    inside_path,
    wait_gone,
)

#: Syscall numbers of Landlock: the same on every architecture (the generic table).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
MARKER = "HARNESS_CONFINED_SESSION"

# The helper runs in a fresh interpreter (-I -S) before anything of the session: argv[1] is
# the rules as JSON, the rest the command. Kept standard-library only and small.
_HELPER = r"""
import ctypes, json, os, sys
rules = json.loads(sys.argv[1]); argv = sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
# A subreaper outside the session's Landlock domain: every orphan of the command (double-forked,
# setsid, or left when PRoot dies) becomes its child, so the session's processes stay the
# descendants of this one, which the session cannot signal (Landlock ABI >= 6 scopes signals).
libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
first = os.fork()
if first:
    os.closerange(0, 65536)
    code = 1
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == first:
            code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)
def call(nr, *args):
    r = libc.syscall(nr, *args)
    if r < 0:
        e = ctypes.get_errno(); sys.stderr.write("harness landlock: syscall %d: %s\n" % (nr, os.strerror(e))); sys.exit(126)
    return r
abi = libc.syscall(444, None, 0, 1)
if abi < 1:
    sys.stderr.write("harness landlock: Landlock is not available\n"); sys.exit(126)
fs_all = (1 << 13) - 1 | ((1 << 13) if abi >= 2 else 0) | ((1 << 14) if abi >= 3 else 0) | ((1 << 15) if abi >= 5 else 0)
READ = (1 << 0) | (1 << 2) | (1 << 3)
net = 2 if (abi >= 4 and rules["no_network"]) else 0
scoped = 3 if abi >= 6 else 0
attr = (ctypes.c_uint64 * 3)(fs_all, net, scoped)
size = 24 if abi >= 6 else (16 if abi >= 4 else 8)
fd = call(444, ctypes.byref(attr), size, 0)
class Beneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]
def allow(path, access):
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    isdir = os.path.isdir(path)
    rule = Beneath(access if isdir else access & ((1 << 0) | (1 << 1) | (1 << 2) | ((1 << 14) if abi >= 3 else 0) | ((1 << 15) if abi >= 5 else 0)), pfd)
    call(445, fd, 1, ctypes.byref(rule), 0)
    os.close(pfd)
for p in rules["read"]:
    allow(p, READ)
for p in rules["write"]:
    allow(p, fs_all)
for p in rules["devices"]:
    allow(p, READ | (1 << 1) | ((1 << 15) if abi >= 5 else 0))
class Port(ctypes.Structure):
    _fields_ = [("allowed", ctypes.c_uint64), ("port", ctypes.c_uint64)]
if net:
    for port in rules["ports"]:
        call(445, fd, 2, ctypes.byref(Port(2, port)), 0)
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
call(446, fd, 0)
# The seccomp filter harness built (statx answers ENOSYS; without network, UDP and raw sockets
# and io_uring are refused): see _seccomp() in confine.py.
if rules["seccomp"]:
    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
    n = len(rules["seccomp"])
    prog = (Insn * n)(*[Insn(*i) for i in rules["seccomp"]])
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn))]
    if libc.prctl(22, 2, ctypes.byref(Prog(n, prog)), 0, 0) != 0:
        sys.stderr.write("harness: seccomp filter refused\n"); sys.exit(126)
os.execv(argv[0], argv)
"""

#: /dev nodes a session may use (read and write); everything else under /dev is refused.
DEVICES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/pts",
    "/dev/ptmx",
    "/dev/shm",
)


#: (audit arch, statx, socket, io_uring_setup) system call numbers per machine.
_SYSCALLS = {"x86_64": (0xC000003E, 332, 41, 425), "aarch64": (0xC00000B7, 291, 198, 425)}
#: Top-level folders an agent may write besides the session's own (PRoot's root itself is
#: read-only to the agent phase, see ConfinedSandbox._rules), as in a Debian image.
EXTRA_DIRS = ("opt", "srv", "mnt", "media")


def _seccomp(machine: str, no_network: bool) -> list[tuple[int, int, int, int]]:
    """The seccomp program of a command: ``statx`` answers ENOSYS (PRoot 5.1 passes it through
    untranslated, so the C library falls back to ``fstatat``, which PRoot translates); without
    network, ``socket(AF_INET/AF_INET6, SOCK_DGRAM/SOCK_RAW)`` (UDP, ICMP and raw sockets,
    which Landlock has no rules for) and ``io_uring_setup`` (whose sockets no filter sees)
    answer EACCES. Empty on a machine whose numbers are not known here."""
    numbers = _SYSCALLS.get(machine)
    if numbers is None:
        return []
    arch, statx, sock, uring = numbers
    ld, jeq, ret, alu_and = 0x20, 0x15, 0x06, 0x54
    allow, enosys, eacces = 0x7FFF0000, 0x00050000 | 38, 0x00050000 | 13
    # (code, true label, false label, k); a label is the name of an instruction below.
    asm: list[tuple[str, int, str, str, int]] = [
        ("", ld, "", "", 4),  # arch
        ("", jeq, "", "ALLOW", arch),
        ("", ld, "", "", 0),  # system call number
        ("", jeq, "ENOSYS", "", statx),
    ]
    if no_network:
        asm += [
            ("", jeq, "EACCES", "", uring),
            ("", jeq, "", "ALLOW", sock),
            ("", ld, "", "", 16),  # args[0]: the domain
            ("", jeq, "TYPE", "", 2),  # AF_INET
            ("", jeq, "", "ALLOW", 10),  # AF_INET6
            ("TYPE", ld, "", "", 24),  # args[1]: the type, less its flags
            ("", alu_and, "", "", 0xF),
            ("", jeq, "EACCES", "", 2),  # SOCK_DGRAM
            ("", jeq, "EACCES", "ALLOW", 3),  # SOCK_RAW
        ]
    asm += [("ALLOW", ret, "", "", allow), ("ENOSYS", ret, "", "", enosys), ("EACCES", ret, "", "", eacces)]
    at = {label: i for i, (label, *_rest) in enumerate(asm) if label}
    out = []
    for i, (_label, code, jt, jf, k) in enumerate(asm):
        out.append((code, at[jt] - i - 1 if jt else 0, at[jf] - i - 1 if jf else 0, k))
    return out


def _writable(folder: Path, blocked: list[tuple[str, ...]], skip: set[str]) -> list[str]:
    """Host paths whose hierarchies together are ``folder`` less the ``blocked`` ones (parts
    relative to it) and the names in ``skip`` (mount points); ``folder`` itself is not among
    them when anything is blocked (Landlock grants a folder's rights to all beneath it)."""
    if () in blocked:
        return []
    if not blocked:
        return [str(folder)]
    out: list[str] = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        if entry.name in skip or entry.is_symlink():
            continue
        below = [b[1:] for b in blocked if b[0] == entry.name]
        if below and entry.is_dir(follow_symlinks=False):
            out += _writable(Path(entry.path), below, set())
        elif not below:
            out.append(entry.path)
    return out


def landlock_abi() -> int:
    """The Landlock ABI version of this kernel (0: none)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        abi = int(libc.syscall(SYS_CREATE_RULESET, None, 0, 1))
    except (OSError, AttributeError):
        return 0
    return max(abi, 0)


def unavailable_reason() -> str | None:
    """Why this confinement cannot run here (None when it can)."""
    if shutil.which("proot", path="/usr/bin:/bin:/usr/sbin:/sbin") is None:
        return "PRoot is not installed (apt-get install proot)"
    if landlock_abi() < 1:
        return "the kernel has no Landlock (Linux >= 5.13 with landlock in the LSM list)"
    return None


class ConfinedSandbox(Sandbox):
    """A session confined by Landlock and PRoot; the interface of :class:`Sandbox`."""

    namespaces = False

    def __init__(self, config: SandboxConfig, **kw: Any) -> None:
        config.idmap = IdMap(
            "single",
            os.geteuid(),
            os.getegid(),
            reason="no user namespaces here: every command runs as the invoking user",
        )
        super().__init__(config, **kw)
        proot = shutil.which("proot", path="/usr/bin:/bin:/usr/sbin:/sbin")
        if proot is None:
            raise SandboxError("PRoot is not installed", hint="apt-get install proot")
        self.proot = proot
        self.abi = landlock_abi()
        self.marker = secrets.token_hex(12)
        self._running_ok = False
        self._tracers: set[int] = set()
        self._helpers: dict[int, asyncio.subprocess.Process] = {}  # the commands' subreapers
        self.loader: Path | None = None

    @property
    def started(self) -> bool:
        return self._running_ok

    @property
    def scratch(self) -> Path:
        """PRoot's own temporary folder (its loader), beside the root."""
        return self.config.root.parent / f"{self.config.root.name}.proot"

    def describe(self) -> dict[str, Any]:
        no_net = not self.config.network
        return {
            "landlock_abi": self.abi,
            "proot": self.proot,
            "tcp_connect": (
                "refused except forwarded ports"
                if no_net and self.abi >= 4
                else "allowed"
                if not no_net
                else "not restricted (Landlock ABI < 4)"
            ),
            "udp": (
                "allowed"
                if not no_net
                else "refused (seccomp: UDP, ICMP and raw sockets, io_uring)"
                if _SYSCALLS.get(platform.machine())
                else f"not restricted (no seccomp filter for {platform.machine()}; Landlock has no UDP rules)"
            ),
            "signals_scoped": self.abi >= 6,
            "pid_namespace": False,
            "orphans": "adopted by each command's subreaper, outside the session's Landlock domain"
            + (
                " (the session cannot signal it: Landlock ABI >= 6)"
                if self.abi >= 6
                else " (Landlock ABI < 6: a process of the session could kill it, and its orphans then escape)"
            ),
            "agent_phase": (
                f"no write to {', '.join(self.config.guarded)} (Landlock), nor to new top-level folders"
                if self.config.guarded
                else "no agent phase (a verifier session)"
            ),
        }

    async def start(self) -> None:
        root = self.config.root
        for folder in (*BASE_DIRS, *EXTRA_DIRS, *(d.lstrip("/") for d in self.config.dirs)):
            (root / inside_path("/" + folder).lstrip("/")).mkdir(parents=True, exist_ok=True)
        os.chmod(root / "tmp", 0o1777)
        # Every bind's mount point exists in the root: PRoot would otherwise make "glue"
        # folders in the host's /tmp, which Landlock (rightly) refuses.
        points = [
            "proc",
            "dev",
            "sys",
            *(p.lstrip("/") for p in self.config.read_only),
            *(p.lstrip("/") for p in self.config.host_binds.values()),
            *(str(p).lstrip("/") for p in self.config.store_paths),
            *(n for n in TOP_LEVEL_LINKS if (Path("/") / n).exists()),
        ]
        for point in points:
            (root / point).mkdir(parents=True, exist_ok=True)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.loader = await asyncio.to_thread(_loader, self.proot, self.scratch)
        self._running_ok = True
        if self.watchdog is not None:
            self.watchdog.start()
        if not self.config.network:
            self.forwarded = list(self.config.forward_ports)  # the host's loopback, allowed by Landlock

    def _proot_env(self) -> dict[str, str]:
        env = {"PROOT_TMP_DIR": str(self.scratch), MARKER: self.marker}
        if self.loader is not None:
            env["PROOT_LOADER"] = str(self.loader)
        return env

    def _mount_points(self) -> set[str]:
        """Top-level names of the root that PRoot binds over (never written through the root)."""
        c = self.config
        names = {"proc", "dev", "sys", *(n for n in TOP_LEVEL_LINKS if (Path("/") / n).exists())}
        names |= {p.strip("/").split("/")[0] for p in (*c.read_only, *c.host_binds.values())}
        return names

    def _rules(self, *, transfer: bool = False) -> dict[str, Any]:
        """The Landlock rules of a command; ``transfer``: of Harbor's own transfers, which may
        write anywhere in the root (its uploads of the verifier's files among them)."""
        c = self.config
        read = [
            *c.read_only,
            *c.host_binds,
            "/proc",
            "/sys",
            *map(str, c.store_paths),
            self.proot,
            *([str(self.loader)] if self.loader else []),
        ]
        read += [f"/{n}" for n in TOP_LEVEL_LINKS if os.path.isdir(f"/{n}")]
        guarded = [] if transfer else self.guarded_now
        if guarded:  # the agent phase: everything of the root but the verifier's folders
            read.append(str(c.root))
            blocked = [tuple(inside_path(g).strip("/").split("/")) for g in guarded]
            write = _writable(c.root, blocked, self._mount_points())
        else:
            write = [str(c.root)]
        return {
            "read": read,
            "write": [*write, str(self.scratch)],
            "devices": [*DEVICES, *c.devices],
            "no_network": not c.network,
            "ports": c.forward_ports,
            "seccomp": _seccomp(platform.machine(), not c.network),
        }

    def session_pids(self) -> set[int]:
        """Every live process of the session: the descendants of the commands' subreapers
        (which adopt every orphan) and whatever carries the session's marker."""
        live = {pid for pid, process in self._helpers.items() if process.returncode is None}
        for pid in [pid for pid, process in self._helpers.items() if process.returncode is not None]:
            del self._helpers[pid]
        return descendants(live | set(_marked(self.marker))) - {os.getpid()}

    def command_pids(self) -> set[int]:
        """The subreapers' descendants (what the memory watchdog samples: no scan of every
        process's environment for the marker, which the kills add)."""
        live = {pid for pid, process in self._helpers.items() if process.returncode is None}
        return descendants(live) - {os.getpid()}

    async def kill_commands(self) -> None:
        await self._kill_session()

    async def _kill_session(self) -> int:
        """SIGKILL every process of the session, the subreapers last (they adopt what their
        children leave); how many could not be killed."""
        helpers = {pid for pid, process in self._helpers.items() if process.returncode is None}
        for _ in range(200):  # a process may fork while we look: look again
            victims = self.session_pids() - helpers
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if not victims:
                break
            await asyncio.sleep(0.02)
        for pid in helpers | self._tracers:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for process in list(self._helpers.values()):
            try:
                await asyncio.wait_for(process.wait(), timeout=5)
            except TimeoutError:
                pass
        self._tracers.clear()
        return len(await asyncio.to_thread(wait_gone, sorted(self.session_pids()), 2.0))

    async def begin_agent_phase(self) -> None:
        """Guard the verifier's folders again (a multi-step task's next agent phase)."""
        if self.phase == "agent" or not self.config.guarded:
            return
        await self._kill_session()
        await asyncio.to_thread(_fresh_folders, self.config.root, list(self.config.guarded))
        self.phase = "agent"

    async def begin_verifier_phase(self) -> dict[str, Any]:
        """End the agent phase: every process of the session killed (the subreapers hold the
        double-forked and setsid ones), ``/tests`` and ``/logs/verifier`` made afresh,
        writable from now on (module doc of :mod:`harness.harbor.sandbox`)."""
        survivors = await self._kill_session()
        guarded, self.phase = list(self.config.guarded), "verifier"
        await asyncio.to_thread(_fresh_folders, self.config.root, guarded)
        return {
            "agent_processes_killed": not survivors,
            "survivors": survivors,
            "how": "killed: the descendants of each command's subreaper, and every process with the session's marker",
            "fresh": guarded,
        }

    def _enter(
        self, *, user: Any = None, privileged: bool = False, limited: bool = False, transfer: bool = False
    ) -> list[str]:
        if not self._running_ok:
            raise SandboxError("the sandbox is not running")
        c = self.config
        outer: list[str] = []
        inner: list[str] = []
        if limited and c.limits is not None:
            outer, inner = c.limits.wrap(self.tools.shell, self.tools.prlimit, self.tools.taskset)
        binds = ["-b", "/proc", "-b", "/dev", "-b", "/sys"]
        for path in c.read_only:
            binds += ["-b", path]
        for secret in host_secrets(c.read_only):  # what only some users may read: masked
            binds += ["-b", f"/dev/null:{secret}"]
        for host_path, inside in sorted(c.host_binds.items()):
            binds += ["-b", f"{host_path}:{inside}"]
        for name in TOP_LEVEL_LINKS:
            host = Path("/") / name
            if host.exists():
                binds += ["-b", f"{host.resolve()}:/{name}"]
        for store_path in c.store_paths:
            binds += ["-b", str(store_path)]
        return [
            *outer,
            sys.executable,
            "-I",
            "-S",
            "-c",
            _HELPER,
            json.dumps(self._rules(transfer=transfer)),
            "--",
            *inner,
            self.proot,
            "-r",
            str(c.root),
            *binds,
            "-w",
            "/",
        ]

    def command_args(self, command: str, cwd: str, user: Any = None, status_fd: int = 9) -> list[str]:
        # The command's status comes back on status_fd (closed for the command itself): PRoot
        # lives on while a background process of the command does, as the session's init would.
        shell = self.tools.shell
        n = int(status_fd)
        return [
            *self._enter(limited=True),
            shell,
            "-c",
            f'cd -- "$1" && "$2" -c "$3" {n}>&-; echo $? >&{n}',
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
        status_r, status_w = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command_args(command, cwd, status_fd=status_w),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**env, **self._proot_env()},
                start_new_session=True,
                pass_fds=(status_w,),
            )
        finally:
            os.close(status_w)
        self._tracers.add(process.pid)
        self._helpers[process.pid] = process
        self._running.add(process.pid)
        output = StreamedOutput(on_output)

        async def run() -> bytes:
            pumps = asyncio.gather(output.pump(process.stdout, "stdout"), output.pump(process.stderr, "stderr"))
            status = await asyncio.to_thread(_read_line, status_r)
            if not status:  # the wrapper never ran: PRoot exits, and its pipes with it
                await pumps
                return status
            # PRoot (which holds the output pipes too) outlives the command while a background
            # process of it runs: once the status is in, take what is in the pipes and go.
            try:
                await asyncio.wait_for(asyncio.shield(pumps), timeout=0.3)
            except TimeoutError:
                pumps.cancel()
                try:
                    await pumps
                except asyncio.CancelledError:
                    pass
            return status

        try:
            raw = await (asyncio.wait_for(run(), timeout=timeout) if timeout else run())
        except TimeoutError:
            await self._kill(process)
            raise RuntimeError(f"Command timed out after {timeout} seconds") from None
        except BaseException:
            await self._kill(process)
            raise
        finally:
            self._running.discard(process.pid)
            os.close(status_r)
        text = raw.decode(errors="replace").strip()
        if text.isdigit():
            code = int(text)
        else:  # the wrapper never ran (the helper or PRoot failed): PRoot's own status
            code = await process.wait() or 1
        return output.outcome(code)

    async def _run_io(
        self, argv: list[str], *, stdin: Any = None, stdout: Any = None, timeout: float = 600, privileged: bool = False
    ) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            *self._enter(transfer=True),
            *argv,
            stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=stdout if stdout is not None else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/root", **self._proot_env()},
            start_new_session=True,
        )
        self._tracers.add(process.pid)
        self._helpers[process.pid] = process
        try:
            _, err = await asyncio.wait_for(process.communicate(), timeout=timeout)
        except BaseException:
            await self._kill(process)
            raise
        return process.returncode or 0, err.decode(errors="replace").strip()

    async def stop(self, *, delete: bool) -> None:
        """Kill every process of the session (:meth:`_kill_session`)."""
        self._running_ok = False
        if self.watchdog is not None:
            await self.watchdog.cancel()
        await self._kill_session()
        if self.config.limits is not None:
            await asyncio.to_thread(self.config.limits.release)
        shutil.rmtree(self.scratch, ignore_errors=True)
        if delete:
            from harness.harbor.sandbox import remove_root

            await asyncio.to_thread(remove_root, self.config.root)


def _loader(proot: str, folder: Path) -> Path | None:
    """PRoot's loader, copied out of the ``proot`` binary (which embeds it as a second ELF
    file) into ``folder``: Debian's PRoot 5.1 would otherwise write it to the host's ``/tmp``
    on every start, which Landlock refuses. None when no loader is found (PRoot then tries
    its own way, and says so if Landlock stops it)."""
    import struct

    data = Path(proot).read_bytes()
    at = data.find(b"\x7fELF", 1)
    while at != -1:
        header = data[at : at + 64]
        if len(header) == 64 and header[4] == 2:  # a 64-bit ELF: its size from its headers
            (shoff,) = struct.unpack_from("<Q", header, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
            (phoff,) = struct.unpack_from("<Q", header, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
            size = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            if phnum and 0 < size <= len(data) - at and size < 1 << 22:
                target = folder / "loader"
                target.write_bytes(data[at : at + size])
                target.chmod(0o555)
                return target
        at = data.find(b"\x7fELF", at + 1)
    return None


def _fresh_folders(root: Path, folders: list[str]) -> None:
    """``folders`` of the session ``root`` made again, empty, mode 0755 (with a parent that an
    agent replaced by a link or a file), without following any link."""
    from harness.harbor.sandbox import remove_root

    for folder in folders:
        parts = inside_path(folder).strip("/").split("/")
        at = root
        for part in parts[:-1]:
            at = at / part
            if at.is_symlink() or (at.exists() and not at.is_dir()):
                at.unlink()
            at.mkdir(exist_ok=True)
        target = at / parts[-1]
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            target.unlink()
        remove_root(target)
        target.mkdir()
        target.chmod(0o755)


def _read_line(fd: int) -> bytes:
    """One line from ``fd`` (not to EOF: PRoot holds the pipe's write end as long as it lives)."""
    data = b""
    while not data.endswith(b"\n") and (chunk := os.read(fd, 1)):
        data += chunk
    return data


def _marked(marker: str) -> list[int]:
    """Pids of this user's processes whose environment carries ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    me = os.geteuid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != me:
                continue
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found
