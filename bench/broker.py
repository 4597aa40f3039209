"""The broker's cost: a lease round trip beside a plain request, and a swap beside a start.

1. Latency, service already up (the built-in kinematics service, resident; the broker in
   its own process as ``harness up`` runs it): ``acquire`` and ``release`` through
   :class:`harness.client.Client` (one keep-alive connection), interleaved with a plain
   ``GET /health`` to the service itself as urllib does it (a new connection per request);
   then acquire/release back to back; then ``GET /health`` over a keep-alive connection to
   the service. Goal (issue 5): acquire p99 under 2 ms on loopback.
2. Swap overhead: in a swap group of two services, the time of ``acquire(B)`` while A is
   loaded and idle (stop A, start B, wait for B's health) beside starting B directly and
   polling its health every millisecond. Goal: under 10% beyond the services' own start
   time. Shown with and without A's own stop time (measured alone: SIGINT until its
   process group is gone), which is the service's cost, not the broker's. Run with the
   test service (``tests/services/fake_model.py``) at two load times, and with two
   instances of the kinematics service (a real, fast-loading service).

   Every request carries the broker's token (``Authorization: Bearer``, read by the client
   from the state folder) and passes its Host/Origin checks: authentication is always on.

3. Under load (issue 31): ``--clients`` threads (20) alternate acquire + release with a bare
   ``GET /health`` to the broker, each on its own keep-alive connection, while the event
   stream is read and ``/status`` polled once a second, as the web UI does. Goal: acquire p99
   at most 2x the ``GET /health`` p99 of the same threads.

    python bench/broker.py [--requests 2000] [--swaps 7] [--latency-only] [--clients 20] [--concurrent-only]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.client import Client  # noqa: E402
from harness.manifests.loading import load_model  # noqa: E402
from harness.manifests.model import ServiceManifest  # noqa: E402
from harness.runtime import supervisor  # noqa: E402
from harness.runtime.broker import Broker, down, spawn  # noqa: E402
from harness.runtime.launch import LaunchSpec, clean_environment, launch_spec  # noqa: E402
from harness.runtime.plan import Plan, ServicePlacement  # noqa: E402

FAKE = ROOT / "tests" / "services" / "fake_model.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def kinematics_spec(name: str, state: Path) -> tuple[LaunchSpec, ServicePlacement]:
    manifest = load_model(ServiceManifest, ROOT / "services" / "kinematics.toml")
    port = free_port()
    where = ServicePlacement(name, "on_demand", None, port, f"http://127.0.0.1:{port}", swap="cpu")
    spec = launch_spec(
        name,
        manifest,
        where,
        python=Path(sys.executable),
        weights=ROOT / "services" / "assets",
        cwd=ROOT,
        state_dir=state,
    )
    return spec, where


def fake_spec(name: str, state: Path, load: float) -> tuple[LaunchSpec, ServicePlacement]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = LaunchSpec(
        name,
        (sys.executable, str(FAKE), "--name", name, "--port", str(port), "--load-seconds", str(load)),
        clean_environment({"PATH": "/usr/bin:/bin"}, None),
        ROOT,
        port,
        url,
        f"{url}/health",
        load + 30,
        state / "logs" / f"{name}.log",
    )
    return spec, ServicePlacement(name, "on_demand", 0, port, url, swap="gpu0")


# ----------------------------------------------------------------------------- latency


def in_process(requests: int) -> dict[str, list[float]]:
    """The broker's own cost without HTTP: ``Broker.acquire``/``release`` called directly
    (the scheduler and its lock), and the access check every request passes (Host, Origin,
    the token compared in constant time), timed on a handler built without a socket."""
    import email.message
    import types

    from harness.runtime.broker import _Handler

    state = Path(tempfile.mkdtemp(prefix="bench-broker-direct-"))
    remote = ServicePlacement("remote", "external", None, None, "http://10.0.0.1:9")
    times: dict[str, list[float]] = {"direct_acquire": [], "direct_release": [], "access_check": []}
    with Broker(Plan((remote,)), {}, state) as broker:
        for _ in range(requests):
            t0 = time.perf_counter()
            lease = broker.acquire("remote", "bench")
            t1 = time.perf_counter()
            broker.release(lease["lease"])
            times["direct_acquire"].append(t1 - t0)
            times["direct_release"].append(time.perf_counter() - t1)
        handler = _Handler.__new__(_Handler)
        handler.server = types.SimpleNamespace(  # type: ignore[assignment]
            token=broker.token.encode(), allowed_hosts=frozenset({"127.0.0.1:8000"})
        )
        headers = email.message.Message()
        headers["Host"] = "127.0.0.1:8000"
        headers["Authorization"] = f"Bearer {broker.token}"
        handler.headers = headers
        for _ in range(requests):
            t0 = time.perf_counter()
            handler._check_access()
            times["access_check"].append(time.perf_counter() - t0)
    return times


def latency(requests: int) -> dict[str, list[float]]:
    """Broker in its own process, as ``harness up`` runs it; the client here."""
    state = Path(tempfile.mkdtemp(prefix="bench-broker-"))
    spec, where = kinematics_spec("kinematics", state)
    where = ServicePlacement(where.name, "resident", None, where.port, where.url)
    keys = ("acquire", "release", "get_new_conn", "acquire_b2b", "release_b2b", "get_keepalive")
    times: dict[str, list[float]] = {k: [] for k in keys}
    spawn(Plan((where,)), {spec.name: spec}, state)
    try:
        client = Client(state_dir=state)
        for _ in range(200):  # warm-up: connections, code paths
            client.release(client.acquire(spec.name))
        # Interleaved with plain requests to the service, as an agent's calls come.
        for _ in range(requests):
            t0 = time.perf_counter()
            lease = client.acquire(spec.name)
            t1 = time.perf_counter()
            client.release(lease)
            t2 = time.perf_counter()
            with urllib.request.urlopen(spec.url + "/health") as response:
                response.read()
            t3 = time.perf_counter()
            times["acquire"].append(t1 - t0)
            times["release"].append(t2 - t1)
            times["get_new_conn"].append(t3 - t2)
        # Back to back: the broker's own cost without the machine's wake-up latency.
        for _ in range(requests):
            t0 = time.perf_counter()
            lease = client.acquire(spec.name)
            t1 = time.perf_counter()
            client.release(lease)
            times["acquire_b2b"].append(t1 - t0)
            times["release_b2b"].append(time.perf_counter() - t1)
        # Keep-alive to the service itself (fewer: see the note printed with it).
        keepalive = http.client.HTTPConnection("127.0.0.1", spec.port)
        for _ in range(min(requests, 100)):
            t0 = time.perf_counter()
            keepalive.request("GET", "/health")
            keepalive.getresponse().read()
            times["get_keepalive"].append(time.perf_counter() - t0)
        keepalive.close()
    finally:
        down(state)
    times["echo"] = echo_floor(requests)
    return times


def concurrent(clients: int, requests: int) -> dict[str, list[float]]:
    """``clients`` threads at once against one broker in its own process (resident kinematics),
    with what the web UI keeps open: the event stream (``GET /events``, read as it comes) and
    ``GET /status`` once a second. Each thread alternates acquire + release with a bare
    ``GET /health`` to the broker over its own keep-alive connection, so both see the same
    load; issue 31's goal compares their p99."""
    import threading

    state = Path(tempfile.mkdtemp(prefix="bench-broker-many-"))
    spec, where = kinematics_spec("kinematics", state)
    where = ServicePlacement(where.name, "resident", None, where.port, where.url)
    spawn(Plan((where,)), {spec.name: spec}, state)
    times: dict[str, list[float]] = {"many_acquire": [], "many_health": []}
    lock = threading.Lock()
    stop = threading.Event()
    try:
        client = Client(state_dir=state)  # one keep-alive connection per thread
        host, port = client._host, client._port
        token = (state / "broker.token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}

        def events() -> None:
            conn = http.client.HTTPConnection(host, port)
            conn.request("GET", "/events", headers=auth)
            response = conn.getresponse()
            while not stop.is_set() and response.fp is not None and response.fp.readline():
                pass

        def status() -> None:
            conn = http.client.HTTPConnection(host, port)
            while not stop.wait(1.0):
                conn.request("GET", "/status", headers=auth)
                conn.getresponse().read()

        def worker() -> None:
            health = http.client.HTTPConnection(host, port)
            mine: dict[str, list[float]] = {"many_acquire": [], "many_health": []}
            for _ in range(20):  # warm-up
                client.release(client.acquire(spec.name))
            for _ in range(requests):
                t0 = time.perf_counter()
                lease = client.acquire(spec.name)
                t1 = time.perf_counter()
                client.release(lease)
                t2 = time.perf_counter()
                health.request("GET", "/health")
                health.getresponse().read()
                mine["many_acquire"].append(t1 - t0)
                mine["many_health"].append(time.perf_counter() - t2)
            with lock:
                for key, values in mine.items():
                    times[key] += values

        observers = [threading.Thread(target=f, daemon=True) for f in (events, status)]
        for thread in observers:
            thread.start()
        threads = [threading.Thread(target=worker) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        stop.set()
        down(state)
    return times


ECHO_SERVER = """
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := conn.recv(4096):
    conn.sendall(data)
"""


def echo_floor(requests: int) -> list[float]:
    """Round trips of 200 bytes to an echo server in another Python process: the floor
    that any request between two processes pays on this machine (scheduling, loopback)."""
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = b"x" * 200
        samples = []
        for _ in range(requests):
            t0 = time.perf_counter()
            sock.sendall(payload)
            got = 0
            while got < len(payload):
                got += len(sock.recv(4096))
            samples.append(time.perf_counter() - t0)
        sock.close()
        return samples
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------- swaps


def direct_start(spec: LaunchSpec, stops: list[float] | None = None) -> float:
    """Start ``spec`` and poll its health every millisecond; seconds until healthy.

    The service is then stopped (SIGINT to its group); that time goes to ``stops``.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(spec.argv),
        cwd=spec.cwd,
        env=dict(spec.env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while True:
            try:
                with urllib.request.urlopen(spec.health_url, timeout=1) as response:
                    if response.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"{spec.name} exited with {proc.returncode}")
            time.sleep(0.001)
    finally:
        t1 = time.perf_counter()
        supervisor.stop(proc.pid, proc=proc, grace=(5.0, 5.0))
        if stops is not None:
            stops.append(time.perf_counter() - t1)


def swaps(label: str, make, runs: int) -> dict[str, float | str]:
    state = Path(tempfile.mkdtemp(prefix="bench-swap-"))
    a_spec, a_where = make("bench-a", state)
    b_spec, b_where = make("bench-b", state)
    direct: list[float] = []
    swapped: list[float] = []
    stops: list[float] = []
    with Broker(Plan((a_where, b_where)), {a_spec.name: a_spec, b_spec.name: b_spec}, state) as broker:
        client = Client(broker.serve_in_thread(), token=broker.token)
        direct_start(b_spec)  # warm-up: page cache, imports
        for _ in range(runs):
            client.release(client.acquire(a_spec.name))  # A loaded and idle; B stopped
            direct.append(direct_start(b_spec, stops))
            t0 = time.perf_counter()
            lease = client.acquire(b_spec.name)  # stop A, start B, wait for health
            swapped.append(time.perf_counter() - t0)
            client.release(lease)
    d, s = statistics.median(direct), statistics.median(swapped)
    return {"label": label, "direct": d, "swap": s, "stop": statistics.median(stops), "overhead": (s - d) / d}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--swaps", type=int, default=7)
    parser.add_argument("--latency-only", action="store_true", help="skip the swap measurements")
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients of the load test")
    parser.add_argument("--concurrent-only", action="store_true", help="only the concurrent clients' test")
    args = parser.parse_args()

    many = concurrent(args.clients, max(50, args.requests // args.clients))
    ratio = pct(many["many_acquire"], 0.99) / pct(many["many_health"], 0.99)
    print(f"{args.clients} concurrent clients, the event stream and a status poll connected (ms)")
    print(f"{'request':<42} {'p50':>7} {'p99':>7}")
    for title, key in (
        ("acquire (broker, keep-alive)", "many_acquire"),
        ("GET /health (broker, keep-alive)", "many_health"),
    ):
        print(f"{title:<42} {pct(many[key], 0.5) * 1e3:7.3f} {pct(many[key], 0.99) * 1e3:7.3f}")
    print(f"goal: acquire p99 <= 2x GET /health p99 under load: {ratio:.2f}x ({'meets' if ratio <= 2 else 'MISSES'})\n")
    if args.concurrent_only:
        return

    times = latency(args.requests)
    times.update(in_process(args.requests))
    print(f"latency, {args.requests} requests each, interleaved (ms)")
    print(f"{'request':<42} {'p50':>7} {'p99':>7}")
    rows = [
        ("acquire (broker, keep-alive)", "acquire"),
        ("release (broker, keep-alive)", "release"),
        ("GET /health to the service, new connection", "get_new_conn"),
        ("acquire, back to back", "acquire_b2b"),
        ("release, back to back", "release_b2b"),
        ("GET /health to the service, keep-alive", "get_keepalive"),
        ("floor: TCP echo to another process", "echo"),
        ("Broker.acquire in process (no HTTP)", "direct_acquire"),
        ("Broker.release in process (no HTTP)", "direct_release"),
        ("access check (Host, Origin, token)", "access_check"),
    ]
    for title, key in rows:
        print(f"{title:<42} {pct(times[key], 0.5) * 1e3:7.3f} {pct(times[key], 0.99) * 1e3:7.3f}")
    p99 = pct(times["acquire"], 0.99) * 1e3
    print(f"goal: acquire p99 < 2 ms (authenticated): {p99:.3f} ms ({'meets' if p99 < 2 else 'MISSES'})\n")
    if args.latency_only:
        print(
            json.dumps(
                {"latency_ms": {k: {"p50": pct(v, 0.5) * 1e3, "p99": pct(v, 0.99) * 1e3} for k, v in times.items()}}
            )
        )
        return

    print(f"swap A→B via the broker vs starting B directly, median of {args.swaps} (s)")
    print(f"{'services':<34} {'direct':>7} {'swap':>7} {'overhead':>9} {'A stop':>7} {'w/o stop':>9}")
    results = [
        swaps("test service, load 1.0 s", lambda n, s: fake_spec(n, s, 1.0), args.swaps),
        swaps("test service, load 0.3 s", lambda n, s: fake_spec(n, s, 0.3), args.swaps),
        swaps("kinematics (real)", kinematics_spec, args.swaps),
    ]
    for r in results:
        rest = (r["swap"] - r["direct"] - r["stop"]) / r["direct"]
        print(
            f"{r['label']:<34} {r['direct']:7.3f} {r['swap']:7.3f} {r['overhead'] * 100:8.1f}% "
            f"{r['stop']:7.3f} {rest * 100:8.1f}%"
        )
    print(
        json.dumps(
            {
                "latency_ms": {k: {"p50": pct(v, 0.5) * 1e3, "p99": pct(v, 0.99) * 1e3} for k, v in times.items()},
                "swaps": results,
            }
        )
    )


if __name__ == "__main__":
    main()
