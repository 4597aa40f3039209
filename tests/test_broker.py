"""The runtime's broker, supervisor and client, with real processes throughout.

Services are ``tests/services/fake_model.py`` (load time, crashes and exit codes set by
arguments) and the built-in kinematics service. What the broker claims is checked against
the process table (psutil), not only its own status.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import psutil
import pytest

from harness.client import BrokerError, Client, Lease, NotAuthorized, ServiceFailed, ServiceOff
from harness.errors import HarnessError
from harness.manifests.deploy import Deploy
from harness.manifests.loading import load_model, validate_data
from harness.manifests.model import ServiceManifest
from harness.runtime import supervisor
from harness.runtime.broker import (
    Broker,
    broker_address,
    down,
    find_brokers,
    plan_from_json,
    read_state,
    spawn,
    status,
)
from harness.runtime.launch import (
    LaunchError,
    LaunchSpec,
    clean_environment,
    launch_spec,
    specs_from_json,
    specs_to_json,
)
from harness.runtime.placement import plan as place
from harness.runtime.parking import PARKED_PREFIX, Parked, park, stale_markers
from harness.runtime.plan import Plan, ServicePlacement
from tests.ports import free_port

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "services" / "fake_model.py"
PY = sys.executable


# ------------------------------------------------------------------------------ helpers


def fake(
    name: str, state: Path, *args: str, load: float = 0.05, load_seconds: float = 10.0, health: bool = True
) -> LaunchSpec:
    """A LaunchSpec of the fake model service on a free port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    return LaunchSpec(
        name=name,
        argv=(PY, str(FAKE), "--name", name, "--port", str(port), "--load-seconds", str(load), *args),
        env=clean_environment(os.environ, None),
        cwd=REPO,
        port=port,
        url=url,
        health_url=f"{url}/health" if health else None,
        load_seconds=load_seconds,
        log_path=state / "logs" / f"{name}.log",
    )


def placement(spec: LaunchSpec, mode: str = "on_demand", **kw: Any) -> ServicePlacement:
    return ServicePlacement(name=spec.name, mode=mode, gpu=kw.pop("gpu", 0), port=spec.port, url=spec.url, **kw)  # type: ignore[arg-type]


def get(url: str, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def fake_processes(names: set[str]) -> dict[str, list[int]]:
    """Live (non-zombie) fake services by --name, read from the process table."""
    found: dict[str, list[int]] = {}
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = process.info["cmdline"] or []
            if process.info["status"] == psutil.STATUS_ZOMBIE or str(FAKE) not in cmd:
                continue
            name = cmd[cmd.index("--name") + 1]
        except (psutil.Error, ValueError, IndexError):
            continue
        if name in names:
            found.setdefault(name, []).append(process.pid)
    return found


class Sampler(threading.Thread):
    """Scans the process table continuously; records the most group members seen at once."""

    def __init__(self, names: set[str]) -> None:
        super().__init__(daemon=True)
        self.names = names
        self.stop_event = threading.Event()
        self.max_together = 0
        self.max_per_name = 0
        self.seen: set[str] = set()
        self.samples = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            found = fake_processes(self.names)
            self.max_together = max(self.max_together, len(found))
            self.max_per_name = max([self.max_per_name, *(len(p) for p in found.values())])
            self.seen |= set(found)
            self.samples += 1

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_event.set()
        self.join()


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., tuple[Broker, Client]]]:
    """Build and serve brokers for a test; every one is shut down at the end."""
    brokers: list[Broker] = []

    def make(placements: list[ServicePlacement], specs: list[LaunchSpec], **options: Any) -> tuple[Broker, Client]:
        options.setdefault("tick", 0.05)
        options.setdefault("grace", (2.0, 2.0))
        broker = Broker(Plan(tuple(placements)), {s.name: s for s in specs}, tmp_path, **options)
        brokers.append(broker)
        return broker, Client(broker.serve_in_thread(), token=broker.token)

    yield make
    for broker in brokers:
        broker.shutdown()
    down(tmp_path, grace=(0.5, 0.5))  # anything a failed test left behind


def service_status(broker: Broker, name: str) -> dict[str, Any]:
    return next(s for s in broker.status()["services"] if s["name"] == name)


# ------------------------------------------------------------------------ launch (pure)


def test_launch_spec_fills_templates_and_cleans_the_environment(tmp_path: Path) -> None:
    manifest = load_model(ServiceManifest, REPO / "services" / "kinematics.toml")
    where = ServicePlacement("kinematics", "resident", None, 18830, "http://127.0.0.1:18830")
    caller = {
        "PATH": f"/venv/bin{os.pathsep}/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "VIRTUAL_ENV": "/venv",
        "PYTHONPATH": "/leak",
        "PYTHONHOME": "/x",
        "PYTHONSTARTUP": "/s.py",
        "CONDA_PREFIX": "/conda",
        "CONDA_DEFAULT_ENV": "base",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    spec = launch_spec(
        "kinematics",
        manifest,
        where,
        python=Path("/store/env/bin/python"),
        weights=Path("/store/w"),
        cwd=REPO,
        state_dir=tmp_path,
        base_env=caller,
    )
    assert spec.argv == (
        "/store/env/bin/python",
        "-u",
        "services/servers/serve_kinematics.py",
        "--robot",
        "/store/w/arm7/arm7.json",
        "--port",
        "18830",
    )
    assert spec.health_url == "http://127.0.0.1:18830/health" and spec.load_seconds == 10
    assert spec.log_path == tmp_path / "logs" / "kinematics.log"
    env = dict(spec.env)
    assert env["PATH"] == "/usr/bin"  # the caller's virtualenv is not on it
    assert env["HOME"] == "/home/u" and env["LANG"] == "C.UTF-8" and env["TMPDIR"] == "/tmp"
    for leaked in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "CONDA_PREFIX", "CONDA_DEFAULT_ENV"):
        assert leaked not in env
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # CPU only: no GPU visible
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONNOUSERSITE"] == "1"
    on_gpu = launch_spec(
        "kinematics",
        manifest,
        ServicePlacement("kinematics", "on_demand", 2, 1, None),
        python=Path("/p"),
        weights=Path("/w"),
        cwd=REPO,
        state_dir=tmp_path,
        base_env=caller,
    )
    assert on_gpu.env["CUDA_VISIBLE_DEVICES"] == "2" and on_gpu.url == "http://127.0.0.1:1"
    with pytest.raises(LaunchError, match=r"\{weights\}"):
        launch_spec(
            "kinematics",
            manifest,
            where,
            python=Path("/p"),
            weights=None,
            cwd=REPO,
            state_dir=tmp_path,
            base_env=caller,
        )
    with pytest.raises(LaunchError, match="launches no process"):
        launch_spec(
            "kinematics",
            manifest,
            ServicePlacement("kinematics", "external", None, None, "http://x"),
            python=Path("/p"),
            weights=None,
            cwd=REPO,
            state_dir=tmp_path,
        )


def test_launch_spec_xpolicylab_runs_setup_policy_server_from_the_realized_source(tmp_path: Path) -> None:
    manifest = load_model(ServiceManifest, REPO / "services" / "smolvla.toml")
    where = ServicePlacement("smolvla", "on_demand", 0, 8820, "http://127.0.0.1:8820", swap="models")
    src = Path("/store/abc-XPolicyLab")
    spec = launch_spec(
        "smolvla",
        manifest,
        where,
        python=Path("/store/env/bin/python"),
        weights=Path("/store/w"),
        cwd=tmp_path,
        state_dir=tmp_path,
        sources={0: src},
        base_env={},
    )
    argv = list(spec.argv)
    assert argv[:2] == ["/store/env/bin/python", f"{src}/setup_policy_server.py"]
    assert argv[argv.index("--config_path") + 1] == f"{src}/policy/SmolVLA/deploy.yml"
    assert argv[argv.index("--port") + 1] == "8820" and argv[argv.index("--host") + 1] == "127.0.0.1"
    overrides = argv[argv.index("--overrides") + 1 :]  # argparse.REMAINDER: must be last
    assert overrides[:2] == ["policy_name=SmolVLA", "checkpoint_path=/store/w/smolvla"]
    assert "smovla_vlm_path=/store/w/smolvlm2" in overrides and "env_cfg_type=arx_x5" in overrides
    assert spec.health_url is None  # readiness: the websocket port accepts connections
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0"
    with pytest.raises(LaunchError, match="not realized"):
        launch_spec(
            "smolvla",
            manifest,
            where,
            python=Path("/p"),
            weights=Path("/w"),
            cwd=tmp_path,
            state_dir=tmp_path,
            sources={},
        )


# ---------------------------------------------------------------------------- supervisor


def test_stop_escalates_to_sigkill_for_the_whole_process_group(tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-stubborn", tmp_path, "--ignore-signals", "--child", load=0)
    proc = supervisor.start(spec, tmp_path)
    supervisor.wait_healthy(spec, proc)
    members = wait_until(
        lambda: len(supervisor._group_members(proc.pid)) == 2 and supervisor._group_members(proc.pid),
        what="the child in the service's group",
    )
    record = supervisor.read_pidfiles(tmp_path)[0]
    assert record.alive and record.pid == proc.pid and record.name == spec.name
    assert supervisor.stop(proc.pid, proc=proc, grace=(0.2, 0.2)) == "SIGKILL"
    assert not any(m.is_running() and m.status() != psutil.STATUS_ZOMBIE for m in members)
    assert proc.returncode == -signal.SIGKILL


def test_wait_healthy_fails_early_with_the_log_tail(tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-broken", tmp_path, "--fail-load", "4", load=0)
    proc = supervisor.start(spec, tmp_path)
    began = time.monotonic()
    with pytest.raises(supervisor.ServiceStartError, match="exit code 4") as info:
        supervisor.wait_healthy(spec, proc)
    assert time.monotonic() - began < 5  # not the whole load_seconds
    assert "cannot load the weights" in info.value.log_tail


# --------------------------------------------------------------------------------- broker


def test_on_demand_starts_on_first_acquire_and_is_healthy_before_the_answer(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-od", tmp_path, load=0.4)
    broker, client = make_broker([placement(spec)], [spec])
    assert fake_processes({spec.name}) == {} and service_status(broker, spec.name)["state"] == "stopped"
    began = time.monotonic()
    with client.use(spec.name) as lease:
        assert time.monotonic() - began >= 0.4
        assert get(lease.url + "/health")["status"] == "ok"  # no retry: healthy already
        assert lease.fresh and lease.incarnation == 1 and lease.url == spec.url
        row = service_status(broker, spec.name)
        assert row["state"] == "ready" and row["leases"] == 1 and row["memory_bytes"] > 0
        if not Path("/dev/nvidia0").exists():  # no driver: GPU memory unknown, not zero
            assert row["gpu_memory_bytes"] is None
        assert fake_processes({spec.name}) == {spec.name: [row["pid"]]}
    again = client.acquire(spec.name)
    assert not again.fresh and again.incarnation == 1  # same process, same client
    client.release(again)


def test_callers_join_a_load_in_progress(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-join", tmp_path, load=0.6)
    broker, client = make_broker([placement(spec)], [spec])
    leases: list[Lease] = []
    pids: list[int] = []
    barrier = threading.Barrier(30)

    def call() -> None:
        barrier.wait()
        with client.use(spec.name) as lease:
            pids.append(get(lease.url + "/health")["pid"])
            leases.append(lease)

    with Sampler({spec.name}) as sampler:
        threads = [threading.Thread(target=call) for _ in range(30)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert len(leases) == 30 and len(set(pids)) == 1
    assert {lease.incarnation for lease in leases} == {1}
    assert sampler.max_per_name == 1 and sampler.samples > 0
    assert service_status(broker, spec.name)["starts"] == 1


def test_200_concurrent_acquires_in_one_swap_group(make_broker, tmp_path: Path) -> None:
    """No deadlock, every call answered, never two members up at once (process table)."""
    specs = [fake(f"{tmp_path.name}-{x}", tmp_path, load=0.03) for x in "abc"]
    names = {s.name for s in specs}
    broker, client = make_broker([placement(s, swap="gpu0") for s in specs], specs)
    rng = random.Random(5)
    plan = [[rng.choice(specs).name for _ in range(2)] for _ in range(200)]
    answers: list[tuple[str, dict[str, Any]]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(200)

    def caller(wanted: list[str]) -> None:
        try:
            barrier.wait()
            for name in wanted:
                with client.use(name) as lease:
                    answers.append((name, get(lease.url + f"/work?sleep={rng.random() * 0.01:.4f}")))
        except BaseException as exc:  # anything at all: reported below
            errors.append(exc)

    began = time.monotonic()
    with Sampler(names) as sampler:
        threads = [threading.Thread(target=caller, args=(w,)) for w in plan]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert not any(t.is_alive() for t in threads), "deadlock: callers still waiting"
    assert errors == []
    assert len(answers) == 400 and all(answer["name"] == name for name, answer in answers)
    assert sampler.max_together == 1, "two members of the swap group ran at once"
    assert sampler.max_per_name == 1, "a member ran twice"
    assert sampler.seen == names and sampler.samples > 10
    rows = [service_status(broker, n) for n in names]
    assert sum(r["leases"] for r in rows) == 0 and sum(r["waiting"] for r in rows) == 0
    assert sum(r["state"] == "ready" for r in rows) == 1
    print(
        f"400 acquires, {sum(r['starts'] for r in rows)} starts, {time.monotonic() - began:.2f} s, "
        f"{sampler.samples} process-table samples"
    )


def test_waiting_callers_are_served_in_order(make_broker, tmp_path: Path) -> None:
    a, b, c = (fake(f"{tmp_path.name}-{x}", tmp_path, load=0.02) for x in "abc")
    broker, client = make_broker([placement(s, swap="g") for s in (a, b, c)], [a, b, c])
    holder = client.acquire(a.name)
    granted: list[tuple[str, Lease]] = []
    lock = threading.Lock()

    def waiter(label: str, service: str) -> threading.Thread:
        def run() -> None:
            lease = Client(client.address, client_id=label, token=broker.token).acquire(service)
            with lock:
                granted.append((label, lease))
            time.sleep(0.05)
            client.release(lease)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    threads = []
    for count, (label, service) in enumerate([("b1", b), ("c1", c), ("a2", a), ("b2", b)], start=1):
        threads.append(waiter(label, service.name))
        wait_until(lambda n=count: sum(r["waiting"] for r in broker.status()["services"]) == n, what=f"{label} queued")
    # a2 wants the loaded member but queues behind b1 and c1: no overtaking.
    assert service_status(broker, a.name)["waiting"] == 1
    client.release(holder)
    for thread in threads:
        thread.join(20)
    order = [label for label, _ in granted]
    assert set(order[:2]) == {"b1", "b2"}, order  # b's waiters are admitted together
    assert order[2:] == ["c1", "a2"], order
    assert dict(granted)["a2"].incarnation == 2  # a was swapped out and loaded again


def test_acquire_timeout_while_a_peer_is_in_use(make_broker, tmp_path: Path) -> None:
    a, b = (fake(f"{tmp_path.name}-{x}", tmp_path) for x in "ab")
    broker, client = make_broker([placement(s, swap="g") for s in (a, b)], [a, b])
    with client.use(a.name):
        with pytest.raises(BrokerError) as info:
            client.acquire(b.name, timeout=0.3)
        assert info.value.status == 504 and info.value.code == "timeout"
        assert service_status(broker, b.name)["waiting"] == 0  # the ticket left the queue
    with client.use(b.name) as lease:
        assert lease.fresh


def test_idle_service_stops_after_idle_seconds(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-idle", tmp_path)
    broker, client = make_broker([placement(spec, idle_seconds=0.3)], [spec])
    lease = client.acquire(spec.name)
    pid = service_status(broker, spec.name)["pid"]
    time.sleep(0.8)  # in flight: never idle
    assert psutil.pid_exists(pid) and service_status(broker, spec.name)["state"] == "ready"
    client.release(lease)
    wait_until(lambda: service_status(broker, spec.name)["state"] == "stopped", timeout=5, what="the idle stop")
    assert not fake_processes({spec.name}) and not psutil.pid_exists(pid)
    row = service_status(broker, spec.name)
    assert row["state"] == "stopped" and row["stop_reason"] == "idle"
    with client.use(spec.name) as again:
        assert again.fresh and again.incarnation == 2


def test_crash_is_noticed_and_restarted_on_next_acquire(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-crash", tmp_path, "--crash-after", "1")
    broker, client = make_broker([placement(spec, scoped=True)], [spec])
    with client.use(spec.name) as lease:
        first_pid = get(lease.url + "/work")["pid"]  # answered, then the process exits
    wait_until(lambda: service_status(broker, spec.name)["state"] == "crashed", what="the crash to be noticed")
    assert "exit code 3" in service_status(broker, spec.name)["error"]
    with client.use(spec.name) as lease:
        assert lease.fresh and lease.incarnation == 2
        second_pid = get(lease.url + "/health")["pid"]
    assert second_pid != first_pid
    # Killed from outside mid-run (SIGKILL, a lease in flight): noticed, restarted on demand.
    with client.use(spec.name) as lease:
        os.kill(second_pid, signal.SIGKILL)
        wait_until(lambda: service_status(broker, spec.name)["state"] == "crashed", what="the kill to be noticed")
    with client.use(spec.name) as lease:
        assert get(lease.url + "/health")["pid"] not in (first_pid, second_pid)
    row = service_status(broker, spec.name)
    assert row["restarts"] == 2 and row["crashes"] == 2


def test_a_service_that_keeps_crashing_gives_its_log_tail(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-bad", tmp_path, "--fail-load", "3", load=0)
    broker, client = make_broker([placement(spec)], [spec], crash_limit=3)
    for _ in range(3):
        with pytest.raises(ServiceFailed) as info:
            client.acquire(spec.name)
        assert info.value.code == "start_failed"
        assert "cannot load the weights: simulated failure" in info.value.log_tail
    began = time.monotonic()
    with pytest.raises(ServiceFailed) as info:
        client.acquire(spec.name)
    assert info.value.code == "crashing" and "keeps crashing" in str(info.value)
    assert "simulated failure" in str(info.value) and time.monotonic() - began < 0.5
    assert spec.log_path.read_text().count("=== harness: starting") == 3  # not started a 4th time
    row = service_status(broker, spec.name)
    assert row["state"] == "crashed" and row["crashes"] == 3 and "exit code 3" in row["error"]


def test_external_and_off(make_broker, tmp_path: Path) -> None:
    ext = ServicePlacement("remote", "external", None, None, "http://10.1.2.3:9000")
    off = ServicePlacement("sam3", "off", None, None, None, reason="no GPU can hold 7.2 GB")
    broker, client = make_broker([ext, off], [])
    lease = client.acquire("remote")
    assert lease.url == "http://10.1.2.3:9000" and lease.incarnation == 0
    client.release(lease)
    with pytest.raises(ServiceOff, match="no GPU can hold 7.2 GB") as info:
        client.acquire("sam3")
    assert info.value.status == 409
    with pytest.raises(BrokerError) as unknown:
        client.acquire("nope")
    assert unknown.value.status == 404
    states = {s["name"]: s["state"] for s in broker.status()["services"]}
    assert states == {"remote": "external", "sam3": "off"}


def test_scoped_service_swapped_out_is_fresh_again(make_broker, tmp_path: Path) -> None:
    policy = fake(f"{tmp_path.name}-policy", tmp_path)
    seg = fake(f"{tmp_path.name}-seg", tmp_path)
    broker, client = make_broker([placement(policy, swap="g", scoped=True), placement(seg, swap="g")], [policy, seg])
    fresh = []
    for name in (policy.name, policy.name, seg.name, policy.name, policy.name):
        with client.use(name) as lease:
            fresh.append(lease.fresh)
            assert lease.scoped == (name == policy.name)
    assert fresh == [True, False, True, True, False]
    assert service_status(broker, policy.name)["incarnation"] == 2
    other = Client(client.address, client_id="another-agent", token=broker.token)
    with other.use(policy.name) as lease:
        assert lease.fresh  # this process has not served that client before


def test_a_port_answered_by_a_foreign_process_is_used_as_is(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-ours", tmp_path)
    foreign = subprocess.Popen([PY, str(FAKE), "--name", "hand-started", "--port", str(spec.port)])
    try:
        wait_until(lambda: supervisor.port_in_use(spec.port), what="the foreign service")
        broker, client = make_broker([placement(spec, mode="resident")], [spec])
        assert broker.start() == {spec.name: None}
        with client.use(spec.name) as lease:
            assert lease.foreign and get(lease.url + "/health")["name"] == "hand-started"
        row = service_status(broker, spec.name)
        assert row["foreign"] and row["pid"] is None and row["state"] == "ready"
        broker.shutdown()
        assert foreign.poll() is None  # never stopped: harness did not start it
        assert not supervisor.read_pidfiles(tmp_path)
    finally:
        foreign.terminate()
        foreign.wait(5)


def test_the_owner_of_a_port_is_read_from_proc(tmp_path: Path) -> None:
    port = free_port()
    listener = subprocess.Popen([PY, str(FAKE), "--name", "mine", "--port", str(port)])
    try:
        wait_until(lambda: supervisor.port_in_use(port), what="the listener")
        [owner] = supervisor.port_owners(port)
        assert (owner.uid, owner.pid) == (os.geteuid(), listener.pid)
        assert owner.command is not None and "--name mine" in owner.command
        assert f"pid {listener.pid} of uid {os.geteuid()}" in owner.describe()
    finally:
        listener.terminate()
        listener.wait(5)
    assert supervisor.port_owners(port) == []


#: Serves 200 to every GET on 127.0.0.1:PORT, as a healthy service would (standard library only).
_LISTENER = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.mark.root
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="starts a process of another uid (root, setpriv)"
)
def test_a_port_answered_by_another_users_process_is_refused(make_broker, tmp_path: Path) -> None:
    import shutil

    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    pythons = [p for p in ("/usr/bin/python3", sys.executable, shutil.which("python3")) if p]
    python = next(
        (p for p in pythons if subprocess.run([*nobody, p, "-c", "pass"], capture_output=True).returncode == 0), None
    )
    if python is None:
        pytest.skip("no Python that uid 65534 may run")
    spec = fake(f"{tmp_path.name}-svc", tmp_path)
    stranger = subprocess.Popen([*nobody, python, "-I", "-c", _LISTENER, str(spec.port)], cwd="/")
    try:
        wait_until(lambda: supervisor.port_in_use(spec.port), what="the other user's listener")
        assert supervisor.probe(spec)  # it answers the health check: today's broker would adopt it
        broker, client = make_broker([placement(spec, mode="resident")], [spec])
        error = broker.start()[spec.name]
        assert error is not None and "\n" not in error.split(" --- last lines")[0], error
        assert f"port {spec.port} is held by pid {stranger.pid} of uid 65534" in error, error
        assert "another user's process" in error and "-I -c" in error
        with pytest.raises(ServiceFailed):
            client.acquire(spec.name)
        row = service_status(broker, spec.name)
        assert not row["foreign"] and row["pid"] is None
        assert stranger.poll() is None  # never signalled: not ours
    finally:
        stranger.kill()
        stranger.wait(5)


def test_down_after_the_broker_was_killed_stops_only_what_harness_started(tmp_path: Path) -> None:
    resident = fake(f"{tmp_path.name}-res", tmp_path)
    lazy = fake(f"{tmp_path.name}-lazy", tmp_path)
    plan = Plan((placement(resident, mode="resident"), placement(lazy)))
    bystander = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        current = spawn(plan, {s.name: s for s in (resident, lazy)}, tmp_path, options={"tick": 0.05})
        assert [s["state"] for s in current["services"]] == ["ready", "stopped"]
        address = broker_address(tmp_path)
        assert address == current["broker"]["url"]
        with Client(state_dir=tmp_path).use(lazy.name) as lease:
            assert get(lease.url + "/health")["name"] == lazy.name
        started = fake_processes({resident.name, lazy.name})
        assert set(started) == {resident.name, lazy.name}
        # A pid file that names the bystander with another create time: a recycled pid.
        (tmp_path / "pids" / "recycled.json").write_text(
            json.dumps(
                {
                    "harness": supervisor.PIDFILE_MARKER,
                    "name": "recycled",
                    "pid": bystander.pid,
                    "pgid": bystander.pid,
                    "create_time": 1.0,
                    "started": 1.0,
                }
            )
        )
        broker_pid = current["broker"]["pid"]
        os.kill(broker_pid, signal.SIGKILL)
        wait_until(lambda: read_state(tmp_path) is None, what="the broker to die")
        offline = status(tmp_path)
        assert offline["broker"] is None
        assert {r["name"]: r["alive"] for r in offline["services"]} == {
            resident.name: True,
            lazy.name: True,
            "recycled": False,
        }
        report = down(tmp_path, grace=(2.0, 2.0))
        assert report["broker"] == "not running"
        outcomes = {r["name"]: r["outcome"] for r in report["services"]}
        assert outcomes == {resident.name: "SIGINT", lazy.name: "SIGINT", "recycled": "recycled"}
        assert fake_processes({resident.name, lazy.name}) == {}
        assert bystander.poll() is None  # untouched
        assert not (tmp_path / "broker.json").exists() and not list((tmp_path / "pids").glob("*.json"))
        # The ordinary path: a live broker is asked to shut down.
        spawn(plan, {s.name: s for s in (resident, lazy)}, tmp_path)
        assert set(fake_processes({resident.name, lazy.name})) == {resident.name}
        assert down(tmp_path)["broker"] == "shutdown"
        assert fake_processes({resident.name, lazy.name}) == {} and read_state(tmp_path) is None
    finally:
        bystander.kill()
        bystander.wait()
        down(tmp_path, grace=(0.5, 0.5))


def test_the_kinematics_service_behind_the_broker(make_broker, tmp_path: Path) -> None:
    manifest = load_model(ServiceManifest, REPO / "services" / "kinematics.toml")
    port = free_port()
    where = ServicePlacement("kinematics", "resident", None, port, f"http://127.0.0.1:{port}")
    # Until the store realizes its environment, the project's interpreter stands in for {python}.
    spec = launch_spec(
        "kinematics",
        manifest,
        where,
        python=Path(PY),
        weights=REPO / "services" / "assets",
        cwd=REPO,
        state_dir=tmp_path,
    )
    broker, client = make_broker([where], [spec])
    assert broker.start() == {"kinematics": None}
    with client.use("kinematics") as lease:
        request = urllib.request.Request(
            lease.url + "/fk",
            data=json.dumps({"joints": [0.0] * 7}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
    assert len(answer["position"]) == 3 and isinstance(answer["within_limits"], bool)
    row = service_status(broker, "kinematics")
    env = psutil.Process(row["pid"]).environ()
    assert "VIRTUAL_ENV" not in env and "PYTHONPATH" not in env and env["CUDA_VISIBLE_DEVICES"] == ""
    assert "kinematics: serving" in spec.log_path.read_text()


def test_every_lease_carries_the_rendered_client_table(make_broker, tmp_path: Path) -> None:
    """The manifest's client table reaches callers: filled as the command is at launch for a
    service harness runs, from its url alone for an external one, through the JSON a
    detached broker reads its specs and plan from."""
    text = (REPO / "services" / "kinematics.toml").read_text()
    table = 'client = { url = "{url}/v1", port = "{port}", python = "{python}", robot = "{weights}/arm7/arm7.json" }'
    (tmp_path / "kinematics.toml").write_text(text.replace('client = { url = "{url}" }', table))
    manifest = load_model(ServiceManifest, tmp_path / "kinematics.toml")
    remote = validate_data(ServiceManifest, {**manifest.model_dump(), "client": {"url": "{url}", "kind": "fk"}}, "r")
    port = free_port()
    services = {"kinematics": {"port": port}, "remote": {"mode": "external", "url": "http://10.1.2.3:9000"}}
    deploy = Deploy.model_validate({"services": services})
    planned = plan_from_json(place({"kinematics": manifest, "remote": remote}, deploy, ()).as_json())
    spec = launch_spec(
        "kinematics",
        manifest,
        planned.service("kinematics"),
        python=Path(PY),
        weights=REPO / "services" / "assets",
        cwd=REPO,
        state_dir=tmp_path,
    )
    [spec] = specs_from_json(specs_to_json({"kinematics": spec})).values()
    broker, client = make_broker(list(planned.services), [spec])
    with client.use("kinematics") as lease:
        assert lease.client == {
            "port": str(port),
            "python": PY,
            "robot": f"{REPO}/services/assets/arm7/arm7.json",
            "url": f"http://127.0.0.1:{port}/v1",
        }
        assert get(lease.url + "/health")["status"] == "ok"
    with client.use("remote") as lease:
        assert lease.client == {"kind": "fk", "url": "http://10.1.2.3:9000"}
    # A client template with no value at launch names the service and the key.
    bare = validate_data(ServiceManifest, {**manifest.model_dump(), "command": ["{python}", "-V"]}, "b")
    with pytest.raises(LaunchError, match=r"kinematics: client\.robot: \{weights\} .* has no value"):
        launch_spec(
            "kinematics",
            bare,
            planned.service("kinematics"),
            python=Path(PY),
            weights=None,
            cwd=REPO,
            state_dir=tmp_path,
        )


def test_a_lease_held_by_a_client_that_died_is_released(make_broker, tmp_path: Path) -> None:
    a, b = (fake(f"{tmp_path.name}-{x}", tmp_path) for x in "ab")
    broker, client = make_broker([placement(s, swap="g") for s in (a, b)], [a, b])
    script = (
        "import os, sys; from harness.client import Client; "
        "Client(sys.argv[1]).acquire(sys.argv[2]); os._exit(0)"
    )  # exits holding the lease
    subprocess.run(
        [PY, "-c", script, client.address, a.name],
        check=True,
        cwd=REPO,
        timeout=30,
        env={**os.environ, "HARNESS_BROKER_TOKEN": broker.token},
    )
    assert service_status(broker, a.name)["leases"] == 1
    with client.use(b.name, timeout=10) as lease:  # a is evictable once its lease is reaped
        assert lease.fresh
    assert service_status(broker, a.name)["state"] == "stopped"


def test_the_client_needs_only_the_standard_library(tmp_path: Path) -> None:
    light = subprocess.run(
        [
            PY,
            "-c",
            (
                "import sys, harness.client; heavy = {'psutil', 'pydantic', 'click', 'rich'} & set(sys.modules); "
                "print(sorted(heavy))"
            ),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert light.stdout.strip() == "[]"
    # Copied alone, outside the package, into an interpreter without site-packages.
    (tmp_path / "harness_client.py").write_text((REPO / "harness" / "client.py").read_text())
    alone = subprocess.run(
        [
            PY,
            "-S",
            "-c",
            ("import harness_client as c; print(c.BrokerError.__mro__[1].__name__); c.Client('http://127.0.0.1:9')"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.strip() == "Exception"


def test_the_http_protocol_without_the_client(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-raw", tmp_path)
    off = ServicePlacement("off-one", "off", None, None, None)
    broker, client = make_broker([placement(spec), off], [spec])

    def post(path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            client.address + path,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {broker.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    code, lease = post("/acquire", json.dumps({"service": spec.name, "client": "curl"}).encode())
    assert code == 200 and set(lease) == {
        "lease",
        "service",
        "url",
        "fresh",
        "incarnation",
        "scoped",
        "foreign",
        "client",
    }
    assert lease["client"] == {}  # a spec with no client table
    assert post("/release", json.dumps({"lease": lease["lease"]}).encode()) == (200, {"released": lease["lease"]})
    code, body = post("/release", json.dumps({"lease": lease["lease"]}).encode())
    assert code == 404 and body["code"] == "unknown_lease"
    code, body = post("/acquire", json.dumps({"service": "off-one"}).encode())
    assert code == 409 and body["code"] == "off" and "off" in body["error"]
    assert post("/acquire", b"not json")[0] == 400
    assert get(client.address + "/health")["status"] == "ok"
    assert {s["name"] for s in client.status()["services"]} == {spec.name, "off-one"}


def test_start_refuses_while_an_earlier_brokers_services_run(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-left", tmp_path)
    proc = supervisor.start(spec, tmp_path)  # as a broker killed earlier would have left it
    try:
        supervisor.wait_healthy(spec, proc)
        broker, _ = make_broker([placement(spec, mode="resident")], [spec])
        with pytest.raises(HarnessError, match=r"still running: .*-left \(pid") as info:
            broker.start()
        assert info.value.hint == "harness down"
    finally:
        supervisor.stop(proc.pid, proc=proc)
        supervisor.remove_pidfile(tmp_path, spec.name)


# ------------------------------------------------------------------------- authentication


def raw_request(
    address: str, method: str, path: str, *, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    """One request exactly as given (headers unchecked by the client library); status and JSON."""
    import http.client

    host, port = address.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = dict(headers or {})
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        if body is not None and "Content-Length" not in headers:
            headers["Content-Length"] = str(len(body))
        for key, value in headers.items():
            conn.putheader(key, value)
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_broker_answers_only_with_its_token_and_never_to_a_web_page(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-auth", tmp_path)
    broker, client = make_broker([placement(spec)], [spec])
    token_file = tmp_path / "broker.token"
    assert token_file.read_text().strip() == broker.token and len(broker.token) >= 32
    assert token_file.stat().st_mode & 0o777 == 0o600
    port = client.address.rsplit(":", 1)[1]
    acquire = json.dumps({"service": spec.name, "client": "intruder"}).encode()
    good = f"Bearer {broker.token}"
    attempts = [
        ("GET", "/status", {}, None, 401),
        ("POST", "/acquire", {}, acquire, 401),
        ("POST", "/acquire", {"Authorization": "Bearer " + "0" * len(broker.token)}, acquire, 401),
        ("POST", "/acquire", {"Authorization": broker.token}, acquire, 401),  # not the Bearer scheme
        ("POST", "/shutdown", {"Authorization": "Bearer nope"}, b"{}", 401),
        # A web page: its requests carry an Origin (and cannot carry the token anyway).
        ("POST", "/acquire", {"Authorization": good, "Origin": "http://evil.example"}, acquire, 403),
        ("POST", "/shutdown", {"Authorization": good, "Origin": "null"}, b"{}", 403),
        # DNS rebinding: a page's own name resolved to 127.0.0.1 arrives as its Host.
        ("POST", "/shutdown", {"Authorization": good, "Host": f"evil.example:{port}"}, b"{}", 403),
        ("GET", "/status", {"Authorization": good, "Host": "127.0.0.1"}, None, 403),
    ]
    for method, path, headers, body, expected in attempts:
        status, answer = raw_request(client.address, method, path, headers=headers, body=body)
        assert status == expected, (method, path, headers, answer)
        assert answer["code"] == ("unauthorized" if expected == 401 else "forbidden")
    # Nothing changed: no service started, no lease, the broker still serves its owner.
    row = service_status(broker, spec.name)
    assert row["state"] == "stopped" and row["starts"] == 0 and row["leases"] == 0
    assert fake_processes({spec.name}) == {} and not broker.status()["broker"]["closing"]
    assert raw_request(client.address, "GET", "/health")[0] == 200  # readiness needs no secret
    with pytest.raises(ServiceFailed.__mro__[1]) as refused:  # BrokerError, as NotAuthorized
        Client(client.address).status()
    assert refused.value.status == 401 and "found no token" in str(refused.value)
    assert Client(state_dir=tmp_path).status()["broker"]["url"] == client.address  # the owner's client reads it


def test_malformed_requests_get_400_never_500(make_broker, tmp_path: Path) -> None:
    spec = fake(f"{tmp_path.name}-bad-input", tmp_path)
    broker, client = make_broker([placement(spec)], [spec])
    auth = {"Authorization": f"Bearer {broker.token}"}

    def acquire(fields: dict[str, Any]) -> bytes:
        return json.dumps({"service": spec.name, **fields}).encode()

    cases: list[tuple[str, dict[str, str], bytes]] = [
        ("/acquire", {"Content-Length": "abc"}, b"{}"),
        ("/acquire", {"Content-Length": "-5"}, b"{}"),
        ("/acquire", {"Content-Length": "1_0"}, b"{}"),
        ("/acquire", {}, b"not json"),
        ("/acquire", {}, b"\xff\xfe"),
        ("/acquire", {}, b"[1, 2]"),
        ("/acquire", {}, b"[" * 100000),
        ("/acquire", {}, acquire({"pid": -1})),
        ("/acquire", {}, acquire({"pid": 0})),
        ("/acquire", {}, acquire({"pid": "123"})),
        ("/acquire", {}, acquire({"pid": True})),
        ("/acquire", {}, acquire({"pid": 2**70})),
        ("/acquire", {}, acquire({"timeout": -1})),
        ("/acquire", {}, acquire({"timeout": "soon"})),
        ("/acquire", {}, acquire({"client": 7})),
        ("/acquire", {}, json.dumps({"service": 5}).encode()),
        ("/release", {}, json.dumps({"lease": ["x"]}).encode()),
    ]
    for path, headers, body in cases:
        status, answer = raw_request(client.address, "POST", path, headers={**auth, **headers}, body=body)
        assert status == 400, (path, headers, body[:40], answer)
        assert answer["code"] == "bad_request" and answer["error"]
    # Too large: refused from the headers alone, before a byte of the body is read. (Sending
    # the 2 MiB body raced the refusal: the broker closes, and the sender saw a broken pipe.)
    with socket.create_connection(("127.0.0.1", int(client.address.rsplit(":", 1)[1])), timeout=30) as sock:
        sock.sendall(
            f"POST /acquire HTTP/1.1\r\nHost: {client.address.removeprefix('http://')}\r\n"
            f"Authorization: Bearer {broker.token}\r\nContent-Length: {2 << 20}\r\n\r\n".encode()
        )
        head = sock.makefile("rb").read().decode(errors="replace")
    assert head.startswith("HTTP/1.1 413") and '"bad_request"' in head, head

    # A body shorter than its Content-Length (the caller hung up halfway).
    def truncated(host: str) -> str:
        with socket.create_connection(("127.0.0.1", int(client.address.rsplit(":", 1)[1])), timeout=30) as sock:
            sock.sendall(
                f"POST /acquire HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {broker.token}\r\n"
                'Content-Length: 100\r\n\r\n{"service"'.encode()
            )
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    assert truncated("127.0.0.1").startswith("HTTP/1.1 403")  # Host without the port: refused first
    reply = truncated(client.address.removeprefix("http://"))
    assert reply.startswith("HTTP/1.1 400") and "ended after 10 of 100 bytes" in reply
    # Nothing was started by any of it, and a well-formed request still works.
    assert service_status(broker, spec.name)["starts"] == 0
    with client.use(spec.name) as lease:
        assert lease.incarnation == 1


OTHER_USER = "harness-broker-other"


def other_user() -> str:
    """A local user who is not us (created once, no home, no shell): another member of the machine."""
    import pwd

    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER], check=True)
    return OTHER_USER


@pytest.mark.root
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/sbin/useradd").exists(), reason="creates another user (needs root and useradd)"
)
def test_another_local_user_cannot_use_or_stop_the_broker(tmp_path: Path) -> None:
    import shutil
    import tempfile

    other_user()
    state = Path(tempfile.mkdtemp(prefix="harness-auth-", dir="/tmp"))
    spec = fake(f"{state.name}-svc", state)
    broker = Broker(Plan((placement(spec),)), {spec.name: spec}, state, tick=0.05, grace=(2.0, 2.0))
    try:
        address = broker.serve_in_thread()
        assert state.stat().st_mode & 0o077 == 0  # harness keeps its state folder to itself ...
        # ... but one the other user can look into (as a shared /srv or home folder would be)
        # still keeps the secret: every file in it is its owner's only.
        state.chmod(0o755)
        probe = r"""
import json, sys, urllib.request, urllib.error
state, address, service = sys.argv[1:4]
try:
    open(state + "/broker.token").read()
    print("read-token")
except PermissionError:
    print("token-unreadable")
try:
    print("url", json.load(open(state + "/broker.json"))["url"] == address)
except PermissionError:
    print("state-unreadable")
for method, path, body in (("GET", "/status", None), ("POST", "/shutdown", b"{}"),
                           ("POST", "/acquire", json.dumps({"service": service}).encode())):
    request = urllib.request.Request(address + path, data=body, method=method,
                                     headers={"Authorization": "Bearer guessed"})
    try:
        urllib.request.urlopen(request, timeout=10)
        print(path, 200)
    except urllib.error.HTTPError as exc:
        print(path, exc.code)
"""
        runnable = [
            p
            for p in ("/usr/bin/python3", sys.executable, shutil.which("python3"))
            if p
            and subprocess.run(
                ["runuser", "-u", OTHER_USER, "--", p, "-c", "pass"], capture_output=True, check=False
            ).returncode
            == 0
        ]
        if not runnable:
            pytest.skip(f"no Python that {OTHER_USER} may run")
        python = runnable[0]
        result = subprocess.run(
            ["runuser", "-u", OTHER_USER, "--", python, "-I", "-c", probe, str(state), address, spec.name],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("\n")[:5] == [
            "token-unreadable",
            "state-unreadable",
            "/status 401",
            "/shutdown 401",
            "/acquire 401",
        ], result.stdout
        row = service_status(broker, spec.name)
        assert row["state"] == "stopped" and row["starts"] == 0 and not broker.status()["broker"]["closing"]
        assert fake_processes({spec.name}) == {}
    finally:
        broker.shutdown()
        shutil.rmtree(state, ignore_errors=True)


# ---------------------------------------------------------------- lease limits, GPU memory


def test_a_lease_held_past_its_limit_is_reclaimed_and_its_holder_told(make_broker, tmp_path: Path) -> None:
    from harness.client import LeaseExpired

    a, b = (fake(f"{tmp_path.name}-{x}", tmp_path) for x in "ab")
    broker, client = make_broker([placement(s, swap="g") for s in (a, b)], [a, b], lease_seconds=0.5)
    forgotten = client.acquire(a.name)  # a caller that hangs, holding its lease
    with client.use(b.name, timeout=30) as lease:  # the group moves on once it is reclaimed
        assert lease.incarnation == 1
    assert service_status(broker, a.name)["state"] == "stopped"
    with pytest.raises(LeaseExpired, match=r"reclaimed: held [0-9.]+ s, longer than the broker's lease limit") as info:
        client.release(forgotten)
    assert info.value.status == 410 and info.value.code == "lease_expired"


class FakeInventory:
    """GPU free memory as a test sets it: NVML's answer, injected."""

    def __init__(self, free_gb: float) -> None:
        self.free_gb = free_gb
        self.calls = 0

    def __call__(self, index: int) -> float | None:
        assert index == 0
        self.calls += 1
        return self.free_gb


def test_after_a_swap_the_next_member_waits_for_gpu_memory(make_broker, tmp_path: Path) -> None:
    a, b = (fake(f"{tmp_path.name}-{x}", tmp_path) for x in "ab")
    inventory = FakeInventory(free_gb=2.0)
    broker, client = make_broker(
        [placement(s, swap="g", vram_gb=6.0) for s in (a, b)], [a, b], gpu_free=inventory, gpu_wait_seconds=60.0
    )
    with client.use(a.name):
        pass
    assert inventory.calls == 0  # a first start waits for nothing: the planner made room
    result: list[Lease] = []
    thread = threading.Thread(target=lambda: result.append(client.acquire(b.name)))
    thread.start()
    wait_until(lambda: inventory.calls >= 3, what="the broker asking for free memory")
    # a is gone, b not started: the driver has not released a's memory yet.
    assert fake_processes({a.name, b.name}) == {} and service_status(broker, b.name)["state"] == "starting"
    inventory.free_gb = 8.0
    thread.join(30)
    assert result and result[0].incarnation == 1
    client.release(result[0])
    # Memory that never comes back: a clear error after the limit, naming GPU and sizes.
    broker.gpu_wait_seconds = 0.2
    inventory.free_gb = 1.5
    with pytest.raises(ServiceFailed, match=r"GPU 0 has 1.5 GB free after the swap and .*-a needs 6 GB") as info:
        client.acquire(a.name)
    assert info.value.code == "start_failed" and fake_processes({a.name}) == {}


def test_a_crashed_resident_comes_back_without_a_caller(make_broker, tmp_path: Path) -> None:
    """Residents stay up: one killed from outside is started again after its backoff, with
    nobody asking for it."""
    spec = fake(f"{tmp_path.name}-kin", tmp_path)
    broker, _ = make_broker([placement(spec, mode="resident")], [spec], restart_backoff=(0.2, 1.0))
    assert broker.start() == {spec.name: None}
    first = service_status(broker, spec.name)["pid"]
    os.kill(first, signal.SIGKILL)

    def restarted() -> bool:
        # one snapshot: two reads could see the old process still "ready", then the new
        # one's pid while it is only "starting"
        row = service_status(broker, spec.name)
        return row["state"] == "ready" and row["pid"] != first

    wait_until(
        restarted,
        timeout=15,
        what="the resident to be restarted",
    )
    row = service_status(broker, spec.name)
    assert row["crashes"] == 1 and row["restarts"] == 1 and row["incarnation"] == 2


def test_a_hung_resident_fails_its_health_checks_and_is_replaced(make_broker, tmp_path: Path) -> None:
    """A process that still runs but no longer answers (SIGSTOP) fails its health checks in a
    row; it is stopped as a crash and started again."""
    spec = fake(f"{tmp_path.name}-hung", tmp_path)
    broker, _ = make_broker(
        [placement(spec, mode="resident")],
        [spec],
        restart_backoff=(0.2, 1.0),
        health_interval=0.2,
        health_failures=3,
        grace=(0.5, 0.5),
    )
    assert broker.start() == {spec.name: None}
    hung = service_status(broker, spec.name)["pid"]
    os.kill(hung, signal.SIGSTOP)
    try:

        def replaced() -> bool:
            row = service_status(broker, spec.name)  # one snapshot, as above
            return row["pid"] not in (hung, None) and row["state"] == "ready"

        wait_until(
            replaced,
            timeout=30,
            what="the hung resident to be replaced",
        )
    finally:
        if psutil.pid_exists(hung):
            os.kill(hung, signal.SIGCONT)
    row = service_status(broker, spec.name)
    assert row["crashes"] == 1 and "health checks in a row" in row["last_error"]
    assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE


# ------------------------------------------------------------------- metrics and events


def read_events(address: str, token: str, since: int | None, count: int) -> list[dict[str, Any]]:
    """The first ``count`` events of ``GET /events`` (server-sent events), each checked to
    carry its number as the ``id`` and its kind as the ``event``."""
    query = "" if since is None else f"?since={since}"
    request = urllib.request.Request(address + "/events" + query, headers={"Authorization": f"Bearer {token}"})
    events: list[dict[str, Any]] = []
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        fields: dict[str, str] = {}
        while len(events) < count:
            line = response.readline().decode()
            assert line, "the stream ended"
            line = line.rstrip("\n")
            if line.startswith(":"):
                continue
            if line:
                key, _, val = line.partition(": ")
                fields[key] = val
                continue
            if not fields:
                continue  # the blank line after a comment: no event
            event = json.loads(fields["data"])
            assert fields["id"] == str(event["seq"]) and fields["event"] == event["event"]
            events.append(event)
            fields = {}
    return events


def test_metrics_and_events_of_a_real_broker(make_broker, tmp_path: Path) -> None:
    from tests.test_metrics import parse, value

    spec = fake(f"{tmp_path.name}-obs", tmp_path, load=0.3)
    broker, _ = make_broker([placement(spec)], [spec])
    client = Client(broker.address, token=broker.token, client_id="watcher")
    began = time.time()
    lease = client.acquire(spec.name)
    time.sleep(0.2)
    client.release(lease)

    def scrape(token: str | None = broker.token) -> tuple[int, str, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(client.address + "/metrics", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers["Content-Type"], response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()

    code, kind, text = scrape()
    assert code == 200 and kind.startswith("text/plain; version=0.0.4")
    samples = parse(text)
    name = spec.name
    assert value(samples, "harness_service_starts_total", service=name) == 1
    assert value(samples, "harness_service_crashes_total", service=name) == 0
    assert value(samples, "harness_service_state", service=name, state="ready") == 1
    assert value(samples, "harness_service_leases", service=name) == 0
    assert value(samples, "harness_service_leases_total", service=name) == 1
    assert 0.3 <= value(samples, "harness_service_load_seconds", service=name) < 10
    # the lease waited for the load, and was held the 0.2 s slept
    assert value(samples, "harness_lease_wait_seconds_count", service=name) == 1
    assert value(samples, "harness_lease_wait_seconds_sum", service=name) >= 0.3
    assert value(samples, "harness_lease_hold_seconds_count", service=name) == 1
    assert 0.2 <= value(samples, "harness_lease_hold_seconds_sum", service=name) < 5
    assert value(samples, "harness_lease_hold_seconds_bucket", service=name, le="0.1") == 0
    assert value(samples, "harness_lease_hold_seconds_bucket", service=name, le="+Inf") == 1
    assert 0 < value(samples, "harness_broker_uptime_seconds") < 120
    assert scrape(None)[0] == 401 and scrape("wrong")[0] == 401  # like every endpoint but /health

    events = read_events(client.address, broker.token, None, 5)
    assert [(e["event"], e["service"]) for e in events] == [
        ("added", name),
        ("start", name),
        ("ready", name),
        ("lease", name),
        ("release", name),
    ]
    assert [e["seq"] for e in events] == [1, 2, 3, 4, 5]
    assert all(began - 5 <= e["time"] <= time.time() for e in events[1:])
    assert events[1]["reason"] == "caller" and events[3]["client"] == "watcher" and events[3]["lease"] == lease.id
    assert events[3]["pid"] == os.getpid() and events[4]["held_s"] >= 0.2
    # resuming: what came after event 4, then a decision made while the stream is open
    got: list[list[dict[str, Any]]] = []
    reader = threading.Thread(target=lambda: got.append(read_events(client.address, broker.token, 4, 3)))
    reader.start()
    time.sleep(0.2)  # the reader has the first two: the stop comes while it waits
    assert broker.stop_service(name) == "stopped"
    reader.join(15)
    assert got, "the stream did not deliver the stop"
    assert [(e["seq"], e["event"], e.get("reason")) for e in got[0]] == [
        (5, "release", None),
        (6, "stop", "down"),
        (7, "stopped", "down"),
    ]
    auth = {"Authorization": f"Bearer {broker.token}"}
    code, body = raw_request(client.address, "GET", "/events?since=x", headers=auth)
    assert code == 400 and "since" in body["error"]


def test_status_waits_for_the_brokers_start_when_asked(make_broker, tmp_path: Path) -> None:
    """``GET /status?ready=S`` (what spawn waits with) answers as the broker's start ends,
    with the service up; at once once it is; a bad S is refused."""
    spec = fake(f"{tmp_path.name}-rdy", tmp_path, load=0.4)
    broker, _ = make_broker([placement(spec, mode="resident")], [spec])
    auth = {"Authorization": f"Bearer {broker.token}"}
    assert broker.status()["broker"]["up"] == "idle"
    starter = threading.Thread(target=lambda: time.sleep(0.3) or broker.start())
    began = time.monotonic()
    starter.start()
    code, body = raw_request(broker.address, "GET", "/status?ready=60", headers=auth)
    waited = time.monotonic() - began
    starter.join(30)
    assert code == 200 and body["broker"]["up"] == "ready", body
    assert service_status(broker, spec.name)["state"] == "ready"
    assert 0.3 <= waited < 30  # it waited for the start (0.3 s before it, 0.4 s of load), not the 60 s
    code, body = raw_request(broker.address, "GET", "/status", headers=auth)
    assert code == 200 and body["broker"]["up"] == "ready"
    for bad in ("x", "-1", "3601", "1e3"):
        code, body = raw_request(broker.address, "GET", f"/status?ready={bad}", headers=auth)
        assert code == 400 and "ready" in body["error"], (bad, body)


def test_the_broker_log_records_every_decision_with_its_reason(tmp_path: Path) -> None:
    resident = fake(f"{tmp_path.name}-res", tmp_path)
    lazy = fake(f"{tmp_path.name}-lazy", tmp_path)
    plan = Plan(
        (
            placement(resident, mode="resident"),
            placement(lazy, swap="g"),
            placement(resident_peer := fake(f"{tmp_path.name}-peer", tmp_path), swap="g"),
        )
    )
    try:
        spawn(plan, {s.name: s for s in (resident, lazy, resident_peer)}, tmp_path, options={"tick": 0.05})
        client = Client(state_dir=tmp_path, client_id="logged")
        with client.use(lazy.name):
            pass
        with client.use(resident_peer.name):  # lazy is swapped out for it
            pass
        assert down(tmp_path)["broker"] == "shutdown"
    finally:
        down(tmp_path, grace=(0.5, 0.5))
    lines = (tmp_path / "logs" / "broker.log").read_text().splitlines()
    matches = [re.fullmatch(r"broker: (\S+Z) #(\d+) (\S+) (\S+)(.*)", line) for line in lines]
    decisions = [m.groups() for m in matches if m]
    seen = [
        (kind, name, m.group(1) if (m := re.search(r"reason=(\S+)", rest)) else None)
        for _, _, kind, name, rest in decisions
    ]
    assert ("start", resident.name, "caller") in seen and ("ready", resident.name, None) in seen
    swap = seen.index(("stop", lazy.name, "swap"))
    assert seen[swap + 1 : swap + 3] == [("stopped", lazy.name, "swap"), ("start", resident_peer.name, "caller")]
    assert ("stop", resident.name, "shutdown") in seen and ("stop", resident_peer.name, "shutdown") in seen
    leases = [rest for _, _, kind, _, rest in decisions if kind == "lease"]
    assert len(leases) == 3 and all("client=logged" in rest for rest in leases[1:])
    numbers = [int(number) for _, number, *_ in decisions]
    assert numbers == list(range(1, len(numbers) + 1))  # one line per event, none left out


def test_a_node_broker_ends_itself_once_no_run_is_joined(tmp_path: Path) -> None:
    """``exit_unjoined`` (a cluster node's broker, shared by one run's shards): it stays while
    a run is joined, ends itself that long after the last one ended, and from the moment it
    decides, a run that comes to join is refused (it starts another) rather than joined to a
    broker about to stop."""
    from harness.runtime.scheduling import BrokerError as Refused

    broker = Broker(Plan(services=()), {}, tmp_path / "state", tick=0.02, exit_unjoined=0.3)
    try:
        broker.serve_in_thread()
        broker.start()
        broker.register_run("shard 0", os.getpid())
        time.sleep(1.5)  # past exit_unjoined and a slow housekeeping round: a joined run keeps it
        assert not broker.wait_closed(0)
        broker.end_run("shard 0")
        assert broker.wait_closed(10), "it ended itself once no run was joined"
        with pytest.raises(Refused) as refused:
            broker.register_run("shard 1", os.getpid())
        assert refused.value.status == 503
    finally:
        broker.shutdown()


def test_a_run_joins_a_new_broker_of_its_folder_with_the_token_its_command_holds(tmp_path: Path) -> None:
    """A cluster node's broker that went away is started again on the same port, and each
    shard joins it again with the token its command already holds (``POST /runs`` with
    ``token``): the command's address and token answer again. A malformed token is refused."""
    from harness.runtime.broker import SharedBroker

    state, port = tmp_path / "state", free_port()
    first = Broker(Plan(services=()), {}, state, port=port)
    try:
        first.serve_in_thread()
        shared = SharedBroker.find(state)
        assert shared is not None
        token = shared.join_run("shard 1", os.getpid())["HARNESS_BROKER_TOKEN"]
    finally:
        first.shutdown()
    with pytest.raises(BrokerError):  # the broker is gone: the command's calls fail meanwhile
        Client(address=shared.url, token=token).acquire("kinematics")
    second = Broker(Plan(services=()), {}, state, port=port)
    try:
        second.serve_in_thread()
        again = SharedBroker.find(state)
        assert again is not None and again.url == shared.url and again.token != shared.token
        assert again.join_run("shard 1", os.getpid(), token) == {
            "HARNESS_BROKER": shared.url,
            "HARNESS_BROKER_TOKEN": token,
        }
        with pytest.raises(BrokerError) as unknown:  # authorized: the service is unknown, not the caller
            Client(address=shared.url, token=token).acquire("kinematics")
        assert unknown.value.status == 404
        with pytest.raises(HarnessError, match='"token" must be 32 to 200 URL-safe characters'):
            again.request("POST", "/runs", {"run": "shard 2", "token": "short"})
    finally:
        second.shutdown()


def test_the_client_waits_for_a_broker_started_again_at_its_address(tmp_path: Path) -> None:
    """``reconnect`` (``$HARNESS_BROKER_WAIT``, set for a cluster shard's command): a lease
    whose broker went away is released without an error, and an acquire while no broker
    answers waits for the one started again at the same address, which serves it (a fresh
    service process). Without it, the acquire fails at once."""
    from harness.runtime.broker import SharedBroker

    spec = fake(f"{tmp_path.name}-again", tmp_path, load=0)
    plan, state, port = Plan((placement(spec, mode="resident"),)), tmp_path / "state", free_port()
    first = Broker(plan, {spec.name: spec}, state, port=port, tick=0.05, grace=(1.0, 1.0))
    first.serve_in_thread()
    first.start()
    shared = SharedBroker.find(state)
    assert shared is not None
    token = shared.join_run("shard 1", os.getpid())["HARNESS_BROKER_TOKEN"]
    client = Client(shared.url, token=token, reconnect=30)
    lease = client.acquire(spec.name)
    first.shutdown()
    client.release(lease)  # gone with its broker: not an error
    with pytest.raises(BrokerError):
        Client(shared.url, token=token).acquire(spec.name)
    second = Broker(plan, {spec.name: spec}, state, port=port, tick=0.05, grace=(1.0, 1.0))

    def start_again() -> None:
        time.sleep(1.0)
        second.serve_in_thread()
        time.sleep(0.8)  # serving, the run not joined again yet: its token is refused meanwhile
        again = SharedBroker.find(state)
        assert again is not None
        again.join_run("shard 1", os.getpid(), token)

    later = threading.Thread(target=start_again)
    try:
        later.start()
        waited = time.monotonic()
        with client.use(spec.name) as fresh:
            assert fresh.fresh and fresh.url == lease.url and time.monotonic() - waited >= 1.7
        later.join()
        stranger = Client(shared.url, token="x" * 43, reconnect=30)  # never granted: refused at once
        waited = time.monotonic()
        with pytest.raises(NotAuthorized):
            stranger.acquire(spec.name)
        assert time.monotonic() - waited < 5
    finally:
        later.join()
        second.shutdown()


# ------------------------------------------------------------------ a broker parked ahead


def _parked_waiting(parked: Parked, seconds: float = 1.0) -> None:
    """Give the parked process time to import and reach its wait; it must still be there,
    serving nothing: no port of its own, no broker.json, no service."""
    time.sleep(seconds)
    assert parked.proc.poll() is None, (parked.state_dir / "logs" / "broker.log").read_text()
    assert [c for c in psutil.Process(parked.proc.pid).net_connections() if c.status == psutil.CONN_LISTEN] == []
    assert read_state(parked.state_dir) is None and not list((parked.state_dir / "pids").glob("*.json"))
    assert parked.marker.is_file()


def test_a_parked_broker_starts_nothing_until_spawn_hands_it_the_plan(tmp_path: Path) -> None:
    """A cluster shard parks its node's broker before it has checked its closure: the process
    serves nothing until ``spawn`` hands it the plan, then is the broker (its pid), and the
    services get exactly their environment, a secret the parked process lacks included."""
    resident = fake(f"{tmp_path.name}-res", tmp_path)
    resident = type(resident)(**{**resident.__dict__, "env": {**resident.env, "OPENAI_API_KEY": "sk-parked-secret"}})
    plan = Plan((placement(resident, mode="resident"),))
    parked = park(tmp_path)
    assert parked is not None
    try:
        _parked_waiting(parked)
        assert fake_processes({resident.name}) == {}
        current = spawn(plan, {resident.name: resident}, tmp_path, options={"tick": 0.05}, parked=parked)
        assert current["broker"]["spawned"] and current["broker"]["pid"] == parked.proc.pid
        assert [s["state"] for s in current["services"]] == ["ready"]
        assert not parked.marker.exists()
        pid = {row["name"]: row["pid"] for row in status(tmp_path)["services"]}[resident.name]
        environ = psutil.Process(pid).environ()
        assert environ.pop("HARNESS_BROKER") and environ.pop("HARNESS_BROKER_TOKEN")
        assert environ == dict(resident.env)
        assert "OPENAI_API_KEY" not in psutil.Process(parked.proc.pid).environ()
        assert park(tmp_path) is None  # a broker serves: nothing is parked beside it
    finally:
        down(tmp_path, grace=(0.5, 0.5))
    assert fake_processes({resident.name}) == {} and parked.proc.wait(10) == 0


def test_a_discarded_parked_broker_ends_having_started_nothing(tmp_path: Path) -> None:
    """A shard refused before it joins (a tampered node) discards what it parked."""
    parked = park(tmp_path)
    assert parked is not None
    _parked_waiting(parked, 0.3)
    parked.discard()
    assert parked.proc.returncode == 0
    assert not parked.marker.exists() and read_state(tmp_path) is None
    assert find_brokers(tmp_path) == [] and not list((tmp_path / "pids").glob("*.json"))
    assert "serving" not in (tmp_path / "logs" / "broker.log").read_text()


def test_a_stale_parked_marker_is_not_trusted_and_is_removed(tmp_path: Path) -> None:
    """A ``parked.<token>`` marker whose process is gone (the parked broker killed with
    SIGKILL), names another process under a reused pid, or was left by a caller killed
    before it started the process: the next ``park`` removes it and parks its own, rather
    than believe another shard will start the broker. A parked process whose caller dies
    (SIGKILL: its stdin closes) removes its own marker as it exits."""
    killed = park(tmp_path)
    assert killed is not None
    _parked_waiting(killed, 0.3)
    killed.proc.kill()
    killed.proc.wait(10)
    assert killed.marker.is_file() and stale_markers(tmp_path) == [killed.marker]
    me = psutil.Process()
    other = tmp_path / f"{PARKED_PREFIX}0123abcd"  # a live process, but not a parked broker
    other.write_text(json.dumps({"process": {"pid": me.pid, "create_time": me.create_time()}}))
    reused = tmp_path / f"{PARKED_PREFIX}4567cdef"  # our pid, another start time: a reused pid
    reused.write_text(json.dumps({"process": {"pid": me.pid, "create_time": me.create_time() - 100}}))
    orphan = tmp_path / f"{PARKED_PREFIX}89abcdef"  # its caller died before starting the process
    orphan.write_text(json.dumps({"caller": {"pid": killed.proc.pid, "create_time": 1.0}}))
    assert sorted(stale_markers(tmp_path)) == sorted([killed.marker, other, reused, orphan])
    fresh = park(tmp_path)
    assert fresh is not None, "a stale marker must not stop the next shard from parking"
    try:
        assert sorted(tmp_path.glob(f"{PARKED_PREFIX}*")) == [fresh.marker] and stale_markers(tmp_path) == []
    finally:
        fresh.discard()
    caller = subprocess.Popen(
        [sys.executable, "-c", PARK_AND_WAIT, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert caller.stdout is not None
    pid = int(caller.stdout.readline())
    caller.kill()
    caller.wait(10)
    deadline = time.time() + 30
    while psutil.pid_exists(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(pid), "a parked process whose caller died ends"
    assert not list(tmp_path.glob(f"{PARKED_PREFIX}*"))


#: Park a broker, say its pid, wait to be killed.
PARK_AND_WAIT = """
import sys, time
from pathlib import Path
from harness.runtime.parking import park
parked = park(Path(sys.argv[1]))
print(parked.proc.pid, flush=True)
time.sleep(120)
"""


def test_another_callers_spawn_starts_its_broker_beside_a_parked_one_which_then_joins_it(tmp_path: Path) -> None:
    """Two shards of a run reach a node at once: the second's ``spawn`` does not take the
    first's parked process for a stray broker, and the first, finding a broker serving,
    joins it and ends its parked process: one broker, one service start."""
    resident = fake(f"{tmp_path.name}-res", tmp_path)
    plan, specs = Plan((placement(resident, mode="resident"),)), {resident.name: resident}
    parked = park(tmp_path)
    assert parked is not None
    try:
        _parked_waiting(parked, 0.3)
        assert park(tmp_path) is None  # one parked per folder: a second would only be ended
        other = spawn(plan, specs, tmp_path, options={"tick": 0.05})
        assert other["broker"]["spawned"] and other["broker"]["pid"] != parked.proc.pid
        joined = spawn(plan, specs, tmp_path, parked=parked)
        assert not joined["broker"]["spawned"] and joined["broker"]["pid"] == other["broker"]["pid"]
        assert parked.proc.returncode == 0 and not parked.marker.exists()
        assert [len(p) for p in fake_processes({resident.name}).values()] == [1]
        # A process that was parked and never handed a plan, its marker gone, is a stray again.
        assert [p.pid for p in find_brokers(tmp_path)] == [other["broker"]["pid"]]
    finally:
        down(tmp_path, grace=(0.5, 0.5))


def test_a_node_broker_killed_under_a_joined_shard_starts_again_and_the_shard_records_its_lost_resets(
    tmp_path: Path,
) -> None:
    """A cluster shard joined to its node's broker (:mod:`harness.runs.nodebroker`) whose
    broker process is killed (on Slurm: cancelled with the task that started it): the shard's
    watch starts a new broker on the same URL, its command's token answers there, and the
    shard's record names the restart as an impurity: the scoped resets the old broker saw in
    its leases went with it, and the scoped service started again with its memory empty."""
    from types import SimpleNamespace

    from harness.runs.nodebroker import lost_resets
    from harness.runs.run import _RunBroker

    runs = tmp_path / "home" / "runs" / "run-1"
    state, run_dir = runs / "node", runs / "shards" / "0"
    run_dir.mkdir(parents=True)
    policy = fake(f"{tmp_path.name}-pol", state)
    prepared = SimpleNamespace(
        deploy=None, plan=Plan((placement(policy, mode="resident", scoped=True),)), specs={policy.name: policy}
    )
    broker = _RunBroker(None, node=state)
    url, env = broker.start(prepared, run_dir)  # type: ignore[arg-type]
    impurities: list[str] = []
    try:
        first = read_state(state)
        assert first is not None and first["url"] == url
        os.kill(int(first["pid"]), signal.SIGKILL)
        assert broker.watch is not None
        wait_until(lambda: broker.watch.restarts, timeout=90, what="the watch's restart")  # type: ignore[union-attr]
        client = Client(url, client_id="agent", token=env["HARNESS_BROKER_TOKEN"])
        with client.use(policy.name, timeout=60) as lease:
            assert lease.url == policy.url  # the command's address and token answer again, same port
    finally:
        impurities = broker.stop()
        down(state, grace=(0.5, 0.5))
    [restart] = broker.restarts
    assert restart["gone_pid"] == first["pid"] and restart["new_pid"] != first["pid"], restart
    assert "started by this shard, is gone" in restart["reason"], restart
    assert impurities == lost_resets(broker.restarts, [policy.name]) and len(impurities) == 1, impurities
    assert f"scoped resets of {policy.name} unknown until " in impurities[0], impurities
    assert f"the node's broker (pid {first['pid']})" in impurities[0], impurities
    # A run without a scoped service loses nothing when its node's broker starts again.
    assert lost_resets(broker.restarts, []) == []


def test_the_shard_that_started_its_nodes_broker_keeps_it_while_another_shard_is_joined(tmp_path: Path) -> None:
    """On Slurm, the task of the shard that started its node's broker must not end while other
    shards use that broker (a cgroup Slurm ends every process of a task with it). Its run
    over, :func:`hold_node_broker` hands the result over first, then waits while the broker's
    ``/status`` lists another joined shard, and ends once none is; SIGTERM (``scancel``)
    during the wait ends it at once. Each end leaves ``ended.json``, from which a shard that
    saw the broker go names the cause: a task that had finished, or one cancelled."""
    from types import SimpleNamespace

    from harness.runs.nodebroker import ENDED_FILE, broker_gone_cause, hold_node_broker
    from harness.runs.run import _RunBroker
    from harness.runtime.parking import process_identity

    runs = tmp_path / "home" / "runs" / "run-1"
    state, run_dir = runs / "node", runs / "shards" / "0"
    run_dir.mkdir(parents=True)
    service = fake(f"{tmp_path.name}-svc", state)
    prepared = SimpleNamespace(
        deploy=None, plan=Plan((placement(service, mode="resident"),)), specs={service.name: service}
    )
    starter = _RunBroker(None, node=state)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # shard 1's process
    handed: list[float] = []
    try:
        starter.start(prepared, run_dir)  # shard 0 starts the node's broker and joins it
        shared = starter.shared
        assert shared is not None
        shared.join_run("shard 1", other.pid)
        starter.stop()  # shard 0's run is over (its /runs/end); shard 1 is still joined
        left: list[float] = []

        def hand_over() -> None:  # the result goes to the head first; shard 1 ends a second later
            handed.append(time.time())

            def end() -> None:
                left.append(time.time())
                shared.end_run("shard 1")

            threading.Timer(1.0, end).start()

        held = hold_node_broker(state, "shard 0", os.getpid(), before=hand_over, poll=0.1)
        assert held["held_broker_for"] == ["shard 1"] and held["held_broker_s"] >= 1.0, held
        assert "held_broker_stopped" not in held and time.time() >= left[0]
        assert len(handed) == 1 and handed[0] < left[0], "the result is handed over before the wait"
        ended = json.loads((state / ENDED_FILE).read_text())
        assert ended["run"] == "shard 0" and ended["pid"] == os.getpid() and ended["finished"] is True, ended

        # A shard is joined again; scancel's SIGTERM ends the wait at once, and says so.
        shared.join_run("shard 1", other.pid)
        # Sent once the wait's handlers are in place (``before`` runs inside them).
        sigterm = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM))
        held = hold_node_broker(state, "shard 0", os.getpid(), before=sigterm.start, poll=0.1)
        assert held["held_broker_stopped"] == "SIGTERM", held  # else shard 1 would hold it for ever
        assert held["held_broker_for"] == ["shard 1"], held
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, "the handler before is restored"
        cut = json.loads((state / ENDED_FILE).read_text())
        assert cut["finished"] is False and cut["signal"] == "SIGTERM", cut
        # Not the starter (another shard, or another process under its name): nothing to keep.
        assert hold_node_broker(state, "shard 1", other.pid) == {}
        assert hold_node_broker(state, "shard 0", other.pid) == {}
    finally:
        down(state, grace=(0.5, 0.5))
        other.kill()
        other.wait()
    # The cause a shard joined to that broker records once it is gone (its starter is gone too).
    began_by = {"run": "shard 0", "pid": 999_999, "process": process_identity(999_999), "broker_pid": 42}
    finished = {**ended, "pid": 999_999, "broker_pid": 42}
    assert broker_gone_cause(42, began_by, "shard 1", finished) == (
        "the node's broker (pid 42), started by shard 0, ended with the task of shard 0, which had finished"
    )
    assert broker_gone_cause(42, began_by, "shard 1", {**cut, "pid": 999_999, "broker_pid": 42}) == (
        "the node's broker (pid 42), started by shard 0, was cancelled with it "
        "(SIGTERM while it kept the broker for other shards)"
    )
    # An earlier broker's marker, or none: cancelled with it, as before.
    assert broker_gone_cause(42, began_by, "shard 1", {**finished, "broker_pid": 41}).endswith("was cancelled with it")
    assert broker_gone_cause(42, began_by, "shard 1").endswith("was cancelled with it")


def test_still_joined_names_the_other_shards_once_each() -> None:
    from harness.runs.nodebroker import still_joined

    runs = [{"run": "shard 2", "pid": 1}, {"run": "shard 0", "pid": 2}, {"run": "shard 2", "pid": 3}, {"pid": 4}, "x"]
    assert still_joined(runs, "shard 0") == ["shard 2"]
    assert still_joined([{"run": "shard 0"}], "shard 0") == []
    assert still_joined(None, "shard 0") == []
