"""Episodes of the reach benchmark: sample targets, ask the kinematics service, score.

Runs in the benchmark's own realized environment (standard library only). It finds the
broker through ``HARNESS_BROKER`` and its token through ``HARNESS_BROKER_TOKEN`` (both set by
``harness run``), acquires a lease on the
``kinematics`` service before each call as every skill does, and writes its result to
``$HARNESS_RUN_DIR/benchmark.json`` so the run record carries the score.

Targets are reachable by construction: forward kinematics of random joints within the
limits the service reports (seeded, so every run samples the same targets).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import urllib.request
from pathlib import Path
from typing import Any

SUCCESS_M = 0.01


def post(url: str, body: dict[str, Any], timeout: float = 60, token: str | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if token:  # the broker answers only its owner: the token `harness run` hands down
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get(url: str, timeout: float = 30) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


class Lease:
    """``with Lease(broker, "kinematics") as url:`` — acquire before a call, release after."""

    def __init__(self, broker: str, service: str) -> None:
        self.broker, self.service, self.lease = broker.rstrip("/"), service, None
        self.token = os.environ.get("HARNESS_BROKER_TOKEN")

    def __enter__(self) -> str:
        answer = post(f"{self.broker}/acquire", {"service": self.service, "client": "reach"}, token=self.token)
        self.lease = answer["lease"]
        return str(answer["url"]).rstrip("/")

    def __exit__(self, *exc: object) -> None:
        post(f"{self.broker}/release", {"lease": self.lease}, token=self.token)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    broker = os.environ.get("HARNESS_BROKER")
    if not broker:
        print("reach: HARNESS_BROKER is not set; run me with `harness run --benchmark reach`", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    with Lease(broker, "kinematics") as url:
        info = get(f"{url}/info")
    limits = [(joint["lower"], joint["upper"]) for joint in info["joints"]]
    successes = 0
    episodes = []
    for episode in range(args.episodes):
        joints = [rng.uniform(lo, hi) for lo, hi in limits]
        with Lease(broker, "kinematics") as url:
            target = post(f"{url}/fk", {"joints": joints})["position"]
            answer = post(f"{url}/ik", {"position": target})
            reached = post(f"{url}/fk", {"joints": answer["joints"]})["position"]
        error = math.dist(target, reached)
        ok = bool(answer["success"]) and error <= SUCCESS_M
        successes += ok
        episodes.append({"episode": episode, "target": [round(v, 6) for v in target],
                         "error_m": error, "success": ok})
        print(f"episode {episode:2d}: target {[round(v, 3) for v in target]} error {error:.2e} m "
              f"{'success' if ok else 'miss'}", flush=True)
    rate = successes / args.episodes if args.episodes else 0.0
    result = {"benchmark": "reach", "episodes": args.episodes, "seed": args.seed,
              "successes": successes, "success_rate": rate, "episode_results": episodes}
    run_dir = os.environ.get("HARNESS_RUN_DIR")
    if run_dir:
        Path(run_dir, "benchmark.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"reach: success rate {rate:.2f} ({successes}/{args.episodes})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
