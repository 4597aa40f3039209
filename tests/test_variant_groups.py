"""Every target of a lock of variants has its own expected closure, and audit checks the variant.

A benchmark whose environment has cpu, cu126 and cu128 variants (``tvar 1.0+cpu`` … built in
the test and served from three local indexes, as in tests/test_variants.py) is locked once.
Pure: the store paths and digest of each (platform, variant) target, the node's choice of
target (driver, ``HARNESS_VARIANT``, the run's forced variant) and its refusal naming what the
lock offers, the closure expected of a group, a group's shards judged against each other, and a
variant's reason judged against the lock. End to end: a local run records its variant, and
``audit`` fails a record that names another variant than the one it ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.errors import HarnessError
from harness.lock.document import Lock
from harness.lock.lockfile import read
from harness.lock.platforms import for_platform
from harness.lock.targets import paths_digest, target_paths
from harness.lock.variants import choose_variant, reason_problem
from harness.runs.groups import (
    NodeTarget,
    TargetRefused,
    choose_targets,
    group_closure,
    group_disagreements,
    group_label,
    shard_expectation,
    target_problems,
)
from tests.localindex import LocalIndex
from tests.upstreams import make_project

VARIANTS = """
[environment.variants.cpu]
package-index = { tvar = "tvar-cpu" }

[environment.variants.cu126]
cuda = "12.6"
package-index = { tvar = "tvar-cu126" }

[environment.variants.cu128]
cuda = "12.8"
package-index = { tvar = "tvar-cu128" }
"""

# The worker writes the build of tvar it imported into the run's record.
WORKER = (
    "import os, pathlib, tvar.build; "
    "pathlib.Path(os.environ['HARNESS_RUN_DIR'], 'build.txt').write_text(tvar.build.BUILD)"
)

BENCHMARK = f"""kind = "benchmark"
summary = "a worker that says which build of tvar it ran"
worker = ["{{python}}", "-c", {json.dumps(WORKER)}]

[environment]
python = "3.11"
requirements = ["tvar==1.0"]
{VARIANTS}"""

#: The platform tags of an x86_64 glibc 2.28+ machine (the project's lock target).
X86_TAGS = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 17, -1)] + ["linux_x86_64"]
AARCH64_TAGS = [f"manylinux_2_{minor}_aarch64" for minor in range(28, 17, -1)] + ["linux_aarch64"]


def harness(*args: str, home: Path, project: Path, **env: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--home", str(home), "--project", str(project), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@contextmanager
def variant_indexes(root: Path, stack: pytest.MonkeyPatch) -> Iterator[None]:
    """The default index (tshared) and an index per variant serving its build of tvar, named
    to harness through ``HARNESS_INDEX_*`` (set with ``stack``)."""
    with (
        LocalIndex(root / "pypi") as default,
        LocalIndex(root / "cpu") as cpu,
        LocalIndex(root / "cu126") as cu126,
        LocalIndex(root / "cu128") as cu128,
    ):
        default.add_wheel("tshared", "1.0")
        for local, label in ((cpu, "cpu"), (cu126, "cu126"), (cu128, "cu128")):
            local.add_wheel(
                "tvar", f"1.0+{label}", requires=["tshared"], modules={"tvar/build.py": f"BUILD = {label!r}\n"}
            )
        stack.setenv("HARNESS_INDEX_PYPI", default.url)
        stack.setenv("HARNESS_INDEX_TVAR_CPU", cpu.url)
        stack.setenv("HARNESS_INDEX_TVAR_CU126", cu126.url)
        stack.setenv("HARNESS_INDEX_TVAR_CU128", cu128.url)
        stack.delenv("HARNESS_VARIANT", raising=False)
        stack.delenv("HARNESS_CUDA_DRIVER", raising=False)
        yield


def variant_project(root: Path) -> Path:
    return make_project(root, {}, {"benchmarks/vb.toml": BENCHMARK.encode()})


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The project, locked, with the indexes still serving (for the runs)."""
    root = tmp_path_factory.mktemp("vgroups")
    with pytest.MonkeyPatch.context() as stack, variant_indexes(root, stack):
        project = variant_project(root / "p")
        result = harness("lock", home=root / "home", project=project)
        assert result.returncode == 0, result.stderr
        yield project


def _whole(project: Path) -> Lock:
    return read(project / "locks" / "vb.lock.toml", whole=True)


def test_every_target_has_its_own_store_paths_and_digest(locked: Path) -> None:
    lock = _whole(locked)
    targets = target_paths(lock)
    assert [(t.variant, t.cuda) for t in targets] == [("cpu", None), ("cu126", "12.6"), ("cu128", "12.8")]
    assert len({t.digest for t in targets}) == 3 and len({t.environment for t in targets}) == 3
    # Each is the projection's own paths, exactly what realizing that variant names.
    from harness.lock.objects import lock_objects

    for t in targets:
        single = for_platform(lock, t.platform, t.variant)
        assert list(t.paths) == lock_objects(single) and t.environment == single.environment.store
        assert t.digest == paths_digest(lock_objects(single)) and t.interpreter == t.own_interpreter
    from harness.lock.objects import build_inputs

    # The targets' paths are their runtime closures: the interpreter is the one they share;
    # the wheel every variant installs is one path among what they are built from.
    assert set.intersection(*(set(t.paths) for t in targets)) == {targets[0].own_interpreter}
    singles = [for_platform(lock, t.platform, t.variant) for t in targets]
    shared = set.intersection(*(set(build_inputs(single)) for single in singles))
    assert any("tshared" in p for p in shared), "what the variants share is one path"
    # Built on a host copy standing in: another interpreter, so another environment path.
    host = "b" * 32 + "-cpython-3.11.7-host"
    stood = target_paths(lock, {targets[0].own_interpreter: host})
    assert all(t.interpreter == host and host in t.paths for t in stood)
    assert [t.environment for t in stood] != [t.environment for t in targets]
    assert target_paths(lock) == targets, "pure: the same lock, the same paths"


def _table(lock: Lock, head: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    from harness.runs.groups import expected_targets

    return expected_targets({"vb": lock}, head or {"locks": {}})


def test_a_node_chooses_its_target_as_realize_does_and_is_refused_naming_the_offer(locked: Path) -> None:
    table = _table(_whole(locked))
    platform = table["vb"][0]["platform"]

    def chosen(driver: str | None, forced: str | None = None) -> str:
        return choose_targets(table, host_tags=X86_TAGS, driver=driver, forced=forced)["vb"].variant

    assert (chosen(None), chosen("12.6"), chosen("12.9"), chosen("12.9", "cpu")) == ("cpu", "cu126", "cu128", "cpu")
    with pytest.raises(TargetRefused) as refused:
        choose_targets(table, host_tags=X86_TAGS, driver="12.8", forced="rocm", here="node gpu-b (/h/b)")
    message = refused.value.message
    assert "node gpu-b (/h/b)" in message and "HARNESS_VARIANT=rocm" in message, message
    assert f"{platform} (cpu, cu126, cu128)" in message and "no variant 'rocm'" in message, message
    with pytest.raises(TargetRefused, match="runs none of the platforms of lock vb"):
        choose_targets(table, host_tags=AARCH64_TAGS, driver=None, forced=None)
    label = group_label(choose_targets(table, host_tags=X86_TAGS, driver="12.8", forced=None))
    assert label == f"{platform} cu128"


def _head(lock: Lock, variant: str) -> dict[str, Any]:
    """A head's expected closure that ran ``variant``: made-up content hashes."""
    target = next(t for t in target_paths(lock) if t.variant == variant)
    return {
        "store_paths": [{"path": p, "content": f"blake3:{i}"} for i, p in enumerate(sorted(target.paths))],
        "locks": {
            "vb": {
                "interpreter": target.interpreter,
                "standing_in_for": None,
                "environment": target.environment,
                "lock_blake3": "L",
                "python": f"cpython 3.11.7 {target.platform}",
                "code": None,
            }
        },
    }


def test_the_closure_of_a_group_takes_the_heads_content_where_it_shares_a_path(locked: Path) -> None:
    lock = _whole(locked)
    head = _head(lock, "cpu")
    table = _table(lock, head)
    platform = table["vb"][0]["platform"]
    same = group_closure(head, table, {"vb": NodeTarget(platform, "cpu", "r")})
    assert same["store_paths"] == head["store_paths"], "the head's own group is the head's closure"
    other = group_closure(head, table, {"vb": NodeTarget(platform, "cu128", "r")})
    cu128 = next(t for t in target_paths(lock) if t.variant == "cu128")
    assert {e["path"] for e in other["store_paths"]} == set(cu128.paths)
    known = {e["path"]: e["content"] for e in head["store_paths"]}
    for entry in other["store_paths"]:
        assert entry["content"] == known.get(entry["path"], ""), entry
    assert other["locks"]["vb"]["environment"] == cu128.environment
    with pytest.raises(HarnessError, match="holds no target"):
        group_closure(head, table, {"vb": NodeTarget(platform, "rocm", "r")})


def test_a_shard_is_judged_against_its_own_variant_and_its_reason(locked: Path) -> None:
    from harness.runs.closures import closure_differences

    lock = _whole(locked)
    head = _head(lock, "cpu")
    table = _table(lock, head)
    platform = table["vb"][0]["platform"]
    driver = choose_variant([("cpu", None), ("cu126", "12.6"), ("cu128", "12.8")], driver="12.8").reason
    cluster = {"targets": table, "variant": None}
    node = group_closure(head, table, {"vb": NodeTarget(platform, "cu128", driver)})
    node = json.loads(json.dumps(node))
    for entry in node["store_paths"]:
        entry["content"] = entry["content"] or "blake3:built-on-the-node"
    node["locks"]["vb"].update(variant="cu128", variant_reason=driver, platform=platform)
    expectation = shard_expectation(cluster, head, node)
    assert expectation.problems == [] and expectation.group == f"{platform} cu128"
    assert closure_differences(expectation.expected, node) == []
    # A record naming cu126 for the paths of cu128: judged against cu126, it differs.
    lied = json.loads(json.dumps(node))
    lied["locks"]["vb"].update(variant="cu126", variant_reason=driver.replace("12.8", "12.6", 1))
    assert target_problems(table, {"vb": NodeTarget(platform, "cu126", driver)}) != []
    assert closure_differences(shard_expectation(cluster, head, lied).expected, lied) != []
    # A reason that does not lead to its variant, and a variant other than the run forced.
    wrong = json.loads(json.dumps(node))
    wrong["locks"]["vb"]["variant_reason"] = "no NVIDIA driver here: the variant that needs no CUDA"
    assert "chooses cpu, not cu128" in shard_expectation(cluster, head, wrong).problems[0]
    forced = shard_expectation({**cluster, "variant": "cpu"}, head, node).problems
    assert forced and "the run forced cpu" in forced[0] and "reason" not in forced[0], forced


def test_reason_problem_accepts_exactly_what_choosing_says() -> None:
    variants: list[tuple[str, str | None]] = [("cpu", None), ("cu126", "12.6"), ("cu128", "12.8")]
    for driver, forced in ((None, None), ("12.4", None), ("12.6", None), ("13.0", None), ("12.6", "cu128")):
        choice = choose_variant(variants, driver=driver, forced=forced)
        assert reason_problem(variants, choice.variant, choice.reason) is None, choice
    assert "not one the lock holds" in str(reason_problem(variants, "rocm", "named by HARNESS_VARIANT"))
    said = "the NVIDIA driver supports CUDA 12.6: cu126 (CUDA 12.6) is the newest it runs"
    assert "chooses cu126, not cu128" in str(reason_problem(variants, "cu128", said))
    assert "none harness gives" in str(reason_problem(variants, "cpu", "because"))


def test_shards_of_one_group_that_disagree_on_their_own_paths_are_named() -> None:
    def closure(content: str) -> dict[str, Any]:
        return {"store_paths": [{"path": "a" * 32 + "-vb-env", "content": content}]}

    members = {0: ("g", closure("blake3:1")), 1: ("g", closure("blake3:1")), 2: ("g", closure("blake3:2"))}
    members[3] = ("other", closure("blake3:3"))
    told = group_disagreements(members)
    assert list(told) == [2] and "shard(s) 0, 1 of its group g" in told[2] and "vb-env is blake3:2" in told[2]
    assert group_disagreements({0: ("g", closure("x")), 1: ("g", closure("x"))}) == {}


def test_audit_checks_the_variant_of_a_local_run(locked: Path, tmp_path: Path) -> None:
    """A run on a machine whose driver supports CUDA 12.6 runs cu126 and says why; audit
    passes it, and fails the record once it names cu128 (paths of cu126), or a reason that
    chooses another variant."""
    home = tmp_path / "home"
    result = harness("run", "--benchmark", "vb", home=home, project=locked, HARNESS_CUDA_DRIVER="12.6")
    assert result.returncode == 0, result.stderr
    [run_dir] = list((home / "runs").iterdir())
    assert (run_dir / "build.txt").read_text() == "cu126"
    closure = json.loads((run_dir / "lock.json").read_text())
    entry = closure["locks"]["vb"]
    assert entry["variant"] == "cu126" and "supports CUDA 12.6" in entry["variant_reason"]
    assert entry["variants"] == [["cpu", None], ["cu126", "12.6"], ["cu128", "12.8"]]
    audit = harness("audit", run_dir.name, home=home, project=locked)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    line = next(ln for ln in audit.stdout.splitlines() if "vb: variant cu126" in ln)
    assert line.startswith("ok") and "that variant's" in line, line
    original = (run_dir / "lock.json").read_text()
    newest = "the NVIDIA driver supports CUDA 12.8: cu128 (CUDA 12.8) is the newest it runs"
    for change, told in (
        ({"variant": "cu128", "variant_reason": newest}, "the closure is not cu128's projection of the lock"),
        ({"variant_reason": "no NVIDIA driver here: the variant that needs no CUDA"}, "chooses cpu, not cu126"),
    ):
        tampered = json.loads(original)
        tampered["locks"]["vb"].update(change)
        (run_dir / "lock.json").write_text(json.dumps(tampered))
        audit = harness("audit", run_dir.name, home=home, project=locked)
        assert audit.returncode == 1, audit.stdout
        bad = [ln for ln in audit.stdout.splitlines() if ln.startswith("modified") and "vb: variant" in ln]
        assert len(bad) == 1 and told in bad[0], audit.stdout


def test_diff_names_a_shard_whose_group_changed_and_the_record_lists_groups() -> None:
    from harness.runs.audit import cluster_differences
    from harness.runs.groups import shard_groups

    def view(groups: list[str]) -> dict[str, Any]:
        per_shard = [
            {"index": i, "where": "n (/h)", "status": "ok", "score": 1.0, "platform": "linux-x86_64"}
            | {"group": g, "retries": 0, "closure": "the head's"}
            for i, g in enumerate(groups)
        ]
        return {"engine": "ray", "shards": len(groups), "retries": 3, "per_shard": per_shard}

    before, after = view(["p cpu", "p cu128"]), view(["p cpu", "p cpu"])
    assert cluster_differences(before, after) == ["shard 1/2 group: p cu128 → p cpu"]
    assert cluster_differences(before, view(["p cpu"] * 3))[1] == "shard groups: p cpu ×1, p cu128 ×1 → p cpu ×3"
    summaries = [
        {"index": 0, "group": "p cpu", "expected_digest": "E1", "closure_digest": "C1"},
        {"index": 1, "group": "p cu128", "expected_digest": "E2", "closure_digest": "C2"},
        {"index": 2, "group": "p cu128", "expected_digest": "E2", "closure_digest": "C2"},
        {"index": 3, "status": "lost"},
    ]
    groups = shard_groups(summaries)
    assert groups["p cu128"]["shards"] == [1, 2] and groups["p cu128"]["closure_digests"] == ["C2"]
    assert list(groups) == ["p cpu", "p cu128"] and groups["p cpu"]["expected_digest"] == "E1"


def test_a_two_platform_lock_of_variants_has_a_target_per_platform_and_variant(tmp_path: Path) -> None:
    """x86_64 servers and an aarch64 robot computer share one lock: six targets, the head's
    stand-in applies to its own platform's only, and an aarch64 node chooses aarch64's."""
    with pytest.MonkeyPatch.context() as stack, variant_indexes(tmp_path / "indexes", stack):
        project = variant_project(tmp_path / "p")
        settings = project / "harness.toml"
        settings.write_text(
            settings.read_text().replace(
                'platform = "x86_64-manylinux_2_28"', 'platforms = ["x86_64-manylinux_2_28", "aarch64-manylinux_2_28"]'
            )
        )
        result = harness("lock", home=tmp_path / "home", project=project)
        assert result.returncode == 0, result.stderr
    lock = _whole(project)
    targets = target_paths(lock)
    assert [(t.platform.split("-")[0], t.variant) for t in targets] == [
        (arch, v) for arch in ("x86_64", "aarch64") for v in ("cpu", "cu126", "cu128")
    ]
    assert len({t.digest for t in targets}) == 6 and len({t.own_interpreter for t in targets}) == 2
    host = "c" * 32 + "-cpython-3.11.7-host"
    head = {"locks": {"vb": {"standing_in_for": targets[0].own_interpreter, "interpreter": host}}}
    table = _table(lock, head)
    assert [e["interpreter"] == host for e in table["vb"]] == [True] * 3 + [False] * 3
    chosen = choose_targets(table, host_tags=AARCH64_TAGS, driver="12.6", forced=None)
    assert chosen["vb"] == NodeTarget(targets[3].platform, "cu126", chosen["vb"].reason)
    assert group_label(chosen) == f"{targets[3].platform} cu126"
    cpu_arm = group_closure(
        {"store_paths": [], "locks": head["locks"]}, table, {"vb": NodeTarget(targets[3].platform, "cpu")}
    )
    assert {e["path"] for e in cpu_arm["store_paths"]} == set(targets[3].paths)
    assert cpu_arm["locks"]["vb"]["python"].endswith(targets[3].platform)
