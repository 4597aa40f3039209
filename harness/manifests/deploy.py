"""Deploys: how one machine runs the project's services (``configs/deploy/<machine>.toml``).

A deploy never changes what a run computes, only where and when (DESIGN invariant 5). It is
validated on its own (:class:`Deploy`) and against the project's manifests
(:func:`check_deploy_against`), since it may only name services that exist.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from harness.errors import InputError
from harness.manifests.model import Port, Strict

Mode = Literal["resident", "on_demand", "external", "off"]


class Sim(Strict):
    """Simulator workers of ``harness run``: ``workers_per_gpu`` on each of ``gpus``."""

    gpus: list[int] = Field(default_factory=list)
    workers_per_gpu: int = Field(default=1, ge=1, le=64)
    base_port: Port = 8771

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, values: list[int]) -> list[int]:
        return _gpu_list(values)


class ServiceDeploy(Strict):
    """How one service runs on this machine."""

    gpu: int | Literal["auto"] | None = Field(default=None, description="GPU index or 'auto'")
    mode: Mode = "resident"
    swap: str | None = Field(default=None, description="swap group: one member loaded at a time")
    idle_seconds: float | None = Field(default=None, gt=0)
    url: str | None = Field(default=None, description="where an external service answers")
    port: Port | None = Field(default=None, description="overrides the manifest's port")

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 0:
            raise ValueError("gpu must be a non-negative index or 'auto'")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ServiceDeploy:
        if self.mode == "external" and not self.url:
            raise ValueError("mode 'external' needs a url")
        if self.url and self.mode != "external":
            raise ValueError("url applies to mode = 'external' only")
        if self.swap is not None and self.mode != "on_demand":
            raise ValueError("swap groups load one member at a time: swap needs mode = 'on_demand'")
        if self.idle_seconds is not None and self.mode != "on_demand":
            raise ValueError("idle_seconds applies to mode = 'on_demand' only")
        return self


class BrokerDeploy(Strict):
    """``[broker]``: limits of the broker that serves this machine's services."""

    lease_seconds: float | None = Field(default=None, gt=0, description="reclaim a lease held longer")
    gpu_wait_seconds: float = Field(default=120.0, gt=0, description="after a swap, wait this long for GPU memory")


class Deploy(Strict):
    """``configs/deploy/<machine>.toml``: GPUs, paths and service modes for one machine."""

    weights: str | None = Field(default=None, description="where weight views live")
    state: str | None = Field(default=None, description="logs and pid files")
    gpus: list[int] | None = Field(default=None, description="GPUs the project may use")
    gpu_memory_gb: float | None = Field(default=None, gt=0, le=4096)
    sim: Sim | None = None
    broker: BrokerDeploy | None = None
    services: dict[str, ServiceDeploy] = Field(default_factory=dict)
    substituters: list[str] = Field(default_factory=list, description="binary caches to pull from")
    trusted_keys: list[str] = Field(default_factory=list, alias="trusted-keys")

    # Spelled out (not Strict.model_config | {...}) so the pydantic mypy plugin sees it.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, populate_by_name=True)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, values: list[int] | None) -> list[int] | None:
        return None if values is None else _gpu_list(values)

    @model_validator(mode="after")
    def _gpus_known(self) -> Deploy:
        if self.gpus is None:
            return self
        allowed = set(self.gpus)
        for name, service in self.services.items():
            if isinstance(service.gpu, int) and service.gpu not in allowed:
                raise ValueError(f"services.{name}.gpu {service.gpu} is not in gpus {self.gpus}")
        if self.sim is not None:
            stray = [g for g in self.sim.gpus if g not in allowed]
            if stray:
                raise ValueError(f"sim.gpus {stray} are not in gpus {self.gpus}")
        return self


def _gpu_list(values: list[int]) -> list[int]:
    if any(v < 0 for v in values):
        raise ValueError("GPU indexes are non-negative")
    if len(set(values)) != len(values):
        raise ValueError("a GPU is listed twice")
    return values


def check_deploy_against(deploy: Deploy, service_names: set[str], shown: str) -> None:
    """A deploy may only configure services that have a manifest."""
    unknown = sorted(set(deploy.services) - service_names)
    if unknown:
        import difflib

        lines = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(service_names), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            lines.append(f"{shown}: services.{name}: no manifest services/{name}.toml{hint}")
        raise InputError("\n".join(lines))
