"""Store lifecycle with real processes: gc never deletes what is in use, ``diff`` never misses
a change, and ``push`` never leaves an archive without its narinfo.

The races run ``harness store gc`` in a loop in its own process (:data:`GC_LOOP`) while a
real ``harness realize``, ``run``, ``up``, ``store push`` or ``store pull`` works in the same
home, a bounded number of times, and require every one of them to succeed. The loop is
*aggressive*: before each collection it removes the project roots and keeps no finished
run, so only the temporary roots of live processes (and ``up``'s services) protect anything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from harness.lock.lockfile import read
from harness.realize.builder import lock_objects
from harness.realize.standin import realized_lock
from harness.runs.audit import diff_runs
from harness.store.store import BuildResult, Store
from tests.ports import free_port
from tests.test_runs import _project, harness
from tests.upstreams import Upstreams

PORT = free_port()  # the service's port (tests/ports.py)

#: ``python -c GC_LOOP HOME STOP``: collect until STOP exists; print a JSON summary.
GC_LOOP = r"""
import json, sys, time, traceback
from pathlib import Path
from harness.store.gc import collect
from harness.store.store import Store
home, stop = Path(sys.argv[1]), Path(sys.argv[2])
store = Store.in_home(home)
rounds, deleted, errors = 0, 0, []
while not stop.exists() or rounds == 0:
    for root in (store.roots_dir / "projects").glob("*.json"):
        root.unlink(missing_ok=True)
    try:
        deleted += len(collect(store, dry_run=False, runs_dir=home / "runs", keep_runs=0).dead)
    except Exception:
        errors.append(traceback.format_exc())
    rounds += 1
    time.sleep(0.02)  # leave the cores to the process under test
print(json.dumps({"rounds": rounds, "deleted": deleted, "errors": errors}))
"""


@contextmanager
def gc_loop(home: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Collect ``home``'s store over and over while the block runs; the summary is filled in
    at the end (rounds, paths deleted, errors: there must be none)."""
    stop = tmp_path / f"stop-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", GC_LOOP, str(home), str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    summary: dict[str, Any] = {}
    try:
        yield summary
    finally:
        stop.touch()
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        summary.update(json.loads(out))
    assert summary["errors"] == [], summary["errors"]
    assert summary["rounds"] >= 1


@pytest.fixture(scope="module")
def project(up: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = _project(tmp_path_factory.mktemp("gc"), "alpha==1.0", PORT)
    assert harness(project, up.home, "lock").returncode == 0
    return project


def _run(project: Path, home: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    before = set((home / "runs").iterdir()) if (home / "runs").exists() else set()
    result = harness(project, home, "run", "--service", "svc", "--", sys.executable, "caller.py", *args)
    [run_dir] = set((home / "runs").iterdir()) - before
    return result, run_dir


# ------------------------------------------------------------------------------- races


def test_gc_racing_realize_into_a_fresh_home_never_breaks_it(project: Path, tmp_path: Path) -> None:
    for attempt in range(3):
        home = tmp_path / f"home{attempt}"
        with gc_loop(home, tmp_path) as summary:
            result = harness(project, home, "realize")
            assert result.returncode == 0, result.stderr
        assert summary["rounds"] >= 2


def test_gc_racing_runs_never_breaks_them(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with gc_loop(home, tmp_path) as summary:
        for _ in range(3):
            result, _ = _run(project, home)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "service answered svc" in result.stdout
    # Every run realized its closure again after the previous one was collected.
    assert summary["deleted"] > 0, summary


def test_gc_keeps_what_up_services_use_while_they_live(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert harness(project, home, "realize").returncode == 0
    store = Store.in_home(home)
    lock = realized_lock(Store.in_home(home), read(project / "locks" / "svc.lock.toml"))
    up = harness(project, home, "up", "--json")
    assert up.returncode == 0, up.stderr
    try:
        code = next(p.name for p in store.root.iterdir() if p.name.endswith("-svc-code"))
        why = harness(project, home, "store", "why", code).stdout
        assert "root services" in why and "services of harness up" in why, why
        with gc_loop(home, tmp_path) as summary:
            time.sleep(1)
        assert summary["rounds"] >= 1
        for name in [*lock_objects(lock), code]:
            assert store.is_registered(name), f"{name} was collected while up's services ran from it"
        status = json.loads(harness(project, home, "status", "--json").stdout)
        assert next(s for s in status["services"] if s["name"] == "svc")["state"] == "ready"
    finally:
        assert harness(project, home, "down").returncode == 0
    # Once the broker is gone, so is its root: an aggressive collection takes everything.
    with gc_loop(home, tmp_path):
        pass
    assert not store.is_registered(lock.environment.store)


def _add(store: Store, name: str, references: tuple[str, ...] = (), size: int = 1 << 16) -> str:
    def build(out: Path) -> BuildResult:
        out.mkdir()
        (out / "data").write_bytes(os.urandom(size))
        return BuildResult(obtained="test")

    store.add(name, "source", build, references=references)
    return name


def _orphans(cache: Path) -> list[str]:
    """Archives of ``cache`` that no narinfo names."""
    named = {
        line.split(":", 1)[1].strip()
        for info in cache.glob("*.narinfo")
        for line in info.read_text().splitlines()
        if line.startswith("URL:")
    }
    archives = (
        {str(p.relative_to(cache)) for p in (cache / "nar").glob("*") if not p.name.startswith(".")}
        if (cache / "nar").is_dir()
        else set()
    )
    return sorted(archives - named)


def test_push_and_pull_racing_gc(project: Path, tmp_path: Path) -> None:
    """Pushes of a realized closure and pulls of it into a fresh home, with gc collecting both
    homes throughout: every push and pull succeeds and the cache never holds an archive
    without its narinfo."""
    home = tmp_path / "home"
    assert harness(project, home, "realize").returncode == 0
    lock = realized_lock(Store.in_home(home), read(project / "locks" / "svc.lock.toml"))
    assert harness(project, home, "store", "keygen", "test", "--dir", str(tmp_path)).returncode == 0
    key = tmp_path / "test.secret"
    public = (tmp_path / "test.public").read_text().strip()
    for attempt in range(2):
        cache = tmp_path / f"cache{attempt}"
        other = tmp_path / f"other{attempt}"
        pushed = harness(project, home, "store", "push", str(cache), "svc", "--key", str(key))
        assert pushed.returncode == 0, pushed.stderr
        assert _orphans(cache) == []
        with gc_loop(other, tmp_path):
            # By store path: a fresh home asking for "svc" would want the lock's own interpreter,
            # and a host copy standing in for it here is never pushed under that name.
            pulled = harness(project, other, "store", "pull", str(cache), *lock_objects(lock), "--trusted-key", public)
            assert pulled.returncode == 0, pulled.stderr
            assert f"pulled {len(lock_objects(lock))} path(s)" in pulled.stdout or "already present" in pulled.stdout
        # The pushing home's paths are garbage to an aggressive gc: a push racing it either
        # roots them first (and publishes all) or finds them gone and says so.
        again = tmp_path / f"again{attempt}"
        with gc_loop(home, tmp_path):
            late = harness(project, home, "store", "push", str(again), "svc", "--key", str(key))
        assert late.returncode == 0 or "collected by `harness store gc`" in late.stderr, late.stderr
        assert "cannot hash" not in late.stderr
        if again.exists():
            assert _orphans(again) == []
        assert harness(project, home, "realize").returncode == 0  # put back what gc took


def test_a_failed_push_takes_back_its_archives(tmp_path: Path) -> None:
    from harness.cache.backends import open_backend
    from harness.cache.format import CacheError
    from harness.cache.transfer import push

    store = Store(tmp_path / "store")
    leaf = _add(store, "a" * 32 + "-leaf")
    top = _add(store, "b" * 32 + "-top", references=(leaf,))
    # The leaf changed since registration: it is refused, so top (which needs it) gets no
    # narinfo; the archive top already uploaded must not stay behind.
    data = store.root / leaf / "data"
    (store.root / leaf).chmod(0o755)
    data.chmod(0o644)
    data.write_bytes(b"tampered")
    cache = tmp_path / "cache"
    with pytest.raises(CacheError, match="changed since it was registered"):
        push(store, [top], open_backend(str(cache)), secret=None, cache_dir=tmp_path / "c")
    assert list(cache.glob("*.narinfo")) == []
    assert _orphans(cache) == []
    assert [p for p in (cache / "nar").iterdir() if not p.name.startswith(".")] == []


def test_a_push_of_a_collected_path_says_so(project: Path, tmp_path: Path) -> None:
    gone = "c" * 32 + "-gone"
    result = harness(project, tmp_path, "store", "push", str(tmp_path / "cache"), gone)
    assert result.returncode != 0
    assert f"{gone} is not registered" in result.stderr and "collected by `harness store gc`" in result.stderr
    assert not (tmp_path / "cache" / f"{gone[:32]}.narinfo").exists()


# ------------------------------------------------------------ runs kept, pinned, audited


def test_gc_keeps_the_last_runs_and_pinned_ones_and_audit_names_what_went(project: Path, tmp_path: Path) -> None:
    work = tmp_path / "project"
    shutil.copytree(project, work)
    home = tmp_path / "home"
    first, run_a = _run(work, home)
    assert first.returncode == 0, first.stderr
    old_code = json.loads((run_a / "lock.json").read_text())["locks"]["svc"]["code"]
    server = work / "services" / "servers" / "fake_model.py"
    server.write_text(server.read_text() + "\n# edited: new code, a new store path\n")
    second, run_b = _run(work, home)
    assert second.returncode == 0, second.stderr
    new_code = json.loads((run_b / "lock.json").read_text())["locks"]["svc"]["code"]
    assert new_code != old_code
    env = {"HARNESS_GC_KEEP_RUNS": "1"}

    def store_cmd(*args: str) -> subprocess.CompletedProcess[str]:
        from tests.conftest import run_harness_process

        return run_harness_process("--project", str(work), "--home", str(home), *args, env=env)

    # The current checkout's code is a project root; the old code only run A used.
    assert f"root project {work.resolve()} (code of svc)" in store_cmd("store", "why", new_code).stdout
    dry = store_cmd("store", "gc", "--dry-run").stdout
    assert f"would delete {old_code}: last used by run {run_a.name}, older than the last 1 runs" in dry
    assert harness(work, home, "runs", "pin", run_a.name).returncode == 0
    assert f"root pinned run {run_a.name}" in store_cmd("store", "why", old_code).stdout
    assert old_code not in store_cmd("store", "gc", "--dry-run").stdout
    assert json.loads(harness(work, home, "runs", "--json").stdout)[-1]["pinned"] is True
    assert harness(work, home, "runs", "pin", "--remove", run_a.name).returncode == 0
    assert store_cmd("store", "gc").returncode == 0
    assert not (home / "store" / old_code).exists()
    assert (home / "store" / new_code).exists(), "the checkout's code is kept"
    audit = harness(work, home, "audit", run_a.name)
    assert audit.returncode == 1
    assert f"1 path(s) of this run are gone from the store: {old_code}" in audit.stdout
    assert harness(work, home, "audit", run_b.name).returncode == 0


def test_gc_after_runs_prune_collects_what_only_removed_runs_used(project: Path, tmp_path: Path) -> None:
    """`[gc] keep-runs` counts the records that exist: once `runs prune` removed run A's
    record, the code only A used is no run's any more, and gc collects it; run B's stays."""
    work = tmp_path / "project"
    shutil.copytree(project, work)
    home = tmp_path / "home"
    first, run_a = _run(work, home)
    assert first.returncode == 0, first.stderr
    old_code = json.loads((run_a / "lock.json").read_text())["locks"]["svc"]["code"]
    server = work / "services" / "servers" / "fake_model.py"
    server.write_text(server.read_text() + "\n# edited: new code, a new store path\n")
    second, run_b = _run(work, home)
    assert second.returncode == 0, second.stderr
    new_code = json.loads((run_b / "lock.json").read_text())["locks"]["svc"]["code"]
    # Both records are among the last 10 runs: gc keeps A's code.
    assert f"root run {run_a.name}" in harness(work, home, "store", "why", old_code).stdout
    assert old_code not in harness(work, home, "store", "gc", "--dry-run").stdout
    pruned = harness(work, home, "runs", "prune", "--keep", "1")
    assert pruned.returncode == 0 and f"removed run {run_a.name}" in pruned.stdout, pruned.stdout
    collected = harness(work, home, "store", "gc")
    assert collected.returncode == 0, collected.stderr
    assert not (home / "store" / old_code).exists(), collected.stdout
    assert (home / "store" / new_code).exists()
    assert harness(work, home, "audit", run_b.name).returncode == 0, "the kept run is whole and complete"


# --------------------------------------------------------------------------------- diff


def _mutated(
    run_dir: Path, tmp_path: Path, name: str, change: Callable[[dict[str, Any], dict[str, Any]], None]
) -> Path:
    """A copy of ``run_dir`` whose config and closure ``change(config, closure)`` edited."""
    target = tmp_path / name
    shutil.copytree(run_dir, target)
    config = json.loads((target / "config.json").read_text())
    closure = json.loads((target / "lock.json").read_text())
    change(config, closure)
    (target / "config.json").write_text(json.dumps(config))
    (target / "lock.json").write_text(json.dumps(closure))
    return target


def _other(path: str) -> str:
    """Another store path name of the same name (a different hash)."""
    return ("z" if path[0] != "z" else "y") * 32 + path[32:]


def test_diff_names_exactly_each_change(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    result, run_dir = _run(project, home)
    assert result.returncode == 0, result.stderr
    config = json.loads((run_dir / "config.json").read_text())
    launch = config["launch"]["services"]["svc"]
    # The record names the full launch: argv after templates, cwd, the variables harness
    # sets, and the store paths they name (the environment and the code).
    lock = realized_lock(Store.in_home(home), read(project / "locks" / "svc.lock.toml"))
    assert launch["argv"][0] == str(home / "store" / lock.environment.store / "bin" / "python")
    assert launch["env"]["PYTHONNOUSERSITE"] == "1" and "CUDA_VISIBLE_DEVICES" in launch["env"]
    assert "PATH" not in launch["env"] and "HOME" not in launch["env"]
    code = json.loads((run_dir / "lock.json").read_text())["locks"]["svc"]["code"]
    assert set(launch["store_paths"]) == {lock.environment.store, code}
    assert config["launch"]["command"]["env"]["HARNESS_SERVICE_SVC_URL"].endswith(str(PORT))
    assert config["launch"]["command"]["argv"] == [sys.executable, "caller.py"]
    # The broker's token is named among the variables harness set, never recorded.
    assert config["launch"]["command"]["env"].get("HARNESS_BROKER_TOKEN") in (None, "(secret)")

    # Two runs with one and the same record differ in nothing.
    assert diff_runs(run_dir, _mutated(run_dir, tmp_path, "same", lambda c, k: None)) == []

    env = lock.environment.store
    new_env = _other(env)

    def new_environment(c: dict[str, Any], k: dict[str, Any]) -> None:
        """What a different environment store path changes besides its own inputs."""
        svc = c["launch"]["services"]["svc"]
        svc["argv"] = [a.replace(env, new_env) for a in svc["argv"]]
        svc["store_paths"] = sorted(new_env if p == env else p for p in svc["store_paths"])
        k["locks"]["svc"]["environment"] = new_env
        for entry in k["store_paths"]:
            if entry["path"] == env:
                entry["path"], entry["content"] = new_env, "blake3:" + "0" * 64

    def with_source(install: str, commit: str) -> Callable[[dict[str, Any], dict[str, Any]], None]:
        def change(c: dict[str, Any], k: dict[str, Any]) -> None:
            k["locks"]["svc"]["sources"]["toolkit"] = {
                "repo": "file:///repo",
                "commit": commit,
                "tree": commit[:8],
                "install": install,
                "subdirectory": None,
            }

        return change

    def with_weights(sha: str) -> Callable[[dict[str, Any], dict[str, Any]], None]:
        def change(c: dict[str, Any], k: dict[str, Any]) -> None:
            k["locks"]["svc"]["weights"]["hf"] = {"model.safetensors": sha}

        return change

    def both(
        *changes: Callable[[dict[str, Any], dict[str, Any]], None],
    ) -> Callable[[dict[str, Any], dict[str, Any]], None]:
        def change(c: dict[str, Any], k: dict[str, Any]) -> None:
            for one in changes:
                one(c, k)

        return change

    def command(c: dict[str, Any], k: dict[str, Any]) -> None:
        c["launch"]["services"]["svc"]["argv"] += ["--weights-file", "other.bin"]
        k["locks"]["svc"]["manifest_digest"] = "blake3:" + "1" * 64  # the manifest changed too

    def argv(c: dict[str, Any], k: dict[str, Any]) -> None:
        c["command"] = c["command"] + ["7"]
        c["argv"] = c["argv"] + ["7"]
        c["launch"]["command"]["argv"] += ["7"]

    def env_var(c: dict[str, Any], k: dict[str, Any]) -> None:
        c["launch"]["services"]["svc"]["env"]["PYTHONUNBUFFERED"] = "0"

    def package(c: dict[str, Any], k: dict[str, Any]) -> None:
        k["locks"]["svc"]["packages"]["alpha"] = "2.0"
        k["locks"]["svc"]["manifest_digest"] = "blake3:" + "2" * 64
        new_environment(c, k)

    def new_code(c: dict[str, Any], k: dict[str, Any]) -> None:
        other = _other(code)
        k["locks"]["svc"]["code"] = other
        svc = c["launch"]["services"]["svc"]
        svc["cwd"] = svc["cwd"].replace(code, other)
        svc["store_paths"] = sorted(other if p == code else p for p in svc["store_paths"])

    def deploy(c: dict[str, Any], k: dict[str, Any]) -> None:
        c["deploy"] = {"path": "/lab/deploy.toml", "text": "gpus = [0]\n"}

    def placement(c: dict[str, Any], k: dict[str, Any]) -> None:
        c["plan"]["services"][0]["gpu"] = 1
        c["launch"]["services"]["svc"]["env"]["CUDA_VISIBLE_DEVICES"] = "1"

    base_with_source = _mutated(run_dir, tmp_path, "src", with_source("regular", "c" * 40))
    base_with_weights = _mutated(run_dir, tmp_path, "weights", with_weights("a" * 64))
    cases: list[tuple[str, Path, Callable[[dict[str, Any], dict[str, Any]], None], str]] = [
        ("command", run_dir, command, "svc: command {store}/svc-env/bin/python -u services/servers/"),
        ("argv", run_dir, argv, "configuration command: ["),
        (
            "install",
            base_with_source,
            both(with_source("editable", "c" * 40), new_environment),
            "svc: source toolkit install: regular → editable",
        ),
        ("env", run_dir, env_var, "svc: env PYTHONUNBUFFERED: 1 → 0"),
        (
            "weight",
            base_with_weights,
            both(with_weights("b" * 64), new_environment),
            f"svc: weights hf model.safetensors: {'a' * 64} → {'b' * 64}",
        ),
        ("package", run_dir, package, "svc: package alpha: 1.0 → 2.0"),
        (
            "commit",
            base_with_source,
            both(with_source("regular", "d" * 40), new_environment),
            f"svc: source toolkit: {'c' * 40} → {'d' * 40}",
        ),
        ("code", run_dir, new_code, f"svc: code {code} → {_other(code)}"),
        ("deploy", run_dir, deploy, "configuration deploy: None → "),
        ("placement", run_dir, placement, "placement svc.gpu: None → 1"),
        ("environment alone", run_dir, new_environment, f"svc: environment {env} → {new_env}"),
    ]
    for label, base, change, expected in cases:
        lines = diff_runs(base, _mutated(base, tmp_path, f"case-{label}", change))
        assert len(lines) == 1 and lines[0].startswith(expected), (label, lines)
    # The command line itself is named, both ways.
    [line] = diff_runs(run_dir, _mutated(run_dir, tmp_path, "cmd2", command))
    assert "--weights-file" in line and "{store}/" in line and str(home) not in line


def test_diff_names_a_changed_service_command(project: Path, tmp_path: Path) -> None:
    """The issue's case, end to end: the service's command changed (another argument, as
    when it names another weight file), the closure did not; diff names the command and
    nothing else."""
    home = tmp_path / "home"
    work = tmp_path / "project"
    shutil.copytree(project, work)
    first, run_a = _run(work, home)
    assert first.returncode == 0, first.stderr
    manifest = work / "services" / "svc.toml"
    text = manifest.read_text()
    manifest.write_text(text.replace('"--name", "svc"', '"--name", "svc", "--exit-code", "4"'))
    assert harness(work, home, "lock").returncode == 0
    second, run_b = _run(work, home)
    assert second.returncode == 0, second.stderr
    diff = harness(work, home, "diff", run_a.name, run_b.name)
    lines = diff.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("svc: command ") and "--exit-code" in lines[0], lines
    manifest.write_text(text)


# ----------------------------------------------------------------------------- settings


def test_gc_settings_and_their_bad_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.config import load_settings
    from harness.errors import InputError

    monkeypatch.delenv("HARNESS_GC_KEEP_RUNS", raising=False)
    monkeypatch.delenv("HARNESS_GC_KEEP_WHEEL_FILES", raising=False)
    assert load_settings(tmp_path).gc_keep_runs == 10 and load_settings(tmp_path).gc_keep_wheel_files is False
    (tmp_path / "config.toml").write_text("[gc]\nkeep-runs = 3\nmissing-project-days = 0\nkeep-wheel-files = true\n")
    settings = load_settings(tmp_path)
    assert settings.gc_keep_runs == 3 and settings.gc_missing_project_days == 0
    assert settings.gc_keep_wheel_files is True
    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "0")
    assert load_settings(tmp_path).gc_keep_wheel_files is False
    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "no")
    with pytest.raises(InputError, match="HARNESS_GC_KEEP_WHEEL_FILES"):
        load_settings(tmp_path)
    monkeypatch.delenv("HARNESS_GC_KEEP_WHEEL_FILES")
    monkeypatch.setenv("HARNESS_GC_KEEP_RUNS", "5")
    assert load_settings(tmp_path).gc_keep_runs == 5
    for text, key in (
        ('keep-runs = "ten"', "gc.keep-runs"),
        ("missing-project-days = -1", "gc.missing-project-days"),
        ('keep-wheel-files = "no"', "gc.keep-wheel-files: expected true or false"),
        ("keep = 1", "gc.keep: unknown key"),
    ):
        (tmp_path / "config.toml").write_text(f"[gc]\n{text}\n")
        with pytest.raises(InputError, match=key) as info:
            load_settings(tmp_path)
        assert str(tmp_path / "config.toml") in str(info.value)
    monkeypatch.setenv("HARNESS_GC_KEEP_RUNS", "many")
    (tmp_path / "config.toml").unlink()
    with pytest.raises(InputError, match="HARNESS_GC_KEEP_RUNS"):
        load_settings(tmp_path)


# ------------------------------------------------------------- giving up what a realize registered


def test_discard_unused_deletes_only_what_no_one_else_took_up(tmp_path: Path) -> None:
    """What a failed realize gives up goes unless another holder roots it, a pin or a run (of
    any age) names it, a project recorded it, or a kept path references it; the caller's own
    temporary roots count for nothing, and referrers go before what they reference."""
    from harness.store.gc import discard_unused, register_project
    from harness.store.hashing import store_hash, store_path_name
    from harness.store.roots import TempRoots, held
    from harness.store import gc

    home = tmp_path / "home"
    store = Store.in_home(home)
    names = {
        k: _add(store, store_path_name(store_hash("source", k, {}), k), size=64)
        for k in ("held", "pinned", "recorded", "run", "referenced", "gone", "gone-too")
    }
    # Registered after what they reference, as a build would; neither is given up.
    keeper = _add(store, store_path_name(store_hash("source", "keeper", {}), "keeper"), (names["referenced"],))
    # "top" references "gone": both go, the referrer first.
    top = _add(store, store_path_name(store_hash("source", "top", {}), "top"), (names["gone"],))
    gc.pin(store, keeper)
    gc.pin(store, names["pinned"])
    # A project that realized "recorded" (its folder holds no locks now: gc would not keep it).
    (tmp_path / "elsewhere").mkdir()
    register_project(store, tmp_path / "elsewhere", {"svc": [names["recorded"]]})
    run = home / "runs" / "20260101-000000-000-abcd"
    run.mkdir(parents=True)
    (run / "lock.json").write_text(json.dumps({"store_paths": [{"path": names["run"]}]}))
    own = TempRoots(store, "the failed realize")
    own.add([*names.values(), top])
    order: list[str] = []
    try:
        with held(store, [names["held"]], "another realize"):
            deleted = discard_unused(store, [*names.values(), top], own_roots=own.path, before_delete=order.append)
    finally:
        own.close()
    assert deleted == sorted([names["gone"], names["gone-too"], top])
    assert order.index(top) < order.index(names["gone"])
    assert sorted(order) == deleted
    assert {r.name for r in store.records()} == {
        keeper,
        *(names[k] for k in ("held", "pinned", "recorded", "run", "referenced")),
    }


# ------------------------------------------------------------- keep-wheel-files = false


def test_without_wheel_files_the_environment_runs_and_audits_and_a_second_one_fetches(
    project: Path, tmp_path: Path
) -> None:
    """Issue 30 step 3: with `[gc] keep-wheel-files = false` realize drops the package files
    once the environment is registered and verified; the run and its audit need none of them,
    an offline realize of it has nothing to do, and a second environment that installs one of
    them and a wheel never streamed here is refused offline naming the new one only (uv's
    cache holds the other), and is realized online."""
    from harness.lock.objects import build_inputs
    from tests.conftest import run_harness_process

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[gc]\nkeep-wheel-files = false\n")
    result, run_dir = _run(project, home)
    assert result.returncode == 0, result.stdout + result.stderr
    store = Store.in_home(home)
    lock = realized_lock(store, read(project / "locks" / "svc.lock.toml"))
    files = build_inputs(lock)
    assert files and store.is_registered(lock.environment.store)
    assert not [name for name in files if store.is_registered(name)], "the package files were dropped"
    assert not [p.name for p in store.root.iterdir() if p.name.endswith(".whl")]
    assert harness(project, home, "audit", run_dir.name).returncode == 0
    assert harness(project, home, "store", "verify").returncode == 0
    again = harness(project, home, "realize", "--offline")
    assert again.returncode == 0, again.stderr
    # A second environment installing the same alpha wheel, and beta.
    second = _project_like(project, tmp_path / "second", 'alpha==1.0", "beta==1.0')
    assert harness(second, home, "lock").returncode == 0
    offline = harness(second, home, "realize", "--offline")
    assert offline.returncode != 0
    assert "offline" in offline.stderr and "wheel beta-1.0-" in offline.stderr, offline.stderr
    assert "alpha" not in offline.stderr, "alpha was streamed here: uv's cache holds it"
    online = harness(second, home, "realize")
    assert online.returncode == 0, online.stderr
    other = realized_lock(store, read(second / "locks" / "svc.lock.toml"))
    assert store.is_registered(other.environment.store)
    assert not [name for name in build_inputs(other) if store.is_registered(name)]
    ran = run_harness_process("--project", str(second), "--home", str(home), "store", "path", "svc")
    env_python = Path(ran.stdout.strip().splitlines()[-1]) / "bin" / "python"
    assert subprocess.run([str(env_python), "-c", "import alpha, beta"]).returncode == 0


def test_gc_collects_wheel_files_only_when_asked(project: Path, tmp_path: Path) -> None:
    """With `[gc] keep-wheel-files = true` (`HARNESS_GC_KEEP_WHEEL_FILES=1`) a project's locks
    keep their package files (a second environment builds offline from them); at the default
    (false) gc collects those of an environment that is registered, and nothing it runs from."""
    from harness.lock.objects import build_inputs, lock_objects
    from tests.conftest import run_harness_process

    home, keep = tmp_path / "home", {"HARNESS_GC_KEEP_WHEEL_FILES": "1"}
    realized = run_harness_process("--project", str(project), "--home", str(home), "realize", env=keep)
    assert realized.returncode == 0, realized.stderr
    store = Store.in_home(home)
    lock = realized_lock(store, read(project / "locks" / "svc.lock.toml"))
    files = [name for name in build_inputs(lock) if store.is_registered(name)]
    assert files
    kept = run_harness_process("--project", str(project), "--home", str(home), "store", "gc", env=keep)
    assert kept.returncode == 0 and all(store.is_registered(name) for name in files), kept.stdout
    drop = {"HARNESS_GC_KEEP_WHEEL_FILES": "0"}
    dry = run_harness_process("--project", str(project), "--home", str(home), "store", "gc", "--dry-run", env=drop)
    assert all(f"would delete {name}" in dry.stdout for name in files), dry.stdout
    done = run_harness_process("--project", str(project), "--home", str(home), "store", "gc", env=drop)
    assert done.returncode == 0, done.stderr
    assert not [name for name in files if store.is_registered(name)]
    assert all(store.is_registered(name) for name in lock_objects(lock))
    assert harness(project, home, "realize", "--offline").returncode == 0


def _project_like(project: Path, root: Path, requirement: str) -> Path:
    """A copy of ``project`` whose service asks for ``requirement`` instead (not locked yet)."""
    shutil.copytree(project, root, ignore=shutil.ignore_patterns("locks"))
    manifest = root / "services" / "svc.toml"
    manifest.write_text(manifest.read_text().replace('"alpha==1.0"', f'"{requirement}"'))
    return root
