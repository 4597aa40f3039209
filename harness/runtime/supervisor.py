"""Starting, watching and stopping service processes, and the pid files that outlive us.

A service runs in its own session and process group (``start_new_session``), so stopping it
stops everything it spawned (data-loader workers, a tokenizer server…) and a Ctrl-C in the
terminal that started the broker does not reach it. Its stdout and stderr are appended to
its log file. For each process it starts, the supervisor writes a pid file
``<state>/pids/<name>.json``::

    {"harness": "harness-service/1", "name": ..., "pid": ..., "pgid": ..., "port": ...,
     "started": <unix time>, "create_time": <psutil create_time>, "argv": [...],
     "log": <log path>, "broker_pid": <pid of the process that started it>}

and removes it once the process group is gone. The pid files are what lets ``harness down``
stop what harness started, and only that, after the broker itself died: a pid file is
acted on only while its process still has the recorded create time (so a recycled pid is
never signalled), and a leader that already exited is followed through its process group
only when the group's members are still in the session it led.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import psutil

from harness.errors import HarnessError
from harness.runtime.launch import LaunchSpec

#: Marks a pid file as ours; anything else in the folder is never acted on.
PIDFILE_MARKER = "harness-service/1"

#: Grace periods of the stop escalation: after SIGINT, then after SIGTERM (seconds).
DEFAULT_GRACE = (3.0, 3.0)

#: Bytes of a log shown when a service fails.
TAIL_BYTES = 4000

#: create_time is derived from clock ticks since boot; two reads of one process agree to
#: far better than this, and a recycled pid cannot start within it.
_CREATE_TIME_TOLERANCE_S = 0.05


class ServiceStartError(HarnessError):
    """A service exited or did not become healthy within its ``load_seconds``.

    ``log_tail`` holds the last lines of its log (also part of the message).
    """

    def __init__(self, message: str, *, log_tail: str = "", hint: str | None = None) -> None:
        full = f"{message}\n--- last lines of the log ---\n{log_tail.rstrip()}" if log_tail.strip() else message
        super().__init__(full, hint=hint)
        self.log_tail = log_tail


def pid_dir(state_dir: Path) -> Path:
    """``<state>/pids``: one JSON file per service process harness started."""
    return state_dir / "pids"


def pidfile_path(state_dir: Path, name: str) -> Path:
    """The pid file of service ``name``."""
    return pid_dir(state_dir) / f"{name}.json"


def log_tail(path: Path, max_bytes: int = TAIL_BYTES) -> str:
    """The last ``max_bytes`` of a log, starting at a line boundary ("" when missing)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return ""
    if size > max_bytes and b"\n" in data:
        data = data.split(b"\n", 1)[1]
    return data.decode("utf-8", errors="replace")


def state_dir_mode(state_dir: Path) -> int:
    """The mode of a state folder: 0770 inside a group-shared home (the group's layout:
    members may look in, every file there is its writer's only), else 0700."""
    from harness.store.shared import is_shared

    here = Path(os.path.abspath(state_dir))
    return 0o770 if any(is_shared(folder) for folder in here.parents) else 0o700


def make_state_dir(state_dir: Path) -> Path:
    """Create ``state_dir`` private to its owner (:func:`state_dir_mode`), its ``logs``
    folder 0700 (a service's output may show its secrets) and its launch-check log 0600 (so
    the store's appends to it keep that mode). A folder or file this user already has with
    wider modes is narrowed. Returns ``state_dir``.

    Raises :class:`HarnessError` naming the owner when ``state_dir`` or its ``logs`` is a link
    or another user's folder (in a shared home another member can make a project's state
    folder before its owner first uses it): its owner could replace anything written there,
    the broker's start settings (the services' commands) among them, so harness never uses it.
    """
    from harness.store.launchcheck import LAUNCH_CHECKS

    state_dir = Path(state_dir)
    mode = state_dir_mode(state_dir)
    for folder, wanted in ((state_dir, mode), (state_dir / "logs", 0o700)):
        if not os.path.lexists(folder):
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                folder.mkdir(mode=wanted)  # created with it: never readable for a moment
                # ... and given all of it, whatever the umask (the group's bits in a shared home)
                os.chmod(folder, (folder.stat().st_mode & 0o7000) | wanted)
            except FileExistsError:
                pass
        _check_own_folder(folder)
        _narrow(folder, wanted)
    checks = state_dir / LAUNCH_CHECKS
    try:
        os.close(os.open(checks, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600))
    except OSError:
        pass  # a link or another user's file: the store reports it when it appends
    _narrow(checks, 0o600)
    return state_dir


def own_state_folder(parent: Path, name: str) -> Path:
    """``parent/name`` unless another user has it (their folder, or their link): then this
    user's own ``parent/name-<random>``, the one found again on every later call (the first,
    sorted, of this user's folders so named), made now (``0700``) when there is none. So a
    state folder another member took first never stands in this user's way."""
    import glob
    import tempfile

    first = parent / name
    try:
        if os.lstat(first).st_uid == os.geteuid():
            return first
    except OSError:
        return first  # none yet: make_state_dir makes it
    for candidate in sorted(parent.glob(f"{glob.escape(name)}-*")):
        try:
            info = os.lstat(candidate)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            return candidate
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=parent))


def _check_own_folder(folder: Path) -> None:
    """:func:`make_state_dir`'s check: ``folder`` is a folder of this user's, or a link this
    user made to one (a home may hold links); anything else is a HarnessError naming whose."""
    from harness.store.entries import owner_of

    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) and info.st_uid == os.geteuid():
        info = os.stat(folder)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
        return
    raise HarnessError(
        f"{folder}: this state folder is {owner_of(folder)}'s, not a folder of yours; harness keeps a broker's "
        "token, its pid files and the services' start settings there, so it uses only your own",
        hint="its owner can remove it; or give this deploy a state folder of yours (the deploy's `state` key)",
    )


def _narrow(path: Path, wanted: int) -> None:
    """Clear the permission bits of ``path`` (this user's, not followed) beyond ``wanted``."""
    try:
        info = os.lstat(path)
        if info.st_uid == os.geteuid() and not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o777 & ~wanted:
            os.chmod(path, (info.st_mode & 0o7000) | (info.st_mode & wanted))
    except OSError:
        pass


#: A log larger than this when its writer starts (a service's start or restart, the
#: broker's, the watchdog's) is moved aside to ``NAME.log.1`` first, replacing the one there:
#: a service restarted for weeks keeps at most about twice this on disk.
LOG_ROTATE_BYTES = 64 * 1024 * 1024


def open_private_log(path: Path, rotate_bytes: int = LOG_ROTATE_BYTES) -> BinaryIO:
    """Open log ``path`` for appending, readable by its owner only: created 0600, never
    through a link; one this user already has with wider modes is narrowed (a service's
    output may show its secrets). One of this user's over ``rotate_bytes`` is first renamed
    to ``<path>.1`` (a link or another user's file there is replaced, never followed)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _rotate(path, rotate_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        info = os.fstat(fd)
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    except OSError:
        pass
    return os.fdopen(fd, "ab")


def _rotate(path: Path, limit: int) -> None:
    try:
        info = path.lstat()
    except OSError:
        return
    if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_size > limit:
        try:
            os.replace(path, path.with_name(path.name + ".1"))
        except OSError:
            pass  # kept growing rather than lost: appending still works


def write_private(path: Path, text: str) -> None:
    """Write ``path`` atomically, readable by its owner only (0600 from its creation: the
    temporary file is made with that mode, never through a link, and renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.unlink(missing_ok=True)  # O_EXCL below: never write through someone's link or wider file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    write_private(path, json.dumps(data, indent=1) + "\n")


def start(spec: LaunchSpec, state_dir: Path, *, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``spec`` in a new session; write its pid file; return the process.

    The caller owns the returned process and must eventually :func:`stop` it (which also
    removes the pid file). ``extra_env`` is added to ``spec.env`` (the broker adds its own
    address). Before anything starts, every file of ``spec.closure`` is checked against its
    registration and the check is logged to ``<state>/launch-checks.jsonl``
    (:func:`harness.store.launchcheck.checked_launch`). Raises :class:`ServiceStartError`
    when a store path changed (naming its files; nothing is started) or the program cannot
    be executed.
    """
    from harness.store.launchcheck import IntegrityError, checked_launch

    make_state_dir(state_dir)
    try:
        checked_launch(state_dir, spec.name, spec.closure)
    except IntegrityError as exc:
        raise ServiceStartError(f"{spec.name}: refusing to launch: {exc.message}", hint=exc.hint) from None
    env = dict(spec.env)
    if extra_env:
        env.update(extra_env)
    with open_private_log(spec.log_path) as log:
        log.write(
            f"\n=== harness: starting {spec.name} at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
            f"{' '.join(spec.argv)}\n".encode()
        )
        log.flush()
        try:
            proc = subprocess.Popen(
                list(spec.argv),
                cwd=spec.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise ServiceStartError(f"{spec.name}: cannot execute {spec.argv[0]}: {exc}") from None
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.Error:  # exited already; wait_healthy reports it with the log
        create_time = None
    _write_json_atomically(
        pidfile_path(state_dir, spec.name),
        {
            "harness": PIDFILE_MARKER,
            "name": spec.name,
            "pid": proc.pid,
            "pgid": proc.pid,
            "port": spec.port,
            "started": time.time(),
            "create_time": create_time,
            "argv": list(spec.argv),
            "log": str(spec.log_path),
            "broker_pid": os.getpid(),
        },
    )
    return proc


def port_in_use(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class PortOwner:
    """A process listening on a TCP port, as ``/proc`` shows it: its user always; its pid
    and command only where this user may look at its descriptors (its own, or as root)."""

    uid: int
    user: str | None
    pid: int | None
    command: str | None

    def describe(self) -> str:
        who = f"uid {self.uid}" + (f" ({self.user})" if self.user else "")
        if self.pid is None:
            return f"a process of {who} (its command is not visible to this user)"
        return f"pid {self.pid} of {who}: {self.command or '?'}"


def port_owners(port: int) -> list[PortOwner]:
    """Every socket listening on TCP ``port`` (IPv4 and IPv6) and who owns it, read from
    ``/proc/net/tcp`` and ``/proc/net/tcp6`` (the owner's uid) and ``/proc/PID/fd`` (the
    process, where this user may read it). Empty where ``/proc`` does not say (not Linux)."""
    inodes: dict[int, int] = {}  # socket inode → uid
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            try:
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes[int(fields[9])] = int(fields[7])
            except (IndexError, ValueError):
                continue
    pids = _socket_pids(set(inodes))
    owners = []
    for inode, uid in sorted(inodes.items()):
        pid = pids.get(inode)
        command = None
        if pid is not None:
            try:
                command = " ".join(" ".join(psutil.Process(pid).cmdline()).split())[:200] or None  # one line
            except psutil.Error:
                pass
        owners.append(PortOwner(uid, _user_name(uid), pid, command))
    return owners


def _socket_pids(inodes: set[int]) -> dict[int, int]:
    """The pid holding each socket of ``inodes``, among the processes whose descriptors this
    user may read."""
    found: dict[int, int] = {}
    if not inodes:
        return found
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    try:
        processes = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return found
    for pid in processes:
        try:
            descriptors = os.scandir(f"/proc/{pid}/fd")
        except OSError:  # another user's process, or gone
            continue
        with descriptors:
            for entry in descriptors:
                try:
                    inode = wanted.get(os.readlink(entry.path))
                except OSError:
                    continue
                if inode is not None and inode not in found:
                    found[inode] = int(pid)
        if len(found) == len(inodes):
            break
    return found


def _user_name(uid: int) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def probe(spec: LaunchSpec, timeout: float = 1.0) -> bool:
    """One readiness check, chosen by the spec's protocol (:data:`READINESS`).

    Connection refused is the cheap, common answer while a service loads, so the port is
    tried first and the protocol's own check only once something listens.
    """
    if not port_in_use(spec.port, timeout=timeout):
        return False
    return READINESS.get(spec.protocol, http_ready)(spec, timeout)


def http_ready(spec: LaunchSpec, timeout: float) -> bool:
    """The health URL answers 2xx; without one, the port accepting connections is enough."""
    if spec.health_url is None:
        return True
    parts = urllib.parse.urlsplit(spec.health_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""))
        return 200 <= conn.getresponse().status < 300
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def websocket_ready(spec: LaunchSpec, timeout: float) -> bool:
    """A WebSocket opens at the service's URL (its health path, if any) and answers a ping.

    The ping is the protocol's own control frame (RFC 6455 §5.5.2), which every conforming
    server answers without application code: OpenWAM's JSON server and XPolicyLab's policy
    server alike. A server that accepts TCP but has not started its WebSocket loop yet
    (still loading a checkpoint) fails the handshake and is not ready.
    """
    from websockets.exceptions import WebSocketException
    from websockets.sync.client import connect

    target = spec.health_url or spec.url
    if not target.startswith(("ws://", "wss://")):
        target = "ws://" + target.split("://", 1)[-1]
    try:
        with connect(target, open_timeout=timeout, close_timeout=timeout, proxy=None) as socket_:
            return socket_.ping().wait(timeout)
    except (OSError, TimeoutError, WebSocketException):
        return False


#: Readiness check by manifest protocol (anything else: :func:`http_ready`).
READINESS = {"http": http_ready, "websocket": websocket_ready, "xpolicylab": websocket_ready}


def wait_healthy(spec: LaunchSpec, proc: subprocess.Popen[bytes], *, timeout: float | None = None) -> float:
    """Block until ``spec`` is ready; return the seconds waited.

    Polls every few milliseconds at first and at most every 10 ms (a swap's overhead beyond
    the service's own load time is mostly this lag; a refused connection costs
    microseconds, so even a minute's load is cheap to watch), for ``timeout`` (default
    ``spec.load_seconds``). Raises :class:`ServiceStartError` with the tail of the log when
    the process exits first or the time runs out; the process is left running in the
    latter case (the caller stops it).
    """
    limit = spec.load_seconds if timeout is None else timeout
    began = time.monotonic()
    interval = 0.002
    while True:
        code = proc.poll()
        if code is not None:
            raise ServiceStartError(
                f"{spec.name} exited with {_describe_exit(code)} while loading "
                f"(after {time.monotonic() - began:.1f} s); log: {spec.log_path}",
                log_tail=log_tail(spec.log_path),
            )
        if probe(spec):
            return time.monotonic() - began
        elapsed = time.monotonic() - began
        if elapsed >= limit:
            what = (
                f"a WebSocket at {spec.health_url or spec.url} answering a ping"
                if READINESS.get(spec.protocol) is websocket_ready
                else f"GET {spec.health_url} answering 2xx"
                if spec.health_url
                else f"port {spec.port} accepting connections"
            )
            raise ServiceStartError(
                f"{spec.name} was not ready ({what}) within load_seconds = {limit:g}; log: {spec.log_path}",
                log_tail=log_tail(spec.log_path),
                hint="raise load_seconds in its manifest if it loads slowly on this machine",
            )
        time.sleep(min(interval, max(0.0, limit - elapsed)))
        interval = min(interval * 1.5, 0.01)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# ------------------------------------------------------------------------------- stopping


def _group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # someone else's group: listed (and refused) below
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return members


def _group_alive(pgid: int) -> bool:
    """Whether any non-zombie process of group ``pgid`` runs (cheap while the leader lives)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:  # the common case: the leader itself still runs, no need to scan the table
        leader = psutil.Process(pgid)
        if leader.status() != psutil.STATUS_ZOMBIE and os.getpgid(pgid) == pgid:
            return True
    except (psutil.Error, OSError):
        pass
    return bool(_group_members(pgid))


def _wait_group(pgid: int, proc: subprocess.Popen[bytes] | None, seconds: float) -> bool:
    """Wait up to ``seconds`` for group ``pgid`` to be gone; reap ``proc`` on the way."""
    deadline = time.monotonic() + seconds
    interval = 0.002
    while True:
        if proc is not None:
            proc.poll()  # reap our own child, or its zombie keeps the group alive
        if not _group_alive(pgid):
            if proc is not None and proc.returncode is None:
                # Nothing of the group runs, so our child is a zombie (it died after the poll
                # above): reap it now, or its exit status is lost to the caller.
                try:
                    proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    pass
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
        interval = min(interval * 2, 0.05)


def stop(pgid: int, *, proc: subprocess.Popen[bytes] | None = None, grace: tuple[float, float] = DEFAULT_GRACE) -> str:
    """Stop process group ``pgid`` by escalation; return the signal that ended it.

    SIGINT to the whole group (Python services unwind as on Ctrl-C), then SIGTERM after
    ``grace[0]`` seconds, then SIGKILL after ``grace[1]``. Returns "gone" when nothing was
    left to signal, else "SIGINT", "SIGTERM" or "SIGKILL". The caller is responsible for
    ``pgid`` being ours (see :func:`stop_recorded` for pid files).
    """
    if proc is not None:
        proc.poll()
    if not _group_alive(pgid):
        return "gone"
    for sig, wait in ((signal.SIGINT, grace[0]), (signal.SIGTERM, grace[1]), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return sig.name
        if _wait_group(pgid, proc, wait):
            return sig.name
    raise HarnessError(f"process group {pgid} survived SIGKILL (a process stuck in the kernel?)")


# ------------------------------------------------------------------------------ pid files


@dataclass(frozen=True)
class PidRecord:
    """One pid file, and what the process table says about it now.

    ``alive``: the recorded process (same pid *and* create time) runs, or its leader
    exited but members of its process group still run in the session it led. ``recycled``:
    the pid now belongs to another process (never signalled).
    """

    path: Path
    name: str
    pid: int
    pgid: int
    port: int | None
    started: float
    create_time: float | None
    argv: tuple[str, ...]
    log: str | None
    alive: bool
    recycled: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "pgid": self.pgid,
            "port": self.port,
            "started": self.started,
            "alive": self.alive,
            "recycled": self.recycled,
            "log": self.log,
            "pidfile": str(self.path),
        }


def _examine(pid: int, pgid: int, create_time: float | None) -> tuple[bool, bool]:
    """(alive, recycled) of a recorded process group leader."""
    try:
        process = psutil.Process(pid)
        actual = process.create_time()
        zombie = process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        process = None
    except psutil.Error:
        return False, True  # cannot inspect it: not ours to touch
    if process is not None:
        if create_time is None or abs(actual - create_time) > _CREATE_TIME_TOLERANCE_S:
            return False, True
        if not zombie:
            return True, False
    # The leader is gone. Linux does not reuse a pid while a group or session of that id
    # exists, so members still in session ``pgid`` are the orphans of our service.
    for member in _group_members(pgid):
        try:
            if os.getsid(member.pid) == pgid:
                return True, False
        except OSError:
            continue
    return False, False


def read_pidfiles(state_dir: Path) -> list[PidRecord]:
    """Every harness pid file under ``state_dir``, sorted by name, with liveness.

    Files without :data:`PIDFILE_MARKER`, that do not parse, or that are not this user's own
    (a link, or a file another member of a shared home planted in a state folder they made
    first, naming a process of this user's for ``down`` to stop) are skipped: never ours to
    act on.
    """
    from harness.store.entries import read_own

    records: list[PidRecord] = []
    folder = pid_dir(state_dir)
    if not folder.is_dir():
        return records
    for path in sorted(folder.glob("*.json")):
        try:
            raw = read_own(path, limit=1024 * 1024)
            if raw is None:
                continue
            data = json.loads(raw)
            if data.get("harness") != PIDFILE_MARKER:
                continue
            pid, pgid = int(data["pid"]), int(data["pgid"])
            create_time = None if data.get("create_time") is None else float(data["create_time"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        alive, recycled = _examine(pid, pgid, create_time)
        records.append(
            PidRecord(
                path=path,
                name=str(data.get("name", path.stem)),
                pid=pid,
                pgid=pgid,
                port=data.get("port"),
                started=float(data.get("started", 0.0)),
                create_time=create_time,
                argv=tuple(data.get("argv", ())),
                log=data.get("log"),
                alive=alive,
                recycled=recycled,
            )
        )
    return records


def remove_pidfile(state_dir: Path, name: str) -> None:
    """Forget service ``name``'s pid file (after its process group is gone)."""
    try:
        pidfile_path(state_dir, name).unlink()
    except FileNotFoundError:
        pass


def stop_recorded(record: PidRecord, *, grace: tuple[float, float] = DEFAULT_GRACE) -> str:
    """Stop the process group of a pid file if it is still ours; remove the file.

    Returns what :func:`stop` returns, "recycled" (pid reused by another process: left
    alone) or "gone" (nothing of it runs).
    """
    # Re-examine right before signalling: the record may be seconds old.
    alive, recycled = _examine(record.pid, record.pgid, record.create_time)
    outcome = "recycled" if recycled else ("gone" if not alive else stop(record.pgid, grace=grace))
    try:
        record.path.unlink()
    except FileNotFoundError:
        pass
    return outcome


def iter_alive(state_dir: Path) -> Iterator[PidRecord]:
    """The pid files whose processes still run."""
    return (r for r in read_pidfiles(state_dir) if r.alive)


def tree_usage(pid: int) -> tuple[int, list[int]] | None:
    """Resident memory (bytes) of a process and all its descendants, and their pids (for the
    GPU memory NVML reports per process), from one walk of the tree; None if it is gone."""
    try:
        root = psutil.Process(pid)
        total = root.memory_info().rss
        pids = [pid]
        for child in root.children(recursive=True):
            try:
                total += child.memory_info().rss
                pids.append(child.pid)
            except psutil.Error:
                continue
        return total, pids
    except psutil.Error:
        return None
