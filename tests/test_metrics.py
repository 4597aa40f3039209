"""What the broker tells a watcher (:mod:`harness.runtime.metrics`), without processes.

The scheduler's events are driven as in ``tests/test_scheduling.py`` (the clock is a number
the test moves); the counters, the event log and the Prometheus text are checked against
what happened. ``tests/test_broker.py`` scrapes ``/metrics`` and reads ``/events`` of a real
broker.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from harness.runtime import metrics
from harness.runtime.scheduling import STATES, Scheduler, Start, Stop
from tests.test_scheduling import place, spec

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{((?:[a-zA-Z_]+="(?:[^"\\]|\\.)*",?)*)\})? (\S+)$')


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition, strictly: a line that is neither a
    comment nor a sample fails the test; each family has its HELP and TYPE first."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    typed: dict[str, str] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter", "histogram") and name not in typed, line
            typed[name] = kind
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample: {line!r}"
        name, labels = match.group(1), match.group(3) or ""
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in typed else name
        assert family in typed, f"{name} has no TYPE line before it"
        pairs = frozenset(tuple(p.split("=", 1)) for p in re.findall(r'[a-zA-Z_]+="(?:[^"\\]|\\.)*"', labels))
        key = (name, frozenset((k, v.strip('"')) for k, v in pairs))
        assert key not in samples, f"sample twice: {line}"
        samples[key] = float(match.group(4))
    return samples


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def driven() -> tuple[Scheduler, list[dict[str, Any]]]:
    """A swap group of two and a scoped service, through starts, a swap, an idle stop, a
    crash with its restart, leases and a scoped reset."""
    seen: list[dict[str, Any]] = []
    placements = (
        place("a", 9001, swap="gpu0"),
        place("b", 9002, swap="gpu0", idle_seconds=5.0),
        place("r", 9003, mode="resident", scoped=True),
    )
    specs = {p.name: spec(p.name, p.port or 0) for p in placements}
    s = Scheduler(placements, specs, on_event=seen.append, restart_backoff=(1.0, 60.0), new_id=None)
    ta = s.enqueue("a", "agent", 0.0)
    step = s.advance(s.group_of("a"), 0.0)
    assert isinstance(step.action, Start) and step.action.service == "a"
    s.started("a", 2.5)  # loaded in 2.5 s
    s.advance(s.group_of("a"), 2.5)
    assert ta.lease is not None
    tb = s.enqueue("b", "agent", 3.0)
    assert s.advance(s.group_of("b"), 3.0).action is None  # a is in use: b waits
    s.release(ta.lease.id, 4.0)  # held 1.5 s
    step = s.advance(s.group_of("b"), 4.0)
    assert step.action == Stop("a", "swap")
    s.stopped("a", 4.5)
    step = s.advance(s.group_of("b"), 4.5)
    assert isinstance(step.action, Start) and step.action.after_swap
    s.started("b", 5.0)
    s.advance(s.group_of("b"), 5.0)
    assert tb.lease is not None and tb.lease.service == "b"
    s.release(tb.lease.id, 5.25)
    assert s.idle(s.group_of("b"), 20.0) == Stop("b", "idle")
    s.stopped("b", 20.0)
    # the scoped resident: a lease, a crash, a restart without a caller, a reset
    tr = s.enqueue("r", "policy", 30.0)
    s.advance(s.group_of("r"), 30.0)
    s.started("r", 31.0)
    s.advance(s.group_of("r"), 31.0)
    assert tr.lease is not None
    s.release(tr.lease.id, 31.5)
    assert s.exited("r", 40.0, "r exited with code 1") == Stop("r", "crash")
    s.stopped("r", 40.0)
    restart = s.restart_due(s.group_of("r"), 42.0)
    assert isinstance(restart, Start) and restart.service == "r"
    s.started("r", 43.0)
    tr2 = s.enqueue("r", "policy", 50.0)
    s.advance(s.group_of("r"), 50.0)
    assert tr2.lease is not None and tr2.lease.fresh
    return s, seen


def test_the_scheduler_tells_every_decision_with_its_reason() -> None:
    _, seen = driven()
    told = [(e["event"], e["service"], e.get("reason")) for e in seen if e["event"] not in ("added",)]
    assert told == [
        ("start", "a", "caller"),
        ("ready", "a", None),
        ("lease", "a", None),
        ("release", "a", None),
        ("stop", "a", "swap"),
        ("stopped", "a", "swap"),
        ("start", "b", "caller"),
        ("ready", "b", None),
        ("lease", "b", None),
        ("release", "b", None),
        ("stop", "b", "idle"),
        ("stopped", "b", "idle"),
        ("start", "r", "caller"),
        ("ready", "r", None),
        ("lease", "r", None),
        ("release", "r", None),
        ("crash", "r", None),
        ("stop", "r", "crash"),
        ("stopped", "r", "crash"),
        ("start", "r", "restart"),
        ("ready", "r", None),
        ("lease", "r", None),
        ("scoped_reset", "r", None),
    ]
    swap = next(e for e in seen if e["event"] == "stop" and e["reason"] == "swap")
    assert swap["for"] == "b"  # the member it makes room for
    lease_b = next(e for e in seen if e["event"] == "lease" and e["service"] == "b")
    assert lease_b["wait_s"] == 2.0 and lease_b["client"] == "agent"  # asked at 3.0, granted at 5.0
    assert next(e for e in seen if e["event"] == "ready" and e["service"] == "a")["load_s"] == 2.5
    reset = seen[-1]
    assert (reset["client"], reset["incarnation"], reset["previous_incarnation"]) == ("policy", 2, 1)
    assert seen[-2]["fresh"] is True


def test_counters_and_the_prometheus_text_follow_the_events() -> None:
    s, seen = driven()
    counted = metrics.Metrics()
    log = metrics.EventLog()
    for i, event in enumerate(seen):
        counted.observe(log.append(event, 1_700_000_000.0 + i))
    rows = [s.status_row(name, 60.0) for name in s.order]
    samples = parse(metrics.render(counted, rows, 12.5, STATES, log.last_seq))
    assert value(samples, "harness_broker_uptime_seconds") == 12.5
    assert value(samples, "harness_broker_events_total") == len(seen)
    assert value(samples, "harness_service_starts_total", service="r") == 2
    assert value(samples, "harness_service_restarts_total", service="r") == 1
    assert value(samples, "harness_service_crashes_total", service="r") == 1
    assert value(samples, "harness_service_swaps_total", service="a") == 1
    assert value(samples, "harness_service_swaps_total", service="b") == 0
    assert value(samples, "harness_service_idle_stops_total", service="b") == 1
    assert value(samples, "harness_service_scoped_resets_total", service="r") == 1
    assert value(samples, "harness_service_stops_total", service="r", reason="crash") == 1
    assert value(samples, "harness_service_load_seconds", service="a") == 2.5
    assert value(samples, "harness_service_state", service="r", state="ready") == 1
    assert value(samples, "harness_service_state", service="a", state="ready") == 0
    assert value(samples, "harness_service_state", service="a", state="stopped") == 1
    assert value(samples, "harness_service_leases", service="r") == 1
    # b waited 2 s: in the 2.5 s bucket, not in the 1 s one; a's lease was held 1.5 s
    assert value(samples, "harness_lease_wait_seconds_bucket", service="b", le="1") == 0
    assert value(samples, "harness_lease_wait_seconds_bucket", service="b", le="2.5") == 1
    assert value(samples, "harness_lease_wait_seconds_bucket", service="b", le="+Inf") == 1
    assert value(samples, "harness_lease_wait_seconds_sum", service="b") == 2.0
    assert value(samples, "harness_lease_hold_seconds_sum", service="a") == 1.5
    assert value(samples, "harness_lease_hold_seconds_count", service="r") == 1  # one released of two
    assert value(samples, "harness_lease_wait_seconds_count", service="r") == 2


def test_the_text_parses_with_prometheus_client_too() -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    s, seen = driven()
    counted = metrics.Metrics()
    for event in seen:
        counted.observe(event)
    text = metrics.render(counted, [s.status_row(n, 60.0) for n in s.order], 1.0, STATES, len(seen))
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert families["harness_lease_wait_seconds"].type == "histogram"
    # prometheus_client names a counter family without its _total
    assert {x.labels["service"]: x.value for x in families["harness_service_crashes"].samples} == {
        "a": 0,
        "b": 0,
        "r": 1,
    }


def test_label_values_are_escaped() -> None:
    counted = metrics.Metrics()
    counted.observe({"event": "start", "service": 'we"ird\\name\nx', "reason": "caller"})
    samples = parse(metrics.render(counted, [], 0.0, STATES, 1))
    assert value(samples, "harness_service_starts_total", service='we\\"ird\\\\name\\nx') == 1


def test_the_event_log_resumes_from_a_number_and_keeps_the_newest() -> None:
    log = metrics.EventLog(kept=3)
    for i in range(5):
        log.append({"event": "lease", "service": "a", "n": i}, 100.0 + i)
    assert log.last_seq == 5
    assert [e["seq"] for e in log.since(0)] == [3, 4, 5]  # the two oldest are gone
    assert [e["n"] for e in log.since(4)] == [4]
    assert log.since(5) == [] and log.since(99) == []
    assert log.since(0)[0]["time"] == 102.0


def test_one_log_line_per_event_with_its_reason() -> None:
    line = metrics.describe(
        {"seq": 7, "time": 0.25, "event": "stop", "service": "vla", "reason": "swap", "for": "world model"}
    )
    assert line == '1970-01-01T00:00:00.250000Z #7 stop vla reason=swap for="world model"'
    assert "\n" not in metrics.describe({"seq": 1, "time": 0, "event": "crash", "service": "x", "error": "a\nb"})


def test_reading_the_newest_events_does_not_walk_the_whole_log() -> None:
    import time

    log = metrics.EventLog()
    for i in range(metrics.EVENTS_KEPT):
        log.append({"event": "lease", "service": "a", "n": i}, 0.0)
    began = time.perf_counter()
    for _ in range(10_000):
        [newest] = log.since(log.last_seq - 1)
    assert newest["n"] == metrics.EVENTS_KEPT - 1
    # 10,000 reads of the whole log take seconds; of the one newest event, milliseconds
    assert time.perf_counter() - began < 0.5
    assert [e["seq"] for e in log.since(log.last_seq - 3)] == [log.last_seq - 2, log.last_seq - 1, log.last_seq]
