"""A benchmark whose simulator runs elsewhere (issue 36): a task from The Simulator needs
only its client.

End to end on the repository's example (``benchmarks/reach-remote.toml``) with real
processes: the "remote" simulator is a stand-in on loopback started here
(tests/services/reach_simulator.py), the kinematics service is one more process of ours
the deploy makes external, and the only thing harness realizes is the benchmark's client
environment, from its committed lock, offline (a host copy stands in for the lock's
interpreter). The run scores its episodes, its record names the simulator (address and
identity) as an impurity that ``audit --strict`` fails on, and ``diff`` names a change of
its address and version. ``closure``, ``plan`` and ``doctor`` say what runs and what is
installed where; the kinematics-only agent chooses between the local and the remote reach
with ``--set``. The planner and the record's comparison are also checked as the pure
functions they are, and each refusal as the CLI gives it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, run_harness_process
from tests.ports import free_port

SIMULATOR = REPO / "tests" / "services" / "reach_simulator.py"
KINEMATICS = REPO / "services" / "servers" / "serve_kinematics.py"
REMOTE = ("--agent", "kinematics-only", "--set", "agent.benchmark=reach-remote")


def _serve(argv: list[str], banner: str) -> subprocess.Popen[str]:
    """Start a loopback server of ours; return once it printed ``banner`` (it listens)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if banner not in line:
        proc.kill()
        raise AssertionError(f"{argv[1]} did not start: {line}{proc.stdout.read()}")
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def simulator(port: int, version: str) -> subprocess.Popen[str]:
    return _serve([sys.executable, str(SIMULATOR), "--port", str(port), "--version", version], "reach-sim: serving")


@dataclass
class World:
    project: Path
    home: Path
    kinematics_url: str

    def deploy(self, simulator_url: str | None, name: str) -> Path:
        """A deploy: kinematics external (ours, on loopback), the simulator at ``simulator_url``."""
        path = self.home.parent / f"{name}.toml"
        text = f'[services.kinematics]\nmode = "external"\nurl = "{self.kinematics_url}"\n'
        if simulator_url is not None:
            text += f'\n[benchmarks.reach-remote]\nurl = "{simulator_url}"\n'
        path.write_text(text)
        return path

    def harness(self, *args: str, deploy: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        extra = ["--deploy", str(deploy)] if deploy is not None else []
        result = run_harness_process(
            "--project", str(self.project), "--home", str(self.home), *extra, *args, cwd=self.project, timeout=timeout
        )
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def runs(self) -> list[Path]:
        folder = self.home / "runs"
        return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A copy of the example project, an empty home, and the kinematics service running as
    the external service the deploys name."""
    pytest.importorskip("numpy")  # the stand-ins compute with the kinematics service's own math
    root = tmp_path_factory.mktemp("remote-sim")
    project = root / "project"
    project.mkdir()
    for rel in ("harness.toml", "services", "benchmarks", "configs", "locks"):
        source = REPO / rel
        if source.is_dir():
            shutil.copytree(source, project / rel, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.is_file():
            shutil.copy(source, project / rel)
    for deploy in (project / "configs" / "deploy").glob("*.toml"):
        if not deploy.name.startswith("example-"):
            deploy.unlink()  # a developer's own deploy file stays out of the test
    port = free_port()
    kinematics = _serve(
        [sys.executable, str(KINEMATICS), "--robot", str(REPO / "services/assets/arm7/arm7.json"), "--port", str(port)],
        "kinematics: serving",
    )
    try:
        yield World(project, root / "home", f"http://127.0.0.1:{port}")
    finally:
        _stop(kinematics)


def _record(run_dir: Path) -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
    return tuple(json.loads((run_dir / f"{name}.json").read_text()) for name in ("config", "lock", "result"))  # type: ignore[return-value]


# ------------------------------------------------------------------------------ end to end


def test_remote_simulator_run_recorded_audited_and_diffed(world: World) -> None:
    """Only the client is realized and started; the run scores the simulator's episodes;
    the record names the simulator (address, identity) as an impurity, strict audit fails
    on it, and diff names a change of address and version."""
    from harness.lock.lockfile import read

    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    sim = simulator(port_a, "1.0.0")
    try:
        first = world.harness("run", *REMOTE, "--offline", deploy=world.deploy(url_a, "deploy-a"))
    finally:
        _stop(sim)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "reach-remote: success rate 1.00 (5/5)" in first.stdout
    assert f"simulator of reach-remote: elsewhere, at {url_a}" in first.stderr + first.stdout
    run_a = world.runs()[-1]
    config, closure, result = _record(run_a)
    # Only the client's environment is in the closure: the benchmark's lock, nothing else.
    assert set(closure["locks"]) == {"reach-remote"}
    client = read(world.project / "locks" / "reach-remote.lock.toml")
    assert closure["locks"]["reach-remote"]["manifest_digest"] == client.manifest_digest
    assert config["plan"]["sim_workers"] == []
    assert config["plan"]["simulator"] == {"benchmark": "reach-remote", "url": url_a, "identity": "/info"}
    assert config["simulator"] == {
        "benchmark": "reach-remote",
        "url": url_a,
        "identity": "/info",
        "reported": {"simulator": "reach-sim", "version": "1.0.0", "task": "reach-arm7"},
    }
    command = config["launch"]["command"]
    assert command["argv"][-4:] == ["--simulator", url_a, "--episodes", "5"]
    assert command["env"]["HARNESS_SIMULATOR_URL"] == url_a
    impure = [line for line in config["impurities"] if "simulator at" in line]
    assert impure == [
        f"reach-remote: simulator at {url_a} runs elsewhere (not built by harness: only its client is in the "
        'closure; it reports {"simulator": "reach-sim", "task": "reach-arm7", "version": "1.0.0"})'
    ]
    assert result["score"] == 1.0 and result["exit_status"] == 0
    assert json.loads((run_a / "benchmark.json").read_text())["simulator"]["version"] == "1.0.0"

    audit = world.harness("audit", run_a.name)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert f"simulator at {url_a} runs elsewhere" in audit.stdout
    strict = world.harness("audit", "--strict", run_a.name)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert f"simulator at {url_a} runs elsewhere" in strict.stdout and "--strict fails" in strict.stdout

    sim = simulator(port_b, "1.1.0")
    try:
        second = world.harness("run", *REMOTE, "--offline", deploy=world.deploy(url_b, "deploy-b"))
    finally:
        _stop(sim)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    run_b = world.runs()[-1]
    diff = world.harness("diff", run_a.name, run_b.name)
    assert diff.returncode == 0, diff.stderr
    lines = diff.stdout.splitlines()
    assert f"simulator of reach-remote: address {url_a} → {url_b}" in lines
    assert "simulator of reach-remote: reports version: 1.0.0 → 1.1.0" in lines
    # The worker's argv and HARNESS_SIMULATOR_URL differ only by the address: said once.
    assert not [line for line in lines if line.startswith("run command:")], lines
    assert not [line for line in lines if line.startswith("reach-remote:")], lines  # same client


def test_run_refuses_a_simulator_without_address_or_answer(world: World) -> None:
    """No deploy gives the address: exit 2 naming the deploy key. The address does not
    answer the identity path: exit 1 naming it; the worker never starts."""
    before = world.runs()
    missing = world.harness("run", *REMOTE, "--offline", deploy=world.deploy(None, "deploy-none"))
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "benchmark reach-remote: its simulator runs elsewhere" in missing.stderr
    assert "[benchmarks.reach-remote] url" in missing.stderr
    silent = world.harness("run", *REMOTE, "--offline", deploy=world.deploy(f"http://127.0.0.1:{free_port()}", "dead"))
    assert silent.returncode == 1, silent.stdout + silent.stderr
    assert "its simulator at http://127.0.0.1:" in silent.stderr and "did not answer GET /info" in silent.stderr
    assert "success rate" not in silent.stdout
    assert world.runs() == before  # nothing ran, so nothing is recorded as a run


def test_closure_plan_and_doctor_tell_local_from_remote(world: World) -> None:
    """``--set agent.benchmark`` chooses the local or the remote reach; closure shows the
    client's environment, plan no simulator workers (the [sim] GPU free for models), doctor
    only the client as what a run would install."""
    deploy = world.deploy("http://sim.example.invalid:9000", "deploy-plan")
    remote = world.harness("closure", *REMOTE, deploy=deploy)
    assert remote.returncode == 0, remote.stderr
    assert "benchmark: reach-remote" in remote.stdout
    assert (
        "simulator: elsewhere (at http://sim.example.invalid:9000); only its client is installed here" in remote.stdout
    )
    assert "client env: python 3.11; requirements: (none)" in remote.stdout
    local = world.harness("closure", "--agent", "kinematics-only", deploy=deploy)
    assert "benchmark: reach\n" in local.stdout and "simulator: here" in local.stdout

    no_gpu = world.project / "configs" / "deploy" / "example-no-gpu.toml"  # [sim] gpus = [0]
    planned = {}
    for label, extra in (("remote", REMOTE), ("local", ("--agent", "kinematics-only"))):
        result = world.harness("plan", *extra, "--gpus", "1x24", "--json", deploy=no_gpu)
        assert result.returncode == 0, result.stderr
        planned[label] = json.loads(result.stdout)
    assert planned["local"]["sim_workers"] == [{"index": 0, "gpu": 0, "port": 8771}]
    assert planned["local"]["simulator"] is None
    assert planned["remote"]["sim_workers"] == []
    assert planned["remote"]["simulator"] == {"benchmark": "reach-remote", "url": None, "identity": "/info"}
    assert any("[benchmarks.reach-remote] url" in note for note in planned["remote"]["notes"])

    fresh = world.home.parent / "fresh-home"  # nothing realized: what would a run install?
    report = run_harness_process(
        "--project", str(world.project), "--home", str(fresh), "--deploy", str(deploy),
        "doctor", *REMOTE, "--json", cwd=world.project,
    )  # fmt: skip
    data = json.loads(report.stdout)
    assert data["run_would_install"] == ["reach-remote"]  # the client; kinematics is external
    assert data["run_simulator"] == {
        "benchmark": "reach-remote",
        "url": "http://sim.example.invalid:9000",
        "identity": "/info",
    }
    text = run_harness_process(
        "--project", str(world.project), "--home", str(fresh), "doctor", *REMOTE, cwd=world.project
    )
    assert "a run would install: kinematics, reach-remote" in text.stdout
    assert "not installed: the simulator of reach-remote (elsewhere, no deploy gives its address yet)" in text.stdout


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('simulator = "external"\nvram_gb = 8\n', "vram_gb must be 0"),
        ('identity = "/info"\n', 'identity applies to simulator = "external" only'),
        ('simulator = "elsewhere"\n', "simulator"),
        ('simulator = "external"\nidentity = "info"\n', "must be a URL path starting with '/'"),
    ],
)
def test_bad_remote_manifest_is_exit_2(tmp_path: Path, body: str, said: str) -> None:
    project = tmp_path / "p"
    (project / "benchmarks").mkdir(parents=True)
    (project / "services").mkdir()
    (project / "benchmarks" / "sim.toml").write_text(
        'summary = "s"\nworker = ["{python}", "c.py", "{url}"]\n' + body + '[environment]\npython = "3.11"\n'
    )
    result = run_harness_process("--project", str(project), "validate", cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "benchmarks/sim.toml" in result.stdout + result.stderr and said in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('[benchmarks.reach]\nurl = "http://h:1"\n', 'benchmarks/reach.toml runs its simulator here (simulator = "local")'),
        ('[benchmarks.reach-remot]\nurl = "http://h:1"\n', "no manifest benchmarks/reach-remot.toml (did you mean 'reach-remote'?)"),
        ('[benchmarks.reach-remote]\nurl = "h:1"\n', "url must be an http(s):// or ws(s):// address"),
        ("[benchmarks.reach-remote]\n", "url"),
    ],
)  # fmt: skip
def test_bad_deploy_benchmarks_is_exit_2(tmp_path: Path, table: str, said: str) -> None:
    deploy = tmp_path / "d.toml"
    deploy.write_text(table)
    result = run_harness_process("--deploy", str(deploy), "plan", "--gpus", "none", cwd=REPO)
    assert result.returncode == 2, result.stdout + result.stderr
    assert str(deploy.name) in result.stderr and said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------------------ pure parts


def test_planner_places_no_simulator_workers_for_a_remote_simulator() -> None:
    """[sim] GPU 0 runs the local simulator's workers and keeps auto-placed models off it;
    with the simulator elsewhere nothing of it is placed and GPU 0 holds the model."""
    from harness.manifests.deploy import Deploy
    from harness.manifests.model import BenchmarkManifest, ServiceManifest
    from harness.runtime.placement import plan
    from harness.runtime.plan import Gpu, RemoteSimulator

    model = ServiceManifest.model_validate(
        {"kind": "m", "summary": "m", "command": ["x"], "port": 9000, "vram_gb": 10, "environment": {"python": "3.11"}}
    )
    common = {"summary": "b", "worker": ["{python}", "c.py"], "environment": {"python": "3.11"}}
    local = BenchmarkManifest.model_validate({**common, "vram_gb": 8})
    remote = BenchmarkManifest.model_validate({**common, "simulator": "external", "identity": "/v"})
    deploy = Deploy.model_validate({"sim": {"gpus": [0]}, "benchmarks": {"far": {"url": "http://sim:9/"}}})
    gpus = (Gpu(0, "g", 24.0, 24.0),)

    here = plan({"m": model}, deploy, gpus, benchmark=local, benchmark_name="near")
    assert len(here.sim_workers) == 1 and here.simulator is None
    assert here.service("m").mode == "off"  # auto never shares the simulator's GPU

    there = plan({"m": model}, deploy, gpus, benchmark=remote, benchmark_name="far")
    assert there.sim_workers == ()
    assert there.simulator == RemoteSimulator("far", "http://sim:9", "/v")
    assert (there.service("m").mode, there.service("m").gpu) == ("resident", 0)
    assert any(
        "far: its simulator runs elsewhere (at http://sim:9)" in n and "[sim] is not used" in n for n in there.notes
    )
    assert plan({"m": model}, deploy, gpus, benchmark=remote, benchmark_name="far") == there  # deterministic


def test_simulator_differences_name_address_and_reported_keys() -> None:
    from harness.runs.simulator import simulator_differences

    a = {"benchmark": "b", "url": "http://a:1", "identity": "/i", "reported": {"version": "1", "task": "t"}}
    b = {**a, "url": "http://b:2", "reported": {"version": "2", "task": "t", "build": 7}}
    assert simulator_differences(a, b) == [
        "simulator of b: address http://a:1 → http://b:2",
        "simulator of b: reports build: (nothing) → 7",
        "simulator of b: reports version: 1 → 2",
    ]
    assert simulator_differences(a, a) == []
    assert simulator_differences(None, None) == []
    assert simulator_differences(None, a) == ["simulator: here (or none) → b elsewhere, at http://a:1"]
    assert simulator_differences({**a, "reported": None}, a) == [
        'simulator of b: reported (nothing) → {"task": "t", "version": "1"}'
    ]


def test_identity_answer_must_be_a_json_object(tmp_path: Path) -> None:
    """A simulator whose identity path answers something else is refused, naming it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from harness.errors import HarnessError
    from harness.runs.simulator import ask_identity

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b"[1, 2]" if self.path == "/list" else b"not json"
            self.send_response(200 if self.path != "/gone" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(HarnessError, match="with a JSON object \\(it answered a list\\)"):
            ask_identity(url, "/list", "b")
        with pytest.raises(HarnessError, match="with JSON: b'not json'"):
            ask_identity(url, "/text", "b")
        with pytest.raises(HarnessError, match="HTTP 404"):
            ask_identity(url, "/gone", "b")
    finally:
        server.shutdown()
        server.server_close()
