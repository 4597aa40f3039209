"""The broker's scheduling rules as a pure state machine: events in, decisions out.

:class:`Scheduler` decides who gets a lease, which swap-group member is loaded next, when a
service is stopped for idleness or after a crash, when starts are refused because a service
keeps crashing, and which leases are reclaimed. It never touches a socket, a process, a
thread or the clock: every method that needs the time takes ``now`` (monotonic seconds),
and whatever needs doing outside (start a process, stop one) is returned as a decision —
:class:`Start` or :class:`Stop` — whose outcome the caller reports back with
:meth:`Scheduler.started`, :meth:`Scheduler.start_failed` or :meth:`Scheduler.stopped`.
:mod:`harness.runtime.broker` is the shell that serves it over HTTP and runs the
processes; it calls the scheduler under one lock.

The rules (the broker's documented semantics):

* **Groups.** Services that share one load slot form a group: a swap group
  (``swap = "name"``, local services only) or a single service on its own. At most one
  member of a group has a process at any instant; ``busy`` is true from a :class:`Start`
  or :class:`Stop` decision until its outcome is reported, and nothing else is decided
  for the group meanwhile.
* **Admission order.** Callers wait in one queue per group. The member loaded next is the
  one the oldest waiting caller wants; once it is ready, every caller waiting for it is
  admitted together (they cost no swap); a caller arriving while others wait queues
  behind them even if its member is loaded. Nobody is passed over by later callers for
  another member, and callers of one member are admitted in arrival order.
* **Swaps.** A member with leases in flight is never stopped; its last release lets the
  queue move on.
* **Idle.** An ``on_demand`` service with ``idle_seconds`` is stopped after that long
  with no lease in flight and nobody waiting for it.
* **Crashes.** A ready service whose process exited is recorded as a crash and its group
  stopped; a failed start fails the callers waiting for that member. After
  ``crash_limit`` failures within ``crash_window`` seconds, acquires are refused at once
  (503 ``crashing``) until the window has passed.
* **fresh / incarnation.** ``fresh`` is true on a client's first lease from each process
  start (so a ``scoped`` policy's reset memory is never mistaken for a kept one);
  ``incarnation`` counts starts (0 for external and foreign services).
* **Residents stay up.** A ready ``resident`` service whose health check fails
  ``health_failures`` times in a row is stopped as a crash (:meth:`Scheduler.health`); a
  crashed resident (a crash or a failed start) is started again without waiting for a
  caller (:meth:`Scheduler.restart_due`) after a backoff that doubles with each failure in
  the crash window (``restart_backoff``: first and largest wait), and not while the crash
  limit refuses it. A service stopped by hand (:meth:`Scheduler.unload`, ``harness down
  NAME``) stays stopped until a caller asks for it.
* **Services added** to a running scheduler (:meth:`Scheduler.add`, ``harness up NAME``
  beside a broker that did not launch NAME) join their swap group, or form their own.
* **Lease limits.** With ``lease_seconds``, a lease held longer is reclaimed by
  :meth:`Scheduler.reclaim_overdue`; its holder's later release gets 410
  ``lease_expired`` saying so.
* **external** services are granted at once; **off** ones are refused (409) with the
  plan's reason; **foreign** ones (a port that already answered) are used as they are and
  take no part in their group's one-at-a-time rule.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.errors import HarnessError
from harness.runtime.launch import LaunchSpec
from harness.runtime.plan import ServicePlacement

STATES = ("stopped", "starting", "ready", "stopping", "crashed", "external", "off")

#: How many reclaimed lease ids are remembered, so their holders get a clear error.
RECLAIMED_MEMORY = 4096
#: How many (service, client) pairs are remembered to tell scoped resets (oldest forgotten).
RESET_MEMORY = 65536


class BrokerError(HarnessError):
    """An acquire or release the broker refuses; ``status`` is the HTTP status it answers."""

    def __init__(self, status: int, code: str, message: str, *, log_tail: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.code = code
        self.log_tail = log_tail

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"error": str(self), "code": self.code}
        if self.log_tail:
            data["log_tail"] = self.log_tail
        return data


# ------------------------------------------------------------------------------ decisions


@dataclass(frozen=True)
class Start:
    """Start ``service``'s process and report :meth:`Scheduler.started` or ``start_failed``.

    ``after_swap``: a peer was stopped to make room for it, so its GPU (``gpu``) may still be
    releasing memory; ``vram_gb`` is what the service needs there.
    """

    service: str
    after_swap: bool = False
    gpu: int | None = None
    vram_gb: float = 0.0


@dataclass(frozen=True)
class Stop:
    """Stop ``service``'s process group and report :meth:`Scheduler.stopped`.

    ``reason``: "swap", "idle", "crash" or "shutdown".
    """

    service: str
    reason: str


Action = Start | Stop


# ------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class Lease:
    """A grant: ``client`` may call ``service`` until it releases ``id``."""

    id: str
    service: str
    client: str
    client_pid: int | None
    client_create_time: float | None
    incarnation: int
    granted: float  # monotonic
    fresh: bool
    url: str | None
    scoped: bool
    foreign: bool
    #: the service's client table, rendered (``client`` in the answer; ``client`` above is the caller's id)
    client_table: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: the joined run whose token took it (None: the broker's owner)
    run: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The body of ``POST /acquire``'s answer."""
        return {
            "lease": self.id,
            "service": self.service,
            "url": self.url,
            "fresh": self.fresh,
            "incarnation": self.incarnation,
            "scoped": self.scoped,
            "foreign": self.foreign,
            "client": dict(self.client_table),
        }


@dataclass(eq=False)
class Ticket:
    """One caller waiting in a group's queue; resolved by ``lease`` or ``error``."""

    service: str
    client: str
    client_pid: int | None = None
    client_create_time: float | None = None
    lease: Lease | None = None
    error: BrokerError | None = None
    queued: float = 0.0  # monotonic time of the acquire
    run: str | None = None  # the joined run asking, if any

    @property
    def done(self) -> bool:
        return self.lease is not None or self.error is not None


@dataclass(frozen=True)
class Step:
    """What one :meth:`Scheduler.advance` did: tickets it resolved, and what to do next."""

    admitted: tuple[Ticket, ...] = ()
    refused: tuple[Ticket, ...] = ()
    action: Action | None = None

    @property
    def resolved(self) -> bool:
        return bool(self.admitted or self.refused)


@dataclass(eq=False)
class ServiceState:
    """One service's scheduling state."""

    placement: ServicePlacement
    url: str | None
    log: str | None
    group: str
    state: str
    client: Mapping[str, str] = field(default_factory=dict)  # the rendered client table every lease carries
    foreign: bool = False
    incarnation: int = 0
    served: set[str] = field(default_factory=set)  # client ids this incarnation has served
    inflight: set[str] = field(default_factory=set)  # lease ids of this incarnation
    last_used: float = 0.0
    ready_at: float | None = None
    starts: int = 0
    crashes: int = 0
    failures: deque[float] = field(default_factory=deque)  # times of crashes and failed starts
    error: str | None = None
    error_tail: str = ""
    stop_reason: str | None = None
    stopping: str | None = None  # the reason of the Stop in progress
    failed_at: float | None = None  # when it last crashed or failed to start
    last_error: str | None = None  # why, kept after a restart cleared ``error``
    health_misses: int = 0  # health checks failed in a row while ready
    start_began: float | None = None  # when the Start in progress was decided

    @property
    def name(self) -> str:
        return self.placement.name

    @property
    def local(self) -> bool:
        return self.placement.mode in ("resident", "on_demand")


@dataclass(eq=False)
class GroupState:
    """Services sharing one load slot. ``active`` has (or is getting) a process."""

    name: str
    members: list[str]
    queue: deque[Ticket] = field(default_factory=deque)
    active: str | None = None
    busy: bool = False
    swapped_out: bool = False  # the last stop made room for another member


def _always(error: BrokerError) -> Callable[[Ticket], BrokerError]:
    def refuse(_ticket: Ticket) -> BrokerError:
        return error

    return refuse


def _counter_ids() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"lease-{next(counter)}"


# ------------------------------------------------------------------------------ scheduler


class Scheduler:
    """The decisions of a broker serving ``placements``; see the module docstring.

    ``specs`` must hold a launch spec for every ``resident`` and ``on_demand`` placement
    (only its ``url``, ``log_path`` and ``client`` are read; an external placement's own
    ``url`` and ``client`` are used). ``new_id`` makes lease ids (the broker
    passes a random one; tests a counter). Not thread-safe: callers serialize calls.
    """

    def __init__(
        self,
        placements: Iterable[ServicePlacement],
        specs: Mapping[str, LaunchSpec],
        *,
        crash_limit: int = 3,
        crash_window: float = 300.0,
        lease_seconds: float | None = None,
        new_id: Callable[[], str] | None = None,
        restart_backoff: tuple[float, float] | None = (1.0, 60.0),
        health_failures: int = 3,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.on_event = on_event
        self._resets = ResetTracker(limit=RESET_MEMORY)
        self.crash_limit = crash_limit
        self.crash_window = crash_window
        self.lease_seconds = lease_seconds
        self.restart_backoff = restart_backoff
        self.health_failures = health_failures
        self.closing = False
        self._new_id = new_id or _counter_ids()
        self.services: dict[str, ServiceState] = {}
        self.groups: dict[str, GroupState] = {}
        self.leases: dict[str, Lease] = {}
        self._reclaimed: OrderedDict[str, str] = OrderedDict()
        self.order: list[str] = []
        missing = [p.name for p in placements if p.mode in ("resident", "on_demand") and p.name not in specs]
        if missing:
            raise HarnessError(f"no launch spec for {', '.join(sorted(missing))}")
        for placement in placements:
            self.add(placement, specs.get(placement.name))

    def add(self, placement: ServicePlacement, spec: LaunchSpec | None) -> GroupState:
        """Serve ``placement`` too (``spec``: its launch, for a local one); its group. Raises
        :class:`BrokerError` (409) for a name already served or a local one without a spec."""
        if placement.name in self.services:
            raise BrokerError(409, "exists", f"{placement.name} is served already")
        local = placement.mode in ("resident", "on_demand")
        if local and spec is None:
            raise BrokerError(400, "bad_request", f"no launch spec for {placement.name}")
        key = f"swap:{placement.swap}" if (placement.swap and local) else f"service:{placement.name}"
        group = self.groups.setdefault(key, GroupState(name=key, members=[]))
        group.members.append(placement.name)
        state = {"external": "external", "off": "off"}.get(placement.mode, "stopped")
        url = spec.url if (local and spec is not None) else placement.url
        log = str(spec.log_path) if (local and spec is not None) else None
        client = spec.client if (local and spec is not None) else placement.client
        self.services[placement.name] = ServiceState(placement, url, log, key, state, dict(client))
        self.order.append(placement.name)
        self._emit("added", placement.name, mode=placement.mode)
        return group

    def _emit(self, event: str, service: str, **fields: Any) -> None:
        """Tell :attr:`on_event` a decision or outcome (see :mod:`harness.runtime.metrics`)."""
        if self.on_event is not None:
            self.on_event({"event": event, "service": service, **fields})

    # --------------------------------------------------------------------- lookups

    def service(self, name: str) -> ServiceState:
        return self.services[name]

    def group_of(self, service: str) -> GroupState:
        return self.groups[self.services[service].group]

    def lease(self, lease_id: str) -> Lease | None:
        return self.leases.get(lease_id)

    def processes_expected(self, group: GroupState) -> list[str]:
        """Members that have (or may have) a process of ours: ready, starting or stopping."""
        return [
            n
            for n in group.members
            if self.services[n].local
            and not self.services[n].foreign
            and self.services[n].state in ("ready", "starting", "stopping")
        ]

    # ------------------------------------------------------------------ acquiring

    def enqueue(
        self,
        service: str,
        client: str,
        now: float,
        *,
        client_pid: int | None = None,
        client_create_time: float | None = None,
        run: str | None = None,
    ) -> Ticket:
        """A caller asks for ``service`` (``run``: the joined run asking, told in the events):
        a ticket granted at once (external) or queued.

        Raises :class:`BrokerError` for an unknown service (404), an ``off`` one (409) or a
        closing scheduler (503). Follow with :meth:`advance` on its group.
        """
        svc = self.services.get(service)
        if svc is None:
            known = ", ".join(sorted(self.services))
            raise BrokerError(404, "unknown_service", f"no service {service!r} in the plan (known: {known})")
        if svc.placement.mode == "off":
            why = f": {svc.placement.reason}" if svc.placement.reason else ""
            raise BrokerError(409, "off", f"{service} is off in this run's plan{why}")
        if self.closing:
            raise BrokerError(503, "closing", "the broker is shutting down")
        ticket = Ticket(service, client, client_pid, client_create_time, queued=now, run=run)
        if svc.placement.mode == "external":
            ticket.lease = self._grant(svc, ticket, now)
        else:
            self.groups[svc.group].queue.append(ticket)
        return ticket

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a caller that gave up (timeout) out of its queue; True if it was queued."""
        group = self.group_of(ticket.service)
        if ticket in group.queue:
            group.queue.remove(ticket)
            return True
        return False

    def advance(self, group: GroupState, now: float) -> Step:
        """Move ``group``'s queue forward as far as possible without outside work.

        Admits and refuses tickets, and returns at most one action (after which the group
        is busy until its outcome is reported).
        """
        admitted: list[Ticket] = []
        refused: list[Ticket] = []
        action: Action | None = None
        while group.queue and not group.busy and not self.closing:
            head = self.services[group.queue[0].service]
            if head.state == "ready" and (head.foreign or group.active == head.name):
                admitted += self._resolve(group, head.name, self._granter(head, now))
                continue
            if group.active is not None and group.active != head.name:
                peer = self.services[group.active]
                if peer.inflight:
                    break  # never evict mid-call; its release moves the queue on
                action = self._begin_stop(group, peer, "swap", room_for=head.name)
                break
            refusal = self._crash_refusal(head, now)
            if refusal is not None:
                turned = self._resolve(group, head.name, _always(refusal))
                for ticket in turned:
                    self._emit("refused", head.name, code=refusal.code, client=ticket.client)
                refused += turned
                continue
            action = self._begin_start(group, head, now, "caller")
            break
        return Step(tuple(admitted), tuple(refused), action)

    def _resolve(
        self, group: GroupState, service: str, outcome: Callable[[Ticket], Lease | BrokerError]
    ) -> list[Ticket]:
        """Resolve every queued ticket for ``service`` (in arrival order) with ``outcome``."""
        kept: deque[Ticket] = deque()
        done: list[Ticket] = []
        for ticket in group.queue:
            if ticket.service != service:
                kept.append(ticket)
                continue
            result = outcome(ticket)
            if isinstance(result, BrokerError):
                ticket.error = result
            else:
                ticket.lease = result
            done.append(ticket)
        group.queue = kept
        return done

    def _granter(self, svc: ServiceState, now: float) -> Callable[[Ticket], Lease]:
        def grant(ticket: Ticket) -> Lease:
            return self._grant(svc, ticket, now)

        return grant

    def _grant(self, svc: ServiceState, ticket: Ticket, now: float) -> Lease:
        fresh = ticket.client not in svc.served
        svc.served.add(ticket.client)
        lease = Lease(
            self._new_id(),
            svc.name,
            ticket.client,
            ticket.client_pid,
            ticket.client_create_time,
            svc.incarnation,
            now,
            fresh,
            svc.url,
            svc.placement.scoped,
            svc.foreign,
            svc.client,
            ticket.run,
        )
        self.leases[lease.id] = lease
        svc.inflight.add(lease.id)
        svc.last_used = now
        self._emit(
            "lease",
            svc.name,
            lease=lease.id,
            client=lease.client,
            pid=lease.client_pid,
            run=lease.run,
            wait_s=round(max(0.0, now - ticket.queued), 6),
            fresh=fresh,
            incarnation=lease.incarnation,
        )
        if svc.placement.scoped:
            reset = self._resets.observe(lease.as_json(), lease.client, now)
            if reset is not None:
                reset.pop("at", None)
                reset.pop("service", None)
                self._emit("scoped_reset", svc.name, **reset)
        return lease

    def _crash_refusal(self, svc: ServiceState, now: float) -> BrokerError | None:
        while svc.failures and now - svc.failures[0] > self.crash_window:
            svc.failures.popleft()
        if len(svc.failures) < self.crash_limit:
            return None
        retry = self.crash_window - (now - svc.failures[0])
        return BrokerError(
            503,
            "crashing",
            f"{svc.name} keeps crashing: {len(svc.failures)} failures in the last "
            f"{self.crash_window:g} s; not starting it again for {retry:.0f} s. Last: {svc.error}",
            log_tail=svc.error_tail,
            hint=f"see its log: {svc.log or '-'}",
        )

    # ------------------------------------------------------------ starts and stops

    def _begin_start(self, group: GroupState, svc: ServiceState, now: float, reason: str) -> Start:
        group.busy = True
        group.active = svc.name
        svc.state = "starting"
        svc.start_began = now
        svc.error, svc.error_tail = None, ""
        after_swap, group.swapped_out = group.swapped_out, False
        self._emit("start", svc.name, reason=reason, after_swap=after_swap)
        return Start(svc.name, after_swap, svc.placement.gpu, svc.placement.vram_gb)

    def _begin_stop(self, group: GroupState, svc: ServiceState, reason: str, room_for: str | None = None) -> Stop:
        group.busy = True
        svc.state = "stopping"
        svc.stopping = reason
        if room_for is None:
            self._emit("stop", svc.name, reason=reason)
        else:
            self._emit("stop", svc.name, reason=reason, **{"for": room_for})
        return Stop(svc.name, reason)

    def stop(self, service: str, reason: str) -> Stop:
        """Decide to stop ``service`` now (shutdown); its group must not be busy."""
        svc = self.services[service]
        group = self.groups[svc.group]
        assert not group.busy, f"{group.name} is busy"
        return self._begin_stop(group, svc, reason)

    def started(self, service: str, now: float, *, foreign: bool = False) -> None:
        """A :class:`Start` succeeded: the service is ready (``foreign``: someone else's
        process already answered on its port; it is used as is and holds no slot)."""
        svc = self.services[service]
        group = self.groups[svc.group]
        group.busy = False
        svc.state = "ready"
        svc.ready_at = now
        load = round(now - svc.start_began, 6) if svc.start_began is not None else None
        svc.start_began = None
        if foreign:
            svc.foreign = True
            group.active = None
            self._emit("ready", service, foreign=True, load_s=load)
            return
        svc.foreign = False
        svc.health_misses = 0
        svc.incarnation += 1
        svc.starts += 1
        svc.served = set()
        svc.inflight = set()  # leases of an earlier incarnation no longer pin this one
        svc.last_used = now
        self._emit("ready", service, incarnation=svc.incarnation, load_s=load)

    def start_failed(self, service: str, now: float, message: str, log_tail: str = "") -> list[Ticket]:
        """A :class:`Start` failed: record it and fail the callers waiting for it."""
        svc = self.services[service]
        group = self.groups[svc.group]
        group.busy = False
        group.active = None
        svc.state = "crashed"
        svc.error, svc.error_tail = message, log_tail
        svc.failures.append(now)
        svc.failed_at = now
        svc.last_error = message
        svc.crashes += 1
        svc.start_began = None
        self._emit("start_failed", service, error=message)
        error = BrokerError(503, "start_failed", message, log_tail=log_tail)
        return self._resolve(group, service, _always(error))

    def stopped(self, service: str, now: float) -> None:
        """A :class:`Stop` finished: the process group is gone."""
        svc = self.services[service]
        group = self.groups[svc.group]
        reason = svc.stopping or "stopped"
        group.busy = False
        svc.state = "crashed" if reason == "crash" else "stopped"
        svc.stop_reason = reason
        svc.stopping = None
        svc.ready_at = None
        if group.active == service:
            group.active = None
        group.swapped_out = reason == "swap"
        self._emit("stopped", service, reason=reason)

    def exited(self, service: str, now: float, message: str, log_tail: str = "") -> Stop | None:
        """The process of ``service`` exited on its own: a crash; returns the group's stop
        (children it left may still hold memory). None unless the service was ready."""
        svc = self.services[service]
        group = self.groups[svc.group]
        if svc.state != "ready" or svc.foreign or group.busy:
            return None
        svc.crashes += 1
        svc.failures.append(now)
        svc.failed_at = now
        svc.last_error = message
        svc.error, svc.error_tail = message, log_tail
        self._emit("crash", service, error=message)
        return self._begin_stop(group, svc, "crash")

    def health(self, service: str, ok: bool, now: float, message: str = "") -> Stop | None:
        """The result of a health check of a ready local service; the stop of one that failed
        ``health_failures`` checks in a row (a hung process: stopped as a crash, so a
        resident is started again). ``message`` says how the last check failed."""
        svc = self.services[service]
        group = self.groups[svc.group]
        if ok or svc.state != "ready" or svc.foreign:
            svc.health_misses = 0
            return None
        svc.health_misses += 1
        if svc.health_misses < self.health_failures or group.busy or svc.inflight:
            return None  # a service answering a long call may be slow to check: never mid-call
        svc.health_misses = 0
        svc.crashes += 1
        svc.failures.append(now)
        svc.failed_at = now
        svc.last_error = message
        svc.error = svc.last_error = f"{service} failed {self.health_failures} health checks in a row: {message}"
        svc.error_tail = ""
        self._emit("crash", service, error=svc.error)
        return self._begin_stop(group, svc, "crash")

    def restart_due(self, group: GroupState, now: float) -> Start | None:
        """The start of a crashed ``resident`` member of ``group`` whose backoff has passed
        (None while the group is busy, holds another process, has callers waiting — their
        acquire starts what they want — or while the crash limit refuses the service)."""
        if self.restart_backoff is None or group.busy or self.closing or group.queue or group.active is not None:
            return None
        first, largest = self.restart_backoff
        for name in group.members:
            svc = self.services[name]
            if svc.placement.mode != "resident" or svc.state != "crashed" or svc.foreign:
                continue
            if self._crash_refusal(svc, now) is not None:
                continue
            wait = min(largest, first * 2 ** max(0, len(svc.failures) - 1))
            if svc.failed_at is not None and now - svc.failed_at < wait:
                continue
            return self._begin_start(group, svc, now, "restart")
        return None

    def remove(self, service: str) -> bool:
        """Serve ``service`` no more (a ``harness up NAME`` that added it and failed takes it
        out again); True when its group went with it. Raises :class:`BrokerError` (409
        ``in_use``) while it has a process, leases or callers."""
        svc = self.services[service]
        group = self.groups[svc.group]
        if (
            svc.state in ("starting", "ready", "stopping")
            or svc.inflight
            or group.active == service
            or any(t.service == service for t in group.queue)
        ):
            raise BrokerError(409, "in_use", f"{service} is {svc.state} or in use: not removed")
        del self.services[service]
        self.order.remove(service)
        group.members.remove(service)
        self._emit("removed", service)
        if not group.members:
            del self.groups[group.name]
            return True
        return False

    def unload(self, service: str) -> Stop | str:
        """``harness down NAME``: the stop of ``service``'s process now; ``"wait"`` while its
        group is busy or leases on it are in flight (never stopped mid-call); or why there
        is nothing to stop (``"not running"``, ``"foreign"``, ``"external"``, ``"off"``). It
        stays stopped until a caller asks for it."""
        svc = self.services[service]
        group = self.groups[svc.group]
        if svc.placement.mode in ("external", "off"):
            return svc.placement.mode
        if svc.foreign:
            return "foreign"
        if group.busy or (svc.state == "ready" and svc.inflight):
            return "wait"
        if svc.state != "ready":
            return "not running"
        return self._begin_stop(group, svc, "down")

    def foreign_gone(self, service: str) -> None:
        """A foreign service's port stopped answering: start our own next time."""
        svc = self.services[service]
        if svc.foreign and svc.state == "ready":
            svc.state, svc.foreign, svc.stop_reason = "stopped", False, "foreign service went away"
            svc.ready_at = None
            self._emit("stopped", service, reason="foreign_gone")

    # ------------------------------------------------------------------ releasing

    def release(self, lease_id: str, now: float, *, reclaimed: bool = False) -> tuple[Lease, bool]:
        """End a lease; returns it and whether its group's waiters should look again (the
        last lease of a member let go). Raises 404 ``unknown_lease`` or 410 ``lease_expired``.
        ``reclaimed``: the broker ends it (held too long, or its holder died), not its holder."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            why = self._reclaimed.get(lease_id)
            if why is not None:
                raise BrokerError(410, "lease_expired", why)
            raise BrokerError(404, "unknown_lease", f"no lease {lease_id!r} (released already?)")
        svc = self.services[lease.service]
        svc.inflight.discard(lease_id)
        svc.last_used = now
        self._emit(
            "release",
            lease.service,
            lease=lease.id,
            client=lease.client,
            pid=lease.client_pid,
            run=lease.run,
            held_s=round(max(0.0, now - lease.granted), 6),
            reclaimed=reclaimed,
        )
        group = self.groups[svc.group]
        return lease, bool(group.queue) and not svc.inflight

    def reclaim_overdue(self, now: float) -> list[Lease]:
        """Release every lease held longer than ``lease_seconds``; its holder's release then
        gets 410 ``lease_expired``. Returns the leases reclaimed."""
        if self.lease_seconds is None:
            return []
        overdue = [lease for lease in self.leases.values() if now - lease.granted > self.lease_seconds]
        for lease in overdue:
            self.release(lease.id, now, reclaimed=True)
            self._reclaimed[lease.id] = (
                f"lease {lease.id} on {lease.service} was reclaimed: held {now - lease.granted:.1f} s, longer "
                f"than the broker's lease limit of {self.lease_seconds:g} s; acquire again for the next call"
            )
            while len(self._reclaimed) > RECLAIMED_MEMORY:
                self._reclaimed.popitem(last=False)
        return overdue

    def leases_with_pids(self) -> Iterator[Lease]:
        """Leases held by a local process (the shell checks those processes still run)."""
        return (lease for lease in list(self.leases.values()) if lease.client_pid is not None)

    # ------------------------------------------------------------------ housekeeping

    def idle(self, group: GroupState, now: float) -> Stop | None:
        """The stop of a member idle for its ``idle_seconds``, if any."""
        if group.busy or self.closing:
            return None
        for name in group.members:
            svc = self.services[name]
            idle = svc.placement.idle_seconds
            if (
                idle is not None
                and svc.placement.mode == "on_demand"
                and svc.state == "ready"
                and not svc.foreign
                and not svc.inflight
                and now - svc.last_used >= idle
                and not any(t.service == name for t in group.queue)
            ):
                return self._begin_stop(group, svc, "idle")
        return None

    def close(self) -> list[Ticket]:
        """Refuse new acquires and every waiting caller (503 ``closing``)."""
        self.closing = True
        error = BrokerError(503, "closing", "the broker is shutting down")
        refused: list[Ticket] = []
        for group in self.groups.values():
            for ticket in group.queue:
                ticket.error = error
                refused.append(ticket)
            group.queue = deque()
        return refused

    # ------------------------------------------------------------------------ status

    def status_row(self, name: str, now: float) -> dict[str, Any]:
        """The scheduling part of a service's ``/status`` row."""
        svc = self.services[name]
        group = self.groups[svc.group]
        p = svc.placement
        return {
            "name": name,
            "mode": p.mode,
            "gpu": p.gpu,
            "swap": p.swap,
            "state": svc.state,
            "foreign": svc.foreign,
            "url": svc.url,
            "uptime_s": None if svc.ready_at is None else round(now - svc.ready_at, 3),
            "leases": len(svc.inflight),
            "waiting": sum(1 for t in group.queue if t.service == name),
            "starts": svc.starts,
            "restarts": max(0, svc.starts - 1),
            "health_misses": svc.health_misses,
            "crashes": svc.crashes,
            "incarnation": svc.incarnation,
            "scoped": p.scoped,
            "idle_seconds": p.idle_seconds,
            "stop_reason": svc.stop_reason,
            "error": svc.error,
            "last_error": svc.last_error,
            "log": svc.log,
        }

    def who(self, name: str, now: float) -> dict[str, list[dict[str, Any]]]:
        """Who holds a lease on service ``name`` and who waits for it (the UI's view):
        ``holders`` (client, pid, run, lease, held_s) and ``waiters`` (client, pid, run,
        waited_s), oldest first."""
        svc = self.services[name]
        held = sorted((self.leases[i] for i in svc.inflight if i in self.leases), key=lambda lease: lease.granted)
        waiting = [t for t in self.groups[svc.group].queue if t.service == name and not t.done]
        return {
            "holders": [
                {
                    "client": x.client,
                    "pid": x.client_pid,
                    "run": x.run,
                    "lease": x.id,
                    "held_s": round(now - x.granted, 3),
                }
                for x in held
            ],
            "waiters": [
                {"client": t.client, "pid": t.client_pid, "run": t.run, "waited_s": round(now - t.queued, 3)}
                for t in waiting
            ],
        }


# ------------------------------------------------------------------------- scoped resets


class ResetTracker:
    """Which leases of one run are resets of a ``scoped`` service (pure; not thread-safe).

    A reset is a lease on a scoped service for a client that an earlier incarnation of the
    service had served: the process that held the client's memory is gone. A client's
    first lease loses nothing. Judged by the incarnation alone (not the lease's ``fresh``,
    which is per client id in the whole broker: a broker that several runs share may have
    served another run's client of the same id in this incarnation already).
    """

    def __init__(self, limit: int | None = None) -> None:
        self._seen: dict[tuple[str, str], int] = {}  # (service, client) -> incarnation last leased
        self._limit = limit  # pairs remembered at most (the least recently leased forgotten)

    def observe(self, lease: Mapping[str, Any], client: str, at: float) -> dict[str, Any] | None:
        """Note ``lease`` (an acquire's answer) for ``client`` at unix time ``at``; the reset
        it shows, if any."""
        if not lease.get("scoped"):
            return None
        key = (str(lease.get("service")), client)
        incarnation = int(lease.get("incarnation") or 0)
        previous = self._seen.pop(key, None)
        self._seen[key] = incarnation
        if self._limit is not None and len(self._seen) > self._limit:
            del self._seen[next(iter(self._seen))]
        if previous is None or previous == incarnation:
            return None
        return {
            "service": key[0],
            "at": at,
            "client": client,
            "lease": lease.get("lease"),
            "incarnation": incarnation,
            "previous_incarnation": previous,
        }
