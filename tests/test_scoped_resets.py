"""A scoped service's reset during a run is recorded, and shown by audit and diff."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from harness.client import Client
from harness.runs.audit import audit_run, diff_runs
from harness.runs.resets import RESETS_FILE, RecordingBroker, ResetLog, read_resets
from harness.runtime.broker import Broker, down
from harness.runtime.plan import Plan
from tests.test_broker import fake, placement


def test_a_scoped_service_swapped_out_and_back_is_recorded_as_reset(tmp_path: Path) -> None:
    policy = fake(f"{tmp_path.name}-policy", tmp_path)
    seg = fake(f"{tmp_path.name}-seg", tmp_path)
    log = tmp_path / "run" / RESETS_FILE
    broker = RecordingBroker(
        Plan((placement(policy, swap="g", scoped=True), placement(seg, swap="g"))),
        {policy.name: policy, seg.name: seg},
        tmp_path,
        tick=0.05,
        grace=(2.0, 2.0),
        resets=ResetLog(log),
    )
    try:
        agent = Client(broker.serve_in_thread(), client_id="agent", token=broker.token)
        other = Client(agent.address, client_id="other", token=broker.token)
        leases = []
        for client, name in (
            (agent, policy.name),
            (agent, policy.name),
            (agent, seg.name),
            (other, policy.name),
            (agent, policy.name),
        ):
            with client.use(name) as lease:
                leases.append(lease)
        assert [lease.fresh for lease in leases] == [True, False, True, True, True]
    finally:
        broker.shutdown()
        down(tmp_path, grace=(0.5, 0.5))
    # The seg swap reset the policy: "other" never had memory there, "agent" lost its own.
    [reset] = read_resets(log)
    assert reset["service"] == policy.name and reset["client"] == "agent"
    assert reset["lease"] == leases[4].id and (reset["previous_incarnation"], reset["incarnation"]) == (1, 2)


def _record(run: Path, resets: list[dict[str, object]]) -> Path:
    run.mkdir()
    (run / "lock.json").write_text(json.dumps({"store_paths": [], "locks": {}, "project_files": {}}))
    (run / "config.json").write_text(json.dumps({"plan": {"services": []}, "impurities": []}))
    (run / "result.json").write_text(json.dumps({"impurities": [], "scoped_resets": resets}))
    return run


def test_audit_shows_resets_and_diff_compares_them(tmp_path: Path) -> None:
    reset = {
        "service": "simate",
        "at": 1_700_000_000.0,
        "client": "agent",
        "lease": "ab12",
        "incarnation": 2,
        "previous_incarnation": 1,
    }
    quiet = _record(tmp_path / "a", [])
    swapped = _record(tmp_path / "b", [reset, {**reset, "lease": "cd34", "incarnation": 3}])
    report = audit_run(swapped, tmp_path / "store", None)
    assert not report.failed and [r["lease"] for r in report.scoped_resets] == ["ab12", "cd34"]
    assert diff_runs(quiet, swapped) == ["scoped resets of simate: 0 → 2"]
    assert diff_runs(swapped, swapped) == []


def _post(url: str, path: str, token: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_joined_runs_token_is_watched_for_resets_and_may_only_lease(tmp_path: Path) -> None:
    """A run that joins a broker it does not own gets a token of its own: its leases are
    watched for resets by the rule a run's own broker uses; it cannot start or stop anything."""
    policy = fake(f"{tmp_path.name}-jpolicy", tmp_path)
    seg = fake(f"{tmp_path.name}-jseg", tmp_path)
    broker = Broker(
        Plan((placement(policy, swap="g", scoped=True), placement(seg, swap="g"))),
        {policy.name: policy, seg.name: seg},
        tmp_path,
        tick=0.05,
        grace=(2.0, 2.0),
    )
    try:
        url = broker.serve_in_thread()
        status, answer = _post(url, "/runs", broker.token, {"run": "r1", "pid": os.getpid()})
        assert status == 200
        token = str(answer["token"])
        for name in (policy.name, seg.name, policy.name):
            status, lease = _post(url, "/acquire", token, {"service": name, "client": "agent"})
            assert status == 200, lease
            assert _post(url, "/release", token, {"lease": lease["lease"]})[0] == 200
        # Another client of the same id, with the owner's token: not the run's.
        status, lease = _post(url, "/acquire", broker.token, {"service": seg.name, "client": "agent"})
        _post(url, "/release", broker.token, {"lease": lease["lease"]})
        assert broker.status()["broker"]["runs"] == [{"run": "r1", "pid": os.getpid(), "scoped_resets": 1}]
        # The broker's events name the run that holds each lease, and the reset
        events = broker.events_since(0)
        holders = [(e["event"], e["service"], e["run"]) for e in events if e["event"] in ("lease", "release")]
        assert holders == [
            *[(kind, name, "r1") for name in (policy.name, seg.name, policy.name) for kind in ("lease", "release")],
            ("lease", seg.name, None),
            ("release", seg.name, None),
        ]
        [reset_event] = [e for e in events if e["event"] == "scoped_reset"]
        assert (reset_event["service"], reset_event["client"], reset_event["incarnation"]) == (policy.name, "agent", 2)
        for path in ("/start", "/shutdown", "/runs"):
            status, refusal = _post(url, path, token, {"names": [], "run": "r2"})
            assert status == 403 and "only acquire and release" in str(refusal["error"])
        status, ended = _post(url, "/runs/end", broker.token, {"run": "r1"})
        assert status == 200
        [reset] = ended["scoped_resets"]  # type: ignore[misc]
        assert (reset["service"], reset["previous_incarnation"], reset["incarnation"]) == (policy.name, 1, 2)
        # With them, the broker's events since the run joined: its report's timeline.
        seqs = [e["seq"] for e in ended["events"]]  # type: ignore[union-attr]
        assert seqs == [e["seq"] for e in broker.events_since(0) if e["event"] != "added"]
        assert [e["run"] for e in ended["events"] if e["event"] == "lease"][:3] == ["r1"] * 3  # type: ignore[union-attr]
        assert _post(url, "/acquire", token, {"service": seg.name})[0] == 401, "its token ended with the run"
        assert _post(url, "/runs/end", broker.token, {"run": "r1"})[0] == 404
    finally:
        broker.shutdown()
        down(tmp_path, grace=(0.5, 0.5))
