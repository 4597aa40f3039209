"""``harness run`` records, ``audit`` and ``diff``, end to end with real processes.

A test project runs a stand-in model service (tests/services/fake_model.py) from a realized
environment whose one package comes from the local index; the run's command asks the
broker for a lease, calls the service, and exits with a code the test chooses.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from harness.lock.lockfile import read
from harness.realize.standin import realized_lock
from harness.store.store import Store
from tests.conftest import run_harness_process
from tests.ports import free_port
from tests.upstreams import Upstreams, make_project

SERVICE = """kind = "tester"
summary = "a stand-in model service"
command = ["{python}", "-u", "services/servers/fake_model.py", "--name", "svc", "--port", "{port}"]
port = %d
health = "/health"
load_seconds = 20
client = { url = "{url}", port = "{port}", python = "{python}" }

[environment]
python = "3.11"
requirements = ["%s"]
"""

CALLER = r"""
import json, os, sys, urllib.request
broker = os.environ["HARNESS_BROKER"]
def post(path, body):
    req = urllib.request.Request(broker + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + os.environ["HARNESS_BROKER_TOKEN"]})
    return json.loads(urllib.request.urlopen(req, timeout=60).read())
lease = post("/acquire", {"service": "svc", "client": "test"})
answer = json.loads(urllib.request.urlopen(lease["url"] + "/health", timeout=10).read())
post("/release", {"lease": lease["lease"]})
print("service answered", answer["name"], flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "client":
    print("client", json.dumps({"env": os.environ.get("HARNESS_SERVICE_SVC_CLIENT"), "lease": lease.get("client")}))
if len(sys.argv) > 1 and sys.argv[1] == "sleep":
    import time; time.sleep(60)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 0)
"""


def _project(root: Path, requirement: str, port: int) -> Path:
    project = make_project(root, {"svc": SERVICE % (port, requirement)})
    servers = project / "services" / "servers"
    servers.mkdir()
    shutil.copy(Path(__file__).parent / "services" / "fake_model.py", servers / "fake_model.py")
    (project / "caller.py").write_text(CALLER)
    return project


def harness(project: Path, home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = run_harness_process("--project", str(project), "--home", str(home), *args, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _run(project: Path, home: Path, *command: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    before = set((home / "runs").iterdir()) if (home / "runs").exists() else set()
    result = harness(project, home, "run", "--service", "svc", "--", sys.executable, "caller.py", *command)
    [run_dir] = set((home / "runs").iterdir()) - before
    return result, run_dir


@pytest.fixture(scope="module")
def project(up: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = _project(tmp_path_factory.mktemp("runs"), "alpha==1.0", free_port())
    assert harness(project, up.home, "lock").returncode == 0
    return project


@pytest.fixture(scope="module")
def home(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A realized home shared by the tests that do not change the store."""
    home = tmp_path_factory.mktemp("home")
    assert harness(project, home, "realize").returncode == 0
    return home


def test_run_records_and_audits_ok(project: Path, up: Upstreams, tmp_path: Path, home: Path) -> None:
    result, run_dir = _run(project, home)
    assert result.returncode == 0, result.stderr
    assert "service answered svc" in result.stdout
    config = json.loads((run_dir / "config.json").read_text())
    closure = json.loads((run_dir / "lock.json").read_text())
    outcome = json.loads((run_dir / "result.json").read_text())
    assert outcome["exit_status"] == 0 and outcome["ended"] >= outcome["started"]
    own = read(project / "locks" / "svc.lock.toml")
    lock = realized_lock(Store.in_home(home), own)  # a host copy stands in here (no downloads)
    paths = {e["path"]: e for e in closure["store_paths"]}
    assert lock.environment.store in paths and lock.python.store in paths
    assert closure["locks"]["svc"]["interpreter"] == lock.python.store
    assert closure["locks"]["svc"]["standing_in_for"] == own.python.store != lock.python.store
    assert closure["locks"]["svc"]["packages"] == {"alpha": "1.0"}
    # The service's code from services/servers/ runs from a store path of its own, which
    # the closure names and the audit re-hashes like any other.
    code = closure["locks"]["svc"]["code"]
    assert code.endswith("-svc-code") and paths[code]["kind"] == "source"
    assert (home / "store" / code / "services" / "servers" / "fake_model.py").is_file()
    assert config["versions"]["harness"] and config["versions"]["uv"]
    assert config["plan"]["services"][0]["name"] == "svc"
    assert any("is host:" in i for i in config["impurities"]), "a host interpreter is named"
    assert (run_dir / "logs" / "command.log").read_text().startswith("service answered")
    audit = harness(project, home, "audit", run_dir.name)
    assert audit.returncode == 0 and "audit of run" in audit.stdout and ": ok" in audit.stdout
    strict = harness(project, home, "audit", "--strict", run_dir.name)
    assert strict.returncode == 1, "impurities fail a strict audit"
    listed = json.loads(harness(project, home, "runs", "--json").stdout)
    assert listed[0]["id"] == run_dir.name and listed[0]["exit_status"] == 0
    # The run's report: one page from the record, with the broker's events as its timeline.
    events = [json.loads(line) for line in (run_dir / "services" / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e.get("service") == "svc"][:3] == ["added", "start", "ready"]
    written = harness(project, home, "report", run_dir.name)
    assert written.returncode == 0 and written.stdout.strip() == str(run_dir / "report.html"), written.stderr
    page = (run_dir / "report.html").read_text()
    assert "<script" not in page and lock.environment.store in page and "<title>svc: " in page
    assert "each as the run used it" in page and "is host:" in page  # the verdict (impure, not failed) and why


def test_the_command_and_every_lease_get_the_rendered_client_table(project: Path, home: Path) -> None:
    result, run_dir = _run(project, home, "client")
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("client ")]
    seen = json.loads(line.removeprefix("client "))
    port = tomllib.loads((project / "services" / "svc.toml").read_text())["port"]
    lock = realized_lock(Store.in_home(home), read(project / "locks" / "svc.lock.toml"))
    expected = {
        "port": str(port),
        "python": str(home / "store" / lock.environment.store / "bin" / "python"),
        "url": f"http://127.0.0.1:{port}",
    }
    assert seen["lease"] == expected  # the broker's lease
    assert seen["env"] == json.dumps(expected, sort_keys=True)  # HARNESS_SERVICE_SVC_CLIENT, sorted keys
    # Recorded with the command's other HARNESS_* variables, beside the service's URL.
    env = json.loads((run_dir / "config.json").read_text())["launch"]["command"]["env"]
    assert env["HARNESS_SERVICE_SVC_CLIENT"] == seen["env"] and env["HARNESS_SERVICE_SVC_URL"] == expected["url"]


def test_a_run_is_judged_as_it_ran_and_a_changed_store_path_is_refused_at_launch(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    result, good_run = _run(project, home)
    assert result.returncode == 0, result.stderr
    checks = [json.loads(line) for line in (good_run / "services" / "launch-checks.jsonl").read_text().splitlines()]
    lock = realized_lock(Store.in_home(home), read(project / "locks" / "svc.lock.toml"))  # a host copy here
    assert checks[0]["launch"] == "svc" and lock.environment.store in checks[0]["paths"]
    assert lock.python.store in checks[0]["paths"], "what the environment references is checked too"
    env = home / "store" / lock.environment.store
    target = next((env / "lib").glob("python3.*/site-packages/alpha/__init__.py"))
    target.parent.chmod(0o755)
    target.chmod(0o644)
    target.write_text(target.read_text() + "# tampered\n")
    # The finished run computed with the registered bytes: it stays ok, with a note.
    audit = harness(project, home, "audit", "--json", good_run.name)
    assert audit.returncode == 0, audit.stdout
    [item] = [i for i in json.loads(audit.stdout)["items"] if i["path"] == lock.environment.store]
    assert item["status"] == "ok" and item["at_launch"] == "stat" and "alpha/__init__.py" in item["store_now"]
    # A new run is refused before its service starts, naming the file.
    refused, bad_run = _run(project, home)
    assert refused.returncode != 0
    assert "alpha/__init__.py" in refused.stdout + refused.stderr
    audit = harness(project, home, "audit", "--json", bad_run.name)
    assert audit.returncode == 1
    bad = [i for i in json.loads(audit.stdout)["items"] if i["status"] != "ok"]
    assert [(i["path"], i["at_launch"]) for i in bad] == [(lock.environment.store, "refused")]
    assert "alpha/__init__.py" in bad[0]["detail"]
    # Repairing the store changes neither verdict.
    assert harness(project, home, "store", "verify", "--repair").returncode == 0
    assert harness(project, home, "audit", bad_run.name).returncode == 1
    assert harness(project, home, "audit", good_run.name).returncode == 0


def test_failing_command_still_leaves_a_record(project: Path, tmp_path: Path, home: Path) -> None:
    result, run_dir = _run(project, home, "3")
    assert result.returncode == 3
    assert json.loads((run_dir / "result.json").read_text())["exit_status"] == 3


def test_sigint_still_writes_the_record(project: Path, tmp_path: Path, home: Path) -> None:
    before = set((home / "runs").glob("*/logs/command.log")) if (home / "runs").exists() else set()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "--project",
            str(project),
            "--home",
            str(home),
            "run",
            "--service",
            "svc",
            "--",
            sys.executable,
            "caller.py",
            "sleep",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    log = None
    while time.monotonic() < deadline:
        logs = sorted(set((home / "runs").glob("*/logs/command.log")) - before) if (home / "runs").exists() else []
        if logs and "service answered" in logs[0].read_text():
            log = logs[0]
            break
        time.sleep(0.2)
    assert log is not None, "the command never called its service"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    outcome = json.loads((log.parent.parent / "result.json").read_text())
    assert outcome["exit_status"] != 0 and outcome["ended"] >= outcome["started"]
    # Nothing the run started is left running.
    import psutil

    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any("fake_model.py" in part for part in (p.info["cmdline"] or []))
        and str(home) in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


def test_a_run_killed_with_sigkill_leaves_no_service_running(project: Path, home: Path) -> None:
    import psutil

    before = set((home / "runs").glob("*/logs/command.log")) if (home / "runs").exists() else set()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "--project",
            str(project),
            "--home",
            str(home),
            "run",
            "--service",
            "svc",
            "--",
            sys.executable,
            "caller.py",
            "sleep",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    log = None
    while time.monotonic() < deadline and log is None:
        logs = sorted(set((home / "runs").glob("*/logs/command.log")) - before) if (home / "runs").exists() else []
        if logs and "service answered" in logs[0].read_text():
            log = logs[0]
        time.sleep(0.2)
    assert log is not None, "the command never called its service"

    def services() -> list[psutil.Process]:
        return [
            p
            for p in psutil.process_iter(["cmdline"])
            if any("fake_model.py" in part for part in (p.info["cmdline"] or []))
            and str(home) in " ".join(p.info["cmdline"] or [])
        ]

    assert services(), "the service runs while the run does"
    proc.kill()  # nothing in the run's process gets to clean up
    proc.wait()
    deadline = time.monotonic() + 60
    while services() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert services() == [], "a service outlived the run that started it"
    for child in psutil.process_iter(["cmdline", "cwd"]):  # the run's own command: the test ends it
        if "caller.py" in " ".join(child.info["cmdline"] or []) and child.info["cwd"] == str(project):
            child.kill()


def test_diff_names_exactly_the_bumped_package(project: Path, up: Upstreams, tmp_path: Path, home: Path) -> None:
    first, run_a = _run(project, home)
    assert first.returncode == 0, first.stderr
    bumped = tmp_path / "bumped"
    shutil.copytree(project, bumped)
    manifest = bumped / "services" / "svc.toml"
    manifest.write_text(manifest.read_text().replace("alpha==1.0", "alpha==2.0"))
    assert harness(bumped, home, "lock").returncode == 0
    second, run_b = _run(bumped, home)
    assert second.returncode == 0, second.stderr
    diff = harness(bumped, home, "diff", run_a.name, run_b.name)
    assert diff.returncode == 0
    assert diff.stdout.strip().splitlines() == ["svc: package alpha: 1.0 → 2.0"]


def test_diff_names_a_changed_environment_and_never_records_a_secret(project: Path, home: Path) -> None:
    """Services and the command inherit the caller's environment: a variable that changed is
    a difference ("same closure" would be a lie), and a secret's value is never written."""
    runs = []
    for flag, secret in (("1", "hunter2-first"), ("changed", "hunter2-second")):
        before = set((home / "runs").iterdir()) if (home / "runs").exists() else set()
        result = run_harness_process(
            *("--project", str(project), "--home", str(home), "run", "--service", "svc", "--"),
            *(sys.executable, "caller.py"),
            env={"TINY_FLAG": flag, "MY_API_TOKEN": secret},
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        [run_dir] = set((home / "runs").iterdir()) - before
        runs.append(run_dir)
        text = (run_dir / "config.json").read_text()
        assert secret not in text, "a secret's value is never in a record"
        launch = json.loads(text)["launch"]
        assert launch["services"]["svc"]["environment"]["TINY_FLAG"] == flag
        hidden = launch["services"]["svc"]["environment"]["MY_API_TOKEN"]
        # Keyed (the user's record key), so nobody holding the record can test guesses against it.
        assert hidden.startswith("hmac:") and hashlib.sha256(secret.encode()).hexdigest()[:16] not in hidden
    diff = harness(project, home, "diff", runs[0].name, runs[1].name)
    assert diff.returncode == 0
    lines = diff.stdout.strip().splitlines()
    assert "svc: environment TINY_FLAG: 1 → changed" in lines
    assert "run command: environment TINY_FLAG: 1 → changed" in lines
    assert "svc: environment MY_API_TOKEN: changed (a secret: its value is recorded as a hash only)" in lines
    assert len(lines) == 4, lines
    assert "same closure" not in diff.stdout
    from harness.runtime.recordkey import key_path

    assert key_path().stat().st_mode & 0o777 == 0o600, "the key is the user's alone"


def test_a_secret_hashed_under_another_key_is_not_called_changed() -> None:
    """Records made by another user (another key) cannot say whether a secret changed."""
    from harness.runs.audit import _environment_diff
    from harness.runtime.launch import recorded_environment

    env = {"MY_API_TOKEN": "same", "TINY_FLAG": "1"}
    mine, theirs = recorded_environment(env, b"k" * 32), recorded_environment(env, b"o" * 32)
    assert mine["MY_API_TOKEN"] != theirs["MY_API_TOKEN"] and mine["TINY_FLAG"] == theirs["TINY_FLAG"]
    lines = _environment_diff("svc", {"environment": mine}, {"environment": theirs}, skip=set())
    assert lines == ["svc: environment MY_API_TOKEN: cannot compare (a secret hashed under another key)"]


def test_changed_service_code_is_a_new_store_path(project: Path, home: Path, tmp_path: Path) -> None:
    first, run_a = _run(project, home)
    assert first.returncode == 0, first.stderr
    edited = tmp_path / "edited"
    shutil.copytree(project, edited)
    server = edited / "services" / "servers" / "fake_model.py"
    server.write_text(server.read_text() + "\n# a comment changes the code's store path\n")
    second, run_b = _run(edited, home)
    assert second.returncode == 0, second.stderr
    lines = harness(edited, home, "diff", run_a.name, run_b.name).stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("svc: code ") and lines[0].endswith("-svc-code")
    # The first run's code is still what it was: its audit is clean.
    assert harness(project, home, "audit", run_a.name).returncode == 0


# ----------------------------------------------------------- listing and pruning records


def _age(run_dir: Path, days: float, target: Path, *, result: bool = True) -> Path:
    """A copy of the real record ``run_dir`` under ``target/runs``, as if it started ``days`` ago
    (a fresh id of that time; the ids inside its files follow)."""
    from harness.runs.record import new_run_id

    started = time.time() - days * 86400
    run_id = new_run_id(started)
    copy = target / "runs" / run_id
    shutil.copytree(run_dir, copy)
    for name in ("config.json", "result.json"):
        data = json.loads((copy / name).read_text())
        data.update({"id": run_id, "started": started, **({"ended": started + 1} if "ended" in data else {})})
        (copy / name).write_text(json.dumps(data))
    if not result:
        (copy / "result.json").unlink()  # a run killed with SIGKILL leaves no result.json
    return copy


@pytest.fixture(scope="module")
def many(project: Path, home: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A home with two real runs (newest) and 25 copies of the first, 1 to 25 days old; the
    ids newest first."""
    target = tmp_path_factory.mktemp("many")
    shutil.copytree(home / "store", target / "store", symlinks=True)
    first, run_a = _run(project, target)
    second, run_b = _run(project, target, "3")
    assert first.returncode == 0 and second.returncode == 3, (first.stderr, second.stderr)
    for days in range(1, 26):
        _age(run_a, days, target)
    ids = sorted((p.name for p in (target / "runs").iterdir()), reverse=True)
    assert ids[:2] == [run_b.name, run_a.name]
    return target, ids


def _ids(project: Path, home: Path, *args: str) -> list[str]:
    listed = harness(project, home, "runs", "--json", *args)
    assert listed.returncode == 0, listed.stderr
    return [row["id"] for row in json.loads(listed.stdout)]


def test_runs_lists_the_newest_first_and_stops_at_last(project: Path, many: tuple[Path, list[str]]) -> None:
    home, ids = many
    assert _ids(project, home) == ids[:20], "the newest 20 by default"
    assert _ids(project, home, "--last", "3") == ids[:3]
    assert _ids(project, home, "--all") == ids
    table = harness(project, home, "runs", "--last", "2").stdout
    assert ids[0] in table and ids[1] in table and ids[2] not in table
    table = harness(project, home, "runs").stdout
    assert ids[19] in table and ids[20] not in table
    # `latest` is still the newest run (the trash prune uses is never a run).
    (home / "runs" / ".trash").mkdir(exist_ok=True)
    assert harness(project, home, "audit", "latest").stdout.count(ids[0]) >= 1
    (home / "runs" / ".trash").rmdir()


@pytest.mark.parametrize(
    "args, says",
    [
        (["runs", "--last", "0"], "Invalid value for '--last'"),
        (["runs", "--last", "-4"], "Invalid value for '--last'"),
        (["runs", "--last", "2", "--all"], "--last N or --all, not both"),
        (["runs", "prune"], "--keep N, --older-than DAYS, or both"),
        (["runs", "prune", "--keep", "-1"], "Invalid value for '--keep'"),
        (["runs", "prune", "--older-than", "-2"], "Invalid value for '--older-than'"),
        (["runs", "prune", "--older-than", "soon"], "Invalid value for '--older-than'"),
    ],
)
def test_bad_listing_and_prune_options_are_refused_clearly(
    project: Path, tmp_path: Path, args: list[str], says: str
) -> None:
    result = harness(project, tmp_path / "home", *args)
    assert result.returncode == 2 and says in result.stderr, result.stderr


def _copy_home(many: tuple[Path, list[str]], tmp_path: Path) -> tuple[Path, list[str]]:
    home, ids = many
    target = tmp_path / "home"
    shutil.copytree(home / "runs", target / "runs", symlinks=True)
    shutil.copytree(home / "store", target / "store", symlinks=True)  # for `audit`
    return target, ids


def _bytes(run_dir: Path) -> int:
    return sum(p.lstat().st_size for p in run_dir.rglob("*") if not p.is_dir() or p.is_symlink())


def test_prune_keep_removes_old_records_whole_but_never_a_pinned_or_unfinished_one(
    project: Path, many: tuple[Path, list[str]], tmp_path: Path
) -> None:
    home, ids = _copy_home(many, tmp_path)
    runs = home / "runs"
    assert harness(project, home, "runs", "pin", ids[10]).returncode == 0
    unfinished = _age(runs / ids[1], 40, home, result=False)  # killed long ago: --keep alone keeps it
    dry = harness(project, home, "runs", "prune", "--keep", "5", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("would remove run ") == 21 and f"would remove run {ids[5]}" in dry.stdout
    assert ids[10] not in dry.stdout and unfinished.name not in dry.stdout and ids[4] not in dry.stdout
    assert len(list(runs.iterdir())) == 28, "a dry run removes nothing"
    going = [runs / i for i in ids[5:] if i != ids[10]]
    size = sum(_bytes(p) for p in going)
    done = harness(project, home, "runs", "prune", "--keep", "5")
    assert done.returncode == 0, done.stderr
    assert f"removed 21 of 28 run(s), freed {size} bytes" in done.stdout
    assert "kept despite the options: 1 pinned, 1 without result.json" in done.stdout
    assert sorted(p.name for p in runs.iterdir()) == sorted([*ids[:5], ids[10], unfinished.name])
    assert _ids(project, home) == [*ids[:5], ids[10], unfinished.name]
    assert harness(project, home, "audit", ids[0]).returncode == 0, "a kept record is whole"
    # Nothing more to go: the same prune again removes nothing.
    assert "removed 0 of 7 run(s), freed 0 bytes" in harness(project, home, "runs", "prune", "--keep", "5").stdout


def test_prune_older_than_and_with_keep(project: Path, many: tuple[Path, list[str]], tmp_path: Path) -> None:
    home, ids = _copy_home(many, tmp_path)
    runs = home / "runs"
    unfinished = _age(runs / ids[1], 40, home, result=False)
    # The copies are 1..25 days old: ids[2] is 1 day old, ids[26] 25 days.
    both = harness(project, home, "runs", "prune", "--older-than", "10.5", "--keep", "20", "--dry-run").stdout
    assert both.count("would remove run ") == 8, both  # beyond the newest 20 and older: 20..25 days, the unfinished
    done = harness(project, home, "runs", "prune", "--older-than", "10.5")
    assert done.returncode == 0, done.stderr
    # Days 11..25 go, and the record without result.json: no live process holds it.
    assert "removed 16 of 28 run(s)" in done.stdout, done.stdout
    assert sorted(p.name for p in runs.iterdir()) == sorted(ids[:12])
    assert not unfinished.exists()


def test_prune_never_removes_a_run_in_progress(project: Path, home: Path, tmp_path: Path) -> None:
    target = tmp_path / "home"
    shutil.copytree(home / "store", target / "store", symlinks=True)
    finished = _run(project, target)[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "--project", str(project), "--home", str(target)]
        + ["run", "--service", "svc", "--", sys.executable, "caller.py", "sleep"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        live = None
        while time.monotonic() < deadline and live is None:
            logs = [p for p in (target / "runs").glob("*/logs/command.log") if finished not in p.parents]
            if logs and "service answered" in logs[0].read_text():
                live = logs[0].parent.parent
            time.sleep(0.2)
        assert live is not None, "the run never called its service"
        assert not (live / "result.json").exists()
        for args in (["--keep", "0"], ["--older-than", "0"], ["--keep", "0", "--older-than", "0"]):
            pruned = harness(project, target, "runs", "prune", *args)
            assert pruned.returncode == 0, pruned.stderr
            assert "kept despite the options: 1 in progress" in pruned.stdout, (args, pruned.stdout)
            assert live.is_dir() and (live / "config.json").is_file()
        assert not finished.exists(), "the finished run went"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert (live / "result.json").is_file(), "the run recorded its end in the record prune left"
    assert "removed 1 of 1" in harness(project, target, "runs", "prune", "--keep", "0").stdout


# ------------------------------------------------------- where a benchmark's worker runs

# A stand-in for a simulator client that writes its results relative to its working folder
# (RoboDojo's eval_result/<benchmark>/<task>/), one of them read-only as assets copied from
# the store would be, and a marker into the folder {run} names.
PROBE = r"""
import json, os, pathlib, sys
out = pathlib.Path("eval_result/probe/task")
out.mkdir(parents=True)
(out / "_result.json").write_text(json.dumps({"cwd": os.getcwd()}))
assets = pathlib.Path("Assets")
assets.mkdir()
(assets / "material.txt").write_text("read-only, as copied from the store")
assets.chmod(0o555)
pathlib.Path(sys.argv[1], "from-template.txt").write_text("{run}")
"""

INLINE = "import os, pathlib; p = pathlib.Path('eval_result'); p.mkdir(); (p / 'cwd.txt').write_text(os.getcwd())"

BENCHMARK = """kind = "benchmark"
summary = "a worker that writes relative files"
worker = %s
%s
[environment]
python = "3.11"
requirements = []
"""


@pytest.fixture(scope="module")
def benchmarks(up: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with two benchmarks and no service: ``inrun`` runs the project file
    benchmarks/probe/main.py with ``workdir = "run"``; ``inproject`` runs inline code
    with the default workdir, so it starts in the project folder."""
    inrun = BENCHMARK % (json.dumps(["{python}", "-u", "benchmarks/probe/main.py", "{run}"]), 'workdir = "run"')
    inproject = BENCHMARK % (json.dumps(["{python}", "-c", INLINE]), "")
    project = make_project(
        tmp_path_factory.mktemp("bench"),
        {},
        {
            "benchmarks/inrun.toml": inrun.encode(),
            "benchmarks/inproject.toml": inproject.encode(),
            "benchmarks/probe/main.py": PROBE.encode(),
        },
    )
    assert harness(project, up.home, "lock").returncode == 0
    return project


def _bench_run(project: Path, home: Path, benchmark: str) -> Path:
    before = set((home / "runs").iterdir()) if (home / "runs").exists() else set()
    result = harness(project, home, "run", "--benchmark", benchmark)
    assert result.returncode == 0, result.stdout + result.stderr
    [run_dir] = set((home / "runs").iterdir()) - before
    return run_dir


def test_a_worker_with_workdir_run_writes_into_its_own_run_record(benchmarks: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    runs = [_bench_run(benchmarks, home, "inrun") for _ in range(2)]
    for run_dir in runs:
        work = run_dir / "work"
        written = json.loads((work / "eval_result" / "probe" / "task" / "_result.json").read_text())
        assert written == {"cwd": str(work)}
        assert (run_dir / "from-template.txt").read_text() == "{run}", "{run} is the record's folder"
        launch = json.loads((run_dir / "config.json").read_text())["launch"]["command"]
        assert launch["cwd"] == str(work), "the record names the folder the worker ran in"
        # Its own code, from the store by absolute path, since the worker no longer starts there.
        script = Path(launch["argv"][2])
        assert script.is_absolute() and script.is_relative_to(home / "store") and script.name == "main.py"
        assert launch["argv"][3] == str(run_dir)
    assert not (benchmarks / "eval_result").exists() and not (benchmarks / "Assets").exists()
    # Two runs, two folders: nothing in how they were launched differs.
    diff = harness(benchmarks, home, "diff", runs[0].name, runs[1].name)
    assert diff.returncode == 0, diff.stderr
    assert "working directory" not in diff.stdout and "argv" not in diff.stdout, diff.stdout
    # The record goes whole, the worker's read-only folder included.
    pruned = harness(benchmarks, home, "runs", "prune", "--keep", "0")
    assert pruned.returncode == 0 and "removed 2 of 2" in pruned.stdout, pruned.stdout + pruned.stderr
    assert list((home / "runs").iterdir()) == []


def test_a_worker_runs_in_the_project_by_default(benchmarks: Path, tmp_path: Path) -> None:
    run_dir = _bench_run(benchmarks, tmp_path / "home", "inproject")
    try:
        assert (benchmarks / "eval_result" / "cwd.txt").read_text() == str(benchmarks)
        assert json.loads((run_dir / "config.json").read_text())["launch"]["command"]["cwd"] == str(benchmarks)
        assert not (run_dir / "work").exists()
    finally:
        shutil.rmtree(benchmarks / "eval_result", ignore_errors=True)
