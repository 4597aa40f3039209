"""``harness doctor``: one look at a machine's readiness, as plain data."""

from __future__ import annotations

from typing import Any


def diagnose(
    state: Any, *, agent: str | None = None, sets: tuple[str, ...] = (), gpus: str | None = None
) -> dict[str, Any]:
    """Per manifest: lock state (missing, stale, ok) and whether its store paths are realized;
    the GPUs (NVML, empty without a driver; ``gpus``, a ``--gpus`` spec, rehearses another
    machine); what a run of ``agent`` would install — only what its plan launches on those
    GPUs under the deploy, plus its benchmark: services external, off in the deploy or off
    for lack of room are never installed (``run_skips`` says which and why); and the store's
    health (existence and references; ``store verify --check-contents`` re-hashes)."""
    from harness.config import load_settings
    from harness.errors import HarnessError
    from harness.lock.check import check_locks
    from harness.lock.generate import load_manifests
    from harness.lock.lockfile import lock_path, read
    from harness.realize.builder import missing
    from harness.realize.standin import realized_lock
    from harness.runtime.inventory import detect_gpus, parse_gpus
    from harness.store.store import Store
    from harness.store.verify import verify_store

    project = state.project()
    store = Store.in_home(state.home)
    found = load_manifests(project)
    stale = {s.name: s.reason for s in check_locks(project, [], settings=load_settings(state.home, project.root))}
    manifests: dict[str, dict[str, Any]] = {}
    for name in sorted(found):
        if name in stale:
            manifests[name] = {
                "state": "lock " + ("missing" if stale[name] == "missing" else "stale"),
                "detail": stale[name],
            }
            continue
        lock = read(lock_path(project.locks_dir, name))
        absent = missing(store, lock)
        here = realized_lock(store, lock)  # a host interpreter may stand in for the lock's
        manifests[name] = {
            "state": "realized" if not absent else "not realized",
            "detail": here.environment.store if not absent else f"{len(absent)} store paths to build",
        }
    try:
        inventory = parse_gpus(gpus) if gpus is not None else detect_gpus()
    except HarnessError:
        if gpus is not None:
            raise  # a bad --gpus is the user's to fix
        inventory = ()
    would_install = None
    skips: dict[str, str] = {}
    if agent is not None:
        from harness.manifests.agent import parse_override
        from harness.runtime.placement import agent_plan

        config = project.load_agent(agent, [parse_override(s) for s in sets])
        deploy = project.load_deploy(state.deploy_path) if state.deploy_path is not None else None
        closure, plan = agent_plan(project.load_services(), config, deploy, inventory, project.load_benchmarks())
        launched = {p.name for p in plan.services if p.mode in ("resident", "on_demand")}
        skips = {
            p.name: f"{p.mode}: {p.reason}" if p.reason else p.mode for p in plan.services if p.name not in launched
        }
        names = sorted(launched | ({closure.benchmark} if closure.benchmark else set()))
        would_install = [n for n in names if manifests.get(n, {}).get("state") != "realized"]
    findings = verify_store(store, check_contents=False)
    bad = [f for f in findings if f.status != "ok"]
    problems = len(bad) + sum(1 for m in manifests.values() if m["state"] == "lock stale")
    return {
        "gpus": [g.__dict__ for g in inventory],
        "gpus_from": f"--gpus {gpus}" if gpus is not None else "NVML",
        "manifests": manifests,
        "run_would_install": would_install,
        "run_skips": skips,
        "store": {
            "root": str(store.root),
            "paths": len(findings),
            "problems": len(bad),
            "details": [f"{f.status} {f.name}: {f.detail}" for f in bad],
        },
        "problems": problems,
    }
