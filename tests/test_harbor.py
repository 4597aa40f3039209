"""Harbor trials on realized harness environments (issue 8), with real ``harbor`` and real sandboxes.

Two kinds of test:

* **sandbox** tests drive :mod:`harness.harbor.sandbox` (bubblewrap + nsenter) directly, on
  a store realized here: read-only ``/usr`` and store, timeouts that leave no process,
  nothing written outside the session root, transfers that stay inside, a broker reachable
  from a sandbox without network. They need user namespaces (skipped, with the reason, where
  bwrap cannot create them) but not Harbor.
* **harbor** tests run the real ``harbor`` CLI (``harbor run``, ``harbor job regrade``,
  ``harbor job resume``) with ``-e harness.harbor:HarnessEnvironment`` on the example tasks
  of ``tests/harbor/``. Harbor needs Python >= 3.12: in the main (3.11) suite they are
  skipped, with the reason; ``.ci/run`` runs this file again in a 3.12 venv with
  the ``harbor`` extra.

Issue 18 added: pure tests of the task-user plan, the limits (on a fake cgroup tree), the
Dockerfile translation, ``init`` and the host facts; sandbox tests of memory limits and of a
namespace with one id; a Harbor job of ``tests/harbor/reach-users`` (task users, ``cpus =
0.5``, network); and the Landlock + PRoot confinement with ``user.max_user_namespaces = 0`` —
set inside a user namespace of the test's own (the limit is per user namespace), so nothing
else on the machine notices and it is gone when the test ends; any user can run it.

Issue 33 (step 2) added: a task's Dockerfile applied or refused, never dropped — the pure plan
of each step, the checks and copies of :mod:`harness.harbor.image`, and Harbor jobs of
``tests/harbor/dockerfile-steps`` (ENV, WORKDIR, COPY, USER checked by its verifier; with and
without user namespaces), of the same task with an unsupported step, and of
``tests/harbor/compose-sidecar`` (refused naming its sidecar).

Issue 33 (steps 1 and 6) added: ``tests/harbor/kuka-two-station``, shaped like the seed's KUKA
task, whose ``docker_image`` labels name the rootfs templates of ``tests/harbor/kuka-project``
(Debian packages built here and served from a local archive, ``tests/debarchive.py``), graded
1.0 by the oracle with and without user namespaces.

The environment is a test project's ``reach`` benchmark locked for this machine's CPython
(an interpreter and an empty venv), realized offline into a temporary ``HARNESS_HOME``; the
example task itself runs verbatim (the repository's ``reach`` lock, CPython 3.11.7) where
that interpreter is installed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from collections.abc import Sequence
from typing import Any

import psutil
import pytest

from harness.errors import InputError
from harness.harbor.sandbox import Sandbox, SandboxConfig, SandboxPathError, inside_path, unavailable_reason
from harness.harbor.spec import read_spec

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "tests" / "harbor"
ENV = "harness.harbor:HarnessEnvironment"

_SANDBOX_REASON = unavailable_reason()
needs_sandbox = pytest.mark.skipif(_SANDBOX_REASON is not None, reason=f"no native sandbox here: {_SANDBOX_REASON}")
_HARBOR_BIN = Path(sys.executable).parent / "harbor"
_HARBOR_REASON = (
    f"Harbor is not importable in this Python ({platform.python_version()}; it needs >= 3.12): "
    "`.ci/run` runs these tests in a Python 3.12 venv with the harbor extra"
    if importlib.util.find_spec("harbor") is None or not _HARBOR_BIN.exists()
    else None
)
needs_harbor = pytest.mark.skipif(_HARBOR_REASON is not None, reason=_HARBOR_REASON or "")

MANIFEST = (
    (REPO / "benchmarks" / "reach.toml")
    .read_text()
    .replace('python = "3.11"', f'python = "{platform.python_version()}"')
)


# ------------------------------------------------------------------------------ fixtures


def _harness(home: Path, *args: str, project: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HARNESS_HOME": str(home), "UV_PYTHON_DOWNLOADS": "never"}
    cmd = [sys.executable, "-m", "harness", *(["--project", str(project)] if project else []), *args]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A project whose ``reach`` benchmark is this CPython and nothing else; (root, pin)."""
    from harness.lock.lockfile import read

    root = tmp_path_factory.mktemp("harbor-project")
    (root / "services").mkdir()
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "reach.toml").write_text(MANIFEST)
    result = _harness(tmp_path_factory.mktemp("lock-home"), "lock", "reach", "--offline", project=root)
    assert result.returncode == 0, result.stderr
    return root, read(root / "locks" / "reach.lock.toml").environment.store


@pytest.fixture(scope="module")
def home(project: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A HARNESS_HOME with the project's ``reach`` realized."""
    home = tmp_path_factory.mktemp("harbor-home")
    result = _harness(home, "realize", "reach", "--offline", project=project[0])
    assert result.returncode == 0, result.stderr
    return home


def _realized_env(home: Path, project: tuple[Path, str]) -> str:
    """The environment the project's ``reach`` lock realized to in ``home``: downloads are off
    here, so a host copy stands in for the lock's interpreter, with an environment of its own."""
    from harness.lock.lockfile import read
    from harness.realize.standin import realized_lock
    from harness.store.store import Store

    return realized_lock(Store.in_home(home), read(project[0] / "locks" / "reach.lock.toml")).environment.store


def _closure(home: Path, pin: str) -> list[Path]:
    from harness.cache.transfer import closure
    from harness.store.store import Store

    store = Store.in_home(home)
    return [store.path(name) for name in closure(store, [pin])]


def _task(name: str, dest: Path, project: Path, pin: str, *, folder: str | None = None) -> Path:
    """A copy of example task ``name`` whose harness.toml names the test project's environment."""
    task = dest / (folder or name)
    shutil.copytree(EXAMPLES / name, task)
    (task / "environment" / "harness.toml").write_text(
        f'manifest = "reach"\nproject = "{project}"\nenvironment = "{pin}"\n'
    )
    return task


def _harbor(
    *args: str, home: Path, cwd: Path, timeout: float = 240, prefix: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """``harbor ARGS`` with ``home`` as the harness home (``prefix``: a command it runs under)."""
    env = {
        **os.environ,
        "HARNESS_HOME": str(home),
        "UV_PYTHON_DOWNLOADS": "never",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "COLUMNS": "200",
    }
    argv = [*prefix, str(_HARBOR_BIN), *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _harbor_job(
    tasks: Path, jobs: Path, name: str, home: Path, *extra: str, no_userns: bool = False, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``harbor run`` of the task (or folder of tasks) ``tasks`` with the oracle agent, its job
    ``name`` under ``jobs`` (``extra``: more options); ``no_userns``: on a machine without
    user namespaces (simulated for this command's own processes only)."""
    argv = ["run", "-p", str(tasks), "-a", "oracle", "-e", ENV, *extra, "-o", str(jobs), "--job-name", name]
    return _harbor(*argv, home=home, cwd=cwd or jobs.parent, timeout=300, prefix=_NO_USERNS if no_userns else ())


def _confined_trial(task: Path, tmp_path: Path, home: Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The oracle's trial of ``task`` where no user namespace can be made (job ``confined``):
    its result, checked to have raised nothing; its record, checked to say Landlock and PRoot
    confined it; and what its verifier printed ("" where it printed nothing)."""
    result = _harbor_job(task, tmp_path / "jobs", "confined", home, no_userns=True)
    assert result.returncode == 0, result.stdout + result.stderr
    [trial] = _trials(tmp_path / "jobs" / "confined").values()
    assert trial["exception_info"] is None, trial["exception_info"]
    record = json.loads((trial["_dir"] / "harness" / "env.json").read_text())
    assert record["sandbox"]["backend"] == "landlock+proot", record["sandbox"]
    printed = trial["_dir"] / "verifier" / "test-stdout.txt"
    return trial, record, printed.read_text() if printed.is_file() else ""


def _trials(job: Path) -> dict[str, dict[str, Any]]:
    """task folder name -> the trial's result.json (with its folder under "_dir")."""
    out = {}
    for result in job.glob("*/result.json"):
        data = json.loads(result.read_text())
        data["_dir"] = result.parent
        out[result.parent.name.rsplit("__", 1)[0]] = data
    return out


def _reward(trial: dict[str, Any]) -> dict[str, float] | None:
    return (trial.get("verifier_result") or {}).get("rewards")


def _processes_with(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _python_installed(version: str, platform_tag: str) -> bool:
    from harness.resolve.interpreter import installed_paths, list_pythons

    try:
        return bool(installed_paths(version, list_pythons(None), platform=platform_tag))
    except Exception:
        return False


# ---------------------------------------------------------------------------------- spec


def test_spec_forms_and_overrides(tmp_path: Path) -> None:
    env = tmp_path / "environment"
    env.mkdir()
    (env / "harness.toml").write_text('manifest = "reach"\nenvironment = "' + "a" * 32 + '-reach-env"\n')
    spec = read_spec(env)
    assert (spec.form, spec.manifest, spec.environment) == ("manifest", "reach", "a" * 32 + "-reach-env")
    # --ek manifest names another environment: the file's pin no longer applies.
    other = read_spec(env, {"manifest": "kinematics", "project": "proj"}, cwd=tmp_path)
    assert (other.manifest, other.environment, other.project) == ("kinematics", None, tmp_path / "proj")
    assert "--ek" in other.source
    # --ek environment alone re-pins the same manifest (and lands in Harbor's lock.json).
    assert read_spec(env, {"environment": "b" * 32 + "-x"}).environment == "b" * 32 + "-x"
    (env / "harness.toml").write_text('lock = "reach.lock.toml"\n')
    assert read_spec(env).lock == env / "reach.lock.toml"
    for text, message in (
        ('manifest = "a"\nlock = "b"\n', "either manifest or lock"),
        ('image = "x"\n', "unknown key"),
        ('environment = "nope"\n', "not a store path"),
        ("manifest = \n", "not valid TOML"),
        ("", "names no environment"),
    ):
        (env / "harness.toml").write_text(text)
        with pytest.raises(InputError, match=message):
            read_spec(env)
    (env / "harness.toml").unlink()
    with pytest.raises(InputError, match="no environment/harness.toml"):
        read_spec(env)


def test_inside_paths_refuse_escapes() -> None:
    assert inside_path("/app/./x/../y") == "/app/y"
    for bad in ("app/x", "/../etc/passwd", "/app/../../etc", ""):
        with pytest.raises(SandboxPathError):
            inside_path(bad)


# ------------------------------------------------------------------------------- sandbox


def _sandbox(tmp_path: Path, home: Path, pin: str, **kw: Any) -> Sandbox:
    return Sandbox(
        SandboxConfig(root=tmp_path / "root", store_paths=_closure(home, pin), dirs=["/app", "/logs/agent"], **kw)
    )


def _env(home: Path, pin: str) -> dict[str, str]:
    env = home / "store" / pin
    return {"PATH": f"{env}/bin:/usr/bin:/bin", "HOME": "/root", "HARNESS_ENVIRONMENT": str(env)}


@needs_sandbox
def test_store_and_usr_are_read_only(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    pin = _realized_env(home, project)

    async def scenario() -> list[str]:
        box = _sandbox(tmp_path, home, pin, network=False)
        await box.start()
        try:
            outcomes = []
            for target in (
                "/usr/harness-probe",
                "/etc/harness-probe",
                f"{home}/store/{pin}/probe",
                f"{home}/store/{pin}/bin/python",
            ):
                r = await box.exec(f"echo x >> {target}", cwd="/app", env=_env(home, pin))
                outcomes.append(r.stderr or "")
            r = await box.exec(
                "mount -o remount,rw /usr; chmod u+w $HARNESS_ENVIRONMENT/bin", cwd="/app", env=_env(home, pin)
            )
            assert r.return_code != 0
            r = await box.exec(
                "python -c 'import sys; print(sys.prefix)' && echo ok > /app/written && grep CapEff /proc/self/status",
                cwd="/app",
                env=_env(home, pin),
            )
            assert r.return_code == 0, r
            assert r.stdout.splitlines()[0] == f"{home}/store/{pin}"
            caps = int(r.stdout.split()[-1], 16)
            # Root keeps Docker's default set where task users can have ids, else none; never
            # CAP_SYS_ADMIN (21), which could remount the read-only binds, nor CAP_SYS_PTRACE (19).
            assert caps & ((1 << 21) | (1 << 19)) == 0
            assert caps == 0 if not box.idmap.multi else caps & 0b11 == 0b11  # chown, dac_override
            assert (tmp_path / "root" / "app" / "written").read_text() == "ok\n"
            return outcomes
        finally:
            await box.stop(delete=True)

    outcomes = asyncio.run(scenario())
    # bin/python is read-only twice over (mode 0555, no capability to override it).
    assert all("Read-only file system" in o or "Permission denied" in o for o in outcomes), outcomes
    assert sum("Read-only file system" in o for o in outcomes) >= 3, outcomes
    assert not Path("/usr/harness-probe").exists() and not (home / "store" / pin / "probe").exists()
    assert not (tmp_path / "root").exists()  # stop(delete=True)


@needs_sandbox
def test_exec_streams_output_as_it_comes(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    """``on_output`` gets each stream's text while the command still runs, and the outcome
    holds the same text, each stream apart; a stream with nothing on it is None."""
    pin = _realized_env(home, project)

    async def scenario() -> None:
        box = _sandbox(tmp_path, home, pin, network=False)
        await box.start()
        try:
            pieces: list[tuple[str, str]] = []
            first = asyncio.get_running_loop().create_future()

            async def seen(text: str, stream: str) -> None:
                pieces.append((stream, text))
                if not first.done():
                    first.set_result(None)

            command = "echo one; echo bad >&2; until [ -e /app/go ]; do sleep 0.05; done; echo two; exit 5"
            task = asyncio.ensure_future(box.exec(command, cwd="/app", env=_env(home, pin), on_output=seen))
            await asyncio.wait_for(first, timeout=30)  # output arrives before the command ends
            assert not task.done()
            (tmp_path / "root" / "app" / "go").write_text("\n")
            outcome = await asyncio.wait_for(task, timeout=30)
            assert (outcome.return_code, outcome.stdout, outcome.stderr) == (5, "one\ntwo\n", "bad\n")
            assert "".join(t for s, t in pieces if s == "stdout") == "one\ntwo\n"
            assert "".join(t for s, t in pieces if s == "stderr") == "bad\n"
            quiet = await box.exec("true", cwd="/app", env=_env(home, pin))
            assert (quiet.return_code, quiet.stdout, quiet.stderr) == (0, None, None)
        finally:
            await box.stop(delete=True)

    asyncio.run(scenario())


@needs_sandbox
def test_timeout_kills_the_whole_process_group(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    pin = _realized_env(home, project)
    marker = f"{os.getpid() % 1000 + 3000}"

    async def scenario() -> None:
        box = _sandbox(tmp_path, home, pin, network=False)
        await box.start()
        try:
            started = time.monotonic()
            with pytest.raises(RuntimeError, match="Command timed out after 1 seconds"):
                await box.exec(
                    f"sleep {marker}1 & (sleep {marker}2 &) ; sleep {marker}3",
                    cwd="/app",
                    env=_env(home, pin),
                    timeout=1,
                )
            assert time.monotonic() - started < 5
            await asyncio.sleep(0.2)
            assert not _processes_with(f"sleep {marker}"), "a timed-out command left processes behind"
            # Cancellation (Harbor's agent timeout) kills the group too.
            task = asyncio.ensure_future(box.exec(f"sleep {marker}4", cwd="/app", env=_env(home, pin)))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.2)
            assert not _processes_with(f"sleep {marker}4")
            # A background process outlives its command (as in a container) until stop().
            r = await box.exec(f"nohup sleep {marker}5 >/dev/null 2>&1 &", cwd="/app", env=_env(home, pin))
            assert r.return_code == 0
            assert _processes_with(f"sleep {marker}5")
        finally:
            await box.stop(delete=True)
        await asyncio.sleep(0.2)
        assert not _processes_with(f"sleep {marker}")

    asyncio.run(scenario())


@needs_sandbox
def test_nothing_is_written_outside_the_session_root(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    """Every directory the sandbox sees (the store paths, /usr and /etc to depth 3, the root's
    own folders) is tried; whatever could be created exists only under the session root."""
    pin = _realized_env(home, project)
    token = f"harness-probe-{os.getpid()}"
    script = (
        "for d in / $(find / -maxdepth 3 \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -type d -print) "
        '$(find "$HARNESS_ENVIRONMENT" -type d); do '
        f'if touch "$d/{token}" 2>/dev/null; then echo "W $d"; else echo "R $d"; fi; done'
    )

    async def scenario() -> str:
        box = _sandbox(tmp_path, home, pin, network=False)
        await box.start()
        try:
            r = await box.exec(script, cwd="/", env=_env(home, pin), timeout=120)
            return r.stdout or ""
        finally:
            await box.stop(delete=False)

    lines = asyncio.run(scenario()).splitlines()
    written = [line[2:] for line in lines if line.startswith("W ")]
    refused = [line[2:] for line in lines if line.startswith("R ")]
    root = tmp_path / "root"
    assert written and refused
    assert any(d.startswith("/usr") for d in refused) and any(d.startswith(str(home)) for d in refused)
    for folder in written:
        assert (root / folder.lstrip("/") / token).is_file(), folder
        assert not folder.startswith(("/usr", "/etc", str(home / "store"))), folder
        host = Path(folder) / token
        # os.path.exists: False where this user may not even look (e.g. /root): nor could it write
        assert not os.path.exists(host) or host.is_relative_to(root), f"{host} written outside the root"
    for folder in refused:
        assert not os.path.exists(Path(folder) / token)
    found = subprocess.run(["find", str(home), "/usr", "/etc", "-name", token], capture_output=True, text=True)
    assert found.stdout == ""


@needs_sandbox
def test_transfers_stay_inside(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    pin = _realized_env(home, project)
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "a.txt").write_text("a")
    (tmp_path / "up" / "sub").mkdir()
    (tmp_path / "up" / "sub" / "b.txt").write_text("b")

    async def scenario() -> None:
        box = _sandbox(tmp_path, home, pin, network=False)
        await box.start()
        try:
            await box.upload_dir(tmp_path / "up", "/app/in")
            await box.upload_file(tmp_path / "up" / "a.txt", "/tests/deep/a.txt")
            r = await box.exec(
                "cat /app/in/a.txt /app/in/sub/b.txt /tests/deep/a.txt && "
                "ln -s /etc /app/in/etc-link && ln -s ../../../../../etc/passwd /app/in/up && "
                "ln -s sub/b.txt /app/in/inside",
                cwd="/app",
                env=_env(home, pin),
            )
            assert (r.return_code, r.stdout) == (0, "aba"), r
            for bad in ("relative/x", "/../x", "/usr/bin/x", f"{home}/store/{pin}/x", "/proc/1/environ"):
                with pytest.raises(SandboxPathError):
                    await box.upload_file(tmp_path / "up" / "a.txt", bad)
            with pytest.raises(RuntimeError):  # /etc is read-only inside, whatever the path says
                await box.upload_file(tmp_path / "up" / "a.txt", "/app/in/etc-link/passwd")
            await box.download_dir("/app/in", tmp_path / "down")
            await box.download_file("/app/in/sub/b.txt", tmp_path / "b.txt")
            with pytest.raises(RuntimeError):
                await box.download_file("/app/missing", tmp_path / "missing")
        finally:
            await box.stop(delete=True)

    asyncio.run(scenario())
    down = tmp_path / "down"
    assert (down / "a.txt").read_text() == "a" and (down / "sub" / "b.txt").read_text() == "b"
    assert os.readlink(down / "inside") == "sub/b.txt"  # a link inside the download is kept
    assert not (down / "etc-link").exists() and not (down / "etc-link").is_symlink()  # pointing out: skipped
    assert not (down / "up").is_symlink()
    assert (tmp_path / "b.txt").read_text() == "b" and not (tmp_path / "missing").exists()


@needs_sandbox
def test_broker_reachable_without_network(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    """A real broker on the host's loopback answers inside a sandbox that has no network;
    a port that is not forwarded stays unreachable."""
    from harness.runtime.broker import Broker
    from harness.runtime.plan import Plan

    pin = _realized_env(home, project)
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    broker = Broker(Plan(services=()), {}, tmp_path / "state")
    try:
        url = broker.serve_in_thread()
        port = int(url.rsplit(":", 1)[1])
        probe = (
            "import json, os, socket, urllib.request\n"
            "print(json.load(urllib.request.urlopen(os.environ['HARNESS_BROKER'] + '/health', timeout=5))['status'])\n"
            f"s = socket.socket()\ns.settimeout(2)\nprint(s.connect_ex(('127.0.0.1', {other.getsockname()[1]})))\n"
        )

        async def scenario() -> str:
            box = _sandbox(tmp_path, home, pin, network=False, forward_ports=[port])
            await box.start()
            try:
                r = await box.exec(
                    f"python -c {shlex.quote(probe)}", cwd="/app", env={**_env(home, pin), "HARNESS_BROKER": url}
                )
                assert r.return_code == 0, r
                return r.stdout or ""
            finally:
                await box.stop(delete=True)

        out = asyncio.run(scenario()).splitlines()
    finally:
        broker.shutdown()
        other.close()
    assert out[0] == "ok"
    assert out[1] != "0"  # connection refused: only forwarded ports exist inside


# -------------------------------------------------------------------------------- harbor


@needs_harbor
@needs_sandbox
def test_environment_exec_honours_cwd_env_and_timeout(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    """HarnessEnvironment as Harbor calls it, in-process: cwd, env (persistent < per call),
    timeout_sec, transfers, the record; a broken spec fails at start, not at construction."""
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from harness.harbor import HarnessEnvironment
    from harness.harbor.resolve import EnvironmentUnavailable

    root, pin = project
    task = _task("reach-python", tmp_path, root, pin)
    trial = TrialPaths(trial_dir=tmp_path / "trial")
    trial.mkdir()

    def make(**kw: Any) -> Any:
        return HarnessEnvironment(
            environment_dir=task / "environment",
            environment_name="reach-python",
            session_id="trial__env",
            trial_paths=trial,
            task_env_config=EnvironmentConfig(network_mode="no-network", workdir="/work"),
            persistent_env={"A": "persistent", "B": "persistent"},
            home=str(home),
            **kw,
        )

    async def scenario() -> None:
        env = make()
        await env.start(force_build=False)
        try:
            r = await env.exec("pwd; echo $A $B; python -c 'import sys; print(sys.prefix)'", env={"B": "call"})
            realized = _realized_env(home, project)  # a host copy may stand in, with its own environment
            assert r.stdout.splitlines() == ["/work", "persistent call", f"{home}/store/{realized}"], r
            r = await env.exec("pwd; exit 3", cwd="/tmp")
            assert (r.return_code, r.stdout) == (3, "/tmp\n")
            with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
                await env.exec("sleep 30", timeout_sec=1)
            await env.upload_dir(task / "tests", "/tests")
            assert await env.is_file("/tests/test.sh") and await env.is_dir("/logs/verifier")
            await env.download_file("/tests/test.sh", tmp_path / "test.sh")
            assert (tmp_path / "test.sh").read_bytes() == (task / "tests" / "test.sh").read_bytes()
        finally:
            await env.stop(delete=True)
        record = json.loads((trial.trial_dir / "harness" / "env.json").read_text())
        assert record["session"]["commands"] >= 5 and record["sandbox"]["workdir"] == "/work"
        broken = make(manifest="absent")  # constructing never raises: the trial fails at start
        with pytest.raises(EnvironmentUnavailable, match="no lock at"):
            await broken.start(force_build=False)
        await broken.stop(delete=True)

    asyncio.run(scenario())


@needs_harbor
@needs_sandbox
def test_example_task_scores_one_with_record_and_digest(tmp_path: Path, project: tuple[Path, str]) -> None:
    """The documented one-command run of tests/harbor/reach-python: realized on first use into
    an empty HARNESS_HOME, scored 1.0, its harness record in the trial directory and the
    environment's pin covered by the task digest in lock.json."""
    from harness.lock.lockfile import read

    home = tmp_path / "home"
    repo_lock = read(REPO / "locks" / "reach.lock.toml")
    if _python_installed(repo_lock.python.version, repo_lock.python.platform):
        task, cwd, pin, extra = EXAMPLES / "reach-python", REPO, repo_lock.environment.store, []
    else:  # this machine lacks CPython 3.11.7 offline: the same task on the test project's lock
        task, cwd, pin = EXAMPLES / "reach-python", tmp_path, project[1]
        extra = ["--ek", f"project={project[0]}", "--ek", "manifest=reach", "--ek", f"environment={pin}"]
    result = _harbor_job(task, tmp_path / "jobs", "example", home, "--ek", "offline=true", *extra, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    job = tmp_path / "jobs" / "example"
    trial = _trials(job)["reach-python"]
    assert trial["exception_info"] is None, trial["exception_info"]
    assert _reward(trial) == {"reward": 1.0}
    record = json.loads((trial["_dir"] / "harness" / "env.json").read_text())
    from harness.realize.standin import realized_lock
    from harness.store.store import Store

    # As realized in that home: a host copy standing in for the interpreter has its own environment.
    lock_file = (REPO if cwd == REPO else project[0]) / "locks" / "reach.lock.toml"
    assert record["environment"]["store"] == realized_lock(Store.in_home(home), read(lock_file)).environment.store
    assert set(record["environment"]["realized_now"]) == {e["path"] for e in record["closure"]["store_paths"]}
    kinds = {e["kind"]: e for e in record["closure"]["store_paths"]}
    assert set(kinds) == {"python", "environment"}
    assert all(e["content"].startswith("blake3:") for e in kinds.values())
    assert record["interpreter"]["store"] == kinds["python"]["path"]
    assert record["environment"]["digest"].startswith("sha256:")
    assert record["sandbox"]["network"] == "none" and record["session"]["root_deleted"] is True
    assert not (trial["_dir"] / "harness" / "env").exists()
    # lock.json (the trial's and the job's) carries the task digest that covers harness.toml.
    digest = json.loads((trial["_dir"] / "lock.json").read_text())["task"]["digest"]
    assert record["task"]["digest"] == record["task"]["lock_json_digest"] == digest
    assert digest in (job / "lock.json").read_text()


@needs_harbor
@needs_sandbox
def test_separate_verifier_and_job_regrade(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    root, pin = project
    task = _task("reach-separate", tmp_path / "tasks", root, pin)
    result = _harbor_job(task, tmp_path / "jobs", "sep", home)
    assert result.returncode == 0, result.stdout + result.stderr
    trial = _trials(tmp_path / "jobs" / "sep")["reach-separate"]
    assert trial["exception_info"] is None, trial["exception_info"]
    assert _reward(trial) == {"reward": 1.0}  # the verifier's sandbox was fresh: no scratch file
    records = sorted(p.name for p in (trial["_dir"] / "harness").glob("*.json"))
    assert records[0] == "env.json" and records[1].startswith("verifier__"), records
    verifier = json.loads((trial["_dir"] / "harness" / records[1]).read_text())
    assert (
        verifier["session"]["id"] != json.loads((trial["_dir"] / "harness" / "env.json").read_text())["session"]["id"]
    )

    # Regrade with a new verifier (same task name): only a separate verifier runs.
    v2 = tmp_path / "v2" / "reach-separate"
    shutil.copytree(task, v2)
    test = v2 / "tests" / "test.sh"
    test.write_text(
        test.read_text().replace(
            'open("/logs/verifier/reward.txt", "w").write("1\\n" if ok and fresh else "0\\n")',
            'json.dump({"reward": float(ok and fresh), "v2": 1.0}, open("/logs/verifier/reward.json", "w"))',
        )
    )
    assert "v2" in test.read_text()
    result = _harbor(
        "job",
        "regrade",
        str(tmp_path / "jobs" / "sep"),
        "-p",
        str(v2),
        "-e",
        ENV,
        "-o",
        str(tmp_path / "jobs"),
        "--job-name",
        "regraded",
        home=home,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    regraded = next(iter(_trials(tmp_path / "jobs" / "regraded").values()))
    assert regraded["exception_info"] is None, regraded["exception_info"]
    assert _reward(regraded) == {"reward": 1.0, "v2": 1.0}
    assert [p.name for p in (regraded["_dir"] / "harness").glob("*.json")] == [records[1]]  # no agent session


@needs_harbor
@needs_sandbox
def test_bad_environments_fail_their_trial_only_and_resume_refuses_drift(
    tmp_path: Path, project: tuple[Path, str], home: Path
) -> None:
    root, pin = project
    tasks = tmp_path / "tasks"
    good = _task("reach-python", tasks, root, pin, folder="good")
    missing = _task("reach-python", tasks, root, pin, folder="missing")
    (missing / "environment" / "harness.toml").write_text(f'manifest = "absent"\nproject = "{root}"\n')
    drifted = _task("reach-python", tasks, root, pin, folder="drifted")
    (drifted / "environment" / "harness.toml").write_text(
        f'manifest = "reach"\nproject = "{root}"\nenvironment = "{"0" * 32}-reach-env"\n'
    )
    slow = _task("reach-python", tasks, root, pin, folder="slow")
    marker = f"{os.getpid() % 1000 + 5000}7"
    (slow / "solution" / "solve.sh").write_text(f"#!/bin/bash\nsleep {marker} & sleep {marker}\n")
    config = (slow / "task.toml").read_text().replace("[agent]\ntimeout_sec = 120.0", "[agent]\ntimeout_sec = 2.0")
    (slow / "task.toml").write_text(config)
    result = _harbor_job(tasks, tmp_path / "jobs", "mixed", home, "-n", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    trials = _trials(tmp_path / "jobs" / "mixed")
    assert set(trials) == {"good", "missing", "drifted", "slow"}
    assert trials["good"]["exception_info"] is None and _reward(trials["good"]) == {"reward": 1.0}
    for name, words in (("missing", "no lock at"), ("drifted", "the environment drifted")):
        info = trials[name]["exception_info"]
        assert info["exception_type"] == "EnvironmentUnavailable", info
        assert words in info["exception_message"], info
    assert trials["slow"]["exception_info"]["exception_type"] == "AgentTimeoutError"
    assert not _processes_with(f"sleep {marker}"), "the timed-out agent left processes behind"

    # Re-pinning a task changes its digest: the recorded job refuses to resume.
    (good / "environment" / "harness.toml").write_text(
        f'manifest = "reach"\nproject = "{root}"\nenvironment = "{"1" * 32}-reach-env"\n'
    )
    result = _harbor("job", "resume", "-p", str(tmp_path / "jobs" / "mixed"), home=home, cwd=tmp_path)
    assert result.returncode != 0
    assert "does not match" in result.stdout + result.stderr


# ------------------------------------------------------------------- users, limits, host


def test_task_users_plan_and_files() -> None:
    from harness.harbor.ids import IdMap, UserTable

    multi = IdMap("root", 0, 0, 100000, 100000, 65536)
    table = UserTable.plan(["agent", "verifier", "agent", 1500, "root"], multi)
    assert {n: (u.uid, u.gid) for n, u in table.users.items()} == {
        "root": (0, 0),
        "agent": (1000, 1000),
        "verifier": (1001, 1001),
        "1500": (1500, 1500),
    }
    assert table.get(None) is None and table.get("root") is None and table.get(0) is None
    assert table.get("agent").uid == 1000 and table.get(1500).uid == 1500  # type: ignore[union-attr]
    assert "agent:x:1000:1000:agent:/home/agent:/bin/bash" in table.passwd().splitlines()
    assert "verifier:x:1001:" in table.group().splitlines()
    assert multi.uid_lines() == "0 0 1\n1 100000 65536\n" and multi.host_uid(1000) == 100999
    with pytest.raises(ValueError, match="outside"):
        UserTable.plan([70000], multi)
    single = IdMap("single", 1000, 1000, reason="task users need newuidmap")
    assert list(UserTable.plan(["agent"], single).users) == ["root"]


def test_subid_ranges_are_read_per_user(tmp_path: Path) -> None:
    from harness.harbor.ids import _subid_range

    (tmp_path / "subuid").write_text("alice:100000:65536\nbob:165536:0\n1001:231072:1000\n")
    assert _subid_range(tmp_path / "subuid", ("alice", "1000")) == (100000, 65536)
    assert _subid_range(tmp_path / "subuid", ("bob", "1002")) is None  # an empty range is none
    assert _subid_range(tmp_path / "subuid", ("carol", "1001")) == (231072, 1000)
    assert _subid_range(tmp_path / "missing", ("alice",)) is None


def test_limits_fall_back_to_per_process_limits_and_say_so() -> None:
    from harness.harbor.limits import enforce

    none = enforce("s", None, None)
    assert (none.cpu_enforced, none.memory_enforced, none.procs) == (False, False, [])
    out = enforce("s", 0.5, 256, use_cgroups=False)
    assert out.address_space == 256 * 1024 * 1024 and out.memory_enforced
    assert "session total watched" in out.memory_how and out.no_cgroup == "cgroups not used"
    assert out.watch_bytes == 256 * 1024 * 1024
    assert out.affinity and len(out.affinity) == 1 and "whole CPUs: 0.5 asked" in out.cpu_how
    outer, inner = out.wrap("/bin/sh", "/usr/bin/prlimit", "/usr/bin/taskset")
    assert outer == [] and inner[:2] == ["/usr/bin/prlimit", f"--as={256 << 20}:{256 << 20}"]
    assert inner[3:5] == ["/usr/bin/taskset", "-c"] and len(inner) == 6  # taskset takes no "--"
    record = out.as_json()
    assert record["cpus"] == 0.5 and record["cgroups"] == []


def test_limits_read_cgroup_v1_and_v2_layouts(tmp_path: Path) -> None:
    """A fake /proc/self and cgroup tree: v2 without controllers falls back to v1, which sets
    exact quotas; the cgroup is removed on release."""
    from harness.harbor.limits import PERIOD_US, enforce

    v1cpu, v1mem, v2 = tmp_path / "cpu", tmp_path / "memory", tmp_path / "unified"
    for folder in (v1cpu / "a", v1mem / "b", v2):
        folder.mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("")  # hybrid: no controllers on the v2 tree
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(
        f"32 31 0:29 / {v1cpu} rw,relatime - cgroup cgroup rw,cpu\n"
        f"35 31 0:32 / {v1mem} rw,relatime - cgroup cgroup rw,memory\n"
        f"41 31 0:38 / {v2} rw,relatime - cgroup2 cgroup2 rw\n"
    )
    (proc / "cgroup").write_text("4:memory:/b\n1:cpu:/a\n0::/\n")
    out = enforce("trial__env", 1.5, 512, proc=proc)
    assert out.cpu_enforced and out.memory_enforced, out.as_json()
    cpu_dir, mem_dir = out.cgroups
    assert cpu_dir.parent == v1cpu / "a" and mem_dir.parent == v1mem / "b"
    assert (cpu_dir / "cpu.cfs_quota_us").read_text() == str(int(1.5 * PERIOD_US))
    assert (mem_dir / "memory.limit_in_bytes").read_text() == str(512 << 20)
    assert out.address_space is None and out.affinity is None
    assert [p.name for p in out.procs] == ["cgroup.procs", "cgroup.procs"]
    for folder in out.cgroups:  # a real cgroup folder's files vanish with it
        for f in folder.iterdir():
            f.unlink()
    out.release()
    assert not cpu_dir.exists() and not mem_dir.exists()


def test_dockerfile_translation_lists_every_step_it_cannot_translate() -> None:
    from harness.harbor.dockerfile import translate

    text = (
        "FROM python:3.12-slim AS base\n# a comment\n"
        "RUN apt-get update && apt-get install -y git \\\n    && rm -rf /var/lib/apt/lists/*\n"
        "COPY requirements.txt /tmp/req.txt\n"
        "RUN pip install --no-cache-dir -r /tmp/req.txt && python -m pip install 'numpy==2.1.0' requests\n"
        "RUN uv pip install --system pyyaml>=6 ./local_pkg\nWORKDIR /app\nUSER agent\nENV A=1\n"
        "RUN curl -L x | sh\n"
    )
    out = translate(text, lambda path: "attrs==24.2.0\n# c\nsix\n--hash x\n" if path == "requirements.txt" else None)
    assert out.python == "3.12"
    assert out.requirements == ["attrs==24.2.0", "six", "numpy==2.1.0", "requests", "pyyaml>=6"]
    steps = "\n".join(out.untranslated)
    for expected in (
        "line 1: FROM python:3.12-slim",
        "line 3: RUN apt-get install -y git",
        "--hash x",
        "./local_pkg",
        "RUN curl -L x | sh",
    ):
        assert expected in steps, (expected, steps)
    for applied in ("COPY", "WORKDIR", "USER", "ENV"):  # each trial applies these (issue 33)
        assert applied not in steps, (applied, steps)
    assert (out.workdir, out.user) == ("/app", "agent")
    # System packages: a trial applies apt-get install on a rootfs template that pins them.
    apt = [step for step in out.untranslated if "apt-get install" in step]
    assert len(apt) == 1 and "come from a rootfs template" in apt[0] and "host" not in apt[0], apt
    other = translate("FROM ubuntu:22.04\nRUN pip3 install flask\nRUN apk add --no-cache git\n")
    assert other.python is None and other.requirements == ["flask"]
    assert "not a python:X base" in other.untranslated[0]
    assert "RUN apk add --no-cache git: a trial refuses this" in "\n".join(other.untranslated), other.untranslated


def test_init_writes_manifest_and_harness_toml(tmp_path: Path) -> None:
    from harness.harbor.__main__ import main
    from harness.harbor.spec import read_spec
    from harness.manifests.project import Project

    root = tmp_path / "proj"
    task = root / "tasks" / "My Task"
    (task / "environment").mkdir(parents=True)
    (task / "task.toml").write_text("[environment]\n")
    (task / "environment" / "Dockerfile").write_text(
        "FROM python:3.11\nCOPY requirements.txt .\nRUN pip install -r requirements.txt\nRUN make\n"
    )
    (task / "environment" / "requirements.txt").write_text("six==1.16.0\n")
    assert main(["init", str(task), "--project", str(root)]) == 0
    manifest = Project(root).load_benchmarks()["my-task"]
    assert manifest.environment.python == "3.11" and manifest.environment.requirements == ["six==1.16.0"]
    assert "not translated: line 4: RUN make" in (root / "benchmarks" / "my-task.toml").read_text()
    spec = read_spec(task / "environment")
    assert spec.manifest == "my-task" and spec.project is not None and spec.project.resolve() == root
    assert main(["init", str(task), "--project", str(root)]) == 2  # exists: refused without --force
    assert main(["init", str(tmp_path / "nowhere")]) == 2  # not a task
    # What a trial would refuse, said by init and by check (issue 33).
    from harness.harbor.__main__ import _refused, init

    said = init(task, root, "again", None, True)
    assert "a trial refuses: line 4: RUN make: an arbitrary command" in "\n".join(said), said
    assert "line 4: RUN make" in (_refused(task) or "")
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11\nCOPY requirements.txt .\n")
    assert _refused(task) is None


def test_host_summary_and_executables_cache(tmp_path: Path) -> None:
    from harness.harbor import host

    summary = host.summary()
    assert summary["kernel"] == platform.release() and summary["machine"] == platform.machine()
    if platform.libc_ver()[0] == "glibc":
        assert summary["libc"].startswith("glibc ")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "tool"
    tool.write_text("#!/bin/sh\necho 1\n")
    tool.chmod(0o755)
    (bin_dir / "data.txt").write_text("not executable")
    (bin_dir / "link").symlink_to("tool")
    first = host.executables(tmp_path / "cache", dirs=(str(bin_dir),))
    import hashlib

    sha = hashlib.sha256(tool.read_bytes()).hexdigest()
    assert first == {str(tool): sha, str(bin_dir / "link"): sha}
    assert (tmp_path / "cache" / host.CACHE_NAME).is_file()
    tool.write_text("#!/bin/sh\necho 2\n")  # changed: hashed again, not served from the cache
    second = host.executables(tmp_path / "cache", dirs=(str(bin_dir),))
    assert second[str(tool)] == hashlib.sha256(tool.read_bytes()).hexdigest() != sha
    assert host.digest(first) != host.digest(second)


def test_host_libraries_follow_the_loader(tmp_path: Path) -> None:
    """The shared libraries an executable loads, found from its ELF headers as the loader
    finds them (interpreter, DT_NEEDED, RUNPATH, ldconfig's cache), transitively, hashed;
    a script has none; what is under an excluded folder (the store) is followed, not listed."""
    import hashlib

    from harness.harbor import host

    python = os.path.realpath(sys.executable)
    deps = host.elf_dependencies(python)
    assert deps is not None and deps[0] and any(n.startswith("libc.so") for n in deps[1] + _needed_below(deps))
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\n")
    assert host.elf_dependencies(str(script)) is None
    found, missing = host.libraries([python, str(script)], tmp_path / "cache")
    libc = next(p for p in found if os.path.basename(p).startswith("libc.so"))
    assert found[libc] == hashlib.sha256(Path(libc).read_bytes()).hexdigest()
    assert os.path.realpath(deps[0]) in found  # the loader itself
    assert missing == []
    # A folder excluded (as the store is): its libraries are followed, not listed.
    own = [p for p in found if p.startswith(os.path.dirname(os.path.dirname(python)))]
    if own:  # an interpreter with a libpython beside it (pyenv's): libc still comes through it
        kept, _ = host.libraries([python], None, exclude=(os.path.dirname(own[0]),))
        assert own[0] not in kept and libc in kept


def _needed_below(deps: tuple[Any, ...]) -> tuple[str, ...]:
    """The DT_NEEDED names of the libraries an ELF file's own DT_NEEDED resolve to (libc may be
    a dependency of libpython rather than of the interpreter)."""
    from harness.harbor import host

    names: tuple[str, ...] = ()
    for name in deps[1]:
        for folder in (*deps[2], *host.DEFAULT_LIB_DIRS):
            below = host.elf_dependencies(os.path.join(folder, name))
            if below:
                names += below[1]
                break
    return names


@needs_harbor
@needs_sandbox
def test_task_users_limits_and_host_in_a_job_with_network(
    tmp_path: Path, project: tuple[Path, str], home: Path
) -> None:
    """tests/harbor/reach-users: [agent] user and [verifier] user under ids of their own with
    Docker's permissions where this machine can map them (else the record and the trial log
    say why not), cpus = 0.5 (fractional: the job must run) and memory_mb enforced as the
    record says, network on (the host's namespace, which an unprivileged session must not
    try to join), the host and the ignored storage_mb in the record."""
    from harness.harbor.ids import probe

    root, pin = project
    task = _task("reach-users", tmp_path / "tasks", root, pin)
    result = _harbor_job(task, tmp_path / "jobs", "users", home)
    assert result.returncode == 0, result.stdout + result.stderr
    trial = _trials(tmp_path / "jobs" / "users")["reach-users"]
    assert trial["exception_info"] is None, trial["exception_info"]
    rewards = _reward(trial) or {}
    record = json.loads((trial["_dir"] / "harness" / "env.json").read_text())
    sandbox = record["sandbox"]
    log = (trial["_dir"] / "trial.log").read_text()
    assert sandbox["network"] == "host"
    idmap = probe()
    assert sandbox["users"]["enforced"] is idmap.multi
    if idmap.multi:
        assert rewards and all(v == 1.0 for v in rewards.values()), rewards
        table = {u["name"]: u["uid"] for u in sandbox["users"]["table"]}
        assert table == {"root": 0, "agent": 1000, "checker": 1001}
        assert "users: root uid 0, agent uid 1000, checker uid 1001" in log
    else:  # one id: every command ran as root, and both the record and the log say why
        assert rewards["answer"] == 1.0 and rewards["agent_is_not_root"] == 0.0, rewards
        assert sandbox["users"]["ids"]["reason"].startswith("task users need")
        assert "runs every command as the sandbox's root, not as agent, checker" in log
    limits = sandbox["limits"]
    assert (limits["cpus"], limits["memory_mb"]) == (0.5, 512)
    assert limits["cpus_enforced"] and limits["memory_enforced"]
    assert f"cpus 0.5: {limits['cpus_how']}" in log
    if limits["cpus_how"].startswith("cgroup"):
        assert limits["cgroups"] and not any(Path(p).exists() for p in limits["cgroups"])  # removed at stop
    else:
        assert "whole CPUs: 0.5 asked" in limits["cpus_how"] and limits["no_cgroup_because"]
        assert limits["memory_how"].startswith("session total watched")
        assert limits["watchdog"]["limit_mb"] == 512 and limits["watchdog"]["exceeded"] is None
    assert sandbox["storage"]["storage_mb"] == 1024 and sandbox["storage"]["enforced"] is False
    assert sandbox["storage"]["used_mb_at_stop"] is not None
    assert any("storage_mb = 1024" in line for line in sandbox["ignored"])
    hostinfo = record["host"]
    assert hostinfo["kernel"] == platform.release() and hostinfo["executables"]["count"] > 10
    listing = (trial["_dir"] / "harness" / hostinfo["executables"]["list"]).read_text().splitlines()
    assert len(listing) == hostinfo["executables"]["count"]
    bash = next(line for line in listing if line.endswith("  /usr/bin/bash") or line.endswith("  /bin/bash"))
    import hashlib

    assert bash.split()[0] == hashlib.sha256(Path("/bin/bash").read_bytes()).hexdigest()
    libraries = hostinfo["libraries"]  # what those executables and the interpreter load
    lines = (trial["_dir"] / "harness" / libraries["list"]).read_text().splitlines()
    assert libraries["count"] == len(lines) > 0 and libraries["digest"].startswith("sha256:")
    libc = next(line for line in lines if "/libc.so" in line)
    assert libc.split()[0] == hashlib.sha256(Path(libc.split(None, 1)[1].strip()).read_bytes()).hexdigest()
    assert not any(str(home / "store") in line for line in lines)  # store paths have content hashes
    env = record["commands_env"]
    assert env["base"]["HARNESS_ENVIRONMENT"] == str(home / "store" / _realized_env(home, project))
    assert env["given_by_harbor"] == sorted(env["given_by_harbor"])  # names only: values may be secrets
    assert all("=" not in name for name in env["given_by_harbor"])


# ------------------------------------------------------- machines without user namespaces

_NO_USERNS = [
    "unshare",
    "--user",
    "--map-root-user",
    "--",
    "sh",
    "-c",
    'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"',
    "no-userns",
]


def _no_userns_reason() -> str | None:
    """Why the Landlock + PRoot tests cannot run here (None when they can)."""
    from harness.harbor import confine

    if _SANDBOX_REASON is not None:
        return f"no user namespace to set user.max_user_namespaces = 0 in: {_SANDBOX_REASON}"
    return confine.unavailable_reason()


needs_confine = pytest.mark.skipif(_no_userns_reason() is not None, reason=f"{_no_userns_reason()}")

_CONFINED_SCRIPT = r"""
import asyncio, json, sys
from pathlib import Path
from harness.harbor import confine
from harness.harbor.sandbox import SandboxConfig, unavailable_reason
out = {"bwrap": unavailable_reason(), "confine": confine.unavailable_reason()}
root, env_dir, store_paths = Path(sys.argv[1]), sys.argv[2], [Path(p) for p in sys.argv[3:]]
async def main():
    box = confine.ConfinedSandbox(SandboxConfig(root=root, store_paths=store_paths, dirs=["/app"], network=False))
    await box.start()
    env = {"PATH": env_dir + "/bin:/usr/bin:/bin", "HOME": "/root", "HARNESS_ENVIRONMENT": env_dir}
    runs = {}
    try:
        for name, cmd in {
            "python": "python -c 'import sys; print(sys.prefix)'",
            "usr": "echo x > /usr/harness-probe",
            "store": f"echo x > {store_paths[0]}/probe",
            "app": "echo ok > /app/w && cat /app/w && ls -d /app",
            "status": "exit 7",
            "background": "nohup sleep 3217 >/dev/null 2>&1 & echo started",
            "tcp": "python -c \"import socket; s=socket.socket(); s.settimeout(3); print(s.connect_ex(('127.0.0.1', 9)))\"",
            "host_tree": "ls /work /home/* 2>&1 | head -3; cat /dev/sda 2>&1 | head -1",
            "secrets": "cat /etc/shadow /etc/gshadow 2>&1 | head -2; echo done",
        }.items():
            r = await box.exec(cmd, cwd="/app", env=env, timeout=60)
            runs[name] = [r.return_code, r.stdout, r.stderr]
        pieces = []
        async def seen(text, stream):
            pieces.append([stream, text])
        r = await box.exec("echo out; echo err >&2; exit 3", cwd="/app", env=env, timeout=60, on_output=seen)
        runs["streamed"] = [r.return_code, r.stdout, r.stderr, pieces]
        await box.upload_file(Path(sys.argv[0]), "/app/uploaded.py")
        await box.download_file("/app/w", root.parent / "downloaded")
        out["describe"] = box.describe()
        out["marked"] = len(confine._marked(box.marker))
    finally:
        await box.stop(delete=False)
    out["runs"] = runs
    out["marked_after_stop"] = len(confine._marked(box.marker))
asyncio.run(main())
print(json.dumps(out))
"""


@needs_confine
def test_landlock_proot_confinement_without_user_namespaces(
    tmp_path: Path, project: tuple[Path, str], home: Path
) -> None:
    """With user.max_user_namespaces = 0 (in a user namespace of the test's own, so nothing
    else on the machine notices, and restored when it ends), bubblewrap cannot start and the
    Landlock + PRoot confinement runs the session: store and /usr read-only, writes land in
    the session root, the status of each command, TCP refused without network, transfers
    inside, and every process of the session gone after stop."""
    pin = _realized_env(home, project)
    script = tmp_path / "confined.py"
    script.write_text(_CONFINED_SCRIPT)
    closure = [str(p) for p in _closure(home, pin)]
    result = subprocess.run(
        [*_NO_USERNS, sys.executable, str(script), str(tmp_path / "root"), str(home / "store" / pin), *closure],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert "cannot create namespaces" in out["bwrap"] and out["confine"] is None
    runs = out["runs"]
    assert runs["python"][:2] == [0, f"{home}/store/{pin}\n"]
    assert runs["usr"][0] != 0 and "Permission denied" in runs["usr"][2]
    assert runs["store"][0] != 0 and "Permission denied" in runs["store"][2]
    assert runs["app"][:2] == [0, "ok\n/app\n"], runs["app"]
    assert (tmp_path / "root" / "app" / "w").read_text() == "ok\n"
    assert runs["status"][0] == 7
    code, stdout, stderr, pieces = runs["streamed"]  # on_output saw what the outcome holds
    assert (code, stdout, stderr) == (3, "out\n", "err\n")
    assert sorted(pieces) == [["stderr", "err\n"], ["stdout", "out\n"]]
    assert runs["background"][:2] == [0, "started\n"]
    assert runs["tcp"][1].strip() == "13"  # EACCES: Landlock refuses the connection
    assert "No such file or directory" in runs["host_tree"][1]
    assert runs["secrets"][:2] == [0, "done\n"], runs["secrets"]  # masked: empty, whoever runs harness
    assert (tmp_path / "root" / "app" / "uploaded.py").read_text() == _CONFINED_SCRIPT
    assert (tmp_path / "downloaded").read_text() == "ok\n"
    assert out["describe"]["landlock_abi"] >= 1 and out["describe"]["pid_namespace"] is False
    assert out["marked"] >= 1 and out["marked_after_stop"] == 0  # the background sleep was killed
    assert not Path("/usr/harness-probe").exists()
    assert not _processes_with("sleep 3217")


@needs_harbor
@needs_confine
def test_harbor_job_without_user_namespaces(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    """`harbor run` where no namespace can be made: the trial runs confined by Landlock and
    PRoot, scores 1.0, and its record and log say so."""
    root, pin = project
    task = _task("reach-python", tmp_path / "tasks", root, pin)
    trial, record, _ = _confined_trial(task, tmp_path, home)
    assert _reward(trial) == {"reward": 1.0}
    assert record["sandbox"]["confinement"]["pid_namespace"] is False
    assert record["sandbox"]["users"]["enforced"] is False
    assert "confined with Landlock and PRoot instead" in (trial["_dir"] / "trial.log").read_text()


@needs_sandbox
@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup-if-possible", "per-process"])
def test_memory_limit_stops_a_command_that_exceeds_it(
    tmp_path: Path, project: tuple[Path, str], home: Path, cgroups: bool
) -> None:
    """memory_mb = 64: a command touching 200 MiB fails (the cgroup's OOM kill, or MemoryError
    under RLIMIT_AS), one touching 8 MiB does not; the cgroup is gone after stop."""
    from harness.harbor.limits import enforce

    pin = _realized_env(home, project)
    limits = enforce(f"memtest-{cgroups}", 1, 64, use_cgroups=cgroups)
    assert limits.memory_enforced, limits.as_json()
    touch = "python -c 'b = bytearray({} << 20); b[::4096] = bytes(len(b[::4096])); print(len(b) >> 20)'"

    async def scenario() -> tuple[Any, Any]:
        box = _sandbox(tmp_path, home, pin, network=False, limits=limits)
        await box.start()
        try:
            small = await box.exec(touch.format(8), cwd="/app", env=_env(home, pin), timeout=120)
            big = await box.exec(touch.format(200), cwd="/app", env=_env(home, pin), timeout=120)
            return small, big
        finally:
            await box.stop(delete=True)

    small, big = asyncio.run(scenario())
    assert (small.return_code, small.stdout) == (0, "8\n"), small
    assert big.return_code != 0 and big.stdout is None, big
    if not limits.memory_how.startswith("cgroup"):
        assert "MemoryError" in (big.stderr or "")
    assert not any(p.exists() for p in limits.cgroups)


@needs_sandbox
def test_one_id_namespace_runs_task_users_as_root_and_keeps_no_capabilities(
    tmp_path: Path, project: tuple[Path, str], home: Path
) -> None:
    """Where the namespace can hold one id only (an unprivileged user without a subordinate
    range), a task user's command runs as the sandbox's root, with no capabilities at all."""
    from harness.harbor.ids import IdMap

    pin = _realized_env(home, project)
    single = IdMap("single", os.geteuid(), os.getegid(), reason="task users need newuidmap")

    async def scenario() -> Any:
        box = _sandbox(tmp_path, home, pin, network=False, users=["agent"], idmap=single)
        await box.start()
        try:
            assert await box.ensure_user("agent") is None
            return await box.exec("id -u; grep CapEff /proc/self/status", cwd="/app", env=_env(home, pin), user="agent")
        finally:
            await box.stop(delete=True)

    r = asyncio.run(scenario())
    assert r.return_code == 0 and r.stdout.split()[0] == "0" and r.stdout.split()[-1] == "0" * 16, r


# ------------------------------------------------- verifiers no agent can reach (issue 33)


@needs_harbor
@pytest.mark.parametrize(
    "no_userns",
    [
        pytest.param(False, marks=needs_sandbox, id="namespaces"),
        pytest.param(True, marks=needs_confine, id="landlock-proot"),
    ],
)
def test_background_forger_scores_zero(tmp_path: Path, project: tuple[Path, str], home: Path, no_userns: bool) -> None:
    """tests/harbor/background-forger: the agent leaves a double-forked, setsid process without
    its environment (so without the session's marker) that rewrites /tests/test.sh and
    /logs/verifier/reward.txt once the verifier starts, and tries to write them itself. Both
    with and without user namespaces: the agent's own writes are refused, the forger is gone
    before the verifier runs, the genuine test.sh grades it 0, and the record says which
    guarantees held."""
    root, pin = project
    task = _task("background-forger", tmp_path / "tasks", root, pin)
    (tmp_path / "jobs").mkdir()
    result = _harbor_job(task, tmp_path / "jobs", "forger", home, no_userns=no_userns)
    assert result.returncode == 0, result.stdout + result.stderr
    trial = _trials(tmp_path / "jobs" / "forger")["background-forger"]
    assert trial["exception_info"] is None, trial["exception_info"]
    stdout = (trial["_dir"] / "verifier" / "test-stdout.txt").read_text()
    assert "genuine verifier" in stdout, stdout
    assert "reward: refused" in stdout and "tests: refused" in stdout, stdout
    assert _reward(trial) == {"reward": 0.0}
    record = json.loads((trial["_dir"] / "harness" / "env.json").read_text())
    sandbox = record["sandbox"]
    assert sandbox["backend"].startswith("landlock" if no_userns else "bwrap")
    isolation = sandbox["verifier_isolation"]
    assert isolation["guarded"] == ["/tests", "/logs/verifier"]
    begun = isolation["begun"]
    assert begun["agent_processes_killed"] is True and begun["survivors"] == 0, begun
    if no_userns:
        assert "udp: refused 13" in stdout, stdout  # EACCES: the seccomp filter
        assert sandbox["udp"].startswith("refused (seccomp")
        assert "Landlock" in isolation["agent_phase_writes"]
    else:
        assert sandbox["udp"].startswith("loopback only")
    assert not _processes_with("/tmp/forge.sh"), "the forger outlived its trial"


@needs_sandbox
def test_memory_watchdog_stops_a_session_over_its_total(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    """memory_mb = 256 without a cgroup: three processes of 200 MiB each pass RLIMIT_AS one by
    one, but their sum is over the limit: the watchdog stops them within seconds and says why
    (the environment raises Harbor's MemoryLimitExceededError from it); a command holding
    8 MiB before runs as usual."""
    from harness.harbor.limits import enforce

    pin = _realized_env(home, project)
    limits = enforce("memwatch", None, 256, use_cgroups=False)
    assert limits.watch_bytes == 256 << 20
    marker = f"memhog-{os.getpid()}"
    hog = (
        f"python -c 'import time; b = bytearray(200 << 20); b[::4096] = bytes(len(b[::4096])); "
        f"time.sleep(60)  # {marker}'"
    )

    async def scenario() -> tuple[Any, Any, float, str | None]:
        box = _sandbox(tmp_path, home, pin, network=False, limits=limits)
        await box.start()
        try:
            assert box.watchdog is not None
            small = await box.exec(
                "python -c 'b = bytearray(8 << 20); b[::4096] = bytes(len(b[::4096])); print(1)'",
                cwd="/app",
                env=_env(home, pin),
                timeout=60,
            )
            started = time.monotonic()
            big = await box.exec(f"for i in 1 2 3; do {hog} & done; wait", cwd="/app", env=_env(home, pin), timeout=60)
            return small, big, time.monotonic() - started, box.watchdog.exceeded
        finally:
            await box.stop(delete=True)

    small, big, seconds, exceeded = asyncio.run(scenario())
    assert (small.return_code, small.stdout) == (0, "1\n"), small
    assert exceeded and "over its memory limit of 256 MiB" in exceeded, exceeded
    assert big.return_code != 0 and seconds < 30, (big, seconds)
    assert not _processes_with(marker)


_CONFINED_MEMORY_SCRIPT = r"""
import asyncio, json, sys, time
from pathlib import Path
from harness.harbor import confine
from harness.harbor.limits import enforce
from harness.harbor.sandbox import SandboxConfig
root, env_dir, marker, store_paths = Path(sys.argv[1]), sys.argv[2], sys.argv[3], [Path(p) for p in sys.argv[4:]]
hog = ("python -c 'import time; b = bytearray(200 << 20); b[::4096] = bytes(len(b[::4096])); "
       "time.sleep(60)  # " + marker + "'")
async def main():
    limits = enforce("confined-memwatch", None, 256, use_cgroups=False)
    box = confine.ConfinedSandbox(SandboxConfig(root=root, store_paths=store_paths, dirs=["/app"], limits=limits))
    await box.start()
    env = {"PATH": env_dir + "/bin:/usr/bin:/bin", "HOME": "/root"}
    try:
        started = time.monotonic()
        # setsid and double-forked: the subreaper still counts them as the session's
        r = await box.exec(f"for i in 1 2 3; do ( setsid {hog} & ) ; done; sleep 60", cwd="/app", env=env, timeout=90)
        out = {"rc": r.return_code, "seconds": time.monotonic() - started, "exceeded": box.watchdog.exceeded}
    finally:
        await box.stop(delete=True)
    print(json.dumps(out))
asyncio.run(main())
"""


@needs_confine
def test_memory_watchdog_without_user_namespaces(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    """The watchdog under Landlock + PRoot: three 200 MiB processes, started in sessions of
    their own, are the session's (the subreaper's descendants), so 256 MiB stops them."""
    pin = _realized_env(home, project)
    script = tmp_path / "memory.py"
    script.write_text(_CONFINED_MEMORY_SCRIPT)
    marker = f"confined-memhog-{os.getpid()}"
    closure = [str(p) for p in _closure(home, pin)]
    result = subprocess.run(
        [*_NO_USERNS, sys.executable, str(script), str(tmp_path / "root"), str(home / "store" / pin), marker, *closure],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["exceeded"] and "over its memory limit of 256 MiB" in out["exceeded"], out
    assert out["rc"] != 0 and out["seconds"] < 45, out
    assert not _processes_with(marker)


@needs_harbor
@pytest.mark.parametrize(
    "no_userns",
    [
        pytest.param(False, marks=needs_sandbox, id="namespaces"),
        pytest.param(True, marks=needs_confine, id="landlock-proot"),
    ],
)
def test_each_step_of_a_multi_step_task_guards_its_verifier(
    tmp_path: Path, project: tuple[Path, str], home: Path, no_userns: bool
) -> None:
    """Two steps in one session: the first honest (graded 1), the second the background
    forger. After the first verifier the second agent phase is guarded again, and its forger
    is killed before the second verifier: 0 for that step."""
    root, pin = project
    forger = EXAMPLES / "background-forger"
    task = tmp_path / "tasks" / "two-steps"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "harness.toml").write_text(
        f'manifest = "reach"\nproject = "{root}"\nenvironment = "{pin}"\n'
    )
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n\n[task]\nname = "harness/two-steps"\n\n[environment]\n'
        'network_mode = "no-network"\nworkdir = "/app"\n\n'
        '[[steps]]\nname = "one"\n[steps.agent]\ntimeout_sec = 60.0\n[steps.verifier]\ntimeout_sec = 60.0\n\n'
        '[[steps]]\nname = "two"\n[steps.agent]\ntimeout_sec = 60.0\n[steps.verifier]\ntimeout_sec = 60.0\n'
    )
    one, two = task / "steps" / "one", task / "steps" / "two"
    for step in (one, two):
        (step / "solution").mkdir(parents=True)
        (step / "tests").mkdir()
        (step / "instruction.md").write_text((forger / "instruction.md").read_text())
    (one / "solution" / "solve.sh").write_text("#!/bin/bash\necho done > /app/one\n")
    (one / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif [ -f /app/one ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    shutil.copy(forger / "solution" / "solve.sh", two / "solution" / "solve.sh")
    shutil.copy(forger / "tests" / "test.sh", two / "tests" / "test.sh")
    for script in task.glob("steps/*/*/*.sh"):
        script.chmod(0o755)
    (tmp_path / "jobs").mkdir()
    result = _harbor_job(task, tmp_path / "jobs", "steps", home, no_userns=no_userns)
    assert result.returncode == 0, result.stdout + result.stderr
    trial = _trials(tmp_path / "jobs" / "steps")["two-steps"]
    assert trial["exception_info"] is None, trial["exception_info"]
    steps = {s["step_name"]: (s.get("verifier_result") or {}).get("rewards") for s in trial["step_results"]}
    assert steps == {"one": {"reward": 1.0}, "two": {"reward": 0.0}}, steps
    assert not _processes_with("/tmp/forge.sh"), "the forger outlived its trial"


@needs_harbor
@needs_sandbox
def test_environment_reports_the_watchdog_as_harbors_memory_error(
    tmp_path: Path, project: tuple[Path, str], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HarnessEnvironment where no cgroup is used (memory_mb = 256): three 200 MiB processes
    end the command with MemoryLimitExceededError, which Harbor's error policy knows (retried,
    not graded), and the record has the watchdog's peak."""
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths
    from harbor.models.trial.result import ExceptionInfo

    from harness.harbor import HarnessEnvironment
    from harness.harbor import environment as environment_module
    from harness.harbor.limits import MemoryLimitExceededError

    real = environment_module.enforce
    monkeypatch.setattr(
        environment_module, "enforce", lambda session, cpus, memory, **_: real(session, cpus, memory, use_cgroups=False)
    )
    root, pin = project
    task = _task("reach-python", tmp_path, root, pin)
    trial = TrialPaths(trial_dir=tmp_path / "trial")
    trial.mkdir()
    hog = "python -c 'import time; b = bytearray(200 << 20); b[::4096] = bytes(len(b[::4096])); time.sleep(60)'"

    async def scenario() -> BaseException:
        env = HarnessEnvironment(
            environment_dir=task / "environment",
            environment_name="reach-python",
            session_id="trial__env",
            trial_paths=trial,
            task_env_config=EnvironmentConfig(network_mode="no-network", workdir="/app", memory_mb=256),
            home=str(home),
        )
        await env.start(force_build=False)
        try:
            with pytest.raises(MemoryLimitExceededError) as info:
                await env.exec(f"for i in 1 2 3; do {hog} & done; wait", timeout_sec=60)
            with pytest.raises(MemoryLimitExceededError):  # the session goes no further
                await env.exec("true")
            return info.value
        finally:
            await env.stop(delete=True)

    error = asyncio.run(scenario())
    assert "over its memory limit of 256 MiB" in str(error)
    policy = ExceptionInfo.from_exception(error).policy
    assert (policy.should_retry, policy.should_grade) == (True, False)
    limits = json.loads((trial.trial_dir / "harness" / "env.json").read_text())["sandbox"]["limits"]
    assert limits["watchdog"]["exceeded"] and limits["watchdog"]["peak_mb"] > 256


@needs_sandbox
def test_verifier_phase_kills_everything_and_makes_the_folders_afresh(
    tmp_path: Path, project: tuple[Path, str], home: Path
) -> None:
    """Sandbox level (bubblewrap): in the agent phase /tests and /logs/verifier are read-only
    even to the sandbox's root; a setsid'd background process, a link planted in place of
    /logs and one in place of the folder above the store paths (which left the verifier
    without a session: bubblewrap could not make its mount points) do not survive
    begin_verifier_phase, after which both folders are empty, real and writable, and the
    environment runs; begin_agent_phase guards them again. The host's secrets in /etc read
    as empty files."""
    pin = _realized_env(home, project)
    marker = f"{os.getpid() % 1000 + 7000}3"
    guarded = ["/tests", "/logs/verifier"]
    box = Sandbox(
        SandboxConfig(
            root=tmp_path / "root",
            store_paths=_closure(home, pin),
            dirs=["/app", "/logs/agent", *guarded],
            network=False,
            guarded=guarded,
        )
    )
    env = _env(home, pin)

    async def scenario() -> dict[str, Any]:
        await box.start()
        try:
            refused = await box.exec("echo 1 > /logs/verifier/reward.txt || echo refused", cwd="/app", env=env)
            await box.exec(f"( setsid sleep {marker} >/dev/null 2>&1 & ) &", cwd="/app", env=env)
            secrets = await box.exec("cat /etc/shadow /etc/gshadow 2>&1 | head -2; echo done", cwd="/", env=env)
            moved = await box.exec("mv /logs /logs-moved && ln -s /app /logs && echo moved", cwd="/", env=env)
            top = shlex.quote("/" + PurePosixPath(str(box.config.store_paths[0])).parts[1])
            above = await box.exec(f"mv {top} {top}-moved && ln -s /nowhere {top} && echo moved", cwd="/", env=env)
            assert _processes_with(f"sleep {marker}")
            outcome = await box.begin_verifier_phase()
            after = await box.exec(
                "[ -d /logs/verifier ] && [ ! -L /logs ] && ls -A /tests /logs/verifier && echo 1 > /tests/t && "
                "python -c 'print(1)' && echo writable",
                cwd="/",
                env=env,
            )
            await box.begin_agent_phase()
            again = await box.exec("echo x > /tests/u || echo refused; ls -A /tests", cwd="/", env=env)
            return {
                "refused": refused,
                "moved": moved,
                "above": above,
                "outcome": outcome,
                "after": after,
                "again": again,
                "secrets": secrets,
            }
        finally:
            await box.stop(delete=False)

    out = asyncio.run(scenario())
    assert "refused" in (out["refused"].stdout or ""), out["refused"]
    # The host's /etc/shadow and /etc/gshadow are masked: empty, whoever runs harness (as root
    # the sandbox's root could read them).
    assert out["secrets"].stdout == "done\n", out["secrets"]
    assert "moved" in (out["moved"].stdout or "") and "moved" in (out["above"].stdout or ""), out["above"]
    assert out["outcome"]["agent_processes_killed"] and out["outcome"]["survivors"] == 0, out["outcome"]
    assert not _processes_with(f"sleep {marker}")
    assert out["after"].return_code == 0 and out["after"].stdout.endswith("writable\n"), out["after"]
    assert (out["again"].stdout or "").strip() == "refused", out["again"]  # guarded again, and empty
    assert not (tmp_path / "root" / "logs").is_symlink()


# ------------------------------------------------ Dockerfiles applied or refused (issue 33)


def test_dockerfile_plan_applies_refuses_and_ignores_each_step_by_line() -> None:
    """Each step of a Dockerfile is applied (ARG substituted, ENV, WORKDIR, COPY, USER, RUN
    pip/mkdir/useradd), accepted (FROM a Debian or python base), ignored with its reason
    (EXPOSE, LABEL, CMD) or refused naming its line; nothing is dropped."""
    from harness.harbor.dockerfile import plan

    text = (
        'FROM python:3.12-slim\nARG ROOT=/srv\nENV A=1 B="two words" PATH=/opt/bin:$PATH\nENV LEGACY some value\n'
        'WORKDIR ${ROOT}\nWORKDIR app\nCOPY requirements.txt data/ ./\nCOPY ["notes.txt", "/opt/notes"]\n'
        "RUN pip install --no-cache-dir -r requirements.txt && pip install -U pip\n"
        'RUN useradd -m agent && mkdir -p out /srv/cache\nUSER agent:agent\nEXPOSE 80\nLABEL x=y\nCMD ["sh"]\n'
    )
    out = plan(
        text, {"PATH": "/env/bin:/usr/bin"}, lambda name: "six==1.16.0\n" if name == "requirements.txt" else None
    )
    assert not out.refused, out.refused
    assert out.env == {"A": "1", "B": "two words", "PATH": "/opt/bin:/env/bin:/usr/bin", "LEGACY": "some value"}
    assert (out.workdir, out.workdirs, out.user, out.users) == ("/srv/app", ["/srv", "/srv/app"], "agent", ["agent"])
    assert out.dirs == ["/srv/app/out", "/srv/cache"] and out.requirements == [(9, "six==1.16.0")]
    assert [(c.line, c.sources, c.dest) for c in out.copies] == [
        (7, ["requirements.txt", "data"], "/srv/app/"),
        (8, ["notes.txt"], "/opt/notes"),
    ]
    actions = {s.line: s.action for s in out.steps}
    assert actions[1] == "accepted" and "host's Debian system" in out.steps[0].how
    assert {actions[n] for n in (12, 13, 14)} == {"ignored"} and actions[11] == "applied"
    assert out.python == "3.12"
    # An exec form that is JSON but no list of strings, or nested past the parser: refused by line.
    odd = plan("FROM python:3.12\nRUN [1, 2]\nRUN " + "[" * 100_000 + "\n", {})
    assert [(s.line, s.action) for s in odd.steps[1:]] == [(2, "refused"), (3, "refused")]
    chowned = plan("FROM debian:12\nARG U=agent\nCOPY --chown=${U}:staff --link a /a\nCOPY --chown=root b /b\n", {})
    assert [(c.dest, c.owner) for c in chowned.copies] == [("/a", "agent"), ("/b", None)]
    assert (
        "given to agent" in chowned.steps[2].how
        and "--chmod" in plan("FROM debian\nCOPY --chmod=600 a /a\n", {}).refused[0].how
    )

    refused = plan(
        "FROM python:3.12\nRUN apt-get update && apt-get install -y git\nRUN make\nADD https://example.invalid/x /x\n"
        'ADD pkg.tar.gz /opt/\nCOPY --from=build /a /b\nCOPY a /usr/local/bin/a\nCOPY b /tests/b\nSHELL ["bash"]\n'
        "HEALTHCHECK CMD true\nRUN pip install ./local\nRUN useradd -u 1234 x\nFROM debian:12\n",
        {},
    )
    lines = {s.line: s.how for s in refused.refused}
    assert sorted(lines) == list(range(2, 14)), lines
    assert "apt-get install -y git: git: no rootfs template is the base (python:3.12 is the host's" in lines[2]
    assert lines[3].startswith("an arbitrary command")
    assert "network" in lines[4] and "unpacks archives" in lines[5] and "--from" in lines[6]
    assert "/usr is the host's" in lines[7] and "/tests is Harbor's" in lines[8]
    assert "local path" in lines[11] and "fixed ids" in lines[12] and "multi-stage" in lines[13]
    for base in ("FROM alpine:3.20", "FROM python:3.12-alpine", "FROM ubuntu:24.04", "FROM scratch"):
        assert plan(base + "\n", {}).refused[0].action == "refused", base
        assert len(plan(base + "\n", {}).refused) == 1, base  # the base, not also "no FROM"
    assert plan("ENV A=1\n", {}).refused[0].how == "the Dockerfile has no FROM"
    # A separate verifier's image (tests/Dockerfile) bundles its tests, as Harbor expects.
    assert not plan("FROM debian:12\nCOPY test.sh /tests/\n", {}, tests_bundled=True).refused
    assert "/tests is Harbor's" in plan("FROM debian:12\nCOPY test.sh /tests/\n", {}).refused[0].how


def test_dockerfile_from_a_template_and_apt_get_install_of_its_pinned_packages() -> None:
    """FROM a template's label, or a base a template provides (docker.io/library/ and :latest
    normalized), is that template's root; apt-get install (with update, DEBIAN_FRONTEND=, -y,
    --no-install-recommends, the lists removed) records its packages, which unpinned() checks
    against the template's lock by name and version; a base no template provides is refused
    naming the templates there are; apt-get install on the host's base is refused naming the
    packages; other apt-get commands and apk are refused."""
    from harness.harbor.dockerfile import base_image, plan, unpinned

    bases = {"lab": "lab", "debian:bookworm": "lab", "solver": "solver"}
    text = (
        "ARG BASE=docker.io/library/debian:bookworm\nFROM $BASE\n"
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\\n"
        "    kuka-plan kuka-common=0.4.3-1 && rm -rf /var/lib/apt/lists/*\nUSER agent\n"
    )
    assert base_image(text) == "docker.io/library/debian:bookworm"
    out = plan(text, {}, templates=bases)
    assert not out.refused, out.refused
    assert (out.template, out.base_is_template, out.packages) == (
        "lab",
        True,
        [(3, "kuka-plan"), (3, "kuka-common=0.4.3-1")],
    )
    assert "root of rootfs template lab" in out.steps[1].how and "from template lab's lock" in out.steps[2].how
    assert unpinned(out, {"kuka-plan": "0.4.3-1", "kuka-common": "0.4.3-1"}) == []
    problems = unpinned(out, {"kuka-plan": "0.4.3-1", "kuka-common": "0.4.2-1"})
    assert problems == [
        "line 3: apt-get install kuka-common=0.4.3-1: template lab's lock pins kuka-common 0.4.2-1 "
        "(add it to harbor/images/lab.toml's debian.packages and run `harness lock image:lab`)"
    ]
    assert "pins no kuka-plan" in unpinned(out, {"kuka-common": "0.4.3-1"})[0]
    assert plan("FROM solver\nRUN apt-get install -y xy\n", {}, templates=bases).template == "solver"
    # docker_image names one template, FROM another: refused; FROM python with a docker_image
    # template: the packages are that template's.
    clash = plan("FROM lab\n", {}, templates=bases, label_template="solver").refused
    assert "task.toml's docker_image names template solver" in clash[0].how
    on_label = plan("FROM python:3.12\nRUN apt-get install -y xy\n", {}, templates=bases, label_template="solver")
    assert not on_label.refused and (on_label.template, on_label.base_is_template) == ("solver", False)
    other = plan("FROM ubuntu:24.04\n", {}, templates=bases).refused[0].how
    assert "no rootfs template provides it (the project's templates: lab, solver" in other
    assert 'provides = ["ubuntu:24.04"]' in other
    assert "the project has no templates" in plan("FROM ubuntu:24.04\n", {}).refused[0].how
    for step, words in (
        ("RUN apt-get install -y git", "git: no rootfs template is the base (debian:12 is the host's"),
        ("RUN apt-get upgrade -y", "only install, update and clean"),
        ("RUN apt-get install -t sid git", "-t: a release other than"),
        ("RUN apt-get install ./local.deb", "./local.deb: not a package name"),
        ("RUN apk add git", "apk: system packages come from a rootfs template's lock"),
    ):
        refused = plan(f"FROM debian:12\n{step}\n", {}).refused
        assert len(refused) == 1 and words in refused[0].how, (step, refused)


def test_template_users_in_passwd_and_group_reproducibly() -> None:
    """The pure user tables: base lines for a tree without them, uids from 1000 in the order
    named, a package's lines kept, the same names giving the same bytes; the sandbox's table
    takes a template's uids."""
    from harness.harbor.ids import IdMap, UserTable
    from harness.realize.rootfs_users import add_users

    passwd, group, ids = add_users(None, None, ["agent", "grader"])
    assert passwd.splitlines() == [
        "root:x:0:0:root:/root:/bin/bash",
        "agent:x:1000:1000:agent:/home/agent:/bin/bash",
        "grader:x:1001:1001:grader:/home/grader:/bin/bash",
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
    ]
    assert group.splitlines() == ["root:x:0:", "agent:x:1000:", "grader:x:1001:", "nogroup:x:65534:"]
    assert ids == {"agent": 1000, "grader": 1001} and add_users(None, None, ["agent", "grader"])[:2] == (passwd, group)
    again = add_users(passwd + "messagebus:x:1002:1002::/x:/bin/false\n", group, ["grader", "solver"])
    assert again[2] == {"grader": 1001, "solver": 1003} and "messagebus:x:1002" in again[0]
    idmap = IdMap("root", 0, 0, 100000, 100000, 65536)
    table = UserTable.plan(["solver", "agent"], idmap, {"agent": 1004, "other": 1000})
    assert (table.users["agent"].uid, table.users["solver"].uid) == (1004, 1001)  # 1000 is other's
    # The sandbox's own files keep the root's other users (a package's system user) and groups.
    base = "root:x:0:0:root:/root:/bin/bash\nmessagebus:x:100:101::/nonexistent:/bin/false\nagent:x:1004:1004::/h:/bin/sh\n"
    lines = table.passwd(base).splitlines()
    assert lines[:2] == ["root:x:0:0:root:/root:/bin/bash", "messagebus:x:100:101::/nonexistent:/bin/false"]
    assert "agent:x:1004:1004:agent:/home/agent:/bin/bash" in lines and len(lines) == 5, lines
    assert table.group("root:x:0:\nmessagebus:x:101:\n").splitlines()[:2] == ["root:x:0:", "messagebus:x:101:"]


def test_dockerfile_image_checks_requirements_host_and_copies(tmp_path: Path) -> None:
    """image.check refuses a pip requirement the locked environment lacks (or has at another
    version), another Python than the base's, a host that is not Debian; copy_into copies
    as COPY does and refuses a source linking out of environment/; a compose file is refused
    naming its sidecars."""
    from harness.harbor import image
    from harness.harbor.dockerfile import plan

    env = tmp_path / "env"
    site = env / "lib" / "python3.12" / "site-packages"
    (site / "six-1.16.0.dist-info").mkdir(parents=True)
    (site / "six-1.16.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: six\nVersion: 1.16.0\n")
    (env / "pyvenv.cfg").write_text("implementation = CPython\nversion_info = 3.12.1\n")
    debian = {"id": "debian", "pretty_name": "Debian GNU/Linux 12 (bookworm)"}
    ok = plan("FROM python:3.12\nRUN pip install six==1.16.0 'attrs; python_version < \"3\"'\n", {})
    assert image.check(ok, env, debian) == []
    assert image.check(ok, env, {"id": "ubuntu", "id_like": "debian"}) == []
    assert "cannot stand in for a Debian base" in image.check(ok, env, {"id": "fedora", "pretty_name": "Fedora"})[0]
    problems = image.check(plan("FROM python:3.11\nRUN pip install 'six>=2' requests\n", {}), env, debian)
    assert len(problems) == 3, problems
    assert "Python is 3.12.1" in problems[0] and "has six 1.16.0" in problems[1] and "has no requests" in problems[2]

    context = tmp_path / "task" / "environment"
    (context / "data" / "deep").mkdir(parents=True)
    (context / "data" / "deep" / "f.txt").write_text("f")
    (context / "notes.txt").write_text("n")
    (context / "Dockerfile").write_text(
        "FROM debian:12\nWORKDIR /srv\nCOPY data/ out/\nCOPY --chown=agent:agent notes.txt *.txt /x/\n"
    )
    root = tmp_path / "root"
    root.mkdir()
    made = image.copy_into(image.read(context, {}) or plan("", {}), context, root)
    assert made == [("/srv/out", None), ("/x/notes.txt", "agent"), ("/x/notes.txt", "agent")]
    assert (root / "srv" / "out" / "deep" / "f.txt").read_text() == "f" and (root / "x" / "notes.txt").is_file()
    (tmp_path / "secret").write_text("s")
    (context / "data" / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(image.ImageRefused, match="line 3: COPY .*leak: a link out of environment/"):
        image.copy_into(image.read(context, {}) or plan("", {}), context, tmp_path / "root2")
    (context / "data" / "leak").unlink()
    (context / "data" / "etc").mkdir()
    (context / "Dockerfile").write_text("FROM debian:12\nCOPY data /\n")  # its contents over the root
    with pytest.raises(image.ImageRefused, match="line 2: COPY data/etc: /etc: /etc is the host's"):
        image.copy_into(image.read(context, {}) or plan("", {}), context, tmp_path / "root4")
    (context / "Dockerfile").write_text("FROM debian:12\nCOPY absent.txt /a\n")
    with pytest.raises(image.ImageRefused, match="line 2: COPY absent.txt: no such file"):
        image.copy_into(image.read(context, {}) or plan("", {}), context, tmp_path / "root3")
    (context / "Dockerfile").write_text("FROM debian:12\nRUN curl x | sh\n")
    with pytest.raises(
        image.ImageRefused, match=r"environment/Dockerfile: line 2: RUN curl x \| sh: an arbitrary command"
    ):
        image.read(context, {})
    (context / "compose.yaml").write_text("services:\n  main:\n    build: .\n  db:\n    image: postgres\n  cache: {}\n")
    with pytest.raises(image.ImageRefused, match="compose.yaml: sidecar service.s. db, cache cannot be served"):
        image.read(context, {})


def _dockerfile_tasks(dest: Path, project: Path, pin: str) -> Path:
    """dockerfile-steps (its base set to this Python), the same with an unsupported step, and
    compose-sidecar: each naming the test project's environment."""
    steps = _task("dockerfile-steps", dest, project, pin)
    dockerfile = steps / "environment" / "Dockerfile"
    version = ".".join(platform.python_version_tuple()[:2])
    dockerfile.write_text(dockerfile.read_text().replace("FROM python:3.11-slim", f"FROM python:{version}-slim"))
    unsupported = _task("dockerfile-steps", dest, project, pin, folder="unsupported")
    text = dockerfile.read_text().replace("USER solver\n", "RUN apt-get install -y git\nUSER solver\n")
    (unsupported / "environment" / "Dockerfile").write_text(text)
    # Refused before anything is resolved: a manifest without a lock is never looked at.
    (unsupported / "environment" / "harness.toml").write_text(f'manifest = "absent"\nproject = "{project}"\n')
    _task("compose-sidecar", dest, project, pin)
    return dest


@needs_harbor
@needs_sandbox
def test_dockerfile_task_scores_one_and_unsupported_steps_and_compose_are_refused(
    tmp_path: Path, project: tuple[Path, str], home: Path
) -> None:
    """tests/harbor/dockerfile-steps with the oracle agent: ENV (ARG substituted), WORKDIR,
    COPY and USER applied, each checked by its verifier: 1.0, the record listing every step;
    the same task with `RUN apt-get install` fails with Harbor's SandboxBuildFailedError
    naming that step and its line, before any agent runs; a compose task is refused naming
    its sidecar."""
    root, pin = project
    tasks = _dockerfile_tasks(tmp_path / "tasks", root, pin)
    result = _harbor_job(tasks, tmp_path / "jobs", "dockerfiles", home, "-n", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    trials = _trials(tmp_path / "jobs" / "dockerfiles")
    assert set(trials) == {"dockerfile-steps", "unsupported", "compose-sidecar"}, trials
    good = trials["dockerfile-steps"]
    assert good["exception_info"] is None, good["exception_info"]
    stdout = (good["_dir"] / "verifier" / "test-stdout.txt").read_text()
    assert _reward(good) == dict.fromkeys(("reward", "env", "workdir", "copy", "chown", "user", "answer"), 1.0), stdout
    record = json.loads((good["_dir"] / "harness" / "env.json").read_text())
    if record["sandbox"]["users"]["enforced"]:
        assert "user: solver" in stdout, stdout
        assert record["dockerfile"]["owners"]["/srv/data"].startswith("solver (uid "), record["dockerfile"]
    dockerfile = record["dockerfile"]
    steps = {s["line"]: (s["action"], s["step"].split()[0]) for s in dockerfile["steps"]}
    assert steps[3] == ("accepted", "FROM") and steps[13] == ("applied", "USER"), steps
    assert {a for a, word in steps.values() if word in ("ARG", "ENV", "WORKDIR", "COPY", "RUN")} == {"applied"}
    assert {steps[7][0], steps[14][0], steps[15][0]} == {"ignored"}
    assert dockerfile["copied"] == ["/srv/data", "/srv/work/notes.txt"] and dockerfile["user"] == "solver"
    assert dockerfile["env"] == {"GREETING": "hello from the image", "DATA_DIR": "/srv/data"}
    assert record["sandbox"]["workdir"] == "/srv/work" and not any(
        "Dockerfile" in i for i in record["sandbox"]["ignored"]
    )

    for name, words in (
        (
            "unsupported",
            "environment/Dockerfile: line 13: RUN apt-get install -y git: git: no rootfs template is the base",
        ),
        ("compose-sidecar", "environment/docker-compose.yaml: sidecar service(s) db cannot be served"),
    ):
        info = trials[name]["exception_info"]
        assert info["exception_type"] == "SandboxBuildFailedError", info
        assert words in info["exception_message"], info
        assert trials[name]["verifier_result"] is None and not (trials[name]["_dir"] / "harness" / "env.json").exists()


@needs_harbor
@needs_confine
def test_dockerfile_task_without_user_namespaces(tmp_path: Path, project: tuple[Path, str], home: Path) -> None:
    """The same Dockerfile task confined by Landlock and PRoot: ENV, WORKDIR and COPY are
    applied as with namespaces; USER cannot give the commands ids of their own there: the
    record says the users were not enforced and the verifier sees the one id this test's
    namespace maps (where its USER check accepts root)."""
    root, pin = project
    task = _dockerfile_tasks(tmp_path / "tasks", root, pin) / "dockerfile-steps"
    trial, record, stdout = _confined_trial(task, tmp_path, home)
    assert record["sandbox"]["users"]["enforced"] is False
    assert _reward(trial) == dict.fromkeys(("reward", "env", "workdir", "copy", "chown", "user", "answer"), 1.0), stdout
    assert "user: root one id: True cwd: /srv/work" in stdout, stdout
    assert record["dockerfile"]["user"] == "solver" and record["dockerfile"]["copied"] == [
        "/srv/data",
        "/srv/work/notes.txt",
    ]


# ------------------------------------------- rootfs templates for docker_image labels (issue 33)


def _kuka_project(tmp_path: Path, project: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    """The test project with the KUKA templates (tests/harbor/kuka-project) and the task under
    it; the templates' Debian packages built here and served as archive ``kuka``."""
    from tests.debarchive import DebArchive

    root = tmp_path / "project"
    shutil.copytree(project[0], root)
    shutil.copytree(EXAMPLES / "kuka-project", root, dirs_exist_ok=True)
    shutil.copytree(EXAMPLES / "kuka-two-station", root / "tasks" / "kuka-two-station")
    archive = DebArchive(tmp_path / "archive")
    archive.add("kuka-common", "0.4.3-1", {"usr/share/kuka/cells.txt": "conveyor\n"})
    plan = '#!/bin/sh\n[ -f /usr/share/kuka/cells.txt ] || exit 3\nset -- $(tr -d \'{}[]",:\' < "$1")\n'
    plan += 'echo "pick@$2 handover place@$3"\n'
    archive.add("kuka-plan", "0.4.3-1", {"bin/kuka-plan": plan}, executable=("bin/kuka-plan",), depends="kuka-common")
    probe = '#!/bin/sh\n[ -f /usr/share/kuka/cells.txt ] || exit 3\necho "probe: $(wc -w < "$1") steps ok"\n'
    archive.add(
        "kuka-probe",
        "0.4.3-1",
        {"usr/bin/kuka-probe": probe},
        executable=("usr/bin/kuka-probe",),
        depends="kuka-common",
    )
    archive.publish()
    monkeypatch.setenv("HARNESS_DEBIAN_ARCHIVE_KUKA", archive.serve())
    monkeypatch.setenv("HARNESS_DEBIAN_UNSIGNED_KUKA", "1")  # signatures: tests/test_rootfs.py
    return root, archive


@needs_harbor
@pytest.mark.parametrize(
    "no_userns",
    [
        pytest.param(False, marks=needs_sandbox, id="namespaces"),
        pytest.param(True, marks=needs_confine, id="landlock-proot"),
    ],
)
def test_kuka_shaped_task_on_rootfs_templates(
    tmp_path: Path, project: tuple[Path, str], home: Path, no_userns: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's KUKA shape (schema 1.3, artifacts from /workspace/output, user "agent", cpus,
    memory_mb, a separate verifier) whose docker_image labels name rootfs templates: locked,
    realized on first use by the session, laid as each root's base — the solver's tool from its
    Debian package on /usr/bin beside the host's tools, the verifier's tests bundled in its
    template (the task ships none) — graded 1.0 by the oracle, with and without user namespaces."""
    root, archive = _kuka_project(tmp_path, project, monkeypatch)
    locked = _harness(home, "lock", "image:kuka-solver-v043", "image:kuka-verifier-v043", project=root)
    assert locked.returncode == 0, locked.stderr
    solver_store = re.search(r'^store = "(.*)"$', (root / "locks/images/kuka-solver-v043.lock.toml").read_text(), re.M)
    assert solver_store is not None
    realized_before = (home / "store" / solver_store.group(1)).exists()
    # Another task's template may have fetched the same .deb into the home's cache already.
    plan_sha = re.search(
        r'name = "kuka-plan"\n(?:.*\n)*?sha256 = "([0-9a-f]{64})"',
        (root / "locks/images/kuka-solver-v043.lock.toml").read_text(),
    )
    assert plan_sha is not None
    cached_before = (home / "cache" / "debs" / f"{plan_sha.group(1)}.deb").is_file()
    task = root / "tasks" / "kuka-two-station"
    assert not (task / "tests").exists() and not (task / "environment" / "harness.toml").exists()
    (tmp_path / "jobs").mkdir()
    result = _harbor_job(task, tmp_path / "jobs", "kuka", home, no_userns=no_userns)
    assert result.returncode == 0, result.stdout + result.stderr
    trial = _trials(tmp_path / "jobs" / "kuka")["kuka-two-station"]
    assert trial["exception_info"] is None, trial["exception_info"]
    stdout = (trial["_dir"] / "verifier" / "test-stdout.txt").read_text()
    assert _reward(trial) == {"reward": 1.0, "native": 0.8, "probe": 0.2}, stdout
    records = sorted(p.name for p in (trial["_dir"] / "harness").glob("*.json"))
    solver = json.loads((trial["_dir"] / "harness" / "env.json").read_text())
    verifier = json.loads((trial["_dir"] / "harness" / records[1]).read_text())
    assert solver["rootfs"]["label"] == "kuka-solver-v043" and verifier["rootfs"]["label"] == "kuka-verifier-v043"
    assert solver["rootfs"]["packages"] == ["kuka-common=0.4.3-1", "kuka-plan=0.4.3-1"]
    # /etc too: the template's users are in its etc/passwd and etc/group, merged with the host's /etc.
    assert solver["rootfs"]["laid"]["host_binds"] == {"/usr": "/.host/usr", "/etc": "/.host/etc"}
    assert (home / "store" / solver["rootfs"]["store"]).is_dir()
    assert solver["task"]["spec"]["manifest"] == "reach" and "kuka-solver-v043" in solver["task"]["spec"]["source"]
    assert not any("docker_image" in line for line in solver["sandbox"]["ignored"])
    assert "/usr" not in solver["sandbox"]["read_only"]
    if no_userns:
        assert solver["sandbox"]["backend"] == "landlock+proot"
    else:
        assert "verifier runs as agent" in stdout, stdout
        assert solver["sandbox"]["users"]["enforced"] is True
    # Realized on first use by the session (a later run finds it in the store).
    assert realized_before or cached_before or any(r.endswith("kuka-plan_0.4.3-1_amd64.deb") for r in archive.requests)
    # `python -m harness.harbor check` reads the same: the templates' environment, both templates.
    check = subprocess.run(
        [sys.executable, "-m", "harness.harbor", "check", str(task), "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "manifest reach" in check.stdout
    for label in ("kuka-solver-v043", "kuka-verifier-v043"):
        assert f"template {label} -> " in check.stdout and f"-rootfs-{label}: realized" in check.stdout


@needs_harbor
@needs_sandbox
def test_a_template_not_locked_or_stale_fails_its_trial_naming_the_fix(
    tmp_path: Path, project: tuple[Path, str], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A label whose template was never locked, and one whose file changed since its lock: each
    trial fails before any agent runs, saying which template and the command that fixes it."""
    root, _archive = _kuka_project(tmp_path, project, monkeypatch)
    locked = _harness(home, "lock", "image:kuka-verifier-v043", project=root)  # the solver's: never locked
    assert locked.returncode == 0, locked.stderr
    tasks = root / "tasks"
    (tmp_path / "jobs").mkdir()
    result = _harbor_job(tasks / "kuka-two-station", tmp_path / "jobs", "unlocked", home, no_userns=False)
    assert result.returncode == 0, result.stdout + result.stderr
    info = _trials(tmp_path / "jobs" / "unlocked")["kuka-two-station"]["exception_info"]
    assert info is not None and "template 'kuka-solver-v043' is not locked" in info["exception_message"], info
    assert "harness lock image:kuka-solver-v043" in info["exception_message"]

    assert _harness(home, "lock", "image:kuka-solver-v043", project=root).returncode == 0
    (root / "kuka" / "solver" / "stations.json").write_text('{"stations": ["KR-10-left"]}\n')
    result = _harbor_job(tasks / "kuka-two-station", tmp_path / "jobs", "stale", home, no_userns=False)
    assert result.returncode == 0, result.stdout + result.stderr
    info = _trials(tmp_path / "jobs" / "stale")["kuka-two-station"]["exception_info"]
    assert info is not None and "docker_image = 'kuka-solver-v043'" in info["exception_message"], info
    assert (
        "lock is stale" in info["exception_message"]
        and "harness lock image:kuka-solver-v043" in info["exception_message"]
    )


@needs_harbor
@needs_sandbox
def test_dockerfile_from_a_template_with_apt_get_install_scores_one(
    tmp_path: Path, project: tuple[Path, str], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/harbor/dockerfile-template: FROM debian:bookworm, which the KUKA project's
    lab-bookworm template provides, RUN apt-get install of a package that template pins,
    ENV, WORKDIR, COPY and USER: 1.0 with the oracle, every step checked by its verifier, the
    template's user and the task's [agent] user known to getent and id inside; the same task
    FROM the kuka-solver-v043 label directly: 1.0; and apt-get install of a package the
    template does not pin (kuka-probe is in the archive, not in the lock): Harbor's
    SandboxBuildFailedError naming it, before any agent runs."""
    root, _archive = _kuka_project(tmp_path, project, monkeypatch)
    locked = _harness(home, "lock", "image:lab-bookworm", "image:kuka-solver-v043", project=root)
    assert locked.returncode == 0, locked.stderr
    lab = (root / "locks" / "images" / "lab-bookworm.lock.toml").read_text()
    assert re.findall(r'^name = "(.*)"$', lab, re.M) == ["kuka-common", "kuka-plan"] and "sha256" in lab
    tasks = root / "tasks"
    shutil.copytree(EXAMPLES / "dockerfile-template", tasks / "from-base")
    label = shutil.copytree(EXAMPLES / "dockerfile-template", tasks / "from-label")
    dockerfile = label / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("FROM debian:bookworm", "FROM kuka-solver-v043"))
    unpinned = shutil.copytree(EXAMPLES / "dockerfile-template", tasks / "unpinned")
    dockerfile = unpinned / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("kuka-plan \\", "kuka-plan kuka-probe \\"))
    shutil.rmtree(tasks / "kuka-two-station")
    result = _harbor_job(tasks, tmp_path / "jobs", "templates", home, "-n", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    trials = _trials(tmp_path / "jobs" / "templates")
    assert set(trials) == {"from-base", "from-label", "unpinned"}, trials
    keys = ("reward", "apt", "env", "workdir", "copy", "user", "users", "answer")
    for name, template in (("from-base", "lab-bookworm"), ("from-label", "kuka-solver-v043")):
        trial = trials[name]
        assert trial["exception_info"] is None, (name, trial["exception_info"])
        stdout = (trial["_dir"] / "verifier" / "test-stdout.txt").read_text()
        assert _reward(trial) == dict.fromkeys(keys, 1.0), (name, stdout)
        record = json.loads((trial["_dir"] / "harness" / "env.json").read_text())
        assert record["rootfs"]["label"] == template and "kuka-plan=0.4.3-1" in record["rootfs"]["packages"]
        assert record["dockerfile"]["template"] == template and record["dockerfile"]["packages"] == ["kuka-plan"]
        assert record["dockerfile"]["host_base"].startswith(f"rootfs template {template}")
        steps = {s["line"]: s for s in record["dockerfile"]["steps"]}
        assert steps[3]["action"] == "accepted" and f"root of rootfs template {template}" in steps[3]["how"]
        assert steps[4]["action"] == "applied" and f"from template {template}'s lock" in steps[4]["how"]
        assert record["task"]["spec"]["manifest"] == "reach"
        if record["sandbox"]["users"]["enforced"]:
            assert "user: agent" in stdout, stdout
            table = {u["name"]: u["uid"] for u in record["sandbox"]["users"]["table"]}
            assert table["agent"] == 1000 and table["operator"] == 1001, table  # the root's /etc/passwd
    info = trials["unpinned"]["exception_info"]
    assert info is not None and info["exception_type"] == "SandboxBuildFailedError", info
    assert (
        "line 4: apt-get install kuka-probe: template lab-bookworm's lock pins no kuka-probe"
        in (info["exception_message"])
    ), info
    assert "harness lock image:lab-bookworm" in info["exception_message"]
    assert trials["unpinned"]["verifier_result"] is None
    # `python -m harness.harbor check` reads the same: the template FROM names, its environment,
    # and the unpinned package.
    for name, code, words in (
        ("from-base", 0, ["manifest reach", "template lab-bookworm -> ", "-rootfs-lab-bookworm: realized"]),
        ("unpinned", 1, ["a trial is refused", "line 4: apt-get install kuka-probe: template lab-bookworm's"]),
    ):
        check = subprocess.run(
            [sys.executable, "-m", "harness.harbor", "check", str(tasks / name), "--home", str(home)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert check.returncode == code and all(w in check.stdout + check.stderr for w in words), (
            name,
            check.stdout + check.stderr,
        )


@needs_harbor
@needs_confine
def test_dockerfile_from_a_template_without_user_namespaces(
    tmp_path: Path, project: tuple[Path, str], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same FROM-a-template task confined by Landlock and PRoot: apt-get's package, ENV,
    WORKDIR and COPY as with namespaces; commands run as the one id there, yet `id agent` and
    `getent passwd agent` answer from the root's /etc/passwd (the template's, with the task's
    [agent] user added to the session's copy)."""
    root, _archive = _kuka_project(tmp_path, project, monkeypatch)
    assert _harness(home, "lock", "image:lab-bookworm", project=root).returncode == 0
    task = shutil.copytree(EXAMPLES / "dockerfile-template", root / "tasks" / "dockerfile-template")
    trial, record, stdout = _confined_trial(task, tmp_path, home)
    assert record["sandbox"]["users"]["enforced"] is False
    keys = ("reward", "apt", "env", "workdir", "copy", "user", "users", "answer")
    assert _reward(trial) == dict.fromkeys(keys, 1.0), stdout
    assert "agent:x:1000:1000:" in stdout and "operator:x:1001:1001:" in stdout, stdout
