"""``harness realize``: exactly what the lock says, into an immutable store, checked byte by byte.

Upstreams are the local counterparts of tests/upstreams.py: a package index, a ``file://``
git repository and a Hugging Face + ModelScope server, all real. The project locks once per
module; each test realizes into homes of its own.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.lock.lockfile import read
from harness.lock.objects import build_inputs, built_wheels, lock_objects
from harness.realize.standin import realized_lock
from harness.store.store import Store, remove_tree
from harness.store.verify import verify_store
from tests.conftest import ctrl_c_at, run_harness_process
from tests.upstreams import LOCAL_FILES, Upstreams


@pytest.fixture(scope="module")
def project(svc: Path) -> Path:
    """tests/upstreams.py's locked git + hub + path project (tests here only read it)."""
    return svc


def realize(project: Path, home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = run_harness_process("--project", str(project), "--home", str(home), "realize", *args)
    if check:
        assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result


#: Every upstream (the index, both hubs) at a loopback port nothing answers on.
NO_UPSTREAMS = {
    "HARNESS_INDEX_PYPI": "http://127.0.0.1:9/simple",
    "HF_ENDPOINT": "http://127.0.0.1:9",
    "HARNESS_MODELSCOPE_ENDPOINT": "http://127.0.0.1:9",
}


def snapshot(home: Path) -> dict[str, str]:
    """Every registered path and its content hash: the store's state."""
    store = Store.in_home(home)
    return {r.name: r.content for r in store.records()}


def store_files(home: Path) -> list[str]:
    root = home / "store"
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


@pytest.fixture(scope="module")
def realized(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home-a")
    realize(project, home, "--json")
    return home


def test_realize_builds_every_object_and_the_environment_runs(project: Path, realized: Path) -> None:
    store = Store.in_home(realized)
    # As realized here: without interpreter downloads a host copy stands in for the lock's.
    lock = realized_lock(store, read(project / "locks" / "svc.lock.toml"))
    assert store.is_registered(lock.environment.store)
    assert store.is_registered(lock.python.store)
    for source in lock.sources:
        assert store.record(source.store).content == source.tree  # type: ignore[union-attr]
    env_python = store.root / lock.environment.store / "bin" / "python"
    code = "import alpha, beta, gamma, delta, toolkit, sys; print(sys.prefix)"
    result = subprocess.run([str(env_python), "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(lock.environment.store)
    view = run_harness_process(
        "--project", str(project), "--home", str(realized), "store", "path", "svc", "--weights"
    ).stdout.strip()
    assert (Path(view) / "local" / "arm.json").read_bytes() == LOCAL_FILES["arm.json"]
    assert (Path(view) / "hf" / "config.json").is_file()
    assert all(f.status == "ok" for f in verify_store(store, check_contents=True))


def test_realize_again_does_nothing(project: Path, realized: Path) -> None:
    before = snapshot(realized)
    result = realize(project, realized, "--json")
    assert json.loads(result.stdout)[0]["built"] == []
    assert snapshot(realized) == before


def test_build_inputs_are_needed_only_where_the_environment_must_be_built(project: Path) -> None:
    """Pure: the runtime closure names no package file; the build inputs are asked for only
    while the environment is not registered, and a registered built wheel's sdist not even then."""
    from harness.lock.objects import all_objects, build_inputs, built_wheels, chosen_file, lock_objects
    from harness.lock.objects import needed_build_inputs

    lock = read(project / "locks" / "svc.lock.toml")
    runtime, inputs = lock_objects(lock), build_inputs(lock)
    files = {chosen_file(p, lock).store for p in [*lock.packages, *lock.build_packages]}
    assert files <= set(inputs) and not files & set(runtime)
    assert lock.environment.store in runtime and lock.python.store in runtime
    assert set(all_objects(lock)) == {*runtime, *inputs}
    assert needed_build_inputs(lock, lambda name: False) == inputs
    assert needed_build_inputs(lock, lambda name: name == lock.environment.store) == []
    built = built_wheels(lock)
    assert built, "the svc lock builds epsilon's wheel from its sdist"
    package, wheel = built[0]
    sdist = chosen_file(package, lock).store
    assert sdist in needed_build_inputs(lock, lambda name: False)
    needed = needed_build_inputs(lock, lambda name: name == wheel)
    assert sdist not in needed and wheel in needed


def test_a_realized_environment_needs_none_of_its_wheel_files(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 step 3: the wheel files are build inputs, not part of the environment's runtime
    closure. With every one of them gone from the store (and no download left), an offline
    realize has nothing to do, the store verifies and the environment runs."""
    from harness.lock.objects import build_inputs, lock_objects

    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "1")  # the package files as store paths
    home = tmp_path / "home"
    realize(project, home)
    store = Store.in_home(home)
    lock = realized_lock(store, read(project / "locks" / "svc.lock.toml"))
    wheels = [name for name in build_inputs(lock) if store.is_registered(name)]
    assert wheels and not set(wheels) & set(lock_objects(lock))
    for name in wheels:
        store.delete(name)
    shutil.rmtree(home / "cache" / "downloads", ignore_errors=True)
    result = realize(project, home, "--offline", "--json")
    assert json.loads(result.stdout)[0]["built"] == [], result.stdout
    assert not [name for name in wheels if store.is_registered(name)], "nothing was fetched"
    assert {f.status for f in verify_store(store, check_contents=True)} == {"ok"}
    verified = run_harness_process("--project", str(project), "--home", str(home), "store", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    env_python = store.root / lock.environment.store / "bin" / "python"
    ran = subprocess.run([str(env_python), "-c", "import alpha, gamma, toolkit"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr


def test_two_homes_same_hashes_and_a_copied_env_runs(project: Path, realized: Path, tmp_path: Path) -> None:
    other = tmp_path / "somewhere" / "else"
    realize(project, other)
    assert snapshot(other) == snapshot(realized)
    # The environment (with its interpreter and sources, its siblings) copied into a third
    # home at another path runs there.
    lock = realized_lock(Store.in_home(realized), read(project / "locks" / "svc.lock.toml"))
    third = tmp_path / "third" / "store"
    third.mkdir(parents=True)
    for name in [lock.environment.store, lock.python.store, *[s.store for s in lock.sources]]:
        subprocess.run(["cp", "-a", str(realized / "store" / name), str(third / name)], check=True)
    result = subprocess.run(
        [str(third / lock.environment.store / "bin" / "python"), "-c", "import toolkit, alpha, sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(third / lock.environment.store)


def _tampered(project: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    copy = tmp_path / "project"
    shutil.copytree(project, copy)
    path = copy / "locks" / "svc.lock.toml"
    path.write_text(edit(path.read_text()))
    return copy


def store_state(home: Path) -> dict[str, list[str]]:
    """What a failed realize must leave as it was: registered paths and their records, every
    store entry (scratch builds in .tmp included), the stand-in notes and the lasting roots
    (not a process's temporary roots, which go with it)."""
    root = home / "store"

    def listing(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    return {
        "records": sorted(f"{name} {content}" for name, content in snapshot(home).items()),
        "paths": store_files(home),
        "meta": listing(root / ".meta"),
        "tmp": listing(root / ".tmp"),
        "standins": listing(root / ".standins"),
        "projects": listing(root / ".roots" / "projects"),
        "pins": listing(root / ".roots" / "pins"),
    }


EMPTY = {"records": [], "paths": [], "meta": [], "tmp": [], "standins": [], "projects": [], "pins": []}


@pytest.mark.parametrize("keep_wheel_files", ["1", "0"])
def test_wheel_hash_mismatch_names_file_and_leaves_store(
    project: Path, up: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_wheel_files: str
) -> None:
    """The interpreter (a host copy: no downloads here) is built while the files download (and
    stops at its next phase once the fetch failed); one wheel's bytes do not match the lock, so
    nothing of it is registered, not even the copy or its scratch build. With `[gc]
    keep-wheel-files = false` uv downloads that wheel into the environment and refuses it as it
    streams: the realize names the file, expected and actual all the same, and leaves nothing."""
    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", keep_wheel_files)
    lock = read(project / "locks" / "svc.lock.toml")
    gamma = next(p for p in lock.packages if p.name == "gamma").wheels[0]
    bad = _tampered(project, tmp_path, lambda t: t.replace(gamma.sha256, "0" * 64))
    home = tmp_path / "home"
    result = realize(bad, home, check=False)
    assert result.returncode != 0
    assert gamma.file in result.stderr and "0" * 64 in result.stderr and gamma.sha256 in result.stderr
    assert store_state(home) == EMPTY


def test_streamed_wheels_make_the_same_paths_in_an_empty_home(
    project: Path, realized: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `[gc] keep-wheel-files = false` uv downloads the wheels into the environment
    itself (issue 30): an empty home then holds no wheel, and every path it holds, the
    environment first, has the name and the content hash a home that realized from wheel
    files has."""
    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "0")
    other = tmp_path / "streamed"
    realize(project, other)
    lock = realized_lock(Store.in_home(other), read(project / "locks" / "svc.lock.toml"))
    streamed, from_files = snapshot(other), snapshot(realized)
    assert lock.environment.store in streamed
    assert {name: from_files.get(name) for name in streamed} == streamed
    assert not [name for name in streamed if name.endswith(".whl")]
    assert _downloads(other) == set()


def test_source_tree_mismatch_names_source_and_leaves_store(project: Path, tmp_path: Path) -> None:
    """A git source whose files do not hash to the lock's tree fails the realize before any
    path is registered: the wheels downloaded for it and the interpreter built beside them too."""
    lock = read(project / "locks" / "svc.lock.toml")
    source = lock.sources[0]
    wrong = "blake3:" + "2" * 64
    bad = _tampered(project, tmp_path, lambda t: t.replace(source.tree, wrong))
    home = tmp_path / "home"
    result = realize(bad, home, check=False)
    assert result.returncode == 1, result.stderr
    assert source.repo in result.stderr and wrong in result.stderr and source.tree in result.stderr
    assert store_state(home) == EMPTY
    # The same home realizes the real lock afterwards (what was fetched is reused).
    realize(project, home)
    assert Store.in_home(home).is_registered(realized_lock(Store.in_home(home), lock).environment.store)


def test_index_lacking_a_file_is_a_clear_error(project: Path, tmp_path: Path) -> None:
    lock = read(project / "locks" / "svc.lock.toml")
    gamma = next(p for p in lock.packages if p.name == "gamma").wheels[0]
    bad = _tampered(project, tmp_path, lambda t: t.replace(gamma.file, gamma.file.replace("1.0", "9.9")))
    result = realize(bad, tmp_path / "home", check=False)
    assert result.returncode != 0 and "9.9" in result.stderr
    assert store_files(tmp_path / "home") == []


def test_weight_hash_mismatch(project: Path, tmp_path: Path) -> None:
    lock = read(project / "locks" / "svc.lock.toml")
    hub_file = next(w for w in lock.weights if w.dir == "hf").files[0]
    bad = _tampered(project, tmp_path, lambda t: t.replace(hub_file.sha256, "1" * 64))
    result = realize(bad, tmp_path / "home", check=False)
    assert result.returncode != 0, result.stderr
    assert hub_file.path in result.stderr and "1" * 64 in result.stderr and hub_file.sha256 in result.stderr
    assert store_state(tmp_path / "home") == EMPTY


def test_changed_path_weights_make_the_lock_stale(project: Path, tmp_path: Path) -> None:
    copy = tmp_path / "project"
    shutil.copytree(project, copy)
    (copy / "assets" / "local" / "arm.json").write_bytes(b'{"dof": 6}\n')
    result = realize(copy, tmp_path / "home", check=False)
    assert result.returncode != 0 and "weights local changed: arm.json" in result.stderr
    assert snapshot(tmp_path / "home") == {}


def test_offline_lists_everything_missing_then_works_when_present(
    project: Path, realized: Path, tmp_path: Path
) -> None:
    result = realize(project, tmp_path / "cold", "--offline", check=False)
    assert result.returncode != 0
    assert "offline" in result.stderr and "gamma" in result.stderr and "org/model" in result.stderr
    assert snapshot(tmp_path / "cold") == {}
    result = realize(project, realized, "--offline")
    assert result.returncode == 0


@pytest.mark.root
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a network namespace"
)
def test_offline_in_a_network_namespace(project: Path, realized: Path, tmp_path: Path) -> None:
    """With no network reachable at all, an offline realize of what is present succeeds."""
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {probe.stderr.decode().strip()}")
    home = tmp_path / "home"
    shutil.copytree(realized, home, symlinks=True)
    cmd = [
        "unshare",
        "-n",
        sys.executable,
        "-m",
        "harness",
        "--project",
        str(project),
        "--home",
        str(home),
        "realize",
        "--offline",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_concurrent_realizes_build_once(project: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "harness", "--project", str(project), "--home", str(home), "realize", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    assert all(f.status == "ok" for f in verify_store(Store.in_home(home), check_contents=True))
    lock = realized_lock(Store.in_home(home), read(project / "locks" / "svc.lock.toml"))
    assert lock.python.store != read(project / "locks" / "svc.lock.toml").python.store, "a host copy stands in"
    assert Store.in_home(home).is_registered(lock.environment.store)


def test_sigkill_during_realize_never_corrupts_the_store(project: Path, realized: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    rng = random.Random(11)
    lock = realized_lock(Store.in_home(realized), read(project / "locks" / "svc.lock.toml"))
    for attempt in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness", "--project", str(project), "--home", str(home), "realize"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.2, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for finding in verify_store(Store.in_home(home), check_contents=True):
            assert finding.status == "ok", (attempt, finding)
        if Store.in_home(home).is_registered(lock.environment.store):
            # Everything got built before the kill: start over so later kills land mid-build.
            remove_tree(home)
    realize(project, home)
    assert snapshot(home) == snapshot(realized)


def test_realize_substitutes_from_a_signed_cache_without_upstreams(
    project: Path, up: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Home A, which keeps its package files, pushes to a directory cache; home B realizes from
    it with no index or hub, and so does home C, which does not trust the cache's key and
    builds from the package files the cache carries."""
    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "1")  # the package files as store paths
    realized = tmp_path / "home-a"
    realize(project, realized)
    keys, cache = tmp_path / "keys", tmp_path / "cache"
    assert run_harness_process("store", "keygen", "lab", "--dir", str(keys)).returncode == 0
    push = run_harness_process(
        "--project",
        str(project),
        "--home",
        str(realized),
        "store",
        "push",
        str(cache),
        "--key",
        str(keys / "lab.secret"),
    )
    assert push.returncode == 0, push.stderr
    public = (keys / "lab.public").read_text().strip()
    # Every upstream unreachable: what B gets must come from the cache.
    env = {"HARNESS_SUBSTITUTERS": cache.as_uri(), "HARNESS_TRUSTED_KEYS": public, **NO_UPSTREAMS}
    other = tmp_path / "home-b"
    result = run_harness_process("--project", str(project), "--home", str(other), "realize", env=env)
    assert result.returncode == 0, result.stderr
    # B took A's environment, built on the same host copy (same content, same name), from the
    # cache instead of building it again: it holds A's runtime closure, and of A's package
    # files only those the cache gave before the environment came (none were needed).
    lock = read(project / "locks" / "svc.lock.toml")
    assert lock_objects(realized_lock(Store.in_home(other), lock)) == lock_objects(
        realized_lock(Store.in_home(realized), lock)
    )
    theirs, ours = snapshot(realized), snapshot(other)
    assert {name: theirs.get(name) for name in ours} == ours
    assert set(theirs) - set(ours) <= set(build_inputs(lock)) | set(
        build_inputs(realized_lock(Store.in_home(realized), lock))
    )
    assert "installing" not in result.stderr and "built-wheel" not in result.stderr, result.stderr
    # Without the key, built paths (interpreter, environment) are refused and built locally,
    # while fixed-output paths are still taken on their lock hashes.
    third = tmp_path / "home-c"
    env_untrusted = {**env, "HARNESS_TRUSTED_KEYS": ""}
    result = run_harness_process("--project", str(project), "--home", str(third), "realize", env=env_untrusted)
    assert result.returncode == 0, result.stderr
    assert "signature" in result.stderr or "trusted" in result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: not substituted")]
    assert warnings and len(warnings) == len(set(warnings)), "each refusal is said once"
    assert snapshot(third) == snapshot(realized)


def test_a_home_that_keeps_no_wheel_files_still_serves_another_through_its_cache(
    project: Path, up: Upstreams, tmp_path: Path
) -> None:
    """Issue 30, step 3: with `[gc] keep-wheel-files = false` the pushing home holds no package
    file, only the environment, built on a host copy (no interpreter downloads here). Another
    home with the same host CPython, every upstream unreachable, makes its own copy, finds it
    is the pushed one (same content, same name) and takes the environment on it from the
    cache: nothing to fetch, nothing to build. Without the cache's key the environment is
    refused and the wheels it would be built from are named."""
    keys, cache, pusher = tmp_path / "keys", tmp_path / "cache", tmp_path / "home-a"
    assert run_harness_process("store", "keygen", "lab", "--dir", str(keys)).returncode == 0
    lean = {"HARNESS_GC_KEEP_WHEEL_FILES": "0"}
    result = run_harness_process("--project", str(project), "--home", str(pusher), "realize", env=lean)
    assert result.returncode == 0, result.stderr
    lock = read(project / "locks" / "svc.lock.toml")
    assert not any(Store.in_home(pusher).is_registered(name) for name in build_inputs(lock))
    push = ("--project", str(project), "--home", str(pusher), "store", "push", str(cache))
    assert run_harness_process(*push, "--key", str(keys / "lab.secret")).returncode == 0
    public = (keys / "lab.public").read_text().strip()
    env = {**lean, "HARNESS_SUBSTITUTERS": cache.as_uri(), "HARNESS_TRUSTED_KEYS": public, **NO_UPSTREAMS}
    other = tmp_path / "home-b"
    result = run_harness_process("--project", str(project), "--home", str(other), "realize", env=env)
    assert result.returncode == 0, result.stderr
    assert "fetching" not in result.stderr and "installing" not in result.stderr, result.stderr
    theirs, ours = realized_lock(Store.in_home(pusher), lock), realized_lock(Store.in_home(other), lock)
    assert ours.python.store != lock.python.store, "a host copy stands in"
    assert lock_objects(ours) == lock_objects(theirs)
    # The pusher keeps the wheel it built from an sdist (making it again takes a build); the
    # other home, which built nothing, needs none of it.
    built = {name for _, name in built_wheels(theirs)}
    assert built and all(Store.in_home(pusher).is_registered(name) for name in built)
    assert snapshot(other) == {k: v for k, v in snapshot(pusher).items() if k not in built}
    assert all(f.status == "ok" for f in verify_store(Store.in_home(other), check_contents=True))
    # A second realize there is a no-op: the host copy is noted as standing in.
    again = run_harness_process("--project", str(project), "--home", str(other), "realize", env=env)
    assert again.returncode == 0 and "copying" not in again.stderr, again.stderr
    third = tmp_path / "home-c"
    untrusted = {**env, "HARNESS_TRUSTED_KEYS": ""}
    result = run_harness_process("--project", str(project), "--home", str(third), "realize", env=untrusted)
    assert result.returncode != 0
    assert "127.0.0.1:9" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_host_copy_is_made_before_the_fetch_only_where_it_is_known_to_stand_in(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy is made first (to pull the environment on it) only where no download of the
    lock's interpreter will be tried: an interpreter uv may still download overlaps the fetch."""
    from harness.config import Settings
    from harness.realize.builder import Context, _standin_expected
    from harness.realize.unreachable import download_key, remember_unreachable

    lock = read(project / "locks" / "svc.lock.toml")
    assert lock.python.source == "uv-managed"

    def context(**kwargs: bool) -> Context:
        return Context(
            store=Store(tmp_path / "store"),
            project_root=project,
            settings=Settings(),
            cache_dir=tmp_path / "cache",
            **kwargs,  # type: ignore[arg-type]
        )

    monkeypatch.delenv("UV_PYTHON_DOWNLOADS", raising=False)
    assert not _standin_expected(context(), lock), "uv may download it: it overlaps the fetch"
    assert _standin_expected(context(offline=True), lock)
    remember_unreachable(tmp_path / "cache", download_key(lock.python.store, Settings().python_download_env()), "x")
    assert _standin_expected(context(), lock), "it failed a short while ago"
    assert not _standin_expected(context(refresh=True), lock), "--refresh tries uv again"
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    assert _standin_expected(context(refresh=True), lock)


def test_a_host_copy_left_under_a_locks_own_name_is_removed_with_what_was_built_on_it(tmp_path: Path) -> None:
    """An older harness registered host copies under the lock's uv-managed name; realize drops
    such a path and the environments built on it before installing the real interpreter."""
    from harness.realize.builder import _drop_legacy_host_copy
    from harness.store.hashing import store_hash, store_path_name
    from harness.store.store import BuildResult

    store = Store(tmp_path / "store")
    python = store_path_name(store_hash("python", "cpython-3.11.7", {"t": 1}), "cpython-3.11.7")
    names = {
        kind: store_path_name(store_hash(kind, f"x-{kind}", {"t": 1}), f"x-{kind}")
        for kind in ("environment", "source")
    }

    def folder(impure: str | None = None):  # type: ignore[no-untyped-def]
        def build(out: Path) -> BuildResult:
            out.mkdir()
            (out / "f").write_text("x")
            return BuildResult(impure=impure)

        return build

    store.add(python, "python", folder("host: /usr/bin/python3.11"))
    store.add(names["environment"], "environment", folder(), references=(python,))
    store.add(names["source"], "source", folder())
    _drop_legacy_host_copy(store, python)
    assert {r.name for r in store.records()} == {names["source"]}
    # A uv-managed interpreter (no impurity) under that name is the real one: kept.
    store.add(python, "python", folder())
    _drop_legacy_host_copy(store, python)
    assert store.is_registered(python)


# ------------------------------------------------------- a lock that fails while registering


def _needs_toolchain(up: Upstreams, tmp_path: Path) -> Path:
    """Publish ``needstool`` 1.0, an sdist whose wheel build fails (as a missing compiler or
    system header makes one fail) until the returned file exists; its metadata needs no build,
    so it locks. The file is the fix a user applies before retrying."""
    from tests.localindex import BACKEND

    toolchain = tmp_path / "toolchain"
    backend = (
        BACKEND
        + f"""

_build_wheel = build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if not os.path.exists({str(toolchain)!r}):
        raise RuntimeError("needstool: the frobnicator toolchain is missing")
    return _build_wheel(wheel_directory, config_settings, metadata_directory)
"""
    )
    up.index.add_sdist("needstool", "1.0", backend=backend)
    return toolchain


def _locked(root: Path, manifests: dict[str, str]) -> Path:
    from tests.upstreams import make_project

    project = make_project(root, manifests, {f"assets/local/{k}": v for k, v in LOCAL_FILES.items()})
    result = run_harness_process("--project", str(project), "lock")
    assert result.returncode == 0, result.stderr
    return project


def _realize_failing(project: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A realize that fails with the sdist build's own error (uv's report, with the backend's
    traceback in it) and nothing of harness's own: no harness traceback, no warning."""
    result = run_harness_process("--project", str(project), "--home", str(home), "realize", *args)
    assert result.returncode == 1, result.stderr
    assert "frobnicator toolchain is missing" in result.stderr
    assert re.search(r'File "[^"]*/harness/[^"]*\.py"', result.stderr) is None, result.stderr
    assert "warning" not in result.stderr.lower() and "internal error" not in result.stderr, result.stderr
    return result


def _downloads(home: Path) -> set[str]:
    folder = home / "cache" / "downloads"
    return {p.name for p in folder.iterdir() if len(p.name) == 64} if folder.is_dir() else set()


def test_a_failed_environment_build_gives_back_what_the_lock_registered(
    up: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every kind of path (package files, the git source, weight sets, the weights view, the
    host interpreter copy) is registered before uv builds the environment; the sdist's build
    fails, so all of it is given up again: the store is as it was (empty), the downloads are
    back in the download cache, and the retry after the fix downloads nothing."""
    from tests.upstreams import svc_manifest

    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "1")  # the package files as store paths

    toolchain = _needs_toolchain(up, tmp_path)
    manifest = svc_manifest(up).replace('"delta==1.0"', '"delta==1.0", "needstool==1.0"')
    assert "needstool" in manifest
    project = _locked(tmp_path / "project", {"svc": manifest})
    lock = read(project / "locks" / "svc.lock.toml")
    home = tmp_path / "home"

    _realize_failing(project, home)
    assert store_state(home) == EMPTY
    assert verify_store(Store.in_home(home), check_contents=True) == []
    from harness.realize.builder import chosen_file

    files = {chosen_file(p, lock).sha256 for p in [*lock.packages, *lock.build_packages]}
    weights = {f.sha256 for w in lock.weights for f in w.files}
    assert files | weights <= _downloads(home)

    toolchain.write_text("")
    up.index.requests.clear()
    up.hub.clear_requests()
    realize(project, home)
    assert [r for r in up.index.requests if r.startswith("/files/")] == []
    assert up.hub.requests == []
    store = Store.in_home(home)
    assert store.is_registered(realized_lock(store, lock).environment.store)
    assert all(f.status == "ok" for f in verify_store(store, check_contents=True))
    assert _downloads(home) == set()  # the store holds them now


def test_a_failed_realize_keeps_what_was_there_and_what_another_process_holds(
    up: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paths registered before the failed realize (a wheel and the interpreter shared with a
    lock realized earlier) stay, and so does a path it registered that another process roots
    meanwhile; the rest of what it registered goes."""
    from harness.realize.builder import chosen_file
    from harness.store.roots import held
    from tests.upstreams import service

    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "1")  # the package files as store paths

    toolchain = _needs_toolchain(up, tmp_path)
    project = _locked(
        tmp_path / "project",
        {"base": service(["beta==1.0"]), "broken": service(["beta==1.0", "delta==1.0", "needstool==1.0"])},
    )
    base, broken = (read(project / "locks" / f"{n}.lock.toml") for n in ("base", "broken"))
    home = tmp_path / "home"
    realize(project, home, "base")
    store = Store.in_home(home)
    before = store_state(home)

    def file_of(name: str) -> str:
        return chosen_file(next(p for p in broken.packages if p.name == name), broken).store

    beta, delta, needstool = file_of("beta"), file_of("delta"), file_of("needstool")
    assert store.is_registered(beta) and not store.is_registered(delta)
    with held(store, [delta], "a concurrent realize"):
        _realize_failing(project, home, "broken")
    after = store_state(home)
    assert after["paths"] == sorted([*before["paths"], delta])
    assert {k: v for k, v in after.items() if k not in ("records", "paths", "meta")} == {
        k: v for k, v in before.items() if k not in ("records", "paths", "meta")
    }
    assert store.is_registered(beta) and store.is_registered(realized_lock(store, base).python.store)
    assert not store.is_registered(needstool)
    assert chosen_file(next(p for p in broken.packages if p.name == "needstool"), broken).sha256 in _downloads(home)
    assert all(f.status == "ok" for f in verify_store(store, check_contents=True))

    toolchain.write_text("")
    realize(project, home, "broken")
    assert store.is_registered(realized_lock(store, broken).environment.store)


def test_what_a_failed_lock_shares_with_one_realized_beside_it_stays(
    up: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two locks realized together into an empty store: the one that fails gives up only what
    the other (realized) does not use: the shared wheel and interpreter stay."""
    from harness.lock.objects import all_objects
    from harness.realize.builder import chosen_file
    from tests.upstreams import service

    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "1")  # the package files as store paths

    _needs_toolchain(up, tmp_path)
    project = _locked(
        tmp_path / "project",
        {"good": service(["delta==1.0"]), "broken": service(["delta==1.0", "needstool==1.0"])},
    )
    good, broken = (read(project / "locks" / f"{n}.lock.toml") for n in ("good", "broken"))
    home = tmp_path / "home"
    _realize_failing(project, home)
    store = Store.in_home(home)
    assert sorted(r.name for r in store.records()) == sorted(all_objects(realized_lock(store, good)))
    needstool = chosen_file(next(p for p in broken.packages if p.name == "needstool"), broken)
    assert not store.is_registered(needstool.store) and needstool.sha256 in _downloads(home)
    assert all(f.status == "ok" for f in verify_store(store, check_contents=True))


# -- a deploy's weights folder: a local source of weight files ------------------------------

#: Hub endpoints nobody answers at (port 9, discard): what comes must come from elsewhere.
NO_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9", "HARNESS_MODELSCOPE_ENDPOINT": "http://127.0.0.1:9"}


def _deploy_with_weights(project: Path, realized: Path, tmp_path: Path, weights: str = "pre") -> tuple[Path, Path]:
    """A deploy file under ``tmp_path/deploy`` whose ``weights`` is ``weights`` (relative: to
    the deploy's folder), and that folder filled with a copy (not links) of the realized
    weights view: (deploy file, folder)."""
    view = run_harness_process(
        "--project", str(project), "--home", str(realized), "store", "path", "svc", "--weights"
    ).stdout.strip()
    deploy = tmp_path / "deploy" / "lab.toml"
    deploy.parent.mkdir(parents=True)
    deploy.write_text(f'weights = "{weights}"\n')
    folder = deploy.parent / weights
    shutil.copytree(view, folder)  # symlinks followed: plain files the user owns
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return deploy, folder


def _realize_with(project: Path, home: Path, deploy: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = run_harness_process(
        "--project", str(project), "--home", str(home), "--deploy", str(deploy), "realize", env=env
    )
    assert "Traceback" not in result.stderr
    return result


def _corrupt(path: Path) -> str:
    """Flip one byte of ``path`` (same size); returns its new sha256."""
    import hashlib

    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return hashlib.sha256(data).hexdigest()


def test_deploy_weights_folder_realizes_without_the_hub(
    project: Path, realized: Path, up: Upstreams, tmp_path: Path
) -> None:
    """Every weight file is in the deploy's folder: a realize with both hubs unreachable
    succeeds, and gives the same store paths and content hashes as one from the hub."""
    deploy, folder = _deploy_with_weights(project, realized, tmp_path)
    home = tmp_path / "home"
    up.hub.clear_requests()
    result = _realize_with(project, home, deploy, NO_HUB)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr
    assert snapshot(home) == snapshot(realized)
    assert up.hub.requests == []
    # Copies, not links: no store file shares an inode with the user's folder.
    user_inodes = {p.stat().st_ino for p in folder.rglob("*") if p.is_file()}
    assert not user_inodes & {p.stat().st_ino for p in (home / "store").rglob("*") if p.is_file()}


def test_deploy_weights_folder_with_a_corrupt_copy_warns_and_fetches_from_the_hub(
    project: Path, realized: Path, tmp_path: Path
) -> None:
    lock = read(project / "locks" / "svc.lock.toml")
    hf = next(w for w in lock.weights if w.dir == "hf")
    item = next(f for f in hf.files if f.path == "model.safetensors")
    deploy, folder = _deploy_with_weights(project, realized, tmp_path)
    bad = folder / "hf" / "model.safetensors"
    actual = _corrupt(bad)
    home = tmp_path / "home"
    result = _realize_with(project, home, deploy, {})
    assert result.returncode == 0, result.stderr
    warning = next(line for line in result.stderr.splitlines() if line.startswith("warning:"))
    assert str(bad) in warning and item.sha256 in warning and actual in warning
    assert f"fetching it from Hugging Face org/model@{hf.revision} instead" in warning, warning
    assert snapshot(home) == snapshot(realized)
    view = Path(
        run_harness_process(
            "--project", str(project), "--home", str(home), "store", "path", "svc", "--weights"
        ).stdout.strip()
    )
    assert (view / "hf" / "model.safetensors").read_bytes() != bad.read_bytes()


def test_deploy_weights_folder_with_a_corrupt_copy_and_no_hub_fails_naming_it(
    project: Path, realized: Path, tmp_path: Path
) -> None:
    lock = read(project / "locks" / "svc.lock.toml")
    ms = next(w for w in lock.weights if w.dir == "ms")
    item = next(f for f in ms.files if f.path == "weights.bin")
    deploy, folder = _deploy_with_weights(project, realized, tmp_path)
    bad = folder / "ms" / "weights.bin"
    actual = _corrupt(bad)
    home = tmp_path / "home"
    result = _realize_with(project, home, deploy, NO_HUB)
    assert result.returncode == 1, result.stderr
    error = result.stderr[result.stderr.index("error") :]
    assert str(bad) in error and item.sha256 in error and actual in error
    assert store_state(home) == EMPTY


def test_deploy_weights_folder_that_does_not_exist_is_a_warning_naming_file_and_key(
    project: Path, realized: Path, tmp_path: Path
) -> None:
    """As the seed's example deploys name ``~/harness-weights``, a machine without that folder
    is told so (the deploy file, the key, the expanded path) and fetches from the hub."""
    deploy = tmp_path / "lab.toml"
    deploy.write_text('weights = "~/no-such-weights-$USER-x"\n')
    home = tmp_path / "home"
    # HOME stays the user's own: the interpreter to copy may live under it (pyenv), as in CI.
    user = f"someone-{tmp_path.name}"
    result = _realize_with(project, home, deploy, {"USER": user})
    assert result.returncode == 0, result.stderr
    assert f"warning: {deploy}: weights" in result.stderr
    expanded = Path("~").expanduser() / f"no-such-weights-{user}-x"
    assert str(expanded) in result.stderr and "does not exist" in result.stderr
    assert snapshot(home) == snapshot(realized)


_HARBOR_RESOLVE = """
import sys
from pathlib import Path
from harness.errors import HarnessError
from harness.harbor.resolve import resolve
from harness.harbor.spec import EnvironmentSpec

form, project, home, deploy = sys.argv[1:5]
if form == "manifest":
    spec = EnvironmentSpec(manifest="svc", project=Path(project))
else:
    spec = EnvironmentSpec(lock=Path(project) / "locks" / "svc.lock.toml", project=Path(project))
try:
    resolved = resolve(spec, Path(home), deploy=Path(deploy) if deploy else None)
except HarnessError as exc:
    sys.exit(f"unavailable: {exc}")
print(resolved.environment)
"""


@pytest.mark.parametrize("form", ["manifest", "lock"])
def test_a_harbor_realize_on_first_use_takes_weights_from_the_deploy_folder(
    project: Path, realized: Path, tmp_path: Path, form: str
) -> None:
    """A Harbor trial realizing its environment on first use reads the machine's deploy (the
    ``deploy`` option, else ``$HARNESS_DEPLOY``) as ``harness realize --deploy`` does: with
    both hubs unreachable, the weights come from its folder; without it, the realize fails."""
    deploy, _ = _deploy_with_weights(project, realized, tmp_path)

    def harbor_resolve(home: Path, deploy_file: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", _HARBOR_RESOLVE, form, str(project), str(home), deploy_file]
        result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **NO_HUB}, timeout=300)
        assert "Traceback" not in result.stderr
        return result

    without = harbor_resolve(tmp_path / "home-without", "")
    assert without.returncode != 0 and "unavailable: realizing" in without.stderr, without.stderr
    home = tmp_path / "home"
    result = harbor_resolve(home, str(deploy))
    assert result.returncode == 0, result.stderr
    assert snapshot(home) == snapshot(realized)


def test_without_wheel_files_wheels_stream_into_environments_and_a_failed_lock_retries_without_downloads(
    up: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[gc] keep-wheel-files = false`, two locks realized together, one of which fails (its
    sdist's build): the store never holds a wheel (uv downloads each into the environment
    that installs it, checking it as it streams: issue 30); harness downloads only the sdist.
    The failed lock's retry after the fix, offline, takes the wheel it shares with the other
    from uv's cache (its address noted beside it), downloads nothing and leaves no package
    file."""
    from harness.lock.document import Lock, LockedFile
    from harness.lock.objects import chosen_file
    from tests.upstreams import service

    toolchain = _needs_toolchain(up, tmp_path)
    project = _locked(
        tmp_path / "project",
        {"good": service(["alpha==1.0", "delta==1.0"]), "broken": service(["delta==1.0", "needstool==1.0"])},
    )
    good, broken = (read(project / "locks" / f"{n}.lock.toml") for n in ("good", "broken"))
    home = tmp_path / "home"
    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "0")
    _realize_failing(project, home)
    store = Store.in_home(home)
    assert store.is_registered(realized_lock(store, good).environment.store)

    def file_of(lock: Lock, name: str) -> LockedFile:
        return chosen_file(next(p for p in lock.packages if p.name == name), lock)

    wheels = [file_of(good, "alpha"), file_of(good, "delta")]
    assert not [f.file for f in wheels if store.is_registered(f.store)], "streamed: never a store path"
    before = _downloads(home)
    assert before == {file_of(broken, "needstool").sha256}, "harness downloaded the sdist alone"
    toolchain.write_text("")
    realize(project, home, "--offline", "broken")
    realized = realized_lock(store, broken)
    assert store.is_registered(realized.environment.store)
    # Only the wheel built from the sdist stays: another environment takes it without a build.
    [(_, built)] = built_wheels(realized)
    assert [n for n in build_inputs(realized) if store.is_registered(n)] == [built]
    assert _downloads(home) <= before
    assert all(f.status == "ok" for f in verify_store(store, check_contents=True))


def test_ctrl_c_while_the_streamed_wheels_index_hangs_ends_realize_within_a_second(
    up: Upstreams, tmp_path: Path
) -> None:
    """With `[gc] keep-wheel-files = false` the wheels' addresses are read from the index in
    threads of their own beside phase 1, and the environment's build waits for them. An index
    whose pages hang must not hold a Ctrl-C up to the read's timeout (60 s): realize ends
    within a second (asserted loosely), exit 130, no traceback, and the store verifies."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.upstreams import service

    project = _locked(tmp_path / "project", {"plain": service(["alpha==1.0", "delta==1.0"])})
    released = threading.Event()

    class Hanging(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            released.wait(30)
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    home = tmp_path / "home"
    env = {
        **os.environ,
        "UV_PYTHON_DOWNLOADS": "never",
        "HARNESS_GC_KEEP_WHEEL_FILES": "0",
        "HARNESS_INDEX_PYPI": f"http://127.0.0.1:{server.server_address[1]}/simple",
    }
    try:
        done = ctrl_c_at(
            ["--project", str(project), "--home", str(home), "realize"],
            lambda line: line.startswith("realizing plain"),  # phase 2: the build waits for the pages
            env=env,
            pause=0.5,
            timeout=60,
        )
    finally:
        released.set()
        server.shutdown()
        server.server_close()
    assert done.took is not None, done.stderr
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert done.took < 3, f"{done.took:.2f} s after SIGINT\n{done.stderr}"
    assert run_harness_process("--project", str(project), "--home", str(home), "store", "verify").returncode == 0


def test_offline_streamed_wheels_come_from_uvs_cache_and_one_it_lost_is_named(
    up: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[gc] keep-wheel-files = false`: an environment realized offline takes a wheel uv
    streamed into an earlier one from uv's cache (offline, the index page that gave its
    address cannot be read: the address is noted beside the cache), and it is the same
    environment an online realize builds. When uv's cache has lost it, the offline realize
    is refused naming the file, and the store is as it was."""
    from harness.lock.objects import chosen_file
    from harness.realize.wheelurls import remembered
    from tests.upstreams import service

    project = _locked(
        tmp_path / "project",
        {name: service(["alpha==1.0"]) for name in ("first", "again", "third")},
    )
    first, again, third = (read(project / "locks" / f"{n}.lock.toml") for n in ("first", "again", "third"))
    alpha = chosen_file(next(p for p in first.packages if p.name == "alpha"), first)
    home = tmp_path / "home"
    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "0")
    realize(project, home, "first")
    store = Store.in_home(home)
    assert not store.is_registered(alpha.store) and not _downloads(home), "streamed: neither stored nor downloaded"
    assert alpha.sha256 in remembered(home / "cache")

    realize(project, home, "--offline", "again")
    env = realized_lock(store, again).environment.store
    assert store.is_registered(env) and not store.is_registered(alpha.store) and not _downloads(home)
    online_home = tmp_path / "online"
    realize(project, online_home, "again")
    assert snapshot(online_home)[env] == snapshot(home)[env], "offline from uv's cache: the same environment"

    for bucket in (home / "cache").glob("*-v[0-9]*"):  # uv's cache loses its wheels, keeps the note
        shutil.rmtree(bucket)
    before = snapshot(home)
    refused = realize(project, home, "--offline", "third", check=False)
    assert refused.returncode != 0
    assert alpha.file in refused.stderr and "uv's cache" in refused.stderr, refused.stderr
    assert snapshot(home) == before, "a refused realize leaves the store as it was"
    assert not store.is_registered(realized_lock(store, third).environment.store)


def test_an_online_second_environment_takes_streamed_wheels_from_uvs_cache_without_the_index(
    up: Upstreams, tmp_path: Path
) -> None:
    """By default (`[gc] keep-wheel-files = false`) a second environment whose wheels uv
    streamed into a first one is built from uv's cache first, online too: no index page is
    read, so it realizes with the index unreachable (as fast as from kept wheel files). Where
    uv's cache has lost a wheel, the online realize reads the address from the index again and
    builds the same environment."""
    from harness.lock.objects import chosen_file
    from tests.upstreams import service

    project = _locked(tmp_path / "project", {name: service(["alpha==1.0"]) for name in ("first", "again", "third")})
    first = read(project / "locks" / "first.lock.toml")
    alpha = chosen_file(next(p for p in first.packages if p.name == "alpha"), first)
    home = tmp_path / "home"
    realize(project, home, "first")
    store = Store.in_home(home)
    assert not store.is_registered(alpha.store), "streamed: not a store path"

    gone = {"HARNESS_INDEX_PYPI": "http://127.0.0.1:9/simple"}  # nothing answers there
    again = run_harness_process("--project", str(project), "--home", str(home), "realize", "again", env=gone)
    assert again.returncode == 0, again.stderr
    assert "from uv's cache" in again.stderr, again.stderr
    env = realized_lock(store, read(project / "locks" / "again.lock.toml")).environment.store
    other = tmp_path / "other"
    realize(project, other, "again")
    assert snapshot(other)[env] == snapshot(home)[env], "the environment an online sync builds"

    for bucket in (home / "cache").glob("*-v[0-9]*"):  # uv's cache loses its wheels, keeps the note
        shutil.rmtree(bucket)
    lost = run_harness_process("--project", str(project), "--home", str(home), "realize", "third", env=gone)
    assert lost.returncode != 0 and "Traceback" not in lost.stderr
    assert "127.0.0.1:9" in lost.stderr, lost.stderr
    third = realize(project, home, "third")
    assert "from uv's cache" in third.stderr and "downloading 1 of them" in third.stderr, third.stderr
    assert store.is_registered(realized_lock(store, read(project / "locks" / "third.lock.toml")).environment.store)
    assert all(f.status == "ok" for f in verify_store(store, check_contents=True))


def test_a_wheel_uvs_cache_lost_is_recognized_however_uv_wraps_its_message() -> None:
    """uv wraps its error to the terminal's width (``COLUMNS``), so the message that a wheel is
    not in its cache may break anywhere between words: it is still the wheel, by name."""
    from harness.realize.environment import NotCached, RemoteWheel, _remote_dist, not_cached

    url = "http://127.0.0.1:37117/files/beta-1.0-py3-none-any.whl"
    remote = [_remote_dist(RemoteWheel("beta-1.0-py3-none-any.whl", url, "0" * 64))]
    for stderr in (
        f"error: Failed to download `beta==1.0`\n  cause: Network connectivity is disabled, but the requested data wasn't found in the cache: {url}\n",
        f"error: Failed to download `beta==1.0`\n  cause: Network connectivity is disabled, but the requested data wasn't found\n         in the cache: {url}\n",
    ):
        error = not_cached(stderr, remote)
        assert isinstance(error, NotCached) and "beta-1.0-py3-none-any.whl" in error.message, stderr
    assert not_cached("error: Failed to download `beta==1.0`: connection refused", remote) is None


def test_a_download_others_can_write_is_copied_and_checked_again_not_linked(tmp_path: Path) -> None:
    """In a shared home ``cache/downloads`` is group-writable: a member may change a file's
    bytes after the fetch checked them. Taking a download there into a store build copies it
    and checks the copy against the lock (a mismatch names file, expected and actual, and
    leaves nothing); in a folder only this user writes, it is hard-linked as before."""
    import hashlib

    from harness.config import Settings
    from harness.errors import HarnessError
    from harness.realize.builder import Context, _take_download

    good = b"wheel bytes " * 1000
    sha = hashlib.sha256(good).hexdigest()
    ctx = Context(
        store=Store(tmp_path / "store"), project_root=tmp_path, settings=Settings(), cache_dir=tmp_path / "cache"
    )
    ctx.downloads.mkdir(parents=True)
    ctx.downloads.chmod(0o755)
    ctx.download_path(sha).write_bytes(good)

    _take_download(ctx, sha, len(good), tmp_path / "private" / "a.whl")
    assert os.path.samefile(tmp_path / "private" / "a.whl", ctx.download_path(sha)), "a private download is linked"

    ctx.downloads.chmod(0o2775)  # as `store init --group` leaves it
    _take_download(ctx, sha, len(good), tmp_path / "shared" / "a.whl")
    taken = tmp_path / "shared" / "a.whl"
    assert taken.read_bytes() == good and not os.path.samefile(taken, ctx.download_path(sha)), "copied, not linked"

    changed = good[:-1] + bytes([good[-1] ^ 1])  # what another member wrote after the check
    ctx.download_path(sha).write_bytes(changed)
    dest = tmp_path / "tampered" / "a.whl"
    with pytest.raises(HarnessError) as info:
        _take_download(ctx, sha, len(good), dest)
    message = str(info.value)
    assert "a.whl" in message and sha in message and hashlib.sha256(changed).hexdigest() in message
    assert not dest.exists(), "nothing of the changed bytes is kept"
    assert not ctx.download_path(sha).exists(), "the changed download is gone: the next realize fetches it again"
