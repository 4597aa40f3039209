"""Placement: the GPU inventory, the planner on the seed's deploys, written deploys, and
``harness plan`` / ``harness deploy write`` through the real CLI.

Pure tests: manifests and deploys are the project's own files or models built here; the
only code run besides the planner is the CLI, in-process.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from harness.errors import InputError
from harness.manifests.agent import AgentConfig, services_needed
from harness.manifests.deploy import Deploy
from harness.manifests.model import BenchmarkManifest, ServiceManifest
from harness.manifests.project import Project
from harness.runtime.deploywrite import assign_ports, default_path, write_deploy
from harness.runtime.inventory import detect_gpus, parse_gpus, visible
from harness.runtime.placement import agent_plan, closure_plan, plan
from harness.runtime.plan import Gpu, Plan
from tests.conftest import REPO

PROJECT = Project(REPO)
# The seed's services, so services other work adds to the project cannot move these tests.
SERVICES = {
    name: manifest
    for name, manifest in PROJECT.load_services().items()
    if name in ("kinematics", "molmo2", "openwam", "sam3", "simate", "smolvla")
}
ROBODOJO = PROJECT.load_benchmarks()["robodojo"]  # 8 GB per simulator worker


def example(name: str) -> Deploy:
    return PROJECT.load_deploy(REPO / "configs" / "deploy" / f"example-{name}.toml")


def service(vram_gb: float, port: int, kind: str = "segmenter", **extra: Any) -> ServiceManifest:
    return ServiceManifest.model_validate(
        {
            "kind": kind,
            "summary": "test service",
            "command": ["{python}", "serve.py", "{port}"],
            "port": port,
            "vram_gb": vram_gb,
            "environment": {"python": "3.11"},
            **extra,
        }
    )


def benchmark(vram_gb: float) -> BenchmarkManifest:
    return BenchmarkManifest.model_validate(
        {"summary": "test benchmark", "vram_gb": vram_gb, "environment": {"python": "3.11"}}
    )


def deploy(**data: Any) -> Deploy:
    return Deploy.model_validate(data)


def gpus_load(result: Plan) -> dict[int, float]:
    """GB each GPU must hold at worst: residents plus the largest member of each swap group."""
    load: dict[int, float] = {}
    groups: dict[tuple[int, str], float] = {}
    for p in result.services:
        if p.gpu is None or p.mode not in ("resident", "on_demand"):
            continue
        if p.swap is None:
            load[p.gpu] = load.get(p.gpu, 0) + p.vram_gb
        else:
            key = (p.gpu, p.swap)
            groups[key] = max(groups.get(key, 0), p.vram_gb)
    for (gpu, _), need in groups.items():
        load[gpu] = load.get(gpu, 0) + need
    return load


# --- the seed's four deploys -----------------------------------------------------------------


def test_four_gpus_example_matches_the_seed() -> None:
    result = plan(SERVICES, example("four-gpus"), parse_gpus("4x24"), benchmark=ROBODOJO)
    for name in ("sam3", "simate"):
        assert (result.service(name).mode, result.service(name).gpu) == ("resident", 0)
    for name in ("molmo2", "openwam"):
        p = result.service(name)
        assert (p.mode, p.gpu, p.swap) == ("on_demand", 1, "experiments")
    assert result.swap_groups() == {"experiments": ["molmo2", "openwam"]}
    assert [(w.gpu, w.port) for w in result.sim_workers] == [(2, 8771), (2, 8772), (3, 8773), (3, 8774)]
    kinematics = result.service("kinematics")
    assert (kinematics.mode, kinematics.gpu, kinematics.url) == ("resident", None, "http://127.0.0.1:8830")
    assert result.service("sam3").url == "http://127.0.0.1:8810"
    assert result.service("simate").scoped
    # Nothing the deploy does not mention lands on the simulator's GPUs.
    assert all(p.gpu not in (2, 3) for p in result.services)


def test_two_gpus_example_matches_the_seed() -> None:
    result = plan(SERVICES, example("two-gpus"), parse_gpus("2x24"), benchmark=ROBODOJO)
    for name in ("sam3", "simate"):
        assert (result.service(name).mode, result.service(name).gpu) == ("resident", 1)
    assert [(w.gpu, w.port) for w in result.sim_workers] == [(0, 8771), (0, 8772)]


def test_one_gpu_example_puts_sam3_and_simate_in_one_swap_group() -> None:
    result = plan(SERVICES, example("one-gpu"), parse_gpus("1x24"), benchmark=ROBODOJO)
    for name in ("sam3", "simate"):
        p = result.service(name)
        assert (p.mode, p.gpu, p.swap) == ("on_demand", 0, "models")
    assert result.swap_groups() == {"models": ["sam3", "simate"]}
    assert [(w.gpu, w.port) for w in result.sim_workers] == [(0, 8771)]
    # 24 GB minus one 8 GB worker leaves 16: the group needs its largest member, 14 GB.
    assert gpus_load(result)[0] == 14


def test_no_gpu_example_turns_every_model_off_but_kinematics_runs() -> None:
    result = plan(SERVICES, example("no-gpu"), parse_gpus("1x24"), benchmark=ROBODOJO)
    for p in result.services:
        if SERVICES[p.name].vram_gb > 0:
            assert p.mode == "off" and p.gpu is None and p.url is None, p
            assert any(note.startswith(f"{p.name} is off: no GPU with") for note in result.notes)
    assert result.service("kinematics").mode == "resident"
    assert "sam3 is off: no GPU with 7.2 GB free (GPU 0 runs the simulator workers" in "\n".join(result.notes)


def test_no_gpu_at_all_turns_models_off_with_a_note() -> None:
    result = plan(SERVICES, None, ())
    assert result.service("sam3").mode == "off"
    assert "sam3 is off: no GPU with 7.2 GB free (no GPU here)" in result.notes
    assert result.service("kinematics").mode == "resident"


# --- without a deploy ----------------------------------------------------------------------------


def test_without_deploy_everything_resident_when_it_fits() -> None:
    result = plan(SERVICES, None, parse_gpus("4x80"))
    assert {p.mode for p in result.services} == {"resident"}
    assert all(p.swap is None for p in result.services)
    assert all(load <= 80 for load in gpus_load(result).values())
    # Largest first on the GPU with the most room: the four biggest get a GPU each.
    assert [result.service(n).gpu for n in ("openwam", "molmo2", "simate", "sam3")] == [0, 1, 2, 3]


def test_without_deploy_not_fitting_goes_on_demand_one_model_per_gpu() -> None:
    result = plan(SERVICES, None, parse_gpus("2x24"))
    models = [p for p in result.services if p.vram_gb > 0]
    assert {p.mode for p in models} == {"on_demand"}
    assert {p.swap for p in models} == {"gpu0", "gpu1"}
    for p in models:
        assert p.swap == f"gpu{p.gpu}"
    assert all(load <= 24 for load in gpus_load(result).values())
    assert result.service("kinematics").mode == "resident"
    assert any("not everything fits resident" in note for note in result.notes)


def test_without_deploy_a_model_too_big_for_any_gpu_is_off() -> None:
    services = {"big": service(40, 9001), "small": service(10, 9002), "cpu": service(0, 9003)}
    result = plan(services, None, parse_gpus("24"))
    assert result.service("big").mode == "off"
    assert result.service("small").mode == "on_demand"
    assert "big is off: no GPU with 40 GB free (GPU 0: 24 GB free)" in result.notes


# --- with a deploy: auto, swap groups, explicit ---------------------------------------------------


def test_auto_places_largest_first_on_the_gpu_with_most_room() -> None:
    services = {"a": service(10, 9001), "b": service(8, 9002), "c": service(6, 9003), "d": service(5, 9004)}
    result = plan(services, deploy(services={"a": {"gpu": "auto"}}), parse_gpus("16,12"))
    # a (10) → GPU 0 (16); b (8) → GPU 1 (12); c (6) → GPU 0 (6 left vs 4); d (5) fits nowhere.
    assert [result.service(n).gpu for n in "abc"] == [0, 1, 0]
    assert result.service("d").mode == "off"
    assert "auto" in result.service("a").reason


def test_auto_ties_go_to_the_lower_index_and_are_deterministic() -> None:
    services = {"x": service(4, 9001), "y": service(4, 9002)}
    first = plan(services, deploy(), parse_gpus("2x24"))
    assert (first.service("x").gpu, first.service("y").gpu) == (0, 1)
    assert plan(services, deploy(), parse_gpus("2x24")) == first


def test_swap_group_goes_to_one_gpu_sized_by_its_largest_member() -> None:
    services = {"a": service(10, 9001), "b": service(8, 9002), "c": service(1, 9003)}
    group = {"mode": "on_demand", "swap": "g"}
    result = plan(services, deploy(services={"a": group, "b": group}), parse_gpus("9,11"))
    # Needs 10 (a), not 18 (a + b): only GPU 1 (11 GB) holds it, though b alone fits GPU 0.
    assert (result.service("a").gpu, result.service("b").gpu) == (1, 1)
    assert result.swap_groups() == {"g": ["a", "b"]}
    assert result.service("c").gpu == 0  # 9 GB left there, 1 GB on GPU 1
    assert gpus_load(result) == {0: 1, 1: 10}


def test_swap_group_follows_a_pinned_member() -> None:
    services = {"a": service(10, 9001), "b": service(8, 9002)}
    result = plan(
        services,
        deploy(
            services={
                "a": {"mode": "on_demand", "swap": "g"},
                "b": {"mode": "on_demand", "swap": "g", "gpu": 1},
            }
        ),
        parse_gpus("2x24"),
    )
    assert (result.service("a").gpu, result.service("b").gpu) == (1, 1)


def test_swap_group_pinned_to_two_gpus_is_an_error() -> None:
    services = {"a": service(10, 9001), "b": service(8, 9002)}
    with pytest.raises(InputError, match=r"swap group 'g' is pinned to more than one GPU \(a on GPU 0, b on GPU 1\)"):
        plan(
            services,
            deploy(
                services={
                    "a": {"mode": "on_demand", "swap": "g", "gpu": 0},
                    "b": {"mode": "on_demand", "swap": "g", "gpu": 1},
                }
            ),
            parse_gpus("2x24"),
        )


def test_infeasible_explicit_placement_names_services_gpu_and_sizes() -> None:
    pinned = deploy(
        gpus=[0], sim={"gpus": [0], "workers_per_gpu": 1}, services={"sam3": {"gpu": 0}, "simate": {"gpu": 0}}
    )
    services = {n: SERVICES[n] for n in ("sam3", "simate")}
    with pytest.raises(InputError) as caught:
        plan(services, pinned, parse_gpus("1x24"), benchmark=benchmark(9))
    assert caught.value.message == (
        "services sam3 (7.2 GB) and simate (14 GB) need 21.2 GB on GPU 0, "
        "which has 24 GB minus 9 GB for 1 simulator worker"
    )
    assert "swap" in (caught.value.hint or "")
    # The same pair as a swap group needs only its largest member: it fits.
    grouped = deploy(
        gpus=[0],
        sim={"gpus": [0]},
        services={
            "sam3": {"gpu": 0, "mode": "on_demand", "swap": "m"},
            "simate": {"gpu": 0, "mode": "on_demand", "swap": "m"},
        },
    )
    assert plan(services, grouped, parse_gpus("1x24"), benchmark=benchmark(9)).service("sam3").gpu == 0


def test_infeasible_swap_group_is_described_as_a_group() -> None:
    services = {"a": service(10, 9001), "b": service(30, 9002)}
    group = {"mode": "on_demand", "swap": "g", "gpu": 0}
    with pytest.raises(
        InputError,
        match=r"swap group 'g' \(a, b: 30 GB for its largest member, b\) needs 30 GB on GPU 0, which has 24 GB\nhint: move it",
    ):
        plan(services, deploy(services={"a": group, "b": group}), parse_gpus("24"))


def test_pinning_to_a_gpu_the_machine_lacks_is_an_error() -> None:
    with pytest.raises(InputError, match="puts sam3 and simate on GPU 1, which this machine does not have"):
        plan(SERVICES, example("two-gpus"), parse_gpus("1x24"))
    with pytest.raises(InputError, match=r"\[sim\] puts simulator workers on GPU 2 and 3"):
        plan(SERVICES, deploy(sim={"gpus": [2, 3]}), parse_gpus("2x24"))


def test_simulator_workers_that_do_not_fit_are_an_error() -> None:
    with pytest.raises(InputError, match="3 simulator workers \\(9 GB each\\) need 27 GB on GPU 0, which has 24 GB"):
        plan({}, deploy(sim={"gpus": [0], "workers_per_gpu": 3}), parse_gpus("24"), benchmark=benchmark(9))


def test_external_off_port_override_and_idle_seconds() -> None:
    result = plan(
        SERVICES,
        deploy(
            services={
                "sam3": {"mode": "external", "url": "http://gpu-box:8810"},
                "molmo2": {"mode": "off"},
                "simate": {"mode": "on_demand", "port": 9100, "idle_seconds": 120},
            }
        ),
        parse_gpus("4x24"),
    )
    sam3 = result.service("sam3")
    assert (sam3.mode, sam3.gpu, sam3.port, sam3.url) == ("external", None, None, "http://gpu-box:8810")
    molmo2 = result.service("molmo2")
    assert (molmo2.mode, molmo2.gpu, molmo2.port, molmo2.url) == ("off", None, None, None)
    simate = result.service("simate")
    assert (simate.mode, simate.port, simate.url, simate.idle_seconds) == (
        "on_demand",
        9100,
        "http://127.0.0.1:9100",
        120,
    )
    # A service the deploy does not mention is resident on auto.
    assert result.service("openwam").mode == "resident" and result.service("openwam").gpu is not None
    assert all(p.reason for p in result.services)


def test_a_port_used_twice_is_an_error() -> None:
    with pytest.raises(InputError, match="port 8771 is used by both simulator worker 0 and sam3"):
        plan(
            {"sam3": SERVICES["sam3"]}, deploy(sim={"gpus": [0]}, services={"sam3": {"port": 8771}}), parse_gpus("2x24")
        )


def test_deploy_gpus_and_gpu_memory_limit_what_is_visible() -> None:
    machine = (Gpu(0, "A100", 80, 80), Gpu(1, "A100", 80, 10), Gpu(2, "A100", 80, 80))
    limited = deploy(gpus=[1, 2], gpu_memory_gb=24)
    assert visible(machine, limited) == (Gpu(1, "A100", 24, 10), Gpu(2, "A100", 24, 24))
    assert visible(machine, None) == machine
    result = plan({"m": service(20, 9001)}, limited, machine)
    assert result.service("m").gpu == 2 and [g.index for g in result.gpus] == [1, 2]


def test_closure_plan_covers_the_agents_services_and_benchmark() -> None:
    config = PROJECT.load_agent("default")
    closure = services_needed(config, {n: m.kind for n, m in SERVICES.items()})
    result = closure_plan(SERVICES, closure, example("one-gpu"), parse_gpus("1x24"), PROJECT.load_benchmarks())
    assert [p.name for p in result.services] == ["kinematics", "sam3", "simate"]
    assert not any("not counted" in note for note in result.notes)  # robodojo sized the worker


def test_the_agents_models_fit_one_24_gb_gpu_resident() -> None:
    # Seed ("A deploy written for you"): kinematics, SAM 3 and Simate fit one 24 GB GPU.
    closure = services_needed(
        AgentConfig.model_validate(tomllib.loads((REPO / "configs" / "agents" / "default.toml").read_text())),
        {n: m.kind for n, m in SERVICES.items()},
    )
    result = closure_plan(SERVICES, closure, None, parse_gpus("1x24"))
    assert {p.mode for p in result.services} == {"resident"}


def test_a_skill_whose_service_the_plan_turns_off_for_room_drops_out() -> None:
    services = {
        "seg": service(7, 9101, kind="segmenter"),
        "wam": service(40, 9102, kind="world_model"),
        "kin": service(0, 9103, kind="kinematics"),
        "helper": service(1, 9104, kind="helper"),
    }
    config = AgentConfig.model_validate(
        {
            "agent": {
                "skills": {
                    "segment": {"needs": ["segmenter"], "summary": "Segment objects"},
                    "imagine": {"needs": ["world_model", "helper"], "summary": "Imagine the future"},
                    "kinematics": {"needs": ["kinematics"]},
                }
            }
        }
    )
    closure, result = agent_plan(services, config, None, parse_gpus("1x24"), {})
    assert closure.skills_on == ("kinematics", "segment")
    assert [s for s, _ in closure.skills_dropped] == ["imagine"]
    # The helper only the dropped skill needed is gone too; the plan still says why wam is off.
    assert closure.services == {"seg", "kin"}
    assert {p.name: p.mode for p in result.services} == {"kin": "resident", "seg": "resident", "wam": "off"}
    assert any(n.startswith("wam is off: no GPU with 40 GB free") for n in result.notes)
    # With room, nothing drops.
    closure, result = agent_plan(services, config, None, parse_gpus("1x80"), {})
    assert closure.skills_dropped == () and closure.services == {"seg", "wam", "kin", "helper"}


# --- inventory -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("4x24", [24, 24, 24, 24]),
        ("2X80", [80, 80]),
        ("24,24,80", [24, 24, 80]),
        ("40.5", [40.5]),
        (" 1 x 24 ", [24]),
        ("0", []),
        ("none", []),
        ("NONE", []),
    ],
)
def test_parse_gpus(spec: str, sizes: list[float]) -> None:
    gpus = parse_gpus(spec)
    assert [g.total_gb for g in gpus] == sizes
    assert [g.free_gb for g in gpus] == sizes
    assert [g.index for g in gpus] == list(range(len(sizes)))


@pytest.mark.parametrize("spec", ["", "4x", "x24", "four", "24,,24", "0x24", "4x0", "-1", "100x24", "4x9999", "24;80"])
def test_parse_gpus_rejects_bad_specs_with_an_example(spec: str) -> None:
    with pytest.raises(InputError, match="--gpus 4x24"):
        parse_gpus(spec)


def test_detect_gpus_is_empty_without_a_gpu() -> None:
    gpus = detect_gpus()
    assert isinstance(gpus, tuple)
    if not Path("/dev/nvidia0").exists():
        assert gpus == ()
    for gpu in gpus:  # on a machine with GPUs: sane numbers, never an exception
        assert gpu.total_gb > 0 and 0 <= gpu.free_gb <= gpu.total_gb and gpu.name


def test_gpu_memory_by_pid_reads_every_gpu_and_degrades_to_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per process, over every GPU, a process with compute and graphics contexts counted once
    per GPU, a hidden usage as 0; no driver is None (unknown), never an exception. NVML is
    played by a stand-in module: there is no GPU here."""
    import types

    from harness.runtime.inventory import gpu_memory_by_pid, tree_gpu_memory

    real = gpu_memory_by_pid()
    assert real is None or isinstance(real, dict)
    if not Path("/dev/nvidia0").exists():
        assert real is None

    def proc(pid: int, used: int | None) -> types.SimpleNamespace:
        return types.SimpleNamespace(pid=pid, usedGpuMemory=used)

    compute = {0: [proc(10, 3 << 30), proc(11, None)], 1: [proc(10, 1 << 30)]}
    graphics = {0: [proc(10, 3 << 30), proc(12, 5 << 20)], 1: []}
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: compute[h]  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetGraphicsRunningProcesses = lambda h: graphics[h]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    usage = gpu_memory_by_pid()
    assert usage == {10: 4 << 30, 11: 0, 12: 5 << 20}
    assert tree_gpu_memory([10, 12, 99], usage) == (4 << 30) + (5 << 20)
    assert tree_gpu_memory(None, usage) is None and tree_gpu_memory([10], None) is None

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    nvml.nvmlInit = no_driver  # type: ignore[attr-defined]
    assert gpu_memory_by_pid() is None


# --- a deploy written for you -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "strategy"),
    [
        ("0", "all_on_demand"),
        ("1x24", "all_on_demand"),
        ("24,40", "policies_on_demand"),
        ("4x80", "resident"),
    ],
)
def test_written_deploy_validates_and_plans(tmp_path: Path, spec: str, strategy: str) -> None:
    gpus = parse_gpus(spec)
    text, layout = write_deploy(SERVICES, gpus, machine="testbox")
    assert layout.strategy == strategy
    path = tmp_path / "testbox.toml"
    path.write_text(text)
    written = PROJECT.load_deploy(path)  # the Deploy model and the project's manifests
    result = plan(SERVICES, written, gpus)
    chosen = {c.name: c for c in layout.choices}
    for p in result.services:
        assert (p.mode, p.gpu, p.swap) == (chosen[p.name].mode, chosen[p.name].gpu, chosen[p.name].swap)
    ports = [p.port for p in result.services if p.port is not None]
    assert len(ports) == len(set(ports))
    assert result.service("kinematics").mode == "resident"
    assert "# " in text and "harness deploy write" in text
    if spec == "0":
        assert all(p.mode == "off" for p in result.services if p.vram_gb > 0)
    if strategy == "policies_on_demand":
        swapped = sorted(p.name for p in result.services if p.swap == "policies")
        assert swapped == ["openwam", "simate", "smolvla"]
        assert {result.service(n).mode for n in ("sam3", "molmo2")} == {"resident"}
    if strategy == "all_on_demand" and gpus:
        assert {p.mode for p in result.services if p.vram_gb > 0} == {"on_demand"}


def test_written_deploy_moves_ports_in_use_without_a_cascade() -> None:
    text, _ = write_deploy(SERVICES, parse_gpus("4x80"), taken=lambda port: port == 8810)
    entries = tomllib.loads(text)["services"]
    assert entries["sam3"]["port"] not in (8810, 8811, 8812, 8820, 8830, 8848)
    assert (entries["molmo2"]["port"], entries["simate"]["port"]) == (8811, 8812)


def test_assign_ports() -> None:
    assert assign_ports({"a": 8000, "b": 8000, "c": 8001}, lambda p: False) == {"a": 8000, "c": 8001, "b": 8002}
    with pytest.raises(InputError, match="no free port for a"):
        assign_ports({"a": 65535}, lambda p: True)


def test_default_deploy_path_is_the_short_hostname() -> None:
    assert default_path(Path("d"), "gpu-box.lab.example") == Path("d/gpu-box.toml")
    assert default_path(Path("d"), "example-one") == Path("d/host-example-one.toml")
    assert default_path(Path("d"), "") == Path("d/this-machine.toml")


# --- through the CLI --------------------------------------------------------------------------------------


def test_cli_plan_json_one_gpu_example(harness_cli) -> None:
    result = harness_cli(
        "--project",
        str(REPO),
        "--deploy",
        str(REPO / "configs" / "deploy" / "example-one-gpu.toml"),
        "plan",
        "--gpus",
        "1x24",
        "--json",
    )
    assert result.code == 0, result.err
    data = json.loads(result.out)
    placed = {s["name"]: s for s in data["services"]}
    for name in ("sam3", "simate"):
        assert (placed[name]["mode"], placed[name]["gpu"], placed[name]["swap"]) == ("on_demand", 0, "models")
    assert data["benchmark"] == "robodojo"
    assert data["sim_workers"] == [{"index": 0, "gpu": 0, "port": 8771}]


def test_cli_plan_table_agent_and_services(harness_cli) -> None:
    result = harness_cli("--project", str(REPO), "plan", "--gpus", "1x24", "--agent", "default")
    assert result.code == 0, result.err
    assert "sam3" in result.out and "resident" in result.out and "openwam" not in result.out
    result = harness_cli("--project", str(REPO), "plan", "--gpus", "none", "--service", "kinematics", "--json")
    assert [s["name"] for s in json.loads(result.out)["services"]] == ["kinematics"]
    result = harness_cli("--project", str(REPO), "plan", "--service", "sam4")
    assert result.code == 2 and "did you mean 'sam3'" in result.err
    result = harness_cli("--project", str(REPO), "plan", "--gpus", "4x")
    assert result.code == 2 and "--gpus 4x24" in result.err


def test_cli_plan_infeasible_deploy_exits_2(harness_cli, tmp_path: Path) -> None:
    path = tmp_path / "tight.toml"
    path.write_text("gpus = [0]\n[services.sam3]\ngpu = 0\n[services.simate]\ngpu = 0\n[services.openwam]\ngpu = 0\n")
    result = harness_cli("--project", str(REPO), "--deploy", str(path), "plan", "--gpus", "1x24")
    assert result.code == 2
    assert "need 43.2 GB on GPU 0, which has 24 GB" in result.err


def test_cli_deploy_write_gives_every_instance_ports_of_its_own(harness_cli, tmp_path: Path) -> None:
    home = ("--home", str(tmp_path / "home"))

    def write(name: str, *extra: str) -> dict[str, int]:
        out = tmp_path / f"{name}.toml"
        result = harness_cli("--project", str(REPO), *home, "deploy", "write", "-o", str(out), "--gpus", "1x24", *extra)
        assert result.code == 0, result.err
        return {n: s.port for n, s in PROJECT.load_deploy(out).services.items() if s.port is not None}

    first = write("first")
    second = write("second")  # nothing of the first runs: only the registry keeps them apart
    assert first and set(first) == set(second)
    assert not set(first.values()) & set(second.values())
    assert len(set(second.values())) == len(second)
    assert write("second", "--force") == second, "rewriting a deploy keeps its ports"
    states = [PROJECT.load_deploy(tmp_path / f"{name}.toml").state for name in ("first", "second")]
    assert states[0] != states[1], "and a state folder of its own: a broker, logs and pid files each"
    assert all(str(tmp_path / "home" / "state") in str(state) for state in states)
    registry = json.loads((tmp_path / "home" / "state" / "ports" / f"{os.geteuid()}.json").read_text())
    assert set(registry["deploys"]) == {str(tmp_path / "first.toml"), str(tmp_path / "second.toml")}
    (tmp_path / "first.toml").unlink()  # a deploy that is gone gives its ports back
    assert write("third") == first


def test_deploy_write_keeps_the_reservations_of_the_earlier_single_registry_file(harness_cli, tmp_path: Path) -> None:
    """A home whose ``state/ports.json`` an earlier harness wrote: its reservations still keep
    a new deploy's ports apart, and its owner's move into their own file at the next write."""
    home = tmp_path / "home"
    (home / "state").mkdir(parents=True)
    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text("# an earlier deploy\n")
    result = harness_cli(
        "--project", str(REPO), "--home", str(home), "deploy", "write", "-o", str(new), "--gpus", "1x24"
    )
    assert result.code == 0, result.err
    ports = {n: s.port for n, s in PROJECT.load_deploy(new).services.items() if s.port is not None}
    legacy = {"version": 1, "deploys": {str(old): dict(ports)}}  # what the old file held: these very ports
    (home / "state" / "ports.json").write_text(json.dumps(legacy))
    result = harness_cli(
        "--project", str(REPO), "--home", str(home), "deploy", "write", "-o", str(new), "--gpus", "1x24", "--force"
    )
    assert result.code == 0, result.err
    moved = {n: s.port for n, s in PROJECT.load_deploy(new).services.items() if s.port is not None}
    assert not set(moved.values()) & set(ports.values()), "the earlier file's reservations were passed over"
    assert not (home / "state" / "ports.json").exists()
    registry = json.loads((home / "state" / "ports" / f"{os.geteuid()}.json").read_text())
    assert registry["deploys"] == {str(old): ports, str(new): moved}


def test_what_is_planted_in_the_port_registry_is_never_followed_nor_fails_a_deploy_write(
    harness_cli, tmp_path: Path
) -> None:
    """A link as the registry's lock file and as this user's file, a fifo and garbage beside
    them (what another member of a shared home could make there first): ``deploy write``
    works, writes through none of them, and its reservation holds for the next write."""
    home, victim = tmp_path / "home", tmp_path / "victim.txt"
    victim.write_text("someone's file\n")
    registry = home / "state" / "ports"
    registry.mkdir(parents=True)
    (registry / ".lock").symlink_to(victim)
    (registry / f"{os.geteuid()}.json").symlink_to(victim)
    os.mkfifo(registry / f"{os.geteuid() + 1}.json")
    (registry / f"{os.geteuid() + 2}.json").write_text("{not json")

    def write(name: str) -> dict[str, int]:
        out = tmp_path / f"{name}.toml"
        result = harness_cli(
            "--project", str(REPO), "--home", str(home), "deploy", "write", "-o", str(out), "--gpus", "1x24"
        )
        assert result.code == 0 and "Traceback" not in result.err, result.err
        return {n: s.port for n, s in PROJECT.load_deploy(out).services.items() if s.port is not None}

    first, second = write("first"), write("second")
    assert first and not set(first.values()) & set(second.values())
    assert victim.read_text() == "someone's file\n"
    assert (registry / f"{os.geteuid()}.json").is_symlink(), "the planted link is left as it is"
    own = [p for p in registry.glob(f"{os.geteuid()}-*.json") if not p.is_symlink()]
    assert len(own) == 1 and set(json.loads(own[0].read_text())["deploys"]) == {
        str(tmp_path / "first.toml"),
        str(tmp_path / "second.toml"),
    }


def test_cli_deploy_write(harness_cli, tmp_path: Path) -> None:
    out = tmp_path / "box.toml"
    result = harness_cli(
        "--project",
        str(REPO),
        "--home",
        str(tmp_path / "home"),
        "deploy",
        "write",
        "-o",
        str(out),
        "--gpus",
        "1x24",
        "--agent",
        "default",
    )
    assert result.code == 0, result.err
    written = PROJECT.load_deploy(out)
    assert written.services["sam3"].mode == "resident" and written.services["openwam"].mode == "off"
    again = harness_cli(
        "--project", str(REPO), "--home", str(tmp_path / "home"), "deploy", "write", "-o", str(out), "--gpus", "1x24"
    )
    assert again.code == 2 and "--force" in again.err
    forced = harness_cli(
        "--project",
        str(REPO),
        "--home",
        str(tmp_path / "home"),
        "deploy",
        "write",
        "-o",
        str(out),
        "--gpus",
        "1x24",
        "--force",
    )
    assert forced.code == 0, forced.err
    assert PROJECT.load_deploy(out).services["openwam"].mode == "on_demand"
    planned = harness_cli("--project", str(REPO), "--deploy", str(out), "plan", "--gpus", "1x24", "--json")
    assert planned.code == 0, planned.err


def test_an_engines_cuda_visible_devices_is_narrowed_never_overwritten() -> None:
    """Ray or Slurm gave this process GPUs 2 and 3 (``CUDA_VISIBLE_DEVICES=2,3``): the
    inventory holds those alone, numbered 0 and 1 as CUDA numbers them inside the process,
    and a service placed on the process's GPU 1 gets physical GPU 3, never GPU 1 (two
    shards on one node each planned "GPU 0" and shared it)."""
    from harness.runtime.inventory import restrict, visible_devices
    from harness.runtime.launch import assigned_device, clean_environment
    from harness.runtime.plan import Gpu

    physical = tuple(Gpu(i, f"gpu{i}", 80.0, 80.0 - i) for i in range(4))
    uuids = {i: f"GPU-{i}aaaa-{i}" for i in range(4)}
    assert visible_devices({}) is None
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"], "CUDA stops at an entry it cannot read"
    mine = restrict(physical, ["2", "3"], uuids)
    assert [(g.index, g.name, g.free_gb) for g in mine] == [(0, "gpu2", 78.0), (1, "gpu3", 77.0)]
    assert [g.name for g in restrict(physical, ["GPU-3a", "GPU-0"], uuids)] == ["gpu3", "gpu0"]
    assert restrict(physical, ["7", "1"], uuids) == (), "an entry naming no GPU hides the rest"
    engine = {"CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/usr/bin"}
    assert assigned_device(engine, 1) == "3" and assigned_device({}, 1) == "1"
    assert clean_environment(engine, 0)["CUDA_VISIBLE_DEVICES"] == "2"
    assert clean_environment(engine, None)["CUDA_VISIBLE_DEVICES"] == ""
    assert clean_environment({"PATH": "/usr/bin"}, 1)["CUDA_VISIBLE_DEVICES"] == "1"
