"""Packages installed from an sdist realize on a clean machine (issue 28): the lock names what
each sdist's build backend needs, and realize builds it offline from that alone.

Locally: an sdist whose build backend is *not* in its tree (``build-system.requires`` names a
backend package on the index) and whose backend asks for one more package at build time
(PEP 517 ``get_requires_for_build_wheel``); both must be in the lock's build packages, and
the lock must realize in an empty home, and to the same store paths and content hashes in a
home with history. Against the real index (``network``): the seed's sdist-only packages
(``docopt``, ``iopath``) and one that compiles a C extension (``markupsafe`` 2.0.1, which
publishes no wheel for CPython 3.11).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.store.store import Store
from tests.conftest import REPO
from tests.localindex import BACKEND, LocalIndex
from tests.upstreams import make_project, service

ORIGINAL_ENV = dict(os.environ)

#: The backend package: the tests' PEP 517 backend, which also asks for ``tinyhelper`` at build
#: time and imports it while building, so a build without it fails.
TINY_BACKEND = (
    BACKEND
    + """

def get_requires_for_build_wheel(config_settings=None):
    asked = os.environ.get("TINYBACKEND_ASKED")  # a file: one line per question, where from
    if asked:
        with open(asked, "a") as f:
            f.write(os.getcwd() + "\\n")
    return ["tinyhelper==1.0"]


_plain_build_wheel = build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    import tinyhelper  # only the lock's build packages can supply it

    return _plain_build_wheel(wheel_directory, config_settings, metadata_directory)
"""
)


def sdist_with_external_backend(name: str, version: str, backend: str = "tinybackend==1.0") -> bytes:
    """A deterministic sdist whose ``[build-system]`` needs ``backend`` (``tinybackend``) from the index."""
    module = re.split(r"[<>=!~ ;\[]", backend)[0]
    pyproject = (
        f'[build-system]\nrequires = ["{backend}"]\nbuild-backend = "{module}"\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = []\n'
    )
    members = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        "pyproject.toml": pyproject,
        f"{name}/__init__.py": f'__version__ = "{version}"\n',
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, text in sorted(members.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{path}")
            info.size, info.mtime, info.mode = len(data), 1_600_000_000, 0o644
            archive.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=1_600_000_000) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalIndex]:
    with LocalIndex(tmp_path / "index") as local:
        local.add_wheel("tinybackend", "1.0", modules={"tinybackend/__init__.py": TINY_BACKEND})
        local.add_wheel("tinyhelper", "1.0")
        local.add_wheel("tinybackend", "2.0")  # a newer backend the sdist does not ask for
        (local.root / "sdonly-1.0.tar.gz").write_bytes(sdist_with_external_backend("sdonly", "1.0"))
        monkeypatch.setenv("HARNESS_INDEX_PYPI", local.url)
        yield local


def harness(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def registered(home: Path) -> dict[str, str]:
    """Store path name → content hash of every registered path in ``home``."""
    return {r.name: r.content for r in Store.in_home(home).records()}


def test_an_sdists_build_backend_and_its_dynamic_requirements_are_locked(index: LocalIndex, tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", {"svc": service(["sdonly==1.0"])})
    result = harness("--project", str(project), "lock", home=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    lock_file = project / "locks" / "svc.lock.toml"
    data = tomllib.loads(lock_file.read_text())
    [package] = [p for p in data["packages"] if p["name"] == "sdonly"]
    assert "sdist" in package and not package.get("wheels")
    builds = {p["name"]: p["version"] for p in data.get("build-packages", [])}
    assert builds == {"tinybackend": "1.0", "tinyhelper": "1.0"}, "static and dynamic build requirements"
    # Re-locked from scratch (another home: no cached backend answer, no download): the same bytes.
    # A file planted in that home's download cache under the sdist's hash is not what runs.
    first = lock_file.read_bytes()
    planted = tmp_path / "other" / "cache" / "downloads" / package["sdist"]["sha256"]
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"not the sdist")
    result = harness("--project", str(project), "lock", "--refresh", home=tmp_path / "other")
    assert result.returncode == 0, result.stderr
    assert lock_file.read_bytes() == first
    assert planted.read_bytes() != b"not the sdist", "replaced by the checked download"


def test_an_answer_cache_entry_that_is_not_this_users_file_is_asked_again_of_the_sdist(
    index: LocalIndex, tmp_path: Path
) -> None:
    """The backend's cached answer (``cache/build-requires/<key>.json``) counts only as a file of
    this user's (answercache.py): one another member of a shared home made, or a link planted
    in its place, is passed by and the backend asked again, of the unpacked sdist. Before, the
    entry's mere presence let the re-lock skip unpacking the sdist, and the backend was asked
    in an empty folder: ``tinyhelper`` was lost from the build set."""
    project = make_project(tmp_path / "p", {"svc": service(["sdonly==1.0"])})
    home = tmp_path / "home"
    assert harness("--project", str(project), "lock", home=home).returncode == 0
    lock_file = project / "locks" / "svc.lock.toml"
    first = lock_file.read_bytes()
    answers = home / "cache" / "build-requires"
    [dynamic] = [p for p in answers.glob("*.json") if not p.name.endswith("-static.json")]
    elsewhere = tmp_path / "someone-elses-answer.json"
    elsewhere.write_text("[]")  # says the backend asks for nothing more
    dynamic.unlink()
    dynamic.symlink_to(elsewhere)
    result = harness("--project", str(project), "lock", "--refresh", home=home)
    assert result.returncode == 0, result.stderr
    assert lock_file.read_bytes() == first
    assert elsewhere.read_text() == "[]", "never written through"
    assert not dynamic.is_symlink() and json.loads(dynamic.read_text()) == ["tinyhelper==1.0"], (
        "the answer, asked again"
    )


def test_an_sdist_realizes_from_the_lock_alone_whatever_the_homes_history(index: LocalIndex, tmp_path: Path) -> None:
    """A fresh home (empty store, empty uv cache) builds the sdist offline from the lock's
    build packages; a home that realized other things first, its uv cache warm, gets the same
    store paths and content hashes."""
    project = make_project(tmp_path / "p", {"svc": service(["sdonly==1.0"]), "other": service(["tinyhelper"])})
    assert harness("--project", str(project), "lock", home=tmp_path / "locker").returncode == 0
    fresh = tmp_path / "fresh"
    result = harness("--project", str(project), "realize", "svc", home=fresh)
    assert result.returncode == 0, result.stderr
    envs = [p for p in Store.in_home(fresh).root.iterdir() if p.name.endswith("-svc-env")]
    assert len(envs) == 1, envs
    checked = subprocess.run(
        [str(envs[0] / "bin" / "python"), "-c", "import sdonly; print(sdonly.__version__)"],
        capture_output=True,
        text=True,
    )
    assert checked.stdout.strip() == "1.0", checked.stderr

    busy = tmp_path / "busy"
    assert harness("--project", str(project), "realize", "other", home=busy).returncode == 0
    result = harness("--project", str(project), "realize", "svc", home=busy)
    assert result.returncode == 0, result.stderr
    ours = {n: c for n, c in registered(busy).items() if n in registered(fresh)}
    assert ours == registered(fresh), "the same lock realizes to the same paths and bits"


@pytest.mark.parametrize("keep_wheel_files", ["0", "1"])
def test_a_wheel_built_from_an_sdist_is_a_store_path_built_once_and_carried_by_a_cache(
    index: LocalIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_wheel_files: str
) -> None:
    """The wheel an sdist builds is a store path of its own (kind ``built-wheel``): a second
    environment installing the same sdist takes it instead of building again, a binary cache
    carries it (signed, as any built path), and a home that pulled it builds no wheel. So
    whether the store keeps the downloaded package files or not (the default): it always keeps
    the wheels it built. Where it keeps the downloads too, the second environment (its other
    wheel included) realizes offline."""
    monkeypatch.setenv("HARNESS_GC_KEEP_WHEEL_FILES", keep_wheel_files)
    # Without the downloads kept, svc2's other wheel (tinyhelper) comes from the index.
    offline = ["--offline"] if keep_wheel_files == "1" else []
    project = make_project(
        tmp_path / "p", {"svc": service(["sdonly==1.0"]), "svc2": service(["sdonly==1.0", "tinyhelper==1.0"])}
    )
    assert harness("--project", str(project), "lock", home=tmp_path / "locker").returncode == 0
    home = tmp_path / "a"
    result = harness("--project", str(project), "realize", "svc", home=home)
    assert result.returncode == 0, result.stderr
    store = Store.in_home(home)
    [wheel] = [r for r in store.records() if r.kind == "built-wheel"]
    assert wheel.name.endswith("-sdonly-1.0-wheel"), wheel.name
    assert [p.name for p in (store.root / wheel.name).iterdir()] == ["sdonly-1.0-py3-none-any.whl"]
    assert "build of sdonly-1.0.tar.gz" in wheel.obtained, wheel.obtained
    # The project's locks keep the wheel they built alive: `store gc` leaves it for svc2.
    collected = harness("--project", str(project), "store", "gc", home=home)
    assert collected.returncode == 0, collected.stderr
    assert store.is_registered(wheel.name), collected.stdout + collected.stderr

    result = harness("--project", str(project), "realize", "svc2", *offline, home=home)
    assert result.returncode == 0, result.stderr
    assert "building" not in result.stderr, result.stderr
    assert [r for r in store.records() if r.kind == "built-wheel"] == [wheel], "built once per store"
    for name in ("svc", "svc2"):
        [venv] = [p for p in store.root.iterdir() if p.name.endswith(f"-{name}-env")]
        probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import sdonly"], capture_output=True, text=True)
        assert probe.returncode == 0, probe.stderr

    keys = tmp_path / "keys"
    assert harness("store", "keygen", "ci-1", "--dir", str(keys), home=home).returncode == 0
    cache = tmp_path / "cache"
    pushed = harness(
        "--project", str(project), "store", "push", str(cache), "svc", "--key", str(keys / "ci-1.secret"), home=home
    )
    assert pushed.returncode == 0, pushed.stderr
    other = tmp_path / "b"
    trusted = (keys / "ci-1.public").read_text().strip()
    pulled = harness("store", "pull", str(cache), "--all", "--trusted-key", trusted, home=other)
    assert pulled.returncode == 0, pulled.stderr
    result = harness("--project", str(project), "realize", "svc2", *offline, home=other)
    assert result.returncode == 0, result.stderr
    assert "building" not in result.stderr, result.stderr
    [theirs] = [r for r in Store.in_home(other).records() if r.kind == "built-wheel"]
    assert theirs.name == wheel.name and theirs.content == wheel.content
    assert theirs.obtained.startswith("cache "), theirs.obtained


def test_sdists_whose_backends_conflict_each_lock_and_build_with_their_own_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sdists, one built by ``tinybackend<2`` and one by ``tinybackend>=2``: each is locked
    with a build set of its own (``build-requires``), where one set for all sdists could not
    be resolved; the lock re-locks byte for byte; realize builds each from its own set."""
    with LocalIndex(tmp_path / "index") as local:
        for version in ("1.0", "2.0"):
            local.add_wheel("tinybackend", version, modules={"tinybackend/__init__.py": TINY_BACKEND})
        local.add_wheel("tinyhelper", "1.0")
        (local.root / "sdold-1.0.tar.gz").write_bytes(sdist_with_external_backend("sdold", "1.0", "tinybackend<2"))
        (local.root / "sdnew-1.0.tar.gz").write_bytes(sdist_with_external_backend("sdnew", "1.0", "tinybackend>=2"))
        monkeypatch.setenv("HARNESS_INDEX_PYPI", local.url)
        project = make_project(tmp_path / "p", {"svc": service(["sdold==1.0", "sdnew==1.0"])})
        result = harness("--project", str(project), "lock", home=tmp_path / "locker")
        assert result.returncode == 0, result.stderr
        lock_file = project / "locks" / "svc.lock.toml"
        data = tomllib.loads(lock_file.read_text())
        sets = {p["name"]: p["build-requires"] for p in data["packages"]}
        assert sets == {
            "sdold": ["tinybackend==1.0", "tinyhelper==1.0"],
            "sdnew": ["tinybackend==2.0", "tinyhelper==1.0"],
        }
        builds = sorted((p["name"], p["version"]) for p in data["build-packages"])
        assert builds == [("tinybackend", "1.0"), ("tinybackend", "2.0"), ("tinyhelper", "1.0")]
        first = lock_file.read_bytes()
        result = harness("--project", str(project), "lock", "--refresh", home=tmp_path / "other")
        assert result.returncode == 0, result.stderr
        assert lock_file.read_bytes() == first, "re-locked byte for byte"

        home = tmp_path / "home"
        result = harness("--project", str(project), "realize", "svc", home=home)
        assert result.returncode == 0, result.stderr
    store = Store.in_home(home)
    built = sorted(r.name.split("-", 1)[1] for r in store.records() if r.kind == "built-wheel")
    assert built == ["sdnew-1.0-wheel", "sdold-1.0-wheel"]
    [venv] = [p for p in store.root.iterdir() if p.name.endswith("-svc-env")]
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import sdold, sdnew"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr


def test_a_lock_of_two_platforms_gives_each_sdist_its_build_set(index: LocalIndex, tmp_path: Path) -> None:
    """Locked for x86_64 and aarch64, the sdist's entry (and its build set) is shared, and
    each platform's projection is byte for byte the lock of that platform alone."""
    from harness.lock.lockfile import dumps, read
    from harness.lock.platforms import for_platform

    platforms = ["x86_64-manylinux_2_28", "aarch64-manylinux_2_28"]
    locks: dict[str, str] = {}
    for label, wanted in (("both", platforms), *((p, [p]) for p in platforms)):
        project = make_project(tmp_path / label, {"svc": service(["sdonly==1.0"])})
        settings = project / "harness.toml"
        settings.write_text(
            settings.read_text().replace(
                'platform = "x86_64-manylinux_2_28"', f"platforms = {wanted!r}".replace("'", '"')
            )
        )
        result = harness("--project", str(project), "lock", home=tmp_path / "home")
        assert result.returncode == 0, result.stderr
        locks[label] = str(project / "locks" / "svc.lock.toml")
    data = tomllib.loads(Path(locks["both"]).read_text())
    [sdonly] = [p for p in data["packages"] if p["name"] == "sdonly"]
    assert sdonly["build-requires"] == ["tinybackend==1.0", "tinyhelper==1.0"] and "platforms" not in sdonly
    both = read(Path(locks["both"]), whole=True)
    for platform in platforms:
        assert dumps(for_platform(both, platform)) == Path(locks[platform]).read_text(), platform

    # Written by a harness from before sdists' build requirements were locked (its aarch64
    # environment path is the one that harness gave it): stale, naming why.
    from harness.lock.storepaths import environment_path_before_sdist_builds

    old = environment_path_before_sdist_builds(for_platform(both, platforms[1]))
    path = Path(locks["both"])
    path.write_text(path.read_text().replace(both.targets[1].environment, old))
    project = path.parent.parent
    check = harness("--project", str(project), "lock", "--check", home=tmp_path / "home")
    assert check.returncode == 1
    assert "written by an older harness: its sdists' build requirements are not locked" in check.stdout, check.stdout


def test_a_lock_of_two_platforms_fetches_and_asks_each_sdist_once(index: LocalIndex, tmp_path: Path) -> None:
    """The platforms resolve side by side, each going on to its sdists as soon as it is done:
    the second waits for the first's answer instead of fetching the sdist and asking its
    backend again."""
    asked = tmp_path / "asked.txt"
    project = make_project(tmp_path / "p", {"svc": service(["sdonly==1.0"])})
    settings = project / "harness.toml"
    settings.write_text(
        settings.read_text().replace(
            'platform = "x86_64-manylinux_2_28"', 'platforms = ["x86_64-manylinux_2_28", "aarch64-manylinux_2_28"]'
        )
    )
    result = harness("--project", str(project), "lock", home=tmp_path / "home", env={"TINYBACKEND_ASKED": str(asked)})
    assert result.returncode == 0, result.stderr
    # uv asks the backend too, building the sdist's metadata in its own folders; harness asks
    # in its throw-away copy of the tree.
    ours = [line for line in asked.read_text().splitlines() if "harness-build-requires-" in line]
    assert len(ours) == 1, asked.read_text()
    lock = tomllib.loads((project / "locks" / "svc.lock.toml").read_text())
    assert [t["platform"] for t in lock["targets"]] == ["x86_64-manylinux_2_28", "aarch64-manylinux_2_28"]
    [sdonly] = [p for p in lock["packages"] if p["name"] == "sdonly"]
    assert sdonly["build-requires"] == ["tinybackend==1.0", "tinyhelper==1.0"]


def test_an_sdist_whose_backend_asks_for_nothing_more_gets_its_static_build_set(
    index: LocalIndex, tmp_path: Path
) -> None:
    """A backend that asks for no dynamic requirements (most do not): the build set resolved
    from the static ones while the backend was asked is the one locked, for each platform,
    and the sdist builds from it."""
    index.add_wheel("plainbackend", "1.0", modules={"plainbackend/__init__.py": BACKEND})
    (index.root / "sdplain-1.0.tar.gz").write_bytes(sdist_with_external_backend("sdplain", "1.0", "plainbackend==1.0"))
    project = make_project(tmp_path / "p", {"svc": service(["sdplain==1.0"])})
    settings = project / "harness.toml"
    settings.write_text(
        settings.read_text().replace(
            'platform = "x86_64-manylinux_2_28"', 'platforms = ["x86_64-manylinux_2_28", "aarch64-manylinux_2_28"]'
        )
    )
    home = tmp_path / "home"
    result = harness("--project", str(project), "lock", home=home)
    assert result.returncode == 0, result.stderr
    lock = tomllib.loads((project / "locks" / "svc.lock.toml").read_text())
    [sdplain] = [p for p in lock["packages"] if p["name"] == "sdplain"]
    assert sdplain["build-requires"] == ["plainbackend==1.0"] and "platforms" not in sdplain
    assert [(p["name"], p["version"]) for p in lock["build-packages"]] == [("plainbackend", "1.0")]
    realized = harness("--project", str(project), "realize", "svc", home=home)
    assert realized.returncode == 0, realized.stderr


def test_an_sdist_build_requirement_the_index_lacks_is_a_lock_error_naming_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalIndex(tmp_path / "index") as local:
        (local.root / "sdonly-1.0.tar.gz").write_bytes(sdist_with_external_backend("sdonly", "1.0"))
        monkeypatch.setenv("HARNESS_INDEX_PYPI", local.url)
        project = make_project(tmp_path / "p", {"svc": service(["sdonly==1.0"])})
        result = harness("--project", str(project), "lock", home=tmp_path / "home")
    assert result.returncode != 0
    assert "sdonly 1.0" in result.stderr and "tinybackend" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (project / "locks" / "svc.lock.toml").exists()


def test_a_lock_without_an_sdists_build_requirements_says_to_re_lock(index: LocalIndex, tmp_path: Path) -> None:
    """A lock written before sdists' build requirements were locked (its build packages
    lack the backend): realize refuses with what the sdist needs, and the store is as it was."""
    from harness.lock.lockfile import read, write
    from harness.lock.storepaths import assign_store_paths
    from harness.store.verify import verify_store

    project = make_project(tmp_path / "p", {"svc": service(["sdonly==1.0"])})
    assert harness("--project", str(project), "lock", home=tmp_path / "locker").returncode == 0
    path = project / "locks" / "svc.lock.toml"
    old = read(path, whole=True)
    write(path, assign_store_paths(old.model_copy(update={"build_packages": []})))
    home = tmp_path / "home"
    result = harness("--project", str(project), "realize", "svc", home=home)
    assert result.returncode == 1, result.stderr
    assert "re-lock: sdonly 1.0 needs tinybackend" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert [r.name for r in Store.in_home(home).records()] == []
    assert verify_store(Store.in_home(home), check_contents=True) == []


#: A backend that needs the environment's own packages while it builds (as a CUDA extension
#: needs the installed torch), and asks for one more at build time.
ENV_BACKEND = (
    BACKEND
    + """

def get_requires_for_build_wheel(config_settings=None):
    return ["envhelper==1.0"]


_plain_build_wheel = build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    import envdep, envhelper  # only the environment has them: no isolated build does

    return _plain_build_wheel(wheel_directory, config_settings, metadata_directory)
"""
)


def test_a_package_built_against_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``no-build-isolation = ["needsenv"]``: its backend's build requirements are locked into
    the environment, and its sdist is built against the environment once the rest is in;
    without it the isolated build fails, naming the package and the build's own error."""
    with LocalIndex(tmp_path / "index") as local:
        local.add_wheel("envdep", "1.0")
        local.add_wheel("envhelper", "1.0")
        local.add_sdist("needsenv", "1.0", backend=ENV_BACKEND)
        monkeypatch.setenv("HARNESS_INDEX_PYPI", local.url)
        manifest = service(["envdep==1.0", "needsenv==1.0"], extra='no-build-isolation = ["needsenv"]\n')
        project = make_project(tmp_path / "p", {"svc": manifest, "isolated": service(["envdep==1.0", "needsenv==1.0"])})
        result = harness("--project", str(project), "lock", home=tmp_path / "locker")
        assert result.returncode == 0, result.stderr
    data = tomllib.loads((project / "locks" / "svc.lock.toml").read_text())
    packages = {p["name"]: p for p in data["packages"]}
    assert packages["needsenv"].get("build-isolation") is False and "sdist" in packages["needsenv"]
    assert "envhelper" in packages, "its backend's dynamic requirement is in the environment"
    assert "envhelper" not in {p["name"] for p in data.get("build-packages", [])}
    with LocalIndex(tmp_path / "index") as local:  # realize fetches from the index again
        monkeypatch.setenv("HARNESS_INDEX_PYPI", local.url)
        home = tmp_path / "home"
        result = harness("--project", str(project), "realize", "svc", home=home)
        assert result.returncode == 0, result.stderr
        [env] = [p for p in (home / "store").iterdir() if p.name.endswith("-svc-env")]
        probe = subprocess.run([str(env / "bin" / "python"), "-c", "import needsenv"], capture_output=True, text=True)
        assert probe.returncode == 0, probe.stderr
        failed = harness("--project", str(project), "realize", "isolated", home=tmp_path / "other")
    assert failed.returncode == 1, failed.stderr
    assert "building needsenv 1.0 from its sdist failed" in failed.stderr and "envdep" in failed.stderr, failed.stderr
    assert re.search(r'File "[^"]*/harness/[^"]*\.py"', failed.stderr) is None, "no traceback of harness's own"


def test_a_lock_written_before_sdists_build_requirements_were_locked_is_stale(
    index: LocalIndex, tmp_path: Path
) -> None:
    """Such a lock (an sdist, and the environment path an older harness gave it) is stale for
    ``lock --check`` and refused by realize, which says to re-lock; a re-lock mends it."""
    from harness.lock.lockfile import read
    from harness.lock.storepaths import environment_path_before_sdist_builds

    project = make_project(tmp_path / "p", {"svc": service(["sdonly==1.0"])})
    assert harness("--project", str(project), "lock", home=tmp_path / "locker").returncode == 0
    path = project / "locks" / "svc.lock.toml"
    text = path.read_text()
    lock = read(path, whole=True)
    path.write_text(text.replace(lock.environment.store, environment_path_before_sdist_builds(lock)))
    check = harness("--project", str(project), "lock", "--check", home=tmp_path / "other")
    assert check.returncode == 1
    assert "written by an older harness: its sdists' build requirements are not locked" in check.stdout, check.stdout
    refused = harness("--project", str(project), "realize", "svc", home=tmp_path / "home")
    assert refused.returncode != 0 and "older harness" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert harness("--project", str(project), "lock", home=tmp_path / "locker").returncode == 0
    assert path.read_text() == text, "a re-lock writes what a fresh lock writes"


def _tar(members: list[tuple[str, str, str]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as archive:
        for name, kind, extra in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = extra.encode()
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, extra
                archive.addfile(info)
            else:
                info.type = tarfile.CHRTYPE
                archive.addfile(info)
    return raw.getvalue()


@pytest.mark.parametrize(
    "members",
    [
        [("../evil", "file", "x")],
        [("pkg-1/link", "link", "/etc/passwd")],
        [("pkg-1/link", "link", "../../outside")],
        [("pkg-1/device", "device", "")],
    ],
    ids=["climbs", "absolute link", "link out", "device"],
)
def test_an_sdist_that_would_write_outside_its_folder_is_refused(tmp_path: Path, members: list) -> None:  # type: ignore[type-arg]
    """Whichever Python runs it (the standard library's data filter from 3.11.4, harness's own
    checks before that, as on Debian's 3.11.2), nothing lands outside the folder."""
    from harness.errors import HarnessError
    from harness.resolve.sdists import unpack_sdist

    archive = tmp_path / "bad-1.tar.gz"
    archive.write_bytes(_tar([("pkg-1/setup.py", "file", ""), *members]))
    with pytest.raises(HarnessError):
        unpack_sdist(archive, tmp_path / "out" / "here")
    assert not (tmp_path / "out" / "evil").exists() and not (tmp_path / "evil").exists()
    good = tmp_path / "good-1.tar.gz"
    good.write_bytes(_tar([("good-1/setup.py", "file", "x"), ("good-1/good/__init__.py", "file", "")]))
    root = unpack_sdist(good, tmp_path / "fine")
    assert root.name == "good-1" and (root / "good" / "__init__.py").is_file()


# --------------------------------------------------------------------- the real index


@pytest.mark.network
def test_the_seeds_sdist_only_packages_lock_and_realize_in_an_empty_home(tmp_path: Path) -> None:
    """sam3's ``iopath``, SmolVLA's ``docopt`` and a C extension built from its sdist
    (``markupsafe`` 2.0.1's speedups), locked from the real index and realized in a home that
    never saw them: every package imports, the extension is compiled."""
    project = tmp_path / "p"
    (project / "services").mkdir(parents=True)
    (project / "harness.toml").write_bytes((REPO / "harness.toml").read_bytes())
    (project / "services" / "seedsdists.toml").write_text(
        service(["docopt==0.6.2", "iopath==0.1.10", "markupsafe==2.0.1"])
    )
    env = {k: v for k, v in ORIGINAL_ENV.items() if not k.startswith("HARNESS_INDEX")}
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--home", str(tmp_path / "locker"), "--project", str(project), "lock"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    data = tomllib.loads((project / "locks" / "seedsdists.lock.toml").read_text())
    sdists = {p["name"] for p in data["packages"] if "sdist" in p}
    assert {"docopt", "iopath", "markupsafe"} <= sdists
    assert "setuptools" in {p["name"] for p in data.get("build-packages", [])}
    home = tmp_path / "empty"
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--home", str(home), "--project", str(project), "realize"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    [venv] = [p for p in (home / "store").iterdir() if p.name.endswith("-seedsdists-env")]
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import docopt, iopath, markupsafe._speedups as s; print(s.__file__.endswith('.so'))",
        ],
        capture_output=True,
        text=True,
    )
    assert probe.stdout.strip() == "True", probe.stderr

    # A second empty home builds the same wheels: the same store paths, and the same content
    # unless the record says which compiled files name the store's location (an extension
    # linked against a host interpreter copy keeps its path as a run path).
    again = tmp_path / "again"
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--home", str(again), "--project", str(project), "realize"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    first, second = registered(home), registered(again)
    assert set(first) == set(second)
    kinds = {r.name: r.kind for r in Store.in_home(again).records()}
    built = {n for n, kind in kinds.items() if kind == "built-wheel"}
    assert {n.split("-", 1)[1] for n in built} == {
        "docopt-0.6.2-wheel",
        "iopath-0.1.10-wheel",
        "markupsafe-2.0.1-wheel",
    }, "each sdist's wheel is a store path of its own"
    # The C extension was compiled with this machine's toolchain, which no lock names: an
    # impurity the record, the realize and every run using it say; the pure wheels are not.
    impure = {n.split("-", 2)[1]: Store.in_home(again).record(n).impure for n in built}  # type: ignore[union-attr]
    assert impure["docopt"] is None and impure["iopath"] is None, impure
    assert "compiled from its sdist with this machine's toolchain" in (impure["markupsafe"] or ""), impure
    assert "compiled from its sdist with this machine's toolchain" in result.stdout + result.stderr
    differing = {n for n in first if first[n] != second[n]}
    assert differing <= {venv.name, *(n for n in built if "markupsafe" in n)}, differing
    for name in differing:  # only what the records say is not reproducible, and why
        record = Store.in_home(again).record(name)
        assert record is not None and "not reproducible in another home" in record.obtained, record
        assert "markupsafe" in record.obtained, record
