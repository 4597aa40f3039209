"""``harness lock``, ``lock --check`` and ``harness export`` end to end, through the real CLI.

Every upstream is a real local counterpart started here: a package index serving wheels and
sdists built in the test (tests/localindex.py), git repositories reached through ``file://``,
and a Hugging Face + ModelScope server spoken to by the real hub clients (tests/hubserver.py).
Settings reach harness the way a user's would, through the environment (harness.config).
One test, marked ``network``, locks the repository's own kinematics manifest from the real
default index and must reproduce the committed lock byte for byte.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness.lock.lockfile import read
from harness.lock.storepaths import assign_store_paths, file_path
from tests.conftest import REPO
from tests.localindex import LocalIndex
from tests.upstreams import HF_FILES, LOCAL_FILES, MS_FILES, STORE, Upstreams, make_project, service, sha

ORIGINAL_ENV = dict(os.environ)  # before the module's fixtures point everything at local servers


def no_traceback(result) -> None:  # type: ignore[no-untyped-def]
    assert "Traceback" not in result.err + result.out
    assert "internal error" not in result.err


# ------------------------------------------------------------------------ the git+hub project


def test_lock_pins_every_input(svc: Path, up: Upstreams) -> None:
    path = svc / "locks" / "svc.lock.toml"
    text = path.read_text()
    data = tomllib.loads(text)
    assert (data["lock-version"], data["name"], data["type"], data["manifest"]) == (
        1,
        "svc",
        "service",
        "services/svc.toml",
    )
    assert data["manifest-digest"].startswith("blake3:")
    assert data["python"] | {"store": ""} == {
        "implementation": "cpython",
        "version": "3.11.7",
        "platform": "x86_64-manylinux_2_28",
        "source": "uv-managed",
        "store": "",
    }

    # Packages: the manifest's, their dependencies, and the git source's own (beta → alpha).
    packages = {p["name"]: p for p in data["packages"]}
    assert {n: p["version"] for n, p in packages.items()} == {
        "alpha": "2.0",
        "beta": "1.0",
        "delta": "1.0",
        "epsilon": "1.0",
        "gamma": "1.0",
    }
    assert "toolkit" not in packages  # the source is a source, not an index package
    assert all(p["index"] == "pypi" for p in packages.values())
    # Every wheel that fits the target, not the Windows one; the sdist only where no wheel is.
    assert [w["file"] for w in packages["delta"]["wheels"]] == [
        "delta-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "delta-1.0-py3-none-any.whl",
    ]
    assert "sdist" not in packages["delta"] and "wheels" not in packages["epsilon"]
    files = [f for p in packages.values() for f in [*p.get("wheels", []), *filter(None, [p.get("sdist")])]]
    for f in files:
        on_index = up.index.file(f["file"]).read_bytes()
        assert (f["size"], f["sha256"]) == (len(on_index), sha(on_index))
    # Build requirements of the source, locked so realize can build it offline.
    assert [(p["name"], p["version"]) for p in data["build-packages"]] == [("tinybuild", "1.0")]

    [source] = data["sources"]
    assert source | {"store": ""} == {
        "name": "toolkit",
        "repo": up.repo_url,
        "rev": "v1",
        "commit": up.commit,
        "tree": up.tree,
        "install": "editable",
        "store": "",
        "build-requires": ["tinybuild==1.0"],  # its isolated build takes these build packages alone
    }

    weights = {w["dir"]: w for w in data["weights"]}
    hf = weights["hf"]
    assert (hf["provider"], hf["repo"], hf["revision"]) == ("huggingface_model", "org/model", up.hf_commit)
    assert [(f["path"], f["size"], f["sha256"]) for f in hf["files"]] == [
        (p, len(HF_FILES[p]), sha(HF_FILES[p])) for p in ("config.json", "model.safetensors", "tokenizer/vocab.txt")
    ]
    ms = weights["ms"]
    assert (ms["provider"], ms["repo"], ms["revision"]) == ("modelscope_model", "org/ms-model", "v1.0")
    assert [(f["path"], f["size"], f["sha256"], f["revision"]) for f in ms["files"]] == [
        (p, len(MS_FILES[p]), sha(MS_FILES[p]), up.ms_commit) for p in sorted(MS_FILES)
    ]
    local = weights["local"]
    assert (local["provider"], local["repo"], "revision" in local) == ("path", "assets/local", False)
    assert [(f["path"], f["size"], f["sha256"]) for f in local["files"]] == [
        (p, len(LOCAL_FILES[p]), sha(LOCAL_FILES[p])) for p in sorted(LOCAL_FILES)
    ]

    # A store path on every object, and all of them a pure function of the lock's content.
    stores = [
        data["python"]["store"],
        data["environment"]["store"],
        source["store"],
        *(w["store"] for w in data["weights"]),
        *(f["store"] for f in files),
        *(w["store"] for p in data["build-packages"] for w in p["wheels"]),
    ]
    assert all(STORE.match(s) for s in stores), stores
    assert len(set(stores)) == len(stores)
    lock = read(path)
    assert assign_store_paths(lock) == lock
    assert all(w.store == file_path(w) for p in lock.packages for w in p.wheels)
    # No address of the index or hub made it into the lock.
    assert "127.0.0.1" not in text and "http" not in text


def test_relock_is_byte_identical_warm_and_cold(svc: Path, up: Upstreams, harness_cli, tmp_path: Path) -> None:
    project = tmp_path / "p"
    shutil.copytree(svc, project)
    before = (project / "locks" / "svc.lock.toml").read_bytes()
    result = harness_cli("--project", str(project), "lock")
    assert result.code == 0, result.err
    assert "unchanged svc" in result.err
    # From empty caches (another HARNESS_HOME): the same bytes.
    result = harness_cli("--home", str(tmp_path / "cold"), "--project", str(project), "lock", "svc")
    assert result.code == 0, result.err
    assert (project / "locks" / "svc.lock.toml").read_bytes() == before


def test_check_names_stale_and_missing_locks(svc: Path, harness_cli, tmp_path: Path) -> None:
    project = tmp_path / "p"
    shutil.copytree(svc, project)

    def check():  # type: ignore[no-untyped-def]
        result = harness_cli("--project", str(project), "lock", "--check")
        no_traceback(result)
        return result

    result = check()
    assert (result.code, result.out.strip()) == (0, "every lock is up to date")

    # Settings that shape the lock: the [lock] platforms (set and order) and the Python pin.
    locked = tomllib.loads((project / "locks" / "svc.lock.toml").read_text())["python"]
    settings = project / "harness.toml"
    original_settings = settings.read_text() if settings.is_file() else None
    request = ".".join(locked["version"].split(".")[:2])
    for table, reason in (
        (f'[lock]\nplatforms = ["{locked["platform"]}"]\n', None),
        (
            f'[lock]\nplatforms = ["{locked["platform"]}", "aarch64-manylinux_2_28"]\n',
            f"platforms changed: locked for {locked['platform']}; {settings}: lock.platforms asks for "
            f"{locked['platform']}, aarch64-manylinux_2_28",
        ),
        (f'[lock.python]\n"{request}" = "{locked["version"]}"\n', None),
        (
            f'[lock.python]\n"{request}" = "{request}.99"\n',
            f"python pin changed: locked {locked['version']}; lock.python pins {request} to {request}.99",
        ),
    ):
        settings.write_text(table)
        result = check()
        if reason is None:
            assert result.code == 0, result.out
        else:
            assert (result.code, f"stale  svc: {reason} (locks/svc.lock.toml)") == (1, result.out.strip())
    if original_settings is None:
        settings.unlink()
    else:
        settings.write_text(original_settings)
    assert check().code == 0

    # A changed path weight is stale although the manifest is not.
    asset = project / "assets" / "local" / "meshes" / "link0.stl"
    asset.write_bytes(b"solid moved\n")
    result = check()
    assert result.code == 1
    assert "stale  svc: weights local changed: meshes/link0.stl (locks/svc.lock.toml)" in result.out
    asset.write_bytes(LOCAL_FILES["meshes/link0.stl"])
    assert check().code == 0

    # Reformatting or a comment is not a change of meaning; a new requirement is.
    manifest = project / "services" / "svc.toml"
    original = manifest.read_text()
    manifest.write_text("# a comment\n" + original.replace("port = 9000", "port   =   9000"))
    assert check().code == 0
    manifest.write_text(original.replace('"delta==1.0"', '"delta==1.0", "alpha"'))
    result = check()
    assert result.code == 1 and "stale  svc: manifest changed (locks/svc.lock.toml)" in result.out

    (project / "services" / "other.toml").write_text(service(["alpha"]))
    (project / "locks" / "svc.lock.toml").unlink()
    result = check()
    assert result.code == 1
    assert "stale  other: missing (locks/other.lock.toml)" in result.out
    assert "stale  svc: missing (locks/svc.lock.toml)" in result.out
    # Never-locked manifests are said to be that, with what to do (a fresh clone has six).
    assert "2 manifest(s) were never locked here (other, svc)" in result.err and "harness lock NAME" in result.err
    result = harness_cli("--project", str(project), "lock", "--check", "--json", "other")
    assert result.code == 1 and '"reason": "missing"' in result.out and "svc" not in result.out


# ------------------------------------------------------------------ the kinematics example


def test_kinematics_example_locks_like_the_committed_lock(up: Upstreams, harness_cli, tmp_path: Path) -> None:
    """The shipped kinematics manifest, locked against the local index whose ``numpy`` is a
    stand-in: the lock equals the committed one but for that wheel's bytes."""
    project = make_project(tmp_path / "p", {})
    shutil.copy(REPO / "services" / "kinematics.toml", project / "services")
    shutil.copytree(REPO / "services" / "assets", project / "services" / "assets")
    result = harness_cli("--project", str(project), "lock", "kinematics")
    assert result.code == 0, result.err
    ours = read(project / "locks" / "kinematics.lock.toml")
    committed = read(REPO / "locks" / "kinematics.lock.toml")
    wheel = up.index.file(committed.packages[0].wheels[0].file).read_bytes()
    [package] = committed.packages
    stand_in = package.model_copy(
        update={"wheels": [package.wheels[0].model_copy(update={"size": len(wheel), "sha256": sha(wheel)})]}
    )
    expected = assign_store_paths(committed.model_copy(update={"packages": [stand_in]}))
    assert ours == expected
    result = harness_cli("--project", str(project), "lock", "--check")
    assert result.code == 0


@pytest.mark.network
def test_kinematics_relocks_to_the_committed_bytes_from_the_real_index(tmp_path: Path) -> None:
    """Determinism across machines: the repository's kinematics manifest, locked from uv's
    default index with empty caches in a copy of the project, gives the committed file."""
    project = tmp_path / "p"
    (project / "locks").mkdir(parents=True)
    shutil.copytree(REPO / "services", project / "services")
    shutil.copy(REPO / "harness.toml", project / "harness.toml")
    env = {**ORIGINAL_ENV, "HARNESS_HOME": str(tmp_path / "home")}  # this machine's settings
    result = subprocess.run(
        [sys.executable, "-m", "harness", "lock", "kinematics"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (project / "locks" / "kinematics.lock.toml").read_bytes() == (
        REPO / "locks" / "kinematics.lock.toml"
    ).read_bytes()
    result = subprocess.run(
        [sys.executable, "-m", "harness", "lock", "--check", "kinematics"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------- upgrading


def test_upgrade_package_moves_only_that_package(
    up: Upstreams, harness_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalIndex(tmp_path / "index") as index:
        for name in ("alpha", "beta", "zeta"):
            index.add_wheel(name, "1.0")
        monkeypatch.setenv("HARNESS_INDEX_PYPI", index.url)
        project = make_project(tmp_path / "p", {"svc": service(["alpha", "beta", "zeta"])})
        lock_file = project / "locks" / "svc.lock.toml"

        def versions() -> dict[str, str]:
            return {p["name"]: p["version"] for p in tomllib.loads(lock_file.read_text())["packages"]}

        def lock(*args: str, home: Path = up.home):  # type: ignore[no-untyped-def]
            result = harness_cli("--home", str(home), "--project", str(project), "lock", *args)
            assert result.code == 0, result.err
            return result

        lock()
        assert versions() == {"alpha": "1.0", "beta": "1.0", "zeta": "1.0"}
        first = lock_file.read_bytes()
        for name in ("alpha", "beta", "zeta"):
            index.add_wheel(name, "1.1")
        # Previous pins are kept, even from empty caches that see the new versions.
        assert "unchanged svc" in lock(home=tmp_path / "cold").err
        assert lock_file.read_bytes() == first
        lock("--upgrade-package", "beta")
        assert versions() == {"alpha": "1.0", "beta": "1.1", "zeta": "1.0"}
        lock("--upgrade")
        assert versions() == {"alpha": "1.1", "beta": "1.1", "zeta": "1.1"}


# ---------------------------------------------------------------------------- bad inputs


@pytest.fixture(scope="module")
def good_lock(up: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a good lock, which every bad-input test must leave untouched."""
    from harness.cli import main

    root = make_project(tmp_path_factory.mktemp("good"), {"svc": service(["beta"])})
    with pytest.raises(SystemExit) as exit_:
        main(["--project", str(root), "lock"])
    assert exit_.value.code == 0
    return (root / "locks" / "svc.lock.toml").read_bytes()


BAD = {
    "unsatisfiable": (
        lambda up: service(["beta==1.0", "alpha<1.0"]),
        [r"cannot resolve the requirements for CPython 3\.11\.7", r"(?s)No solution found.*alpha.*beta"],
    ),
    "missing-rev": (
        lambda up: service([], extra=f'[[environment.sources]]\nrepo = "{up.repo_url}"\nrev = "v9"\n'),
        [r"rev 'v9' is not a branch, tag or commit of"],
    ),
    "unknown-hub-repo": (
        lambda up: service([], extra='[[weights]]\ndir = "m"\nhuggingface_model = "org/missing"\n'),
        [r"Hugging Face repo org/missing \(revision main\): repository not found"],
    ),
    "include-nothing": (
        lambda up: service([], extra='[[weights]]\ndir = "m"\nhuggingface_model = "org/model"\ninclude = ["*.onnx"]\n'),
        [r"weights 'm': no file of Hugging Face org/model@[0-9a-f]{40} matches include"],
    ),
    "url-sha256": (
        lambda up: service(
            [], extra=f'[[weights]]\ndir = "u"\nurl = "{up.hub.static("w.bin", b"real")}"\nsha256 = "{"0" * 64}"\n'
        ),
        [rf"weights 'u': .*w\.bin has sha256 {sha(b'real')}, the manifest expects 0{{64}}"],
    ),
    "unknown-index": (
        lambda up: service(["alpha"], extra='indexes = ["lab-cuda"]\n'),
        [r"index 'lab-cuda' has no address on this machine", r"HARNESS_INDEX_LAB_CUDA"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_clear_error_and_keeps_the_old_lock(
    case: str, up: Upstreams, good_lock: bytes, harness_cli, tmp_path: Path
) -> None:
    make_manifest, patterns = BAD[case]
    project = make_project(tmp_path / "p", {"svc": make_manifest(up)}, {"locks/svc.lock.toml": good_lock})
    result = harness_cli("--project", str(project), "lock")
    no_traceback(result)
    assert result.code != 0
    assert "error: services/svc.toml: " in result.err, result.err
    for pattern in patterns:
        assert re.search(pattern, result.err), (pattern, result.err)
    assert (project / "locks" / "svc.lock.toml").read_bytes() == good_lock


def test_no_index_reachable(
    up: Upstreams, good_lock: bytes, harness_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index is down: online, a clear error; --offline with empty caches, a clear error
    saying the cache lacks what is needed. Either way the old lock stays."""
    down = LocalIndex(tmp_path / "down").start()
    address = down.url
    down.stop()
    monkeypatch.setenv("HARNESS_INDEX_PYPI", address)
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")  # a refused connection fails at once, not in 10 s
    project = make_project(tmp_path / "p", {"svc": service(["beta", "alpha<2"])}, {"locks/svc.lock.toml": good_lock})
    for args, pattern in (
        ([], r"(?s)cannot resolve the requirements for CPython 3\.11\.7.*(Failed to fetch|onnect)"),
        (
            ["--offline"],
            r"(?s)cannot resolve for CPython 3\.11\.7 on x86_64-manylinux_2_28 offline: "
            r"uv's cache lacks what it needs.*hint: lock once with network access",
        ),
    ):
        result = harness_cli("--home", str(tmp_path / "cold"), "--project", str(project), "lock", *args)
        no_traceback(result)
        assert result.code != 0
        assert "error: services/svc.toml: " in result.err
        assert re.search(pattern, result.err), result.err
        assert (project / "locks" / "svc.lock.toml").read_bytes() == good_lock


def test_one_bad_manifest_does_not_stop_the_others(up: Upstreams, harness_cli, tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", {"good": service(["alpha==1.0"]), "bad": service(["alpha==9.9"])})
    result = harness_cli("--project", str(project), "lock", "--json")
    no_traceback(result)
    assert result.code == 1
    assert (project / "locks" / "good.lock.toml").is_file()
    assert not (project / "locks" / "bad.lock.toml").exists()
    assert "services/bad.toml" in result.err and "services/good.toml" not in result.err


# ------------------------------------------------------------------------ committed locks


def test_committed_locks_name_no_registry() -> None:
    """DESIGN invariant 4: committed locks hold names and hashes, never an index or hub address.
    Git sources and ``url`` weights keep the repository or URL their manifest gives; nothing
    else may look like an address or a host name."""
    from urllib.parse import urlsplit

    from harness.lock.export import uv_default_index

    with pytest.MonkeyPatch.context() as mp:  # uv's own default, not a mirror configured here
        mp.delenv("UV_DEFAULT_INDEX", raising=False)
        mp.delenv("UV_INDEX_URL", raising=False)
        registry = urlsplit(uv_default_index()).hostname
    assert registry
    host = re.compile(r"(?i)\b(?:[a-z0-9-]+\.)+(?:org|com|net|io|cn|ai|co|dev|cloud|edu)\b")
    locks = sorted((REPO / "locks").rglob("*"))
    assert any(p.name == "kinematics.lock.toml" for p in locks)
    for path in locks:
        if not path.is_file():
            continue
        text = path.read_text()
        assert registry not in text, f"{path.name} names uv's default index"
        data = tomllib.loads(text)
        kept = [s["repo"] for s in data.get("sources", [])]
        kept += [w["repo"] for w in data.get("weights", []) if w.get("provider") == "url"]
        rest = text
        for value in kept:
            rest = rest.replace(f'"{value}"', '""')
        assert "://" not in rest, f"{path.name} holds an address"
        assert not host.search(rest), f"{path.name} names a host: {host.search(rest).group(0)}"


# -------------------------------------------------------------------------------- export


def make_venv(path: Path) -> Path:
    from harness.resolve.uvtool import run_uv

    run_uv(["venv", "--quiet", str(path), "--python", sys.executable])
    return path / "bin" / "python"


def installed(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; print(json.dumps(sorted("
        "(d.metadata['Name'], d.version) for d in m.distributions())))"
    )
    out = subprocess.run([str(python), "-I", "-c", code], check=True, capture_output=True, text=True).stdout
    return dict(tomllib.loads(f"x = {out}")["x"])


LOCKED = {"alpha": "2.0", "beta": "1.0", "delta": "1.0", "epsilon": "1.0", "gamma": "1.0"}


def test_export_requirements_installs_hash_checked(svc: Path, up: Upstreams, harness_cli, tmp_path: Path) -> None:
    from harness.resolve.uvtool import UvError, run_uv

    requirements = tmp_path / "requirements.txt"
    result = harness_cli("--project", str(svc), "export", "svc", "--format", "requirements", "-o", str(requirements))
    assert result.code == 0, result.err
    text = requirements.read_text()
    assert f"--index-url {up.index.url}\n" in text
    assert "delta==1.0 \\\n    --hash=sha256:" in text and text.count("--hash=sha256:") == 6
    # Nothing dropped silently: the git source pinned by commit, the weights, as comments.
    assert f"# toolkit @ git+{up.repo_url}@{up.commit}\n" in text
    assert "# Weights:" in text and "#   hf: huggingface_model org/model at " in text
    assert "git source(s) toolkit as commented lines" in result.err and "weights hf, ms, local" in result.err
    python = make_venv(tmp_path / "venv")
    run_uv(
        ["pip", "install", "--quiet", "--require-hashes", "-r", str(requirements), "--python", str(python)],
        cache_dir=up.home / "cache",
    )
    assert installed(python) == LOCKED

    # A file whose bytes are not the locked ones is refused.
    alpha = sha(up.index.file("alpha-2.0-py3-none-any.whl").read_bytes())
    requirements.write_text(text.replace(alpha, "0" * 64))
    with pytest.raises(UvError, match="(?i)hash"):
        run_uv(
            [
                "pip",
                "install",
                "--quiet",
                "--require-hashes",
                "-r",
                str(requirements),
                "--python",
                str(make_venv(tmp_path / "venv2")),
            ],
            cache_dir=up.home / "cache",
        )


def test_export_pylock_fills_addresses_from_configuration(
    svc: Path, up: Upstreams, harness_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.resolve.uvtool import run_uv

    pylock = tmp_path / "pylock.toml"
    result = harness_cli("--project", str(svc), "export", "svc", "--format", "pylock", "-o", str(pylock))
    assert result.code == 0, result.err
    text = pylock.read_text()
    data = tomllib.loads(text)
    assert (data["lock-version"], data["created-by"], data["requires-python"]) == ("1.0", "harness", "==3.11.*")
    lock = read(svc / "locks" / "svc.lock.toml")
    vcs = [p for p in data["packages"] if "vcs" in p]
    assert vcs == [
        {
            "name": "toolkit",
            "vcs": {"type": "git", "url": up.repo_url, "requested-revision": "v1", "commit-id": up.commit},
        }
    ]
    assert "# Weights:" in text
    indexed = [p for p in data["packages"] if "vcs" not in p]
    assert [(p["name"], p["version"]) for p in indexed] == [(p.name, p.version) for p in lock.packages]
    for entry, package in zip(indexed, lock.packages, strict=True):
        assert entry["index"] == up.index.url
        files = entry.get("wheels", []) + ([entry["sdist"]] if "sdist" in entry else [])
        locked = package.wheels + ([package.sdist] if package.sdist else [])
        assert [(f["name"], f["url"], f["size"], f["hashes"]) for f in files] == [
            (f.file, f"{up.index.base}/files/{f.file}", f.size, {"sha256": f.sha256}) for f in locked
        ]

    python = make_venv(tmp_path / "venv")
    # (the git source's build requirement comes from the index the installer is given)
    run_uv(
        [
            "pip",
            "sync",
            "--quiet",
            "--preview-features",
            "pylock",
            str(pylock),
            "--python",
            str(python),
            "--default-index",
            up.index.url,
        ],
        cache_dir=up.home / "cache",
    )
    assert installed(python) == LOCKED | {"toolkit": "0.1"}

    def export() -> str:
        result = harness_cli("--project", str(svc), "export", "svc", "--format", "pylock")
        no_traceback(result)
        assert result.code == 0, result.err
        return result.out

    # An HTML-only (PEP 503) mirror of the same files: the same document, its addresses.
    with LocalIndex(up.index.root, json_api=False) as mirror:
        monkeypatch.setenv("HARNESS_INDEX_PYPI", mirror.url)
        assert export() == text.replace(up.index.base, mirror.base)
    # pypi left at uv's default: the address is uv's (here a default index set for uv).
    monkeypatch.delenv("HARNESS_INDEX_PYPI")
    monkeypatch.setenv("UV_DEFAULT_INDEX", up.index.url)
    assert export() == text
    # An index that does not hold the locked files: one clear error.
    with LocalIndex(tmp_path / "empty") as empty:
        empty.add_wheel("alpha", "1.0")
        monkeypatch.setenv("HARNESS_INDEX_PYPI", empty.url)
        result = harness_cli("--project", str(svc), "export", "svc", "--format", "pylock")
    no_traceback(result)
    assert result.code == 1
    assert re.search(
        r"error: (alpha 2\.0: index 'pypi' no longer lists alpha-2\.0-py3-none-any\.whl"
        r"|index 'pypi' does not list beta \(\S+: HTTP 404\))",
        result.err,
    ), result.err
