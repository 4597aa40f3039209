"""From a project to launchable services: closure → plan → realized store paths → launch specs.

This is where the runtime meets the store (DESIGN invariant 1): every ``{python}`` and
``{weights}`` a launch spec names is a registered store path, realized first when missing
(install on first use, honouring ``--offline``). ``up``, ``plan``-then-start and ``run``
all go through :func:`prepare`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from harness.errors import HarnessError, InputError, unknown_names
from harness.manifests.project import ProjectState

if TYPE_CHECKING:  # the models (pydantic) load only when a command prepares something
    from harness.lock.document import Lock
    from harness.manifests.agent import Closure
    from harness.manifests.deploy import Deploy
    from harness.manifests.model import BenchmarkManifest, ServiceManifest
    from harness.manifests.project import Project
    from harness.runtime.launch import LaunchSpec
    from harness.runtime.plan import Gpu, Plan, ServicePlacement
    from harness.store.store import Store


class Skills(TypedDict, total=False):
    """An agent run's skills as its record keeps them (empty for a run of named services)."""

    on: list[str]
    dropped: list[list[str]]  # [skill, why]
    text: dict[str, str]  # skill -> summary, for the skills on only


@dataclass
class Prepared:
    """Everything needed to start a project's services for one purpose."""

    project: Project
    home: Path
    state_dir: Path
    deploy: Deploy | None
    deploy_path: Path | None
    manifests: dict[str, ServiceManifest]
    benchmark: str | None
    benchmark_manifest: BenchmarkManifest | None
    plan: Plan
    specs: dict[str, LaunchSpec]
    locks: dict[str, Lock]  # manifest name -> Lock, for every realized manifest (services + benchmark)
    skills: Skills = field(default_factory=lambda: Skills())
    impurities: list[str] = field(default_factory=list)
    #: manifest name -> store path of the project files its command runs (services/servers/…)
    code: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Intent:
    """What the project and the deploy say, loaded once."""

    project: Project
    home: Path
    deploy_path: Path | None
    deploy: Deploy | None
    manifests: dict[str, ServiceManifest]
    benchmarks: dict[str, BenchmarkManifest]


def default_state_dir(home: Path, project_root: Path, deploy: Deploy | None) -> Path:
    """The deploy's ``state`` folder, else one per project under ``$HARNESS_HOME/state``:
    ``<project>-<key>``, or, where another user has that folder (a member of a shared home
    made it first, or uses the same checkout), this user's own ``<project>-<key>-*``
    (:func:`harness.runtime.supervisor.own_state_folder`)."""
    from harness.runtime.supervisor import own_state_folder

    if deploy is not None and deploy.state:
        return Path(deploy.state).expanduser()
    key = hashlib.sha256(str(project_root.resolve()).encode()).hexdigest()[:16]
    return own_state_folder(home / "state", f"{project_root.name}-{key}")


def broker_options(deploy: Deploy | None) -> dict[str, float]:
    """The deploy's ``[broker]`` settings as :class:`~harness.runtime.broker.Broker` options."""
    settings = getattr(deploy, "broker", None)
    if settings is None:
        return {}
    options = {"gpu_wait_seconds": float(settings.gpu_wait_seconds)}
    if settings.lease_seconds is not None:
        options["lease_seconds"] = float(settings.lease_seconds)
    return options


def prepare(
    state: ProjectState,
    *,
    agent: str | None = None,
    sets: tuple[str, ...] = (),
    services: tuple[str, ...] = (),
    benchmark: str | None = None,
    gpus: str | None = None,
    offline: bool = False,
    realize: bool = True,
    state_dir: Path | None = None,
    only: tuple[str, ...] = (),
    ports: dict[str, int] | None = None,
    show_progress: bool = True,
) -> Prepared:
    """Closure, plan and launch specs; realizes what the launched services need.

    The closure is the agent's enabled skills' services (``agent``), or ``services``, or
    every manifest; plus the benchmark (``benchmark``, else the agent's). ``only`` limits
    which of the planned services get launch specs (``harness up NAME``). ``ports`` moves
    local services to other ports (a cluster shard sharing its node with other shards);
    like all placement, it changes where a service answers, never what it computes.
    """
    from harness.runtime.inventory import detect_gpus, parse_gpus

    intent = _load_intent(state)
    inventory = parse_gpus(gpus) if gpus else detect_gpus()
    closure, plan, skills = _plan_closure(intent, inventory, agent, sets, services, benchmark)
    if ports:
        plan = with_ports(plan, ports)
    launched = _launched(plan, only)
    to_realize = list(launched) + ([closure.benchmark] if closure.benchmark else [])
    locks: dict[str, Lock] = {}
    if to_realize:
        locks = ensure_realized(state, to_realize, offline=offline, realize=realize, show_progress=show_progress)
    if state_dir is None:
        state_dir = default_state_dir(intent.home, intent.project.root, intent.deploy)
    specs, code = _launch_specs(intent, plan, locks, launched, state_dir)
    bench_manifest = intent.benchmarks.get(closure.benchmark) if closure.benchmark else None
    return Prepared(
        intent.project,
        intent.home,
        state_dir,
        intent.deploy,
        intent.deploy_path,
        intent.manifests,
        closure.benchmark,
        bench_manifest,
        plan,
        specs,
        locks,
        skills,
        _impurities(_store(intent.home), plan, locks),
        code,
    )


def _load_intent(state: ProjectState) -> _Intent:
    """The project's services and benchmarks, and the deploy when one is given."""
    project = state.project()
    home = state.home
    manifests = project.load_services()
    benchmarks = project.load_benchmarks()
    deploy_path = state.deploy_path
    deploy = project.load_deploy(deploy_path) if deploy_path is not None else None
    return _Intent(project, home, deploy_path, deploy, manifests, benchmarks)


def _plan_closure(
    intent: _Intent,
    inventory: tuple[Gpu, ...],
    agent: str | None,
    sets: tuple[str, ...],
    services: tuple[str, ...],
    benchmark: str | None,
) -> tuple[Closure, Plan, Skills]:
    """The closure (the agent's, else the services named, else every one) and its plan."""
    from harness.runtime.placement import closure_plan

    if agent is not None:
        closure, plan, skills = _agent_closure(intent, inventory, agent, sets, benchmark)
        _check_benchmark(closure, intent.benchmarks)
        return closure, plan, skills
    closure = _services_closure(intent.manifests, sets, services, benchmark)
    _check_benchmark(closure, intent.benchmarks)
    return closure, closure_plan(intent.manifests, closure, intent.deploy, inventory, intent.benchmarks), Skills()


def _agent_closure(
    intent: _Intent, inventory: tuple[Gpu, ...], agent: str, sets: tuple[str, ...], benchmark: str | None
) -> tuple[Closure, Plan, Skills]:
    """The closure and plan of agent config ``agent`` (with ``sets`` applied), and its skills."""
    from harness.manifests.agent import parse_override
    from harness.runtime.placement import agent_plan

    config = intent.project.load_agent(agent, [parse_override(s) for s in sets])
    # A service the plan turns off for lack of room drops its skills as a deploy's off does.
    closure, plan = agent_plan(
        intent.manifests, config, intent.deploy, inventory, intent.benchmarks, benchmark=benchmark
    )
    skills = Skills(
        on=list(closure.skills_on),
        dropped=[list(d) for d in closure.skills_dropped],
        # What the agent's prompt may say of its skills: only the ones on.
        text={s: config.agent.skills[s].summary or "" for s in closure.skills_on},
    )
    return closure, plan, skills


def _services_closure(
    manifests: dict[str, ServiceManifest], sets: tuple[str, ...], services: tuple[str, ...], benchmark: str | None
) -> Closure:
    """The closure of a run without an agent: the services named, else every manifest."""
    from harness.manifests.agent import Closure

    if sets:
        raise InputError("--set changes an agent config: give --agent too")
    chosen = list(services) or sorted(manifests)
    unknown = [n for n in chosen if n not in manifests]
    if unknown:
        raise unknown_names("service", unknown, set(manifests))
    return Closure(frozenset(chosen), benchmark, (), ())


def _check_benchmark(closure: Closure, benchmarks: dict[str, BenchmarkManifest]) -> None:
    if closure.benchmark is not None and closure.benchmark not in benchmarks:
        raise unknown_names("benchmark", [closure.benchmark], set(benchmarks))


def _launched(plan: Plan, only: tuple[str, ...]) -> list[str]:
    """The plan's local services that get launch specs (those of ``only`` when given)."""
    launched = [p.name for p in plan.services if p.mode in ("resident", "on_demand") and (not only or p.name in only)]
    unknown_only = [n for n in only if n not in {p.name for p in plan.services}]
    if unknown_only:
        raise unknown_names("service", unknown_only, {p.name for p in plan.services})
    return launched


def _launch_specs(
    intent: _Intent, plan: Plan, locks: dict[str, Lock], launched: list[str], state_dir: Path
) -> tuple[dict[str, LaunchSpec], dict[str, str]]:
    """The launch spec of each launched service, from its realized lock; and the store path
    of the project code each one runs, where its command names project files."""
    specs: dict[str, LaunchSpec] = {}
    code: dict[str, str] = {}
    for name in launched:
        spec, service_code = _launch_spec_of(intent, plan, name, locks[name], state_dir)
        if service_code is not None:
            code[name] = service_code
        specs[name] = spec
    return specs, code


def _launch_spec_of(
    intent: _Intent, plan: Plan, name: str, lock: Lock, state_dir: Path
) -> tuple[LaunchSpec, str | None]:
    from harness.lock.storepaths import source_folders, weights_view_path
    from harness.realize.project_code import realize_project_files, service_files
    from harness.runtime.launch import launch_spec

    store_root = intent.home / "store"
    project_root = intent.project.root
    manifest = intent.manifests[name]
    view = weights_view_path(lock)
    sources = {i: store_root / folder for i, folder in enumerate(source_folders(lock))}
    # Service code shipped in the project (services/servers/...) runs from the store too:
    # its files are realized as a content-addressed path and the service starts there.
    files = service_files(project_root, manifest.command or [])
    code = realize_project_files(_store(intent.home), project_root, f"{name}-code", files) if files else None
    spec = launch_spec(
        name,
        manifest,
        plan.service(name),
        python=store_root / lock.environment.store / "bin" / "python",
        weights=store_root / view if view else None,
        cwd=store_root / code if code is not None else project_root,
        state_dir=state_dir,
        sources=sources,
    )
    return dataclasses.replace(spec, closure=launch_closure(store_root, lock, code)), code


def _impurities(store: Store, plan: Plan, locks: dict[str, Lock]) -> list[str]:
    """What the run uses that harness did not build: external services, interpreters that
    are host copies and wheels compiled from sdists with the machine's toolchain (impure
    records), sorted."""
    from harness.lock.objects import built_wheels
    from harness.lock.storepaths import interpreter_path

    impurities: list[str] = []
    for placement in plan.services:
        if placement.mode == "external":
            impurities.append(f"{placement.name}: external service at {placement.url} (not built by harness)")
    for name, lock in locks.items():
        record = store.record(lock.python.store)
        if record is not None and record.impure:
            own = interpreter_path(lock)
            instead = f", standing in for the lock's {own}" if own != lock.python.store else ""
            impurities.append(f"{name}: interpreter {lock.python.store} is {record.impure}{instead}")
        for _, wheel in built_wheels(lock):
            record = store.record(wheel)
            if record is not None and record.impure:
                impurities.append(f"{name}: wheel {wheel} is {record.impure}")
    return sorted(set(impurities))


def launch_closure(store_root: Path, lock: Lock, code: str | None) -> tuple[str, ...]:
    """The store paths a process of ``lock`` runs from (absolute): its environment, weights
    view, sources and project code. The launch check adds what they reference (the
    interpreter, the weight sets); wheels are left out, being copied into the environment."""
    from harness.lock.storepaths import source_folders, weights_view_path

    view = weights_view_path(lock)
    names = [
        lock.environment.store,
        *([view] if view else []),
        *source_folders(lock),
        *([code] if code else []),
    ]
    return tuple(str(store_root / n) for n in dict.fromkeys(names))


def with_ports(plan: Plan, ports: dict[str, int]) -> Plan:
    """``plan`` with the local services named in ``ports`` answering on those ports."""
    from dataclasses import replace

    from harness.runtime.placement import local_url

    def url(p: ServicePlacement) -> str:  # keep the scheme: a WebSocket service stays ws://
        return local_url(ports[p.name], "websocket" if (p.url or "").startswith("ws") else "http")

    moved = tuple(
        replace(p, port=ports[p.name], url=url(p)) if p.name in ports and p.mode in ("resident", "on_demand") else p
        for p in plan.services
    )
    return replace(plan, services=moved)


def _store(home: Path) -> Store:
    from harness.store.store import Store

    return Store.in_home(home)


def ensure_realized(
    state: ProjectState, names: list[str], *, offline: bool, realize: bool, show_progress: bool = True
) -> dict[str, Lock]:
    """The locks of ``names``, realized (install on first use) unless ``realize`` is off,
    in which case anything missing is an error naming it."""
    from harness.realize.install import realize_names
    from harness.lock.lockfile import lock_path, read
    from harness.realize.builder import lock_objects, missing
    from harness.realize.standin import realized_lock
    from harness.store.roots import hold

    project = state.project()
    if realize:
        realize_names(state, names, offline=offline, jobs=8, lock_missing=True, show_progress=show_progress)
    locks = {}
    for name in names:
        path = lock_path(project.locks_dir, name)
        if not path.is_file():
            raise HarnessError(f"{name} has no lock", hint=f"run `harness install {name}`")
        # As realized here: a host interpreter may stand in for the lock's (realize/standin.py).
        locks[name] = realized_lock(_store(state.home), read(path))
        # What this process launches stays rooted for as long as it lives (a run, `up`).
        hold(_store(state.home), lock_objects(locks[name]))
        absent = missing(_store(state.home), locks[name])
        if absent:
            raise HarnessError(
                f"{name} is not realized ({len(absent)} store paths missing)", hint=f"run `harness install {name}`"
            )
    return locks
