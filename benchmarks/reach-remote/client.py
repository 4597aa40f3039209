"""The client of the reach task on a remote simulator: the only part of it that runs here.

Runs in the benchmark's realized client environment (standard library only), started by
``harness run`` with the simulator's address (``--simulator {url}``; also
``HARNESS_SIMULATOR_URL``). Each episode asks the simulator for a target (``POST /reset``),
asks the kinematics service through the broker (``HARNESS_BROKER``, a lease per call, as
every skill does) for joints that reach it, and sends them to the simulator
(``POST /step``), which judges them. The result, with what the simulator said it is
(``GET /info``), goes to ``$HARNESS_RUN_DIR/benchmark.json``, so the run record carries the
score.

Sharding (``--shard I/N``, default ``$HARNESS_SHARD``, else ``0/1``): shard I runs the
episodes whose index is I modulo N, as the local reach benchmark does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any


def post(url: str, body: dict[str, Any], *, token: str | None = None, timeout: float = 60) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
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
        self.token = os.environ.get("HARNESS_BROKER_TOKEN")

    def __enter__(self) -> str:
        answer = post(f"{self.broker}/acquire", {"service": self.service, "client": "reach-remote"}, token=self.token)
        self.lease = answer["lease"]
        return str(answer["url"]).rstrip("/")

    def __exit__(self, *exc: object) -> None:
        post(f"{self.broker}/release", {"lease": self.lease}, token=self.token)


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
    parser.add_argument("--simulator", default=os.environ.get("HARNESS_SIMULATOR_URL"), help="the simulator's URL")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--shard", type=parse_shard, default=os.environ.get("HARNESS_SHARD") or "0/1",
                        metavar="I/N", help="run the episodes whose index is I modulo N")
    args = parser.parse_args()
    index, count = args.shard
    broker = os.environ.get("HARNESS_BROKER")
    if not broker or not args.simulator:
        print("reach-remote: run me with `harness run` (HARNESS_BROKER and the simulator's --simulator URL)",
              file=sys.stderr)
        return 2
    simulator = args.simulator.rstrip("/")
    identity = get(f"{simulator}/info")
    print(f"reach-remote: simulator {json.dumps(identity, sort_keys=True)} at {simulator}", flush=True)
    successes = 0
    episodes = []
    for episode in range(args.episodes):
        if episode % count != index:
            continue
        target = post(f"{simulator}/reset", {"episode": episode})["target"]
        with Lease(broker, "kinematics") as url:
            answer = post(f"{url}/ik", {"position": target})
        judged = post(f"{simulator}/step", {"episode": episode, "joints": answer["joints"]})
        ok = bool(judged["success"])
        successes += ok
        episodes.append({"episode": episode, "target": target, "error_m": judged["error_m"], "success": ok})
        print(f"episode {episode:2d}: target {[round(v, 3) for v in target]} error {judged['error_m']:.2e} m "
              f"{'success' if ok else 'miss'}", flush=True)
    rate = successes / len(episodes) if episodes else 0.0
    result = {"benchmark": "reach-remote", "simulator": identity, "episodes": len(episodes),
              "shard": f"{index}/{count}", "episodes_total": args.episodes, "successes": successes,
              "success_rate": rate, "episode_results": episodes}
    run_dir = os.environ.get("HARNESS_RUN_DIR")
    if run_dir:
        Path(run_dir, "benchmark.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"reach-remote: success rate {rate:.2f} ({successes}/{len(episodes)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
