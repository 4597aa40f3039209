"""The placement planner: manifests, a deploy and a GPU inventory in, a :class:`Plan` out.

Pure (data in, data out): no processes, no NVML, no files. The rules are the seed's
"Placement and deploys" and "On demand and swap groups":

* **Without a deploy**, every GPU service is resident when all of them fit the free memory
  (each on the GPU with the most room, largest first); otherwise they run on demand, one
  swap group per GPU (``gpu0``, ``gpu1``, …), so a GPU holds one model at a time.
* **With a deploy**, each service runs as its ``[services.<name>]`` says; a service it does
  not mention is resident on ``gpu = "auto"``. ``auto`` picks the GPU with the most room for
  the service's ``vram_gb``, largest services first, ties to the lower index. A swap group
  goes to ONE GPU and needs the room of its largest member.
* **Simulator workers** (``[sim]``): ``workers_per_gpu`` on each of ``sim.gpus``, on
  consecutive ports from ``base_port``. Their memory (the benchmark's ``vram_gb`` per
  worker, when a benchmark is given) is taken before any model is placed, and those GPUs
  are the simulator's: ``auto`` never places a model there, only an explicit ``gpu = N``
  shares one (that is how the seed's "No GPU for models" example keeps every model off).
  A benchmark whose simulator runs elsewhere (``simulator = "external"``) has no workers
  here: the plan's ``simulator`` names its address, and ``[sim]``'s GPUs stay free.
* ``vram_gb = 0`` services are CPU only and always run; ``external`` is a URL only; ``off``
  is off.
* A service that ``auto`` cannot place (no GPU at all, or none with room) is **off** with a
  note, as the seed's no-GPU example says. Work the deploy pins explicitly to a GPU that
  lacks the room (or does not exist) is **infeasible**: :class:`InputError` naming what
  does not fit where.

A plan never changes what a run computes, only where and when (DESIGN invariant 5).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import InputError
from harness.runtime.inventory import describe, visible
from harness.runtime.launch import local_url as launch_url
from harness.runtime.launch import render_client
from harness.runtime.plan import Gpu, Mode, Plan, RemoteSimulator, ServicePlacement, SimWorker

if TYPE_CHECKING:
    from harness.manifests.agent import AgentConfig, Closure
    from harness.manifests.deploy import Deploy, ServiceDeploy
    from harness.manifests.model import BenchmarkManifest, ServiceManifest

#: Tolerance for comparing GB figures: 7.2 + 14 must fit 21.2 despite binary floats.
EPS = 1e-6
LOCALHOST = "127.0.0.1"
_GPUS_HINT = "plan for another machine with --gpus, e.g. --gpus 4x24 or --gpus 24,80"


def gb(value: float) -> str:
    """A GB figure for people: ``7.2``, ``14``, ``21.2`` (no float noise)."""
    return f"{round(value, 2):g}"


def local_url(port: int, protocol: str = "http") -> str:
    """The URL of a service this machine runs (``ws://`` for WebSocket protocols)."""
    return launch_url(port, protocol)


def swap_group_for_gpu(index: int) -> str:
    """The name of the swap group that shares GPU ``index`` when nothing fits resident."""
    return f"gpu{index}"


# --- packing helpers (pure; also used by harness.runtime.deploywrite) ---------------------


def place_largest_first(
    items: Sequence[tuple[str, float]], room: Mapping[int, float]
) -> tuple[dict[str, int], dict[int, float], list[str]]:
    """Place each ``(key, gb)`` item, largest first (ties by key), on the GPU with the most
    room left (ties to the lower index), taking its memory there.

    Returns ``(key → GPU, room left per GPU, keys that fit nowhere)``; ``room`` is not
    modified. An item that fits nowhere takes nothing, so smaller ones may still fit.
    """
    left = dict(room)
    placed: dict[str, int] = {}
    unplaced: list[str] = []
    for key, need in sorted(items, key=lambda item: (-item[1], item[0])):
        fitting = [g for g, free in left.items() if free + EPS >= need]
        if not fitting:
            unplaced.append(key)
            continue
        best = max(fitting, key=lambda g: (left[g], -g))
        placed[key] = best
        left[best] -= need
    return placed, left, unplaced


def spread_one_at_a_time(
    items: Sequence[tuple[str, float]], room: Mapping[int, float]
) -> tuple[dict[str, int], list[str]]:
    """Spread ``(key, gb)`` items over GPUs that each hold ONE of them at a time (one swap
    group per GPU): an item fits a GPU whose room is at least its own size. Largest first;
    each goes to the GPU with the fewest items so far, then the most room, then the lower
    index, so swapping is spread out. Returns ``(key → GPU, keys that fit nowhere)``.
    """
    counts = {g: 0 for g in room}
    placed: dict[str, int] = {}
    unplaced: list[str] = []
    for key, need in sorted(items, key=lambda item: (-item[1], item[0])):
        fitting = [g for g, free in room.items() if free + EPS >= need]
        if not fitting:
            unplaced.append(key)
            continue
        best = min(fitting, key=lambda g: (counts[g], -room[g], g))
        placed[key] = best
        counts[best] += 1
    return placed, unplaced


# --- the planner ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Unit:
    """What placement moves as one piece: a lone service, or a swap group."""

    key: str  # the service's name, or the swap group's
    members: tuple[str, ...]
    need: float  # GB on its GPU: the service's vram_gb, or the group's largest member's
    mode: Mode  # resident or on_demand
    swap: str | None
    pinned: int | None  # the deploy's explicit GPU, None for auto

    def describe(self, vram: Mapping[str, float]) -> str:
        if self.swap is None:
            return f"{self.key} ({gb(self.need)} GB)"
        largest = max(self.members, key=lambda n: (vram[n], n))
        return (
            f"swap group '{self.swap}' ({', '.join(self.members)}: {gb(self.need)} GB "
            f"for its largest member, {largest})"
        )


class _Planner:
    """One planning pass. Holds the working state so each rule reads as one method; nothing
    here outlives :func:`plan`."""

    def __init__(
        self,
        services: Mapping[str, ServiceManifest],
        deploy: Deploy | None,
        gpus: tuple[Gpu, ...],
        benchmark: BenchmarkManifest | None,
        benchmark_name: str | None = None,
    ) -> None:
        self.services = services
        self.deploy = deploy
        self.benchmark = benchmark
        self.simulator = remote_simulator(benchmark_name, benchmark, deploy)
        self.inventory = visible(gpus, deploy)
        self.free = {g.index: g.free_gb for g in self.inventory}
        self.total = {g.index: g.total_gb for g in self.inventory}
        self.room = dict(self.free)
        self.sim_load: dict[int, float] = {}
        self.sim_count: dict[int, int] = {}
        self.workers: list[SimWorker] = []
        self.placements: dict[str, ServicePlacement] = {}
        self.notes: list[str] = []
        self.off_notes: dict[str, str] = {}  # service → why it is off; listed by name
        self.vram = {name: m.vram_gb for name, m in services.items()}

    # -- entry ---------------------------------------------------------------------------

    def run(self) -> Plan:
        self.place_sim_workers()
        if self.deploy is None:
            self.place_without_deploy()
        else:
            self.place_with_deploy(self.deploy)
        self.check_ports()
        return Plan(
            services=tuple(self.placements[name] for name in sorted(self.placements)),
            sim_workers=tuple(self.workers),
            gpus=self.inventory,
            notes=tuple(self.notes) + tuple(self.off_notes[n] for n in sorted(self.off_notes)),
            simulator=self.simulator,
        )

    # -- simulator workers -----------------------------------------------------------------

    def place_sim_workers(self) -> None:
        sim = self.deploy.sim if self.deploy is not None else None
        if self.simulator is not None:
            # Its simulator runs elsewhere: no worker of it is placed here, and [sim]'s
            # GPUs stay free for models.
            name = self.simulator.benchmark
            where = (
                f"at {self.simulator.url}"
                if self.simulator.url
                else f"no address: the deploy's [benchmarks.{name}] url"
            )
            self.notes.append(
                f"benchmark {name}: its simulator runs elsewhere ({where}); only its client runs here, "
                "no simulator workers" + (" ([sim] is not used)" if sim is not None and sim.gpus else "")
            )
            return
        if sim is None or not sim.gpus:
            return
        missing = [g for g in sim.gpus if g not in self.free]
        if missing:
            raise InputError(
                f"the deploy's [sim] puts simulator workers on GPU {_join(map(str, missing))}, "
                f"which this machine does not have ({describe(self.inventory)})",
                hint=_GPUS_HINT,
            )
        per_worker = self.benchmark.vram_gb if self.benchmark is not None else 0.0
        for gpu in sim.gpus:
            for _ in range(sim.workers_per_gpu):
                index = len(self.workers)
                self.workers.append(SimWorker(index=index, gpu=gpu, port=sim.base_port + index))
            load = per_worker * sim.workers_per_gpu
            if load > self.free[gpu] + EPS:
                raise InputError(
                    f"{_workers(sim.workers_per_gpu)} ({gb(per_worker)} GB each) need "
                    f"{gb(load)} GB on GPU {gpu}, which has {self._has(gpu, with_sim=False)}",
                    hint="lower [sim] workers_per_gpu or spread the workers over more GPUs",
                )
            self.sim_load[gpu] = load
            self.sim_count[gpu] = sim.workers_per_gpu
            self.room[gpu] -= load
        if self.benchmark is None:
            self.notes.append(
                "simulator workers' memory is not counted: no benchmark given "
                "(an agent config's benchmark, or --benchmark)"
            )
        last_port = sim.base_port + len(self.workers) - 1
        if last_port > 65535:
            raise InputError(f"[sim] base_port {sim.base_port}: worker ports run past 65535")

    # -- no deploy ----------------------------------------------------------------------------

    def place_without_deploy(self) -> None:
        on_gpu = []
        for name in sorted(self.services):
            if self.vram[name] <= 0:
                self.put(name, "resident", None, None, "CPU only (vram_gb = 0)")
            else:
                on_gpu.append((name, self.vram[name]))
        if not on_gpu:
            return
        placed, _, unplaced = place_largest_first(on_gpu, self.room)
        if not unplaced:
            for name, gpu in placed.items():
                self.put(
                    name,
                    "resident",
                    gpu,
                    None,
                    f"no deploy, all fit resident: GPU {gpu} had most room",
                )
            return
        # Not everything fits at once: share each GPU one model at a time (seed: "otherwise
        # on demand, sharing a GPU one model at a time").
        needed = sum(need for _, need in on_gpu)
        if self.inventory:
            self.notes.append(
                f"not everything fits resident ({gb(needed)} GB of models, "
                f"{gb(sum(self.room.values()))} GB free): models run on demand, "
                "one at a time per GPU"
            )
        spread, unplaced = spread_one_at_a_time(on_gpu, self.room)
        for name, gpu in spread.items():
            group = swap_group_for_gpu(gpu)
            self.put(
                name,
                "on_demand",
                gpu,
                group,
                f"no deploy, not all fit resident: shares GPU {gpu} one model at a time",
            )
        for name in unplaced:
            self.off_for_room(name, self.vram[name], allowed=set(self.room))

    # -- with a deploy --------------------------------------------------------------------------

    def place_with_deploy(self, deploy: Deploy) -> None:
        from harness.manifests.deploy import ServiceDeploy

        # A service the deploy does not mention is resident on gpu = "auto".
        entries: dict[str, ServiceDeploy] = {
            name: deploy.services.get(name) or ServiceDeploy() for name in sorted(self.services)
        }
        local: dict[str, ServiceDeploy] = {}
        for name, entry in entries.items():
            if entry.mode == "off":
                self.placements[name] = self._placement(name, "off", None, None, None, "off in the deploy")
            elif entry.mode == "external":
                self.placements[name] = ServicePlacement(
                    name=name,
                    mode="external",
                    gpu=None,
                    port=None,
                    url=entry.url,
                    vram_gb=self.vram[name],
                    scoped=self.services[name].scoped,
                    reason=f"external in the deploy: answers at {entry.url}",
                    # Only {url} has a value: harness runs nothing of an external service
                    # (a deploy refuses any other template when it is loaded).
                    client=render_client(name, self.services[name].client, {"url": entry.url or ""}),
                )
            else:
                local[name] = entry

        units = self.units(local)
        pinned: dict[int, list[_Unit]] = {}
        auto: list[_Unit] = []
        for unit in units:
            if unit.need <= 0:
                self.place_cpu(unit)
            elif unit.pinned is not None:
                pinned.setdefault(unit.pinned, []).append(unit)
            else:
                auto.append(unit)
        for gpu in sorted(pinned):
            self.place_pinned(gpu, pinned[gpu])
        self.place_auto(auto)

    def units(self, local: Mapping[str, ServiceDeploy]) -> list[_Unit]:
        """Lone services and swap groups of the services this machine runs."""
        groups: dict[str, list[str]] = {}
        units: list[_Unit] = []
        for name, entry in local.items():
            if entry.swap is not None:
                groups.setdefault(entry.swap, []).append(name)
                continue
            units.append(
                _Unit(
                    name, (name,), self.vram[name], entry.mode, None, entry.gpu if isinstance(entry.gpu, int) else None
                )
            )
        for swap, members in sorted(groups.items()):
            explicit: dict[str, int] = {}
            for n in members:
                if isinstance(pinned := local[n].gpu, int):
                    explicit[n] = pinned
            if len(set(explicit.values())) > 1:
                listed = ", ".join(f"{n} on GPU {g}" for n, g in sorted(explicit.items()))
                raise InputError(
                    f"swap group '{swap}' is pinned to more than one GPU ({listed}); a swap "
                    "group loads one member at a time on ONE GPU",
                    hint=f"give every member of '{swap}' the same gpu, or \"auto\"",
                )
            need = max(self.vram[n] for n in members)
            gpu = next(iter(explicit.values())) if explicit else None
            units.append(_Unit(swap, tuple(sorted(members)), need, "on_demand", swap, gpu))
        return units

    def place_cpu(self, unit: _Unit) -> None:
        """A unit needing no GPU memory always runs; an explicit GPU is kept (it may still
        want CUDA_VISIBLE_DEVICES) but must exist."""
        if unit.pinned is not None and unit.pinned not in self.free:
            self._missing_gpu(unit.pinned, [unit])
        for name in unit.members:
            reason = "CPU only (vram_gb = 0)"
            if unit.pinned is not None:
                reason = f"deploy: GPU {unit.pinned}; needs no GPU memory"
            self.put(name, unit.mode, unit.pinned, unit.swap, reason)

    def place_pinned(self, gpu: int, units: list[_Unit]) -> None:
        """Work the deploy pins to ``gpu``: it fits, or the deploy is infeasible."""
        if gpu not in self.free:
            self._missing_gpu(gpu, units)
        demand = sum(unit.need for unit in units)
        if demand > self.room[gpu] + EPS:
            raise InputError(
                f"{_subject(units, self.vram)} {gb(demand)} GB on GPU {gpu}, which has {self._has(gpu, with_sim=True)}",
                hint=(
                    'move it to a GPU with more room, or let gpu = "auto" choose'
                    if len(units) == 1
                    else 'put them on demand in one swap group (mode = "on_demand", swap = '
                    '"models"), move one to another GPU, or let gpu = "auto" choose'
                ),
            )
        self.room[gpu] -= demand
        for unit in units:
            for name in unit.members:
                if unit.swap is not None:
                    reason = (
                        f"deploy: swap group '{unit.swap}' on GPU {gpu}, one member at a time "
                        f"(room of its largest, {gb(unit.need)} GB)"
                    )
                elif unit.mode == "on_demand":
                    reason = f"deploy: on demand on GPU {gpu}"
                else:
                    reason = f"deploy: resident on GPU {gpu}"
                self.put(name, unit.mode, gpu, unit.swap, reason)

    def place_auto(self, units: list[_Unit]) -> None:
        """``gpu = "auto"``: the GPU with the most room, largest first; never a GPU of the
        simulator's (only an explicit pin shares one)."""
        allowed = {g: free for g, free in self.room.items() if g not in self.sim_load}
        by_key = {unit.key: unit for unit in units}
        placed, left, unplaced = place_largest_first([(unit.key, unit.need) for unit in units], allowed)
        before = dict(allowed)
        for key, need in sorted(((u.key, u.need) for u in units), key=lambda i: (-i[1], i[0])):
            if key not in placed:
                continue
            gpu = placed[key]
            unit = by_key[key]
            had = before[gpu]
            before[gpu] -= need
            for name in unit.members:
                if unit.swap is not None:
                    reason = (
                        f"auto: swap group '{unit.swap}' on GPU {gpu}, most room ({gb(had)} GB "
                        f"free) for its largest ({gb(unit.need)} GB)"
                    )
                else:
                    mode = "on demand" if unit.mode == "on_demand" else "resident"
                    reason = f"auto, {mode}: GPU {gpu} had most room ({gb(had)} GB free)"
                self.put(name, unit.mode, gpu, unit.swap, reason)
        for gpu, free in left.items():
            self.room[gpu] = free
        for key in unplaced:
            unit = by_key[key]
            for name in unit.members:
                self.off_for_room(name, unit.need, allowed=set(allowed), swap=unit.swap)

    # -- shared pieces -------------------------------------------------------------------------

    def off_for_room(self, name: str, need: float, *, allowed: set[int], swap: str | None = None) -> None:
        """``name`` fits no GPU it may use: off for this run, with one line saying why."""
        parts = [f"GPU {g}: {gb(self.room[g])} GB free" for g in sorted(self.room) if g in allowed]
        kept = [g for g in sorted(self.room) if g not in allowed]
        if kept:
            one = len(kept) == 1
            parts.append(
                f"GPU{'' if one else 's'} {_join(kept)} run{'s' if one else ''} the simulator "
                f"workers; gpu = {kept[0]} in the deploy shares {'it' if one else 'one'}"
            )
        detail = "; ".join(parts) if parts else "no GPU here"
        what = f" for its swap group '{swap}'" if swap else ""
        note = f"{name} is off: no GPU with {gb(need)} GB free{what} ({detail})"
        self.off_notes[name] = note
        self.placements[name] = self._placement(name, "off", None, None, None, f"no GPU with {gb(need)} GB free{what}")

    def put(self, name: str, mode: Mode, gpu: int | None, swap: str | None, reason: str) -> None:
        """Record a local (resident or on-demand) placement with its port and URL."""
        entry = self.deploy.services.get(name) if self.deploy is not None else None
        port = entry.port if entry is not None and entry.port is not None else self.services[name].port
        idle = entry.idle_seconds if entry is not None and mode == "on_demand" else None
        self.placements[name] = ServicePlacement(
            name=name,
            mode=mode,
            gpu=gpu,
            port=port,
            url=local_url(port, self.services[name].protocol),
            vram_gb=self.vram[name],
            swap=swap,
            idle_seconds=idle,
            scoped=self.services[name].scoped,
            reason=reason,
        )

    def _placement(
        self, name: str, mode: Mode, gpu: int | None, port: int | None, url: str | None, reason: str
    ) -> ServicePlacement:
        return ServicePlacement(
            name=name,
            mode=mode,
            gpu=gpu,
            port=port,
            url=url,
            vram_gb=self.vram[name],
            scoped=self.services[name].scoped,
            reason=reason,
        )

    def check_ports(self) -> None:
        """Two things on one port would make the second fail to start: refuse the plan."""
        owners: dict[int, str] = {}
        for worker in self.workers:
            owners[worker.port] = f"simulator worker {worker.index}"
        for placement in sorted(self.placements.values(), key=lambda p: p.name):
            if placement.mode not in ("resident", "on_demand") or placement.port is None:
                continue
            other = owners.get(placement.port)
            if other is not None:
                raise InputError(
                    f"port {placement.port} is used by both {other} and {placement.name}",
                    hint=f"set services.{placement.name}.port (or [sim] base_port) in the deploy",
                )
            owners[placement.port] = placement.name

    def _has(self, gpu: int, *, with_sim: bool) -> str:
        """``24 GB`` / ``20 GB free of 24 GB``, and ``minus 9 GB for 1 simulator worker``."""
        free, total = self.free[gpu], self.total[gpu]
        text = f"{gb(free)} GB" if abs(free - total) < EPS else f"{gb(free)} GB free of {gb(total)} GB"
        load = self.sim_load.get(gpu, 0.0)
        if with_sim and load > 0:
            text += f" minus {gb(load)} GB for {_workers(self.sim_count[gpu])}"
        return text

    def _missing_gpu(self, gpu: int, units: list[_Unit]) -> None:
        names = [name for unit in units for name in unit.members]
        raise InputError(
            f"the deploy puts {_join(names)} on GPU {gpu}, which this machine does not have "
            f"({describe(self.inventory)})",
            hint=_GPUS_HINT,
        )


def remote_simulator(
    name: str | None, benchmark: BenchmarkManifest | None, deploy: Deploy | None
) -> RemoteSimulator | None:
    """Where the simulator of benchmark ``name`` runs when its manifest says ``simulator =
    "external"`` (the deploy's ``[benchmarks.<name>] url``, None when it gives none); None for
    a local simulator or no benchmark."""
    if benchmark is None or not benchmark.external:
        return None
    entry = deploy.benchmarks.get(name) if deploy is not None and name is not None else None
    return RemoteSimulator(name or "(benchmark)", entry.url if entry is not None else None, benchmark.identity)


def _join(items: Iterable[object]) -> str:
    words = [str(item) for item in items]
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def _workers(count: int) -> str:
    return f"{count} simulator worker{'s' if count != 1 else ''}"


def _subject(units: list[_Unit], vram: Mapping[str, float]) -> str:
    """``services sam3 (7.2 GB) and simate (14 GB) need`` and the like."""
    singles = [u.describe(vram) for u in sorted(units, key=lambda u: u.key) if u.swap is None]
    groups = [u.describe(vram) for u in sorted(units, key=lambda u: u.key) if u.swap is not None]
    pieces = []
    if singles:
        pieces.append(("service " if len(singles) == 1 else "services ") + _join(singles))
    pieces.extend(groups)
    verb = "needs" if len(singles) + len(groups) == 1 else "need"
    return f"{_join(pieces)} {verb}"


def plan(
    services: Mapping[str, ServiceManifest],
    deploy: Deploy | None,
    gpus: tuple[Gpu, ...],
    *,
    benchmark: BenchmarkManifest | None = None,
    benchmark_name: str | None = None,
) -> Plan:
    """Place ``services`` (name → manifest) on ``gpus`` as ``deploy`` says (see the module
    docstring for the rules).

    ``gpus`` is the machine's whole inventory (NVML or ``--gpus``); the deploy's ``gpus`` and
    ``gpu_memory_gb`` are applied here (:func:`~harness.runtime.inventory.visible`), and the
    plan's ``gpus`` are the visible ones. ``benchmark`` sizes the simulator workers; one whose
    simulator runs elsewhere has none, and the plan's ``simulator`` says where (the deploy's
    ``[benchmarks.<benchmark_name>] url``). Deploy entries for services not in ``services`` are ignored (a closure plans a subset).
    Deterministic; raises :class:`InputError` only for an infeasible or contradictory
    deploy (explicit placement without room, a missing GPU, a swap group on two GPUs, a
    port used twice).
    """
    return _Planner(services, deploy, tuple(gpus), benchmark, benchmark_name).run()


def closure_plan(
    services: Mapping[str, ServiceManifest],
    closure: Closure,
    deploy: Deploy | None,
    gpus: tuple[Gpu, ...],
    benchmarks: Mapping[str, BenchmarkManifest] | None = None,
) -> Plan:
    """The plan of one run: only the services ``closure`` needs, simulator workers sized by
    its benchmark (when ``benchmarks`` has it)."""
    missing = sorted(closure.services - set(services))
    if missing:
        raise InputError(f"no manifest services/{missing[0]}.toml (needed by the agent config)")
    chosen = {name: services[name] for name in sorted(closure.services)}
    benchmark = None
    if closure.benchmark is not None and benchmarks is not None:
        benchmark = benchmarks.get(closure.benchmark)
    return plan(chosen, deploy, gpus, benchmark=benchmark, benchmark_name=closure.benchmark)


def agent_plan(
    services: Mapping[str, ServiceManifest],
    config: AgentConfig,
    deploy: Deploy | None,
    gpus: tuple[Gpu, ...],
    benchmarks: Mapping[str, BenchmarkManifest],
    *,
    benchmark: str | None = None,
) -> tuple[Closure, Plan]:
    """The closure and plan of a run of agent config ``config`` (pure).

    A service the plan turns off for lack of room is treated as one the deploy turns off:
    the skills that need it drop out of the run (and with them any service only they
    needed), and the closure is planned again, until no more drops out (each round only
    removes services, so this ends). The plan still lists the services turned off for room,
    with the note saying why. ``benchmark`` replaces the agent's own.
    """
    from harness.manifests.agent import Closure, services_needed

    kinds = {name: manifest.kind for name, manifest in services.items()}
    off = frozenset(n for n, s in deploy.services.items() if s.mode == "off") if deploy is not None else frozenset()
    dropped: dict[str, ServicePlacement] = {}
    notes: list[str] = []
    while True:
        closure = services_needed(config, kinds, off=off, benchmarks=frozenset(benchmarks))
        if benchmark is not None:
            closure = Closure(closure.services, benchmark, closure.skills_on, closure.skills_dropped)
        planned = closure_plan(services, closure, deploy, gpus, benchmarks)
        for_room = [p for p in planned.services if p.mode == "off" and p.name not in off]
        if not for_room:
            break
        off = off | {p.name for p in for_room}
        dropped.update({p.name: p for p in for_room})
        notes += [n for n in planned.notes if any(n.startswith(f"{p.name} is off") for p in for_room)]
    if dropped:
        kept = tuple(sorted((*planned.services, *dropped.values()), key=lambda p: p.name))
        planned = Plan(kept, planned.sim_workers, planned.gpus, (*notes, *planned.notes), planned.simulator)
    return closure, planned
