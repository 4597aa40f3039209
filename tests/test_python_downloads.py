"""The interpreter real users get, end to end on the built-in example.

* **uv-managed** (the path every user with internet takes): uv installs the lock's CPython
  from a download list served on loopback (tests/pythondownloads.py: this machine's CPython
  repackaged as a python-build-standalone ``install_only`` archive), realize registers it
  under the lock's own name, builds the environments on it, and the example runs with no
  impurity; two homes agree on every path and hash; ``realize --offline`` needs nothing.
* **the offline cluster**: a machine with "internet" (the download list) realizes and pushes
  to a directory cache; a machine without it pulls and runs, with no impurity either.
* **host fallback**: without downloads, a host copy stands in under a name of its own with
  environments of their own, every report and record says so, and a later realize that can
  download replaces it.

The example's one wheel (numpy) comes from the real package index, like scripts/example.sh.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.lock.lockfile import read
from harness.lock.storepaths import is_host_interpreter
from harness.store.store import Store
from tests.conftest import REPO, run_harness_process
from tests.pythondownloads import python_downloads

pytestmark = [
    pytest.mark.network,
    pytest.mark.skipif(platform.system() != "Linux", reason="host copies (the archive's source) are Linux-only"),
]

NAMES = ("kinematics", "reach")
LOCK = read(REPO / "locks" / "kinematics.lock.toml")
VERSION = LOCK.python.version


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository's built-in example project (manifests, configs, locks)."""
    root = tmp_path_factory.mktemp("example")
    for rel in ("harness.toml", "services", "benchmarks", "configs", "locks"):
        source = REPO / rel
        if source.is_dir():
            shutil.copytree(source, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, root / rel)
    for deploy in (root / "configs" / "deploy").glob("*.toml") if (root / "configs" / "deploy").is_dir() else []:
        if not deploy.name.startswith("example-"):
            deploy.unlink()  # a developer's own deploy file stays out of the test
    return root


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a download list offering the lock's CPython, served on loopback."""
    try:
        with python_downloads(VERSION, tmp_path_factory.mktemp("python-downloads")) as url:
            yield url
    except HarnessError as exc:
        if "no installed CPython" in str(exc):
            pytest.skip(f"no CPython {VERSION} on this machine to repackage: {exc}")
        raise


def _env(**extra: str | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "UV_PYTHON_DOWNLOADS",
            "UV_PYTHON_DOWNLOADS_JSON_URL",
            "HARNESS_PYTHON_DOWNLOADS_JSON_URL",
            "HARNESS_SUBSTITUTERS",
            "HARNESS_TRUSTED_KEYS",
            "HARNESS_DEPLOY",
        )
    }
    # uv's default, said outright: the conftest forbids downloads for every other test, and
    # run_harness_process lays this over the process environment.
    env["UV_PYTHON_DOWNLOADS"] = "automatic"
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def harness(
    project: Path, home: Path, *args: str, env: dict[str, str], ok: bool = True, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    result = run_harness_process(
        "--project", str(project), "--home", str(home), *args, env=env, timeout=timeout, cwd=project
    )
    assert "Traceback" not in result.stderr, result.stderr
    if ok:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _last_run(home: Path) -> tuple[dict, dict]:  # type: ignore[type-arg]
    run_dir = max((home / "runs").iterdir())
    return (json.loads((run_dir / "config.json").read_text()), json.loads((run_dir / "lock.json").read_text()))


def _python_paths(home: Path) -> dict[str, str]:
    """Every registered interpreter: name → content hash."""
    return {r.name: r.content for r in Store.in_home(home).records() if r.kind == "python"}


def _pure_run(project: Path, home: Path, env: dict[str, str], *extra: str) -> None:
    """The example runs, its record names the lock's own interpreter and environments and no
    impurity, and a strict audit passes."""
    result = harness(project, home, "run", "--agent", "kinematics-only", *extra, env=env)
    assert "success rate 1.00" in result.stdout
    config, closure = _last_run(home)
    assert config["impurities"] == []
    for name in NAMES:
        lock = read(project / "locks" / f"{name}.lock.toml")
        info = closure["locks"][name]
        assert info["interpreter"] == lock.python.store and info["standing_in_for"] is None
        assert info["environment"] == lock.environment.store
    assert not any(entry["impure"] for entry in closure["store_paths"])
    harness(project, home, "audit", "--strict", "latest", env=env)


@pytest.fixture(scope="module")
def online(example: Path, downloads: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home realized "with internet": the interpreter through uv from the download list."""
    home = tmp_path_factory.mktemp("online") / "home"
    result = harness(example, home, "realize", *NAMES, env=_env(HARNESS_PYTHON_DOWNLOADS_JSON_URL=downloads))
    assert "impure" not in result.stdout and "stands in" not in result.stdout, result.stdout
    return home


def test_uv_managed_interpreter_end_to_end(example: Path, online: Path, downloads: str, tmp_path: Path) -> None:
    store = Store.in_home(online)
    record = store.record(LOCK.python.store)
    assert record is not None and record.impure is None and record.obtained == "uv-managed"
    assert list(_python_paths(online)) == [LOCK.python.store], "no host copy anywhere"
    for name in NAMES:
        assert store.is_registered(read(example / "locks" / f"{name}.lock.toml").environment.store)
    # The built environment runs on the uv-managed interpreter, from inside the store.
    env_python = store.root / LOCK.environment.store / "bin" / "python"
    probe = subprocess.run(
        [env_python, "-c", "import sys, numpy; print(sys.base_prefix)"], capture_output=True, text=True, check=True
    )
    assert os.path.realpath(probe.stdout.strip()) == os.path.realpath(store.root / LOCK.python.store)

    _pure_run(example, online, _env())

    # Another home, somewhere else: the same interpreter path with the same content hash.
    other = tmp_path / "elsewhere" / "home"
    harness(example, other, "realize", *NAMES, env=_env(HARNESS_PYTHON_DOWNLOADS_JSON_URL=downloads))
    assert _python_paths(other) == _python_paths(online)
    realized_there = {r.name: r.content for r in Store.in_home(other).records()}
    assert realized_there.items() <= {r.name: r.content for r in store.records()}.items()
    assert LOCK.environment.store in realized_there

    # Afterwards nothing needs the network: no download list, the full path (no stamp).
    shutil.rmtree(online / "cache" / "up-to-date", ignore_errors=True)
    again = harness(example, online, "realize", "--offline", *NAMES, env=_env(UV_PYTHON_DOWNLOADS="never"))
    assert again.stdout.count("up to date") == len(NAMES) and "impure" not in again.stdout, again.stdout


def test_offline_cluster_pulls_the_uv_managed_closure(example: Path, online: Path, tmp_path: Path) -> None:
    """The README's offline cluster: realize and push where there is internet; pull and run
    where there is none (no download list, downloads forbidden, --offline)."""
    keys = tmp_path / "keys"
    env = _env()
    harness(example, online, "store", "keygen", "--dir", str(keys), "lab", env=env)
    cache = tmp_path / "cache"
    harness(example, online, "store", "push", "--key", str(keys / "lab.secret"), str(cache), *NAMES, env=env)

    node = tmp_path / "node" / "home"
    offline = _env(
        UV_PYTHON_DOWNLOADS="never",
        HARNESS_SUBSTITUTERS=str(cache),
        HARNESS_TRUSTED_KEYS=(keys / "lab.public").read_text().strip(),
    )
    result = harness(example, node, "realize", "--offline", *NAMES, env=offline)
    assert "impure" not in result.stdout and "stands in" not in result.stdout, result.stdout
    assert _python_paths(node) == _python_paths(online)
    _pure_run(example, node, offline, "--offline")


def test_host_copy_stands_in_under_its_own_name_until_uv_can_install(
    example: Path, downloads: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    no_downloads = _env(UV_PYTHON_DOWNLOADS="never")
    result = harness(example, home, "realize", *NAMES, env=no_downloads)
    store = Store.in_home(home)
    [host] = _python_paths(home)
    assert is_host_interpreter(host) and host != LOCK.python.store and not store.is_registered(LOCK.python.store)
    assert store.record(host).impure.startswith("host: ")  # type: ignore[union-attr]
    # realize says plainly what stands in for what, and why.
    assert (
        f"host interpreter {host}" in result.stdout and f"stands in for the lock's {LOCK.python.store}" in result.stdout
    )
    assert "UV_PYTHON_DOWNLOADS=never forbids downloading it" in result.stdout
    # The environments built on it have paths of their own.
    for name in NAMES:
        lock = read(example / "locks" / f"{name}.lock.toml")
        assert not store.is_registered(lock.environment.store)
        assert f"{name}: built" in result.stdout and lock.environment.store not in result.stdout
    path = harness(example, home, "store", "path", "kinematics", env=no_downloads).stdout.strip()
    env_record = store.record(Path(path).name)
    assert Path(path).name != LOCK.environment.store and env_record is not None and env_record.references == (host,)

    # The example still runs (this is how it runs offline here), and its record names the copy.
    run = harness(example, home, "run", "--agent", "kinematics-only", env=no_downloads)
    assert "success rate 1.00" in run.stdout
    config, closure = _last_run(home)
    assert any(host in line and LOCK.python.store in line for line in config["impurities"])
    assert closure["locks"]["kinematics"]["interpreter"] == host
    assert closure["locks"]["kinematics"]["standing_in_for"] == LOCK.python.store
    audit = harness(example, home, "audit", "latest", env=no_downloads)
    assert "impure" in audit.stdout and host in audit.stdout
    assert harness(example, home, "audit", "--strict", "latest", env=no_downloads, ok=False).returncode == 1
    host_run = max((home / "runs").iterdir()).name

    # Every realize says it again (the fast path too)...
    assert "stands in" in harness(example, home, "realize", *NAMES, env=no_downloads).stdout
    # ...and `harness realize` tries again for the lock's own: with downloads possible, it
    # installs it through uv, and the runtime uses it; the host copy is garbage now.
    with_downloads = _env(HARNESS_PYTHON_DOWNLOADS_JSON_URL=downloads)
    replaced = harness(example, home, "realize", *NAMES, env=with_downloads)
    assert "impure" not in replaced.stdout and store.is_registered(LOCK.python.store), replaced.stdout
    _pure_run(example, home, with_downloads)
    diff = harness(example, home, "diff", host_run, "latest", env=with_downloads)
    assert (
        f"kinematics: interpreter {host} (host copy, standing in for {LOCK.python.store}) → "
        f"{LOCK.python.store}" in diff.stdout
    ), diff.stdout
    # gc keeps what recent runs used: once only the pure run counts, the copy goes.
    harness(example, home, "store", "gc", env={**with_downloads, "HARNESS_GC_KEEP_RUNS": "1"})
    assert not store.is_registered(host) and store.is_registered(LOCK.python.store)


def test_one_realize_asks_uv_for_an_interpreter_once(example: Path, tmp_path: Path) -> None:
    """Both example locks are built on one interpreter. When uv cannot provide it (a download
    list without it), the second lock goes straight to the host copy instead of asking uv again,
    which, with an unreachable list, means waiting through its retries a second time."""
    listing = tmp_path / "no-pythons.json"
    listing.write_text("{}\n")
    result = harness(
        example, tmp_path / "home", "realize", *NAMES, env=_env(HARNESS_PYTHON_DOWNLOADS_JSON_URL=str(listing))
    )
    asked = [line for line in result.stderr.splitlines() if line.endswith("(uv python install) ...")]
    assert len(asked) == 1, result.stderr
    assert result.stdout.count("stands in for the lock's") == len(NAMES), result.stdout


def test_a_failed_fetch_registers_no_interpreter(example: Path, downloads: str, tmp_path: Path) -> None:
    """uv installs the lock's interpreter while the wheels download; the wheel's bytes do not
    match the lock, so the interpreter (installed, or stopped at its next phase) is dropped. With a second lock
    that needs no wheel, that one is realized (and the interpreter with it) and the failure of
    the first names the file and both hashes."""
    lock = read(example / "locks" / "kinematics.lock.toml")
    [numpy] = [p for p in lock.packages if p.name == "numpy"]
    wheel = numpy.wheels[0]
    bad = tmp_path / "project"
    shutil.copytree(example, bad)
    path = bad / "locks" / "kinematics.lock.toml"
    path.write_text(path.read_text().replace(wheel.sha256, "0" * 64))
    env = _env(HARNESS_PYTHON_DOWNLOADS_JSON_URL=downloads)
    home = tmp_path / "home"
    store = Store.in_home(home)

    alone = harness(bad, home, "realize", "kinematics", env=env, ok=False)
    assert alone.returncode == 1, alone.stderr
    assert wheel.file in alone.stderr and "0" * 64 in alone.stderr and wheel.sha256 in alone.stderr
    assert list(store.records()) == []
    assert [p.name for p in store.root.iterdir() if not p.name.startswith(".")] == []
    assert list((store.root / ".tmp").iterdir()) == [], "the staged interpreter is gone"
    assert list((store.root / ".roots").glob("projects/*.json")) == [], "a failed realize roots nothing"

    both = harness(bad, home, "realize", *NAMES, env=env, ok=False)
    assert both.returncode == 1 and "1 of 2 failed to realize; 1 other(s) realized" in both.stderr, both.stderr
    failure = both.stderr.split("1 other(s) realized:", 1)[1]
    assert "kinematics: " in failure and wheel.file in failure and "0" * 64 in failure and wheel.sha256 in failure
    reach = read(example / "locks" / "reach.lock.toml")
    assert {r.name for r in store.records()} == {LOCK.python.store, reach.environment.store}
    assert list((store.root / ".tmp").iterdir()) == []
    [root] = (store.root / ".roots" / "projects").glob("*.json")
    assert set(json.loads(root.read_text())["locks"]) == {"reach"}, "the failed lock is no root"


def test_a_failed_download_is_not_waited_on_again_until_refresh(example: Path, tmp_path: Path) -> None:
    """uv could not install the interpreter for the first lock: the next realize that has work
    (the second lock, in a new process) uses the host copy without asking uv again, and says
    so; ``--refresh`` asks again, and so does a different download list."""
    listing = tmp_path / "no-pythons.json"
    listing.write_text("{}\n")
    env = _env(HARNESS_PYTHON_DOWNLOADS_JSON_URL=str(listing))
    home = tmp_path / "home"

    def asked(result: subprocess.CompletedProcess[str]) -> int:
        return sum(line.endswith("(uv python install) ...") for line in result.stderr.splitlines())

    first = harness(example, home, "realize", "kinematics", env=env)
    assert asked(first) == 1 and "stands in for the lock's" in first.stdout, first.stderr
    [note] = (home / "cache" / "python-unreachable").glob("*.json")
    assert note.stat().st_mode & 0o777 == 0o600 and str(listing) not in note.read_text()

    second = harness(example, home, "realize", "reach", env=env)
    assert asked(second) == 0, second.stderr
    assert "reach: built" in second.stdout and "not asked again" in second.stdout, second.stdout

    refreshed = harness(example, home, "realize", "--refresh", *NAMES, env=env)
    assert asked(refreshed) == 1, refreshed.stderr
    assert "not asked again" not in refreshed.stdout and "stands in for the lock's" in refreshed.stdout

    other = tmp_path / "other-pythons.json"
    other.write_text("{}\n")
    elsewhere = harness(example, home, "realize", *NAMES, env=_env(HARNESS_PYTHON_DOWNLOADS_JSON_URL=str(other)))
    assert asked(elsewhere) == 1, elsewhere.stderr


def test_an_unreachable_mirror_is_waited_on_once_then_run_and_up_use_the_stand_in(
    example: Path, tmp_path: Path
) -> None:
    """Issue 30, step 1, with a real uv: the download mirror is a closed port on loopback (a
    socket bound, never listening: every connection is refused, as on an offline cluster). The
    first realize asks uv once (without retries: a refused connection is not retried); `run`
    and `up` afterwards (each a full realize path: their sets of locks have no up-to-date
    stamp yet) use the host copy in place without asking uv; `--refresh` asks again."""
    import socket

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound and never listening: connections are refused
    port = closed.getsockname()[1]
    try:
        env = _env(UV_PYTHON_INSTALL_MIRROR=f"http://127.0.0.1:{port}/python-build-standalone")
        home = tmp_path / "home"

        def asked(result: subprocess.CompletedProcess[str]) -> int:
            return sum(line.endswith("(uv python install) ...") for line in result.stderr.splitlines())

        def timed(*args: str) -> tuple[subprocess.CompletedProcess[str], None]:
            return harness(example, home, *args, env=env), None

        first, _ = timed("realize", "kinematics")
        assert asked(first) == 1 and "Connection refused" in first.stdout, first.stdout + first.stderr
        assert "stands in for the lock's" in first.stdout
        [note] = (home / "cache" / "python-unreachable").glob("*.json")
        assert str(port) not in note.read_text(), "addresses are hashed, never written"

        # `run` realizes kinematics + reach (no stamp for that set): reach is built on the
        # host copy, and nothing asks uv.
        ran, _ = timed("run", "--quiet", "--agent", "kinematics-only")
        assert asked(ran) == 0 and "success rate 1.00" in ran.stdout, ran.stdout + ran.stderr
        _, closure = _last_run(home)
        assert closure["locks"]["reach"]["standing_in_for"] == LOCK.python.store

        # `up` (another set again: kinematics alone is stamped by the realize above, so drop
        # the stamps to take the full path) starts the service on the host copy, asking nothing.
        shutil.rmtree(home / "cache" / "up-to-date")
        upped, _ = timed("up", "--quiet", "kinematics")
        try:
            assert asked(upped) == 0, upped.stderr
        finally:
            harness(example, home, "down", env=env)

        refreshed = harness(example, home, "realize", "--refresh", "kinematics", env=env)
        assert asked(refreshed) == 1 and "not asked again" not in refreshed.stdout, refreshed.stderr
    finally:
        closed.close()


def test_a_download_that_cannot_connect_is_asked_once_and_a_server_error_with_uv_retries(
    example: Path, tmp_path: Path
) -> None:
    """uv's first try at the interpreter goes without HTTP retries: a mirror that refuses the
    connection (or whose name does not resolve) is not asked again within seconds, while one
    that answers with a server error gets uv's retries afterwards (the server counts the
    requests: the quick try, then uv's own tries). Either way the host copy stands in."""
    import http.server
    import threading

    from harness.realize.interpreter import _CANNOT_CONNECT

    seen: list[str] = []

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        mirror = f"http://127.0.0.1:{server.server_address[1]}/python-build-standalone"
        failed = harness(example, tmp_path / "home", "realize", "kinematics", env=_env(UV_PYTHON_INSTALL_MIRROR=mirror))
    finally:
        server.shutdown()
        server.server_close()
    assert "stands in for the lock's" in failed.stdout, failed.stdout + failed.stderr
    assert len(seen) >= 2 and len(set(seen)) == 1, seen  # the quick try, then uv's retries
    assert _CANNOT_CONNECT.search(failed.stdout) is None, "a server error is not a failed connection"

    # What uv says of a refused connection is what the first try stops at (uv's own words,
    # from the same `uv python install` realize runs).
    import socket

    from harness.resolve.uvtool import run_uv

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # never listening: refused
    try:
        mirror = f"http://127.0.0.1:{closed.getsockname()[1]}/python-build-standalone"
        said = run_uv(
            ["python", "install", f"cpython-{VERSION}", "--install-dir", tmp_path / "pythons", "--no-bin"],
            cache_dir=tmp_path / "uv-cache",
            env_extra={"UV_PYTHON_INSTALL_MIRROR": mirror, "UV_HTTP_RETRIES": "0"},
            python_downloads="manual",
            check=False,
        )
    finally:
        closed.close()
    assert said.returncode != 0 and _CANNOT_CONNECT.search(said.stderr), said.stderr
