"""Only what shapes a lock makes it stale: runtime-only keys do not (issue 14, item 10)."""

from __future__ import annotations

import shutil
from pathlib import Path

from harness.lock.digest import accepted_digests, manifest_digest
from harness.manifests.loading import load_model
from harness.manifests.model import ServiceManifest
from tests.conftest import REPO

BASE = {
    "kind": "policy",
    "summary": "s",
    "command": ["{python}", "serve.py"],
    "port": 9000,
    "environment": {"python": "3.11", "requirements": ["alpha==1.0"]},
}


def test_runtime_only_keys_leave_the_digest_alone() -> None:
    base = ServiceManifest.model_validate(BASE)
    runtime = ServiceManifest.model_validate(
        {
            **BASE,
            "summary": "other",
            "command": ["{python}", "other.py", "{port}"],
            "port": 9100,
            "vram_gb": 12,
            "load_seconds": 300,
            "health": "/health",
            "client": {"url": "{url}"},
            "scoped": True,
            "kind": "planner",
            "protocol": "websocket",
        }
    )
    assert manifest_digest(runtime) == manifest_digest(base)
    shaped = ServiceManifest.model_validate({**BASE, "environment": {"python": "3.11", "requirements": ["alpha==2.0"]}})
    assert manifest_digest(shaped) != manifest_digest(base)
    weights = ServiceManifest.model_validate({**BASE, "weights": [{"dir": "w", "huggingface_model": "org/m"}]})
    assert manifest_digest(weights) != manifest_digest(base)
    assert manifest_digest(base) in accepted_digests(base) and len(accepted_digests(base)) == 2


def test_changing_load_seconds_keeps_the_committed_lock_fresh(harness_cli, tmp_path: Path) -> None:
    project = tmp_path / "p"
    (project / "locks").mkdir(parents=True)
    shutil.copytree(REPO / "services", project / "services")
    shutil.copy(REPO / "harness.toml", project / "harness.toml")
    shutil.copy(REPO / "locks" / "kinematics.lock.toml", project / "locks")
    manifest = project / "services" / "kinematics.toml"
    text = manifest.read_text()
    assert "load_seconds" in text
    manifest.write_text(text.replace("load_seconds = ", "scoped = true\nload_seconds = 1"))
    assert load_model(ServiceManifest, manifest).scoped
    assert harness_cli("--project", str(project), "lock", "--check", "kinematics").code == 0
    manifest.write_text(text.replace('python = "3.11"', 'python = "3.12"'))
    stale = harness_cli("--project", str(project), "lock", "--check", "kinematics")
    assert stale.code == 1 and "manifest changed" in stale.out
