"""Deploys: how one machine runs the project's services (``configs/deploy/<machine>.toml``).

A deploy never changes what a run computes, only where and when (DESIGN invariant 5). It is
validated on its own (:class:`Deploy`) and against the project's manifests
(:func:`check_deploy_against`), since it may only name services that exist.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from harness.errors import InputError
from harness.manifests.model import Port, Strict

Mode = Literal["resident", "on_demand", "external", "off"]


class Sim(Strict):
    """Simulator workers of ``harness run``: ``workers_per_gpu`` on each of ``gpus``."""

    gpus: list[int] = Field(default_factory=list, description="The GPUs simulator workers run on (distinct indexes).")
    workers_per_gpu: int = Field(default=1, ge=1, le=64, description="Workers started on each of those GPUs, 1-64.")
    base_port: Port = Field(default=8771, description="The first worker's port; the others follow it.")

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, values: list[int]) -> list[int]:
        return _gpu_list(values)


class ServiceDeploy(Strict):
    """How one service runs on this machine."""

    gpu: int | Literal["auto"] | None = Field(
        default=None,
        description='The GPU it runs on; "auto" (like unset) lets placement choose the GPU with the most room '
        "for its vram_gb, largest services first; a swap group's members share one GPU.",
    )
    mode: Mode = Field(
        default="resident",
        description="resident: started before the first episode (or by harness up) and kept; on_demand: started "
        "by the broker on first call, stopped after idle_seconds or when a swap peer needs the GPU; external: "
        "someone else runs it at url, nothing is installed; off: not on this machine (its skills drop out).",
    )
    swap: str | None = Field(
        default=None,
        description='A swap group name: its members share a GPU, one loaded at a time. Needs mode = "on_demand".',
    )
    idle_seconds: float | None = Field(
        default=None,
        gt=0,
        description='Stop the service after this long with no lease (never, when unset). Needs mode = "on_demand".',
    )
    url: str | None = Field(
        default=None,
        description='Where an external service answers; required by, and only allowed with, mode = "external".',
    )
    port: Port | None = Field(default=None, description="The port on this machine, instead of the manifest's.")

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


class BenchmarkDeploy(Strict):
    """How one benchmark runs on this machine: where its remote simulator answers."""

    url: str = Field(
        description='Where the simulator of a benchmark whose manifest says simulator = "external" answers '
        "(http://host:port, ws://…); its worker, the simulator's client, gets it as {url} and "
        "HARNESS_SIMULATOR_URL, and every run records it. Only for such a benchmark.",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^(https?|wss?)://[^\s/]+(/[^\s]*)?$", value):
            raise ValueError(f"url must be an http(s):// or ws(s):// address, got {value!r}")
        return value.rstrip("/")


class SlurmDeploy(Strict):
    """``[slurm]``: what a ``--cluster slurm`` run's array job asks Slurm for (``--slurm
    KEY=VALUE`` on the command line wins, key by key)."""

    partition: str | None = Field(default=None, min_length=1, description="sbatch --partition.")
    account: str | None = Field(default=None, min_length=1, description="sbatch --account, charged for the job.")
    qos: str | None = Field(default=None, min_length=1, description="sbatch --qos, the quality of service.")
    time: str | None = Field(
        default=None,
        description="Each task's time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, as sbatch "
        "--time takes it (default 24 hours).",
    )
    mem: str | None = Field(
        default=None,
        description="Each task's memory, as sbatch --mem takes it: a number with an optional K, M, G or T (32G).",
    )
    gpus: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="GPUs per shard (sbatch --gpus-per-node), instead of what the run's plan places services on: "
        "the head may have none, while the nodes do.",
    )

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None:
            slurm_minutes(value)  # raises ValueError naming the forms
        return value

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[1-9][0-9]*[KMGT]?", value):
            raise ValueError(f"mem {value!r}: give a number with an optional K, M, G or T, as 32G")
        return value


def slurm_minutes(text: str) -> int:
    """Slurm's time limit (``--time``) in whole minutes, rounded up. Pure. Forms: ``M``,
    ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; a ValueError names them."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if match is None:
        raise ValueError(f"time {text!r}: give minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    days, first, second, third = match.groups()
    if days is not None:  # D-H[:M[:S]]
        seconds = int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    elif third is not None:  # H:M:S
        seconds = int(first) * 3600 + int(second) * 60 + int(third)
    elif second is not None:  # M:S
        seconds = int(first) * 60 + int(second)
    else:  # M
        seconds = int(first) * 60
    if seconds <= 0:
        raise ValueError(f"time {text!r}: the limit must be above zero")
    return -(-seconds // 60)


class BrokerDeploy(Strict):
    """``[broker]``: limits of the broker that serves this machine's services."""

    lease_seconds: float | None = Field(
        default=None,
        gt=0,
        description="A lease held longer is reclaimed, and its holder's release fails with 410 lease_expired "
        "(no limit when unset).",
    )
    gpu_wait_seconds: float = Field(
        default=120.0,
        gt=0,
        description="After a swap, how long the next member waits for its GPU's free memory to hold its vram_gb "
        "before its start fails.",
    )


class Deploy(Strict):
    """``configs/deploy/<machine>.toml``: GPUs, paths and service modes for one machine."""

    weights: str | None = Field(
        default=None,
        min_length=1,
        description="A folder on this machine that already holds weight files (an offline cluster's shared disk, "
        "an older install's downloads), laid out as a service's {weights} view: <folder>/<dir>/<file path>. "
        "Realize copies a file from there when its size matches the lock, keeps the copy only if its sha256 "
        "does, and otherwise warns and fetches the file from its hub. ~ and $VARS are expanded; a relative path "
        "is relative to the deploy file's folder; a folder that does not exist is warned about once a weight file "
        "is to be fetched, and every file then comes from its hub. {weights} still names the service's view in the store.",
    )
    state: str | None = Field(
        default=None,
        description="The folder for the started services' logs, pid files and the broker's state (default: one "
        "per project under $HARNESS_HOME/state; `harness deploy write` writes one of its own for each deploy file, so "
        "two instances on one machine never share a broker). It must be a folder of the caller's own (or a link they "
        "made to one): one another user owns is refused, since they could replace what harness writes there; the "
        "default one, where another user has it first, is a folder of the caller's own beside it.",
    )
    gpus: list[int] | None = Field(
        default=None,
        description="The GPUs the project may use (every GPU found, when unset); every integer services.<name>.gpu "
        "and sim.gpus entry must be in it.",
    )
    gpu_memory_gb: float | None = Field(
        default=None,
        gt=0,
        le=4096,
        description="The project's share of each GPU in GB: total and free memory are capped at it when planning "
        "(as measured, when unset).",
    )
    variant: str | None = Field(
        default=None,
        description="The accelerator variant of every lock that has variants (cpu, cu128) this machine runs, "
        "instead of what its driver supports (--variant and HARNESS_VARIANT come first).",
    )
    sim: Sim | None = Field(default=None, description="Simulator workers of harness run.")
    broker: BrokerDeploy | None = Field(default=None, description="Limits of the broker.")
    slurm: SlurmDeploy | None = Field(default=None, description="What a --cluster slurm run's array job asks for.")
    services: dict[str, ServiceDeploy] = Field(
        default_factory=dict,
        description="How each service runs here, by manifest name; a name without a manifest is an error.",
    )
    benchmarks: dict[str, BenchmarkDeploy] = Field(
        default_factory=dict,
        description='How each benchmark runs here, by manifest name: the url of one whose simulator = "external"; '
        "a name without a benchmark manifest, or one whose simulator is local, is an error.",
    )
    substituters: list[str] = Field(
        default_factory=list,
        description="Binary caches realize pulls store paths from (a folder, s3://, http(s)://), added to the "
        "settings' [cache] substituters.",
    )
    trusted_keys: list[str] = Field(
        default_factory=list,
        alias="trusted-keys",
        description="Public keys (name:base64) whose signatures on cached built paths are accepted, added to "
        "the settings' [cache] trusted-keys; trusted_keys is accepted too.",
    )

    # Spelled out (not Strict.model_config | {...}) so the pydantic mypy plugin sees it.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, populate_by_name=True)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, values: list[int] | None) -> list[int] | None:
        return None if values is None else _gpu_list(values)

    def weights_folder(self, deploy_file: Path) -> Path | None:
        """The ``weights`` folder as an absolute path, or None when the key is unset.

        ``~`` and ``$VARS`` are expanded (an unset variable is left as written, so the error
        for the folder shows it); a relative path is taken from ``deploy_file``'s folder, so a
        deploy means the same folder from any working directory. Whether it exists is the
        caller's question (:meth:`harness.realize.fetch.LocalWeights.check`).
        """
        if self.weights is None:
            return None
        folder = Path(os.path.expanduser(os.path.expandvars(self.weights)))
        return folder if folder.is_absolute() else Path(os.path.abspath(deploy_file.parent / folder))

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


def check_deploy_benchmarks(deploy: Deploy, simulators: Mapping[str, str], shown: str) -> None:
    """A deploy's ``[benchmarks.<name>]`` must name a benchmark whose simulator runs
    elsewhere. ``simulators`` maps each benchmark manifest's name to its ``simulator``."""
    lines = []
    for name in sorted(deploy.benchmarks):
        where = simulators.get(name)
        if where is None:
            import difflib

            close = difflib.get_close_matches(name, sorted(simulators), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            lines.append(f"{shown}: benchmarks.{name}: no manifest benchmarks/{name}.toml{hint}")
        elif where != "external":
            lines.append(
                f"{shown}: benchmarks.{name}.url: benchmarks/{name}.toml runs its simulator here (simulator = "
                f'"{where}"); a url applies to a benchmark whose manifest says simulator = "external"'
            )
    if lines:
        raise InputError("\n".join(lines))


#: The one template an external service's ``client`` table may use: harness runs nothing of
#: it, so its interpreter, port, weights and sources have no value here.
EXTERNAL_CLIENT_TEMPLATES = frozenset({"url"})


def check_external_clients(deploy: Deploy, clients: Mapping[str, tuple[str, Mapping[str, str]]], shown: str) -> None:
    """Refuse a service the deploy makes external whose manifest's ``client`` table uses a
    template other than ``{url}``. ``clients`` maps such a service's name to its manifest's
    display path and ``client`` table (templates already checked by the manifest model)."""
    lines = []
    for name in sorted(clients):
        entry = deploy.services.get(name)
        if entry is None or entry.mode != "external":
            continue
        manifest, table = clients[name]
        for key in sorted(table):
            used = [f for _, f, _, _ in string.Formatter().parse(table[key]) if f is not None]
            wrong = sorted({f for f in used if f not in EXTERNAL_CLIENT_TEMPLATES})
            if wrong:
                named = ", ".join("{" + ("source:NAME" if f == "source" else f) + "}" for f in wrong)
                lines.append(
                    f'{shown}: services.{name}: mode = "external", but {manifest}: client.{key} uses {named}; '
                    "an external service's client table may use only {url} (harness runs nothing of it, so "
                    "{python}, {port}, {weights} and {source:NAME} have no value)"
                )
    if lines:
        raise InputError("\n".join(lines))
