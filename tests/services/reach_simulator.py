#!/usr/bin/env python3
"""A stand-in on loopback for a remote simulator serving the reach task (the API that
``benchmarks/reach-remote.toml`` documents), started by the tests as its own process.

Targets are reachable by construction: forward kinematics (the kinematics service's own
math, ``services/servers/serve_kinematics.py``, imported with this Python's numpy) of
seeded random joints within the arm's limits. ``/step`` judges joints by the distance of
the tool from the episode's target: success within 1 cm.

    python reach_simulator.py --port P [--version V] [--task T] [--seed S]

prints ``reach-sim: serving on http://127.0.0.1:P`` once it listens, and serves until
SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SUCCESS_M = 0.01


def _kinematics() -> Any:
    spec = importlib.util.spec_from_file_location("serve_kinematics", REPO / "services/servers/serve_kinematics.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["serve_kinematics"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--version", default="1.0.0")
    parser.add_argument("--task", default="reach-arm7")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    kinematics = _kinematics()
    robot = kinematics.load_robot(REPO / "services/assets/arm7/arm7.json")
    info = kinematics.robot_info(robot)
    limits = [(joint["lower"], joint["upper"]) for joint in info["joints"]]
    targets: dict[int, list[float]] = {}

    def target(episode: int) -> list[float]:
        if episode not in targets:
            rng = random.Random(args.seed * 100_003 + episode)
            joints = [rng.uniform(lo, hi) for lo, hi in limits]
            targets[episode] = [float(v) for v in kinematics.forward(robot, joints)[:3, 3]]
        return targets[episode]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/info":
                self._answer(200, {"simulator": "reach-sim", "version": args.version, "task": args.task})
            else:
                self._answer(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            episode = int(body.get("episode", 0))
            if self.path == "/reset":
                self._answer(200, {"episode": episode, "target": target(episode)})
            elif self.path == "/step":
                reached = [float(v) for v in kinematics.forward(robot, body["joints"])[:3, 3]]
                error = math.dist(reached, target(episode))
                self._answer(200, {"episode": episode, "error_m": error, "success": error <= SUCCESS_M})
            else:
                self._answer(404, {"error": f"no route {self.path}"})

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"reach-sim: serving on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
