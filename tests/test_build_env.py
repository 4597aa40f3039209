"""The interpreter and environment builders, with real uv and real interpreters.

The interpreter is the CPython running these tests (its exact version is installed here by
definition), copied from the host: uv cannot download one without network. Packages are tiny
wheels and source trees from :mod:`tests.localindex`, laid out as a store would lay them out
(``<hash>-<name>`` siblings, source trees read-only). One interpreter copy per module keeps
the suite fast.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.realize.environment import PATH_SOURCES_PTH, build_environment
from harness.realize.interpreter import InterpreterBuild, build_interpreter
from harness.errors import HarnessError
from harness.lock.document import LockedInterpreter
from harness.resolve.interpreter import host_platform
from harness.store.hashing import content_hash, store_hash, store_path_name
from tests.pythondownloads import download_list, install_only_archive, writable
from tests.localindex import BUILD_EDITABLE, LocalIndex, pyproject_text, sdist_bytes, wheel_bytes, write_source_tree

# Host copies are ELF-only, and the checks read /proc/self/maps.
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="host interpreter copies are Linux-only")

VERSION = platform.python_version()
MINOR = ".".join(VERSION.split(".")[:2])

#: PEP 660 for the tests' in-tree backend (already in it; appended again where a test edits it).
EDITABLE_HOOK = BUILD_EDITABLE

#: Imports everything the environment should provide and reports where it all is.
PROBE = """
import json, sys, ssl, sqlite3, ctypes
import alpha, beta, epsilon, edpkg, regpkg
maps = open('/proc/self/maps').read()
print(json.dumps({
    "prefix": sys.prefix, "base_prefix": sys.base_prefix, "executable": sys.executable,
    "versions": [alpha.__version__, beta.__version__, epsilon.__version__, edpkg.__version__, regpkg.__version__],
    "edpkg": edpkg.__file__, "regpkg": regpkg.__file__, "alpha": alpha.__file__,
    "libpython": sorted({l.split()[-1] for l in maps.splitlines() if 'libpython' in l}),
}))
"""


def _wheel_with_script(name: str, version: str) -> bytes:
    """A wheel with a console script ``<name>-cli`` that prints ``sys.prefix``."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f'import sys\n__version__ = "{version}"\n\ndef main():\n    print(sys.prefix)\n',
        f"{info}/METADATA": f"Metadata-Version: 2.3\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: harness-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[console_scripts]\n{name}-cli = {name}:main\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in files.items():
            archive.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), text)
    return buffer.getvalue()


def _name(kind: str, name: str) -> str:
    return store_path_name(store_hash(kind, name, {"test": True}), name)


def _read_only(root: Path) -> None:
    """What the store does to a registered path."""
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    root.chmod(root.stat().st_mode & ~stat.S_IWUSR)


@dataclass
class Inputs:
    """Realized inputs of one environment, in one store folder."""

    store: Path
    interpreter: Path
    build: InterpreterBuild
    wheels: list[Path]
    build_wheels: list[Path]
    editable: Path
    regular: Path


def _interpreter(store: Path, *, source: str = "host") -> tuple[Path, InterpreterBuild]:
    out = store / _name("interpreter", f"cpython-{VERSION}")
    out.mkdir()
    locked = LockedInterpreter(implementation="cpython", version=VERSION, platform=host_platform(), source=source)
    try:
        build = build_interpreter(locked, out, cache_dir=store.parent / "uv-cache", offline=True)
    except HarnessError as exc:
        if "no installed CPython" in str(exc):
            pytest.skip(f"this machine has no base installation of CPython {VERSION} to copy: {exc}")
        raise
    return out, build


def _inputs(store: Path, interpreter: Path, build: InterpreterBuild) -> Inputs:
    """Wheels, a build requirement and two source trees, named and protected as in a store."""
    wheels = []
    for name, requires in (("alpha", []), ("beta", ["alpha"])):
        filename = f"{name}-1.0-py3-none-any.whl"
        path = store / _name("wheel", filename)
        path.write_bytes(wheel_bytes(name, "1.0", requires=requires))
        wheels.append(path)
    gamma = store / _name("wheel", "gamma-1.0-py3-none-any.whl")
    gamma.write_bytes(_wheel_with_script("gamma", "1.0"))
    wheels.append(gamma)
    # A locked package with only an sdist: built offline during the install.
    sdist = store / _name("sdist", "epsilon-1.0.tar.gz")
    sdist.write_bytes(sdist_bytes("epsilon", "1.0"))
    wheels.append(sdist)
    helper = store / _name("wheel", "buildhelper-1.0-py3-none-any.whl")
    helper.write_bytes(wheel_bytes("buildhelper", "1.0"))

    editable = write_source_tree(store / _name("source", "edpkg"), "edpkg", "0.1")
    with (editable / "backend.py").open("a") as f:
        f.write(EDITABLE_HOOK)
    # The regular tree sits in a subdirectory and needs a build requirement, which only
    # ``build_wheels`` provides: its backend imports it.
    regular_root = store / _name("source", "regpkg")
    regular = write_source_tree(regular_root / "python", "regpkg", "0.2", requires=["beta"])
    (regular / "pyproject.toml").write_text(
        pyproject_text("regpkg", "0.2", ["beta"]).replace("requires = []", 'requires = ["buildhelper"]')
    )
    backend = regular / "backend.py"
    backend.write_text("import buildhelper  # a locked build requirement\n" + backend.read_text())
    for path in (editable, regular_root):
        _read_only(path)
    return Inputs(store, interpreter, build, wheels, [helper], editable, regular_root)


def _build_env(inputs: Inputs, *, cache: Path) -> Path:
    out = inputs.store / _name("environment", "demo-env")
    out.mkdir()
    result = build_environment(
        out,
        interpreter_dir=inputs.interpreter,
        interpreter_exe=inputs.build.executable,
        wheels=inputs.wheels,
        sources=[(inputs.editable, "editable", None), (inputs.regular, "regular", "python")],
        build_wheels=inputs.build_wheels,
        cache_dir=cache,
    )
    assert result.python == "bin/python" and result.site_packages == f"lib/python{MINOR}/site-packages"
    assert result.editable == (f"../../../../{inputs.editable.name}",)
    assert result.embedded_paths == ()
    return out


def _run(env: Path) -> dict:
    proc = subprocess.run(
        [os.fspath(env / "bin" / "python"), "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Inputs, Path]]:
    """A store folder holding an interpreter copy, the inputs and an environment built from them,
    with a local package index configured that must never be asked for anything."""
    store = tmp_path_factory.mktemp("home-a") / "store"
    store.mkdir()
    interpreter, build = _interpreter(store)
    inputs = _inputs(store, interpreter, build)
    index = LocalIndex(tmp_path_factory.mktemp("index"))
    index.add_wheel("alpha", "1.0")
    index.add_wheel("buildhelper", "1.0")
    with index, pytest.MonkeyPatch.context() as mp:
        mp.setenv("UV_DEFAULT_INDEX", index.url)
        mp.setenv("UV_INDEX_URL", index.url)
        env = _build_env(inputs, cache=store.parent / "uv-cache")
        assert index.requests == [], "building the environment asked the index for something"
    _read_only(env)
    _read_only(interpreter)
    yield inputs, env
    for path in (env, interpreter, inputs.editable, inputs.regular):
        writable(path)


# --------------------------------------------------------------------------- interpreter


def test_interpreter_copy_is_minimal_and_host_recorded(built: tuple[Inputs, Path]) -> None:
    inputs, _ = built
    out, build = inputs.interpreter, inputs.build
    assert build.source.startswith("host: ") and build.is_host and build.fallback_reason is None
    assert build.executable == f"bin/python{MINOR}" and (out / build.executable).is_file()
    stdlib = out / "lib" / f"python{MINOR}"
    assert list((stdlib / "site-packages").iterdir()) == []
    assert not (stdlib / "test").exists()
    assert (stdlib / "__pycache__").is_dir()  # compiled, unchecked-hash (flags word = 1)
    pyc = next((stdlib / "__pycache__").glob("os.*.pyc"))
    assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 1


def test_interpreter_runs_from_a_copy_elsewhere(built: tuple[Inputs, Path], tmp_path: Path) -> None:
    inputs, _ = built
    copy = tmp_path / "elsewhere" / "python"
    shutil.copytree(inputs.interpreter, copy, symlinks=True)
    exe = copy / inputs.build.executable
    code = (
        "import json, sys, ssl, sqlite3, ctypes\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(json.dumps([sys.prefix, sorted({l.split()[-1] for l in maps.splitlines() if 'libpython' in l})]))"
    )
    proc = subprocess.run([os.fspath(exe), "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    prefix, libs = json.loads(proc.stdout)
    assert prefix == os.fspath(copy)
    # A shared build must load the copy's own libpython, not the original installation's.
    assert all(lib.startswith(os.fspath(copy) + "/") for lib in libs), libs
    assert inputs.build.shared_libpython == bool(libs)


def test_missing_series_is_a_clear_error(tmp_path: Path) -> None:
    locked = LockedInterpreter(implementation="cpython", version="3.99.1", platform=host_platform(), source="host")
    with pytest.raises(
        HarnessError, match=r"no installed CPython 3\.99 to copy \(the lock's 3\.99\.1.*searched: .*versions/3\.99\.1"
    ):
        build_interpreter(locked, tmp_path, cache_dir=tmp_path.parent / "uv-cache", offline=True)


def test_another_release_of_the_series_stands_in_for_a_missing_one(tmp_path: Path) -> None:
    """No 3.11.99 anywhere: the newest installed 3.11.x is copied, and says which it is."""
    locked = LockedInterpreter(implementation="cpython", version="3.11.99", platform=host_platform(), source="host")
    (tmp_path / "copy").mkdir()
    try:
        build = build_interpreter(locked, tmp_path / "copy", cache_dir=tmp_path / "uv-cache", offline=True)
    except HarnessError as exc:
        if "no installed CPython" not in str(exc):
            raise
        pytest.skip(f"no CPython 3.11 installed here: {exc}")
    assert build.version.startswith("3.11.") and build.version != "3.11.99"
    ran = subprocess.run(
        [os.fspath(tmp_path / "copy" / build.executable), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
    )
    assert ran.stdout.strip() == build.version, ran.stderr


# --------------------------------------------------------------------------- environment


def test_environment_imports_everything(built: tuple[Inputs, Path]) -> None:
    inputs, env = built
    seen = _run(env)
    assert seen["versions"] == ["1.0", "1.0", "1.0", "0.1", "0.2"]
    assert seen["prefix"] == os.fspath(env)
    assert seen["base_prefix"] == os.fspath(inputs.interpreter)
    assert seen["executable"] == os.fspath(env / "bin" / "python")
    # Editable: imported from the source tree's store path; regular: installed into the env.
    assert seen["edpkg"] == os.fspath(inputs.editable / "edpkg" / "__init__.py")
    assert seen["regpkg"].startswith(os.fspath(env) + "/")


def test_environment_layout_names_no_absolute_path(built: tuple[Inputs, Path]) -> None:
    inputs, env = built
    assert os.readlink(env / "bin" / "python") == f"../../{inputs.interpreter.name}/{inputs.build.executable}"
    cfg = (env / "pyvenv.cfg").read_text()
    assert "home" not in cfg and "relocatable = true" in cfg
    site = env / "lib" / f"python{MINOR}" / "site-packages"
    assert (site / "_edpkg.pth").read_text() == f"../../../../{inputs.editable.name}\n"
    # No installer metadata (scratch paths, timestamps); pycs are unchecked-hash.
    assert not list(site.glob("*.dist-info/direct_url.json")) and not list(site.glob("*.dist-info/uv_cache.json"))
    assert (site / "alpha" / "__pycache__").is_dir()
    # Nothing anywhere in the environment or the interpreter names the store's location.
    needle = os.fsencode(inputs.store.parent)
    for root in (env, inputs.interpreter):
        for folder, _, names in os.walk(root):
            for name in names:
                path = Path(folder) / name
                if path.is_symlink():
                    assert not os.path.isabs(os.readlink(path)), path
                else:
                    assert needle not in path.read_bytes(), path


def test_environment_moves_with_the_store(built: tuple[Inputs, Path], tmp_path: Path) -> None:
    """Copy the interpreter, the environment and the editable tree to another home, take the
    original away, and run there: prefixes, libpython and the editable all come from the copy."""
    inputs, env = built
    other = tmp_path / "home-b" / "store"
    other.mkdir(parents=True)
    for path in (inputs.interpreter, env, inputs.editable):
        shutil.copytree(path, other / path.name, symlinks=True)
    away = inputs.store.with_name("store.away")
    inputs.store.rename(away)
    try:
        seen = _run(other / env.name)
    finally:
        away.rename(inputs.store)
    assert seen["prefix"] == os.fspath(other / env.name)
    assert seen["base_prefix"] == os.fspath(other / inputs.interpreter.name)
    assert seen["edpkg"] == os.fspath(other / inputs.editable.name / "edpkg" / "__init__.py")
    assert seen["alpha"].startswith(os.fspath(other / env.name) + "/")
    # uv's relocatable console scripts find the environment they are in.
    proc = subprocess.run([os.fspath(other / env.name / "bin" / "gamma-cli")], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == os.fspath(other / env.name), proc.stderr
    assert all(lib.startswith(os.fspath(other) + "/") for lib in seen["libpython"]), seen["libpython"]


def test_builds_are_reproducible_across_homes(
    built: tuple[Inputs, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second home at another path, built from scratch (interpreter included, this time
    asked for as uv-managed: offline it falls back to the host): same content hashes."""
    monkeypatch.delenv("UV_PYTHON_DOWNLOADS", raising=False)  # uv really tries (conftest forbids it)
    inputs, env = built
    store = tmp_path / "second-home-at-a-longer-path" / "store"
    store.mkdir(parents=True)
    interpreter, build = _interpreter(store, source="uv-managed")
    # Offline here; a host version uv never offered (Debian's 3.11.2, as an unprivileged CI
    # user has it) says so instead.
    reason = (build.fallback_reason or "").lower()
    assert build.is_host and ("offline" in reason or "no download found" in reason), reason
    assert "://" not in build.fallback_reason  # addresses elided
    second = _build_env(_inputs(store, interpreter, build), cache=store.parent / "uv-cache")
    assert content_hash(interpreter) == content_hash(inputs.interpreter)
    assert content_hash(second) == content_hash(env)
    for path in (store / inputs.editable.name, store / inputs.regular.name):
        writable(path)


def _locked_hashes(*paths: Path) -> dict[str, str]:
    """File name (store prefix taken off) -> sha256, as a lock records them."""
    return {path.name.split("-", 1)[1]: hashlib.sha256(path.read_bytes()).hexdigest() for path in paths}


def test_environment_refuses_a_wrong_hash(built: tuple[Inputs, Path], tmp_path: Path) -> None:
    inputs, _ = built
    out = tmp_path / "env"
    out.mkdir()
    with pytest.raises(HarnessError, match=r"(?s)Hash mismatch for `alpha==1\.0`.*0000000000"):
        build_environment(
            out,
            interpreter_dir=inputs.interpreter,
            interpreter_exe=inputs.build.executable,
            wheels=inputs.wheels[:1],
            cache_dir=tmp_path / "uv-cache",
            hashes={"alpha-1.0-py3-none-any.whl": "0" * 64},
        )


def test_environment_refuses_a_wrong_build_requirement_hash(built: tuple[Inputs, Path], tmp_path: Path) -> None:
    inputs, _ = built
    out = tmp_path / "env"
    out.mkdir()
    hashes = {**_locked_hashes(*inputs.wheels), "buildhelper-1.0-py3-none-any.whl": "1" * 64}
    with pytest.raises(HarnessError, match=r"(?s)Hash mismatch for `buildhelper==1\.0`"):
        build_environment(
            out,
            interpreter_dir=inputs.interpreter,
            interpreter_exe=inputs.build.executable,
            wheels=inputs.wheels,
            sources=[(inputs.regular, "regular", "python")],
            build_wheels=inputs.build_wheels,
            cache_dir=tmp_path / "uv-cache",
            hashes=hashes,
        )


def test_environment_refuses_an_unlocked_build_requirement(built: tuple[Inputs, Path], tmp_path: Path) -> None:
    """Without the build requirement among ``build_wheels`` the regular source cannot build:
    nothing is fetched to make up for it."""
    inputs, _ = built
    out = tmp_path / "env"
    out.mkdir()
    with pytest.raises(HarnessError, match="buildhelper"):
        build_environment(
            out,
            interpreter_dir=inputs.interpreter,
            interpreter_exe=inputs.build.executable,
            wheels=inputs.wheels,
            sources=[(inputs.regular, "regular", "python")],
            cache_dir=tmp_path / "uv-cache",
        )


def test_environment_refuses_an_editable_that_cannot_move(built: tuple[Inputs, Path], tmp_path: Path) -> None:
    """A backend whose editable install is an import hook holding the tree's absolute path
    (setuptools' default for flat layouts, scikit-build-core's redirect mode) cannot follow
    the store: refused, naming the file."""
    inputs, _ = built
    tree = write_source_tree(inputs.store / _name("source", "hooked"), "hooked", "0.1")
    hook = EDITABLE_HOOK.replace(
        '"_" + module + ".pth": (os.path.abspath(".") + "\\n").encode(),',
        '"_" + module + ".pth": ("import _" + module + "_finder\\n").encode(),\n'
        '        "_" + module + "_finder.py": ("ROOT = " + repr(os.path.abspath(".")) + "\\n").encode(),',
    )
    assert hook != EDITABLE_HOOK
    with (tree / "backend.py").open("a") as f:
        f.write(hook)
    out = tmp_path / "env"
    out.mkdir()
    try:
        with pytest.raises(HarnessError, match=r"names absolute build paths.*_hooked_finder\.py"):
            build_environment(
                out,
                interpreter_dir=inputs.interpreter,
                interpreter_exe=inputs.build.executable,
                wheels=[],
                sources=[(tree, "editable", None)],
                cache_dir=tmp_path / "uv-cache",
            )
    finally:
        shutil.rmtree(tree)


def test_path_sources_are_put_on_sys_path_without_building(built: tuple[Inputs, Path], tmp_path: Path) -> None:
    """``install = "path"``: a checkout that is not a package (no pyproject.toml, no
    setup.py, as RoboDojo's runs from its checkout with it on PYTHONPATH) goes on the
    environment's sys.path, whole or by subdirectory, through one relative ``.pth`` file that
    no RECORD lists; nothing is built, and the environment still moves with the store."""
    inputs, _ = built
    checkout = inputs.store / _name("source", "runner")
    (checkout / "src" / "eval_client").mkdir(parents=True)
    (checkout / "src" / "__init__.py").write_text("")
    (checkout / "src" / "eval_client" / "__init__.py").write_text("WHERE = __file__\n")
    (checkout / "tools").mkdir()
    (checkout / "tools" / "helper.py").write_text("WHERE = __file__\n")
    env = inputs.store / _name("environment", "path-env")
    env.mkdir()
    try:
        result = build_environment(
            env,
            interpreter_dir=inputs.interpreter,
            interpreter_exe=inputs.build.executable,
            wheels=[],
            sources=[(checkout, "path", None), (checkout, "path", "tools")],
            cache_dir=tmp_path / "uv-cache",
        )
        assert result.editable == (f"../../../../{checkout.name}", f"../../../../{checkout.name}/tools")
        site = env / result.site_packages
        assert (site / PATH_SOURCES_PTH).read_text() == "".join(f"{line}\n" for line in result.editable)
        assert not any(PATH_SOURCES_PTH in r.read_text() for r in site.glob("*.dist-info/RECORD"))
        # Ahead of an editable install's own .pth (setuptools' name for it), as PYTHONPATH
        # puts a checkout ahead of what is installed: its ``helper`` is the one imported.
        other = tmp_path / "other-project"
        other.mkdir()
        (other / "helper.py").write_text("WHERE = 'the editable install'\n")
        (site / "__editable__.other-0.1.pth").write_text(f"{other}\n")
        probe = "import json, src.eval_client as a, helper as b; print(json.dumps([a.WHERE, b.WHERE]))"
        moved = tmp_path / "home-b" / "store"
        moved.mkdir(parents=True)
        for path in (inputs.interpreter, env, checkout):
            shutil.copytree(path, moved / path.name, symlinks=True)
        for where in (inputs.store, moved):
            proc = subprocess.run(
                [os.fspath(where / env.name / "bin" / "python"), "-c", probe],
                capture_output=True,
                text=True,
                timeout=60,
                cwd="/",
                env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
            )
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout) == [
                os.fspath(where / checkout.name / "src" / "eval_client" / "__init__.py"),
                os.fspath(where / checkout.name / "tools" / "helper.py"),
            ]
    finally:
        shutil.rmtree(env)
        shutil.rmtree(checkout)


# --------------------------------------------------------------------------- uv-managed


def _fake_download(built: tuple[Inputs, Path], folder: Path) -> Path:
    """A python-build-standalone-style ``install_only`` archive of the host copy and a
    downloads list naming it (tests/pythondownloads.py), which uv accepts instead of its
    built-in one: uv's real install path, offline."""
    inputs, _ = built
    archive = install_only_archive(inputs.interpreter, inputs.build, folder)
    return download_list(archive, archive.as_uri(), VERSION, folder)


def test_uv_managed_interpreter_is_relocatable_and_reproducible(
    built: tuple[Inputs, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UV_PYTHON_DOWNLOADS", raising=False)  # downloads from the list below
    listing = _fake_download(built, tmp_path)
    locked = LockedInterpreter(implementation="cpython", version=VERSION, platform=host_platform(), source="uv-managed")
    cache = tmp_path / "uv-cache"
    hashes = []
    for n, offline in enumerate((False, True)):  # the second from uv's archive cache, offline
        out = tmp_path / f"home-{n}" / ("store" * (n + 1)) / f"cpython-{VERSION}"
        out.mkdir(parents=True)
        build = build_interpreter(
            locked, out, cache_dir=cache, offline=offline, uv_env={"UV_PYTHON_DOWNLOADS_JSON_URL": os.fspath(listing)}
        )
        assert build.source == "uv-managed" and build.fallback_reason is None
        assert sorted(p.name for p in out.iterdir()) == ["BUILD", "bin", "include", "lib"]  # BUILD: uv's build tag
        for folder, _, names in os.walk(out):
            for name in names:
                path = Path(folder) / name
                assert path.is_symlink() or os.fsencode(tmp_path) not in path.read_bytes(), path
        hashes.append(content_hash(out))
    assert hashes[0] == hashes[1]
    moved = tmp_path / "moved"
    out.rename(moved)
    code = "import sys, sysconfig; print(sys.prefix); print(sysconfig.get_config_var('INCLUDEPY'))"
    proc = subprocess.run([os.fspath(moved / build.executable), "-I", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [os.fspath(moved), os.fspath(moved / "include" / f"python{MINOR}")]
