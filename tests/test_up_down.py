"""``harness up`` / ``status`` / ``down`` through the CLI, with real processes.

The service is a stand-in model (tests/services/fake_model.py) run from its realized store
environment; ``down`` must stop what harness started and nothing else, even after the
broker itself was killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.lock.lockfile import read
from harness.realize.standin import realized_lock
from harness.runtime.broker import find_brokers
from harness.runtime.session import default_state_dir
from harness.store.store import Store
from tests.conftest import run_harness_process
from tests.ports import free_port
from tests.test_runs import SERVICE, _project, _run, harness
from tests.upstreams import Upstreams, make_project

PORT = free_port()  # the service's port (tests/ports.py)


@pytest.fixture(scope="module")
def project(up: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = _project(tmp_path_factory.mktemp("updown"), "alpha==1.0", PORT)
    assert harness(project, up.home, "lock").returncode == 0
    return project


@pytest.fixture(scope="module")
def home(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One realized home for the module: each test brings its services down again."""
    home = tmp_path_factory.mktemp("home")
    assert harness(project, home, "realize").returncode == 0
    return home


def _status(project: Path, home: Path) -> dict:
    result = harness(project, home, "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _service(status: dict) -> dict:
    return next(s for s in status["services"] if s["name"] == "svc")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_up_status_down_from_the_store(project: Path, home: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        result = harness(project, home, "up", "--json")
        assert result.returncode == 0, result.stderr
        service = _service(_status(project, home))
        assert service["state"] == "ready" and service["mode"] == "resident"
        pid = service["pid"]
        lock = realized_lock(Store.in_home(home), read(project / "locks" / "svc.lock.toml"))  # a host copy here
        cmdline = " ".join(psutil.Process(pid).cmdline())
        assert str(home / "store" / lock.environment.store) in cmdline, "launched from the store"
        table = harness(project, home, "status")
        assert "svc" in table.stdout and "ready" in table.stdout
        down = harness(project, home, "down", "--json")
        assert down.returncode == 0, down.stderr
        deadline = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
        assert bystander.poll() is None, "down stops only what harness started"
    finally:
        bystander.kill()
        bystander.wait()
        harness(project, home, "down")


def test_down_after_the_broker_died(project: Path, home: Path) -> None:
    assert harness(project, home, "up").returncode == 0
    status = _status(project, home)
    broker_pid, service_pid = status["broker"]["pid"], _service(status)["pid"]
    os.kill(broker_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(broker_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(service_pid), "the service outlives its broker"
    without = _status(project, home)
    assert without["broker"] is None and without["services"][0]["name"] == "svc"
    result = harness(project, home, "down", "--json")
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 15
    while _alive(service_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(service_pid)


def test_a_port_taken_by_a_foreign_process_is_left_alone(project: Path, home: Path) -> None:
    foreign = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "services" / "fake_model.py"),
            "--name",
            "foreign",
            "--port",
            str(PORT),
        ]
    )
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", PORT)) == 0:
                    break
            time.sleep(0.1)
        assert harness(project, home, "up").returncode == 0
        service = _service(_status(project, home))
        assert service["foreign"] is True
        assert harness(project, home, "down").returncode == 0
        assert foreign.poll() is None, "a foreign process is never stopped"
    finally:
        foreign.kill()
        foreign.wait()
        harness(project, home, "down")


def _state_dir(project: Path, home: Path) -> Path:
    return default_state_dir(home, project, None)


def test_a_run_uses_the_services_of_harness_up(project: Path, home: Path) -> None:
    """One broker per state folder: a run joins `up`'s broker; its services are harness's own,
    launched from the store paths the run records, not a foreign impurity."""
    try:
        assert harness(project, home, "up").returncode == 0
        before = _service(_status(project, home))
        result, run_dir = _run(project, home)
        assert result.returncode == 0, result.stderr
        assert "using the broker of harness up" in result.stderr and "service answered svc" in result.stdout
        outcome = json.loads((run_dir / "result.json").read_text())
        assert not any("foreign" in i for i in outcome["impurities"]), outcome["impurities"]
        config = json.loads((run_dir / "config.json").read_text())
        assert config["broker"] == {"shared": True, "state_dir": str(_state_dir(project, home))}
        closure = {e["path"] for e in json.loads((run_dir / "lock.json").read_text())["store_paths"]}
        cmdline = psutil.Process(before["pid"]).cmdline()
        assert any(part.startswith(str(home / "store")) for part in cmdline)
        used = {
            Path(part).relative_to(home / "store").parts[0] for part in cmdline if part.startswith(str(home / "store"))
        }
        assert used <= closure, "the run records the store paths of the process that served it"
        after = _service(_status(project, home))
        assert after["pid"] == before["pid"] and after["starts"] == 1, "the run neither restarted nor stopped it"
        assert after["state"] == "ready"
    finally:
        harness(project, home, "down")


def test_a_run_does_not_join_a_broker_whose_leases_give_another_client_table(project: Path, home: Path) -> None:
    """The client table is read at launch, not locked: after an edit, ``up``'s broker would keep
    handing out the old table while the run's own variable has the new one, so the run refuses
    to join it and says why."""
    manifest = project / "services" / "svc.toml"
    original = manifest.read_text()
    try:
        assert harness(project, home, "up").returncode == 0
        manifest.write_text(original.replace('python = "{python}" }', 'python = "{python}", mode = "edited" }'))
        result = harness(project, home, "run", "--service", "svc", "--", sys.executable, "caller.py")
        assert result.returncode != 0
        assert "does not serve what this project would launch" in result.stderr
        assert "client table" in result.stderr and "'mode': 'edited'" in result.stderr
    finally:
        manifest.write_text(original)
        harness(project, home, "down")


def test_concurrent_ups_give_exactly_one_broker(project: Path, home: Path) -> None:
    state = _state_dir(project, home)
    try:
        args = [sys.executable, "-m", "harness", "--project", str(project), "--home", str(home), "up", "--json"]
        procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        outputs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outputs]
        brokers = {json.loads(out)["broker"]["pid"] for out, _ in outputs}
        assert len(brokers) == 1, "every up reports the one broker"
        assert [p.pid for p in find_brokers(state)] == list(brokers)
        status = _status(project, home)
        assert status["brokers"] == list(brokers) and _service(status)["starts"] == 1
        down = json.loads(harness(project, home, "down", "--json").stdout)
        assert down["brokers"] == list(brokers)
        assert find_brokers(state) == []
    finally:
        harness(project, home, "down")


def test_the_deploy_sets_the_brokers_limits(project: Path, home: Path, tmp_path: Path) -> None:
    deploy = tmp_path / "machine.toml"
    deploy.write_text("[broker]\nlease_seconds = 30\ngpu_wait_seconds = 5\n")
    try:
        result = harness(project, home, "--deploy", str(deploy), "up", "--json")
        assert result.returncode == 0, result.stderr
        broker = json.loads(result.stdout)["broker"]
        assert broker["lease_seconds"] == 30 and broker["gpu_wait_seconds"] == 5
        deploy.write_text("[broker]\nlease_secs = 30\n")
        bad = harness(project, home, "--deploy", str(deploy), "status")
        assert bad.returncode == 2 and "lease_secs" in bad.stderr
    finally:
        harness(project, home, "down")  # the same state folder: the deploy names none


def test_up_fails_when_a_service_crashes_on_start_and_shows_its_log(project: Path, home: Path) -> None:
    try:
        # The stand-in model reads FAKE_FAIL_LOAD from the environment harness passes on.
        result = run_harness_process(
            "--project", str(project), "--home", str(home), "up", env={"FAKE_FAIL_LOAD": "5"}, timeout=300
        )
        assert result.returncode == 1, result.stdout
        assert "1 service(s) did not start" in result.stderr and "svc" in result.stderr
        assert "exit code 5" in result.stderr
        assert "cannot load the weights: simulated failure" in result.stderr, "the log's last lines"
        assert "Traceback" not in result.stderr
    finally:
        harness(project, home, "down")


def test_up_refuses_a_port_held_by_a_process_that_does_not_answer(project: Path, home: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                f"s.bind(('127.0.0.1', {PORT})); s.listen(); time.sleep(300)"
            ),
        ]
    )
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", PORT)) == 0:
                    break
            time.sleep(0.1)
        result = harness(project, home, "up")
        assert result.returncode == 1
        assert f"port {PORT} is held by pid {holder.pid}" in result.stderr, result.stderr
        assert "does not answer" in result.stderr
        assert holder.poll() is None, "never signalled: harness did not start it"
    finally:
        holder.kill()
        holder.wait()
        harness(project, home, "down")


SWAP_DEPLOY = """
[services.policy]
mode = "on_demand"
swap = "g"

[services.seg]
mode = "on_demand"
swap = "g"
"""

#: Acquires the scoped policy, then its swap peer (which swaps the policy out), then the
#: policy again: the agent's memory in the policy is gone.
SWAPPING_CALLER = r"""
import json, os, urllib.request
def post(path, body):
    req = urllib.request.Request(os.environ["HARNESS_BROKER"] + path, data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json",
                                 "Authorization": "Bearer " + os.environ["HARNESS_BROKER_TOKEN"]})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())
for name in ("policy", "seg", "policy"):
    lease = post("/acquire", {"service": name, "client": "agent"})
    print(name, lease["incarnation"], lease["fresh"], flush=True)
    post("/release", {"lease": lease["lease"]})
"""


@pytest.fixture(scope="module")
def swap_project(up: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two services in one swap group, one of them a scoped policy (memory of past frames)."""
    root = tmp_path_factory.mktemp("swapping")
    policy = SERVICE.replace('"svc"', '"policy"') % (free_port(), "alpha==1.0")
    seg = SERVICE.replace('"svc"', '"seg"') % (free_port(), "alpha==1.0")
    project = make_project(
        root, {"policy": policy.replace("[environment]", "scoped = true\n\n[environment]"), "seg": seg}
    )
    servers = project / "services" / "servers"
    servers.mkdir()
    shutil.copy(Path(__file__).parent / "services" / "fake_model.py", servers / "fake_model.py")
    (project / "caller.py").write_text(SWAPPING_CALLER)
    (project / "swap.toml").write_text(SWAP_DEPLOY)
    assert harness(project, up.home, "lock").returncode == 0
    return project


def test_a_run_joining_ups_broker_records_its_scoped_resets(swap_project: Path, home: Path) -> None:
    """The daily workflow: `harness up`, then runs that join its broker. A swap that wipes the
    scoped policy's memory mid-run is in the run's record, and audit --strict fails on it."""
    project = swap_project
    deploy = ("--deploy", str(project / "swap.toml"))
    try:
        # The services run with the environment `up` gave them; the run records that one.
        started = run_harness_process(
            *("--project", str(project), "--home", str(home), *deploy, "up"), env={"TINY_FLAG": "up's"}, timeout=300
        )
        assert started.returncode == 0, started.stderr
        result = harness(
            project, home, *deploy, "run", "--service", "policy", "--service", "seg", "--", sys.executable, "caller.py"
        )
        assert result.returncode == 0, result.stderr
        assert "using the broker of harness up" in result.stderr
        assert result.stdout.split()[:9] == ["policy", "1", "True", "seg", "1", "True", "policy", "2", "True"]
        run_dir = home / "runs" / result.stderr.split("run ", 1)[1].split(":", 1)[0]
        launch = json.loads((run_dir / "config.json").read_text())["launch"]
        assert launch["services"]["policy"]["environment"]["TINY_FLAG"] == "up's"
        assert "TINY_FLAG" not in launch["command"]["environment"]
        [reset] = json.loads((run_dir / "result.json").read_text())["scoped_resets"]
        assert (reset["service"], reset["client"]) == ("policy", "agent")
        assert (reset["previous_incarnation"], reset["incarnation"]) == (1, 2)
        strict = harness(project, home, *deploy, "audit", "--strict", run_dir.name)
        assert strict.returncode != 0 and "scoped reset" in strict.stdout + strict.stderr
        status = _status_with(project, home, *deploy)
        assert status["broker"]["runs"] == [], "the run ended: its token answers no more"
        # The shared broker's events while the run was joined are the record's timeline.
        events = [json.loads(line) for line in (run_dir / "services" / "events.jsonl").read_text().splitlines()]
        assert any(e["event"] == "lease" and e["run"] == run_dir.name for e in events), events
        assert any(e["event"] == "scoped_reset" for e in events)
    finally:
        harness(project, home, *deploy, "down")


def test_two_instances_deploy_write_made_share_a_machine(project: Path, home: Path, tmp_path: Path) -> None:
    """Seed: several instances may share a machine. Each deploy `deploy write` makes has
    ports and a state folder of its own: both come up, and `down` of one stops only its own."""
    deploys = []
    for name in ("first", "second"):
        path = tmp_path / f"{name}.toml"
        result = harness(project, home, "deploy", "write", "-o", str(path), "--gpus", "none")
        assert result.returncode == 0, result.stderr
        deploys.append(("--deploy", str(path)))
    try:
        pids = []
        for deploy in deploys:
            result = harness(project, home, *deploy, "up")
            assert result.returncode == 0, result.stderr
            status = _status_with(project, home, *deploy)
            pids.append((status["broker"]["pid"], _service(status)["pid"], _service(status)["port"]))
        assert pids[0][2] != pids[1][2], "ports of its own"
        assert len({p[0] for p in pids}) == 2, "a broker each"
        down = harness(project, home, *deploys[0], "down", "--json")
        assert down.returncode == 0, down.stderr
        deadline = time.monotonic() + 15
        while (_alive(pids[0][0]) or _alive(pids[0][1])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pids[0][0]) and not _alive(pids[0][1])
        assert _alive(pids[1][0]) and _alive(pids[1][1]), "the other instance is untouched"
        assert _service(_status_with(project, home, *deploys[1]))["state"] == "ready"
    finally:
        for deploy in deploys:
            harness(project, home, *deploy, "down")


def test_up_name_adds_a_service_and_down_name_stops_only_it(swap_project: Path, home: Path) -> None:
    """Per-service control: `up NAME` beside a running broker adds NAME to it (it was
    refused: "harness down, then harness up"), `down NAME` stops NAME alone, the broker and
    the other service staying; a caller's acquire starts it again."""
    project = swap_project
    try:
        first = harness(project, home, "up", "policy", "--json")
        assert first.returncode == 0, first.stderr
        broker_pid = json.loads(first.stdout)["broker"]["pid"]
        added = harness(project, home, "up", "seg", "--json")
        assert added.returncode == 0, added.stderr
        status = json.loads(added.stdout)
        assert status["broker"]["pid"] == broker_pid and status["broker"]["spawned"] is False
        rows = {s["name"]: s for s in status["services"]}
        assert rows["policy"]["state"] == rows["seg"]["state"] == "ready"
        seg_pid, policy_pid = rows["seg"]["pid"], rows["policy"]["pid"]
        stopped = harness(project, home, "down", "seg")
        assert stopped.returncode == 0, stopped.stderr
        assert "broker: running" in stopped.stdout and "seg: stopped" in stopped.stdout
        deadline = time.monotonic() + 15
        while _alive(seg_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(seg_pid) and _alive(policy_pid) and _alive(broker_pid)
        rows = {s["name"]: s for s in _status_with(project, home)["services"]}
        assert (rows["seg"]["state"], rows["seg"]["stop_reason"]) == ("stopped", "down")
        assert rows["policy"]["state"] == "ready" and rows["policy"]["pid"] == policy_pid
        again = harness(project, home, "down", "seg", "--json")
        assert json.loads(again.stdout)["services"] == [{"name": "seg", "outcome": "not running"}]
        unknown = harness(project, home, "down", "nope")
        assert unknown.returncode != 0 and "serves no nope" in unknown.stderr
    finally:
        harness(project, home, "down")


def test_logs_shows_the_last_lines_and_follows_new_ones(project: Path, home: Path) -> None:
    try:
        assert harness(project, home, "up").returncode == 0
        every = harness(project, home, "logs")
        assert every.returncode == 0, every.stderr
        assert any(line.startswith("broker | broker: serving") for line in every.stdout.splitlines())
        assert any(line.startswith("svc    | svc: serving on") for line in every.stdout.splitlines())
        one = harness(project, home, "logs", "svc", "-n", "1")
        assert one.stdout.strip().startswith("svc: serving on"), "one log: no prefix, its last line"
        missing = harness(project, home, "logs", "nope")
        assert missing.returncode == 2 and "no log for nope" in missing.stderr and "svc" in missing.stderr
        args = ["--project", str(project), "--home", str(home), "logs", "-f", "svc", "-n", "0", "--interval", "0.05"]
        follower = subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(2.0)  # it has started following
            assert harness(project, home, "down", "svc").returncode == 0
            assert harness(project, home, "up", "svc").returncode == 0  # a new start writes new lines
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and follower.poll() is None:
                time.sleep(0.5)
                if len(_svc_log_starts(project, home)) >= 2:
                    break
            time.sleep(1.0)
            follower.send_signal(signal.SIGINT)
            out, _ = follower.communicate(timeout=15)
        finally:
            if follower.poll() is None:
                follower.kill()
        assert follower.returncode == 0
        assert "svc: serving on" in out and "=== harness: starting" in out, out
        assert "broker" not in out.split("\n", 1)[0], "only the log named"
    finally:
        harness(project, home, "down")


def test_status_watch_shows_changes_as_they_happen(project: Path, home: Path) -> None:
    try:
        assert harness(project, home, "up").returncode == 0
        args = ["--project", str(project), "--home", str(home), "status", "--watch", "--json", "--interval", "0.2"]
        watcher = subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE, text=True)
        try:
            assert watcher.stdout is not None
            first = json.loads(watcher.stdout.readline())
            assert _service(first)["state"] == "ready"
            assert harness(project, home, "down", "svc").returncode == 0
            deadline = time.monotonic() + 20
            seen = first
            while _service(seen)["state"] != "stopped" and time.monotonic() < deadline:
                seen = json.loads(watcher.stdout.readline())
            assert _service(seen)["state"] == "stopped" and seen["at"] > first["at"]
            watcher.send_signal(signal.SIGINT)
            watcher.communicate(timeout=15)
        finally:
            if watcher.poll() is None:
                watcher.kill()
        assert watcher.returncode == 0
        table = harness(project, home, "status", "--watch", "--gpus", "1x24")
        assert table.returncode == 2 and "give one of them" in table.stderr
    finally:
        harness(project, home, "down")


def _svc_log_starts(project: Path, home: Path) -> list[str]:
    log = _state_dir(project, home) / "logs" / "svc.log"
    return [line for line in log.read_text().splitlines() if "serving on" in line]


def test_a_failed_up_name_leaves_the_broker_as_it_found_it(swap_project: Path, home: Path) -> None:
    """`up NAME` that added NAME to a running broker and saw it fail takes it out again: the
    next `up NAME` launches it afresh (here: without the failure in its environment)."""
    project = swap_project
    try:
        assert harness(project, home, "up", "policy").returncode == 0
        failed = run_harness_process(
            "--project", str(project), "--home", str(home), "up", "seg", env={"FAKE_FAIL_LOAD": "5"}, timeout=300
        )
        assert failed.returncode == 1 and "exit code 5" in failed.stderr, failed.stderr
        assert "no longer serves seg" in failed.stderr
        status = _status_with(project, home)
        assert [s["name"] for s in status["services"]] == ["policy"]
        assert status["services"][0]["state"] == "ready"
        again = harness(project, home, "up", "seg", "--json")
        assert again.returncode == 0, again.stderr
        assert {s["name"]: s["state"] for s in json.loads(again.stdout)["services"]} == {
            "policy": "ready",
            "seg": "ready",
        }
    finally:
        harness(project, home, "down")


def _status_with(project: Path, home: Path, *args: str) -> dict:
    result = harness(project, home, *args, "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


assert SERVICE  # the manifest template shared with tests/test_runs.py


def test_harness_ui_logs_a_browser_in_to_up_s_broker_once(project: Path, home: Path) -> None:
    import urllib.error
    import urllib.request

    refused = harness(project, home, "ui")
    assert refused.returncode == 1 and "no broker serves" in refused.stderr and "harness up" in refused.stderr
    try:
        assert harness(project, home, "up").returncode == 0
        # A run of this home, with its report: the UI lists it (harness up told the broker where runs live).
        run, other = _run(project, home)
        assert run.returncode == 0, run.stderr
        assert harness(project, home, "report", other.name, "--no-audit").returncode == 0
        printed = harness(project, home, "ui")
        assert printed.returncode == 0, printed.stderr
        url = printed.stdout.strip()
        assert url.startswith("http://127.0.0.1:") and "/ui/login?code=" in url and "works once" in printed.stderr

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: object, **kwargs: object) -> None:
                return None

        opener = urllib.request.build_opener(NoRedirect)
        with pytest.raises(urllib.error.HTTPError) as login:
            opener.open(url, timeout=10)
        assert login.value.code == 303 and login.value.headers["Location"] == "/ui"
        cookie = login.value.headers["Set-Cookie"].split(";", 1)[0]
        with pytest.raises(urllib.error.HTTPError) as again:
            opener.open(url, timeout=10)
        assert again.value.code == 403, "the URL works once"
        base = url.split("/ui/", 1)[0]
        request = urllib.request.Request(f"{base}/ui/api/runs", headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=10) as response:
            runs = json.loads(response.read())["runs"]
        assert runs[0]["id"] == other.name and runs[0]["report"] is True
        request = urllib.request.Request(f"{base}/ui/api/logs?name=broker", headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert "ready svc" in json.loads(response.read())["text"]  # the detached broker's own log
    finally:
        harness(project, home, "down")
