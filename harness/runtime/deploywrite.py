"""A deploy written for you (seed): ``harness deploy write``.

For the GPUs this process sees, write a deploy that gives every service a port of its own
and the instance a state folder of its own (so several instances of the project may share a
machine: each has its own broker, logs and pid files, and ``harness down`` of one never
touches another's services; :func:`instance_state`) and picks the first layout that
fits the free memory:

1. **resident**: every model at once;
2. **policies on demand**: policies and world models (kinds ``policy``, ``world_model``)
   on demand in one swap group, the other models resident;
3. **all on demand**: every model but the kinematics (CPU-only services and kind
   ``kinematics``) on demand, one swap group per GPU; a model no GPU can hold is off.

:func:`choose_layout`, :func:`assign_ports` and :func:`render` are pure; :func:`write_deploy`
composes them and checks that the text it returns loads as a :class:`Deploy` and plans
without error on the same inventory. :func:`port_in_use` is the one probe of the machine.
"""

from __future__ import annotations

import hashlib
import re
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from harness.errors import InputError
from harness.runtime.inventory import describe
from harness.runtime.placement import (
    LOCALHOST,
    gb,
    place_largest_first,
    plan,
    spread_one_at_a_time,
    swap_group_for_gpu,
)
from harness.runtime.plan import Gpu, Mode

if TYPE_CHECKING:
    from harness.manifests.model import ServiceManifest

#: Kinds that layout 2 puts on demand together: the big models a run calls least often.
ON_DEMAND_KINDS = ("policy", "world_model")
#: The swap group of layout 2.
POLICY_GROUP = "policies"
KINEMATICS_KIND = "kinematics"

Strategy = Literal["resident", "policies_on_demand", "all_on_demand"]


@dataclass(frozen=True)
class Choice:
    """One service's entry in a written deploy (port assigned later, for running ones)."""

    name: str
    mode: Mode
    gpu: int | None
    swap: str | None
    why: str  # the comment written above the entry


@dataclass(frozen=True)
class Layout:
    """What :func:`choose_layout` decided: a strategy, why, and every service's entry."""

    strategy: Strategy
    summary: tuple[str, ...]  # header comment lines
    choices: tuple[Choice, ...]  # sorted by name

    def running(self) -> list[str]:
        """Services that run here and so need a port."""
        return [c.name for c in self.choices if c.mode in ("resident", "on_demand")]

    def described(self) -> str:
        """What the deploy writes, by mode (``resident: kinematics; off: sam3, …``): the
        strategy's name alone would say "all on demand" of a machine where every model is off."""
        parts = []
        for mode in ("resident", "on_demand", "external", "off"):
            names = [c.name for c in self.choices if c.mode == mode]
            if names:
                parts.append(f"{mode.replace('_', ' ')}: {', '.join(names)}")
        return "; ".join(parts) or "no services"


def _is_kinematics(manifest: ServiceManifest) -> bool:
    return manifest.vram_gb <= 0 or manifest.kind == KINEMATICS_KIND


@dataclass(frozen=True)
class _Fit:
    """What every layout is tried on (:func:`_fit`): the services to place and the GPUs' room.

    ``included`` are the services not left out, by name in order; ``models`` the ``(name,
    vram_gb)`` of those that need a GPU; ``room`` each GPU's free GB; ``fixed`` the entries
    every layout shares (the left out, off; the CPU-only, resident); ``seen`` the summary's
    "N GB of models, M GB free"."""

    included: dict[str, ServiceManifest]
    models: list[tuple[str, float]]
    room: dict[int, float]
    fixed: dict[str, Choice]
    seen: str

    def layout(self, strategy: Strategy, summary: list[str], chosen: Mapping[str, Choice]) -> Layout:
        """The layout of ``strategy``: the shared entries and ``chosen``, sorted by name."""
        choices = {**self.fixed, **chosen}
        return Layout(strategy, tuple(summary), tuple(choices[n] for n in sorted(choices)))


def choose_layout(
    services: Mapping[str, ServiceManifest],
    gpus: tuple[Gpu, ...],
    *,
    left_out: Mapping[str, str] | None = None,
) -> Layout:
    """Pick the first layout (see the module docstring) that fits the GPUs' free memory.

    ``left_out`` (service → why) are written ``mode = "off"`` with that reason, e.g. the
    services an agent's run does not need. Deterministic for equal inputs.
    """
    fit = _fit(services, gpus, dict(left_out or {}))
    return _all_resident(fit) or _policies_on_demand(fit) or _all_on_demand(fit, has_gpus=bool(gpus))


def _fit(services: Mapping[str, ServiceManifest], gpus: tuple[Gpu, ...], left_out: dict[str, str]) -> _Fit:
    """Sort the services out: the left out are off, the CPU-only resident, the rest models."""
    room = {g.index: g.free_gb for g in gpus}
    included = {n: m for n, m in sorted(services.items()) if n not in left_out}
    fixed: dict[str, Choice] = {name: Choice(name, "off", None, None, f"off: {why}") for name, why in left_out.items()}
    for name in [n for n, m in included.items() if m.vram_gb <= 0]:
        fixed[name] = Choice(name, "resident", None, None, "CPU only (vram_gb = 0): always runs")
    models = [(n, m.vram_gb) for n, m in included.items() if m.vram_gb > 0]
    seen = f"{gb(sum(v for _, v in models))} GB of models, {gb(sum(room.values()))} GB free"
    return _Fit(included, models, room, fixed, seen)


def _all_resident(fit: _Fit) -> Layout | None:
    """Layout 1: every model resident at once; None when they do not all fit."""
    placed, _, unplaced = place_largest_first(fit.models, fit.room)
    if unplaced:
        return None
    chosen = {
        name: Choice(name, "resident", gpu, None, f"resident on GPU {gpu} ({gb(fit.included[name].vram_gb)} GB)")
        for name, gpu in placed.items()
    }
    summary = [f"Every model fits the free memory at once ({fit.seen}):", "all are resident."]
    if not fit.models:
        summary = ["No service here needs a GPU: every one is resident."]
    return fit.layout("resident", summary, chosen)


def _policies_on_demand(fit: _Fit) -> Layout | None:
    """Layout 2: policies and world models on demand in one swap group (as big as its largest
    member), the other models resident; None without such a model, or when that does not fit."""
    group = [(n, v) for n, v in fit.models if fit.included[n].kind in ON_DEMAND_KINDS]
    if not group:
        return None
    others = [(n, v) for n, v in fit.models if fit.included[n].kind not in ON_DEMAND_KINDS]
    key = f"swap group '{POLICY_GROUP}'"  # not a service name: names are lowercase words
    largest = max(v for _, v in group)
    placed, _, unplaced = place_largest_first([*others, (key, largest)], fit.room)
    if unplaced:
        return None
    gpu = placed[key]
    chosen = {
        name: Choice(name, "resident", placed[name], None, f"resident on GPU {placed[name]} ({gb(vram)} GB)")
        for name, vram in others
    }
    for name, vram in group:
        chosen[name] = Choice(
            name,
            "on_demand",
            gpu,
            POLICY_GROUP,
            f"on demand in swap group '{POLICY_GROUP}' on GPU {gpu} ({gb(vram)} GB; the "
            f"group needs {gb(largest)} GB, its largest member)",
        )
    members = ", ".join(n for n, _ in group)
    return fit.layout(
        "policies_on_demand",
        [
            f"Not every model fits at once ({fit.seen}): policies and world models",
            f"({members}) are on demand in one swap group on GPU {gpu}, loaded one at",
            "a time; the other models stay resident.",
        ],
        chosen,
    )


def _all_on_demand(fit: _Fit, *, has_gpus: bool) -> Layout:
    """Layout 3, which always fits: the kinematics resident where they fit, every other model
    (and a kinematics that does not fit) on demand, one swap group per GPU; a model no GPU can
    hold is off."""
    kept_on_gpu = [(n, v) for n, v in fit.models if _is_kinematics(fit.included[n])]
    placed, left, _ = place_largest_first(kept_on_gpu, fit.room)  # the unplaced join the shared
    chosen: dict[str, Choice] = {}
    for name, gpu in placed.items():
        vram = gb(fit.included[name].vram_gb)
        chosen[name] = Choice(name, "resident", gpu, None, f"kinematics stays resident on GPU {gpu} ({vram} GB)")
    spread, unplaced = spread_one_at_a_time([(n, v) for n, v in fit.models if n not in placed], left)
    for name, gpu in spread.items():
        swap = swap_group_for_gpu(gpu)
        vram = gb(fit.included[name].vram_gb)
        why = f"on demand in swap group '{swap}' on GPU {gpu} ({vram} GB; one model at a time)"
        chosen[name] = Choice(name, "on_demand", gpu, swap, why)
    for name in unplaced:
        why = f"off: needs {gb(fit.included[name].vram_gb)} GB and no GPU here has that much free"
        chosen[name] = Choice(name, "off", None, None, why)
    return fit.layout("all_on_demand", _all_on_demand_summary(fit, unplaced, has_gpus=has_gpus), chosen)


def _all_on_demand_summary(fit: _Fit, unplaced: list[str], *, has_gpus: bool) -> list[str]:
    """Layout 3's header lines: why it was chosen, and what is off for want of room."""
    if not has_gpus:
        return ["No GPU here: every model is off; CPU-only services (the kinematics) still run."]
    summary = [
        f"Not every model fits at once ({fit.seen}), nor with policies and world",
        "models sharing one swap group: every model but the kinematics is on demand, one",
        "swap group per GPU, so each GPU holds one model at a time.",
    ]
    if unplaced:
        summary.append(f"Off because no GPU can hold them: {', '.join(sorted(unplaced))}.")
    return summary


def assign_ports(wanted: Mapping[str, int], taken: Callable[[int], bool]) -> dict[str, int]:
    """A distinct port per service: its manifest's port (``wanted``) when that is free, else
    the next port up that is not ``taken`` (in use on this machine), not given to another
    service here and not another service's wanted port.

    Displaced services move; the others keep their ports (no cascade). Deterministic for a
    given ``taken``. Raises :class:`InputError` when no port is left below 65536.
    """
    order = sorted(wanted.items(), key=lambda item: (item[1], item[0]))
    given: dict[str, int] = {}
    used: set[int] = set()
    for name, port in order:  # first pass: everyone whose own port is free keeps it
        if port not in used and not taken(port):
            given[name] = port
            used.add(port)
    reserved = set(wanted.values())
    for name, start in order:  # second pass: the displaced take the next port nobody wants
        if name in given:
            continue
        port = start + 1
        while port in used or port in reserved or taken(port):
            port += 1
            if port > 65535:
                raise InputError(f"no free port for {name} from {start} up to 65535")
        given[name] = port
        used.add(port)
    return given


def port_in_use(port: int) -> bool:
    """Whether something on this machine holds ``port`` on the loopback address.

    Binding without SO_REUSEADDR fails for a listener on 127.0.0.1 or 0.0.0.0 (and for a
    socket in TIME_WAIT, which errs on the side of another port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOCALHOST, port))
        except OSError:
            return True
    return False


def instance_state(home: Path, project_root: Path, deploy: Path) -> Path:
    """The state folder of the instance that the deploy file ``deploy`` describes:
    ``$HARNESS_HOME/state/<project>-<deploy's stem>-<hash of both paths>``, so rewriting the
    same file keeps its folder (and a broker running there stays reachable) and no two
    deploy files share one; where another user has that name (a member of a shared home made
    it first), this user's own ``…-<random>`` (:func:`~harness.runtime.supervisor.own_state_folder`)."""
    from harness.runtime.supervisor import own_state_folder

    project, path = project_root.expanduser().resolve(), deploy.expanduser().resolve()
    key = hashlib.sha256(f"{project}\0{path}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^A-Za-z0-9_-]", "-", path.stem).strip("-") or "deploy"
    return own_state_folder(home / "state", f"{project.name}-{stem}-{key}")


def render(
    layout: Layout, gpus: tuple[Gpu, ...], ports: Mapping[str, int], *, machine: str, state: Path | None = None
) -> str:
    """The deploy as TOML text with comments saying why (tomlkit keeps them in place)."""
    import tomlkit

    doc = tomlkit.document()
    header = [
        f"Deploy for {machine}, written by `harness deploy write` for the GPUs it saw:",
        *(f"  {line}" for line in describe(gpus).split("; ")),
        *layout.summary,
        "Every service has a port of its own (its manifest's, or the next free one), so",
        "several instances of the project can share this machine. Edit freely;",
        "`harness --deploy THIS_FILE plan` shows the result.",
    ]
    for line in header:
        doc.add(tomlkit.comment(line))
    doc.add(tomlkit.nl())
    if state is not None:
        doc.add(
            tomlkit.comment("This instance's own broker, logs and pid files: `harness down` stops only its services.")
        )
        doc["state"] = str(state)
    doc["gpus"] = [g.index for g in gpus]

    services = tomlkit.table(is_super_table=True)
    for choice in layout.choices:
        table = tomlkit.table()
        table.add(tomlkit.comment(choice.why))
        if choice.gpu is not None:
            table["gpu"] = choice.gpu
        table["mode"] = choice.mode
        if choice.swap is not None:
            table["swap"] = choice.swap
        if choice.name in ports:
            table["port"] = ports[choice.name]
        services[choice.name] = table
    doc["services"] = services
    return tomlkit.dumps(doc)


def write_deploy(
    services: Mapping[str, ServiceManifest],
    gpus: tuple[Gpu, ...],
    *,
    taken: Callable[[int], bool] = lambda port: False,
    machine: str = "this machine",
    left_out: Mapping[str, str] | None = None,
    preferred: Mapping[str, int] | None = None,
    state: Path | None = None,
) -> tuple[str, Layout]:
    """The deploy text for ``gpus`` and the layout it encodes.

    ``taken`` says which ports are in use (pass :func:`port_in_use` for this machine, plus
    the ports other deploys reserved: :mod:`harness.runtime.portregistry`). ``preferred``
    ports replace the manifests' as the ports services want (an earlier write's). ``state``
    is the instance's state folder (:func:`instance_state`), written as the deploy's ``state``.
    The text is checked before it is returned: it validates as a :class:`Deploy` and
    :func:`~harness.runtime.placement.plan` accepts it on ``gpus``; a failure there is a
    bug in this module and raises RuntimeError.
    """
    from harness.manifests.deploy import Deploy

    layout = choose_layout(services, gpus, left_out=left_out)
    running = set(layout.running())
    ports = assign_ports({n: (preferred or {}).get(n, services[n].port) for n in running}, taken)
    text = render(layout, gpus, ports, machine=machine, state=state)
    try:
        deploy = Deploy.model_validate(tomllib.loads(text))
        plan(services, deploy, gpus)
    except Exception as exc:  # the contract above: never hand out a deploy that fails
        raise RuntimeError(f"harness wrote a deploy it cannot plan: {exc}\n{text}") from exc
    return text, layout


def default_path(deploy_dir: Path, hostname: str | None = None) -> Path:
    """``configs/deploy/<hostname>.toml``: git ignores it (only example-*.toml are tracked)."""
    raw = (hostname if hostname is not None else socket.gethostname()).split(".")[0]
    name = re.sub(r"[^A-Za-z0-9_-]", "-", raw).strip("-") or "this-machine"
    if name.startswith("example-"):  # example-*.toml are the tracked examples
        name = f"host-{name}"
    return deploy_dir / f"{name}.toml"
