"""``doctor`` counts only what a run would really install; ``--gpus`` on doctor and status."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import REPO


def test_doctor_counts_only_what_the_plan_launches(harness_cli, tmp_path: Path) -> None:
    base = ("--project", str(REPO), "--home", str(tmp_path / "home"))
    roomy = json.loads(harness_cli(*base, "doctor", "--agent", "default", "--gpus", "1x24", "--json").out)
    assert roomy["gpus_from"] == "--gpus 1x24" and [g["total_gb"] for g in roomy["gpus"]] == [24]
    assert {"sam3", "simate", "kinematics", "robodojo"} <= set(roomy["run_would_install"])
    assert "openwam" not in roomy["run_would_install"], "its skill has no service in the agent config"
    # No GPU: the models are off for lack of room, so their skills drop and nothing installs them.
    bare = json.loads(harness_cli(*base, "doctor", "--agent", "default", "--gpus", "none", "--json").out)
    assert set(bare["run_would_install"]) == {"kinematics", "robodojo"}
    assert bare["run_skips"]["sam3"].startswith("off: no GPU with 7.2 GB free")
    # An external service is never installed either.
    deploy = tmp_path / "external.toml"
    deploy.write_text('[services.sam3]\nmode = "external"\nurl = "http://10.0.0.5:8000"\n')
    external = json.loads(
        harness_cli(*base, "--deploy", str(deploy), "doctor", "--agent", "default", "--gpus", "1x24", "--json").out
    )
    assert "sam3" not in external["run_would_install"] and external["run_skips"]["sam3"].startswith("external")
    text = harness_cli(*base, "doctor", "--agent", "default", "--gpus", "none")
    assert "GPUs (--gpus none)" in text.out and "not installed: simate (off: no GPU" in text.out
    bad = harness_cli(*base, "doctor", "--gpus", "4x")
    assert bad.code == 2 and "--gpus" in bad.err


def test_status_rehearses_a_deploy_on_other_gpus(harness_cli, tmp_path: Path) -> None:
    base = ("--project", str(REPO), "--home", str(tmp_path / "home"))
    result = harness_cli(*base, "status", "--gpus", "2x24", "--json")
    assert result.code == 0, result.err
    planned = json.loads(result.out)["planned"]
    assert planned["gpus_spec"] == "2x24" and len(planned["gpus"]) == 2 and len(planned["services"]) >= 5
    assert {p["mode"] for p in planned["services"]} <= {"resident", "on_demand", "off"}
    text = harness_cli(*base, "status", "--gpus", "none")
    assert "with --gpus none, the deploy would run" in text.out and "sam3" in text.out
