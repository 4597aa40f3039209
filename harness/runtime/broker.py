"""The broker: the one process that owns a plan's services and hands out leases on them.

Every caller of a model service (policy and world-model clients, the segmenter, chat roles)
asks the broker before each call and releases after it (:mod:`harness.client`). That is how
services can be started on demand, swapped on a shared GPU and stopped when idle, without
ever changing what a run computes (DESIGN invariant 5).

HTTP on loopback (JSON bodies; errors are ``{"error": msg, "code": code}``)::

    POST /acquire  {"service": name, "client": id, "pid": int?, "timeout": s?}
                   -> 200 {"lease", "service", "url", "fresh", "incarnation", "scoped", "foreign",
                           "client"}
                      404 unknown_service · 409 off · 503 start_failed / crashing / closing
                      (with "log_tail") · 504 timeout
    POST /release  {"lease": id}          -> 200 {"released": id} · 404 unknown_lease
    GET  /status                          -> {"broker": {...}, "services": [{...}, ...]}
    GET  /status?ready=S                  -> the same once the broker's start is over (``up``:
                   ``ready``), or after S seconds (at most 3600), whichever comes first
    GET  /health                          -> {"status": "ok"}  (the one endpoint without the token)
    GET  /metrics                         -> Prometheus text (format 0.0.4): per service its state,
                   starts, restarts, crashes, swaps, idle stops, load time, lease wait and hold
                   histograms; the broker's uptime (:mod:`harness.runtime.metrics`)
    GET  /events?since=N                  -> text/event-stream: every decision (start, ready, stop
                   with its reason, crash, lease, release, scoped_reset, ...) numbered from 1, as
                   ``id: N / event: KIND / data: {json}``, from after N on (or ``Last-Event-ID``);
                   the same lines go to ``broker.log``
    POST /shutdown                        -> 200, then every service it started is stopped
    POST /stop     {"names": [...], "timeout": s?} -> 200 {"results": {name: outcome}, "status"}: stop
                   those services' processes, the broker staying (``harness down NAME``);
                   409 in_use when leases stay in flight
    POST /add      {"services": [{"placement": {...}, "spec": {...}}]} -> 200 {"status"}: serve
                   services it did not launch (``harness up NAME``); 409 exists / port_taken
    POST /remove   {"names": [...]} -> 200 {"status"}: serve them no more (a failed ``up NAME``'s)
    POST /runs     {"run": id, "pid": int?} -> 200 {"token": t}: a run that joins this broker
    POST /runs/end {"run": id}              -> 200 {"scoped_resets": [...], "events": [...]} (and the
                   token ends); ``events``: the broker's events since the run joined (its report's timeline)
    POST /ui-login                          -> 200 {"url": one-time login URL of the web UI} (``harness ui``)
    GET  /ui, /ui/...                      the web UI: a session cookie from the one-time URL, checked
                   with Origin and a CSRF token for its POSTs (:mod:`harness.runtime.webui`)

A run that joins the broker (``harness run`` beside ``harness up``) registers itself and
hands its command the token ``/runs`` answered: a token that may only acquire, release and
read ``/status`` and ``/plan``. Leases taken with it are watched for resets of ``scoped``
services (:class:`~harness.runtime.scheduling.ResetTracker`), which ``/runs/end`` hands
back, so the run records them as it would with a broker of its own. A run whose process
exits without ending is forgotten.

In a request ``"client"`` is the caller's id; in the answer it is the service's client
table, an object of strings: the manifest's ``client`` (``url = "{url}"``) with its templates
filled as the service's command is at launch ({url}, {port}, {python}, {weights},
{source:NAME}; an external service's may use {url} alone), ``{}`` when the manifest has
none. Brokers before it answered no ``"client"``; a caller reads its absence as ``{}``.

Semantics (the decisions are :class:`harness.runtime.scheduling.Scheduler`'s, a pure state
machine tested on its own; this module carries them out with processes, threads and HTTP):

* **on_demand** services start on the first acquire and are healthy (health URL 2xx, or the
  port accepting connections) before it is answered, bounded by ``load_seconds``. Callers
  arriving while a load is under way wait for that load (one process is started).
* **resident** services are started by :meth:`Broker.start` (``harness up``); otherwise they
  behave like on_demand ones but are never stopped for idleness.
* **Swap groups** (``swap = "name"``): at most one member has a process at any instant — a
  peer is stopped, its whole process group gone and reaped, before the next member starts.
  A member with leases in flight is never stopped. Callers wait in one queue per group.
  Order: the member loaded next is the one that the oldest waiting caller wants; once it is
  ready, every caller already waiting for it is admitted together (they cost no swap), and
  a caller arriving while others wait queues behind them even if its member is loaded. So
  no caller is passed over by later ones for another member, nobody starves, and callers of
  one member are admitted in arrival order.
* **Idle**: an on_demand service with ``idle_seconds`` is stopped after that long with no
  lease in flight and nobody waiting for it (never, without ``idle_seconds``).
* **Crashes**: a service whose process exits unexpectedly is noticed (polled every
  ``tick`` seconds and on every acquire), its process group is stopped, and it is started
  again on the next acquire; a ``resident`` one also without a caller, after a backoff
  (``restart_backoff``), and a resident that stops answering its health check
  (probed every ``health_interval`` seconds) ``health_failures`` times in a row is stopped
  as a crash and started again. A failed start fails the callers waiting for it (503
  ``start_failed`` with the log's tail). After ``crash_limit`` failures (crashes or failed
  starts) within ``crash_window`` seconds, acquires are refused at once (503 ``crashing``,
  with the log's tail) until the window has passed.
* **external** services answer with their URL; nothing is started. **off** is a refusal
  (409) naming the reason the plan gives.
* **Foreign**: a local service whose port already answers when the broker would start it
  (started by hand, or by another checkout) is used as is and never stopped; its status
  says ``"foreign": true`` so the run record can name the impurity. It takes no part in
  its swap group's one-at-a-time rule, since harness cannot unload it. Only a process of
  this user is adopted: a port another user's process holds is a failed start naming that
  user (and its pid and command where ``/proc`` shows them; :func:`supervisor.port_owners`).
* **fresh** is true when the service process answering this lease has not served this
  client id before: the first acquire after each start of the process, per client. A
  ``scoped`` service (memory of past frames) that was swapped out, stopped for idleness or
  restarted after a crash therefore answers ``fresh: true``, so nobody mistakes a reset
  memory for a kept one. ``incarnation`` counts the broker's starts of the service (0 for
  external and foreign services, whose restarts harness cannot see: for them ``fresh`` is
  true only on a client's first acquire).
* A lease whose client process (``pid``, local callers) has exited is released by the
  broker, so a crashed caller cannot pin a swap group forever.

The broker writes ``<state>/broker.json`` (its URL and pid) while it serves, services' logs
to ``<state>/logs/`` and, through :mod:`harness.runtime.supervisor`, a pid file per service
process to ``<state>/pids/``: :func:`down` uses the broker when it answers and the pid files
when it died, and stops only what harness started.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import psutil
from filelock import FileLock, Timeout

from harness.errors import HarnessError
from harness.runtime import metrics, supervisor, watchdog, webui
from harness.runtime.launch import LaunchSpec, env_as_delta, env_from_delta, recorded_environment
from harness.runtime.parking import PARKED_PREFIX, Parked, broker_env, start_broker_process, waiting_parked
from harness.runtime.recordkey import record_key
from harness.runtime.plan import Gpu, Plan, RemoteSimulator, ServicePlacement, SimWorker
from harness.runtime.scheduling import (
    STATES,
    Action,
    BrokerError,
    GroupState,
    ResetTracker,
    Scheduler,
    Start,
    Stop,
)

__all__ = ["STATES", "Broker", "BrokerError", "broker_address", "down", "read_state", "spawn", "status"]

#: Marks the broker's state file.
STATE_MARKER = "harness-broker/1"
STATE_FILE = "broker.json"
#: The broker's secret (0600): every request but ``GET /health`` carries it as
#: ``Authorization: Bearer <token>``. A new one per broker process.
TOKEN_FILE = "broker.token"
#: Largest request body accepted (a lease request is a few hundred bytes).
MAX_BODY = 1 << 20
#: Held while a broker of the state folder is being looked for or started (one per folder).
LOCK_FILE = "broker.lock"
#: The configuration a detached broker (:func:`spawn`) reads at start (0600). It holds no
#: value of the caller's environment: each service's environment is told relative to the
#: environment the broker inherits (:func:`harness.runtime.launch.env_as_delta`), and
#: secret-like variables are named only.
CONFIG_FILE = "broker-config.json"
#: Secret-like variables of a service's environment that the broker's own environment does
#: not already hold (JSON ``{service: {name: value}}``), handed to a detached broker in its
#: environment (readable by its owner only, like every process's), never in a file; the
#: broker removes it from its environment at start.
HANDED_SECRETS = "HARNESS_BROKER_SECRETS"
#: Client id used by :meth:`Broker.start` to bring services up (no lease outlives it).
SYSTEM_CLIENT = "harness-up"

# ----------------------------------------------------------------------------- broker


@dataclass(eq=False)
class RunWatch:
    """A run that joined the broker (``POST /runs``): its token's leases, watched for resets."""

    run: str
    pid: int | None
    create_time: float | None
    tracker: ResetTracker = field(default_factory=ResetTracker)
    resets: list[dict[str, Any]] = field(default_factory=list)
    first_seq: int = 0  # the broker's last event number when the run joined
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, lease: Mapping[str, Any], client: str) -> None:
        with self.lock:
            reset = self.tracker.observe(lease, client, time.time())
            if reset is not None:
                self.resets.append(reset)


def _token_key(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class Broker:
    """Owns the services of ``plan``: starts, swaps, restarts and stops them; serves leases.

    The decisions are :class:`~harness.runtime.scheduling.Scheduler`'s; this class is the
    shell that carries them out (processes through :mod:`harness.runtime.supervisor`,
    threads waiting on conditions, the clock) and serves them over HTTP. One lock guards
    the scheduler; it is released while a process starts or stops.

    ``specs`` holds a :class:`LaunchSpec` for every ``resident`` and ``on_demand`` service
    of the plan (a missing one is an error at construction). ``state_dir`` receives
    ``broker.json``, logs and pid files. Thread-safe; use it as a context manager, or call
    :meth:`shutdown` — which stops every process it started — when done.
    """

    def __init__(
        self,
        plan: Plan,
        specs: Mapping[str, LaunchSpec],
        state_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        crash_limit: int = 3,
        crash_window: float = 300.0,
        lease_seconds: float | None = None,
        grace: tuple[float, float] = supervisor.DEFAULT_GRACE,
        tick: float = 0.1,
        die_with_owner: bool = False,
        gpu_free: Callable[[int], float | None] | None = None,
        gpu_wait_seconds: float = 120.0,
        restart_backoff: tuple[float, float] | None = (1.0, 60.0),
        health_interval: float = 5.0,
        health_failures: int = 3,
        log: Callable[[str], None] | None = None,
        runs_dir: str | Path | None = None,
        exit_unjoined: float | None = None,
    ) -> None:
        self.plan = plan
        #: Where the run records the web UI lists live (``$HARNESS_HOME/runs``), if known.
        self.runs_dir = Path(runs_dir) if runs_dir is not None else None
        #: The web UI's one-time login codes and sessions (:mod:`harness.runtime.webui`).
        self.ui = webui.UiSessions()
        #: A node's broker for the shards of one cluster run (harness/runs/nodebroker.py):
        #: it shuts itself down this many seconds after its last joined run ended or died.
        self.exit_unjoined = exit_unjoined
        self._unjoined_since = time.monotonic()
        self._ending = False  # it decided to end itself: no run joins any more
        #: Where each event goes as a line (the detached broker's ``broker.log``), if anywhere.
        self._log = log
        #: The events (``GET /events``) and counters (``GET /metrics``); guarded by its lock,
        #: which is taken under the broker's lock, never the other way round.
        self._events = metrics.EventLog()
        self._metrics = metrics.Metrics()
        self._events_cond = threading.Condition()
        self.state_dir = supervisor.make_state_dir(Path(state_dir))
        self.grace = grace
        self.tick = tick
        self.gpu_wait_seconds = gpu_wait_seconds
        self._gpu_free = gpu_free or nvml_free_gb
        self._sched = Scheduler(
            plan.services,
            specs,
            crash_limit=crash_limit,
            crash_window=crash_window,
            lease_seconds=lease_seconds,
            new_id=lambda: secrets.token_hex(8),
            restart_backoff=restart_backoff,
            health_failures=health_failures,
            on_event=self._record,
        )
        self.health_interval = health_interval
        self.specs = {name: specs[name] for name, svc in self._sched.services.items() if svc.local}
        self._lock = threading.Lock()
        self._conds = {name: threading.Condition(self._lock) for name in self._sched.groups}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._host, self._port = host, port
        self._closing = False
        self._closed = threading.Event()
        self._client_times: dict[int, float] = {}  # client pid → create time (for the reaper)
        self._server: ThreadingHTTPServer | None = None
        self._serving = False  # serve_forever is running (server.shutdown() waits for it)
        self._threads: list[threading.Thread] = []
        self._house: threading.Thread | None = None
        self._started_at = time.time()
        self._up_state = "idle"  # idle → starting → ready (Broker.start), for `harness up`
        self._up_changed = threading.Condition()  # told when it becomes ready (GET /status?ready=S)
        self._up_errors: dict[str, str] = {}
        #: The secret every request but ``/health`` must carry; written to ``broker.token``.
        self.token = secrets.token_urlsafe(32)
        self._runs: dict[bytes, RunWatch] = {}  # sha256 of a run's token -> the run
        # A broker inside a run's process: its services must not outlive that process,
        # even killed with SIGKILL (see harness.runtime.watchdog).
        self._watchdog = watchdog.spawn(self.state_dir, grace) if die_with_owner and self.specs else None

    # ---------------------------------------------------------------- context manager

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------------ acquire

    def acquire(
        self,
        service: str,
        client: str = "anonymous",
        *,
        client_pid: int | None = None,
        timeout: float | None = None,
        run: str | None = None,
    ) -> dict[str, Any]:
        """Wait until ``service`` may be called by ``client`` (of joined run ``run``, if any);
        return the lease (as JSON).

        Blocks while the service loads, or while a swap-group peer is in use, for at most
        ``timeout`` seconds (None: no limit besides the load's own ``load_seconds``).
        Raises :class:`BrokerError` (unknown_service, off, start_failed, crashing,
        closing, timeout).
        """
        create_time = self._client_create_time(client_pid) if client_pid is not None else None
        if create_time is None:
            client_pid = None  # not a local process we can watch
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            ticket = self._sched.enqueue(
                service, client, time.monotonic(), client_pid=client_pid, client_create_time=create_time, run=run
            )
            if ticket.lease is not None:
                return ticket.lease.as_json()
            group = self._sched.group_of(service)
            cond = self._conds[group.name]
            try:
                while True:
                    self._drive(group)
                    if ticket.lease is not None:
                        return ticket.lease.as_json()
                    if ticket.error is not None:
                        raise ticket.error
                    wait = self.tick * 5  # a safety net: changes notify the condition
                    if deadline is not None:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise BrokerError(504, "timeout", f"{service} was not available within {timeout:g} s")
                        wait = min(wait, remaining)
                    cond.wait(wait)
            finally:
                if self._sched.withdraw(ticket):
                    cond.notify_all()  # the head may have changed

    def release(self, lease_id: str, *, reclaimed: bool = False) -> None:
        """End a lease (``reclaimed``: for a holder that died). Raises :class:`BrokerError`
        (unknown_lease, lease_expired)."""
        with self._lock:
            lease, wake = self._sched.release(lease_id, time.monotonic(), reclaimed=reclaimed)
            # Only the last lease's release can let the queue move (a peer becomes
            # evictable); waking every waiter on each release costs O(waiters) per call.
            if wake:
                self._conds[self._sched.service(lease.service).group].notify_all()

    def _client_create_time(self, pid: int) -> float | None:
        """The create time of local process ``pid`` (cached: a pid's start never changes)."""
        known = self._client_times.get(pid)
        if known is not None:
            return known
        try:
            known = psutil.Process(pid).create_time()
        except (psutil.Error, ValueError, OverflowError):
            return None
        self._client_times[pid] = known
        return known

    # ------------------------------------------------------------ carrying out decisions

    def _drive(self, group: GroupState) -> None:
        """Let the scheduler move ``group`` on, carrying out its actions (lock held)."""
        cond = self._conds[group.name]
        while True:
            action: Action | None = self._check_exit(group)
            if action is None:
                step = self._sched.advance(group, time.monotonic())
                if step.resolved:
                    cond.notify_all()
                action = step.action
            if action is None:
                return
            self._execute(group, action)

    def _check_exit(self, group: GroupState) -> Stop | None:
        """Report a member whose process exited on its own (lock held); the crash's stop."""
        if group.busy:
            return None
        for name in group.members:
            proc = self._procs.get(name)
            if proc is None:
                continue
            code = proc.poll()
            if code is None:
                continue
            spec = self.specs[name]
            message = f"{name} exited with {supervisor._describe_exit(code)} while serving; log: {spec.log_path}"
            return self._sched.exited(name, time.monotonic(), message, supervisor.log_tail(spec.log_path))
        return None

    def _execute(self, group: GroupState, action: Action) -> None:
        """Carry out a start or stop with the lock released; report its outcome (lock held)."""
        name = action.service
        spec = self.specs[name]
        proc = self._procs.get(name)
        foreign = False
        failure: supervisor.ServiceStartError | None = None
        self._lock.release()
        try:
            if isinstance(action, Start):
                proc = None
                try:
                    if action.after_swap and action.gpu is not None and action.vram_gb > 0:
                        self._wait_for_gpu(action)
                    if supervisor.port_in_use(spec.port):
                        # Someone else holds the port. Another user's process is never handed
                        # out (it could answer anything, and see every request); one of ours
                        # that answers the service's health check is used as is (never
                        # stopped); anything else is refused.
                        strangers = [o for o in supervisor.port_owners(spec.port) if o.uid != os.geteuid()]
                        if strangers:
                            raise supervisor.ServiceStartError(
                                f"{name}: port {spec.port} is held by {strangers[0].describe()}, another "
                                f"user's process: harness serves {name} only from a process of this user",
                                hint=f"ask its owner to stop it, or give {name} another port in the deploy",
                            )
                        if not supervisor.probe(spec):
                            raise supervisor.ServiceStartError(
                                f"{name}: port {spec.port} is held by {port_holder(spec.port)}, which does "
                                f"not answer {spec.health_url or 'connections'} as {name} would",
                                hint=f"stop that process, or give {name} another port in the deploy",
                            )
                        foreign = True
                    else:
                        extra = self.client_env() if self._server is not None else None
                        proc = supervisor.start(spec, self.state_dir, extra_env=extra)
                        supervisor.wait_healthy(spec, proc)
                except Exception as exc:  # whatever happened, the group must not stay busy
                    failure = (
                        exc
                        if isinstance(exc, supervisor.ServiceStartError)
                        else supervisor.ServiceStartError(f"{name}: cannot start: {type(exc).__name__}: {exc}")
                    )
                    if proc is not None:  # timed out while still running: it is ours to stop
                        supervisor.stop(proc.pid, proc=proc, grace=self.grace)
                    supervisor.remove_pidfile(self.state_dir, name)
            elif proc is not None:
                try:
                    supervisor.stop(proc.pid, proc=proc, grace=self.grace)
                finally:
                    supervisor.remove_pidfile(self.state_dir, name)
        finally:
            self._lock.acquire()
        now = time.monotonic()
        if isinstance(action, Start):
            if failure is not None:
                self._sched.start_failed(name, now, failure.message, failure.log_tail)
            else:
                if proc is not None:
                    self._procs[name] = proc
                self._sched.started(name, now, foreign=foreign)
        else:
            self._procs.pop(name, None)
            self._sched.stopped(name, now)
        self._conds[group.name].notify_all()

    def _wait_for_gpu(self, action: Start) -> None:
        """After a swap, wait until the GPU can hold ``action``'s service: a stopped process's
        memory is released by the driver a moment after the process is gone. Raises
        :class:`supervisor.ServiceStartError` after :attr:`gpu_wait_seconds`."""
        assert action.gpu is not None
        began = time.monotonic()
        interval = 0.02
        while True:
            free = self._gpu_free(action.gpu)
            if free is None or free >= action.vram_gb:  # None: no inventory to ask
                return
            waited = time.monotonic() - began
            if waited >= self.gpu_wait_seconds:
                raise supervisor.ServiceStartError(
                    f"{action.service}: GPU {action.gpu} has {free:.1f} GB free after the swap and "
                    f"{action.service} needs {action.vram_gb:g} GB; waited {waited:.0f} s for the memory "
                    "to be released",
                    hint="another process holds memory on that GPU (see nvidia-smi); or correct vram_gb",
                )
            time.sleep(interval)
            interval = min(interval * 1.5, 0.5)

    # -------------------------------------------------------------- housekeeping

    def _housekeeping(self) -> None:
        """Notice crashes, stop idle services, reclaim overdue leases and those of dead
        clients (a thread)."""
        last_slow = 0.0
        while not self._closed.wait(self.tick):
            if self._closing:
                return
            now = time.monotonic()
            slow = now - last_slow >= 1.0
            if slow:
                last_slow = now
                self._reap_dead_clients()
                self._forget_dead_runs()
                if self._unjoined_too_long(now):
                    threading.Thread(target=self.shutdown, name="unjoined-shutdown").start()
                    return
            with self._lock:
                for lease in self._sched.reclaim_overdue(now):
                    self._conds[self._sched.service(lease.service).group].notify_all()
            for group in list(self._sched.groups.values()):
                with self._lock:
                    if group.busy or self._closing:
                        continue
                    restart = self._sched.restart_due(group, time.monotonic())
                    if restart is not None:  # a crashed resident, after its backoff: not on this thread
                        threading.Thread(target=self._carry_out, args=(group, restart), name="restart").start()
                        continue
                    action: Action | None = self._check_exit(group)
                    if action is not None:
                        self._execute(group, action)
                    if slow:
                        for name in group.members:
                            svc = self._sched.service(name)
                            if (
                                svc.foreign
                                and svc.state == "ready"
                                and not supervisor.port_in_use(self.specs[name].port)
                            ):
                                self._sched.foreign_gone(name)
                    action = self._sched.idle(group, time.monotonic())
                    if action is not None:
                        self._execute(group, action)
                    if group.queue:
                        self._conds[group.name].notify_all()

    def _carry_out(self, group: GroupState, action: Action) -> None:
        """Carry out ``action``, decided for ``group`` (now busy) on another thread."""
        with self._lock:
            self._execute(group, action)

    def _health_checks(self) -> None:
        """Probe every ready resident every :attr:`health_interval` seconds (a thread): a
        hung process fails its checks and is stopped as a crash, then started again."""
        while not self._closed.wait(self.health_interval):
            if self._closing:
                return
            with self._lock:
                ready = [
                    name
                    for name in self._sched.order
                    if self._sched.service(name).placement.mode == "resident"
                    and self._sched.service(name).state == "ready"
                    and not self._sched.service(name).foreign
                    and name in self._procs
                ]
            for name in ready:
                spec = self.specs.get(name)
                if spec is None:
                    continue  # taken out meanwhile
                ok = supervisor.probe(spec, timeout=2.0)
                with self._lock:
                    # Not once closing: a stop decided then might never be carried out.
                    if self._closing or name not in self._sched.services:
                        continue
                    group = self._sched.group_of(name)
                    what = spec.health_url or f"port {spec.port}"
                    action = self._sched.health(name, ok, time.monotonic(), f"{what} did not answer")
                    if action is not None:
                        self._execute(group, action)

    def _reap_dead_clients(self) -> None:
        """Release the leases whose client process has exited (a crashed caller must not pin
        a swap group forever)."""
        with self._lock:
            held = list(self._sched.leases_with_pids())
        for lease in held:
            assert lease.client_pid is not None
            try:
                same = abs(psutil.Process(lease.client_pid).create_time() - (lease.client_create_time or 0)) < 0.05
            except psutil.NoSuchProcess:
                same = False
            except psutil.Error:
                continue
            if not same:
                self._client_times.pop(lease.client_pid, None)  # the pid may be reused
                try:
                    self.release(lease.id, reclaimed=True)
                except BrokerError:
                    pass  # released meanwhile

    # --------------------------------------------------------------------- start / up

    def start(self, names: Iterable[str] | None = None, *, check_leftovers: bool = True) -> dict[str, str | None]:
        """Bring services up: the plan's resident ones, or those named; wait until ready.

        Returns service name → None (ready) or the error message. Services of different
        groups start in parallel. Refuses (HarnessError) when pid files show services that
        an earlier broker started still running: ``harness down`` first (not checked with
        ``check_leftovers=False``: a later ``harness up`` joining this broker).
        """
        if check_leftovers:
            self.check_leftovers()
        if names is None:
            wanted = [p.name for p in self.plan.services if p.mode == "resident"]
        else:
            wanted = list(names)
        self._ensure_housekeeping()
        self._up_state = "starting"
        results: dict[str, str | None] = {}

        def up(name: str) -> None:
            try:
                lease = self.acquire(name, SYSTEM_CLIENT)
                self.release(lease["lease"])
                results[name] = None
            except BrokerError as exc:
                results[name] = str(exc)

        threads = [threading.Thread(target=up, args=(n,), name=f"up-{n}") for n in wanted]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._up_errors.update({n: e for n, e in results.items() if e is not None})
        for name in wanted:
            if results.get(name) is None:
                self._up_errors.pop(name, None)
        with self._up_changed:
            self._up_state = "ready"
            self._up_changed.notify_all()
        return {n: results.get(n) for n in wanted}

    def wait_ready(self, seconds: float) -> None:
        """Return once its start is over (``up`` is ``ready``: :meth:`start`) or after ``seconds``."""
        with self._up_changed:
            self._up_changed.wait_for(lambda: self._up_state == "ready", timeout=seconds)

    def served(self) -> set[str]:
        """The names of every service of its plan."""
        with self._lock:
            return set(self._sched.services)

    def stop_service(self, name: str, timeout: float = 60.0) -> str:
        """Stop ``name``'s process, the broker and every other service staying (``harness
        down NAME``): waits for leases on it in flight to be released (at most ``timeout``
        seconds: then 409 ``in_use``). Returns "stopped", or why nothing was: "not running",
        "foreign" (never stopped: not ours), "external", "off". It starts again when a
        caller asks for it. Raises :class:`BrokerError` 404 for a name it does not serve."""
        if name not in self._sched.services:
            raise BrokerError(404, "unknown_service", f"this broker serves no {name}")
        deadline = time.monotonic() + timeout
        with self._lock:
            group = self._sched.group_of(name)
            while True:
                decision = self._sched.unload(name)
                if isinstance(decision, Stop):
                    self._execute(group, decision)
                    return "stopped"
                if decision != "wait":
                    return decision
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    leases = len(self._sched.service(name).inflight)
                    raise BrokerError(
                        409, "in_use", f"{name} still has {leases} lease(s) in flight after {timeout:g} s: not stopped"
                    )
                self._conds[group.name].wait(min(remaining, self.tick * 5))

    def add_services(self, placements: Iterable[ServicePlacement], specs: Mapping[str, LaunchSpec]) -> None:
        """Serve ``placements`` too (``harness up NAME`` beside a broker that does not launch
        NAME): each joins its swap group or forms its own. Raises :class:`BrokerError` (409)
        for a name it serves already or a port another of its services has."""
        placements = list(placements)
        with self._lock:
            ports = {spec.port: name for name, spec in self.specs.items()}
            for placement in placements:
                spec = specs.get(placement.name)
                if placement.name in self._sched.services:
                    raise BrokerError(409, "exists", f"{placement.name} is served by this broker already")
                if placement.mode in ("resident", "on_demand") and spec is None:
                    raise BrokerError(400, "bad_request", f"{placement.name}: no launch spec")
                if spec is not None and spec.port in ports:
                    raise BrokerError(
                        409, "port_taken", f"{placement.name}: port {spec.port} is {ports[spec.port]}'s in this broker"
                    )
            for placement in placements:
                group = self._sched.add(placement, specs.get(placement.name))
                self._conds.setdefault(group.name, threading.Condition(self._lock))
                if placement.mode in ("resident", "on_demand"):
                    self.specs[placement.name] = specs[placement.name]
            self.plan = dataclasses.replace(self.plan, services=(*self.plan.services, *placements))
        if self._server is not None and (read_state(self.state_dir) or {}).get("pid") == os.getpid():
            self._write_state()  # broker.json names every service it serves

    def remove_services(self, names: Iterable[str], timeout: float = 60.0) -> None:
        """Serve ``names`` no more, stopping any process first (``harness up NAME`` taking out
        again the services it added and that did not come up). Raises :class:`BrokerError`."""
        for name in names:
            if name not in self.served():
                continue
            for attempt in range(5):  # a crashed resident's restart may begin meanwhile: stop it again
                self.stop_service(name, timeout)
                with self._lock:
                    group = self._sched.group_of(name).name
                    try:
                        emptied = self._sched.remove(name)
                    except BrokerError:
                        if attempt == 4:
                            raise
                        continue
                    if emptied:
                        self._conds.pop(group, None)
                    break
            with self._lock:
                self.specs.pop(name, None)
                self.plan = dataclasses.replace(
                    self.plan, services=tuple(p for p in self.plan.services if p.name != name)
                )
        if self._server is not None and (read_state(self.state_dir) or {}).get("pid") == os.getpid():
            self._write_state()

    def check_leftovers(self) -> None:
        """Refuse (HarnessError) when pid files show services that an earlier broker of this
        state folder started and that still run: ``harness down`` first."""
        with self._lock:
            ours = {proc.pid for proc in self._procs.values()}
        leftovers = [r for r in supervisor.read_pidfiles(self.state_dir) if r.alive and r.pid not in ours]
        if leftovers:
            listed = ", ".join(f"{r.name} (pid {r.pid})" for r in leftovers)
            raise HarnessError(
                f"services started by an earlier harness are still running: {listed}", hint="harness down"
            )

    def launches(self) -> dict[str, dict[str, Any]]:
        """What each local service runs (``GET /plan``): argv, working folder and port, so a
        caller can tell whether this broker serves the very store paths it would launch."""
        return {name: launch_identity(spec) for name, spec in self.specs.items()}

    # --------------------------------------------------------------------- joined runs

    def register_run(self, run: str, pid: int | None = None, token: str | None = None) -> str:
        """A run joins (``POST /runs``): a token for its command, whose leases are watched for
        resets of scoped services until :meth:`end_run` (or until process ``pid`` exits).
        ``token``: the one the run's command already holds, from a broker of the same state
        folder that is gone (a cluster node's broker started again, harness/runs/nodebroker.py),
        so the command goes on with it; else a new one."""
        create_time = self._client_create_time(pid) if pid is not None else None
        token = token or secrets.token_urlsafe(32)
        with self._events_cond:
            first_seq = self._events.last_seq
        with self._lock:
            if self._closing or self._ending:  # a node's broker ending itself: the run starts another
                raise BrokerError(503, "closing", "this broker is shutting down")
            self._unjoined_since = time.monotonic()
            for key, watch in list(self._runs.items()):
                if watch.run == run:  # registered again: the earlier token ends
                    del self._runs[key]
            watch = RunWatch(run, pid if create_time else None, create_time, first_seq=first_seq)
            self._runs[_token_key(token.encode())] = watch
        return token

    def run_of(self, token: bytes) -> RunWatch | None:
        """The joined run whose token is ``token``, or None."""
        with self._lock:
            return self._runs.get(_token_key(token))

    def end_run(self, run: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """A joined run ends (``POST /runs/end``): its resets and the broker's events since it
        joined (every service's, for the run's timeline); its token no longer answers."""
        with self._lock:
            ended = [(k, w) for k, w in self._runs.items() if w.run == run]
            for key, _ in ended:
                del self._runs[key]
        if not ended:
            raise BrokerError(404, "unknown_run", f"no run {run!r} has joined this broker")
        watch = ended[0][1]
        with watch.lock:
            resets = list(watch.resets)
        return resets, self.events_since(watch.first_seq)

    def _unjoined_too_long(self, now: float) -> bool:
        """Whether a broker with ``exit_unjoined`` has served no joined run for that long
        (counted once its services are up: the first run joins after they are)."""
        if self.exit_unjoined is None:
            return False
        with self._lock:  # decided under the lock a joining run takes: it joins before, or is refused
            if self._runs or self._up_state != "ready":
                self._unjoined_since = now
                return False
            if now - self._unjoined_since < self.exit_unjoined:
                return False
            self._ending = True
        self._log_line(f"no run joined for {self.exit_unjoined:g} s: shutting down")
        return True

    def _log_line(self, line: str) -> None:
        if self._log is not None:
            self._log(line)

    def _forget_dead_runs(self) -> None:
        """Joined runs whose process has exited are forgotten (their token ends)."""
        with self._lock:
            watched = [(k, w) for k, w in self._runs.items() if w.pid is not None]
        for key, watch in watched:
            assert watch.pid is not None
            try:
                alive = abs(psutil.Process(watch.pid).create_time() - (watch.create_time or 0)) < 0.05
            except psutil.NoSuchProcess:
                alive = False
            except psutil.Error:
                continue
            if not alive:
                with self._lock:
                    self._runs.pop(key, None)

    # ------------------------------------------------------------ events and metrics

    def _record(self, event: dict[str, Any]) -> None:
        """The scheduler's ``on_event`` (called under the broker's lock): number and keep the
        event, count it, write its line to the log, wake the ``/events`` readers."""
        with self._events_cond:
            logged = self._events.append(event, time.time())
            self._metrics.observe(logged)
            self._events_cond.notify_all()
        if self._log is not None:
            self._log(metrics.describe(logged))

    def events_since(self, seq: int, wait: float = 0.0) -> list[dict[str, Any]]:
        """The events numbered above ``seq``; waits up to ``wait`` seconds for one when none
        is there yet (an ``/events`` stream), less once the broker has shut down."""
        deadline = time.monotonic() + wait
        with self._events_cond:
            while True:
                found = self._events.since(seq)
                remaining = deadline - time.monotonic()
                if found or remaining <= 0 or self._closed.is_set():
                    return found
                self._events_cond.wait(min(remaining, 1.0))

    def metrics_text(self) -> str:
        """``GET /metrics``: the Prometheus text exposition of the services and leases."""
        now = time.monotonic()
        with self._lock:
            rows = [self._sched.status_row(name, now) for name in self._sched.order]
        with self._events_cond:
            return metrics.render(self._metrics, rows, time.time() - self._started_at, STATES, self._events.last_seq)

    # ------------------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        """The broker and every service, as ``GET /status`` answers."""
        now = time.monotonic()
        with self._lock:
            services = []
            for name in self._sched.order:
                row = self._sched.status_row(name, now)
                row.update(self._sched.who(name, now))
                proc = self._procs.get(name)
                spec = self.specs.get(name)
                row["pid"] = proc.pid if proc is not None else None
                row["port"] = spec.port if spec is not None else self._sched.service(name).placement.port
                services.append(row)
            runs = [{"run": w.run, "pid": w.pid, "scoped_resets": len(w.resets)} for w in self._runs.values()]
        from harness.runtime.inventory import gpu_memory_by_pid, tree_gpu_memory

        gpu_usage = gpu_memory_by_pid() if any(row["pid"] is not None for row in services) else None
        for row in services:
            usage = supervisor.tree_usage(row["pid"]) if row["pid"] is not None else None
            row["memory_bytes"] = usage[0] if usage is not None else None
            row["gpu_memory_bytes"] = tree_gpu_memory(usage[1] if usage is not None else None, gpu_usage)
        return {
            "broker": {
                "url": self.address if self._server is not None else None,
                "pid": os.getpid(),
                "started": self._started_at,
                "state_dir": str(self.state_dir),
                "up": self._up_state,
                "up_errors": self._up_errors,
                "closing": self._closing,
                "lease_seconds": self._sched.lease_seconds,
                "gpu_wait_seconds": self.gpu_wait_seconds,
                "runs": runs,
            },
            "services": services,
        }

    # ------------------------------------------------------------------------ serving

    @property
    def address(self) -> str:
        """The broker's base URL (``http://127.0.0.1:PORT``); binds the socket if needed."""
        server = self._bind()
        host, port = server.server_address[:2]
        # An AF_INET server's address is (str, int); typeshed allows bytes for AF_UNIX.
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def _bind(self) -> ThreadingHTTPServer:
        if self._server is None:
            existing = read_state(self.state_dir)
            if existing is not None and existing.get("pid") != os.getpid():
                raise HarnessError(
                    f"a broker already serves this state folder at {existing['url']} (pid {existing['pid']})",
                    hint="harness down, or use another state folder",
                )
            server = _Server((self._host, self._port), _Handler)
            server.broker = self
            server.token = self.token.encode()
            port = server.server_address[1]
            loopback = self._host in ("127.0.0.1", "localhost", "::1")
            # Loopback only answers requests addressed to loopback: a web page that rebinds
            # a name of its own to 127.0.0.1 sends its own name as Host and is refused.
            server.allowed_hosts = (
                frozenset({f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}) if loopback else None
            )
            self._server = server
        return self._server

    def _ensure_housekeeping(self) -> None:
        if self._house is None:
            self._house = threading.Thread(target=self._housekeeping, name="broker-housekeeping", daemon=True)
            self._house.start()
            threading.Thread(target=self._health_checks, name="broker-health", daemon=True).start()

    def client_env(self) -> dict[str, str]:
        """What a process needs to reach this broker: ``HARNESS_BROKER`` and its token."""
        return {"HARNESS_BROKER": self.address, "HARNESS_BROKER_TOKEN": self.token}

    def _write_state(self) -> None:
        write_token(self.state_dir, self.token)  # before broker.json: whoever finds one finds both
        create_time = psutil.Process().create_time()
        supervisor._write_json_atomically(
            self.state_dir / STATE_FILE,
            {
                "harness": STATE_MARKER,
                "url": self.address,
                "pid": os.getpid(),
                "create_time": create_time,
                "started": self._started_at,
                "services": [p.name for p in self.plan.services],
            },
        )

    def serve_in_thread(self) -> str:
        """Serve HTTP on a daemon thread; write ``broker.json``; return :attr:`address`."""
        server = self._bind()
        self._write_state()
        self._ensure_housekeeping()
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="broker-http", daemon=True
        )
        self._serving = True
        thread.start()
        self._threads.append(thread)
        return self.address

    def serve_forever(self) -> None:
        """Serve HTTP in this thread until :meth:`shutdown` (e.g. from ``POST /shutdown``).

        :meth:`shutdown` must then come from another thread (a signal handler should start
        one), since it waits for this loop to end.
        """
        server = self._bind()
        self._write_state()
        self._ensure_housekeeping()
        self._serving = True
        server.serve_forever(poll_interval=0.1)
        self._closed.wait()

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Block until :meth:`shutdown` has finished."""
        return self._closed.wait(timeout)

    def shutdown(self) -> None:
        """Refuse new acquires, stop every service process it started, stop serving.

        Waits for starts in progress (bounded by their ``load_seconds``) so that no process
        is left behind; foreign and external services are left alone. Idempotent.
        """
        if self._closing:
            self._closed.wait()
            return
        self._closing = True
        with self._lock:
            self._sched.close()  # waiters are refused with "closing"
            for cond in self._conds.values():
                cond.notify_all()
        stoppers = []
        for group in list(self._sched.groups.values()):

            def stop_group(group: GroupState = group) -> None:
                cond = self._conds[group.name]
                with cond:
                    while group.busy:  # a start in progress ends within its load_seconds
                        cond.wait(0.1)
                    for name in group.members:
                        if name in self._procs:
                            self._execute(group, self._sched.stop(name, "shutdown"))

            thread = threading.Thread(target=stop_group, name=f"stop-{group.name}")
            thread.start()
            stoppers.append(thread)
        for thread in stoppers:
            thread.join()
        if self._watchdog is not None and self._watchdog.stdin is not None:
            try:
                self._watchdog.stdin.write(watchdog.CLEAN_EXIT)
                self._watchdog.stdin.close()
                self._watchdog.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        state = self.state_dir / STATE_FILE
        try:
            if json.loads(state.read_text()).get("pid") == os.getpid():
                state.unlink()
        except (OSError, ValueError):
            pass
        if read_token(self.state_dir) == self.token:
            (self.state_dir / TOKEN_FILE).unlink(missing_ok=True)
        if self._server is not None:
            if self._serving:
                self._server.shutdown()
            self._server.server_close()
        self._closed.set()
        with self._events_cond:
            self._events_cond.notify_all()  # /events streams end


# ----------------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # 200 callers connecting at once must not overflow the listen backlog (default 5),
    # whose dropped SYNs a client only retries after a second.
    request_queue_size = 1024
    broker: Broker
    token: bytes
    allowed_hosts: frozenset[str] | None  # None: not on loopback, any Host (the token still counts)


#: How long a stop pressed in the web UI waits for leases in flight before it is refused (409).
UI_STOP_SECONDS = 10.0
#: Seconds between comment lines on a quiet ``/events`` stream (so proxies and readers see it live).
EVENTS_KEEPALIVE = 15.0


def _ready_wait(query: str) -> float:
    """The seconds ``GET /status?ready=S`` waits at most for the broker's start to be over
    (0: none asked)."""
    values = urllib.parse.parse_qs(query).get("ready")
    if not values:
        return 0.0
    raw = values[-1].strip()
    if not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6})?", raw) or float(raw) > 3600:
        raise BrokerError(400, "bad_request", f"ready must be seconds from 0 to 3600, not {raw[:40]!r}")
    return float(raw)


def _since(query: str, last_event_id: str | None) -> int:
    """The event number an ``/events`` reader has seen: ``?since=N``, else the
    ``Last-Event-ID`` header a reconnecting EventSource sends, else 0 (everything kept)."""
    values = urllib.parse.parse_qs(query).get("since")
    raw = values[-1] if values else last_event_id
    if raw is None or raw == "":
        return 0
    if not re.fullmatch(r"[0-9]{1,18}", raw.strip()):
        raise BrokerError(400, "bad_request", f"since must be an event number >= 0, not {raw[:40]!r}")
    return int(raw.strip())


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


class _Handler(BaseHTTPRequestHandler):
    """One HTTP request: access checks, then the broker's answer.

    Every refusal is a JSON error with a 4xx status (never 500 for what a caller sent):
    403 for a request from a web page (``Origin``) or to a name that is not loopback
    (``Host``), 401 without the broker's token, 400 for a malformed body or field.
    """

    protocol_version = "HTTP/1.1"  # keep-alive: a lease round trip costs no TCP handshake
    disable_nagle_algorithm = True  # headers and body go in separate writes
    timeout = 300  # an idle keep-alive connection's thread ends after this
    server: _Server

    def log_message(self, *_: object) -> None:  # requests are not worth a log line each
        pass

    def _reply(self, status: int, data: Mapping[str, Any]) -> bool:
        body = json.dumps(data).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if status == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="harness broker"')
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            return True
        except OSError:
            return False  # the caller went away

    def _reply_text(self, status: int, text: str, content_type: str) -> None:
        body = text.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the caller went away

    def _stream_events(self, broker: Broker, since: int) -> None:
        """``GET /events``: server-sent events, each the JSON of one event with its number as
        the ``id``, from ``since`` on, until the caller leaves or the broker shuts down."""
        self.close_connection = True
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b": harness broker events\n\n")
            self.wfile.flush()
            while True:
                events = broker.events_since(since, wait=EVENTS_KEEPALIVE)
                if not events:
                    if broker.wait_closed(0):
                        return
                    self.wfile.write(b": keep-alive\n\n")
                for event in events:
                    since = int(event["seq"])
                    data = json.dumps(event, separators=(",", ":"))
                    self.wfile.write(f"id: {since}\nevent: {event['event']}\ndata: {data}\n\n".encode())
                self.wfile.flush()
        except OSError:
            return  # the reader went away

    def _refuse(self, exc: BrokerError) -> None:
        if exc.status in (400, 401, 403, 413):
            self.close_connection = True  # the body may be unread: the stream is not trusted
        self._reply(exc.status, exc.as_json())

    def _check_access(self) -> RunWatch | None:
        """Host, then Origin, then the token; raises :class:`BrokerError` (403, 401). Returns
        the joined run whose token was sent (None: the owner's token)."""
        allowed = self.server.allowed_hosts
        host = self.headers.get("Host")
        if allowed is not None and host not in allowed:
            raise BrokerError(403, "forbidden", f"Host {host!r} is not this broker's loopback address")
        origin = self.headers.get("Origin")
        if origin is not None:
            raise BrokerError(403, "forbidden", f"requests from a web page (Origin {origin!r}) are refused")
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        presented = given.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() == "bearer":
            if hmac.compare_digest(presented, self.server.token):
                return None
            run = self.server.broker.run_of(presented)
            if run is not None:
                return run
        raise BrokerError(
            401,
            "unauthorized",
            "this broker answers only its owner: send 'Authorization: Bearer TOKEN' "
            f"with the token of {TOKEN_FILE} in its state folder "
            "(the client reads it, or $HARNESS_BROKER_TOKEN)",
        )

    def _body(self) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding"):
            raise BrokerError(400, "bad_request", "send the body with Content-Length, not Transfer-Encoding")
        raw_length = (self.headers.get("Content-Length") or "0").strip()
        if not re.fullmatch(r"[0-9]{1,12}", raw_length):
            raise BrokerError(400, "bad_request", f"bad Content-Length {raw_length[:40]!r}")
        length = int(raw_length)
        if length > MAX_BODY:
            raise BrokerError(413, "bad_request", f"request body too large ({length} bytes; at most {MAX_BODY})")
        raw = self.rfile.read(length) if length else b"{}"
        if len(raw) < length:
            raise BrokerError(400, "bad_request", f"the body ended after {len(raw)} of {length} bytes")
        try:
            data = json.loads(raw or b"{}")
        except (ValueError, RecursionError):
            raise BrokerError(400, "bad_request", "the body is not JSON") from None
        if not isinstance(data, dict):
            raise BrokerError(400, "bad_request", "the body must be a JSON object")
        return data

    def do_GET(self) -> None:
        broker = self.server.broker
        if self.path == "/health":  # open: readiness probes carry no secret
            self._reply(200, {"status": "ok", "pid": os.getpid()})
            return
        if self.path == "/ui" or self.path.startswith(("/ui/", "/ui?")):
            self._ui("GET")
            return
        try:
            self._check_access()
            path, _, query = self.path.partition("?")
            if path == "/status":
                ready = _ready_wait(query)
                if ready:
                    broker.wait_ready(ready)
                self._reply(200, broker.status())
            elif path == "/plan":
                self._reply(200, {"plan": broker.plan.as_json(), "launch": broker.launches()})
            elif path == "/metrics":
                self._reply_text(200, broker.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/events":
                self._stream_events(broker, _since(query, self.headers.get("Last-Event-ID")))
            else:
                raise BrokerError(404, "not_found", f"no such endpoint: GET {self.path}")
        except BrokerError as exc:
            self._refuse(exc)
        except Exception as exc:  # a bug: answer rather than drop the connection
            self._reply(500, {"error": f"internal error: {type(exc).__name__}: {exc}", "code": "internal"})

    def do_POST(self) -> None:
        broker = self.server.broker
        if self.path.startswith("/ui/"):
            self._ui("POST")
            return
        try:
            run = self._check_access()
            data = self._body()
            if run is not None and self.path not in ("/acquire", "/release"):
                raise BrokerError(
                    403, "forbidden", f"a run's token may only acquire and release leases, not POST {self.path}"
                )
            if self.path == "/acquire":
                self._acquire(broker, data, run)
            elif self.path == "/release":
                lease_id = data.get("lease")
                if not isinstance(lease_id, str) or not 0 < len(lease_id) <= 200:
                    raise BrokerError(400, "bad_request", 'release needs {"lease": id}')
                broker.release(lease_id)
                self._reply(200, {"released": lease_id})
            elif self.path == "/start":
                names = data.get("names")
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise BrokerError(400, "bad_request", 'start needs {"names": [service, ...]}')
                unknown = sorted(set(names) - set(broker.specs))
                if unknown:
                    raise BrokerError(404, "unknown_service", f"this broker launches no {', '.join(unknown)}")
                results = broker.start(names, check_leftovers=False)
                self._reply(200, {"results": results, "status": broker.status()})
            elif self.path == "/stop":
                self._stop(broker, data)
            elif self.path == "/add":
                placements, specs = _services_to_add(data)
                broker.add_services(placements, specs)
                self._reply(200, {"status": broker.status()})
            elif self.path == "/remove":
                names = data.get("names")
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise BrokerError(400, "bad_request", 'remove needs {"names": [service, ...]}')
                broker.remove_services(names)
                self._reply(200, {"status": broker.status()})
            elif self.path == "/runs":
                name, pid = data.get("run"), data.get("pid")
                if not isinstance(name, str) or not 0 < len(name) <= 200:
                    raise BrokerError(400, "bad_request", 'runs needs {"run": id}')
                if pid is not None and not _positive_int(pid):
                    raise BrokerError(400, "bad_request", f'"pid" must be a positive integer, not {pid!r}')
                kept = data.get("token")  # only the owner's token gets here: a run's is refused above
                if kept is not None and not (isinstance(kept, str) and re.fullmatch(r"[A-Za-z0-9_-]{32,200}", kept)):
                    raise BrokerError(400, "bad_request", '"token" must be 32 to 200 URL-safe characters')
                self._reply(200, {"token": broker.register_run(name, pid, kept)})
            elif self.path == "/runs/end":
                name = data.get("run")
                if not isinstance(name, str) or not 0 < len(name) <= 200:
                    raise BrokerError(400, "bad_request", 'runs/end needs {"run": id}')
                resets, events = broker.end_run(name)
                self._reply(200, {"scoped_resets": resets, "events": events})
            elif self.path == "/ui-login":  # the owner's token only: a run's was refused above
                self._reply(200, {"url": f"{broker.address}/ui/login?code={broker.ui.new_code()}"})
            elif self.path == "/shutdown":
                self._reply(200, {"shutting_down": True})
                # Not on this thread: shutdown() waits for serve_forever, which waits for us.
                threading.Thread(target=broker.shutdown, name="broker-shutdown").start()
            else:
                raise BrokerError(404, "not_found", f"no such endpoint: POST {self.path}")
        except BrokerError as exc:
            self._refuse(exc)
        except Exception as exc:  # a bug: answer rather than drop the connection
            self._reply(500, {"error": f"internal error: {type(exc).__name__}: {exc}", "code": "internal"})

    # ------------------------------------------------------------------------ web UI

    def _send(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the caller went away

    def _ui(self, method: str) -> None:
        """A request under ``/ui`` (:mod:`harness.runtime.webui`): the login, else the session
        cookie (or the owner's token) and, for a POST, the page's origin and CSRF token."""
        broker = self.server.broker
        path, _, query = self.path.partition("?")
        port = int(self.server.server_address[1])
        try:
            if self.server.allowed_hosts is None:  # a broker bound to another address than loopback
                raise BrokerError(403, "forbidden", "the web UI is served on loopback only (127.0.0.1)")
            if method == "GET" and path == "/ui/login":
                self._ui_login(broker, query, port)
                return
            request = webui.UiRequest(
                method,
                self.headers.get("Host"),
                self.headers.get("Origin"),
                self.headers.get("Sec-Fetch-Site"),
                self.headers.get("Cookie"),
                self.headers.get("Authorization"),
                self.headers.get(webui.CSRF_HEADER),
            )
            session = webui.check_ui(
                request, port=port, allowed_hosts=self.server.allowed_hosts, token=self.server.token, sessions=broker.ui
            )
            if method == "POST":
                self._ui_post(broker, path, self._body())
            else:
                self._ui_get(broker, path, query, session)
        except BrokerError as exc:
            self._refuse(exc)
        except Exception as exc:  # a bug: answer rather than drop the connection
            self._reply(500, {"error": f"internal error: {type(exc).__name__}: {exc}", "code": "internal"})

    def _ui_login(self, broker: Broker, query: str, port: int) -> None:
        allowed = self.server.allowed_hosts
        if allowed is not None and self.headers.get("Host") not in allowed:
            raise BrokerError(
                403, "forbidden", f"Host {self.headers.get('Host')!r} is not this broker's loopback address"
            )
        code = (urllib.parse.parse_qs(query).get("code") or [""])[0]
        session = broker.ui.redeem(code) if code else None
        if session is None:
            raise BrokerError(
                403, "forbidden", "this login URL was used already or has expired: run `harness ui` again"
            )
        self._send(303, b"", "text/plain", {"Location": "/ui", "Set-Cookie": webui.session_cookie(port, session)})

    def _ui_get(self, broker: Broker, path: str, query: str, session: str | None) -> None:
        if path in ("/ui", "/ui/"):
            csrf = broker.ui.csrf(session) if session is not None else ""
            self._send(
                200, webui.page(csrf), "text/html; charset=utf-8", {"Content-Security-Policy": webui.PAGE_POLICY}
            )
        elif path.removeprefix("/ui/") in webui.ASSETS:
            body, content_type = webui.asset(path.removeprefix("/ui/"))
            self._send(200, body, content_type)
        elif path == "/ui/api/status":
            self._reply(200, broker.status())
        elif path == "/ui/api/events":
            self._stream_events(broker, _since(query, self.headers.get("Last-Event-ID")))
        elif path == "/ui/api/logs":
            self._reply(200, webui.read_log(broker.state_dir, urllib.parse.parse_qs(query)))
        elif path == "/ui/api/runs":
            self._reply(200, {"runs": webui.recent_runs(broker.runs_dir), "known": broker.runs_dir is not None})
        elif (found := re.fullmatch(r"/ui/runs/([^/]+)/report", path)) is not None:
            body = webui.report_file(broker.runs_dir, found.group(1)).read_bytes()
            self._send(200, body, "text/html; charset=utf-8", {"Content-Security-Policy": webui.REPORT_POLICY})
        else:
            raise BrokerError(404, "not_found", f"no such page: GET {path}")

    def _ui_post(self, broker: Broker, path: str, data: Mapping[str, Any]) -> None:
        action = path.removeprefix("/ui/api/")
        if action not in ("start", "stop", "restart"):
            raise BrokerError(404, "not_found", f"no such endpoint: POST {path}")
        name = webui.service_name(data)
        if name not in broker.served():
            raise BrokerError(404, "unknown_service", f"this broker serves no {name}")
        results: dict[str, Any] = {}
        if action in ("stop", "restart"):
            results["stop"] = broker.stop_service(name, UI_STOP_SECONDS)
        if action in ("start", "restart"):
            if name not in broker.specs:
                raise BrokerError(409, "not_local", f"{name} is not started by this broker")
            results["start"] = broker.start([name], check_leftovers=False)[name]
        self._reply(200, {"service": name, "action": action, "results": results})

    def _stop(self, broker: Broker, data: Mapping[str, Any]) -> None:
        names, timeout = data.get("names"), data.get("timeout", 60.0)
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise BrokerError(400, "bad_request", 'stop needs {"names": [service, ...]}')
        if not _number(timeout):
            raise BrokerError(400, "bad_request", f'"timeout" must be a number of seconds >= 0, not {timeout!r}')
        unknown = sorted(set(names) - broker.served())
        if unknown:
            raise BrokerError(404, "unknown_service", f"this broker serves no {', '.join(unknown)}")
        results = {name: broker.stop_service(name, float(timeout)) for name in names}
        self._reply(200, {"results": results, "status": broker.status()})

    def _acquire(self, broker: Broker, data: Mapping[str, Any], run: RunWatch | None) -> None:
        service = data.get("service")
        if not isinstance(service, str) or not service:
            raise BrokerError(400, "bad_request", 'acquire needs {"service": name}')
        client = data.get("client", "anonymous")
        if not isinstance(client, str) or len(client) > 200:
            raise BrokerError(400, "bad_request", '"client" must be a string of at most 200 characters')
        pid, timeout = data.get("pid"), data.get("timeout")
        if pid is not None and not _positive_int(pid):
            raise BrokerError(400, "bad_request", f'"pid" must be a positive integer, not {pid!r}')
        if timeout is not None and not _number(timeout):
            raise BrokerError(400, "bad_request", f'"timeout" must be a number of seconds >= 0, not {timeout!r}')
        lease = broker.acquire(
            service,
            client or "anonymous",
            client_pid=pid,
            timeout=None if timeout is None else float(timeout),
            run=None if run is None else run.run,
        )
        if not self._reply(200, lease):
            broker.release(lease["lease"])  # nobody will ever release it
        elif run is not None:  # a joined run's lease: one its command holds
            run.observe(lease, client or "anonymous")


def _services_to_add(data: Mapping[str, Any]) -> tuple[list[ServicePlacement], dict[str, LaunchSpec]]:
    """The placements and launch specs of a ``POST /add`` body; 400 when malformed."""
    entries = data.get("services")
    if not isinstance(entries, list) or not entries:
        raise BrokerError(400, "bad_request", 'add needs {"services": [{"placement": ..., "spec": ...}, ...]}')
    placements, specs = [], {}
    try:
        for entry in entries:
            placement = ServicePlacement(**entry["placement"])
            placements.append(placement)
            if entry.get("spec") is not None:
                spec = LaunchSpec.from_json(entry["spec"])
                if spec.name != placement.name:
                    raise ValueError(f"spec {spec.name!r} for placement {placement.name!r}")
                specs[placement.name] = spec
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BrokerError(400, "bad_request", f"a service to add is malformed: {type(exc).__name__}: {exc}") from None
    return placements, specs


# ---------------------------------------------------------------- state-folder helpers


def read_state(state_dir: Path) -> dict[str, Any] | None:
    """The live broker's ``broker.json`` for ``state_dir``, or None.

    None when there is no file, it is not ours, or its process is gone (a broker killed
    with SIGKILL leaves a stale file; its pid is checked with its create time). Not ours: a
    file this user did not write (another member of a shared home can make the state folder
    of a project before its owner first uses it, and plant a ``broker.json`` naming a broker
    of theirs, which this user's runs would then use), a link, or garbage.
    """
    from harness.store.entries import read_own

    raw = read_own(Path(state_dir) / STATE_FILE, limit=64 * 1024)
    try:
        data = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("harness") != STATE_MARKER:
        return None
    try:
        process = psutil.Process(int(data["pid"]))
        if abs(process.create_time() - float(data["create_time"])) > 0.05:
            return None
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None
    return data


def broker_address(state_dir: Path) -> str | None:
    """The URL of the broker serving ``state_dir``, or None when none runs."""
    state = read_state(state_dir)
    return None if state is None else str(state["url"])


def write_token(state_dir: Path, token: str) -> Path:
    """Write ``<state>/broker.token`` readable by its owner only (0600), atomically."""
    path = supervisor.make_state_dir(state_dir) / TOKEN_FILE
    supervisor.write_private(path, token + "\n")
    return path


def read_token(state_dir: Path) -> str | None:
    """The token of the broker of ``state_dir`` (None when missing, not readable, or not this
    user's own file: :func:`read_state`)."""
    from harness.store.entries import read_own

    raw = read_own(Path(state_dir) / TOKEN_FILE, limit=4096)
    if raw is None:
        return None
    try:
        return raw.decode().strip() or None
    except UnicodeDecodeError:
        return None


def _http_json(
    method: str, url: str, data: Mapping[str, Any] | None = None, timeout: float = 5.0, token: str | None = None
) -> Any:
    body = None if data is None else json.dumps(data).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def stop_all_from_pidfiles(
    state_dir: Path, *, grace: tuple[float, float] = supervisor.DEFAULT_GRACE
) -> list[dict[str, Any]]:
    """Stop every service process harness started for ``state_dir``, by its pid file.

    For ``harness down`` when the broker is gone. Only processes whose pid file matches
    (marker, pid and create time, or the orphans of that process group) are signalled;
    a recycled pid is left alone. Returns one entry per pid file: name, pid and outcome
    ("SIGINT"/"SIGTERM"/"SIGKILL": what ended it, "gone", "recycled").
    """
    results = []
    for record in supervisor.read_pidfiles(Path(state_dir)):
        outcome = supervisor.stop_recorded(record, grace=grace)
        results.append({"name": record.name, "pid": record.pid, "outcome": outcome})
    return results


def find_brokers(state_dir: Path) -> list[psutil.Process]:
    """Every detached broker process of ``state_dir`` (``python -m harness.runtime.broker
    STATE_DIR``) this user runs, found in the process table, not only the one ``broker.json``
    names: so no broker can run that ``status`` does not show and ``down`` does not stop."""
    wanted = str(Path(state_dir).resolve())
    found = []
    me = os.getpid()
    # Each process's command line only (one read of the process table's entry); its owner and
    # state are asked of the few that run a broker. All three of every process cost a
    # hundredth of a second or more on a busy machine, on the way to every broker's start.
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmd = process.info["cmdline"] or []
            if process.pid == me or "harness.runtime.broker" not in cmd:
                continue
            at = cmd.index("harness.runtime.broker")
            if not (at + 1 < len(cmd) and cmd[at - 1] == "-m" and str(Path(cmd[at + 1]).resolve()) == wanted):
                continue
            if process.uids().real == os.getuid() and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.Error, ValueError, IndexError, AttributeError, OSError):
            continue
    return found


def start_failure(failures: Mapping[str, str], *, hint: str) -> HarnessError:
    """The refusal when services did not come up (``harness up``, ``harness run``): each
    failure's message, which names its service and the cause (a port's holder, an exit, a
    timeout with its log), once; a single failure on the heading's line."""
    lines = [error if error.startswith(name) else f"{name}: {error}" for name, error in sorted(failures.items())]
    heading = f"{len(lines)} service(s) did not start:"
    return HarnessError(heading + (" " if len(lines) == 1 else "\n") + "\n".join(lines), hint=hint)


def failed_up(state_dir: Path, status: Mapping[str, Any]) -> HarnessError | None:
    """After :func:`spawn` (``harness up``): None when every service it was asked for came
    up; else stop what that call started and return the refusal naming each failure.

    What it started is the broker, when it spawned it (``broker.spawned``), with every
    service in it: all of them came up for this call. A broker it joined was running before
    and stays, with what it serves."""
    broker = status.get("broker") or {}
    failed = broker.get("up_errors") or {}
    if not failed:
        return None
    if broker.get("spawned"):
        down(state_dir)
        hint = (
            f"this harness up stopped the broker it started (pid {broker.get('pid')}) and its services; "
            "fix the cause, then harness up again"
        )
    else:
        hint = "fix the cause, then harness up again (the broker it joined stays: harness down stops it)"
        added = [n for n in broker.get("added") or () if n in failed]
        shared = SharedBroker.find(state_dir) if added else None
        if shared is not None:
            try:  # what this up added and did not come up: the broker is left as it found it
                shared.remove(added)
                hint += f"; it no longer serves {', '.join(added)}, which this harness up had added"
            except HarnessError as exc:
                hint += f"; {exc.message}"
    return start_failure(failed, hint=hint)


def down(
    state_dir: Path, *, timeout: float = 60.0, grace: tuple[float, float] = supervisor.DEFAULT_GRACE
) -> dict[str, Any]:
    """Stop every broker of ``state_dir`` and every service harness started there.

    Asks the live broker to shut down (it stops its services) and waits for its process to
    exit, signalling it (SIGTERM, then SIGKILL) if it does not within ``timeout``; signals
    any other broker process of the folder (SIGTERM: it stops its services and exits); then
    stops whatever pid files still name (what a dead broker left running) and removes a
    stale ``broker.json``. Returns ``{"broker": outcome, "brokers": [pid, ...],
    "services": [...]}`` where outcome is "shutdown", "signalled" or "not running".
    """
    state_dir = Path(state_dir)
    outcome = "not running"
    state = read_state(state_dir)
    stopped_brokers: list[int] = []
    if state is not None:
        pid = int(state["pid"])
        try:
            _http_json("POST", f"{state['url']}/shutdown", {}, timeout=5.0, token=read_token(state_dir))
            asked = True
        except (OSError, ValueError):
            asked = False
        outcome = "shutdown" if _wait_or_signal(pid, timeout if asked else 0.1, grace) else "signalled"
        stopped_brokers.append(pid)
    for process in find_brokers(state_dir):  # brokers broker.json does not name
        if process.pid in stopped_brokers:
            continue
        try:
            process.terminate()  # its handler stops its services, then it exits
        except psutil.Error:
            continue
        _wait_or_signal(process.pid, timeout, grace)
        stopped_brokers.append(process.pid)
        if outcome == "not running":
            outcome = "signalled"
    stopped = stop_all_from_pidfiles(state_dir, grace=grace)
    if read_state(state_dir) is None:
        (state_dir / STATE_FILE).unlink(missing_ok=True)
        (state_dir / TOKEN_FILE).unlink(missing_ok=True)
    return {"broker": outcome, "brokers": stopped_brokers, "services": stopped}


def down_services(
    state_dir: Path, names: list[str], *, timeout: float = 60.0, grace: tuple[float, float] = supervisor.DEFAULT_GRACE
) -> dict[str, Any]:
    """Stop the services ``names`` of ``state_dir`` and nothing else (``harness down NAME``):
    through the live broker, which stays; without one, by their pid files. Returns
    ``{"broker": "running" | "not running", "services": [{"name", "outcome"}, ...]}``."""
    shared = SharedBroker.find(state_dir)
    if shared is not None:
        results = shared.stop(names, timeout)
        return {"broker": "running", "services": [{"name": n, "outcome": results.get(n, "?")} for n in names]}
    records = {r.name: r for r in supervisor.read_pidfiles(Path(state_dir))}
    services = []
    for name in names:
        record = records.get(name)
        outcome = "not running" if record is None else supervisor.stop_recorded(record, grace=grace)
        services.append({"name": name, "outcome": outcome, "pid": None if record is None else record.pid})
    return {"broker": "not running", "services": services}


def _wait_or_signal(pid: int, timeout: float, grace: tuple[float, float]) -> bool:
    """Wait for process ``pid`` to exit; SIGTERM then SIGKILL it after ``timeout``.
    True when it exited on its own."""
    try:
        process = psutil.Process(pid)
        try:
            process.wait(timeout)
            return True
        except psutil.TimeoutExpired:
            process.terminate()
            try:
                process.wait(grace[1])
            except psutil.TimeoutExpired:
                process.kill()
                process.wait(5)
            return False
    except psutil.NoSuchProcess:
        return True


def status(state_dir: Path) -> dict[str, Any]:
    """What runs for ``state_dir``: the broker's ``/status``, or the pid files without one.

    Without a live broker the answer is ``{"broker": None, "services": [...]}`` with, per
    pid file, its name, pid, port, whether it is alive and its log. ``brokers`` lists every
    broker process of the folder found in the process table (normally the one).
    """
    state = read_state(state_dir)
    brokers = [p.pid for p in find_brokers(state_dir)]
    if state is not None:
        try:
            current = _http_json("GET", f"{state['url']}/status", timeout=10.0, token=read_token(state_dir))
            current["brokers"] = brokers
            return dict(current)
        except (OSError, ValueError):
            pass
    return {
        "broker": None,
        "brokers": brokers,
        "services": [r.as_json() for r in supervisor.read_pidfiles(Path(state_dir))],
    }


def nvml_free_gb(index: int) -> float | None:
    """Free memory (GB) of GPU ``index`` as NVML reports it now; None without NVML or GPU."""
    from harness.runtime.inventory import detect_gpus

    return next((gpu.free_gb for gpu in detect_gpus() if gpu.index == index), None)


def port_holder(port: int) -> str:
    """Who listens on TCP ``port``: "pid N of uid U (user): command" where ``/proc`` shows
    it, else the user alone (:func:`supervisor.port_owners`)."""
    owners = supervisor.port_owners(port)
    if owners:
        return owners[0].describe()
    return "a process harness cannot see"


def launch_identity(spec: LaunchSpec) -> dict[str, Any]:
    """What makes two launches of a service the same: its argv (every store path of its
    interpreter, weights and sources), working folder (its code's store path) and port, which
    make the same process; and its rendered ``client`` table, which every lease hands out.
    ``environment`` (a secret's value as a hash only) is what the process sees: a run that
    joins records it, and it is not compared."""
    return {
        "argv": list(spec.argv),
        "cwd": str(spec.cwd),
        "port": spec.port,
        "client": dict(spec.client),
        "environment": recorded_environment(spec.env, record_key()),
    }


def launch_differences(served: Mapping[str, Any], specs: Mapping[str, LaunchSpec], names: Iterable[str]) -> list[str]:
    """Why a broker whose ``GET /plan`` launches are ``served`` cannot serve ``names`` as
    ``specs`` would launch them (one line per service; empty when it can)."""
    problems = []
    for name in sorted(names):
        mine = launch_identity(specs[name])
        theirs = served.get(name)
        if theirs is None:
            problems.append(f"{name}: not among the services it launches")
            continue
        for key in ("argv", "cwd", "port"):
            if theirs.get(key) != mine[key]:
                problems.append(f"{name}: it runs {key} {theirs.get(key)!r}, this project wants {mine[key]!r}")
                break
        else:
            # A broker from before client tables hands out none: the same as an empty table.
            if theirs.get("client", {}) != mine["client"]:
                problems.append(
                    f"{name}: its leases give the client table {theirs.get('client', {})!r}, "
                    f"this project's is {mine['client']!r}"
                )
    return problems


class SharedBroker:
    """A live broker of a state folder that a run or a later ``harness up`` joins."""

    def __init__(self, state_dir: Path, state: Mapping[str, Any]) -> None:
        self.state_dir = Path(state_dir)
        self.url = str(state["url"])
        self.pid = int(state["pid"])
        token = read_token(self.state_dir)
        if token is None:
            raise HarnessError(
                f"a broker (pid {self.pid}) serves {self.state_dir}, but its token "
                f"{self.state_dir / TOKEN_FILE} cannot be read",
                hint="it belongs to another user: use a state folder of your own",
            )
        self.token = token
        #: What it launches (``GET /plan``), once :meth:`check_serves` has asked.
        self.launches: dict[str, Any] = {}

    @classmethod
    def find(cls, state_dir: Path) -> SharedBroker | None:
        """The live broker of ``state_dir``, or None."""
        state = read_state(state_dir)
        return None if state is None else cls(state_dir, state)

    def request(
        self, method: str, path: str, data: Mapping[str, Any] | None = None, timeout: float = 10.0
    ) -> dict[str, Any]:
        """The broker's JSON answer to ``method path`` (an object); a refusal or no answer is a
        :class:`HarnessError`."""
        try:
            answer = _http_json(method, self.url + path, data, timeout=timeout, token=self.token)
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", str(exc))
            except (OSError, ValueError, AttributeError):
                message = str(exc)
            raise HarnessError(f"the broker of {self.state_dir} refused {method} {path}: {message}") from None
        except (OSError, ValueError) as exc:
            raise HarnessError(f"the broker of {self.state_dir} at {self.url} does not answer: {exc}") from None
        if not isinstance(answer, dict):
            raise HarnessError(f"the broker of {self.state_dir} answered {method} {path} with no JSON object")
        return answer

    def client_env(self) -> dict[str, str]:
        return {"HARNESS_BROKER": self.url, "HARNESS_BROKER_TOKEN": self.token}

    def check_serves(self, specs: Mapping[str, LaunchSpec], names: Iterable[str]) -> None:
        """Raise HarnessError unless this broker launches ``names`` exactly as ``specs`` do."""
        self.launches = dict(self.request("GET", "/plan").get("launch") or {})
        problems = launch_differences(self.launches, specs, names)
        if problems:
            raise HarnessError(
                f"the broker of {self.state_dir} (pid {self.pid}, started by harness up) does not serve "
                "what this project would launch:\n  " + "\n  ".join(problems),
                hint="harness down, then harness up (or run) again with this project",
            )

    def join_run(self, run: str, pid: int, token: str | None = None) -> dict[str, str]:
        """Register run ``run`` (process ``pid``) with this broker: what its command needs to
        reach it, with a token of the run's own whose leases the broker watches for resets of
        scoped services (:meth:`end_run` hands them back); ``token``: the one its command holds
        from a broker of this folder that is gone, kept."""
        try:
            body: dict[str, Any] = {"run": run, "pid": pid}
            if token is not None:
                body["token"] = token
            answer = self.request("POST", "/runs", body)
        except HarnessError as exc:
            raise HarnessError(
                f"{exc.message}: this broker cannot record the run's scoped resets",
                hint="it was started by an older harness: harness down, then harness up again",
            ) from None
        return {"HARNESS_BROKER": self.url, "HARNESS_BROKER_TOKEN": str(answer["token"])}

    def end_run(self, run: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The scoped resets the broker saw in run ``run``'s leases, and its events since the
        run joined (none from a broker before they were sent); the run's token ends."""
        answer = self.request("POST", "/runs/end", {"run": run}, timeout=30.0)
        resets, events = answer.get("scoped_resets"), answer.get("events")
        return (
            [r for r in resets if isinstance(r, dict)] if isinstance(resets, list) else [],
            [e for e in events if isinstance(e, dict)] if isinstance(events, list) else [],
        )

    def add_missing(self, plan: Plan, specs: Mapping[str, LaunchSpec], names: Iterable[str]) -> list[str]:
        """Have the broker serve those of ``names`` it does not launch yet (``harness up NAME``
        beside a broker started for other services); the names added."""
        launches = self.launches or dict(self.request("GET", "/plan").get("launch") or {})
        missing = [n for n in names if n not in launches and n in specs]
        if missing:
            placed = {p.name: p for p in plan.services}
            body = [{"placement": dataclasses.asdict(placed[n]), "spec": specs[n].as_json()} for n in sorted(missing)]
            # The environment goes whole, to this user's own broker on loopback (as a spawned
            # broker inherits it): it is written to no file.
            self.request("POST", "/add", {"services": body})
            self.launches = dict(self.request("GET", "/plan").get("launch") or {})
        return missing

    def remove(self, names: list[str]) -> None:
        """Have the broker serve ``names`` no more (the ones a failed ``harness up`` added)."""
        self.request("POST", "/remove", {"names": names}, timeout=120.0)

    def stop(self, names: list[str], timeout: float = 60.0) -> dict[str, str]:
        """Stop ``names`` in this broker, which stays (``harness down NAME``): name → outcome."""
        answer = self.request("POST", "/stop", {"names": names, "timeout": timeout}, timeout=timeout + 30)
        return {str(k): str(v) for k, v in (answer.get("results") or {}).items()}

    def start(self, names: list[str], timeout: float) -> dict[str, Any]:
        """Bring ``names`` up in this broker; its ``/status`` with this call's errors."""
        answer = self.request("POST", "/start", {"names": names}, timeout=timeout)
        status = dict(answer["status"])
        status["broker"]["up_errors"] = {n: e for n, e in answer["results"].items() if e is not None}
        return status


# ---------------------------------------------------------- a broker in its own process


def ui_login_url(state_dir: Path) -> str:
    """A one-time URL of the web UI of ``state_dir``'s broker (``harness ui``): opened once,
    within :data:`webui.CODE_SECONDS`, it logs that browser in (:mod:`harness.runtime.webui`)."""
    shared = SharedBroker.find(state_dir)
    if shared is None:
        raise HarnessError(f"no broker serves {state_dir}", hint="harness up starts one")
    return str(shared.request("POST", "/ui-login", {})["url"])


def plan_from_json(data: Mapping[str, Any]) -> Plan:
    """Inverse of :meth:`Plan.as_json`."""
    return Plan(
        services=tuple(ServicePlacement(**s) for s in data.get("services", ())),
        sim_workers=tuple(SimWorker(**w) for w in data.get("sim_workers", ())),
        gpus=tuple(Gpu(**g) for g in data.get("gpus", ())),
        notes=tuple(data.get("notes", ())),
        simulator=RemoteSimulator(**data["simulator"]) if data.get("simulator") else None,
    )


def spawn(
    plan: Plan,
    specs: Mapping[str, LaunchSpec],
    state_dir: Path,
    *,
    names: Iterable[str] | None = None,
    python: str = sys.executable,
    timeout: float | None = None,
    options: Mapping[str, Any] | None = None,
    parked: Parked | None = None,
) -> dict[str, Any]:
    """Bring services up in the broker of ``state_dir``, starting it if none runs (``harness up``).
    ``broker.spawned`` in the answer says whether this call started the broker.

    One broker per state folder: a lock file (``broker.lock``) makes concurrent callers
    agree, and whoever finds a live broker joins it — it must launch ``names`` exactly as
    ``specs`` do (else HarnessError) and is asked to bring them up. A new broker runs
    ``python -m harness.runtime.broker STATE_DIR`` in its own session (so it outlives the
    caller), logs to ``<state>/logs/broker.log``, serves at once and then starts the plan's
    resident services (or ``names``). Returns its ``/status`` once they are up or failed:
    ``broker.up_errors`` names each failure of this call. ``timeout`` defaults to the sum
    of the services' ``load_seconds`` plus 30 s.

    ``parked`` (:func:`harness.runtime.parking.park`): a broker process of ``state_dir`` started ahead, its Python up
    and its modules imported; it becomes the broker if one must start, and is ended (having
    started nothing) if not.
    """
    state_dir = supervisor.make_state_dir(Path(state_dir))
    if timeout is None:
        timeout = 30.0 + sum(s.load_seconds for s in specs.values())
    wanted = list(names) if names is not None else [p.name for p in plan.services if p.mode == "resident"]
    log = state_dir / "logs" / "broker.log"
    try:
        with FileLock(str(state_dir / LOCK_FILE), timeout=60, mode=0o600):
            shared = SharedBroker.find(state_dir)
            if shared is None:
                # A parked process (ours or another caller's) has started nothing: not a stray.
                strays = [p for p in find_brokers(state_dir) if not _parked_waiting(p, state_dir)]
                if strays:
                    raise HarnessError(
                        f"broker processes run for {state_dir} without its broker.json: "
                        + ", ".join(f"pid {p.pid}" for p in strays),
                        hint="harness down",
                    )
                ahead = parked if parked is not None and parked.python == python else None
                proc = _start_detached(plan, specs, state_dir, wanted, python, options, log, ahead)
                if ahead is not None:
                    parked = None  # handed its plan: the broker now (else ended in the finally)
                _wait_serving(proc, state_dir, log, timeout)
    except Timeout:
        raise HarnessError(
            f"another harness up holds {state_dir / LOCK_FILE} for over 60 s", hint="wait for it, or harness down"
        ) from None
    finally:
        if parked is not None:  # a broker served already, or this call failed first
            parked.discard()
    if shared is not None:
        added = shared.add_missing(plan, specs, wanted)
        shared.check_serves(specs, wanted)
        joined = shared.start(wanted, timeout)
        joined["broker"]["spawned"] = False
        joined["broker"]["added"] = added
        return joined
    return _await_started(proc, state_dir, log, time.monotonic() + timeout, timeout)


def _await_started(
    proc: subprocess.Popen[bytes], state_dir: Path, log: Path, deadline: float, timeout: float
) -> dict[str, Any]:
    """The ``/status`` of the broker :func:`spawn` started as ``proc`` once its services are up
    or failed: one ``GET /status?ready=S``, which the broker answers as its start ends, in
    place of a look every few hundredths of a second (each cost the broker a request while
    its services started beside it, and came up to one interval after they were up)."""
    token = read_token(state_dir)
    while time.monotonic() < deadline:
        state = _serving_state(proc, state_dir, log)
        if state is not None:
            left = max(0.0, deadline - time.monotonic())
            try:
                current = _http_json("GET", f"{state['url']}/status?ready={left:.3f}", timeout=left + 5.0, token=token)
            except (OSError, ValueError):
                current = None  # ending, or its answer was cut: look again while it lives
            if current is not None and current["broker"]["up"] == "ready":
                current["broker"]["spawned"] = True
                return dict(current)
        time.sleep(0.02)
    raise HarnessError(f"the broker did not bring its services up within {timeout:g} s; log: {log}")


def _start_detached(
    plan: Plan,
    specs: Mapping[str, LaunchSpec],
    state_dir: Path,
    names: list[str],
    python: str,
    options: Mapping[str, Any] | None,
    log: Path,
    parked: Parked | None = None,
) -> subprocess.Popen[bytes]:
    # A parked broker already runs with the environment it was started with.
    env = parked.env if parked is not None else broker_env()
    # The broker inherits ``env``: each service's environment is written relative to it, so
    # the file names the caller's secrets without holding them (DESIGN invariant 12).
    described, handed = {}, {}
    for name, spec in sorted(specs.items()):
        data = spec.as_json()
        data["env"], private = env_as_delta(data["env"], env)
        described[name] = data
        if private:
            handed[name] = private
    config = {"plan": plan.as_json(), "specs": described, "names": names, "options": dict(options or {})}
    supervisor._write_json_atomically(state_dir / CONFIG_FILE, config)
    if parked is not None:
        return parked.launch(handed)
    if handed:
        env[HANDED_SECRETS] = json.dumps(handed)
    return start_broker_process(python, state_dir, env, log, subprocess.DEVNULL)


def _parked_waiting(process: psutil.Process, state_dir: Path) -> bool:
    try:
        return waiting_parked(process.cmdline(), state_dir)
    except psutil.Error:
        return False


def _serving_state(proc: subprocess.Popen[bytes], state_dir: Path, log: Path) -> dict[str, Any] | None:
    """One look at a broker started detached as ``proc``: its ``broker.json`` once it has
    written it (it serves), None before then (or while the file is another pid's).

    Raises :class:`~harness.runtime.supervisor.ServiceStartError`, with the exit and the
    tail of ``log``, once ``proc`` has exited: it will never serve."""
    if proc.poll() is not None:
        raise supervisor.ServiceStartError(
            f"the broker exited with {supervisor._describe_exit(proc.returncode)}; log: {log}",
            log_tail=supervisor.log_tail(log),
        )
    state = read_state(state_dir)
    return state if state is not None and state.get("pid") == proc.pid else None


def _wait_serving(proc: subprocess.Popen[bytes], state_dir: Path, log: Path, timeout: float) -> None:
    """Wait until the new broker has written ``broker.json`` (it serves: others may join)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _serving_state(proc, state_dir, log) is not None:
            return
        time.sleep(0.005)  # a look is one small file read; the broker serves within hundredths
    proc.terminate()
    raise HarnessError(f"the broker did not start serving within {timeout:g} s; log: {log}")


def _import_start_path() -> None:
    """What a broker imports only as it starts its first service (the launch check of its
    closure and the store it reads, the GPU inventory, the codec of a URL's host name),
    imported by a parked one while it waits: not after it is handed its plan, when every
    hundredth of a second is on its caller's way to a started service."""
    import encodings.idna  # noqa: F401
    import harness.runtime.inventory
    import harness.store.hashing
    import harness.store.launchcheck
    import harness.store.store  # noqa: F401


def _await_plan() -> dict[str, dict[str, str]] | None:
    """A parked broker's wait (:mod:`harness.runtime.parking`): the secrets :meth:`Parked.launch` hands over
    once ``broker-config.json`` is written, or None when its stdin closes unhanded."""
    line = sys.stdin.buffer.readline()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # what it starts reads nothing of the pipe
    os.close(devnull)
    try:
        told = json.loads(line) if line.strip() else None
    except ValueError:
        return None
    if not isinstance(told, dict) or told.get("serve") is not True:
        return None
    return dict(told.get("secrets") or {})


def _main(argv: list[str] | None = None) -> int:
    """Entry of a detached broker: ``python -m harness.runtime.broker STATE_DIR``."""
    parser = argparse.ArgumentParser(prog="python -m harness.runtime.broker")
    parser.add_argument("state_dir", type=Path)
    parser.add_argument(
        "--parked", metavar="TOKEN", help="started ahead (harness.runtime.parking): wait on stdin to be handed a plan"
    )
    args = parser.parse_args(argv)
    handed = json.loads(os.environ.pop(HANDED_SECRETS, "") or "{}")
    if args.parked:
        _import_start_path()
        told = _await_plan()
        if told is None:  # discarded (or its caller died): nothing was started
            if args.parked.isalnum():
                (args.state_dir / f"{PARKED_PREFIX}{args.parked}").unlink(missing_ok=True)
            return 0
        handed = told
    config = json.loads((args.state_dir / CONFIG_FILE).read_text())
    base = dict(os.environ)  # what spawn() gave us: the services' environments are told against it
    specs = {
        name: LaunchSpec.from_json({**data, "env": env_from_delta(data["env"], base, handed.get(name, {}))})
        for name, data in config["specs"].items()
    }
    options = config.get("options") or {}
    for key in ("grace", "restart_backoff"):
        if options.get(key) is not None:
            options[key] = tuple(options[key])
    broker = Broker(
        plan_from_json(config["plan"]),
        specs,
        args.state_dir,
        log=lambda line: print(f"broker: {line}", flush=True),
        **options,
    )

    def on_signal(signum: int, _frame: object) -> None:
        threading.Thread(target=broker.shutdown, name="signal-shutdown").start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        broker.check_leftovers()  # before serving: a later `up` may start services once we do
    except HarnessError as exc:
        print(f"broker: {exc}", flush=True)
        return 1
    address = broker.serve_in_thread()
    print(f"broker: serving on {address} (pid {os.getpid()})", flush=True)
    try:
        results = broker.start(config.get("names"), check_leftovers=False)
    except HarnessError as exc:
        print(f"broker: {exc}", flush=True)
        broker.shutdown()
        return 1
    for name, error in results.items():
        print(f"broker: {name}: {'ready' if error is None else error}", flush=True)
    while not broker.wait_closed(1.0):
        pass
    print("broker: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
