"""Cluster runs without a cluster: ``--cluster`` input, the combined record, the shard audit.

The engines themselves run in tests/test_cluster.py on a real local Ray cluster; here the
record and audit logic is checked on records written by hand, and the CLI's refusals.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.errors import InputError
from harness.runs.audit import audit_run
from harness.runs.audit import audit_shards
from harness.runs.cluster import closure_digest, combine_benchmarks, parse_target, ray_reason


def test_cluster_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_target("ray://head:10001").address == "ray://head:10001"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert (parse_target("ray").engine, parse_target("ray").address) == ("ray", "10.0.0.1:6379")
    monkeypatch.delenv("RAY_ADDRESS")
    assert parse_target("ray").address is None
    assert parse_target("slurm").engine == "slurm" and parse_target("slurm-local").engine == "slurm-local"
    for bad in ("ray://", "k8s://x", "Ray"):
        with pytest.raises(InputError, match="--cluster"):
            parse_target(bad)


def test_cli_refuses_shards_without_a_cluster_and_unknown_clusters(harness_cli: Any) -> None:
    result = harness_cli("run", "--agent", "kinematics-only", "--shards", "2")
    assert result.code == 2 and "--shards splits a run over a cluster: give --cluster too" in result.err
    result = harness_cli("run", "--agent", "kinematics-only", "--cluster", "nowhere", "--shards", "2")
    assert result.code == 2 and "--cluster 'nowhere': unknown cluster" in result.err
    result = harness_cli("run", "--agent", "kinematics-only", "--cluster", "ray", "--shards", "0")
    assert result.code == 2 and "--shards 0: need at least 1" in result.err
    assert "Traceback" not in result.err


def test_combined_benchmark_is_the_union_of_the_shards() -> None:
    shards = [
        {
            "benchmark": "reach",
            "seed": 0,
            "shard": f"{i}/2",
            "episodes": 2,
            "successes": s,
            "episode_results": [{"episode": i + 2 * k} for k in range(2)],
        }
        for i, s in ((0, 2), (1, 1))
    ]
    combined = combine_benchmarks(shards, 2)
    assert combined is not None
    assert (combined["episodes"], combined["successes"], combined["success_rate"]) == (4, 3, 0.75)
    assert [e["episode"] for e in combined["episode_results"]] == [0, 1, 2, 3]
    assert combine_benchmarks(shards[:1], 2) is None, "a missing shard leaves no combined score"


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _record(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A cluster run's record with three shards: the same closure, another one, none."""
    run = tmp_path / "runs" / "r1"
    closure = {
        "store_paths": [
            {"path": "aaa-env", "content": "blake3:1", "kind": "environment"},
            {"path": "bbb-code", "content": "blake3:2", "kind": "source"},
        ],
        "locks": {"svc": {"lock_blake3": "L"}},
        "project_files": {},
    }
    _write(run / "config.json", {"id": "r1", "impurities": [], "cluster": {"shards": 3}})
    _write(run / "lock.json", closure)
    _write(run / "shards" / "0" / "lock.json", closure)
    _write(run / "shards" / "0" / "shard.json", {"hostname": "gpu-a", "home": "/h/a"})
    other = json.loads(json.dumps(closure))
    other["store_paths"][0]["content"] = "blake3:9"
    _write(run / "shards" / "1" / "lock.json", other)
    _write(run / "shards" / "1" / "shard.json", {"hostname": "gpu-b", "home": "/h/b"})
    _write(
        run / "shards" / "2" / "shard.json",
        {"hostname": "gpu-c", "home": "/h/c", "reason": "on gpu-c (/h/c): offline, and the store lacks 1 thing(s)"},
    )
    return run, closure


def test_audit_names_the_node_that_ran_other_bits_and_the_shard_without_a_record(tmp_path: Path) -> None:
    run, closure = _record(tmp_path)
    items = audit_shards(run, closure)
    assert [i.status for i in items] == ["ok", "modified", "missing"]
    assert "gpu-a (/h/a)" in items[0].path and "same 2 store paths" in items[0].detail
    assert "gpu-b (/h/b)" in items[1].path and "aaa-env: blake3:1 here, blake3:9 there" in items[1].detail
    assert "gpu-c" in items[2].path and "offline" in items[2].detail
    # audit_run includes them: the whole audit fails, the head's own store paths aside.
    report = audit_run(run, tmp_path / "store", None)
    assert report.failed and sum(1 for i in report.items if i.path.startswith("shard ")) == 3


def test_closure_digest_depends_on_paths_and_content_only(tmp_path: Path) -> None:
    _, closure = _record(tmp_path)
    shuffled = {"store_paths": list(reversed(closure["store_paths"])), "locks": {}}
    assert closure_digest(closure) == closure_digest(shuffled)
    changed = json.loads(json.dumps(closure))
    changed["store_paths"][1]["content"] = "blake3:3"
    assert closure_digest(changed) != closure_digest(closure)


@pytest.mark.parametrize(
    ("cluster", "module", "extra"), [("ray", "ray", "harness[ray]"), ("slurm", "submitit", "harness[slurm]")]
)
def test_a_missing_engine_says_which_extra_to_install(
    harness_cli: Any, monkeypatch: pytest.MonkeyPatch, cluster: str, module: str, extra: str
) -> None:
    """Before anything is realized: the optional engine is not importable (as without the extra)."""
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    result = harness_cli("run", "--agent", "kinematics-only", "--cluster", cluster, "--shards", "2")
    assert result.code == 1 and f"pip install '{extra}'" in result.err and "Traceback" not in result.err


def test_a_ray_connection_error_is_told_without_the_servers_traceback() -> None:
    """Ray appends its client server's Python traceback to a failed ``ray.init``; a user is
    told its message and the traceback's last line (what went wrong), not the frames."""
    server_side = ConnectionAbortedError(
        "Initialization failure from server:\n"
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/ray/util/client/server/proxier.py", line 700, in Datapath\n'
        "    if not self.proxy_manager.start_specific_server(\n"
        "psutil.ZombieProcess: PID still exists but it's a zombie (pid=4242)\n"
    )
    assert ray_reason(server_side) == (
        "Initialization failure from server: psutil.ZombieProcess: PID still exists but it's a zombie (pid=4242)"
    )
    assert ray_reason(ConnectionError("Could not find any running Ray instance.")) == (
        "Could not find any running Ray instance."
    )
    assert ray_reason(RuntimeError("")) == "RuntimeError"


def test_a_shard_brings_back_its_record_but_not_its_workers_folder(tmp_path: Path) -> None:
    """A worker with workdir = "run" writes whatever it writes (videos) into the shard
    record's work/: that stays on the node, where shard.json's record_dir names it; the
    record's own files come back as text."""
    from harness.runs.shard import _collect

    (tmp_path / "logs").mkdir()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "logs" / "command.log").write_text("episode 1\n")
    video = tmp_path / "work" / "eval_result" / "RoboDojo" / "task"
    video.mkdir(parents=True)
    (video / "episode0.mp4").write_bytes(bytes(range(256)) * 64)
    (video / "_result.json").write_text("{}")
    assert _collect(tmp_path) == {"config.json": "{}", "logs/command.log": "episode 1\n"}
