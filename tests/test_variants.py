"""Accelerator variants in one lock (issue 34): cpu, cu126 and cu128 builds of one package,
each from an index of its own, locked side by side into one file; realize picks what this
machine's driver runs (``HARNESS_CUDA_DRIVER`` stands in for NVML: no GPU here), or what
``--variant``/``HARNESS_VARIANT`` names.

The wheels are built in the test with local versions (``tvar 1.0+cpu``, ``+cu126``, ``+cu128``)
and served from three local indexes; a package the variants share (``tshared``) comes from the
default index and is one entry of the lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.lock.variants import choose_variant
from tests.test_variant_groups import VARIANTS, variant_indexes
from tests.upstreams import make_project, service


@pytest.fixture
def indexes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The default index (tshared) and one index per variant, each serving its build of tvar."""
    with variant_indexes(tmp_path, monkeypatch):
        yield make_project(tmp_path / "p", {"svc": service(["tvar==1.0"], extra=VARIANTS)})


def harness(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )


def test_one_lock_holds_every_variant_and_relocks_byte_for_byte(indexes: Path, tmp_path: Path) -> None:
    project = indexes
    result = harness("--project", str(project), "lock", home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    path = project / "locks" / "svc.lock.toml"
    data = tomllib.loads(path.read_text())
    assert [(t["variant"], t.get("cuda")) for t in data["targets"]] == [
        ("cpu", None),
        ("cu126", "12.6"),
        ("cu128", "12.8"),
    ]
    assert len({t["environment"] for t in data["targets"]}) == 3, "a store path per variant"
    packages = {(p["name"], p["version"]): p for p in data["packages"]}
    assert packages[("tshared", "1.0")].get("variants") is None, "what the variants share is one entry"
    for label in ("cpu", "cu126", "cu128"):
        entry = packages[("tvar", f"1.0+{label}")]
        assert entry["variants"] == [label] and entry["index"] == f"tvar-{label}"
    first = path.read_bytes()
    result = harness("--project", str(project), "lock", "--refresh", home=tmp_path / "other")
    assert result.returncode == 0, result.stderr
    assert path.read_bytes() == first
    check = harness("--project", str(project), "lock", "--check", home=tmp_path / "home")
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HARNESS_CUDA_DRIVER": "none"}, "cpu"),
        ({"HARNESS_CUDA_DRIVER": "12.6"}, "cu126"),
        ({"HARNESS_CUDA_DRIVER": "12.9"}, "cu128"),
        ({"HARNESS_CUDA_DRIVER": "12.8", "HARNESS_VARIANT": "cpu"}, "cpu"),
    ],
)
def test_realize_picks_what_the_driver_runs(indexes: Path, tmp_path: Path, env: dict[str, str], expected: str) -> None:
    project = indexes
    assert harness("--project", str(project), "lock", home=tmp_path / "home").returncode == 0
    home = tmp_path / "realized"
    result = harness("--project", str(project), "realize", "svc", home=home, **env)
    assert result.returncode == 0, result.stderr
    [venv] = [p for p in (home / "store").iterdir() if p.name.endswith("-svc-env")]
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import tvar.build, tshared; print(tvar.build.BUILD)"],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == expected, probe.stderr


def test_a_machine_that_runs_no_variant_is_refused_naming_what_each_needs(indexes: Path, tmp_path: Path) -> None:
    project = indexes
    manifest = project / "services" / "svc.toml"
    manifest.write_text(
        manifest.read_text().replace("[environment.variants.cpu]\n", '[environment.variants.cu118]\ncuda = "11.8"\n')
    )
    assert harness("--project", str(project), "lock", home=tmp_path / "home").returncode == 0
    result = harness("--project", str(project), "realize", "svc", home=tmp_path / "r", HARNESS_CUDA_DRIVER="none")
    assert result.returncode != 0
    assert "no NVIDIA driver" in result.stderr and "cu128: CUDA 12.8" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    result = harness("--project", str(project), "realize", "svc", home=tmp_path / "r", HARNESS_VARIANT="rocm")
    assert result.returncode == 2 and "no variant 'rocm'" in result.stderr, result.stderr


def test_choose_variant_is_pure() -> None:
    variants = [("cpu", None), ("cu126", "12.6"), ("cu128", "12.8")]
    assert choose_variant(variants, driver=None).variant == "cpu"
    assert choose_variant(variants, driver="12.4").variant == "cpu"
    assert choose_variant(variants, driver="12.6").variant == "cu126"
    assert choose_variant(variants, driver="13.0").variant == "cu128"
    assert choose_variant(variants, driver="13.0", forced="cu126").reason.startswith("named by HARNESS_VARIANT")


def test_a_realized_home_follows_the_variant_asked_for(indexes: Path, tmp_path: Path) -> None:
    """The no-op realize of one home answers for the variant it realized: asked for another
    (another driver, another HARNESS_VARIANT), it realizes that one."""
    project = indexes
    assert harness("--project", str(project), "lock", home=tmp_path / "home").returncode == 0
    home = tmp_path / "realized"
    seen = []
    for env in ({"HARNESS_CUDA_DRIVER": "12.6"}, {"HARNESS_CUDA_DRIVER": "12.6"}, {"HARNESS_VARIANT": "cpu"}):
        result = harness("--project", str(project), "realize", "svc", "--json", home=home, **env)
        assert result.returncode == 0, result.stderr
        [report] = json.loads(result.stdout)
        seen.append(report["environment"])
    assert seen[0] == seen[1] and seen[1] != seen[2]
    envs = sorted(p.name for p in (home / "store").iterdir() if p.name.endswith("-svc-env"))
    assert len(envs) == 2, envs


def test_variant_from_the_command_line_or_the_deploy_and_doctor_says_why(indexes: Path, tmp_path: Path) -> None:
    project = indexes
    assert harness("--project", str(project), "lock", home=tmp_path / "home").returncode == 0
    deploy = tmp_path / "machine.toml"
    deploy.write_text('variant = "cu128"\n')
    for args, expected in (
        (["--variant", "cu126"], "cu126"),
        (["--deploy", str(deploy)], "cu128"),
        (["--deploy", str(deploy), "--variant", "cpu"], "cpu"),  # the command line wins
    ):
        home = tmp_path / "-".join(a.strip("-/")[:8] for a in args)
        result = harness(
            *args, "--project", str(project), "realize", "svc", "--json", home=home, HARNESS_CUDA_DRIVER="none"
        )
        assert result.returncode == 0, result.stderr
        doctor = harness(*args, "--project", str(project), "doctor", home=home, HARNESS_CUDA_DRIVER="none")
        line = next(line for line in doctor.stdout.splitlines() if line.startswith("svc "))
        assert f"variant {expected}: named by HARNESS_VARIANT" in line, doctor.stdout
    exported = harness(
        "--variant", "cu126", "--project", str(project), "export", "svc", "--format", "requirements", home=home
    )
    assert exported.returncode == 0 and "tvar==1.0+cu126" in exported.stdout, exported.stdout + exported.stderr
    doctor = harness("--project", str(project), "doctor", home=tmp_path / "fresh", HARNESS_CUDA_DRIVER="12.6")
    assert "variant cu126: the NVIDIA driver supports CUDA 12.6" in doctor.stdout, doctor.stdout


def test_diff_names_a_change_of_variant() -> None:
    from harness.runs.audit import _lock_diff

    before = {"variant": "cpu", "variant_reason": "no NVIDIA driver here: the variant that needs no CUDA"}
    after = {
        "variant": "cu128",
        "variant_reason": "the NVIDIA driver supports CUDA 12.8: cu128 (CUDA 12.8) is the newest it runs",
    }
    lines = _lock_diff("svc", {**before, "packages": {"tvar": "1.0+cpu"}}, {**after, "packages": {"tvar": "1.0+cu128"}})
    assert lines[0] == f"svc: variant cpu → cu128 ({after['variant_reason']})"
    assert "svc: package tvar: 1.0+cpu → 1.0+cu128" in lines


def test_plan_says_which_variant_each_lock_takes_here(indexes: Path, tmp_path: Path) -> None:
    project = indexes
    assert harness("--project", str(project), "lock", home=tmp_path / "home").returncode == 0
    plan = harness("--project", str(project), "plan", home=tmp_path / "home", HARNESS_CUDA_DRIVER="12.8")
    assert plan.returncode == 0, plan.stderr
    assert "note: svc runs variant cu128: the NVIDIA driver supports CUDA 12.8" in plan.stdout, plan.stdout
    plan = harness(
        "--project", str(project), "plan", "--gpus", "none", home=tmp_path / "home", HARNESS_CUDA_DRIVER="12.8"
    )
    assert "note: svc runs variant cpu: no NVIDIA driver here" in plan.stdout, plan.stdout
