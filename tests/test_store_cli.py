"""The store commands through the real CLI: ls, path, verify (and --repair), gc, why, pin;
``harness install`` locking what has no lock; ``harness realize`` refusing a stale lock and
noticing every change on a no-op.

One project (a wheel set, a hub weight set and a path weight set, from the local upstreams of
tests/upstreams.py) is locked and realized once per module into one home; tests that change
the store put it back (``verify --repair``) or only add and collect objects of their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.lock.objects import all_objects, lock_objects
from harness.cli import main
from harness.lock.lockfile import read
from harness.realize.standin import realized_lock
from harness.lock.storepaths import weights_view_path
from harness.store.store import BuildResult, Store, remove_tree
from tests.upstreams import LOCAL_FILES, Upstreams, make_project, service

WEIGHTS = """
[[weights]]
dir = "hf"
huggingface_model = "org/model"
include = ["*.json", "*.safetensors"]

[[weights]]
dir = "local"
path = "assets/local"
"""


def cli(*args: str) -> int:
    try:
        main(list(args))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


@pytest.fixture(scope="module")
def fast_env(up: Upstreams) -> Iterator[None]:
    # No Python download can succeed here: say so up front rather than let uv try first.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UV_PYTHON_DOWNLOADS", "never")
        # The store commands are shown on a store that holds package files too
        # (`[gc] keep-wheel-files = true`): ls lists them, verify and repair mend them, gc roots them.
        mp.setenv("HARNESS_GC_KEEP_WHEEL_FILES", "1")
        yield


@pytest.fixture(scope="module")
def project(up: Upstreams, fast_env: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_project(
        tmp_path_factory.mktemp("storecli"),
        {"svc": service(["beta==1.0", "delta==1.0"], extra=WEIGHTS), "later": service(["alpha==2.0"])},
        {f"assets/local/{k}": v for k, v in LOCAL_FILES.items()},
    )
    assert cli("--project", str(root), "lock", "svc") == 0
    return root


@pytest.fixture(scope="module")
def home(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    assert cli("--project", str(project), "--home", str(home), "realize", "svc", "--json") == 0
    return home


@pytest.fixture
def run(harness_cli, project: Path, home: Path):  # type: ignore[no-untyped-def]
    def call(*args: str, project_root: Path = project, home_dir: Path = home):  # type: ignore[no-untyped-def]
        return harness_cli("--project", str(project_root), "--home", str(home_dir), *args)

    return call


def svc_lock(project: Path, home: Path):  # type: ignore[no-untyped-def]
    """The svc lock as ``home`` realizes it (downloads are off here: a host copy stands in)."""
    return realized_lock(Store.in_home(home), read(project / "locks" / "svc.lock.toml"))


def flip_one_byte(path: Path) -> None:
    """Change one byte of a store file in place (store files are read-only: open it up first)."""
    path.chmod(path.stat().st_mode | 0o200)
    with open(path, "r+b") as handle:
        handle.seek(path.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


def add_object(store: Store, name: str, references: tuple[str, ...] = ()) -> str:
    def build(out: Path) -> BuildResult:
        out.mkdir()
        (out / "data").write_text(name)
        return BuildResult(obtained="test")

    store.add(name, "source", build, references=references)
    return name


# ------------------------------------------------------------------------------------- ls


def test_ls_table_and_json(run, project: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    lock = svc_lock(project, home)
    wanted = set(all_objects(lock))
    result = run("store", "ls", "--json")
    assert result.code == 0, result.err
    listed = json.loads(result.out)
    store_root = home / "store"
    # Every path the lock realized is listed; other tests of this module add (and collect)
    # objects of their own in this home, so in any order the listing may hold more, each
    # of them a registered path too.
    names = {Path(e["path"]).name for e in listed}
    assert wanted <= names
    assert names == {r.name for r in Store.in_home(home).records()}
    for entry in listed:
        assert Path(entry["path"]) == store_root / entry["name"] and Path(entry["path"]).exists()
        assert entry["size"] == entry["nar_size"] > 0
    kinds = {Path(e["path"]).name: e["kind"] for e in listed}
    assert kinds[lock.environment.store] == "environment" and kinds[lock.python.store] == "python"
    assert kinds[weights_view_path(lock)] == "weights-view"
    assert {kinds[w.store] for w in lock.weights} == {"weights"}
    assert {kinds[w.store] for p in lock.packages for w in p.wheels if w.store in wanted} == {"file"}

    monkeypatch.setenv("COLUMNS", "300")  # wide enough that rich folds no name
    table = run("store", "ls")
    assert table.code == 0, table.err
    header = table.out.splitlines()[1]
    assert "path" in header and "kind" in header and "size" in header
    for name in wanted:
        line = next(line for line in table.out.splitlines() if name in line)
        assert kinds[name] in line and ("KiB" in line or "MiB" in line or " B " in line)


# ----------------------------------------------------------------------------------- path


def test_path_prints_the_realized_environment_and_weights(
    run,
    project: Path,
    home: Path,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    lock = svc_lock(project, home)
    result = run("store", "path", "svc")
    assert result.code == 0, result.err
    env = Path(result.out.strip())
    assert env == home / "store" / lock.environment.store
    python = subprocess.run(
        [str(env / "bin" / "python"), "-c", "import alpha, beta, delta; print('ok')"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert python.stdout.strip() == "ok", python.stderr
    view = Path(run("store", "path", "svc", "--weights").out.strip())
    assert (view / "local" / "arm.json").read_bytes() == LOCAL_FILES["arm.json"]
    assert (view / "hf" / "config.json").is_file()

    not_realized = run("store", "path", "svc", home_dir=tmp_path / "empty-home")
    assert not_realized.code != 0
    assert "svc is not realized" in not_realized.err and "harness realize svc" in not_realized.err
    no_lock = run("store", "path", "later")
    assert no_lock.code != 0 and "no lock for 'later'" in no_lock.err and "harness lock later" in no_lock.err


# --------------------------------------------------------------------------------- verify


def test_ls_closure_lists_what_a_manifest_needs_here_and_its_total(run, project: Path, home: Path) -> None:  # type: ignore[no-untyped-def]
    store = Store.in_home(home)
    lock = svc_lock(project, home)
    result = run("store", "ls", "--closure", "svc", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert lock.environment.store in data["paths"] and lock.python.store in data["paths"]
    sizes = {r.name: r.nar_size for r in store.records()}
    assert data["total"] == sum(sizes[name] for name in data["paths"])
    by_path = json.loads(run("store", "ls", "--closure", str(store.root / lock.environment.store), "--json").out)
    assert set(by_path["paths"]) == {lock.environment.store, *store.record(lock.environment.store).references}  # type: ignore[union-attr]
    shown = run("store", "ls", "--closure", "svc")
    assert f"closure of svc: {len(data['paths'])} path(s)" in shown.out
    unknown = run("store", "ls", "--closure", "sam4")
    assert unknown.code == 2 and "neither a registered store path nor a locked manifest" in unknown.err


def test_verify_names_every_change_and_repair_restores(run, project: Path, home: Path) -> None:  # type: ignore[no-untyped-def]
    lock = svc_lock(project, home)
    store = Store.in_home(home)
    clean = run("store", "verify", "--check-contents")
    assert clean.code == 0, clean.out + clean.err

    delta = next(p for p in lock.packages if p.name == "delta")
    wheel = next(w for w in delta.wheels if store.is_registered(w.store))
    hf = next(w for w in lock.weights if w.dir == "hf")
    view = weights_view_path(lock)
    assert view is not None
    flip_one_byte(store.path(wheel.store) / wheel.file)
    flip_one_byte(store.path(hf.store) / "model.safetensors")
    remove_tree(store.path(view))

    # Without --check-contents the launch check's stat fingerprints find the changed files
    # (and only the paths whose fingerprint moved are re-hashed).
    quick = run("store", "verify")
    assert quick.code == 1
    assert f"missing   {view}" in quick.out
    assert f"modified  {wheel.store}: changed since registered: {wheel.store}/{wheel.file}" in quick.out, quick.out
    [hf_line] = [line for line in quick.out.splitlines() if line.startswith(f"modified  {hf.store}: changed since")]
    assert f"{hf.store}/model.safetensors" in hf_line  # (and files whose link count moved: the view's)

    full = run("store", "verify", "--check-contents")
    assert full.code == 1
    bad = {line.split()[1].rstrip(":"): line.split()[0] for line in full.out.splitlines()}
    assert bad == {wheel.store: "modified", hf.store: "modified", view: "missing"}, full.out
    assert "expected blake3:" in full.out

    as_json = json.loads(run("store", "verify", "--check-contents", "--json").out)
    assert {f["name"] for f in as_json["findings"] if f["status"] != "ok"} == set(bad)

    repaired = run("store", "verify", "--repair")
    assert repaired.code == 0, repaired.out + repaired.err
    assert {line.split()[1] for line in repaired.out.splitlines() if line.startswith("repaired")} == set(bad)
    after = run("store", "verify", "--check-contents")
    assert after.code == 0, after.out
    data = (store.path(wheel.store) / wheel.file).read_bytes()
    assert hashlib.sha256(data).hexdigest() == wheel.sha256
    assert (store.path(view) / "local" / "arm.json").read_bytes() == LOCAL_FILES["arm.json"]


def test_repair_never_launders_a_changed_environment_file(run, project: Path, home: Path) -> None:  # type: ignore[no-untyped-def]
    """An environment's files are hard links shared with the store's pool and uv's cache, so
    changing one changes them all. The cheap verify names the file; repair rebuilds the
    environment to the content it was registered with (not the changed bytes the pool and
    uv's cache now hold), and the pool entry holds its named bytes again."""
    import blake3

    store = Store.in_home(home)
    lock = svc_lock(project, home)
    env = lock.environment.store
    registered = store.record(env)
    assert registered is not None
    [target] = [p for p in (store.path(env) / "lib").glob("python*/site-packages/delta/__init__.py")]
    original = target.read_bytes()
    pool = store.links_dir / blake3.blake3(original).hexdigest()
    assert pool.stat().st_ino == target.stat().st_ino, "the file is the pool's inode"
    flip_one_byte(target)
    assert pool.read_bytes() != original  # one inode: the pool changed with it

    rel = target.relative_to(store.root)
    quick = run("store", "verify")
    assert quick.code == 1, quick.out
    [line] = [line for line in quick.out.splitlines() if line.startswith(f"modified  {env}: changed since registered")]
    assert str(rel) in line  # (with any other file of the same bytes: one pool inode)

    repaired = run("store", "verify", "--repair")
    assert repaired.code == 0, repaired.out + repaired.err
    assert f"repaired  {env}" in repaired.out
    again = store.record(env)
    assert again is not None and again.content == registered.content, "the same name, the same content"
    assert target.read_bytes() == original
    assert blake3.blake3(pool.read_bytes()).hexdigest() == pool.name, "the pool entry holds its named bytes"
    assert run("store", "verify", "--check-contents").code == 0


def test_verify_names_the_changed_file_when_a_siblings_links_moved_every_files_ctime(
    run, project: Path, home: Path
) -> None:  # type: ignore[no-untyped-def]
    """Another environment sharing the pool's files (realized beside, or collected) moves the
    ctime of every file it shares: the stat fingerprint then names them all. The cheap verify
    leaves out each file that is still one inode with the pool entry named by its bytes, so
    the one file that changed is named, not buried behind ten unchanged ones."""
    store = Store.in_home(home)
    env = svc_lock(project, home).environment.store
    assert run("store", "verify").code == 0
    files = sorted(
        p for p in store.path(env).rglob("*") if p.is_file() and not p.is_symlink() and p.stat().st_nlink > 1
    )
    assert len(files) > 10, files
    sibling = home / "sibling"  # what an environment linking the same pool files does
    sibling.mkdir()
    for index, path in enumerate(files):
        os.link(path, sibling / str(index))
    shutil.rmtree(sibling)
    [target] = [p for p in files if p.match("*/site-packages/delta/__init__.py")]
    flip_one_byte(target)
    quick = run("store", "verify")
    assert quick.code == 1, quick.out
    [line] = [line for line in quick.out.splitlines() if line.startswith(f"modified  {env}: changed since registered")]
    # Named: the changed file, and every file of the environment that is one inode with it.
    same = sorted(str(p.relative_to(store.root)) for p in files if p.stat().st_ino == target.stat().st_ino)
    assert str(target.relative_to(store.root)) in same
    assert f"changed since registered: {', '.join(same)};" in line, line
    assert run("store", "verify", "--repair").code == 0
    assert run("store", "verify", "--check-contents").code == 0


def test_a_repair_that_cannot_restore_the_registered_content_registers_nothing(run, project: Path, home: Path) -> None:  # type: ignore[no-untyped-def]
    """A record that claims other content than the lock's inputs rebuild to (as a rebuild
    from changed inputs would give): the repair deletes what it rebuilt and names both hashes."""
    store = Store.in_home(home)
    lock = svc_lock(project, home)
    env = lock.environment.store
    record = store.record(env)
    assert record is not None
    meta = store.record_path(env)
    data = json.loads(meta.read_text())
    data["content"] = "blake3:" + "0" * 64
    meta.chmod(0o644)
    meta.write_text(json.dumps(data))
    result = run("store", "verify", "--repair", env)
    assert result.code == 1
    assert f"{env}: rebuilt as {record.content}, registered as blake3:{'0' * 64}" in result.err, result.err
    assert not store.is_registered(env) and "Traceback" not in result.err
    assert run("realize", "svc").code == 0  # put back for the other tests
    assert store.record(env) is not None and store.record(env).content == record.content  # type: ignore[union-attr]


def test_verify_of_unknown_name_and_unrepairable_path(run, home: Path) -> None:  # type: ignore[no-untyped-def]
    store = Store.in_home(home)
    result = run("store", "verify", "9" * 32 + "-nothing")
    assert result.code == 1 and "missing" in result.out and "not registered" in result.out
    # A path no lock names cannot be rebuilt: --repair says so by exiting 1.
    orphan = add_object(store, "8" * 32 + "-orphan")
    flip_one_byte(store.path(orphan) / "data")
    result = run("store", "verify", "--repair", orphan)
    assert result.code == 1 and f"modified  {orphan}" in result.out
    store.delete(orphan)


# ------------------------------------------------------------------------------ gc / why / pin


HOLDER = """
import sys, time
from pathlib import Path
from harness.store.roots import TempRoots
from harness.store.store import Store
roots = TempRoots(Store(Path(sys.argv[1])), "test holder")
roots.add(sys.argv[3:])
print("held", flush=True)
if sys.argv[2] == "stay":
    time.sleep(600)
"""


def hold_in_process(store: Store, names: list[str], *, stay: bool) -> subprocess.Popen[str]:
    """A real process holding temporary roots on ``names`` (until killed, or not at all)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store.root), "stay" if stay else "exit", *names],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    if not stay:
        proc.wait()
    return proc


def gc_lines(out: str, verb: str) -> list[str]:
    """The path names of ``would delete NAME: why`` lines, sorted."""
    at = len(verb.split())
    return sorted(
        line.split()[at].rstrip(":")
        for line in out.splitlines()
        if line.startswith(verb + " ") and not line.split()[at].rstrip(";").isdigit()
    )


def test_gc_collects_only_unreachable_paths(run, project: Path, home: Path) -> None:  # type: ignore[no-untyped-def]
    store = Store.in_home(home)
    lock_paths = set(all_objects(svc_lock(project, home)))
    junk = add_object(store, "0" * 32 + "-junk")
    pinned = add_object(store, "1" * 32 + "-pinned")
    run_leaf = add_object(store, "2" * 32 + "-run-leaf")
    run_top = add_object(store, "3" * 32 + "-run-top", references=(run_leaf,))
    dead_run = add_object(store, "4" * 32 + "-dead-run")
    live = hold_in_process(store, [run_top], stay=True)
    hold_in_process(store, [dead_run], stay=False)  # a holder that exited holds nothing
    try:
        assert run("store", "pin", pinned).code == 0
        missing_pin = run("store", "pin", "5" * 32 + "-absent")
        assert missing_pin.code != 0 and "not a registered store path" in missing_pin.err

        dry = run("store", "gc", "--dry-run")
        assert dry.code == 0, dry.err
        assert gc_lines(dry.out, "would delete") == sorted([junk, dead_run])
        assert f"would delete {junk}: no root reaches it" in dry.out
        assert store.is_registered(junk) and store.is_registered(dead_run)

        why_python = run("store", "why", str(store.path(svc_lock(project, home).python.store)) + "/")
        assert f"referenced by {svc_lock(project, home).environment.store}" in why_python.out
        assert f"root project {project} (lock svc)" in why_python.out
        assert run("store", "why", pinned).out.strip() == f"root pin {pinned}"
        assert run("store", "why", run_leaf).out.strip() == f"referenced by {run_top}"
        assert run("store", "why", run_top).out.strip() == f"root live process {live.pid}: test holder (pid {live.pid})"
        assert "the next gc deletes it" in run("store", "why", junk).out

        collected = run("store", "gc")
        assert collected.code == 0, collected.err
        assert gc_lines(collected.out, "deleted") == sorted([junk, dead_run])
        assert "deleted 2 path(s)" in collected.out
        assert not os.path.lexists(store.root / junk) and not store.record_path(junk).exists()
        assert not os.path.lexists(store.root / dead_run)
        for name in [*lock_paths, pinned, run_leaf, run_top]:
            assert store.is_registered(name), name
        assert run("store", "verify").code == 0

        assert run("store", "pin", "--remove", pinned).code == 0
        live.kill()
        live.wait()
        again = run("store", "gc")
        assert gc_lines(again.out, "deleted") == sorted([pinned, run_leaf, run_top])
        assert all(store.is_registered(name) for name in lock_paths)
    finally:
        live.kill()
        live.wait()
        for name in (junk, pinned, run_leaf, run_top, dead_run):
            store.delete(name)


# -------------------------------------------------------------------------- install / realize


def test_install_locks_a_missing_lock_then_realizes(run, project: Path, home: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    copy = tmp_path / "project"
    shutil.copytree(project, copy)
    refused = run("realize", "later", project_root=copy)
    assert refused.code != 0 and "later: lock missing" in refused.err and "harness lock" in refused.err

    installed = run("install", "later", "--json", project_root=copy)
    assert installed.code == 0, installed.err
    lock = realized_lock(Store.in_home(home), read(copy / "locks" / "later.lock.toml"))
    [report] = json.loads(installed.out)
    assert report["environment"] == str(home / "store" / lock.environment.store)
    assert lock.environment.store in report["built"]
    store = Store.in_home(home)
    assert all(store.is_registered(name) for name in lock_objects(lock))
    env_python = home / "store" / lock.environment.store / "bin" / "python"
    result = subprocess.run(
        [str(env_python), "-c", "import alpha; print(alpha.__version__)"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    # Installed again: nothing to lock or build.
    again = run("install", "later", "--json", project_root=copy)
    assert again.code == 0 and json.loads(again.out)[0]["built"] == []
    # The copy's locks are gc roots now, so its paths survive a collection. Once the copy is
    # gone they are still kept, and said to be, until --forget-missing.
    assert lock.environment.store not in run("store", "gc", "--dry-run").out
    shutil.rmtree(copy)
    dry = run("store", "gc", "--dry-run")
    assert lock.environment.store not in dry.out
    assert f"project {copy} is missing" in dry.out and "--forget-missing" in dry.out
    forget = run("store", "gc", "--dry-run", "--forget-missing")
    assert f"would delete {lock.environment.store}: its project {copy} is gone and is forgotten now" in forget.out
    assert f"would forget project {copy}" in forget.out


def test_realize_refuses_a_stale_lock(run, project: Path, home: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    copy = tmp_path / "project"
    shutil.copytree(project, copy)
    manifest = copy / "services" / "svc.toml"
    manifest.write_text(manifest.read_text().replace('"beta==1.0"', '"beta==1.0", "alpha==1.0"'))
    before = sorted(r.name for r in Store.in_home(home).records())
    result = run("realize", "svc", project_root=copy)
    assert result.code != 0
    assert "svc: lock manifest changed" in result.err and "run `harness lock`" in result.err
    assert sorted(r.name for r in Store.in_home(home).records()) == before


NOOP_PROBE = """
import sys
from harness.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("pydantic loaded:", "pydantic" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


def test_noop_realize_notices_every_change(run, project: Path, home: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A realize with nothing to do is fast, and still sees a changed manifest, lock, path
    weight or store."""
    copy = tmp_path / "project"
    shutil.copytree(project, copy)
    lock = svc_lock(copy, home)
    # Files changed in the last two seconds get no stamp (their stat could yet change
    # unseen within one clock tick): let the copy's age past that.
    time.sleep(2.1)
    result = run("realize", "svc", "--json", project_root=copy)
    assert result.code == 0, result.err
    assert json.loads(result.out)[0]["built"] == []
    assert list((home / "cache" / "up-to-date").glob("*.json")), "a no-op leaves a stamp"
    # The next no-op is decided from the stamp alone: no manifest model (pydantic) is loaded.
    probe = subprocess.run(
        [sys.executable, "-c", NOOP_PROBE, "--project", str(copy), "--home", str(home), "realize", "svc", "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout)[0]["built"] == [] and probe.stderr.strip() == "pydantic loaded: False"

    arm = copy / "assets" / "local" / "arm.json"
    arm.write_bytes(arm.read_bytes().replace(b"7", b"6"))
    changed = run("realize", "svc", project_root=copy)
    assert changed.code != 0 and "weights local changed: arm.json" in changed.err
    arm.write_bytes(LOCAL_FILES["arm.json"])
    assert run("realize", "svc", project_root=copy).code == 0
    # Same size, mtime put back: the change (ctime) is still seen, by the stamp and by the
    # stat cache of path weight hashes alike.
    before = arm.stat()
    arm.write_bytes(LOCAL_FILES["arm.json"].replace(b"7", b"5"))
    os.utime(arm, ns=(before.st_atime_ns, before.st_mtime_ns))
    changed = run("realize", "svc", project_root=copy)
    assert changed.code != 0 and "weights local changed: arm.json" in changed.err
    arm.write_bytes(LOCAL_FILES["arm.json"])

    manifest = copy / "services" / "svc.toml"
    original = manifest.read_text()
    manifest.write_text(original.replace("port = 9000", "port = 9001"))  # runtime only: the lock holds
    assert run("realize", "svc", project_root=copy).code == 0
    manifest.write_text(original.replace('"delta==1.0"', '"delta==1.0", "alpha==1.0"'))
    changed = run("realize", "svc", project_root=copy)
    assert changed.code != 0 and "svc: lock manifest changed" in changed.err
    manifest.write_text(original + "\n# a comment changes no meaning\n")
    assert run("realize", "svc", project_root=copy).code == 0

    broken = copy / "services" / "broken.toml"
    broken.write_text("kind = 1\n")
    assert run("realize", "svc", project_root=copy).code != 0, "every manifest is still validated"
    broken.unlink()

    store = Store.in_home(home)
    view = weights_view_path(lock)
    assert view is not None
    store.delete(view)
    rebuilt = run("realize", "svc", "--json", project_root=copy)
    assert rebuilt.code == 0, rebuilt.err
    assert json.loads(rebuilt.out)[0]["built"] == [view]


def test_a_second_environment_of_the_same_wheels_shares_its_files(
    run,
    project: Path,
    home: Path,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    copy = tmp_path / "project"
    shutil.copytree(project, copy)
    (copy / "services" / "twin.toml").write_text(service(["beta==1.0", "delta==1.0"]))
    assert run("install", "twin", project_root=copy).code == 0
    store = Store.in_home(home)
    first = store.path(svc_lock(copy, home).environment.store)
    twin = store.path(realized_lock(store, read(copy / "locks" / "twin.lock.toml")).environment.store)

    def files(root: Path) -> dict[str, os.stat_result]:
        return {str(p.relative_to(root)): p.lstat() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}

    ours, theirs = files(first), files(twin)
    shared = [
        rel
        for rel, st in theirs.items()
        if rel in ours and (ours[rel].st_ino, ours[rel].st_dev) == (st.st_ino, st.st_dev)
    ]
    unshared = sorted(set(theirs) - set(shared))
    # Only what names the environment differs (its prompt in pyvenv.cfg and activate scripts).
    assert len(shared) > 10, shared
    assert all(rel.startswith("bin/activate") or rel == "pyvenv.cfg" for rel in unshared), unshared
    assert all(not rel.endswith(".pyc") for rel in unshared), unshared

    # One damaged shared file shows in both environments; repairing rebuilds both and puts
    # right the pool file they were linked to.
    pyc = next(first / rel for rel in shared if rel.endswith(".pyc"))
    flip_one_byte(pyc)
    damaged = run("store", "verify", "--check-contents", project_root=copy)
    assert damaged.code == 1
    assert {line.split()[1].rstrip(":") for line in damaged.out.splitlines()} == {first.name, twin.name}
    repaired = run("store", "verify", "--repair", project_root=copy)
    assert repaired.code == 0, repaired.out + repaired.err
    assert run("store", "verify", "--check-contents", project_root=copy).code == 0

    # Once the twin is collected, pool links only it used go too; the first env keeps its files.
    shutil.rmtree(copy)
    assert run("store", "gc", "--forget-missing").code == 0
    assert not twin.exists() and run("store", "verify", "--check-contents").code == 0
    assert all(p.stat().st_nlink > 1 for p in store.links_dir.iterdir())
