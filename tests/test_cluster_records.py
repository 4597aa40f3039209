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
    _write(run / "shards" / "0" / "shard.json", {"hostname": "gpu-a", "home": "/h/a", "status": "ok"})
    other = json.loads(json.dumps(closure))
    other["store_paths"][0]["content"] = "blake3:9"
    _write(run / "shards" / "1" / "lock.json", other)
    _write(run / "shards" / "1" / "shard.json", {"hostname": "gpu-b", "home": "/h/b", "status": "ok"})
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
    assert "gpu-b (/h/b)" in items[1].path and "aaa-env: blake3:1 on the head, blake3:9 on the node" in items[1].detail
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


@pytest.mark.parametrize(("cluster", "module", "extra"), [("ray", "ray", ".[ray]"), ("slurm", "submitit", ".[slurm]")])
def test_a_missing_engine_says_which_extra_to_install(
    harness_cli: Any, monkeypatch: pytest.MonkeyPatch, cluster: str, module: str, extra: str
) -> None:
    """Before anything is realized: the optional engine is not importable (as without the extra)."""
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    result = harness_cli("run", "--agent", "kinematics-only", "--cluster", cluster, "--shards", "2")
    # From the checkout: the distribution is not on the index (and "harness" there is another project).
    assert result.code == 1 and f"pip install -e '{extra}'" in result.err and "Traceback" not in result.err


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


def _launch_refused(path: str) -> dict[str, Any]:
    return {
        "launch": "kinematics",
        "refused": {"path": path, "files": [f"{path}/lib/x.py"], "expected": "blake3:1", "found": "blake3:7"},
    }


def test_judge_shard_sees_refusals_failures_cancels_and_losses() -> None:
    """A shard refused at launch, failed, cancelled, lost or never recorded is no ``ok``, and
    each verdict names node, home and reason (pure: records as data)."""
    from harness.runs.audit import judge_shard

    head = {"store_paths": [{"path": "aaa-env", "content": "blake3:1"}], "locks": {}}
    node = {"hostname": "gpu-b", "home": "/h/b", "status": "ok"}
    ok = judge_shard(0, 4, node, head, [{"launch": "kinematics", "paths": {}}], head)
    assert ok.status == "ok" and "gpu-b (/h/b)" in ok.path and "same 1 store paths" in ok.detail
    # Same lock.json as the head (written before the launch check), but the launch was refused.
    failed = {**node, "status": "failed", "reason": "on gpu-b (/h/b): kinematics: refusing to start the run"}
    refused = judge_shard(1, 4, failed, head, [_launch_refused("aaa-env")], head)
    assert refused.status == "modified" and refused.at_launch == "refused"
    assert "gpu-b (/h/b)" in refused.path and "aaa-env/lib/x.py" in refused.detail and "blake3:7" in refused.detail
    assert judge_shard(1, 4, failed, head, [], head).status == "failed"
    cancelled = judge_shard(2, 4, {**node, "status": "cancelled", "reason": "interrupted"}, None, [], head)
    assert (cancelled.status, cancelled.detail) == ("cancelled", "interrupted")
    lost = judge_shard(3, 4, {"status": "lost", "reason": "no result came back"}, None, [], head)
    assert lost.status == "missing" and "no result came back" in lost.detail and "? (?)" in lost.path
    assert judge_shard(3, 4, None, None, [], head).status == "missing"


def test_a_refused_cluster_run_fails_its_audit(tmp_path: Path) -> None:
    """audit_run reads each shard's launch checks: shards refused at launch make it fail."""
    run, closure = _record(tmp_path)
    _write(run / "shards" / "1" / "lock.json", closure)  # as the node wrote it, before its launch check
    (run / "shards" / "1" / "services").mkdir(parents=True)
    (run / "shards" / "1" / "services" / "launch-checks.jsonl").write_text(json.dumps(_launch_refused("aaa-env")))
    items = audit_shards(run, closure)
    assert [i.status for i in items] == ["ok", "modified", "missing"]
    assert "refused at launch of kinematics" in items[1].detail and "gpu-b (/h/b)" in items[1].path


def test_closure_differences_name_the_interpreter_and_each_path() -> None:
    """A node whose host interpreter stood in: the interpreter and the environment built on
    it are named by their readable names, both sides' paths given; same closures: none."""
    from harness.runs.closures import closure_differences, expected_closure, mismatch_message

    head = {
        "store_paths": [
            {"path": "a" * 32 + "-cpython-3.11.7", "content": "blake3:p", "kind": "python"},
            {"path": "b" * 32 + "-kinematics-env", "content": "blake3:e", "kind": "environment"},
            {"path": "c" * 32 + "-numpy", "content": "blake3:n", "kind": "wheel"},
        ],
        "locks": {"kinematics": {"interpreter": "a" * 32 + "-cpython-3.11.7", "lock_blake3": "L", "packages": {}}},
    }
    assert closure_differences(head, head) == [] and closure_differences(expected_closure(head), head) == []
    node = json.loads(json.dumps(head))
    node["store_paths"][0]["path"] = "d" * 32 + "-cpython-3.11.7-host"
    node["store_paths"][1]["path"] = "f" * 32 + "-kinematics-env"
    node["locks"]["kinematics"]["interpreter"] = "d" * 32 + "-cpython-3.11.7-host"
    node["locks"]["kinematics"]["standing_in_for"] = "a" * 32 + "-cpython-3.11.7"
    found = closure_differences(expected_closure(head), node)
    assert [d.what for d in found] == ["kinematics: interpreter", "kinematics-env"]
    assert "a host copy standing in for " + "a" * 32 in found[0].actual
    assert found[1].told() == f"kinematics-env: {'b' * 32}-kinematics-env on the head, {'f' * 32}-kinematics-env here"
    assert "2 difference(s)" in mismatch_message(found)
    # Both sides host copies standing in for the lock's: said once, with both copies.
    other = json.loads(json.dumps(node))
    other["locks"]["kinematics"]["interpreter"] = "g" * 32 + "-cpython-3.11.7-host"
    other["store_paths"][0]["path"] = "g" * 32 + "-cpython-3.11.7-host"
    (line,) = [d.told() for d in closure_differences(other, node) if "interpreter" in d.what]
    own = "a" * 32 + "-cpython-3.11.7"
    assert (
        line
        == f"kinematics: interpreter (a host copy standing in for {own}): {'g' * 32}-cpython-3.11.7-host on the head, {'d' * 32}-cpython-3.11.7-host here"
    )


def test_head_standins_are_read_from_the_head_closure() -> None:
    from harness.runs.shard import head_standins

    closure = {
        "locks": {
            "kinematics": {"interpreter": "h-cpython-host", "standing_in_for": "o-cpython"},
            "reach": {"interpreter": "o-cpython", "standing_in_for": None},
        }
    }
    assert head_standins(closure) == {"o-cpython": "h-cpython-host"}


def _view(shards: int, per_shard: list[dict[str, Any]], engine: str | None = "ray") -> dict[str, Any]:
    return {"engine": engine, "shards": shards, "retries": 3, "per_shard": per_shard}


def _shard(index: int, **changes: Any) -> dict[str, Any]:
    base = {"index": index, "where": "vm (/h)", "status": "ok", "score": 1.0, "platform": "linux-x86_64"}
    return {**base, "retries": 0, "closure": "the head's", **changes}


def test_diff_compares_engine_shards_platforms_retries_and_closures() -> None:
    from harness.runs.audit import cluster_differences

    eight = _view(8, [_shard(i) for i in range(8)])
    assert cluster_differences(eight, eight) == []
    other = "kinematics: interpreter x on the head, y-host on the node"
    six = _view(6, [_shard(i) for i in range(5)] + [_shard(5, closure=other, where="gpu-b (/h/b)", status="failed")])
    lines = cluster_differences(eight, six)
    assert lines[0] == "cluster shards: 8 → 6"
    assert "shard statuses: ok ×8 → failed ×1, ok ×5" in lines
    assert any(ln.startswith("shard 5/6 of run B on gpu-b (/h/b): not its head's closure: kinematics") for ln in lines)
    local = _view(1, [], engine=None)
    assert cluster_differences(local, eight)[:2] == ["cluster engine: (a local run) → ray", "cluster shards: 1 → 8"]
    retried = _view(8, [_shard(i, retries=1 if i == 2 else 0, score=0.5 if i == 2 else 1.0) for i in range(8)])
    assert cluster_differences(eight, retried) == ["shard 2/8 score: 1.0 → 0.5", "shard 2/8 retries: 0 → 1"]
    arm = _view(8, [_shard(i, platform="linux-aarch64" if i == 7 else "linux-x86_64") for i in range(8)])
    assert cluster_differences(eight, arm) == ["shard 7/8 platform: linux-x86_64 → linux-aarch64"]


def _cluster_record(root: Path, shards: int, node_closure: dict[str, Any] | None = None) -> Path:
    """A cluster run's record of ``shards`` shards with the head's closure; the last one's
    node computed with ``node_closure`` when given."""
    run = root / f"r{shards}"
    closure = {"store_paths": [{"path": "a" * 32 + "-env", "content": "blake3:1"}], "locks": {}, "project_files": {}}
    _write(run / "config.json", {"id": run.name, "cluster": {"engine": "ray", "shards": shards, "retries": 3}})
    _write(run / "lock.json", closure)
    summaries = []
    for index in range(shards):
        theirs = node_closure if node_closure is not None and index == shards - 1 else closure
        _write(run / "shards" / str(index) / "lock.json", theirs)
        status = "ok" if theirs is closure else "failed"
        summaries.append({"index": index, "status": status, "hostname": f"n{index}", "home": "/h", "attempts": [{}]})
    _write(run / "result.json", {"shards": summaries})
    return run


def test_diff_of_an_eight_and_a_six_shard_run_names_the_node_with_other_bits(tmp_path: Path) -> None:
    from harness.runs.audit import diff_runs

    eight = _cluster_record(tmp_path, 8)
    other = {"store_paths": [{"path": "b" * 32 + "-env", "content": "blake3:2"}], "locks": {}, "project_files": {}}
    six = _cluster_record(tmp_path, 6, other)
    lines = diff_runs(eight, six)
    assert "cluster shards: 8 → 6" in lines and "shard statuses: ok ×8 → failed ×1, ok ×5" in lines
    told = f"env: {'a' * 32}-env on the head, {'b' * 32}-env on the node"
    assert lines[2:] == [f"shard 5/6 of run B on n5 (/h): not its head's closure: {told}"], lines
    assert diff_runs(eight, eight) == []


def test_a_node_foresees_another_interpreter_or_lock_before_it_realizes() -> None:
    """Where a host copy stood in on the head, a node that has the lock's own interpreter or
    notes another copy is refused before realizing; one with neither is left to realize
    (its own copy may be the head's bits); another lock file is refused."""
    from harness.runs.closures import NodeInterpreter, foreseen_differences

    head = {"locks": {"kin": {"interpreter": "X-host", "standing_in_for": "O", "lock_blake3": "blake3:L"}}}
    assert foreseen_differences(head, {"O": NodeInterpreter(False, "X-host")}, {"kin": "blake3:L"}) == []
    assert foreseen_differences(head, {"O": NodeInterpreter(False, None)}, {}) == []
    (own,) = foreseen_differences(head, {"O": NodeInterpreter(True, None)}, {})
    assert own.told() == (
        "kin: interpreter: X-host (a host copy standing in for O) on the head, "
        "O (the lock's own, registered here, which realize prefers) here"
    )
    (other,) = foreseen_differences(head, {"O": NodeInterpreter(False, "Y-host")}, {})
    assert other.told() == "kin: interpreter (a host copy standing in for O): X-host on the head, Y-host here"
    (lock,) = foreseen_differences(head, {}, {"kin": "blake3:M"})
    assert lock.told() == "lock of kin: blake3:L on the head, blake3:M here"
    # The head on the lock's own interpreter: realize pulls it from the cache, nothing to foresee.
    own_head = {"locks": {"kin": {"interpreter": "O", "standing_in_for": None}}}
    assert foreseen_differences(own_head, {"O": NodeInterpreter(False, "Y-host")}, {}) == []


def test_judge_shard_refused_before_it_realized() -> None:
    from harness.runs.audit import judge_shard

    summary = {"hostname": "gpu-b", "home": "/h/b", "status": "failed", "closure_refused": True, "reason": "why"}
    item = judge_shard(0, 2, summary, None, [], {"store_paths": []})
    assert (item.status, item.detail) == ("modified", "refused before its first episode: why")


# ------------------------------------------------------------------------------ resume


def _head_config(shards: int, digest: str) -> dict[str, Any]:
    ask = {"command": [], "agent": "a", "sets": [], "services": [], "benchmark": "reach", "offline": False}
    cluster = {"engine": "slurm-local", "address": None, "shards": shards, "retries": 1, "closure_digest": digest}
    return {"id": "r1", "started": 1.0, "impurities": [], "cluster": {**cluster, "ask": ask}}


def test_each_shard_is_recorded_as_it_ends_and_the_run_from_what_is_on_disk(tmp_path: Path) -> None:
    """record_shard writes a shard's files and shard.json at once (a head killed after it
    leaves them); record_cluster_run combines what is on disk, a shard with none lost."""
    from harness.runs.cluster import record_cluster_run, record_shard

    run, closure = _record(tmp_path)
    for index in range(3):
        remove = run / "shards" / str(index)
        for path in sorted(remove.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    config = _head_config(3, closure_digest(closure))
    files = {"lock.json": json.dumps(closure), "benchmark.json": json.dumps({"episodes": 2, "successes": 2})}
    node = {"hostname": "gpu-a", "home": "/h/a", "platform": "linux-x86_64"}
    result = {"index": 0, "status": "ok", "node": node, "files": files, "output": ["realized"], "score": 1.0}
    summary = record_shard(run, config, result)
    assert summary["status"] == "ok" and summary["same_closure"] and summary["attempts"] == [node]
    assert json.loads((run / "shards" / "0" / "shard.json").read_text())["home"] == "/h/a"
    assert (run / "shards" / "0" / "logs" / "shard.log").read_text() == "realized\n"
    assert not (run / "result.json").exists(), "the run's result is written at the end only"
    assert not [p for p in (run / "shards" / "0").iterdir() if p.name.startswith(".")], "no temporary file left"
    # A node that says ok but recorded another closure is failed, named.
    other = json.loads(json.dumps(closure))
    other["store_paths"][0]["content"] = "blake3:9"
    bad = record_shard(run, config, {**result, "index": 1, "files": {"lock.json": json.dumps(other)}})
    assert bad["status"] == "failed" and "gpu-a (/h/a) computed with another closure" in bad["reason"]
    outcome = record_cluster_run(run, config, interrupted=False)
    assert [s["status"] for s in outcome["shards"]] == ["ok", "failed", "lost"] and outcome["exit_status"] == 1
    assert json.loads((run / "shards" / "2" / "shard.json").read_text())["status"] == "lost"


def test_resume_runs_again_exactly_the_shards_without_a_good_record(tmp_path: Path) -> None:
    """The shards to resume are those whose audit verdict is not ok: other bits, failed,
    cancelled, lost, or never recorded (pure, then on a record as the head left it)."""
    from harness.runs.resume import shards_to_resume

    verdicts = {0: "ok", 1: "modified", 2: "failed", 3: "cancelled", 4: "missing", 6: "ok"}
    assert shards_to_resume(8, verdicts) == [1, 2, 3, 4, 5, 7]
    assert shards_to_resume(2, {0: "ok", 1: "ok"}) == []
    run, closure = _record(tmp_path)
    verdicts = {i: item.status for i, item in enumerate(audit_shards(run, closure))}
    assert shards_to_resume(3, verdicts) == [1, 2]


def test_resume_reads_the_recorded_ask_and_refuses_records_without_one() -> None:
    from harness.runs.resume import recorded_ask

    ask, target, shards, retries = recorded_ask(_head_config(4, "d"), "r1")
    assert (ask.agent, ask.benchmark, ask.command, ask.offline) == ("a", "reach", (), False)
    assert (target.engine, shards, retries) == ("slurm-local", 4, 1)
    with pytest.raises(InputError, match=r"run r1: config.json has no \[cluster\]: only a cluster run"):
        recorded_ask({"id": "r1"}, "r1")
    old = _head_config(4, "d")
    del old["cluster"]["ask"]
    with pytest.raises(InputError, match="no cluster.ask: it was recorded before runs could be resumed"):
        recorded_ask(old, "r1")
    broken = _head_config(4, "d")
    del broken["cluster"]["ask"]["agent"]
    with pytest.raises(InputError, match="incomplete"):
        recorded_ask(broken, "r1")


def test_resume_refuses_a_closure_that_is_not_the_runs_naming_each_difference() -> None:
    from harness.runs.resume import closure_refusal

    run = {"store_paths": [{"path": "a" * 32 + "-kinematics-env", "content": "blake3:1"}], "locks": {}}
    assert closure_refusal(run, run) == []
    now = {"store_paths": [{"path": "b" * 32 + "-kinematics-env", "content": "blake3:2"}], "locks": {}}
    (told,) = closure_refusal(run, now)
    assert "kinematics-env" in told and "a" * 32 in told and "b" * 32 in told and "in the run" in told


def test_a_resumed_shards_earlier_record_is_moved_aside(tmp_path: Path) -> None:
    from harness.runs.resume import supersede

    run, _ = _record(tmp_path)
    first = supersede(run, 1)
    assert first == run / "superseded" / "1.1" and (first / "shard.json").is_file()
    assert not (run / "shards" / "1").exists() and supersede(run, 1) is None
    (run / "shards" / "1").mkdir()
    assert supersede(run, 1) == run / "superseded" / "1.2"


def test_slurm_endings_cancel_lose_and_fail_a_shard() -> None:
    """A task Slurm ended without a result: scancel is a cancel (not retried), a lost node is
    lost (retried), a timeout or out of memory a failure naming it (pure)."""
    from harness.runs.cluster import engine_ending

    status, reason, retry = engine_ending("CANCELLED by 1000", "srun: error: task 0: Exited with exit code 143")
    assert (status, retry) == ("cancelled", False) and "scancel" in reason and "CANCELLED by 1000" in reason
    assert engine_ending("NODE_FAIL", "x")[::2] == ("lost", True)
    assert engine_ending("PREEMPTED", "x")[::2] == ("lost", True)
    assert engine_ending("INTERRUPTED", "x")[::2] == ("cancelled", False)
    assert engine_ending("TIMEOUT", "x")[:1] == ("failed",) and "time limit" in engine_ending("TIMEOUT", "x")[1]
    assert "memory" in engine_ending("OUT_OF_MEMORY", "x")[1]
    assert engine_ending("FAILED", "ValueError: boom") == ("failed", "ValueError: boom (state FAILED)", False)
    assert engine_ending("", "gone")[1] == "gone (state UNKNOWN)"


def test_a_ray_task_whose_node_went_away_is_lost_not_failed() -> None:
    from harness.runs.cluster import ray_ending

    assert ray_ending("WorkerCrashedError") == ray_ending("NodeDiedError") == "lost"
    assert ray_ending("RayTaskError") == "failed"


def test_a_shard_whose_task_got_sigterm_is_cancelled_not_a_command_that_exited_143() -> None:
    from harness.runs.cluster import after_termination

    failed = {"index": 0, "status": "failed", "exit_status": 143, "reason": "the shard's command exited with 143"}
    assert after_termination(failed, []) == failed, "no SIGTERM came: the command's own failure"
    cancelled = after_termination(failed, [12.0])
    assert cancelled["status"] == "cancelled" and "SIGTERM (Slurm's scancel" in cancelled["reason"]
    assert "exited with 143" in cancelled["reason"] and failed["status"] == "failed"
    ok = {"index": 0, "status": "ok"}
    assert after_termination(ok, [12.0]) == ok, "a shard that ended ok stays ok"


def test_a_cancel_whose_task_slurm_ended_for_its_node_is_lost_and_retried() -> None:
    """A node set down or gone silent sends the task the SIGTERM of scancel: the state Slurm
    ends the task with (NODE_FAIL, TIMEOUT) decides, a CANCELLED stays a cancel (pure)."""
    from harness.runs.cluster import after_termination, lost_instead

    failed = {"index": 1, "status": "failed", "exit_status": 143, "reason": "the shard's command exited with 143"}
    cancelled = after_termination(failed, [12.0])
    assert lost_instead(cancelled, "CANCELLED by 0") == cancelled
    assert lost_instead(cancelled, "") == cancelled
    lost = lost_instead(cancelled, "NODE_FAIL")
    assert lost["status"] == "lost" and lost["retry"] is True, lost
    assert (
        lost["reason"].startswith("its node was lost (NODE_FAIL): its task got SIGTERM")
        and "--resume" not in lost["reason"]
    )
    timed_out = lost_instead(cancelled, "TIMEOUT")
    assert timed_out["status"] == "failed" and "time limit" in timed_out["reason"] and not timed_out["retry"]
    ok = {"index": 0, "status": "ok"}
    assert lost_instead(ok, "NODE_FAIL") == ok


def test_cli_resume_refuses_other_options_and_a_run_that_is_no_cluster_run(harness_cli: Any, tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = harness_cli("run", "--resume", "r1", "--agent", "kinematics-only", "--shards", "2")
    assert (
        result.code == 2
        and "--resume runs the shards as the run recorded them: give no --agent, --shards" in result.err
    )
    local = home / "runs" / "20260101-000000-abcd"
    _write(local / "config.json", {"id": local.name})
    result = harness_cli("--home", str(home), "run", "--resume", local.name)
    assert result.code == 2 and "has no [cluster]: only a cluster run" in result.err, result.err
    assert "Traceback" not in result.err


def test_a_later_shard_records_the_gpus_its_engine_gave_it_that_stay_idle() -> None:
    """Two shards of a run on one 4-GPU node: Ray gave the first GPUs 0 and 1, the second 2
    and 3. The first placed the run's service on its GPU 1 (physical 1) and started the
    node's broker; the second uses that service, so its own GPUs stay idle, and its record
    says which it was given and which the broker used."""
    from harness.runs.nodebroker import gpu_use
    from harness.runtime.broker import launch_identity
    from harness.runtime.inventory import restrict, visible_devices
    from harness.runtime.launch import LaunchSpec, clean_environment
    from harness.runtime.plan import Gpu

    physical = tuple(Gpu(i, f"gpu{i}", 80.0, 80.0) for i in range(4))
    first = {"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/usr/bin"}
    second = {"CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/usr/bin"}
    assert [g.name for g in restrict(physical, visible_devices(first) or [], {})] == ["gpu0", "gpu1"]
    spec = LaunchSpec(
        name="vla",
        argv=("/store/env/bin/python", "-m", "serve"),
        env=clean_environment(first, 1),  # the first shard's plan: its GPU 1
        cwd=Path("/store/code"),
        port=8100,
        url="http://127.0.0.1:8100",
        health_url=None,
        load_seconds=1.0,
        log_path=Path("/tmp/vla.log"),
    )
    cpu_only = LaunchSpec(**{**spec.__dict__, "name": "kinematics", "env": clean_environment(first, None)})
    launches = {s.name: launch_identity(s) for s in (spec, cpu_only)}
    assert gpu_use(visible_devices(first), launches) == {"given": ["0", "1"], "used": ["1"], "idle": ["0"]}
    assert gpu_use(visible_devices(second), launches) == {"given": ["2", "3"], "used": ["1"], "idle": ["2", "3"]}
    assert gpu_use(None, {"kinematics": launches["kinematics"]}) == {"given": [], "used": [], "idle": []}


def test_a_nodes_ports_are_chosen_once_and_kept_private(tmp_path: Path) -> None:
    """The first shard on a node chooses the services' ports; every later one reads the same
    ones (a service it adds gets a new port, the others keep theirs); the file is the
    owner's only, as the rest of the node's state folder."""
    from harness.runs.nodebroker import PORTS_FILE, node_ports, node_state_dir

    state = node_state_dir(tmp_path / "home", "run-1")
    first = node_ports(state, ("kinematics", "sam3"))
    assert sorted(first) == ["kinematics", "sam3"] and first["kinematics"] != first["sam3"]
    assert node_ports(state, ("sam3", "kinematics")) == first
    more = node_ports(state, ("kinematics", "molmo"))
    assert more["kinematics"] == first["kinematics"] and more["molmo"] not in first.values()
    assert (state / PORTS_FILE).stat().st_mode & 0o777 == 0o600
    assert json.loads((state / PORTS_FILE).read_text()) == {**first, **more}


def test_resume_chooses_again_a_recorded_port_another_process_holds_now(tmp_path: Path) -> None:
    """``--resume`` of a run finds its node's ``ports.json`` from the earlier run: a port that
    another process holds by now (a socket the test listens on) is chosen again and the file
    rewritten; one that is free, or held by the run's own live broker on the node, is kept."""
    import socket

    from harness.runs.nodebroker import PORTS_FILE, node_ports, node_state_dir
    from harness.runtime.broker import Broker
    from harness.runtime.plan import Plan

    state = node_state_dir(tmp_path / "home", "run-1")
    first = node_ports(state, ("kinematics", "sam3", "molmo"))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", first["kinematics"]))
        squatter.listen()
        again = node_ports(state, ("kinematics", "sam3", "molmo"))
        assert again["kinematics"] != first["kinematics"], "a port another process holds is not reused"
        assert again["kinematics"] not in (first["sam3"], first["molmo"])
        assert {n: again[n] for n in ("sam3", "molmo")} == {n: first[n] for n in ("sam3", "molmo")}
        assert json.loads((state / PORTS_FILE).read_text()) == again
    # The run's own broker on the node holds one of its ports: that one is the run's, kept.
    broker = Broker(Plan(services=()), {}, state, port=again["sam3"])
    try:
        broker.serve_in_thread()
        assert node_ports(state, ("kinematics", "sam3", "molmo")) == again
    finally:
        broker.shutdown()


def _squat(port: int) -> int:
    """Another process, not a child of this one (the broker the test serves in its own
    process counts its children as the run's), listening on ``port``: its pid, which the
    caller ends."""
    import subprocess

    code = (
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
        "print('listening', flush=True); time.sleep(120)\n"
    )
    shell = subprocess.Popen(
        ["sh", "-c", '"$0" -c "$1" "$2" & echo "pid $!"', sys.executable, code, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert shell.stdout is not None
    lines = [shell.stdout.readline().strip(), shell.stdout.readline().strip()]
    shell.wait()
    assert "listening" in lines, lines
    return int(next(ln for ln in lines if ln.startswith("pid "))[4:])


def test_a_later_shard_trusts_its_live_brokers_ports_without_listing_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every shard after a node's first finds ``ports.json``'s ports held: by the run's live
    broker (its ``broker.json`` pid with its start time) and the services it serves. Those
    are kept without listing the node's TCP connections (a scan of every process's files);
    a held port the broker does not serve is looked up, and another process's chosen again;
    a ``broker.json`` whose process is gone vouches for nothing."""
    import subprocess

    import psutil

    from harness.runs.nodebroker import BROKER_PORT, node_ports, node_state_dir
    from harness.runtime.broker import STATE_FILE, Broker
    from harness.runtime.launch import LaunchSpec
    from harness.runtime.parking import process_identity
    from harness.runtime.plan import Plan, ServicePlacement

    state = node_state_dir(tmp_path / "home", "run-1")
    names = (BROKER_PORT, "kinematics", "sam3")
    first = node_ports(state, names)
    listed: list[int] = []
    real = psutil.net_connections

    def counted(*args: Any, **kwargs: Any) -> Any:
        listed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(psutil, "net_connections", counted)
    url = f"http://127.0.0.1:{first['sam3']}"
    sam3 = ServicePlacement("sam3", "on_demand", None, first["sam3"], url)
    spec = LaunchSpec(
        "sam3", (sys.executable, "-c", "pass"), {}, tmp_path, first["sam3"], url, None, 1.0, tmp_path / "s.log"
    )
    broker = Broker(Plan(services=(sam3,)), {"sam3": spec}, state, port=first[BROKER_PORT])
    squatters = []
    try:
        broker.serve_in_thread()
        squatters.append(_squat(first["sam3"]))  # stands for the broker's service on its port
        assert node_ports(state, (BROKER_PORT, "sam3")) == {n: first[n] for n in (BROKER_PORT, "sam3")}
        assert listed == [], "the live broker's own ports are trusted: no connections listed"
        squatters.append(_squat(first["kinematics"]))  # not the broker's: another process's
        again = node_ports(state, names)
        assert listed, "a held port the broker does not serve is looked up"
        assert again["kinematics"] != first["kinematics"]
        assert {n: again[n] for n in (BROKER_PORT, "sam3")} == {n: first[n] for n in (BROKER_PORT, "sam3")}
    finally:
        broker.shutdown()
    # A broker.json left by a broker that is gone (its pid with another start time, or none).
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process_identity(dead.pid)
    dead.wait()
    (state / STATE_FILE).write_text(
        json.dumps({**identity, "url": f"http://127.0.0.1:{first[BROKER_PORT]}", "services": ["sam3"]})
    )
    try:
        after = node_ports(state, names)
        assert after["sam3"] != first["sam3"], "a gone broker's claim on a port another process holds is not trusted"
        assert after["kinematics"] == again["kinematics"]
    finally:
        import os
        import signal

        for pid in squatters:
            os.kill(pid, signal.SIGKILL)


def test_a_shards_resets_lost_with_its_nodes_broker_are_named_by_the_runs_audit(tmp_path: Path) -> None:
    """A shard joined across a restart of its node's broker records the resets that went with
    the old broker as an impurity of its own (``result.json``, :func:`lost_resets`); the head
    combines it into the run's result, and the audit names it (``--strict`` fails on it)."""
    from harness.runs.cluster import record_cluster_run, record_shard
    from harness.runs.nodebroker import lost_resets

    restart = {
        "at": 1764921600.0,
        "gone_pid": 4242,
        "reason": "the node's broker (pid 4242), started by shard 0, was cancelled with it; "
        "shard 1 started a new one (pid 4300) on the same ports",
    }
    [line] = lost_resets([restart], ["simate"])
    assert line.startswith(
        "scoped resets of simate unknown until 2025-12-05 08:00:00 UTC: the node's broker (pid 4242)"
    )
    run, closure = _record(tmp_path)
    config = _head_config(1, closure_digest(closure))
    for index in range(3):
        for path in sorted((run / "shards" / str(index)).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    files = {"lock.json": json.dumps(closure), "result.json": json.dumps({"impurities": [line]})}
    node = {"hostname": "gpu-a", "home": "/h/a", "platform": "linux-x86_64"}
    record_shard(run, config, {"index": 0, "status": "ok", "node": node, "files": files, "broker_restarts": [restart]})
    outcome = record_cluster_run(run, config, interrupted=False)
    assert outcome["impurities"] == [line] and outcome["shards"][0]["broker_restarts"] == [restart]
    report = audit_run(run, tmp_path / "store", None)
    assert list(report.impurities) == [line], "harness audit prints it: impure    <line>"


def test_a_nodes_broker_lingers_as_its_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HARNESS_NODE_LINGER`` on a node sets how long its broker waits for the run's next
    shard; unset or empty is the default, and a value that is not seconds above zero is an
    error naming the variable (the shard fails with it) rather than a broker that never ends."""
    from harness.errors import InputError
    from harness.runs.nodebroker import LINGER_S, linger_seconds

    monkeypatch.delenv("HARNESS_NODE_LINGER", raising=False)
    assert linger_seconds() == LINGER_S
    monkeypatch.setenv("HARNESS_NODE_LINGER", " ")
    assert linger_seconds() == LINGER_S
    monkeypatch.setenv("HARNESS_NODE_LINGER", "2.5")
    assert linger_seconds() == 2.5
    for bad in ("0", "-1", "nan", "inf", "ten"):
        monkeypatch.setenv("HARNESS_NODE_LINGER", bad)
        with pytest.raises(InputError, match="HARNESS_NODE_LINGER"):
            linger_seconds()
