"""Wheel-variant metadata (WheelNext, PEP 817/825) read at lock time and used at realize (issue 34, step 5).

The three local indexes of tests/test_variants.py serve ``tvar 1.0+cpu``, ``+cu126`` and
``+cu128``; the cu128 index also serves ``tvar-1.0+cu128-variants.json`` beside the wheel,
linked from the project page as PEP 825 asks. ``harness lock`` records the properties of the
cu128 label in the lock's cu128 target; realize compares the driver with that metadata's
``nvidia :: cuda_version_lower_bound`` rather than the manifest's ``cuda``; a manifest that
declares less than the metadata says is refused naming both. Variant-labelled wheel files
(``...-py3-none-any-cu128.whl``) are never locked: beside plain wheels they are left out, alone
they are refused with what to do.
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

from harness.errors import HarnessError
from harness.lock.variants import choose_variant, cuda_source, needed_cuda, wheel_cuda, wheel_entry
from harness.lock.wheelmeta import declaration_problem
from harness.resolve.wheelvariants import (
    choose_label,
    label_properties,
    parse_variants_json,
    variant_label,
    variants_file_name,
)
from tests.localindex import LocalIndex, wheel_bytes
from tests.test_variant_groups import VARIANTS, variant_indexes
from tests.upstreams import make_project, service

ENTRY = "tvar==1.0+cu128 [cu128] nvidia :: cuda_version_lower_bound :: 12.7"


def harness(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture
def indexes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """tests/test_variants.py's indexes; the project and the cu128 index's folder are returned
    through ``tmp_path`` (``tmp_path / "cu128"``) for the test to publish metadata there."""
    with variant_indexes(tmp_path, monkeypatch):
        yield make_project(tmp_path / "p", {"svc": service(["tvar==1.0"], extra=VARIANTS)})


def publish(folder: Path, bound: str) -> None:
    """The cu128 index serves metadata saying its tvar 1.0+cu128 needs CUDA ``bound``."""
    LocalIndex(folder).add_variants_json(
        "tvar", "1.0+cu128", {"cu128": {"nvidia": {"cuda_version_lower_bound": [bound], "sm_arch": ["90", "100"]}}}
    )


# ------------------------------------------------------------------------------ pure parts


def test_the_metadata_file_is_parsed_and_its_label_chosen() -> None:
    data = json.dumps(
        {
            "default-priorities": {"namespace": ["nvidia", "x86_64"]},
            "providers": {"nvidia": {"requires": ["nvidia-variant-provider"]}},
            "variants": {
                "cu126": {"nvidia": {"cuda_version_lower_bound": ["12.6"]}},
                "cu128": {"nvidia": {"cuda_version_lower_bound": ["12.8"], "sm_arch": ["90"]}},
            },
        }
    ).encode()
    metadata = parse_variants_json(data, "torch-2.8.0-variants.json")
    assert metadata.priorities == ("nvidia", "x86_64") and metadata.providers == ("nvidia",)
    assert label_properties(metadata, "cu128") == [
        "nvidia :: cuda_version_lower_bound :: 12.8",
        "nvidia :: sm_arch :: 90",
    ]
    assert choose_label(metadata, "cu128", []) == "cu128"
    assert choose_label(metadata, "gpu", ["cu126"]) == "cu126", "a locked wheel's own label first"
    with pytest.raises(HarnessError, match="labels cu126, cu128, none of them 'cpu'"):
        choose_label(metadata, "cpu", [])
    for bad, key in (
        (b"[]", "expected a JSON object"),
        (b'{"variants": {"CU128": {}}}', "variants.CU128: not a variant label"),
        (b'{"variants": {"cu128": {"nvidia": {"cuda_version_lower_bound": "12.8"}}}}', "cuda_version_lower_bound"),
        (b'{"default-priorities": {"namespace": "nvidia"}, "variants": {}}', "default-priorities.namespace"),
        (b"[" * 200_000, "not JSON"),  # under the size limit, nested past the parser's depth
    ):
        with pytest.raises(HarnessError, match=key) as caught:
            parse_variants_json(bad, "x-1.0-variants.json")
        assert caught.value.message.startswith("x-1.0-variants.json: ")


def test_file_names_and_labels() -> None:
    assert variants_file_name("Torch", "2.8.0") == "torch-2.8.0-variants.json"
    assert variants_file_name("my.pkg", "1.0+cu128") == "my_pkg-1.0+cu128-variants.json"
    assert variant_label("torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64-cu128.whl") == "cu128"
    assert variant_label("torch-2.8.0-1-cp312-cp312-manylinux_2_28_x86_64-cu128.whl") == "cu128"
    assert variant_label("torch-2.8.0-1-cp312-cp312-manylinux_2_28_x86_64.whl") is None, "a build tag"
    assert variant_label("torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl") is None


def test_the_metadata_decides_what_a_variant_needs_and_a_smaller_declaration_is_refused() -> None:
    entries = [ENTRY, "tother==2.0 [cu128] nvidia :: cuda_version_lower_bound :: 12.4"]
    assert wheel_cuda(entries) == ("12.7", "tvar==1.0+cu128"), "the highest package bound"
    assert needed_cuda("12.8", entries) == "12.7" and needed_cuda("12.8", []) == "12.8"
    assert "from the wheel-variant metadata of tvar==1.0+cu128" in cuda_source("12.8", entries)
    assert "as the manifest declares" in cuda_source("12.8", [])
    # The driver against the metadata: 12.7 runs cu128, whose manifest said 12.8.
    variants = [("cpu", None), ("cu126", "12.6"), ("cu128", needed_cuda("12.8", entries))]
    assert choose_variant(variants, driver="12.7").variant == "cu128"
    assert declaration_problem("cu128", "12.8", entries) is None
    problem = declaration_problem("cu128", "12.6", entries)
    assert problem is not None and problem.exit_code == 2
    assert 'environment.variants.cu128.cuda = "12.6"' in problem.message and "12.7" in problem.message
    problem = declaration_problem(
        "cpu", None, [wheel_entry("tvar", "1.0", "cpu", "nvidia :: cuda_version_lower_bound :: 12.0")]
    )
    assert problem is not None and "is not set" in problem.message


# ------------------------------------------------------------------------------ end to end


def test_lock_records_the_metadata_and_realize_and_plan_use_it(indexes: Path, tmp_path: Path) -> None:
    project = indexes
    publish(tmp_path / "cu128", "12.7")
    assert harness("--project", str(project), "lock", home=tmp_path / "home").returncode == 0
    path = project / "locks" / "svc.lock.toml"
    data = tomllib.loads(path.read_text())
    targets = {t["variant"]: t for t in data["targets"]}
    assert targets["cu128"]["cuda"] == "12.8", "the manifest's declaration stays in the lock"
    assert targets["cu128"]["wheel-variants"] == [
        ENTRY,
        "tvar==1.0+cu128 [cu128] nvidia :: sm_arch :: 100",
        "tvar==1.0+cu128 [cu128] nvidia :: sm_arch :: 90",
    ]
    assert "wheel-variants" not in targets["cu126"], "its index serves no metadata"
    first = path.read_bytes()
    assert harness("--project", str(project), "lock", "--refresh", home=tmp_path / "other").returncode == 0
    assert path.read_bytes() == first, "re-locking is byte for byte"
    offline = harness("--project", str(project), "lock", "--offline", "--refresh", home=tmp_path / "home")
    assert offline.returncode == 0, offline.stderr
    assert path.read_bytes() == first, "offline, the metadata the previous lock recorded is kept"
    # A driver for CUDA 12.7: the manifest alone says cu126; the metadata says cu128 runs.
    home = tmp_path / "realized"
    result = harness("--project", str(project), "realize", "svc", home=home, HARNESS_CUDA_DRIVER="12.7")
    assert result.returncode == 0, result.stderr
    [venv] = [p for p in (home / "store").iterdir() if p.name.endswith("-svc-env")]
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import tvar.build; print(tvar.build.BUILD)"],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "cu128", probe.stderr
    plan = harness("--project", str(project), "plan", home=home, HARNESS_CUDA_DRIVER="12.7")
    assert (
        "note: svc runs variant cu128: the NVIDIA driver supports CUDA 12.7: cu128 (CUDA 12.7) is the newest it runs "
        "(it needs CUDA 12.7 from the wheel-variant metadata of tvar==1.0+cu128" in plan.stdout
    ), plan.stdout
    doctor = harness("--project", str(project), "doctor", home=home, HARNESS_CUDA_DRIVER="12.7")
    line = next(line for line in doctor.stdout.splitlines() if line.startswith("svc "))
    assert "variant cu128" in line and "wheel-variant metadata of tvar==1.0+cu128" in line, doctor.stdout
    doctor = harness("--project", str(project), "doctor", home=home, HARNESS_CUDA_DRIVER="12.6")
    line = next(line for line in doctor.stdout.splitlines() if line.startswith("svc "))
    assert "variant cu126" in line and "as the manifest declares" in line, doctor.stdout


def test_a_declaration_below_the_metadata_fails_lock_naming_both(indexes: Path, tmp_path: Path) -> None:
    project = indexes
    (tmp_path / "cu128" / "tvar-1.0+cu128-variants.json").write_text('{"variants": {"cu128": []}}')
    result = harness("--project", str(project), "lock", home=tmp_path / "home")
    assert result.returncode == 1, result.stdout + result.stderr
    told = "tvar-1.0+cu128-variants.json on index 'tvar-cu128': variants.cu128: expected an object of namespaces"
    assert told in result.stderr, result.stderr
    publish(tmp_path / "cu128", "12.9")
    result = harness("--project", str(project), "lock", home=tmp_path / "home")
    assert result.returncode == 1 and "failed svc" in result.stderr, result.stdout + result.stderr
    assert 'services/svc.toml: environment.variants.cu128.cuda = "12.8"' in result.stderr, result.stderr
    assert "tvar==1.0+cu128 says nvidia :: cuda_version_lower_bound :: 12.9" in result.stderr, result.stderr
    assert not (project / "locks" / "svc.lock.toml").exists(), "nothing written"


def test_a_hand_edited_record_is_refused_naming_file_and_key(indexes: Path, tmp_path: Path) -> None:
    project = indexes
    publish(tmp_path / "cu128", "12.7")
    assert harness("--project", str(project), "lock", home=tmp_path / "home").returncode == 0
    path = project / "locks" / "svc.lock.toml"
    path.write_text(path.read_text().replace(ENTRY, "tvar needs cuda 12.7"))
    result = harness("--project", str(project), "realize", "svc", home=tmp_path / "r", HARNESS_CUDA_DRIVER="12.8")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "svc.lock.toml" in result.stderr and "wheel-variants" in result.stderr, result.stderr
    assert "NAME==VERSION [LABEL] NAMESPACE :: FEATURE :: VALUE" in result.stderr, result.stderr


def test_variant_labelled_wheels_are_left_out_or_refused(indexes: Path, tmp_path: Path) -> None:
    project = indexes
    labelled = "tvar-1.0+cu128-py3-none-any-cu128.whl"
    (tmp_path / "cu128" / labelled).write_bytes(wheel_bytes("tvar", "1.0+cu128"))
    assert harness("--project", str(project), "lock", home=tmp_path / "home").returncode == 0
    text = (project / "locks" / "svc.lock.toml").read_text()
    assert "tvar-1.0+cu128-py3-none-any.whl" in text and labelled not in text, "the plain wheel is locked"
    # An index serving a release only as variant-labelled wheels: refused, saying what to do.
    (tmp_path / "pypi" / "tlab-1.0-py3-none-any-cu128.whl").write_bytes(wheel_bytes("tlab", "1.0"))
    other = make_project(tmp_path / "q", {"lab": service(["tlab==1.0"])})
    result = harness("--project", str(other), "lock", home=tmp_path / "home")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "only as variant-labelled wheels (PEP 825), which harness does not install yet" in result.stderr
    assert "package-index" in result.stderr, result.stderr


# ------------------------------------------------------------------------------ other targets in the cache


def test_a_machine_without_a_gpu_fills_the_cache_with_another_variant(
    indexes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``harness realize --variant cu128`` on a machine without a driver, then ``store push --variant cu128``:
    a machine whose driver runs cu128 realizes it from the cache alone (every index gone)."""
    from harness.lock.lockfile import read
    from harness.lock.targets import target_paths
    from harness.cache.backends import open_backend
    from harness.cache.transfer import present_in
    from harness.runs.groups import cache_gaps
    from harness.store.standins import standin_for
    from harness.store.store import Store

    project = indexes
    # Another lock of the project has no cu128: pushing svc's cu128 closure does not read it.
    no_cu128 = VARIANTS.split("[environment.variants.cu128]")[0]
    (project / "services" / "other.toml").write_text(service(["tvar==1.0"], extra=no_cu128))
    keys, cache = tmp_path / "keys", tmp_path / "cache"
    assert harness("store", "keygen", "lab", "--dir", str(keys), home=tmp_path / "k").returncode == 0
    builder = tmp_path / "builder"
    assert harness("--project", str(project), "lock", home=builder).returncode == 0
    cpu_only = {"HARNESS_CUDA_DRIVER": "none"}
    result = harness("--project", str(project), "realize", "--variant", "cu128", "svc", home=builder, **cpu_only)
    assert result.returncode == 0, result.stderr
    key = str(keys / "lab.secret")
    args = ("--project", str(project), "store", "push", "--variant", "cu128", "--key", key, str(cache), "svc")
    result = harness(*args, home=builder, **cpu_only)
    assert result.returncode == 0, result.stderr
    # The cache now holds cu128's target, not cu126's (what a cluster head's note says).
    lock = read(project / "locks" / "svc.lock.toml", whole=True)
    store = Store.in_home(builder)
    standins = {own: host for t in target_paths(lock) if (host := standin_for(store, own := t.own_interpreter))}
    targets = target_paths(lock, standins)
    present = present_in(open_backend(str(cache)), [p for t in targets for p in t.paths])
    table = {"svc": [{"platform": t.platform, "variant": t.variant, "paths": list(t.paths)} for t in targets]}
    lacking = {gap["variant"] for gap in cache_gaps(table, present)}
    assert "cu128" not in lacking and "cu126" in lacking, (lacking, sorted(present))

    for name in ("PYPI", "TVAR_CPU", "TVAR_CU126", "TVAR_CU128"):
        monkeypatch.setenv(f"HARNESS_INDEX_{name}", "http://127.0.0.1:9/simple")  # nothing answers there
    gpu = {
        "HARNESS_CUDA_DRIVER": "12.8",
        "HARNESS_SUBSTITUTERS": str(cache),
        "HARNESS_TRUSTED_KEYS": (keys / "lab.public").read_text().strip(),
    }
    node = tmp_path / "node"
    result = harness("--project", str(project), "realize", "svc", home=node, **gpu)
    assert result.returncode == 0, result.stdout + result.stderr
    [venv] = [p for p in (node / "store").iterdir() if p.name.endswith("-svc-env")]
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import tvar.build; print(tvar.build.BUILD)"],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "cu128", probe.stderr
