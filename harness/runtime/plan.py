"""The placement plan: where and how each service runs. Plain data, shared by the planner
(:mod:`harness.runtime.placement`), the broker and supervisor, and run records.

A plan never changes what a run computes, only where and when (DESIGN invariant 5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Mode = Literal["resident", "on_demand", "external", "off"]


@dataclass(frozen=True)
class Gpu:
    """One GPU of the inventory (real, from NVML, or planned with ``--gpus``)."""

    index: int
    name: str
    total_gb: float
    free_gb: float


@dataclass(frozen=True)
class ServicePlacement:
    """How one service runs."""

    name: str
    mode: Mode
    gpu: int | None  # None: CPU only (vram_gb == 0), external or off
    port: int | None
    url: str | None  # http://127.0.0.1:<port> for local services, the deploy's for external
    vram_gb: float = 0.0
    swap: str | None = None  # swap group: one member loaded at a time on its GPU
    idle_seconds: float | None = None  # on_demand: stop after this long with nothing in flight
    scoped: bool = False  # a policy with memory: a swap-out resets it (reported to callers)
    reason: str = ""  # why the planner chose this (shown by `harness plan`)
    # external: the manifest's client table with {url} filled (the only template it may
    # use); empty for local services, whose LaunchSpec.client holds it filled at launch
    client: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class SimWorker:
    """One simulator worker of ``[sim]``."""

    index: int
    gpu: int
    port: int


@dataclass(frozen=True)
class RemoteSimulator:
    """The simulator of a benchmark whose manifest says ``simulator = "external"``: it runs
    elsewhere, at ``url`` (the deploy's ``[benchmarks.<name>] url``; None when no deploy
    gives one, which a run refuses). Nothing of it is placed here: only its client runs."""

    benchmark: str
    url: str | None
    identity: str | None = None  # the URL path that reports its version and task, if any


@dataclass(frozen=True)
class Plan:
    """Placement of every service of a closure, plus simulator workers (none when the
    benchmark's simulator runs elsewhere: ``simulator`` says where)."""

    services: tuple[ServicePlacement, ...]
    sim_workers: tuple[SimWorker, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)  # e.g. "sam3 is off: no GPU can hold 7.2 GB"
    simulator: RemoteSimulator | None = None

    def service(self, name: str) -> ServicePlacement:
        for placement in self.services:
            if placement.name == name:
                return placement
        raise KeyError(name)

    def swap_groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for placement in self.services:
            if placement.swap:
                groups.setdefault(placement.swap, []).append(placement.name)
        return groups

    def as_json(self) -> dict[str, Any]:
        return {
            "services": [asdict(s) for s in self.services],
            "sim_workers": [asdict(w) for w in self.sim_workers],
            "gpus": [asdict(g) for g in self.gpus],
            "notes": list(self.notes),
            "simulator": asdict(self.simulator) if self.simulator is not None else None,
        }
