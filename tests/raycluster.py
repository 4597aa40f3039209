"""A real two-node Ray cluster on loopback, started and stopped by a test.

Each node is a ``ray start --block`` process of its own (its own session), with its own
``--temp-dir`` and its own ``HARNESS_HOME`` in its environment: two machines' worth of state
on one. Stopping kills exactly the processes under those ``ray start`` processes (never
``ray stop``, which stops every Ray process of the machine, other people's included).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from tests.clusters import end_processes
from tests.ports import free_port

RAY = Path(sys.executable).with_name("ray")
START_TIMEOUT_S = 240.0


@dataclass
class Node:
    name: str
    home: Path
    temp: Path
    proc: subprocess.Popen[bytes]
    log: Path
    pids: set[int] = field(default_factory=set)

    def descendants(self) -> list[psutil.Process]:
        """The ``ray start`` process and everything under it (the shards' services too)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the node's whole tree at once: the machine dies."""
        procs = self.descendants()
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=30)

    def stop(self) -> None:
        """SIGTERM the tree, then SIGKILL what is left after 3 s: the shards' services end at
        once, while Ray's head (``ray start --block``, its GCS and monitor) takes its time to
        shut down gracefully, past 15 s, with nothing of it kept afterwards."""
        end_processes(self.descendants(), grace=3.0)


@dataclass
class Cluster:
    address: str  # the head's GCS address, HOST:PORT (RAY_ADDRESS)
    client: str  # ray://HOST:PORT of the Ray Client server
    head: Node
    second: Node
    temps: Path

    def stop(self) -> None:
        self.second.stop()
        self.head.stop()
        shutil.rmtree(self.temps, ignore_errors=True)


def _start(
    name: str, args: list[str], home: Path, temp: Path, root: Path, extra_env: dict[str, str] | None = None
) -> Node:
    home.mkdir(parents=True, exist_ok=True)
    temp.mkdir(parents=True, exist_ok=True)
    log = root / f"{name}.log"
    env = {
        **os.environ,
        "HARNESS_HOME": str(home),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Notice a dead node within seconds (the test kills one), not the default half minute.
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
        "RAY_health_check_initial_delay_ms": "1000",
        **(extra_env or {}),
    }
    env.pop("RAY_ADDRESS", None)
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [
                str(RAY),
                "start",
                "--block",
                "--node-ip-address",
                "127.0.0.1",
                "--num-cpus",
                "2",
                "--num-gpus",
                "0",
                "--temp-dir",
                str(temp),
                "--disable-usage-stats",
                *args,
            ],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Node(name, home, temp, proc, log)


def _wait_nodes(address: str, count: int, nodes: list[Node]) -> None:
    """Until ``count`` nodes are alive (asked through ``ray status``-like state, from a subprocess
    so this test process never becomes a Ray driver)."""
    probe = (
        "import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False);"
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    deadline = time.time() + START_TIMEOUT_S
    last = ""
    while time.time() < deadline:
        for node in nodes:
            if node.proc.poll() is not None:
                raise RuntimeError(f"ray start of {node.name} exited: {node.log.read_text()[-2000:]}")
        result = subprocess.run(
            [sys.executable, "-c", probe, address],
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        )
        last = result.stdout.strip() + result.stderr[-500:]
        if result.returncode == 0 and result.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(1)
    raise RuntimeError(f"the cluster did not come up with {count} nodes: {last}")


def sign_into_lab_cache(root: Path, home: Path) -> tuple[Path, Path]:
    """A lab key in ``root/keys`` and a directory cache ``root/cache`` that ``home`` pushes to
    (signing) and pulls from (trusting); returns (keys folder, cache)."""
    keys, cache = root / "keys", root / "cache"
    subprocess.run(
        [sys.executable, "-m", "harness", "store", "keygen", "lab", "--dir", str(keys)], check=True, capture_output=True
    )
    public = (keys / "lab.public").read_text().strip()
    (home / "config.toml").write_text(
        f'[cache]\nsubstituters = ["{cache}"]\ntrusted-keys = ["{public}"]\nsecret-key-file = "{keys / "lab.secret"}"\n'
    )
    return keys, cache


def start_cluster(root: Path, second_env: dict[str, str] | None = None, *, num_cpus: int | None = None) -> Cluster:
    """Head and second node on 127.0.0.1, homes ``root/home-head`` and ``root/home-second``;
    ``second_env``: more of the second node's environment (another machine's driver, say);
    ``num_cpus``: each node's CPUs as Ray counts them (bench/cluster.py gives one)."""
    port, client = free_port(), free_port()
    cpus = ["--num-cpus", str(num_cpus)] if num_cpus is not None else []
    # Ray's session paths are long; a unix socket path must stay under 108 bytes.
    temps = Path(f"/tmp/hr-{os.getpid()}-{port}")
    head = _start(
        "head",
        ["--head", "--port", str(port), "--ray-client-server-port", str(client), "--include-dashboard", "false"] + cpus,
        root / "home-head",
        temps / "h",
        root,
    )
    nodes = [head]
    try:
        address = f"127.0.0.1:{port}"
        _wait_nodes(address, 1, nodes)
        second = _start("second", ["--address", address, *cpus], root / "home-second", temps / "s", root, second_env)
        nodes.append(second)
        _wait_nodes(address, 2, nodes)
    except BaseException:
        for node in nodes:
            node.stop()
        shutil.rmtree(temps, ignore_errors=True)
        raise
    return Cluster(address, f"ray://127.0.0.1:{client}", head, second, temps)
