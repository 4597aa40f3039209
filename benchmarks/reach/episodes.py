"""Episodes of the reach benchmark: sample targets, ask the kinematics service, score.

Runs in the benchmark's own realized environment (standard library only). It finds the
broker through ``HARNESS_BROKER`` (set by ``harness run``), acquires a lease on the
``kinematics`` service before each call as every skill does, and writes its result to
``$HARNESS_RUN_DIR/benchmark.json`` so the run record carries the score.

Targets are reachable by construction: forward kinematics of random joints within the
limits the service reports (seeded, so every run samples the same targets).

Sharding (``--shard I/N``, default ``$HARNESS_SHARD``, else ``0/1``): every shard samples the
whole seeded sequence of targets and runs the episodes whose index is I modulo N, so the N
shards of a cluster run together run exactly the episodes, with exactly the targets, of one
unsharded run. ``benchmark.json`` names the shard, so a runner can check it was honoured.
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


def post(url: str, body: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    token = os.environ.get("HARNESS_BROKER_TOKEN")
    if token:  # the broker answers only its owner (harness run passes the token)
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

    def __enter__(self) -> str:
        answer = post(f"{self.broker}/acquire", {"service": self.service, "client": "reach"})
        self.lease = answer["lease"]
        return str(answer["url"]).rstrip("/")

    def __exit__(self, *exc: object) -> None:
        post(f"{self.broker}/release", {"lease": self.lease})


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` with 0 <= I < N, for argparse (a bad value is a usage error naming it)."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: expected I/N, e.g. 0/4") from None
    if count < 1 or not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: need 0 <= I < N")
    return index, count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard", type=parse_shard, default=os.environ.get("HARNESS_SHARD") or "0/1",
                        metavar="I/N", help="run the episodes whose index is I modulo N")
    args = parser.parse_args()
    index, count = args.shard
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
        # Every shard draws every target, so episode k has the same target in any sharding.
        joints = [rng.uniform(lo, hi) for lo, hi in limits]
        if episode % count != index:
            continue
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
    rate = successes / len(episodes) if episodes else 0.0
    result = {"benchmark": "reach", "episodes": len(episodes), "seed": args.seed,
              "shard": f"{index}/{count}", "episodes_total": args.episodes,
              "successes": successes, "success_rate": rate, "episode_results": episodes}
    run_dir = os.environ.get("HARNESS_RUN_DIR")
    if run_dir:
        Path(run_dir, "benchmark.json").write_text(json.dumps(result, indent=2) + "\n")
    shard = f" in shard {index}/{count}" if count > 1 else ""
    print(f"reach: success rate {rate:.2f} ({successes}/{len(episodes)}){shard}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
