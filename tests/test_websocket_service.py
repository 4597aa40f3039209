"""WebSocket services: ws:// URLs and readiness by handshake and ping (issue 14, item 7).

End to end: a local XPolicyLab-shaped git repository (file://) whose setup_policy_server.py
serves a tiny policy over WebSocket, launched from the store by a manifest shaped like
services/smolvla.toml, and a client that gets actions through the broker.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.lock.lockfile import read
from harness.realize.standin import realized_lock
from harness.manifests.loading import load_model
from harness.manifests.model import ServiceManifest
from harness.runtime.launch import LaunchSpec, launch_spec
from harness.runtime.plan import ServicePlacement
from harness.runtime.supervisor import probe, websocket_ready
from harness.store.store import Store
from tests.conftest import REPO, run_harness_process
from tests.localindex import write_source_tree
from tests.upstreams import Upstreams, git, make_project


def _spec(port: int, protocol: str = "websocket") -> LaunchSpec:
    return LaunchSpec(
        name="ws",
        argv=("true",),
        env={},
        cwd=Path("."),
        port=port,
        url=f"ws://127.0.0.1:{port}",
        health_url=None,
        load_seconds=5,
        log_path=Path(os.devnull),
        protocol=protocol,
    )


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port that accepts TCP connections and never speaks (a server still loading)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for conn in held:
        conn.close()


def test_a_port_that_accepts_but_speaks_no_websocket_is_not_ready(silent_listener: int) -> None:
    assert probe(_spec(silent_listener, "http")), "a port probe would call it ready"
    assert not websocket_ready(_spec(silent_listener), timeout=0.5)
    assert not probe(_spec(silent_listener, "xpolicylab"), timeout=0.5)


def test_a_websocket_server_answering_pings_is_ready() -> None:
    from websockets.sync.server import serve

    def handler(ws: Any) -> None:
        for _ in ws:  # a server's loop: pings are answered by the library while it runs
            pass

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.socket.getsockname()[1]
        assert probe(_spec(port)) and probe(_spec(port, "xpolicylab"))
        server.shutdown()


def test_websocket_protocols_get_ws_urls(tmp_path: Path) -> None:
    manifest = load_model(ServiceManifest, REPO / "services" / "openwam.toml")
    assert manifest.protocol == "websocket"
    where = ServicePlacement("openwam", "on_demand", 0, 8848, None)
    spec = launch_spec(
        "openwam", manifest, where, python=Path("/p"), weights=Path("/w"), cwd=tmp_path, state_dir=tmp_path, base_env={}
    )
    assert spec.url == "ws://127.0.0.1:8848" and spec.protocol == "websocket"
    assert LaunchSpec.from_json(spec.as_json()) == spec


# ------------------------------------------------------------------------- end to end

MODEL = """import json
from pathlib import Path


def load(config):
    hidden = json.loads((Path(config["checkpoint_path"]) / "config.json").read_text())["hidden_size"]

    def act(observation):
        return {"action": [x * hidden * config["scale"] for x in observation["state"]],
                "policy": config["policy_name"], "bench": config["bench_name"]}
    return act
"""

MANIFEST = """kind = "policy"
summary = "a tiny policy through XPolicyLab's policy server"
protocol = "xpolicylab"
port = %d
load_seconds = 60

[xpolicylab]
policy = "policy/Tiny"
checkpoint = "{weights}/tiny"
overrides = { bench_name = "TinyBench", scale = 3 }
source = 0

[environment]
python = "3.11"
requirements = ["alpha==1.0"]
sources = [
  { repo = "%s", rev = "v1", install = "editable" },
]

[[weights]]
dir = "tiny"
huggingface_model = "org/model"
include = ["*.json"]
"""

CLIENT = r"""
import json, sys
from harness.client import Client
from websockets.sync.client import connect

client = Client(client_id="eval")
with client.use("tinyvla") as lease:
    with connect(lease.url, proxy=None, open_timeout=30) as ws:
        ws.send(json.dumps({"state": [1, 2]}))
        answer = json.loads(ws.recv(timeout=30))
print(json.dumps({"url": lease.url, "answer": answer}), flush=True)
"""


def _xpolicylab_repo(root: Path) -> str:
    """An XPolicyLab-shaped repository: an installable project with setup_policy_server.py
    at its root and policy/<Name>/{deploy.yml,model.py}."""
    write_source_tree(root, "xpolicylab", "0.1")
    shutil.copy(Path(__file__).parent / "services" / "xpolicylab_server.py", root / "setup_policy_server.py")
    (root / "policy" / "Tiny").mkdir(parents=True)
    (root / "policy" / "Tiny" / "deploy.yml").write_text("policy_name: Other\nscale: 1\n")
    (root / "policy" / "Tiny" / "model.py").write_text(MODEL)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "XPolicyLab stand-in")
    git(root, "tag", "v1")
    return root.as_uri()


def test_an_xpolicylab_policy_serves_actions_over_websocket_through_the_broker(up: Upstreams, tmp_path: Path) -> None:
    with socket.socket() as probe_socket:  # a port free right now
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    repo = _xpolicylab_repo(tmp_path / "XPolicyLab")
    project = make_project(tmp_path / "project", {"tinyvla": MANIFEST % (port, repo)}, {"client.py": CLIENT.encode()})
    home = tmp_path / "home"
    env = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    common = ("--project", str(project), "--home", str(home))
    locked = run_harness_process(*common, "lock", env=env, timeout=300)
    assert locked.returncode == 0, locked.stderr
    result = run_harness_process(
        *common, "run", "--service", "tinyvla", "--", sys.executable, "client.py", env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["url"] == f"ws://127.0.0.1:{port}"
    # hidden_size 8 from the realized weights, scale 3 and the names from the overrides.
    assert answer["answer"] == {"action": [24, 48], "policy": "Tiny", "bench": "TinyBench"}
    # It ran from the store: the realized XPolicyLab source, checked at launch.
    lock = realized_lock(Store.in_home(home), read(project / "locks" / "tinyvla.lock.toml"))
    source = lock.sources[0].store
    [run_dir] = (home / "runs").iterdir()
    pidlog = (run_dir / "services" / "logs" / "tinyvla.log").read_text()
    assert f"{home / 'store' / source}/setup_policy_server.py" in pidlog
    checks = [json.loads(line) for line in (run_dir / "services" / "launch-checks.jsonl").read_text().splitlines()]
    assert all(source in c["paths"] and lock.environment.store in c["paths"] for c in checks)
    assert (
        subprocess.run(
            ["git", "-C", str(tmp_path / "XPolicyLab"), "status", "--porcelain"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        == ""
    ), "the checkout itself was not used"
