"""A cluster run over nodes that run other accelerator variants of one lock, on a real local Ray cluster.

The head node (no GPU, ``HARNESS_CUDA_DRIVER=none``) runs the cpu variant of the benchmark's
lock; the second node has ``HARNESS_VARIANT=cu128`` in its own environment (as a node whose
deploy or operator names it), so it takes cu128. The lock is built in the test from local
wheels (``tvar 1.0+cpu``, ``+cu126``, ``+cu128``: tests/test_variant_groups.py), served from
local indexes every node reaches; the head signs its pushes to a directory cache.

* Each node's shards are proven against their own variant's closure: the cu128 shards pass,
  ran the cu128 build, and the record, ``audit`` and ``diff`` group the shards by variant.
* A benchmark whose lock lacks cu128: the second node's shards are refused before their first
  episode, naming what the node is and what the lock offers.

Skipped, saying why, where Ray is not installed (``pip install -e '.[ray]'``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' to run the cluster tests")

from tests.raycluster import Cluster, sign_into_lab_cache, start_cluster
from tests.test_variant_groups import BENCHMARK, VARIANTS, variant_indexes, variant_project

# The same worker, from a lock that holds cpu and cu126 only.
NO_CU128 = BENCHMARK.replace(VARIANTS, VARIANTS.split("[environment.variants.cu128]")[0])


@dataclass
class Setup:
    cluster: Cluster
    project: Path


def _harness(setup: Setup, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HARNESS_HOME": str(setup.cluster.head.home), "RAY_ADDRESS": setup.cluster.address}
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--project", str(setup.project), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _run_dir(stderr: str) -> Path:
    line = [ln for ln in stderr.splitlines() if "; record " in ln][-1]
    return Path(line.rsplit("; record ", 1)[1].strip())


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("clustervariants")
    with pytest.MonkeyPatch.context() as stack, variant_indexes(root / "indexes", stack):
        stack.setenv("HARNESS_CUDA_DRIVER", "none")  # the head and its node: no GPU, whatever this machine has
        project = variant_project(root / "project")
        (project / "benchmarks" / "nocu128.toml").write_text(NO_CU128)
        head_home = root / "home-head"
        head_home.mkdir()
        sign_into_lab_cache(root, head_home)
        locked = subprocess.run(
            [sys.executable, "-m", "harness", "--project", str(project), "--home", str(head_home), "lock"],
            capture_output=True,
            text=True,
        )
        assert locked.returncode == 0, locked.stderr
        cluster = start_cluster(root, second_env={"HARNESS_VARIANT": "cu128"})
        try:
            yield Setup(cluster, project)
        finally:
            cluster.stop()


def _lacking(setup: Setup, table: list[dict[str, object]]) -> set[tuple[str, str]]:
    """The variants of ``vb`` whose closure the lab's directory cache does not hold whole now:
    the gaps a run must name. Other tests of this module push variants too (a run forced to
    cu126 pushes cu126's closure), so the expectation is read from the cache, in any order."""
    from harness.cache.format import narinfo_key

    cache = setup.cluster.head.home.parent / "cache"
    return {
        ("vb", str(t["variant"]))
        for t in table
        if not all((cache / narinfo_key(str(p))).is_file() for p in t.get("paths") or [])  # type: ignore[attr-defined]
    }


def test_each_node_is_proven_against_its_own_variants_closure(setup: Setup) -> None:
    result = _harness(setup, "run", "--benchmark", "vb", "--cluster", "ray", "--shards", "4")
    assert result.returncode == 0, result.stderr
    run_dir = _run_dir(result.stderr)
    config = json.loads((run_dir / "config.json").read_text())["cluster"]
    table = config["targets"]["vb"]
    assert [t["variant"] for t in table] == ["cpu", "cu126", "cu128"] and len({t["digest"] for t in table}) == 3
    platform = table[0]["platform"]
    assert config["group"] == f"{platform} cpu" and config["variant"] is None
    # The head pushed cpu's closure only: before the shards started it said which targets the cache lacks.
    gaps = {(g["lock"], g["variant"]) for g in config["cache_gaps"]}
    assert gaps == _lacking(setup, table) and ("vb", "cpu") not in gaps, gaps
    assert f"store paths of vb cu128 ({platform}): nodes that run it build them" in result.stderr, result.stderr
    assert "`harness store push --variant cu128 " in result.stderr, result.stderr
    outcome = json.loads((run_dir / "result.json").read_text())
    second = str(setup.cluster.second.home)
    by_home: dict[str, list[dict[str, object]]] = {}
    for shard in outcome["shards"]:
        by_home.setdefault(str(shard["home"]), []).append(shard)
    assert set(by_home) == {str(setup.cluster.head.home), second}, outcome["shards"]
    for home, shards in by_home.items():
        variant = "cu128" if home == second else "cpu"
        for shard in shards:
            assert shard["status"] == "ok" and shard["same_closure"], shard
            assert shard["group"] == f"{platform} {variant}", shard
            record = run_dir / "shards" / str(shard["index"])
            assert (record / "build.txt").read_text() == variant, "the worker imported its variant's build"
            locked = json.loads((record / "lock.json").read_text())["locks"]["vb"]
            assert locked["variant"] == variant
        if home == second:
            log = (run_dir / "shards" / str(shards[0]["index"]) / "logs" / "shard.log").read_text()
            assert f"target: {platform} cu128 (vb cu128: named by HARNESS_VARIANT" in log, log
    groups = outcome["groups"]
    assert sorted(groups) == [f"{platform} cpu", f"{platform} cu128"], groups
    assert groups[f"{platform} cpu"]["expected_digest"] != groups[f"{platform} cu128"]["expected_digest"]
    assert all(len(g["closure_digests"]) == 1 for g in groups.values()), groups

    audit = _harness(setup, "audit", run_dir.name)
    assert audit.returncode == 0, audit.stdout
    shard_lines = [ln for ln in audit.stdout.splitlines() if " shard " in ln]
    assert len(shard_lines) == 4 and all(ln.startswith("ok") for ln in shard_lines), audit.stdout
    assert sum("as its targets' closure" in ln and second in ln for ln in shard_lines) == len(by_home[second])
    assert any(ln.startswith("ok") and "cluster targets: the 3 targets" in ln for ln in audit.stdout.splitlines())

    # The table the shards were judged against, edited to let cu128 be other paths: named.
    config_file = run_dir / "config.json"
    original = config_file.read_text()
    edited = json.loads(original)
    edited["cluster"]["targets"]["vb"][2]["paths"].pop()
    config_file.write_text(json.dumps(edited))
    audit = _harness(setup, "audit", run_dir.name)
    config_file.write_text(original)
    told = "cluster targets: config.json's targets of vb are not what the lock files give"
    assert audit.returncode == 1 and any(ln.startswith("modified") and told in ln for ln in audit.stdout.splitlines())

    # A cu128 shard whose record names cu126 (with a reason that leads to it) fails the audit.
    index = by_home[second][0]["index"]
    lock_file = run_dir / "shards" / str(index) / "lock.json"
    original = lock_file.read_text()
    tampered = json.loads(original)
    tampered["locks"]["vb"]["variant"] = "cu126"
    lock_file.write_text(json.dumps(tampered))
    audit = _harness(setup, "audit", run_dir.name)
    lock_file.write_text(original)
    bad = [ln for ln in audit.stdout.splitlines() if ln.startswith("modified") and " shard " in ln]
    assert audit.returncode == 1 and len(bad) == 1 and f"shard {index}/4" in bad[0], audit.stdout

    # cu128's closure realized and pushed from the head, which has no GPU: the cache holds it now.
    cache = str(setup.cluster.head.home.parent / "cache")
    assert _harness(setup, "--variant", "cu128", "realize", "vb").returncode == 0
    pushed = _harness(setup, "--variant", "cu128", "store", "push", cache, "vb")
    assert pushed.returncode == 0, pushed.stderr

    # Forced to cpu for the whole run, the second node's shards change group: diff says so.
    forced = _harness(setup, "--variant", "cpu", "run", "--benchmark", "vb", "--cluster", "ray", "--shards", "4")
    assert forced.returncode == 0, forced.stderr
    gaps = json.loads((_run_dir(forced.stderr) / "config.json").read_text())["cluster"]["cache_gaps"]
    assert {(g["lock"], g["variant"]) for g in gaps} == _lacking(setup, table), gaps
    assert ("vb", "cu128") not in {(g["lock"], g["variant"]) for g in gaps}, gaps
    assert "of vb cu128" not in forced.stderr, forced.stderr
    forced_dir = _run_dir(forced.stderr)
    shards = json.loads((forced_dir / "result.json").read_text())["shards"]
    assert {s["group"] for s in shards} == {f"{platform} cpu"}, shards
    diff = _harness(setup, "diff", run_dir.name, forced_dir.name)
    assert diff.returncode == 0, diff.stderr
    assert f"{platform} cu128" in diff.stdout and "group" in diff.stdout, diff.stdout


def test_a_node_whose_variant_the_lock_lacks_is_refused_before_its_first_episode(setup: Setup) -> None:
    result = _harness(setup, "run", "--benchmark", "nocu128", "--cluster", "ray", "--shards", "4")
    assert result.returncode == 1, result.stderr
    run_dir = _run_dir(result.stderr)
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    second = str(setup.cluster.second.home)
    refused = [s for s in shards if s["home"] == second]
    assert refused and all(s["status"] == "failed" and s["closure_refused"] for s in refused), shards
    for shard in refused:
        reason = shard["reason"]
        assert second in reason and "HARNESS_VARIANT=cu128" in reason, reason
        assert "lock nocu128, which holds" in reason and "(cpu, cu126)" in reason, reason
        record = run_dir / "shards" / str(shard["index"])
        assert not (record / "build.txt").exists() and not (record / "logs" / "command.log").exists()
    assert all(s["status"] == "ok" for s in shards if s["home"] != second), shards
    store = setup.cluster.second.home / "store"
    assert not store.is_dir() or not any(p.name.endswith("-nocu128-env") for p in store.iterdir())
    audit = _harness(setup, "audit", run_dir.name)
    bad = [ln for ln in audit.stdout.splitlines() if " shard " in ln and not ln.startswith("ok")]
    assert audit.returncode == 1 and len(bad) == len(refused), audit.stdout
    assert all("refused before its first episode" in ln and second in ln for ln in bad), bad


def test_a_run_forced_to_a_variant_resumes_with_it(setup: Setup) -> None:
    """``--variant cu126`` forces every shard (submitit's local executor here); a shard whose
    record is gone is run again by ``--resume``, which forces cu126 again though nothing on
    this machine asks for it (no driver: cpu)."""
    import shutil

    pytest.importorskip("submitit", reason="submitit is not installed: pip install -e '.[slurm]'")
    args = ("run", "--benchmark", "vb", "--cluster", "slurm-local", "--shards", "2")
    result = _harness(setup, "--variant", "cu126", *args)
    assert result.returncode == 0, result.stderr
    run_dir = _run_dir(result.stderr)
    assert json.loads((run_dir / "config.json").read_text())["cluster"]["variant"] == "cu126"
    shutil.rmtree(run_dir / "shards" / "1")  # lost with its node
    resumed = _harness(setup, "run", "--resume", run_dir.name)
    assert resumed.returncode == 0, resumed.stderr
    shards = json.loads((run_dir / "result.json").read_text())["shards"]
    assert [s["status"] for s in shards] == ["ok", "ok"] and {s["group"].split()[-1] for s in shards} == {"cu126"}
    assert (run_dir / "shards" / "1" / "build.txt").read_text() == "cu126"
    audit = _harness(setup, "audit", run_dir.name)
    assert audit.returncode == 0, audit.stdout
