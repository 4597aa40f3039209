"""``harness doctor``: one look at a machine's readiness, as plain data."""

from __future__ import annotations

from typing import Any


def diagnose(state: Any, *, agent: str | None = None, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """Per manifest: lock state (missing, stale, ok) and whether its store paths are realized;
    the GPUs (NVML, empty without a driver); what a run of ``agent`` would install; and the
    store's health (existence and references; ``store verify --check-contents`` re-hashes)."""
    from harness.realize.builder import missing
    from harness.realize.standin import realized_lock
    from harness.errors import HarnessError
    from harness.lock.check import check_locks
    from harness.lock.lockfile import lock_path, read
    from harness.lock.generate import load_manifests
    from harness.runtime.inventory import detect_gpus
    from harness.store.store import Store
    from harness.store.verify import verify_store

    project = state.project()
    store = Store.in_home(state.home)
    found = load_manifests(project)
    stale = {s.name: s.reason for s in check_locks(project, [])}
    manifests: dict[str, dict[str, Any]] = {}
    for name in sorted(found):
        if name in stale:
            manifests[name] = {"state": "lock " + ("missing" if stale[name] == "missing" else "stale"),
                               "detail": stale[name]}
            continue
        lock = read(lock_path(project.locks_dir, name))
        absent = missing(store, lock)
        here = realized_lock(store, lock)  # a host interpreter may stand in for the lock's
        manifests[name] = {"state": "realized" if not absent else "not realized",
                           "detail": here.environment.store if not absent else f"{len(absent)} store paths to build"}
    would_install = None
    if agent is not None:
        from harness.manifests.agent import parse_override, services_needed

        config = project.load_agent(agent, [parse_override(s) for s in sets])
        closure = services_needed(config, {n: m.kind for n, (t, m) in found.items() if t == "service"},
                                  benchmarks=frozenset(n for n, (t, _) in found.items() if t == "benchmark"))
        names = sorted(closure.services | ({closure.benchmark} if closure.benchmark else set()))
        would_install = [n for n in names if manifests.get(n, {}).get("state") != "realized"]
    findings = verify_store(store, check_contents=False)
    bad = [f for f in findings if f.status != "ok"]
    problems = len(bad) + sum(1 for m in manifests.values() if m["state"] == "lock stale")
    try:
        gpus = [g.__dict__ for g in detect_gpus()]
    except HarnessError:
        gpus = []
    return {
        "gpus": gpus,
        "manifests": manifests,
        "run_would_install": would_install,
        "store": {"root": str(store.root), "paths": len(findings), "problems": len(bad),
                  "details": [f"{f.status} {f.name}: {f.detail}" for f in bad]},
        "problems": problems,
    }
