"""``harness doctor``: one look at a machine's readiness, as plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from harness.manifests.project import Project
    from harness.runtime.plan import Gpu
    from harness.runtime.session import ProjectState
    from harness.store.store import Store


def diagnose(
    state: ProjectState, *, agent: str | None = None, sets: tuple[str, ...] = (), gpus: str | None = None
) -> dict[str, Any]:
    """Per manifest: lock state (missing, stale, ok) and whether its store paths are realized;
    the GPUs (NVML, empty without a driver; ``gpus``, a ``--gpus`` spec, rehearses another
    machine); what a run of ``agent`` would install — only what its plan launches on those
    GPUs under the deploy, plus its benchmark: services external, off in the deploy or off
    for lack of room are never installed (``run_skips`` says which and why); and the store's
    health (existence and references; ``store verify --check-contents`` re-hashes)."""
    from harness.store.store import Store
    from harness.store.verify import verify_store

    project = state.project()
    store = Store.in_home(state.home)
    manifests = _manifest_states(state, project, store)
    inventory = _inventory(gpus)
    would_install = None
    skips: dict[str, str] = {}
    simulator = None
    if agent is not None:
        would_install, skips, simulator = _run_would_install(state, project, agent, sets, inventory, manifests)
    findings = verify_store(store, check_contents=False)
    bad = [f for f in findings if f.status != "ok"]
    problems = len(bad) + sum(1 for m in manifests.values() if m["state"] == "lock stale")
    return {
        "gpus": [g.__dict__ for g in inventory],
        "gpus_from": f"--gpus {gpus}" if gpus is not None else "NVML",
        "manifests": manifests,
        "run_would_install": would_install,
        "run_skips": skips,
        # A benchmark whose simulator runs elsewhere: nothing of the simulator is installed,
        # only its client (the benchmark's own manifest, in run_would_install when missing).
        "run_simulator": simulator,
        "store": {
            "root": str(store.root),
            "paths": len(findings),
            "problems": len(bad),
            "details": [f"{f.status} {f.name}: {f.detail}" for f in bad],
        },
        "problems": problems,
    }


def _manifest_states(state: ProjectState, project: Project, store: Store) -> dict[str, dict[str, Any]]:
    """Each manifest's lock state (missing, stale) or, locked, whether it is realized here."""
    from harness.config import load_settings
    from harness.lock.check import check_locks
    from harness.lock.generate import load_manifests
    from harness.lock.lockfile import lock_path, read
    from harness.realize.builder import missing
    from harness.realize.standin import realized_lock

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
        if lock.variant:  # a lock of accelerator variants: the one this machine takes, and why
            from harness.lock.variants import cuda_source, variant_reason

            manifests[name]["variant"] = lock.variant
            manifests[name]["detail"] += f"; variant {lock.variant}: {variant_reason(lock.variant, lock.needs_cuda)}"
            manifests[name]["detail"] += f" ({cuda_source(lock.cuda, list(lock.wheel_variants))})"
    return manifests


def _inventory(gpus: str | None) -> tuple[Gpu, ...]:
    """The GPUs of ``--gpus``, else NVML's (none when NVML fails)."""
    from harness.errors import HarnessError
    from harness.runtime.inventory import detect_gpus, parse_gpus

    try:
        return parse_gpus(gpus) if gpus is not None else detect_gpus()
    except HarnessError:
        if gpus is not None:
            raise  # a bad --gpus is the user's to fix
        return ()


def _run_would_install(
    state: ProjectState,
    project: Project,
    agent: str,
    sets: tuple[str, ...],
    inventory: tuple[Gpu, ...],
    manifests: dict[str, dict[str, Any]],
) -> tuple[list[str], dict[str, str], dict[str, Any] | None]:
    """What a run of ``agent`` would install (what its plan launches, and its benchmark,
    not realized yet: for a simulator that runs elsewhere, its client alone), the services
    it skips, each with why, and where its simulator runs when elsewhere."""
    from dataclasses import asdict

    from harness.manifests.agent import parse_override
    from harness.runtime.placement import agent_plan

    config = project.load_agent(agent, [parse_override(s) for s in sets])
    deploy = project.load_deploy(state.deploy_path) if state.deploy_path is not None else None
    closure, plan = agent_plan(project.load_services(), config, deploy, inventory, project.load_benchmarks())
    launched = {p.name for p in plan.services if p.mode in ("resident", "on_demand")}
    skips = {p.name: f"{p.mode}: {p.reason}" if p.reason else p.mode for p in plan.services if p.name not in launched}
    names = sorted(launched | ({closure.benchmark} if closure.benchmark else set()))
    pending = [n for n in names if manifests.get(n, {}).get("state") != "realized"]
    return pending, skips, asdict(plan.simulator) if plan.simulator is not None else None


def variant_notes(locks: dict[str, Path], *, no_gpu: bool = False) -> list[str]:
    """One line per lock of ``locks`` (name → lock file) that has variants: the variant this
    machine takes and why, or why it can take none (``no_gpu``: as a machine without an
    NVIDIA driver would, ``plan --gpus none``). Locks that are missing or unreadable say
    nothing here (``lock --check`` and ``validate`` report them)."""
    from harness.errors import HarnessError
    from harness.lock.lockfile import read
    from harness.lock.platforms import host_platform_of
    from harness.lock.projection import cuda_source_of, variants_of
    from harness.lock.variants import choose_variant, driver_cuda, forced_variant

    notes = []
    for name, path in sorted(locks.items()):
        try:
            lock = read(path, whole=True)
        except HarnessError:
            continue
        platform = host_platform_of(lock)
        variants = variants_of(lock, platform) if platform is not None else []
        if not variants:
            continue
        try:
            choice = choose_variant(
                variants, driver=None if no_gpu else driver_cuda(), forced=forced_variant(), what=f"lock {name}"
            )
        except HarnessError as exc:
            notes.append(f"{name}: {exc.message}")
            continue
        source = cuda_source_of(lock, str(platform), choice.variant)
        notes.append(f"{name} runs variant {choice.variant}: {choice.reason} (it needs {source})")
    return notes
