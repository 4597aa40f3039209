"""Resolving Python requirements with the real uv against a real local index.

Pure parts (tags, platforms, index names, uv's listings) are tested without processes; the
rest runs ``uv pip compile`` / ``uv venv`` / ``uv pip sync`` against ``tests.localindex``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from harness.config import Settings
from harness.errors import HarnessError, InputError
from harness.resolve.interpreter import (
    choose_version,
    default_platform_from_tags,
    find_interpreter,
    parse_platform,
    parse_python_list,
    platform_tags,
    target_tags,
)
from harness.resolve.pins import DistFile, Interpreter, Package
from harness.resolve.compile import build_interpreter
from harness.resolve.python import (
    build_requirements,
    index_addresses,
    index_flags,
    index_for_url,
    parse_pylock,
    pylock_for_install,
    resolve_packages,
    wheel_fits,
)
from harness.resolve.uvtool import UvError, run_uv, uv_bin, uv_env, uv_version
from tests import localindex
from tests.localindex import LocalIndex, write_source_tree

local_index = localindex.local_index  # the fixture (tests/conftest.py may import it as well)

LINUX = Interpreter("cpython", "3.11.9", "x86_64-manylinux_2_28", "uv-managed")
WINDOWS = Interpreter("cpython", "3.11.9", "x86_64-pc-windows-msvc", "uv-managed")


def resolve(index: LocalIndex, requirements: list[str], tmp_path: Path, **kw) -> list[Package]:
    kw.setdefault("interpreter", LINUX)
    kw.setdefault("indexes", [])
    kw.setdefault("settings", Settings(indexes={"pypi": index.url}))
    kw.setdefault("cache_dir", tmp_path / "uv-cache")
    return resolve_packages(requirements, **kw)


def by_name(packages: list[Package]) -> dict[str, Package]:
    return {p.name: p for p in packages}


def on_disk(index: LocalIndex, filename: str) -> DistFile:
    path = index.file(filename)
    return DistFile(filename, hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_size)


# --- uvtool ---------------------------------------------------------------------------------


def test_uv_version_is_the_pinned_one() -> None:
    assert uv_version() == "0.13.9"


def test_uv_version_kept_in_a_cache_folder_is_asked_of_uv_once_per_binary(tmp_path: Path) -> None:
    """A run records uv's version from the home's cache (no uv process on its way), for the
    very binary that answered: another binary (its path, inode, size or time) asks uv again."""
    uv_version.cache_clear()
    try:
        assert uv_version(tmp_path) == "0.13.9"
        kept = json.loads((tmp_path / "uv-version.json").read_text())
        assert kept["version"] == "0.13.9" and kept["binary"][0] == uv_bin()
        # What the file says is the answer while its binary is the same: shown by a version uv never gave.
        (tmp_path / "uv-version.json").write_text(json.dumps({**kept, "version": "9.9.9"}))
        uv_version.cache_clear()
        assert uv_version(tmp_path) == "9.9.9"
        # Another binary (here: another modification time) is asked again, and kept.
        (tmp_path / "uv-version.json").write_text(json.dumps({"binary": [*kept["binary"][:3], 1], "version": "9.9.9"}))
        uv_version.cache_clear()
        assert uv_version(tmp_path) == "0.13.9"
        assert json.loads((tmp_path / "uv-version.json").read_text()) == kept
        # A cache folder that cannot be written costs only time.
        blocked = tmp_path / "file"
        blocked.write_text("")
        uv_version.cache_clear()
        assert uv_version(blocked / "cache") == "0.13.9"
    finally:
        uv_version.cache_clear()


def test_uv_env_strips_what_changes_results() -> None:
    env = uv_env(
        base={
            "UV_INDEX_STRATEGY": "x",
            "UV_EXCLUDE_NEWER": "x",
            "UV_DEFAULT_INDEX": "m",
            "VIRTUAL_ENV": "/v",
            "PIP_FIND_LINKS": "/w",
            "PATH": "/bin",
            "HOME": "/h",
        }
    )
    assert env["UV_DEFAULT_INDEX"] == "m" and env["PATH"] == "/bin"
    assert env["UV_PYTHON_DOWNLOADS"] == "never"
    for gone in ("UV_INDEX_STRATEGY", "UV_EXCLUDE_NEWER", "VIRTUAL_ENV", "PIP_FIND_LINKS"):
        assert gone not in env


def test_run_uv_failure_carries_stderr(tmp_path: Path) -> None:
    with pytest.raises(UvError) as info:
        run_uv(["pip", "compile", str(tmp_path / "missing.in")], cache_dir=tmp_path / "c")
    assert info.value.returncode == 2
    assert "missing.in" in info.value.stderr and "missing.in" in str(info.value)


def test_run_stoppable_ends_the_command_when_asked_to_stop() -> None:
    """uvtool.run_stoppable: the output and status of a real process; one still running when
    ``stop`` raises is killed and the exception raised within a poll or two, not at its end;
    a stop already asked for starts nothing."""
    import time

    from harness.progress import Stopped
    from harness.resolve.uvtool import STOP_POLL, run_stoppable

    done = run_stoppable([sys.executable, "-c", "print('out'); raise SystemExit(4)"], lambda: None)
    assert (done.returncode, done.stdout) == (4, "out\n")
    asked = time.monotonic() + 0.5

    def stop() -> None:
        if time.monotonic() > asked:
            raise Stopped("interrupted")

    marker = f"harness-stoppable-{os.getpid()}"
    started = time.monotonic()
    with pytest.raises(Stopped):
        run_stoppable([sys.executable, "-c", f"import time; time.sleep(30)  # {marker}"], stop)
    assert time.monotonic() - started < 0.5 + 10 * STOP_POLL
    gone = subprocess.run(["pgrep", "-f", marker], capture_output=True)
    assert gone.returncode == 1, "the command was killed"
    with pytest.raises(Stopped):
        run_stoppable(["false"], stop)


def test_wait_for_exit_returns_the_status_or_times_out() -> None:
    """uvtool.wait_for_exit: the exit status of a real process, TimeoutExpired while it runs
    (it is left running), a process already reaped, and a pidfd numbered above 1023 (where
    select() would refuse it)."""
    import resource

    from harness.resolve.uvtool import wait_for_exit

    quick = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert wait_for_exit(quick, 60) == 3
    assert wait_for_exit(quick, 60) == 3  # reaped already: Popen's own answer
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            wait_for_exit(slow, 0.2)
        assert slow.poll() is None
    finally:
        slow.kill()
        slow.wait()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files ({hard}) keeps descriptors below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        high = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(5)"])
        assert wait_for_exit(high, 60) == 5
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --- interpreter: pure parts -----------------------------------------------------------------


def _row(
    version: str,
    *,
    path: str | None = None,
    url: bool = True,
    os_: str = "linux",
    arch: str = "x86_64",
    libc: str = "gnu",
    variant: str = "default",
    impl: str = "cpython",
) -> dict:
    return {
        "key": f"{impl}-{version}",
        "version": version,
        "path": path,
        "url": "u" if url and not path else None,
        "os": os_,
        "arch": arch,
        "libc": libc,
        "variant": variant,
        "implementation": impl,
    }


LISTING = parse_python_list(
    json.dumps(
        [
            _row("3.14.0rc1"),
            _row("3.12.9", variant="freethreaded"),
            _row("3.12.8"),
            _row("3.11.10"),
            _row("3.11.9"),
            _row("3.11.7", path="/usr/bin/python3.11"),
            _row("3.11.7"),
            _row("3.11.2", path="/usr/bin/python3"),
            _row("3.10.99", path="/opt/py310", url=False),
            _row("3.11.11", os_="macos", arch="aarch64", libc="none"),
            _row("3.11.12", impl="pypy"),
        ]
    )
)


def test_choose_version_prefers_newest_uv_download() -> None:
    assert choose_version("3.11", LISTING, platform="x86_64-manylinux_2_28") == ("3.11.10", "uv-managed")
    assert choose_version("3.12", LISTING, platform="linux") == ("3.12.8", "uv-managed")
    assert choose_version("3.11", LISTING, platform="aarch64-apple-darwin") == ("3.11.11", "uv-managed")


def test_choose_version_exact_pin_and_host_fallback() -> None:
    assert choose_version("3.11.7", LISTING, platform="linux") == ("3.11.7", "uv-managed")
    assert choose_version("3.11", LISTING, platform="linux", pin="3.11.9") == ("3.11.9", "uv-managed")
    assert choose_version("3.11", LISTING, platform="linux", pin="3.11.2") == ("3.11.2", "host")
    assert choose_version("3.10", LISTING, platform="linux") == ("3.10.99", "host")
    with pytest.raises(InputError, match="not a CPython release in"):
        choose_version("3.11", LISTING, platform="linux", pin="3.12.8")
    with pytest.raises(InputError, match="no CPython 3.13"):
        choose_version("3.13", LISTING, platform="linux")
    with pytest.raises(InputError, match="no download"):  # installed here, not for macOS
        choose_version("3.10", LISTING, platform="x86_64-apple-darwin")


def test_default_platform_from_host_tags() -> None:
    glibc236 = ["linux_x86_64", *(f"manylinux_2_{m}_x86_64" for m in range(36, 4, -1))]
    assert default_platform_from_tags(glibc236) == "x86_64-manylinux_2_36"
    assert default_platform_from_tags(["manylinux_2_30_aarch64", "linux_aarch64"]) == "aarch64-manylinux_2_28"
    assert default_platform_from_tags(["linux_x86_64", "musllinux_1_2_x86_64"]) == "x86_64-unknown-linux-musl"
    assert default_platform_from_tags(["macosx_14_0_arm64", "macosx_14_0_universal2"]) == "aarch64-apple-darwin"
    assert default_platform_from_tags(["win_amd64"]) == "x86_64-pc-windows-msvc"
    with pytest.raises(InputError):
        default_platform_from_tags(["linux_riscv64"])


def test_platform_vocabulary() -> None:
    assert parse_platform("linux").platform == "x86_64-unknown-linux-gnu"
    assert parse_platform("x86_64-unknown-linux-gnu").glibc_minor == 17
    assert platform_tags("x86_64-manylinux_2_28")[:2] == ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64"]
    assert platform_tags("x86_64-manylinux_2_28")[-1] == "linux_x86_64"
    assert "manylinux2014_aarch64" in platform_tags("aarch64-unknown-linux-gnu")
    with pytest.raises(InputError):
        parse_platform("wasm32-pyodide2024")
    with pytest.raises(InputError):
        parse_platform("x86_64-manylinux_2_29")


@pytest.mark.parametrize(
    ("wheel", "platform", "fits"),
    [
        ("a-1-py3-none-any.whl", "x86_64-pc-windows-msvc", True),
        ("a-1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "x86_64-manylinux_2_28", True),
        ("a-1-cp311-cp311-manylinux_2_31_x86_64.whl", "x86_64-manylinux_2_28", False),
        ("a-1-cp311-cp311-manylinux_2_31_x86_64.whl", "x86_64-manylinux_2_36", True),
        ("a-1-cp311-cp311-linux_x86_64.whl", "x86_64-manylinux_2_28", True),
        ("a-1-cp311-cp311-musllinux_1_2_x86_64.whl", "x86_64-manylinux_2_28", False),
        ("a-1-cp311-cp311-musllinux_1_1_x86_64.whl", "x86_64-unknown-linux-musl", True),
        ("a-1-cp311-cp311-win_amd64.whl", "x86_64-manylinux_2_28", False),
        ("a-1-cp312-cp312-manylinux_2_17_x86_64.whl", "x86_64-manylinux_2_28", False),
        ("a-1-cp38-abi3-manylinux_2_17_x86_64.whl", "x86_64-manylinux_2_28", True),
        ("a-1-cp311-cp311-manylinux_2_17_aarch64.whl", "x86_64-manylinux_2_28", False),
        ("a-1-cp311-cp311-macosx_11_0_arm64.whl", "aarch64-apple-darwin", True),
        ("a-1-cp311-cp311-macosx_14_0_arm64.whl", "aarch64-apple-darwin", False),
        ("not-a-wheel.tar.gz", "x86_64-manylinux_2_28", False),
    ],
)
def test_wheel_fits_target(wheel: str, platform: str, fits: bool) -> None:
    assert wheel_fits(wheel, target_tags("3.11.9", platform)) is fits


def test_find_interpreter_for_a_series(tmp_path: Path) -> None:
    interpreter, path = find_interpreter("3.11", cache_dir=tmp_path / "uv-cache")
    version = Version(interpreter.version)
    assert version.release[:2] == (3, 11) and len(version.release) == 3
    assert interpreter.implementation == "cpython" and interpreter.source == "uv-managed"
    parse_platform(interpreter.platform)  # a platform uv and harness both understand
    if path is not None:
        out = subprocess.run(
            [path, "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert out == interpreter.version


def _choice(request: str, listings: list, platform: str, pin: str | None) -> tuple[str, str] | str:
    """choose_version's answer, or its error's words and hint."""
    try:
        return choose_version(request, listings, platform=platform, pin=pin)
    except InputError as exc:
        return f"{exc.message} ({exc.hint})"


def test_one_platforms_downloads_choose_as_the_whole_list(tmp_path: Path) -> None:
    """A lock asks uv for one platform's downloads (≈ 160 rows, not ≈ 2,600): for every
    platform and request, the choice is the one the list of every platform gives, and the
    answer is kept per uv binary and platform and read back without running uv."""
    from harness.resolve.interpreter import list_downloads, list_pythons, python_list_key
    from harness.resolve.uvtool import downloads_list_file

    cache = tmp_path / "uv-cache"
    everything = [row for row in list_pythons(cache) if row.downloadable]
    # A list of every platform kept by an older harness is dropped once one platform's is kept.
    old_list = downloads_list_file(cache, "linux-x86_64-gnu").parent / ("0" * 32 + ".json")
    old_list.parent.mkdir(parents=True)
    old_list.write_text("[]")
    platforms = [
        "x86_64-manylinux_2_28",
        "aarch64-manylinux_2_17",
        "x86_64-unknown-linux-musl",
        "aarch64-apple-darwin",
        "x86_64-pc-windows-msvc",
    ]
    for platform in platforms:
        target = parse_platform(platform)
        one = list_downloads(cache, target)
        kept = downloads_list_file(cache, python_list_key(target))
        assert kept.is_file() and len(one) < len(everything) / 5
        assert not old_list.exists()
        assert {(r.os, r.arch, r.libc) for r in one} == {
            (target.os, "x86_64" if target.arch == "x86_64" else target.arch, target.libc)
        }
        for request, pin in (("3.11", None), ("3.12", None), ("3.11", "3.11.7"), ("3.10.4", None), ("3.9.1", None)):
            assert _choice(request, one, platform, pin) == _choice(request, everything, platform, pin)
        # Read back from the kept file: a corrupt file is listed again, a good one is used as is.
        kept.write_text("[]")
        assert list_downloads(cache, target) == []
        kept.write_text("not json")
        assert list_downloads(cache, target) == one
        assert json.loads(kept.read_text()) and list_downloads(cache, target) == one


# --- index names: pure parts -----------------------------------------------------------------


def test_index_for_url_and_flags() -> None:
    addresses = {"lab": "http://10.0.0.1:8080/lab/simple", "torch": "http://10.0.0.1:8080/whl/cu121", "pypi": None}
    assert index_for_url("http://10.0.0.1:8080/whl/cu121/torch-2.0-cp311-none-any.whl", addresses) == "torch"
    assert index_for_url("http://10.0.0.1:8080/lab/files/x.whl", addresses) == "lab"
    assert index_for_url("https://files.example.invalid/p/x.whl", addresses) == "pypi"
    assert index_for_url("http://10.0.0.1:9999/whl/cu121/x.whl", addresses) == "pypi"  # other port
    assert index_flags(addresses) == [
        "--index",
        "lab=http://10.0.0.1:8080/lab/simple",
        "--index",
        "torch=http://10.0.0.1:8080/whl/cu121",
        "--index-strategy",
        "first-index",
    ]
    settings = Settings(indexes={"pypi": "http://mirror.invalid/simple", "lab": "http://lab.invalid/simple"})
    assert index_addresses(["lab"], settings) == {
        "lab": "http://lab.invalid/simple",
        "pypi": "http://mirror.invalid/simple",
    }
    assert index_flags(index_addresses([], settings))[:2] == ["--default-index", "http://mirror.invalid/simple"]
    with pytest.raises(InputError, match="no address"):
        index_addresses(["nowhere"], settings)


def test_parse_pylock_skips_nothing_and_marks_local() -> None:
    entries = parse_pylock(
        'lock-version = "1.0"\n[[packages]]\nname = "Foo_Bar"\nversion = "1"\nmarker = "os_name == \'nt\'"\n'
        'wheels = [{ url = "http://h/f/foo_bar-1-py3-none-any.whl", size = 3, hashes = { sha256 = "AB" } }]\n'
        '[[packages]]\nname = "src"\ndirectory = { path = "src" }\n'
    )
    assert entries[0].name == "foo-bar" and entries[0].marker == "os_name == 'nt'"
    assert entries[0].wheels[0].name == "foo_bar-1-py3-none-any.whl" and entries[0].wheels[0].sha256 == "ab"
    assert entries[1].local


# --- resolving against the local index --------------------------------------------------------


def test_resolve_pins_exact_files(local_index: LocalIndex, tmp_path: Path) -> None:
    packages = resolve(local_index, ["gamma", "delta"], tmp_path)
    assert [(p.name, p.version) for p in packages] == [
        ("alpha", "2.0"),
        ("beta", "1.0"),
        ("delta", "1.0"),
        ("epsilon", "1.0"),
        ("gamma", "1.0"),
    ]
    pins = by_name(packages)
    assert pins["alpha"].wheels == (on_disk(local_index, "alpha-2.0-py3-none-any.whl"),)
    assert pins["gamma"].wheels == (on_disk(local_index, "gamma-1.0-py3-none-any.whl"),)
    # platform filtering: the manylinux and pure wheels fit, the Windows one does not
    assert pins["delta"].wheels == (
        on_disk(local_index, "delta-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
        on_disk(local_index, "delta-1.0-py3-none-any.whl"),
    )
    # sdist fallback: only where no wheel exists
    assert pins["epsilon"].wheels == () and pins["epsilon"].sdist == on_disk(local_index, "epsilon-1.0.tar.gz")
    assert all(p.sdist is None for p in packages if p.name != "epsilon")
    assert {p.index for p in packages} == {"pypi"} and all(p.marker == "" for p in packages)
    assert "://" not in repr(packages) and "127.0.0.1" not in repr(packages)


def test_uv_builds_with_harnesss_own_interpreter_of_the_same_minor_version() -> None:
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert build_interpreter(f"{here}.0") == sys.executable
    assert build_interpreter(here) == sys.executable
    assert build_interpreter(f"{sys.version_info[0]}.{sys.version_info[1] + 1}.0") is None
    assert build_interpreter("2.7.18") is None


def test_a_resolution_needs_no_python_on_path_when_harness_runs_the_same_minor_version(
    local_index: LocalIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uv is handed harness's own interpreter, so it neither searches ``PATH`` (pyenv's shims:
    tenths of a second per lock) nor fails where ``PATH`` holds no matching Python, as it did
    ("No interpreter found for Python 3.11.9 in ... search path"). The sdist-only epsilon is
    resolved too: its metadata comes through that interpreter."""
    empty = tmp_path / "no-python-here"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    version = f"{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
    here = Interpreter("cpython", version, "x86_64-manylinux_2_28", "uv-managed")
    pins = by_name(resolve(local_index, ["gamma", "epsilon"], tmp_path, interpreter=here))
    assert pins["epsilon"].sdist == on_disk(local_index, "epsilon-1.0.tar.gz")
    assert pins["gamma"].version == "1.0"


def test_resolve_for_another_platform(local_index: LocalIndex, tmp_path: Path) -> None:
    pins = by_name(resolve(local_index, ["delta", "winonly"], tmp_path, interpreter=WINDOWS))
    assert [w.file for w in pins["delta"].wheels] == [
        "delta-1.0-cp311-cp311-win_amd64.whl",
        "delta-1.0-py3-none-any.whl",
    ]
    assert pins["winonly"].wheels == (on_disk(local_index, "winonly-1.0-cp311-cp311-win_amd64.whl"),)
    with pytest.raises(HarnessError, match="winonly"):
        resolve(local_index, ["winonly"], tmp_path)  # nothing for Linux


def test_extra_named_index_and_first_index_strategy(local_index: LocalIndex, tmp_path: Path) -> None:
    with LocalIndex(tmp_path / "lab") as lab:
        lab.add_wheel("private", "0.3", requires=["alpha", "beta"])
        lab.add_wheel("alpha", "1.0")  # the lab mirrors an older alpha: first-index takes it
        settings = Settings(indexes={"pypi": local_index.url, "lab": lab.url})
        pins = by_name(resolve(local_index, ["private"], tmp_path, indexes=["lab"], settings=settings))
    assert {n: (p.version, p.index) for n, p in pins.items()} == {
        "private": ("0.3", "lab"),
        "alpha": ("1.0", "lab"),
        "beta": ("1.0", "pypi"),
    }
    assert pins["private"].wheels == (on_disk(lab, "private-0.3-py3-none-any.whl"),)
    assert "://" not in repr(pins)


def test_html_only_index_still_gives_sizes(tmp_path: Path) -> None:
    with LocalIndex(tmp_path / "html", json_api=False) as index:
        index.add_wheel("alpha", "1.0")
        index.add_sdist("epsilon", "1.0")
        pins = by_name(resolve(index, ["alpha", "epsilon"], tmp_path))
    assert pins["alpha"].wheels == (on_disk(index, "alpha-1.0-py3-none-any.whl"),)
    assert pins["epsilon"].sdist == on_disk(index, "epsilon-1.0.tar.gz")


def test_an_sdist_resolved_in_this_process_is_fetched_without_a_page_lookup(
    local_index: LocalIndex, tmp_path: Path
) -> None:
    """A lock keeps no URL, but the sdists it fetches right after resolving (to ask their
    backends) are fetched from where uv found them: no second look at the index's page."""
    from harness.resolve.sdists import fetch_sdist

    settings = Settings(indexes={"pypi": local_index.url})
    epsilon = by_name(resolve(local_index, ["epsilon"], tmp_path, settings=settings))["epsilon"]
    assert epsilon.sdist is not None
    local_index.requests.clear()
    fetched = fetch_sdist(epsilon, epsilon.sdist, settings=settings, cache_dir=tmp_path / "home-cache", offline=False)
    assert local_index.requests == ["/files/epsilon-1.0.tar.gz"]
    assert fetched.read_bytes() == local_index.file("epsilon-1.0.tar.gz").read_bytes()


def test_resolution_is_deterministic(local_index: LocalIndex, tmp_path: Path) -> None:
    first = resolve(local_index, ["gamma", "delta"], tmp_path, cache_dir=tmp_path / "c1")
    second = resolve(local_index, ["delta", "gamma"], tmp_path, cache_dir=tmp_path / "c2")
    assert first == second


def test_previous_pins_hold_until_upgraded(local_index: LocalIndex, tmp_path: Path) -> None:
    old = resolve(local_index, ["alpha<2"], tmp_path)
    assert [(p.name, p.version) for p in old] == [("alpha", "1.0")]
    kept = resolve(local_index, ["beta"], tmp_path, previous=old)
    assert by_name(kept)["alpha"].version == "1.0"
    assert (
        by_name(resolve(local_index, ["beta"], tmp_path, previous=old, upgrade_packages=["alpha"]))["alpha"].version
        == "2.0"
    )
    assert by_name(resolve(local_index, ["beta"], tmp_path, previous=old, upgrade=True))["alpha"].version == "2.0"


def test_unsatisfiable_requirements_explain_why(local_index: LocalIndex, tmp_path: Path) -> None:
    with pytest.raises(HarnessError) as info:
        resolve(local_index, ["alpha>=3"], tmp_path)
    message = str(info.value)
    assert "No solution found" in message and "alpha" in message and "3.11.9" in message


def test_offline_uses_the_cache_or_says_what_is_missing(local_index: LocalIndex, tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="offline") as info:
        resolve(local_index, ["beta"], tmp_path, cache_dir=tmp_path / "cold", offline=True)
    assert "lock once with network" in str(info.value)
    online = resolve(local_index, ["beta"], tmp_path, cache_dir=tmp_path / "warm")
    local_index.requests.clear()
    assert resolve(local_index, ["beta"], tmp_path, cache_dir=tmp_path / "warm", offline=True) == online
    assert local_index.requests == []


def test_local_source_dependencies_resolve_but_source_is_not_a_package(local_index: LocalIndex, tmp_path: Path) -> None:
    source = write_source_tree(tmp_path / "checkout", "mysource", "0.1", ["beta"])
    packages = resolve(local_index, ["delta"], tmp_path, extra_paths=[source])
    assert [p.name for p in packages] == ["alpha", "beta", "delta"]
    assert build_requirements(source) == []


def test_build_requirements(tmp_path: Path) -> None:
    assert build_requirements(tmp_path) == ["setuptools>=40.8.0"]
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling>=1.20", "hatch-vcs"]\nbuild-backend = "hatchling.build"\n'
    )
    assert build_requirements(tmp_path, "pkg") == ["hatchling>=1.20", "hatch-vcs"]
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert build_requirements(tmp_path) == ["setuptools>=40.8.0"]
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["not a requirement!"]\n')
    with pytest.raises(InputError, match="build-system.requires"):
        build_requirements(tmp_path)
    # A source's pyproject.toml is bounded like every document harness reads (issue 29).
    (tmp_path / "pyproject.toml").write_text(f"[build-system]\nrequires = []\nn = {'9' * 5000}\n")
    with pytest.raises(InputError, match=r"pyproject.toml:3: n: an integer of 5,000 digits"):
        build_requirements(tmp_path)


def test_pylock_for_install_installs_realized_files(local_index: LocalIndex, tmp_path: Path) -> None:
    here = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    target = Interpreter("cpython", here, parse_platform("linux").platform, "host")
    packages = resolve(local_index, ["gamma", "delta"], tmp_path, interpreter=target)
    store = tmp_path / "store"
    store.mkdir()
    realized: dict[str, Path] = {}
    for package in packages:
        for dist in [*package.wheels, *([package.sdist] if package.sdist else [])]:
            path = store / dist.file
            shutil.copyfile(local_index.file(dist.file), path)
            path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # store files are read-only
            realized[dist.file] = path
    lock_dir = tmp_path / "install"
    lock_dir.mkdir()
    (lock_dir / "pylock.toml").write_text(pylock_for_install(packages, realized))
    assert "://" not in (lock_dir / "pylock.toml").read_text()
    cache = tmp_path / "uv-cache"
    venv = tmp_path / "venv"
    run_uv(["venv", str(venv), "--python", sys.executable], cache_dir=cache)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    local_index.stop()  # prove it installs with no index at all
    run_uv(
        [
            "pip",
            "sync",
            "--offline",
            "--preview-features",
            "pylock",
            "--python",
            str(python),
            str(lock_dir / "pylock.toml"),
        ],
        cache_dir=cache,
    )
    code = "import alpha, beta, delta, epsilon, gamma; print(alpha.__version__, epsilon.__version__)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["2.0", "1.0"]
    # uv checks realized files against the lock: a different size, or a different sha256
    run_uv(["pip", "uninstall", "--python", str(python), "alpha"], cache_dir=cache)
    tampered = store / "tampered" / "alpha-2.0-py3-none-any.whl"
    tampered.parent.mkdir()
    tampered.write_bytes(realized["alpha-2.0-py3-none-any.whl"].read_bytes() + b"\0")
    (lock_dir / "pylock.toml").write_text(
        pylock_for_install(packages, {**realized, "alpha-2.0-py3-none-any.whl": tampered})
    )
    sync = [
        "pip",
        "sync",
        "--offline",
        "--preview-features",
        "pylock",
        "--python",
        str(python),
        str(lock_dir / "pylock.toml"),
    ]
    size = realized["alpha-2.0-py3-none-any.whl"].stat().st_size
    with pytest.raises(UvError, match=f"size {size + 1}, but the lockfile records {size}"):
        run_uv(sync, cache_dir=cache)
    alpha = by_name(packages)["alpha"]
    wrong = DistFile(alpha.wheels[0].file, "0" * 64, alpha.wheels[0].size)
    relocked = [p if p.name != "alpha" else Package(p.name, p.version, p.index, wheels=(wrong,)) for p in packages]
    (lock_dir / "pylock.toml").write_text(pylock_for_install(relocked, realized))
    with pytest.raises(UvError, match="(?i)hash mismatch"):
        run_uv(sync, cache_dir=cache)


def test_pylock_for_install_needs_a_file_per_package() -> None:
    package = Package("alpha", "2.0", "pypi", wheels=(DistFile("alpha-2.0-py3-none-any.whl", "0" * 64, 1),))
    with pytest.raises(HarnessError, match="alpha 2.0"):
        pylock_for_install([package], {})


@pytest.mark.network
def test_resolve_from_uvs_default_index(tmp_path: Path) -> None:
    packages = resolve_packages(
        ["six==1.16.0"], interpreter=LINUX, indexes=[], settings=Settings(), cache_dir=tmp_path / "uv-cache"
    )
    assert [(p.name, p.version, p.index) for p in packages] == [("six", "1.16.0", "pypi")]
    assert [w.file for w in packages[0].wheels] == ["six-1.16.0-py2.py3-none-any.whl"]
    assert packages[0].wheels[0].size > 0 and len(packages[0].wheels[0].sha256) == 64
    assert "://" not in repr(packages)
