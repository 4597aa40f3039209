"""A session's ``cpus`` and ``memory_mb``: enforced by a cgroup where one can be made, else
by per-process limits where those express it, and always said which.

Order of preference, per resource:

1. **cgroup v2**, where this process may create a child of its own cgroup with the ``cpu``
   and ``memory`` controllers (a delegated subtree, e.g. systemd's ``user@.service`` with
   ``Delegate=yes``, or root): ``cpu.max`` (fractional CPUs exactly), ``memory.max`` and
   ``memory.swap.max = 0``.
2. **cgroup v1** (root on a v1 or hybrid host): ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``
   and ``memory.limit_in_bytes`` (plus ``memory.memsw.limit_in_bytes`` where swap is
   accounted).
3. **Without a cgroup**: memory by a **watchdog** (:class:`MemoryWatchdog`) that sums the
   resident memory of the session's processes every :data:`WATCH_INTERVAL` seconds (anonymous
   and shared memory, proportionally where a page is shared: the file cache, which the kernel
   can reclaim, is left out) and stops the session's commands once the sum is over
   ``memory_mb`` (the environment then raises Harbor's ``MemoryLimitExceededError``), plus
   ``RLIMIT_AS`` of ``memory_mb`` for each process; CPUs as an affinity mask of
   ``ceil(cpus)`` CPUs (whole CPUs: ``cpus = 0.5`` gets one).

Every command of the session joins the cgroup before it enters the sandbox (the wrapper
from :meth:`Enforcement.wrap`); :meth:`Enforcement.release` removes the cgroup when the
session stops. :meth:`Enforcement.as_json` is what the record and the trial log say.
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import HarnessError

PERIOD_US = 100_000
#: Seconds between two samples of a session's memory by the watchdog.
WATCH_INTERVAL = 0.2
_NEXT_CPU = itertools.count()
_NEXT_CPU_LOCK = threading.Lock()

#: Joins every cgroup named before ``--``, then runs the rest (``$$`` is the process that
#: then execs nsenter: every command of the session starts inside the cgroup).
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass
class Enforcement:
    """How a session's limits are enforced (see the module doc)."""

    cpus: float | None
    memory_mb: int | None
    cpu_how: str = "not asked"
    memory_how: str = "not asked"
    no_cgroup: str = ""  # why no cgroup enforces what the cgroup lines do not say
    cgroups: list[Path] = field(default_factory=list)  # folders this session made
    procs: list[Path] = field(default_factory=list)  # cgroup.procs files every command joins
    address_space: int | None = None  # RLIMIT_AS, bytes
    affinity: list[int] | None = None
    watch_bytes: int | None = None  # the session's total, watched (no cgroup): MemoryWatchdog

    @property
    def cpu_enforced(self) -> bool:
        return self.cpus is not None and not self.cpu_how.startswith("not enforced")

    @property
    def memory_enforced(self) -> bool:
        return self.memory_mb is not None and not self.memory_how.startswith("not enforced")

    def wrap(self, shell: str, prlimit: str | None, taskset: str | None) -> tuple[list[str], list[str]]:
        """(before nsenter, after nsenter) argv prefixes that apply the limits to a command."""
        outer = [shell, "-c", _JOIN, "harness-limits", *map(str, self.procs), "--"] if self.procs else []
        inner: list[str] = []
        if self.address_space is not None and prlimit:
            inner += [prlimit, f"--as={self.address_space}:{self.address_space}", "--"]
        if self.affinity and taskset:
            inner += [taskset, "-c", ",".join(map(str, self.affinity))]  # taskset takes no "--"
        return outer, inner

    def release(self) -> None:
        """Remove the cgroups (their processes are gone, or going: a few tries)."""
        for folder in reversed(self.cgroups):
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    time.sleep(0.02)
        self.cgroups.clear()

    def as_json(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "memory_mb": self.memory_mb,
            "cpus_enforced": self.cpu_enforced,
            "memory_enforced": self.memory_enforced,
            "cpus_how": self.cpu_how,
            "memory_how": self.memory_how,
            "cgroups": [str(p) for p in self.cgroups],
            "no_cgroup_because": self.no_cgroup or None,
        }

    def describe(self) -> str:
        text = f"cpus {self.cpus}: {self.cpu_how}; memory_mb {self.memory_mb}: {self.memory_how}"
        return text + (f" (no cgroup: {self.no_cgroup})" if self.no_cgroup else "")


# ----------------------------------------------------------------------------- discovery


def _mounts(mountinfo: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup mount in ``mountinfo``."""
    out = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            point = fields[4].replace("\\040", " ")
            out.append((point, rest[0], set(rest[2].split(","))))
    return out


def _own(proc_cgroup: str) -> dict[str, str]:
    """controller (``""`` for v2) -> this process's cgroup path, from ``/proc/self/cgroup``."""
    out: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                out[controller] = parts[2]
    return out


def _write(path: Path, value: str) -> None:
    path.write_text(value, encoding="ascii")


def _v2(
    session: str,
    cpus: float | None,
    memory_mb: int | None,
    own: dict[str, str],
    mounts: list[tuple[str, str, set[str]]],
) -> tuple[Enforcement | None, str]:
    v2 = [m for m in mounts if m[1] == "cgroup2"]
    if not v2 or "" not in own:
        return None, "no cgroup v2"
    base = Path(v2[0][0]) / own[""].lstrip("/")
    wanted = {name for name, asked in (("cpu", cpus), ("memory", memory_mb)) if asked is not None}
    try:
        available = set((base / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return None, f"cgroup v2 at {base} unreadable ({exc.strerror})"
    if not wanted <= available:
        return None, f"cgroup v2 {base} lacks the {', '.join(sorted(wanted - available))} controller(s)"
    try:
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if not wanted <= enabled:
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(wanted - enabled)))
        child = base / f"harness-{session}"
        child.mkdir()
    except OSError as exc:
        return None, f"cannot make a cgroup v2 child of {base} ({exc.strerror}: not delegated to this user)"
    out = Enforcement(cpus, memory_mb, cgroups=[child], procs=[child / "cgroup.procs"])
    try:
        if cpus is not None:
            _write(child / "cpu.max", f"{max(1000, round(cpus * PERIOD_US))} {PERIOD_US}")
            out.cpu_how = f"cgroup v2 cpu.max {max(1000, round(cpus * PERIOD_US))} {PERIOD_US} ({child})"
        if memory_mb is not None:
            _write(child / "memory.max", str(memory_mb * 1024 * 1024))
            swap = child / "memory.swap.max"
            if swap.exists():
                _write(swap, "0")
            out.memory_how = f"cgroup v2 memory.max {memory_mb} MiB ({child})"
    except OSError as exc:
        out.release()
        return None, f"cgroup v2 {child} refused a limit ({exc.strerror})"
    return out, ""


def _v1(
    session: str,
    cpus: float | None,
    memory_mb: int | None,
    own: dict[str, str],
    mounts: list[tuple[str, str, set[str]]],
) -> tuple[Enforcement, list[str]]:
    """The v1 part of the limits: what could be set, and why the rest could not."""
    out = Enforcement(cpus, memory_mb)
    why: list[str] = []
    for controller, asked in (("cpu", cpus), ("memory", memory_mb)):
        if asked is None:
            continue
        mount = next((m for m in mounts if m[1] == "cgroup" and controller in m[2]), None)
        if mount is None or controller not in own:
            why.append(f"no cgroup v1 {controller} hierarchy")
            continue
        folder = Path(mount[0]) / own[controller].lstrip("/") / f"harness-{session}"
        try:
            folder.mkdir()
        except OSError as exc:
            why.append(f"cannot make {folder} ({exc.strerror})")
            continue
        out.cgroups.append(folder)
        try:
            if controller == "cpu" and cpus is not None:
                quota = max(1000, round(cpus * PERIOD_US))
                _write(folder / "cpu.cfs_period_us", str(PERIOD_US))
                _write(folder / "cpu.cfs_quota_us", str(quota))
                out.cpu_how = f"cgroup v1 cpu.cfs_quota_us {quota} per {PERIOD_US} ({folder})"
            elif memory_mb is not None:
                limit = str(memory_mb * 1024 * 1024)
                _write(folder / "memory.limit_in_bytes", limit)
                swap = folder / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    _write(swap, limit)
                out.memory_how = f"cgroup v1 memory.limit_in_bytes {memory_mb} MiB ({folder})"
            out.procs.append(folder / "cgroup.procs")
        except OSError as exc:
            why.append(f"{folder} refused a limit ({exc.strerror})")
    return out, why


def enforce(
    session: str,
    cpus: float | None,
    memory_mb: int | None,
    *,
    use_cgroups: bool = True,
    proc: Path = Path("/proc/self"),
) -> Enforcement:
    """Make what enforces ``cpus`` and ``memory_mb`` for ``session`` (see the module doc).

    Never raises for a machine that cannot: the result says what is not enforced and why.
    """
    if cpus is None and memory_mb is None:
        return Enforcement(None, None)
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in session)[:80] + f"-{os.getpid()}"
    reasons: list[str] = []
    out: Enforcement | None = None
    if use_cgroups:
        try:
            mounts = _mounts((proc / "mountinfo").read_text())
            own = _own((proc / "cgroup").read_text())
        except OSError:
            mounts, own = [], {}
        out, why = _v2(name, cpus, memory_mb, own, mounts)
        if out is None:
            reasons.append(why)
            out, why1 = _v1(name, cpus, memory_mb, own, mounts)
            reasons += why1
    else:
        reasons.append("cgroups not used")
    if out is None:
        out = Enforcement(cpus, memory_mb)
    reason = "; ".join(r for r in reasons if r) or "no cgroup"
    if memory_mb is not None and not out.memory_how.startswith("cgroup"):
        out.no_cgroup = reason
        out.address_space = memory_mb * 1024 * 1024
        out.watch_bytes = memory_mb * 1024 * 1024
        out.memory_how = (
            f"session total watched: its commands are stopped once its processes' resident memory "
            f"(file cache excluded, sampled every {WATCH_INTERVAL} s) is over {memory_mb} MiB; "
            f"and RLIMIT_AS {memory_mb} MiB per process"
        )
    if cpus is not None and not out.cpu_how.startswith("cgroup"):
        out.no_cgroup = reason
        out.affinity = _cpus(math.ceil(cpus))
        if out.affinity is None:
            out.cpu_how = "not enforced (no CPU affinity possible)"
        else:
            exact = "" if float(cpus).is_integer() else f", whole CPUs: {cpus} asked"
            out.cpu_how = f"CPU affinity {len(out.affinity)} CPU(s) {out.affinity}{exact}"
    return out


def _cpus(n: int) -> list[int] | None:
    """``n`` CPUs of this process's affinity set, spread across sessions round-robin."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if not allowed:
        return None
    if n >= len(allowed):
        return allowed
    with _NEXT_CPU_LOCK:
        start = next(_NEXT_CPU)
    return sorted({allowed[(start * n + i) % len(allowed)] for i in range(n)})


# ----------------------------------------------------------------------------- the watchdog


class MemoryLimitExceededError(HarnessError):
    """The session's processes used more memory than the task's ``memory_mb`` (Harbor treats
    an error of this name as the environment's memory error: retried, not graded)."""


def resident_bytes(pid: int) -> int | None:
    """Memory ``pid`` holds that the kernel cannot reclaim as file cache: its proportional
    anonymous and shared memory (``smaps_rollup``), else (another user's process, an old
    kernel) ``RssAnon + RssShmem`` of its status; None when it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            text = handle.read()
        fields = dict(line.split(b":", 1) for line in text.splitlines() if b":" in line)
        if b"Pss_Anon" in fields:
            return sum(int(fields[k].split()[0]) for k in (b"Pss_Anon", b"Pss_Shmem") if k in fields) * 1024
    except (OSError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            status = dict(line.split(b":", 1) for line in handle.read().splitlines() if b":" in line)
    except (OSError, ValueError):
        return None
    try:
        return sum(int(status[k].split()[0]) for k in (b"RssAnon", b"RssShmem") if k in status) * 1024
    except ValueError:
        return None


class MemoryWatchdog:
    """Samples the memory of a session's processes (``pids()``) and, once their sum is over
    ``limit`` bytes, calls ``stop()`` (which kills the session's commands) and keeps the
    reason in :attr:`exceeded`; the session refuses to go on from then."""

    def __init__(self, limit: int, pids: Any, stop: Any, *, interval: float = WATCH_INTERVAL) -> None:
        self.limit = limit
        self.pids = pids
        self.stop = stop
        self.interval = interval
        self.exceeded: str | None = None
        self.peak = 0
        self._task: Any = None

    def start(self) -> None:
        import asyncio

        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def cancel(self) -> None:
        import asyncio

        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    def sample(self) -> int:
        total = 0
        for pid in self.pids():
            total += resident_bytes(pid) or 0
        self.peak = max(self.peak, total)
        return total

    async def _run(self) -> None:
        import asyncio

        while self.exceeded is None:
            used = await asyncio.to_thread(self.sample)
            if used > self.limit:
                mib = 1024 * 1024
                self.exceeded = (
                    f"the session's processes held {used // mib} MiB, over its memory limit of "
                    f"{self.limit // mib} MiB (memory_mb): its commands were stopped"
                )
                await self.stop()
                return
            await asyncio.sleep(self.interval)

    def as_json(self) -> dict[str, Any]:
        mib = 1024 * 1024
        return {"limit_mb": self.limit // mib, "peak_mb": round(self.peak / mib, 1), "exceeded": self.exceeded}
