"""What real model environments need from a lock (issue 13), end to end through the CLI:
per-package indexes with local version labels, several platforms in one lock.

Upstreams are the local counterparts of tests/upstreams.py, plus a second index named
``pytorch-cu128`` serving stand-in wheels ``torch-2.7.1+cu128`` and
``torchvision-0.22.1+cu128`` built here (and a decoy ``numpy`` it must never serve).
"""

from __future__ import annotations

import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.lock.lockfile import read
from harness.realize.standin import realized_lock
from harness.store.store import Store
from tests.conftest import run_harness_process
from tests.localindex import LocalIndex
from tests.upstreams import Upstreams, make_project, service

X86 = "manylinux_2_28_x86_64"
ARM = "manylinux_2_28_aarch64"


def add_torch(index: LocalIndex, torch: str = "2.7.1", vision: str = "0.22.1", label: str = "cu128") -> None:
    """Stand-ins for the CUDA builds: one wheel per Linux architecture, local version label."""
    for arch in (X86, ARM):
        tag = f"cp311-cp311-{arch}"
        index.add_wheel("torch", f"{torch}+{label}", tag=tag, requires=["numpy"])
        index.add_wheel("torchvision", f"{vision}+{label}", tag=tag, requires=[f"torch=={torch}"])


@pytest.fixture(scope="module")
def cuda_index(up: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalIndex]:
    """``pytorch-cu128``: torch and torchvision, and a newer numpy that nothing may take."""
    index = LocalIndex(tmp_path_factory.mktemp("cu128"), json_api=False)  # HTML only, like the real one
    add_torch(index)
    index.add_wheel("numpy", "9.9.9")
    with index, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HARNESS_INDEX_PYTORCH_CU128", index.url)
        yield index


def torch_service(extra: str = "") -> str:
    return service(
        ["torchvision==0.22.1", "numpy"],
        extra=('package-index = { torch = "pytorch-cu128", torchvision = "pytorch-cu128" }\n' + extra),
    )


def lock(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = run_harness_process("--project", str(project), "lock", *args)
    assert "Traceback" not in result.stderr
    if check:
        assert result.returncode == 0, result.stderr
    return result


# ------------------------------------------------------------------------ per-package indexes


@pytest.fixture(scope="module")
def torch_project(up: Upstreams, cuda_index: LocalIndex, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_project(tmp_path_factory.mktemp("torch"), {"vision": torch_service()})
    lock(root)
    return root


def test_package_index_pins_named_packages_and_serves_no_other(torch_project: Path) -> None:
    data = tomllib.loads((torch_project / "locks" / "vision.lock.toml").read_text())
    packages = {p["name"]: p for p in data["packages"]}
    assert {n: (p["version"], p["index"]) for n, p in packages.items()} == {
        "torch": ("2.7.1+cu128", "pytorch-cu128"),
        "torchvision": ("0.22.1+cu128", "pytorch-cu128"),
        # the CUDA index has a newer numpy, but an index named in package-index serves only those
        "numpy": ("2.2.6", "pypi"),
    }
    assert [w["file"] for w in packages["torch"]["wheels"]] == [f"torch-2.7.1+cu128-cp311-cp311-{X86}.whl"]
    assert "127.0.0.1" not in (torch_project / "locks" / "vision.lock.toml").read_text()


def test_package_index_realizes_the_local_version_exactly(torch_project: Path, tmp_path: Path) -> None:
    result = run_harness_process("--project", str(torch_project), "--home", str(tmp_path), "realize")
    assert result.returncode == 0, result.stderr
    # As realized here: where a host interpreter stands in, the environment has its own path.
    lock_ = realized_lock(Store.in_home(tmp_path), read(torch_project / "locks" / "vision.lock.toml"))
    python = Store.in_home(tmp_path).root / lock_.environment.store / "bin" / "python"
    code = "import torch, torchvision, numpy; print(torch.__version__, torchvision.__version__, numpy.__version__)"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["2.7.1+cu128", "0.22.1+cu128", "2.2.6"]


def test_package_missing_from_its_index_is_not_taken_elsewhere(
    up: Upstreams, cuda_index: LocalIndex, tmp_path: Path
) -> None:
    # alpha is on the default index only: pinned to pytorch-cu128 it must fail, not fall back.
    root = make_project(tmp_path, {"pinned": service(["alpha"], extra='package-index = { alpha = "pytorch-cu128" }\n')})
    result = lock(root, check=False)
    assert result.returncode == 1
    assert "services/pinned.toml" in result.stderr and "alpha" in result.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            'indexes = ["pytorch-cu128"]\npackage-index = { torch = "pytorch-cu128" }\n',
            "is in both indexes and package-index",
        ),
        ('package-index = { torch = "pypi" }\n', "the default index serves every package"),
        ('package-index = { torch = "https://example.invalid/simple" }\n', "must be a name"),
        ('package-index = { "not a name" = "cu" }\n', "is not a package name"),
    ],
)
def test_package_index_bad_input(extra: str, message: str, tmp_path: Path) -> None:
    root = make_project(tmp_path, {"bad": service(["alpha"], extra=extra)})
    result = run_harness_process("--project", str(root), "lock")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "services/bad.toml" in result.stderr
    assert "Traceback" not in result.stderr


def test_package_index_unconfigured_names_the_setting(up: Upstreams, tmp_path: Path) -> None:
    root = make_project(tmp_path, {"vision": service(["alpha"], extra='package-index = { torch = "nowhere" }\n')})
    result = run_harness_process("--project", str(root), "lock", env={"HARNESS_INDEX_NOWHERE": ""})
    assert result.returncode != 0
    assert "nowhere" in result.stderr and "HARNESS_INDEX_NOWHERE" in result.stderr


# ------------------------------------------------------------------- several platforms, one lock

TWO = ["x86_64-manylinux_2_28", "aarch64-manylinux_2_28"]


def settings_toml(platforms: list[str]) -> str:
    listed = ", ".join(f'"{p}"' for p in platforms)
    return f'[lock]\nplatforms = [{listed}]\n\n[lock.python]\n"3.11" = "3.11.7"\n'


def two_platform_service() -> str:
    # jetson-stats only on aarch64: a pin that one platform has and the other lacks.
    return service(
        ["torchvision==0.22.1", "numpy", "jetson-stats ; platform_machine == 'aarch64'"],
        extra='package-index = { torch = "pytorch-cu128", torchvision = "pytorch-cu128" }\n',
    )


@pytest.fixture(scope="module")
def arm_ready(up: Upstreams, cuda_index: LocalIndex) -> None:
    """The default index gains what aarch64 needs: numpy's aarch64 wheel and jetson-stats."""
    up.index.add_wheel("numpy", "2.2.6", tag=f"cp311-cp311-{ARM}")
    up.index.add_wheel("jetson-stats", "4.3.2")


@pytest.fixture(scope="module")
def two_platforms(arm_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_project(tmp_path_factory.mktemp("two"), {"robot": two_platform_service()})
    (root / "harness.toml").write_text(settings_toml(TWO))
    lock(root)
    return root


def test_one_lock_holds_every_platform(two_platforms: Path) -> None:
    from harness.lock.platforms import for_platform

    text = (two_platforms / "locks" / "robot.lock.toml").read_text()
    data = tomllib.loads(text)
    assert [t["platform"] for t in data["targets"]] == TWO
    assert len({t["environment"] for t in data["targets"]}) == 2
    assert len({t["python"] for t in data["targets"]}) == 2
    packages = {p["name"]: p for p in data["packages"]}
    assert sorted(w["file"] for w in packages["torch"]["wheels"]) == [
        f"torch-2.7.1+cu128-cp311-cp311-{ARM}.whl",
        f"torch-2.7.1+cu128-cp311-cp311-{X86}.whl",
    ]
    assert "platforms" not in packages["torch"]  # the same pin everywhere: one entry
    assert packages["jetson-stats"]["platforms"] == ["aarch64-manylinux_2_28"]
    whole = read(two_platforms / "locks" / "robot.lock.toml", whole=True)
    arm = for_platform(whole, TWO[1])
    assert arm.environment.store == data["targets"][1]["environment"]
    assert {p.name for p in arm.packages} == {"torch", "torchvision", "numpy", "jetson-stats"}
    assert all(w.file.endswith(f"{ARM}.whl") for p in arm.packages for w in p.wheels if "cp311" in w.file)


def test_each_platform_is_what_locking_it_alone_gives(two_platforms: Path, tmp_path: Path) -> None:
    from harness.lock.lockfile import dumps
    from harness.lock.platforms import for_platform

    whole = read(two_platforms / "locks" / "robot.lock.toml", whole=True)
    for platform in TWO:
        alone = make_project(tmp_path / platform, {"robot": two_platform_service()})
        (alone / "harness.toml").write_text(settings_toml([platform]))
        lock(alone)
        assert dumps(for_platform(whole, platform)) == (alone / "locks" / "robot.lock.toml").read_text()


def test_lock_platform_once_does_not_stick(two_platforms: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(two_platforms, root)
    before = (root / "locks" / "robot.lock.toml").read_text()
    lock(root, "--platform", TWO[1])
    data = tomllib.loads((root / "locks" / "robot.lock.toml").read_text())
    assert "targets" not in data and data["python"]["platform"] == TWO[1]
    lock(root)  # the settings' platforms again, not the last --platform
    assert (root / "locks" / "robot.lock.toml").read_text() == before


def test_realize_picks_this_machines_platform(two_platforms: Path, tmp_path: Path) -> None:
    result = run_harness_process("--project", str(two_platforms), "--home", str(tmp_path), "realize")
    assert result.returncode == 0, result.stderr
    lock_ = realized_lock(Store.in_home(tmp_path), read(two_platforms / "locks" / "robot.lock.toml"))  # x86_64
    assert lock_.python.platform == TWO[0]
    python = Store.in_home(tmp_path).root / lock_.environment.store / "bin" / "python"
    code = "import torch, numpy; print(torch.__file__)"
    subprocess.run([str(python), "-c", code], check=True, capture_output=True)
    assert not (
        Store.in_home(tmp_path).root / lock_.environment.store / "lib" / "python3.11" / "site-packages" / "jetson_stats"
    ).exists()


def test_realize_says_when_the_lock_has_nothing_for_this_machine(arm_ready: None, tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", {"robot": two_platform_service()})
    (root / "harness.toml").write_text(settings_toml([TWO[1]]))
    lock(root)
    result = run_harness_process("--project", str(root), "--home", str(tmp_path / "home"), "realize")
    assert result.returncode == 1, result.stderr
    assert "holds aarch64-manylinux_2_28, and nothing for this machine" in result.stderr
    assert "[lock] platforms" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "home" / "store").exists() or not any((tmp_path / "home" / "store").iterdir())


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('platform = "x86_64-manylinux_2_28"\nplatforms = ["x86_64-manylinux_2_28"]', "not both"),
        ("platforms = []", "non-empty list"),
        ('platforms = ["x86_64-manylinux_2_28", "x86_64-manylinux_2_28"]', "listed twice"),
        ('platforms = ["sparc-solaris"]', "lock.platforms: platform 'sparc-solaris'"),
    ],
)
def test_bad_platforms_setting(table: str, message: str, tmp_path: Path) -> None:
    root = make_project(tmp_path, {"robot": service(["alpha"])})
    (root / "harness.toml").write_text(f"[lock]\n{table}\n")
    result = run_harness_process("--project", str(root), "lock")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "harness.toml" in result.stderr and "Traceback" not in result.stderr


# --------------------------------------------------------------------------- sources


DYNAMIC_EDITABLE = """

def get_requires_for_build_editable(config_settings=None):
    return ["editables>=0.3"]  # asked for dynamically, as hatchling does


_static_build_editable = build_editable


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    import editables  # noqa: F401 - only there if the lock pinned what the backend asked for
    return _static_build_editable(wheel_directory, config_settings, metadata_directory)
"""

NEEDS_TORCH = """

_isolated_build_wheel = build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    import torch  # noqa: F401 - a CUDA extension compiles against the environment's torch
    return _isolated_build_wheel(wheel_directory, config_settings, metadata_directory)
"""


def git_repo(
    path: Path, name: str, requires: list[str], backend_extra: str = "", build_requires: list[str] | None = None
) -> str:
    """A one-commit git repository holding a buildable project; returns its file:// URL."""
    from tests.localindex import write_source_tree
    from tests.upstreams import git

    write_source_tree(path, name, "0.1", requires=requires)
    (path / "backend.py").write_text((path / "backend.py").read_text() + backend_extra)
    if build_requires is not None:
        pyproject = path / "pyproject.toml"
        listed = ", ".join(f'"{r}"' for r in build_requires)
        pyproject.write_text(pyproject.read_text().replace("requires = []", f"requires = [{listed}]"))
    (path / "run.py").write_text("print('ran from the checkout')\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", name)
    return path.as_uri()


@pytest.fixture(scope="module")
def sources_project(up: Upstreams, cuda_index: LocalIndex, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("sources")
    up.index.add_wheel("editables", "0.5")
    hatchy = git_repo(base / "hatchy", "hatchy", ["alpha", "beta ; extra == 'fancy'"], DYNAMIC_EDITABLE)
    cudaext = git_repo(base / "cudaext", "cudaext", [], NEEDS_TORCH, build_requires=["tinybuild>=1.0"])
    manifest = f'''kind = "tester"
summary = "sources"
command = ["{{python}}", "{{source:hatchy}}/run.py"]
port = 9000

[environment]
python = "3.11"
requirements = ["torch==2.7.1"]
package-index = {{ torch = "pytorch-cu128" }}
sources = [
  {{ repo = "{hatchy}", rev = "main", install = "editable", extras = ["fancy"] }},
  {{ repo = "{cudaext}", rev = "main", build-isolation = false }},
]
'''
    root = make_project(base / "project", {"src": manifest})
    lock(root)
    return root


def test_source_extras_and_dynamic_build_requirements_lock(sources_project: Path) -> None:
    data = tomllib.loads((sources_project / "locks" / "src.lock.toml").read_text())
    packages = {p["name"] for p in data["packages"]}
    build = {p["name"] for p in data["build-packages"]}
    assert {"alpha", "beta", "torch"} <= packages  # beta only through the source's extra
    assert "editables" in build  # asked for by get_requires_for_build_editable
    # built without isolation: its build requirements belong to the environment itself
    assert "tinybuild" in packages and "tinybuild" not in build
    sources = {s["name"]: s for s in data["sources"]}
    assert sources["cudaext"]["build-isolation"] is False
    assert "build-isolation" not in sources["hatchy"]


def test_sources_realize_offline_builds_and_the_template_names_the_checkout(
    sources_project: Path, tmp_path: Path
) -> None:
    result = run_harness_process("--project", str(sources_project), "--home", str(tmp_path), "realize")
    assert result.returncode == 0, result.stderr
    lock_ = realized_lock(Store.in_home(tmp_path), read(sources_project / "locks" / "src.lock.toml"))
    store = Store.in_home(tmp_path)
    python = store.root / lock_.environment.store / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", "import hatchy, cudaext, beta; print(hatchy.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    hatchy = next(s for s in lock_.sources if s.name == "hatchy")
    assert out.strip().startswith(str(store.root / hatchy.store))  # editable: imported from the store

    from harness.manifests.loading import load_model
    from harness.manifests.model import ServiceManifest
    from harness.runtime.launch import _expand, source_values

    manifest = load_model(ServiceManifest, sources_project / "services" / "src.toml")
    values = source_values(manifest, {i: store.root / s.store for i, s in enumerate(lock_.sources)})
    assert _expand(manifest.command[1], values, "src") == f"{store.root / hatchy.store}/run.py"  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('command = ["{python}", "{source:nowhere}/run.py"]', "names no [[environment.sources]] entry"),
        ('command = ["{python}", "{source}/run.py"]', "needs a source name"),
    ],
)
def test_source_template_bad_input(extra: str, message: str, tmp_path: Path) -> None:
    text = service(["alpha"]).replace('command = ["{python}", "-c", "pass"]', extra)
    root = make_project(tmp_path, {"bad": text})
    result = run_harness_process("--project", str(root), "lock")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "services/bad.toml" in result.stderr


# ------------------------------------------------------------------------ what a lock changed


def test_lock_says_what_changed(up: Upstreams, tmp_path: Path) -> None:
    import json

    from tests.upstreams import git

    repo_url = git_repo(tmp_path / "tool", "tool", [])
    first = service(["alpha==1.0", "delta"], extra=f'sources = [{{ repo = "{repo_url}", rev = "main" }}]\n')
    root = make_project(tmp_path / "p", {"svc": first})
    result = lock(root)
    assert "+ alpha 1.0" in result.stderr and "+ python 3.11.7" in result.stderr

    (tmp_path / "tool" / "NEWS").write_text("a change\n")
    git(tmp_path / "tool", "add", "-A")
    git(tmp_path / "tool", "commit", "-q", "-m", "news")
    old_commit = read(root / "locks" / "svc.lock.toml").sources[0].commit
    (root / "services" / "svc.toml").write_text(first.replace('"alpha==1.0", "delta"', '"alpha==2.0", "beta"'))
    result = lock(root)
    new_commit = read(root / "locks" / "svc.lock.toml").sources[0].commit
    lines = [line.strip() for line in result.stderr.splitlines()]
    assert "alpha 1.0 → 2.0" in lines and "+ beta 1.0" in lines and "- delta" in lines
    assert f"source {repo_url} {old_commit[:12]} → {new_commit[:12]}" in lines
    assert not any("python" in line for line in lines)  # unchanged things are not listed

    (root / "services" / "svc.toml").write_text(first)
    data = json.loads(lock(root, "--json").stdout)
    changes = data["locks"][0]["changes"]
    assert {"kind": "package", "name": "alpha", "old": "2.0", "new": "1.0"} in changes
    assert {"kind": "package", "name": "beta", "old": "1.0", "new": None} in changes
    assert json.loads(lock(root, "--json").stdout)["locks"][0]["changes"] == []  # unchanged: nothing


# ------------------------------------------------------------------------ realize keeps going


@pytest.mark.parametrize("keep_wheel_files", ["1", "0"])
def test_realize_builds_every_lock_it_can_then_lists_each_failure(tmp_path: Path, keep_wheel_files: str) -> None:
    """Kept wheel files are fetched into the store before anything is built, so with
    ``--fail-fast`` a bad one stops the realize before `one` is; streamed ones (the default)
    fail in their environment's sync, each naming its file either way."""
    with LocalIndex(tmp_path / "index") as index:
        index.add_wheel("good", "1.0")
        index.add_wheel("bad", "1.0")
        index.add_wheel("worse", "1.0")
        env = {"HARNESS_INDEX_PYPI": index.url, "HARNESS_GC_KEEP_WHEEL_FILES": keep_wheel_files}
        root = make_project(
            tmp_path / "p", {"one": service(["good"]), "two": service(["bad"]), "three": service(["worse", "good"])}
        )
        assert run_harness_process("--project", str(root), "lock", env=env).returncode == 0
        index.file("bad-1.0-py3-none-any.whl").write_bytes(b"not the locked bytes")
        index.file("worse-1.0-py3-none-any.whl").unlink()

        fast = run_harness_process(
            "--project", str(root), "--home", str(tmp_path / "fast"), "realize", "--fail-fast", env=env
        )
        assert fast.returncode == 1 and "Traceback" not in fast.stderr
        assert "-1.0-py3-none-any.whl" in fast.stderr and "failed to realize" not in fast.stderr, fast.stderr
        one = read(root / "locks" / "one.lock.toml")
        fast_store = Store.in_home(tmp_path / "fast")
        if keep_wheel_files == "1":
            # No environment of `one` at all (its own, or one built on a host copy standing in).
            assert not any(p.name.endswith("-one-env") for p in fast_store.root.iterdir() if fast_store.root.is_dir())

        result = run_harness_process("--project", str(root), "--home", str(tmp_path / "home"), "realize", env=env)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "2 of 3 failed to realize" in result.stderr
    assert "two: " in result.stderr and "bad-1.0-py3-none-any.whl" in result.stderr
    assert "three: " in result.stderr and "worse-1.0-py3-none-any.whl" in result.stderr
    assert "one: built" in result.stdout
    home_store = Store.in_home(tmp_path / "home")
    assert home_store.is_registered(realized_lock(home_store, one).environment.store)


def test_unrealizable_python_hint_names_installed_patches_and_the_pin(up: Upstreams, tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", {"new": service([]).replace('python = "3.11"', 'python = "3.13"')})
    (root / "harness.toml").write_text('[lock]\nplatform = "x86_64-manylinux_2_28"\n')  # no [lock.python] pin
    lock(root)
    version = read(root / "locks" / "new.lock.toml").python.version
    result = run_harness_process(
        "--project", str(root), "--home", str(tmp_path / "home"), "realize", "--offline", env={"PATH": "/usr/bin:/bin"}
    )  # no pyenv: nothing of 3.13 installed here
    if result.returncode == 0:
        pytest.skip(f"CPython {version} is installed on this machine")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert '[lock.python] "3.13" = ' in result.stderr and "harness lock" in result.stderr
