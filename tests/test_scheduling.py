"""The broker's scheduling rules (:mod:`harness.runtime.scheduling`), without processes.

Pure tests: events go in (acquire, release, a start's outcome, a crash, the time), and the
decisions that come out (admit, refuse, start, stop) are checked; the clock is a number
the test moves. ``tests/test_broker.py`` checks the same rules with real processes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from harness.errors import HarnessError
from harness.runtime.launch import LaunchSpec
from harness.runtime.plan import ServicePlacement
from harness.runtime.scheduling import Action, BrokerError, Scheduler, Start, Step, Stop, Ticket


def spec(name: str, port: int) -> LaunchSpec:
    return LaunchSpec(
        name=name,
        argv=("/store/env/bin/python", "serve.py"),
        env={},
        cwd=Path("/store/code"),
        port=port,
        url=f"http://127.0.0.1:{port}",
        health_url=None,
        load_seconds=10.0,
        log_path=Path(f"/state/logs/{name}.log"),
    )


def place(name: str, port: int, mode: str = "on_demand", **kw: Any) -> ServicePlacement:
    return ServicePlacement(
        name=name,
        mode=mode,
        gpu=kw.pop("gpu", 0),
        port=port,  # type: ignore[arg-type]
        url=f"http://127.0.0.1:{port}",
        **kw,
    )


def scheduler(*placements: ServicePlacement, **options: Any) -> Scheduler:
    specs = {p.name: spec(p.name, p.port or 0) for p in placements if p.mode in ("resident", "on_demand")}
    return Scheduler(placements, specs, **options)


def swap_group(*names: str, **options: Any) -> Scheduler:
    return scheduler(*(place(n, 9000 + i, swap="gpu0", vram_gb=6.0) for i, n in enumerate(names)), **options)


def ask(s: Scheduler, service: str, now: float, client: str = "agent") -> tuple[Ticket, Step]:
    """Acquire as the broker does: enqueue, then advance the group."""
    ticket = s.enqueue(service, client, now)
    return ticket, s.advance(s.group_of(service), now)


def step(s: Scheduler, service: str, now: float) -> Step:
    return s.advance(s.group_of(service), now)


# --------------------------------------------------------------------------- on demand


def test_first_acquire_starts_the_service_and_callers_join_the_load() -> None:
    s = scheduler(place("seg", 9001))
    first, decided = ask(s, "seg", 0.0)
    assert decided.action == Start("seg", after_swap=False, gpu=0, vram_gb=0.0) and not first.done
    # Callers arriving during the load wait for it: no second start.
    second, again = ask(s, "seg", 0.1, client="other")
    assert again == Step() and s.service("seg").state == "starting"
    s.started("seg", 1.0)
    admitted = step(s, "seg", 1.0).admitted
    assert admitted == (first, second)  # in arrival order, together
    assert first.lease is not None and second.lease is not None
    assert first.lease.fresh and second.lease.fresh and first.lease.incarnation == 1
    assert first.lease.url == "http://127.0.0.1:9001"
    # Loaded and nobody queued: granted at once, not fresh for a client served before.
    third, decided = ask(s, "seg", 2.0)
    assert decided.admitted == (third,) and third.lease is not None and not third.lease.fresh
    assert s.status_row("seg", 3.0)["leases"] == 3 and s.status_row("seg", 3.0)["uptime_s"] == 2.0


def test_unknown_off_external_and_closing() -> None:
    s = scheduler(
        place("seg", 9001),
        place("remote", 0, mode="external", gpu=None),
        place("sam3", 0, mode="off", gpu=None, reason="no GPU can hold 7.2 GB"),
    )
    with pytest.raises(BrokerError) as unknown:
        s.enqueue("nope", "agent", 0.0)
    assert unknown.value.status == 404 and "known: remote, sam3, seg" in str(unknown.value)
    with pytest.raises(BrokerError, match="no GPU can hold 7.2 GB") as off:
        s.enqueue("sam3", "agent", 0.0)
    assert off.value.status == 409 and off.value.code == "off"
    remote = s.enqueue("remote", "agent", 0.0)
    assert remote.lease is not None and remote.lease.incarnation == 0 and remote.lease.url == "http://127.0.0.1:0"
    waiting, _ = ask(s, "seg", 0.0)
    assert s.close() == [waiting] and waiting.error is not None and waiting.error.code == "closing"
    with pytest.raises(BrokerError) as closing:
        s.enqueue("seg", "agent", 1.0)
    assert closing.value.status == 503


def test_a_launch_spec_is_required_for_every_local_service() -> None:
    with pytest.raises(HarnessError, match="no launch spec for seg"):
        Scheduler([place("seg", 9001)], {})


# -------------------------------------------------------------------------- swap groups


def test_swap_order_admits_the_oldest_callers_member_and_never_evicts_mid_call() -> None:
    s = swap_group("a", "b", "c")
    holder, decided = ask(s, "a", 0.0)
    assert decided.action == Start("a", after_swap=False, gpu=0, vram_gb=6.0)
    s.started("a", 1.0)
    assert step(s, "a", 1.0).admitted == (holder,)
    b1, nothing = ask(s, "b", 2.0)
    assert nothing == Step()  # a is in use: never stopped mid-call
    c1, _ = ask(s, "c", 2.1)
    a2, _ = ask(s, "a", 2.2)  # a is loaded, but a2 queues behind b1 and c1: no overtaking
    b2, _ = ask(s, "b", 2.3)
    assert not a2.done and s.status_row("a", 2.3)["waiting"] == 1
    assert holder.lease is not None
    _, wake = s.release(holder.lease.id, 3.0)
    assert wake  # the last lease let go: the queue can move
    assert step(s, "b", 3.0).action == Stop("a", "swap")
    assert step(s, "b", 3.0) == Step()  # busy until the stop is reported
    s.stopped("a", 4.0)
    assert s.service("a").state == "stopped" and s.service("a").stop_reason == "swap"
    assert step(s, "b", 4.0).action == Start("b", after_swap=True, gpu=0, vram_gb=6.0)
    s.started("b", 5.0)
    assert step(s, "b", 5.0).admitted == (b1, b2)  # b's callers together
    for ticket in (b1, b2):
        assert ticket.lease is not None
        s.release(ticket.lease.id, 6.0)
    assert step(s, "c", 6.0).action == Stop("b", "swap")
    s.stopped("b", 6.5)
    assert step(s, "c", 6.5).action == Start("c", after_swap=True, gpu=0, vram_gb=6.0)
    s.started("c", 7.0)
    assert step(s, "c", 7.0).admitted == (c1,)
    assert c1.lease is not None
    s.release(c1.lease.id, 7.5)
    assert step(s, "a", 7.5).action == Stop("c", "swap")
    s.stopped("c", 8.0)
    assert step(s, "a", 8.0).action == Start("a", after_swap=True, gpu=0, vram_gb=6.0)
    s.started("a", 9.0)
    assert step(s, "a", 9.0).admitted == (a2,)
    assert a2.lease is not None and a2.lease.incarnation == 2 and a2.lease.fresh  # swapped out: fresh again


def test_a_caller_that_gives_up_leaves_the_queue() -> None:
    s = swap_group("a", "b")
    holder, _ = ask(s, "a", 0.0)
    s.started("a", 0.5)
    step(s, "a", 0.5)
    waiting, _ = ask(s, "b", 1.0)
    assert s.withdraw(waiting) and not s.withdraw(waiting)
    assert holder.lease is not None
    _, wake = s.release(holder.lease.id, 2.0)
    assert not wake and step(s, "a", 2.0) == Step()  # nobody waits: a stays loaded
    assert s.service("a").state == "ready"


def test_a_scoped_policy_swapped_out_answers_fresh() -> None:
    s = scheduler(place("policy", 9001, swap="g", scoped=True), place("seg", 9002, swap="g"))
    fresh = []
    now = 0.0
    for name in ("policy", "policy", "seg", "policy", "policy"):
        ticket, decided = ask(s, name, now)
        while not ticket.done:
            action = decided.action
            assert action is not None
            if isinstance(action, Start):
                s.started(action.service, now)
            else:
                s.stopped(action.service, now)
            decided = step(s, name, now)
        assert ticket.lease is not None and ticket.lease.scoped == (name == "policy")
        fresh.append(ticket.lease.fresh)
        s.release(ticket.lease.id, now)
        now += 1
    assert fresh == [True, False, True, True, False]


def test_a_foreign_service_is_used_as_is_and_holds_no_slot() -> None:
    s = swap_group("a", "b")
    first, decided = ask(s, "a", 0.0)
    assert decided.action == Start("a", after_swap=False, gpu=0, vram_gb=6.0)
    s.started("a", 0.1, foreign=True)
    assert step(s, "a", 0.1).admitted == (first,)
    assert first.lease is not None and first.lease.foreign and first.lease.incarnation == 0
    # b may start while a's lease is in flight: harness cannot unload a foreign process.
    _, decided = ask(s, "b", 0.2)
    assert decided.action == Start("b", after_swap=False, gpu=0, vram_gb=6.0)
    s.foreign_gone("a")
    assert s.service("a").state == "stopped" and not s.service("a").foreign


# ----------------------------------------------------------------------- idle and crash


def test_idle_stop_waits_for_idle_seconds_with_nothing_in_flight() -> None:
    s = scheduler(place("seg", 9001, idle_seconds=30.0), place("kin", 9002, mode="resident", idle_seconds=30.0))
    group = s.group_of("seg")
    ticket, _ = ask(s, "seg", 0.0)
    s.started("seg", 1.0)
    step(s, "seg", 1.0)
    assert ticket.lease is not None
    assert s.idle(group, 100.0) is None  # in flight: never idle
    s.release(ticket.lease.id, 100.0)
    assert s.idle(group, 129.0) is None
    assert s.idle(group, 130.0) == Stop("seg", "idle")
    s.stopped("seg", 131.0)
    assert s.status_row("seg", 131.0)["stop_reason"] == "idle"
    resident, _ = ask(s, "kin", 0.0)
    s.started("kin", 0.0)
    step(s, "kin", 0.0)
    assert resident.lease is not None
    s.release(resident.lease.id, 0.0)
    assert s.idle(s.group_of("kin"), 10_000.0) is None  # residents are never stopped for idleness


def test_a_crash_stops_the_group_and_the_next_acquire_starts_it_again() -> None:
    s = scheduler(place("pol", 9001, scoped=True))
    ticket, _ = ask(s, "pol", 0.0)
    s.started("pol", 1.0)
    step(s, "pol", 1.0)
    assert s.exited("pol", 5.0, "pol exited with exit code 3 while serving", "Traceback ...") == Stop("pol", "crash")
    assert s.exited("pol", 5.0, "again", "") is None  # reported once
    s.stopped("pol", 6.0)
    row = s.status_row("pol", 6.0)
    assert row["state"] == "crashed" and row["crashes"] == 1 and "exit code 3" in row["error"]
    assert ticket.lease is not None
    s.release(ticket.lease.id, 6.0)  # a lease of the dead incarnation is still released cleanly
    again, decided = ask(s, "pol", 7.0)
    assert decided.action == Start("pol", after_swap=False, gpu=0, vram_gb=0.0)
    s.started("pol", 8.0)
    step(s, "pol", 8.0)
    assert again.lease is not None and again.lease.fresh and again.lease.incarnation == 2
    assert s.status_row("pol", 8.0)["restarts"] == 1


def test_after_crash_limit_failures_starts_are_refused_until_the_window_passes() -> None:
    s = swap_group("bad", "good")
    s.crash_limit, s.crash_window = 3, 300.0
    for attempt in range(3):
        ticket, decided = ask(s, "bad", float(attempt))
        assert isinstance(decided.action, Start)
        other, _ = ask(s, "good", float(attempt))  # a peer's caller is not failed with it
        failed = s.start_failed("bad", float(attempt), "bad exited with exit code 3 while loading", "no weights")
        assert failed == [ticket] and ticket.error is not None and ticket.error.code == "start_failed"
        assert ticket.error.log_tail == "no weights" and not other.done
        assert s.withdraw(other)
    refused, decided = ask(s, "bad", 10.0)
    assert decided.action is None and decided.refused == (refused,)
    assert refused.error is not None and refused.error.code == "crashing" and refused.error.status == 503
    assert "3 failures in the last 300 s" in str(refused.error) and refused.error.log_tail == "no weights"
    # Once the first failure is older than the window, a start is tried again.
    _, decided = ask(s, "bad", 300.5)
    assert decided.action == Start("bad", after_swap=False, gpu=0, vram_gb=6.0)


# -------------------------------------------------------------------------- leases


def test_a_lease_held_past_the_limit_is_reclaimed_with_a_clear_error() -> None:
    s = swap_group("a", "b", lease_seconds=60.0)
    ticket, _ = ask(s, "a", 0.0)
    s.started("a", 1.0)
    step(s, "a", 1.0)
    waiting, _ = ask(s, "b", 2.0)
    assert s.reclaim_overdue(61.0) == []
    assert ticket.lease is not None
    assert s.reclaim_overdue(61.5) == [ticket.lease]
    assert s.status_row("a", 61.5)["leases"] == 0
    assert step(s, "b", 61.5).action == Stop("a", "swap")  # the group moves on
    with pytest.raises(BrokerError, match="held 60.5 s, longer than the broker's lease limit of 60 s") as info:
        s.release(ticket.lease.id, 70.0)
    assert info.value.status == 410 and info.value.code == "lease_expired"
    with pytest.raises(BrokerError) as unknown:
        s.release("no-such-lease", 70.0)
    assert unknown.value.status == 404 and not waiting.done
    assert scheduler(place("x", 1)).reclaim_overdue(1e9) == []  # no limit by default


# -------------------------------------------------------------- a random walk of callers


@pytest.mark.parametrize("seed", range(6))
def test_random_callers_never_see_two_members_loaded_and_nobody_starves(seed: int) -> None:
    """Many callers of a swap group, random arrivals, releases and crashes: at most one member
    has a process at any instant, every caller is served, and callers of one member are
    admitted in arrival order."""
    rng = random.Random(seed)
    names = ["a", "b", "c"]
    s = swap_group(*names)
    group = s.group_of("a")
    pending: list[Action] = []
    tickets: list[Ticket] = []
    held: list[Ticket] = []
    now = 0.0

    def loaded() -> list[str]:
        return [n for n in names if s.service(n).state in ("starting", "ready", "stopping")]

    def advance() -> None:
        decided = s.advance(group, now)
        if decided.action is not None:
            pending.append(decided.action)

    for _ in range(400):
        now += rng.random()
        roll = rng.random()
        if roll < 0.35:
            tickets.append(s.enqueue(rng.choice(names), f"client-{rng.randrange(5)}", now))
        elif roll < 0.6 and held:
            ticket = held.pop(rng.randrange(len(held)))
            assert ticket.lease is not None
            s.release(ticket.lease.id, now)
        elif roll < 0.9 and pending:
            action = pending.pop()
            if isinstance(action, Start):
                if rng.random() < 0.1:
                    s.start_failed(action.service, now, "failed", "")
                else:
                    s.started(action.service, now)
            else:
                s.stopped(action.service, now)
        elif roll < 0.95 and group.active and not group.busy:
            stop = s.exited(group.active, now, "crashed", "")
            if stop is not None:
                pending.append(stop)
        advance()
        assert len(loaded()) <= 1, loaded()
        assert len(pending) <= 1
        for ticket in tickets:
            if ticket.lease is not None and ticket not in held and ticket.lease.id in s.leases:
                held.append(ticket)
    # Drain: release everything, carry out every decision, until nobody waits.
    for _ in range(1000):
        for ticket in held:
            assert ticket.lease is not None
            if ticket.lease.id in s.leases:
                s.release(ticket.lease.id, now)
        held.clear()
        if pending:
            action = pending.pop()
            if isinstance(action, Start):
                s.started(action.service, now)
            else:
                s.stopped(action.service, now)
        advance()
        held.extend(t for t in tickets if t.lease is not None and t.lease.id in s.leases)
        if not group.queue and not pending:
            break
    assert all(t.done for t in tickets), "a caller was never served"
    for name in names:
        granted = [t.lease.granted for t in tickets if t.service == name and t.lease is not None]
        assert granted == sorted(granted), f"callers of {name} were admitted out of order"


def test_a_reset_is_judged_by_the_incarnation_not_the_brokers_fresh_flag() -> None:
    """In a broker several runs share, another run's client of the same id may have been
    served by this incarnation already (``fresh`` false): this run's client lost its memory
    all the same."""
    from harness.runtime.scheduling import ResetTracker

    tracker = ResetTracker()
    lease = {"service": "policy", "scoped": True, "lease": "a", "incarnation": 1, "fresh": True}
    assert tracker.observe(lease, "agent", 1.0) is None, "a first lease loses nothing"
    assert tracker.observe({**lease, "lease": "b", "fresh": False}, "agent", 2.0) is None
    reset = tracker.observe({**lease, "lease": "c", "incarnation": 2, "fresh": False}, "agent", 3.0)
    assert reset == {
        "service": "policy",
        "at": 3.0,
        "client": "agent",
        "lease": "c",
        "incarnation": 2,
        "previous_incarnation": 1,
    }
    assert tracker.observe({**lease, "scoped": False, "incarnation": 5}, "agent", 4.0) is None, "not scoped"


# ------------------------------------------------------------- per-service control


def _up(s: Scheduler, name: str, now: float) -> None:
    """Start ``name`` the way ``harness up`` does, and report it ready."""
    s.enqueue(name, "harness-up", now)
    action = step(s, name, now).action
    assert isinstance(action, Start)
    s.started(name, now)
    step(s, name, now)  # the caller is admitted
    for lease in [lease for lease in s.leases.values() if lease.service == name]:
        s.release(lease.id, now)


def test_a_crashed_resident_is_restarted_with_a_doubling_backoff() -> None:
    s = scheduler(place("kin", 9001, mode="resident"), restart_backoff=(1.0, 4.0), crash_limit=10)
    group = s.group_of("kin")
    _up(s, "kin", 0.0)
    crash = s.exited("kin", 10.0, "kin exited with exit code 3")
    assert crash == Stop("kin", "crash")
    s.stopped("kin", 10.0)
    assert s.restart_due(group, 10.5) is None, "not before its backoff"
    assert s.restart_due(group, 11.0) == Start("kin", after_swap=False, gpu=0, vram_gb=0.0)
    s.start_failed("kin", 11.0, "exit code 3")  # two failures in the window: two seconds
    assert s.restart_due(group, 12.9) is None and s.restart_due(group, 13.0) is not None
    s.start_failed("kin", 13.0, "exit code 3")  # three: four seconds, the largest
    s.start_failed("kin", 13.0, "again")
    assert s.restart_due(group, 16.9) is None and s.restart_due(group, 17.0) is not None
    s.started("kin", 17.5)
    assert s.restart_due(group, 100.0) is None, "a ready resident is left alone"


def test_restarts_respect_the_crash_limit_and_never_touch_on_demand_or_unloaded_services() -> None:
    s = scheduler(place("kin", 9001, mode="resident"), place("seg", 9002), restart_backoff=(1.0, 4.0), crash_limit=2)
    _up(s, "kin", 0.0)
    s.exited("kin", 1.0, "crash")
    s.stopped("kin", 1.0)
    s.start_failed("kin", 2.0, "again")  # the crash limit: 2 failures within the window
    assert s.restart_due(s.group_of("kin"), 50.0) is None, "refused while it keeps crashing"
    assert s.restart_due(s.group_of("kin"), 303.0) is not None, "once the window has passed"
    _up(s, "seg", 0.0)
    s.exited("seg", 5.0, "crash")
    s.stopped("seg", 5.0)
    assert s.restart_due(s.group_of("seg"), 100.0) is None, "on demand: the next caller starts it"
    t = scheduler(place("kin", 9001, mode="resident"))
    _up(t, "kin", 0.0)
    assert t.unload("kin") == Stop("kin", "down")
    t.stopped("kin", 1.0)
    assert t.service("kin").stop_reason == "down" and t.service("kin").state == "stopped"
    assert t.restart_due(t.group_of("kin"), 100.0) is None, "stopped by hand: stays stopped"
    assert t.unload("kin") == "not running"


def test_unload_waits_for_leases_in_flight_and_leaves_foreign_and_external_alone() -> None:
    s = scheduler(place("seg", 9001), place("remote", 9002, mode="external", gpu=None))
    ticket, _ = ask(s, "seg", 0.0)
    s.started("seg", 1.0)
    step(s, "seg", 1.0)
    assert ticket.lease is not None
    assert s.unload("seg") == "wait", "never stopped mid-call"
    s.release(ticket.lease.id, 2.0)
    assert s.unload("seg") == Stop("seg", "down")
    assert s.unload("remote") == "external"


def test_health_checks_failing_in_a_row_stop_a_hung_service_as_a_crash() -> None:
    s = scheduler(place("kin", 9001, mode="resident"), health_failures=3)
    _up(s, "kin", 0.0)
    assert s.health("kin", False, 1.0, "no answer") is None
    assert s.health("kin", True, 2.0) is None, "an answer resets the count"
    assert s.health("kin", False, 3.0) is None and s.health("kin", False, 4.0) is None
    assert s.health("kin", False, 5.0, "/health did not answer") == Stop("kin", "crash")
    s.stopped("kin", 5.0)
    row = s.status_row("kin", 5.0)
    assert row["state"] == "crashed" and row["crashes"] == 1 and "3 health checks" in row["error"]


def test_a_service_added_joins_its_swap_group() -> None:
    s = swap_group("policy")
    group = s.add(place("seg", 9100, swap="gpu0", vram_gb=6.0), spec("seg", 9100))
    assert group is s.group_of("policy") and group.members == ["policy", "seg"]
    with pytest.raises(BrokerError, match="served already"):
        s.add(place("seg", 9100), spec("seg", 9100))
    alone = s.add(place("kin", 9200, mode="resident", gpu=None), spec("kin", 9200))
    assert alone.members == ["kin"] and s.order[-1] == "kin"


def test_a_service_is_removed_only_when_nothing_of_it_runs_or_waits() -> None:
    s = swap_group("policy")
    s.add(place("seg", 9100, swap="gpu0", vram_gb=6.0), spec("seg", 9100))
    ticket, _ = ask(s, "seg", 0.0)
    with pytest.raises(BrokerError, match="in use"):
        s.remove("seg")  # a caller waits for it
    s.start_failed("seg", 1.0, "exit code 5")
    assert ticket.error is not None
    assert s.remove("seg") is False, "its swap group stays, with policy"
    assert "seg" not in s.services and s.group_of("policy").members == ["policy"]
    assert s.remove("policy") is True and s.groups == {}
