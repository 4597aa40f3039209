"""What the broker decided, kept for watching: the event log, counters and Prometheus text.

Pure: the broker feeds it the events :class:`harness.runtime.scheduling.Scheduler` emits
(dicts with an ``event`` kind and a ``service``) together with the wall-clock time, and
asks for the log since a sequence number (``GET /events``), a one-line description of an
event (``broker.log``) or the Prometheus text exposition of the counters (``GET
/metrics``). No thread, socket or clock here; the broker serializes the calls.

Events (every one has ``seq``, ``time`` — unix seconds — and ``event``):

* ``start`` ``{service, reason: "caller" | "restart", after_swap}``: a process is started
* ``ready`` ``{service, incarnation, load_s}`` · ``start_failed`` ``{service, error}``
* ``stop`` ``{service, reason: "idle" | "swap" | "down" | "crash" | "shutdown", for?}``: a
  stop is decided (``for``: the member a swap makes room for) · ``stopped`` ``{service, reason}``
* ``crash`` ``{service, error}``: a ready process exited, or failed its health checks
* ``lease`` ``{service, lease, client, pid, run, wait_s, fresh, incarnation}`` · ``release``
  ``{service, lease, client, pid, run, held_s, reclaimed}`` (``run``: the joined run whose
  token took the lease, None for the owner's)
* ``refused`` ``{service, code, client}`` · ``scoped_reset`` ``{service, client, lease,
  incarnation, previous_incarnation, run?}``
* ``added`` / ``removed`` ``{service}``
"""

from __future__ import annotations

import itertools
import json
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

#: Events kept for ``GET /events?since=N`` (older ones are gone: a reader resumes from the oldest kept).
EVENTS_KEPT = 10_000

#: Histogram buckets (seconds) of lease wait and hold times.
WAIT_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
HOLD_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class EventLog:
    """The last ``kept`` events, numbered from 1 in the order they happened."""

    def __init__(self, kept: int = EVENTS_KEPT) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=kept)
        self.last_seq = 0

    def append(self, event: Mapping[str, Any], at: float) -> dict[str, Any]:
        """Number ``event`` (which happened at unix time ``at``); the event as logged."""
        self.last_seq += 1
        logged = {"seq": self.last_seq, "time": round(at, 6), **event}
        self._events.append(logged)
        return logged

    def since(self, seq: int) -> list[dict[str, Any]]:
        """The events kept whose number is above ``seq``, oldest first."""
        newer = min(self.last_seq - seq, len(self._events))  # the numbers have no gaps
        if newer <= 0:
            return []
        # from the newest end: a reader that keeps up costs what it reads, not what is kept
        return list(itertools.islice(reversed(self._events), newer))[::-1]


def describe(event: Mapping[str, Any]) -> str:
    """One line for ``broker.log``: time, number, kind, service, then the rest as key=value."""
    stamp = datetime.fromtimestamp(float(event["time"]), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    rest = " ".join(
        f"{key}={_value(value)}"
        for key, value in event.items()
        if key not in ("seq", "time", "event", "service") and value is not None
    )
    head = f"{stamp} #{event['seq']} {event['event']} {event.get('service', '-')}"
    return f"{head} {rest}" if rest else head


def _value(value: object) -> str:
    if isinstance(value, str):
        return value if value and not any(c.isspace() or c in "\"'=" for c in value) else json.dumps(value)
    return json.dumps(value)


@dataclass
class Histogram:
    """A Prometheus histogram: counts per upper bound, the sum and the count."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1


@dataclass
class ServiceCounters:
    """What happened to one service since the broker started."""

    starts: int = 0
    restarts: int = 0
    crashes: int = 0
    failed_starts: int = 0
    swaps: int = 0
    idle_stops: int = 0
    stops: dict[str, int] = field(default_factory=dict)  # reason -> count
    leases: int = 0
    scoped_resets: int = 0
    load_seconds: float | None = None
    wait: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS))
    hold: Histogram = field(default_factory=lambda: Histogram(HOLD_BUCKETS))


class Metrics:
    """Counters per service, fed the scheduler's events (:meth:`observe`)."""

    def __init__(self) -> None:
        self.services: dict[str, ServiceCounters] = {}

    def counters(self, service: str) -> ServiceCounters:
        return self.services.setdefault(service, ServiceCounters())

    def observe(self, event: Mapping[str, Any]) -> None:
        """Count ``event`` (see the module docstring for the kinds)."""
        kind, service = event.get("event"), event.get("service")
        if not isinstance(service, str):
            return
        c = self.counters(service)
        if kind == "start":
            c.starts += 1
            c.restarts += event.get("reason") == "restart"
        elif kind == "ready":
            c.load_seconds = float(event.get("load_s") or 0.0)
        elif kind == "start_failed":
            c.failed_starts += 1
            c.crashes += 1
        elif kind == "crash":
            c.crashes += 1
        elif kind == "stop":
            reason = str(event.get("reason"))
            c.stops[reason] = c.stops.get(reason, 0) + 1
            c.swaps += reason == "swap"
            c.idle_stops += reason == "idle"
        elif kind == "lease":
            c.leases += 1
            c.wait.observe(float(event.get("wait_s") or 0.0))
        elif kind == "release":
            c.hold.observe(float(event.get("held_s") or 0.0))
        elif kind == "scoped_reset":
            c.scoped_resets += 1


# ------------------------------------------------------------------- Prometheus text


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Family:
    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.lines = name, [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, value: float, suffix: str = "", **labels: str) -> None:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        self.lines.append(
            f"{self.name}{suffix}{{{text}}} {_number(value)}" if text else f"{self.name}{suffix} {_number(value)}"
        )

    def histogram(self, h: Histogram, **labels: str) -> None:
        for bound, count in zip(h.bounds, h.counts, strict=True):
            self.sample(count, "_bucket", **labels, le=_number(bound))
        self.sample(h.count, "_bucket", **labels, le="+Inf")
        self.sample(h.total, "_sum", **labels)
        self.sample(h.count, "_count", **labels)


def render(
    metrics: Metrics, rows: Sequence[Mapping[str, Any]], uptime: float, states: Iterable[str], events: int
) -> str:
    """The Prometheus text exposition (format 0.0.4) of ``metrics`` and the current
    ``rows`` (the scheduler's status rows: name, state, leases, waiting, incarnation)."""
    names = [str(r["name"]) for r in rows] + sorted(set(metrics.services) - {str(r["name"]) for r in rows})
    counters = {n: metrics.services.get(n) or ServiceCounters() for n in names}
    families: list[_Family] = []

    def family(name: str, kind: str, help_text: str) -> _Family:
        families.append(_Family(name, kind, help_text))
        return families[-1]

    family("harness_broker_uptime_seconds", "gauge", "Seconds since the broker started.").sample(uptime)
    family("harness_broker_events_total", "counter", "Events the broker logged (GET /events).").sample(events)
    state = family("harness_service_state", "gauge", "1 for the state the service is in, else 0.")
    leases = family("harness_service_leases", "gauge", "Leases in flight.")
    waiting = family("harness_service_waiting", "gauge", "Callers waiting for the service.")
    incarnation = family("harness_service_incarnation", "gauge", "Starts of the service's process (0: none).")
    all_states = tuple(states)
    for row in rows:
        name = str(row["name"])
        for s in all_states:
            state.sample(1 if row.get("state") == s else 0, service=name, state=s)
        leases.sample(float(row.get("leases") or 0), service=name)
        waiting.sample(float(row.get("waiting") or 0), service=name)
        incarnation.sample(float(row.get("incarnation") or 0), service=name)
    simple = (
        ("starts", "Process starts."),
        ("restarts", "Starts of a crashed resident without a caller (after the backoff)."),
        ("crashes", "Crashes: exits while serving, failed health checks and failed starts."),
        ("failed_starts", "Starts that failed."),
        ("swaps", "Stops to make room for another member of the swap group."),
        ("idle_stops", "Stops after idle_seconds without a lease."),
        ("leases", "Leases granted."),
        ("scoped_resets", "Leases of a scoped service whose client an earlier process had served."),
    )
    for key, help_text in simple:
        f = family(f"harness_service_{key}_total", "counter", help_text)
        for name in names:
            f.sample(getattr(counters[name], key), service=name)
    stops = family("harness_service_stops_total", "counter", "Stops decided, by reason.")
    load = family("harness_service_load_seconds", "gauge", "Seconds the last start took until healthy.")
    for name in names:
        for reason, count in sorted(counters[name].stops.items()):
            stops.sample(count, service=name, reason=reason)
        if counters[name].load_seconds is not None:
            load.sample(counters[name].load_seconds or 0.0, service=name)
    wait = family("harness_lease_wait_seconds", "histogram", "Seconds from acquire to grant.")
    hold = family("harness_lease_hold_seconds", "histogram", "Seconds from grant to release.")
    for name in names:
        wait.histogram(counters[name].wait, service=name)
        hold.histogram(counters[name].hold, service=name)
    return "\n".join(line for f in families for line in f.lines) + "\n"
