"""Pinning the interpreter an environment is built on, and naming its target platform.

**Which version a lock pins.** A manifest asks for ``python = "3.11"`` (a series) or
``"3.11.7"`` (exact). harness pins an exact CPython release:

1. a project setting ``pin`` (e.g. ``"3.11.9"``) wins, and must lie in the request;
2. an exact request is taken as is;
3. otherwise the newest final patch release of the series that uv can provide as a managed
   download for the target platform (``uv python list --all-versions``; uv ships that list
   inside its binary, so this needs no network and follows the pinned uv version);
4. otherwise, when uv has no download for the series, the newest one installed on this
   machine.

The pinned version's ``source`` is ``"uv-managed"`` when uv lists a download of exactly that
version for the target (realize can obtain it anywhere, byte for byte), else ``"host"`` (found
installed here only: impure, the lock says so, and every realize stands a host copy in under
a store path of its own, ``harness/realize/standin.py``). A pin chooses the version only,
never the source: a pinned release that uv can download is ``uv-managed`` like any other
(docs/src/content/docs/reference/configuration.md says why). :func:`find_interpreter` also returns the path
of an installed interpreter of exactly that version when this machine has one, else None.

**Platforms** use uv's ``--python-platform`` vocabulary (``x86_64-manylinux_2_28``,
``aarch64-apple-darwin``, ``x86_64-pc-windows-msvc``…). The default is this machine's:
on glibc Linux the highest manylinux level uv knows that the host glibc satisfies
(``x86_64-manylinux_2_36`` on glibc 2.36). A project that locks on several machines should
pin one platform (a lower manylinux level reaches more machines). :func:`target_tags` gives
the wheel tags a target accepts, following uv's own rules, so filtering agrees with uv.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging import tags as pkgtags
from packaging.version import InvalidVersion, Version

from harness.errors import HarnessError, InputError
from harness.resolve.pins import Interpreter
from harness.resolve.uvtool import PYTHON_LIST_ARGS, run_uv

#: glibc minors for which uv 0.13 accepts ``<arch>-manylinux_2_<minor>``.
UV_MANYLINUX_MINORS = (17, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40)
#: uv's platform aliases and their triples.
PLATFORM_ALIASES = {
    "linux": "x86_64-unknown-linux-gnu",
    "windows": "x86_64-pc-windows-msvc",
    "macos": "aarch64-apple-darwin",
}
_LINUX_ARCHES = ("x86_64", "aarch64")
_MIN_MANYLINUX_MINOR = {"x86_64": 5, "i686": 5}  # others: 17 (as uv and PEP 600)
_WINDOWS = {"x86_64": "win_amd64", "aarch64": "win_arm64", "i686": "win32"}
_PYTHON_LIST_ARCH = {"x86_64": "x86_64", "aarch64": "aarch64", "i686": "x86"}
_REQUEST = re.compile(r"^3\.\d{1,2}(\.\d{1,3})?$")


# --- platforms ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A ``--python-platform`` value taken apart."""

    platform: str  # canonical triple (aliases expanded)
    os: str  # "linux" | "macos" | "windows" (uv python list's vocabulary)
    arch: str  # "x86_64" | "aarch64" | "i686"
    libc: str  # "gnu" | "musl" | "none"
    glibc_minor: int | None = None  # manylinux 2.<minor>, gnu only


def parse_platform(platform: str) -> Target:
    """Parse a uv ``--python-platform`` value; InputError for ones harness cannot lock for."""
    canonical = PLATFORM_ALIASES.get(platform, platform)
    match = re.fullmatch(r"(x86_64|aarch64)-(?:unknown-linux-gnu|manylinux(2014|_2_(\d+)))", canonical)
    if match:
        minor = int(match.group(3)) if match.group(3) else 17
        if minor not in UV_MANYLINUX_MINORS:
            raise InputError(
                f"platform {platform!r}: uv knows manylinux_2_<N> for N in {', '.join(map(str, UV_MANYLINUX_MINORS))}"
            )
        return Target(canonical, "linux", match.group(1), "gnu", minor)
    match = re.fullmatch(r"(x86_64|aarch64)-unknown-linux-musl", canonical)
    if match:
        return Target(canonical, "linux", match.group(1), "musl")
    match = re.fullmatch(r"(x86_64|aarch64)-apple-darwin", canonical)
    if match:
        return Target(canonical, "macos", match.group(1), "none")
    match = re.fullmatch(r"(x86_64|aarch64|i686)-pc-windows-msvc", canonical)
    if match:
        return Target(canonical, "windows", match.group(1), "none")
    raise InputError(f"platform {platform!r} is not one harness locks for", hint=f"accepted: {accepted_platforms()}")


def accepted_platforms() -> str:
    """Every spelling :func:`parse_platform` accepts, as one line."""
    minors = ", ".join(map(str, UV_MANYLINUX_MINORS))
    return (
        f"x86_64|aarch64-manylinux_2_N (N: {minors}), x86_64|aarch64-manylinux2014, "
        "x86_64|aarch64-unknown-linux-gnu, x86_64|aarch64-unknown-linux-musl, x86_64|aarch64-apple-darwin, "
        f"x86_64|aarch64|i686-pc-windows-msvc, or uv's aliases {', '.join(PLATFORM_ALIASES)} "
        "(e.g. x86_64-manylinux_2_28)"
    )


def platform_tags(platform: str) -> list[str]:
    """Wheel platform tags a target accepts, best first, as uv 0.13 computes them.

    manylinux targets accept ``manylinux_2_<m>`` from their level down to the architecture's
    minimum (with the legacy ``manylinux1/2010/2014`` aliases) and then ``linux_<arch>``;
    musl targets ``musllinux_1_0..2`` and ``linux_<arch>``; macOS targets macOS 13.0 and
    older (uv's default deployment target); Windows its one tag.
    """
    target = parse_platform(platform)
    arch = target.arch
    if target.libc == "gnu":
        assert target.glibc_minor is not None
        out: list[str] = []
        for minor in range(target.glibc_minor, _MIN_MANYLINUX_MINOR.get(arch, 17) - 1, -1):
            out.append(f"manylinux_2_{minor}_{arch}")
            legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(minor)
            if legacy:
                out.append(f"{legacy}_{arch}")
        return [*out, f"linux_{arch}"]
    if target.libc == "musl":
        return [f"linux_{arch}", *(f"musllinux_1_{minor}_{arch}" for minor in (2, 1, 0))]
    if target.os == "macos":
        return list(pkgtags.mac_platforms((13, 0), "arm64" if arch == "aarch64" else arch))
    return [_WINDOWS[arch]]


def ranked_target_tags(python_version: str, platform: str) -> list[pkgtags.Tag]:
    """Every wheel tag CPython ``python_version`` on ``platform`` accepts, best first."""
    release = Version(python_version).release
    major, minor = release[0], release[1]
    interpreter = f"cp{major}{minor}"
    platforms = platform_tags(platform)
    return [
        *pkgtags.cpython_tags((major, minor), abis=[interpreter], platforms=platforms),
        *pkgtags.compatible_tags((major, minor), interpreter, platforms),
    ]


def target_tags(python_version: str, platform: str) -> frozenset[pkgtags.Tag]:
    """Every wheel tag CPython ``python_version`` (``"3.11.7"``) on ``platform`` accepts."""
    return frozenset(ranked_target_tags(python_version, platform))


def default_platform_from_tags(host_tags: Iterable[str]) -> str:
    """This machine's platform in uv's vocabulary, from its wheel platform tags
    (``packaging.tags.platform_tags()``): see the module doc. Pure."""
    tags = list(host_tags)
    best: dict[str, int] = {}
    for tag in tags:
        match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
        if match and match.group(2) in _LINUX_ARCHES:
            best[match.group(2)] = max(best.get(match.group(2), 0), int(match.group(1)))
    for arch, glibc in best.items():
        known = [minor for minor in UV_MANYLINUX_MINORS if minor <= glibc]
        if known:
            return f"{arch}-manylinux_2_{known[-1]}"
    for tag in tags:
        match = re.fullmatch(r"musllinux_\d+_\d+_(\w+)", tag)
        if match and match.group(1) in _LINUX_ARCHES:
            return f"{match.group(1)}-unknown-linux-musl"
        match = re.fullmatch(r"macosx_\d+_\d+_(arm64|x86_64)", tag)
        if match:
            return "aarch64-apple-darwin" if match.group(1) == "arm64" else "x86_64-apple-darwin"
        for arch, windows_tag in _WINDOWS.items():
            if tag == windows_tag:
                return f"{arch}-pc-windows-msvc"
    raise InputError(
        "cannot name this machine's platform in uv's --python-platform vocabulary",
        hint="set the platform explicitly (for example x86_64-manylinux_2_28)",
    )


def host_platform() -> str:
    """The default target: this machine's platform (see :func:`default_platform_from_tags`)."""
    return default_platform_from_tags(pkgtags.platform_tags())


# --- uv python list -----------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class PythonListing:
    """One row of ``uv python list --output-format json``: a download or an installation."""

    implementation: str
    version: str
    variant: str
    os: str
    arch: str
    libc: str
    path: str | None  # set for an installed interpreter
    downloadable: bool  # uv can download this build


def parse_python_list(text: str) -> list[PythonListing]:
    """Parse uv's JSON listing (keys as in uv 0.13). Pure."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HarnessError(f"cannot read `uv python list` output: {exc}") from None
    out = []
    for row in rows:
        out.append(
            PythonListing(
                implementation=str(row.get("implementation", "")),
                version=str(row.get("version", "")),
                variant=str(row.get("variant") or "default"),
                os=str(row.get("os", "")),
                arch=str(row.get("arch", "")),
                libc=str(row.get("libc", "")),
                path=row.get("path"),
                downloadable=bool(row.get("url")) and not row.get("path"),
            )
        )
    return out


def _final(version: str) -> Version | None:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None
    if parsed.is_prerelease or parsed.is_devrelease or parsed.is_postrelease or len(parsed.release) != 3:
        return None
    return parsed


def _matches(listing: PythonListing, target: Target) -> bool:
    return (
        listing.implementation == "cpython"
        and listing.variant == "default"
        and listing.os == target.os
        and listing.arch == _PYTHON_LIST_ARCH[target.arch]
        and listing.libc == target.libc
    )


def choose_version(
    request: str, listings: Iterable[PythonListing], *, platform: str, pin: str | None = None
) -> tuple[str, str]:
    """The exact CPython version to lock and its source (``uv-managed``/``host``). Pure.

    See the module doc for the rule. InputError when the request is malformed or nothing fits.
    """
    if not _REQUEST.match(request):
        raise InputError(f"python must be a CPython 3 version like '3.11' or '3.11.7', got {request!r}")
    target = parse_platform(platform)
    wanted = Version(request).release
    rows = [row for row in listings if _matches(row, target) and _final(row.version)]
    downloads = {Version(row.version) for row in rows if row.downloadable}
    installed = {Version(row.version) for row in rows if row.path}
    exact = pin if pin is not None else (request if len(wanted) == 3 else None)
    if exact is not None:
        version = _final(exact)
        if version is None or version.release[: len(wanted)] != wanted:
            raise InputError(f"python pin {exact!r} is not a CPython release in {request!r}")
        if version in downloads:
            return str(version), "uv-managed"
        if version in installed:
            return str(version), "host"
        raise InputError(
            f"CPython {version} for {target.platform}: uv offers no download and none is installed",
            hint=_offer(downloads | installed, wanted),
        )

    def series(versions: set[Version]) -> list[Version]:
        return sorted(v for v in versions if v.release[:2] == wanted)

    if series(downloads):
        return str(series(downloads)[-1]), "uv-managed"
    if series(installed):
        return str(series(installed)[-1]), "host"
    raise InputError(
        f"no CPython {request} for {target.platform}: uv offers no download and none is installed",
        hint=_offer(downloads | installed, wanted),
    )


def _offer(versions: set[Version], wanted: tuple[int, ...]) -> str:
    near = sorted(v for v in versions if v.release[:2] == wanted[:2]) or sorted(versions)[-5:]
    return "available: " + (", ".join(map(str, near)) or "none")


def installed_paths(version: str, listings: Iterable[PythonListing], *, platform: str) -> list[str]:
    """Paths of installed interpreters of exactly ``version`` runnable as ``platform``, in uv's
    discovery order, without duplicates. Pure."""
    target = parse_platform(platform)
    out: list[str] = []
    for row in listings:
        if row.path and row.version == version and _matches(row, target) and row.path not in out:
            out.append(row.path)
    return out


def list_pythons(cache_dir: Path | None, *, stop: Callable[[], None] | None = None) -> list[PythonListing]:
    """Ask uv for every CPython it can download (any platform) or finds installed.

    Runs offline: the download list is built into uv. ``UV_PYTHON_DOWNLOADS=automatic`` is
    needed only for uv to *list* downloads; nothing is downloaded. Discovering installed
    interpreters is most of the cost (uv runs each one it finds, and a pyenv shim is a shell
    script: about 1 s here); where downloads are enough, :func:`list_downloads` is quicker.
    ``stop`` ends the listing early by raising (:func:`~harness.resolve.uvtool.run_stoppable`).
    """
    with tempfile.TemporaryDirectory(prefix="harness-python-list-") as neutral:  # no project around
        proc = run_uv(
            PYTHON_LIST_ARGS,
            cache_dir=cache_dir,
            python_downloads="automatic",
            cwd=Path(neutral),
            timeout=120,
            stop=stop,
        )
    return parse_python_list(proc.stdout)


def python_list_key(target: Target) -> str:
    """``target`` as ``uv python list`` spells a platform: ``<os>-<arch>-<libc>``."""
    return f"{target.os}-{_PYTHON_LIST_ARCH[target.arch]}-{target.libc}"


#: The most a kept downloads list may hold (one platform's is ≈ 60 KB; every platform's 1 MB).
_LIST_LIMIT = 8 << 20


def list_downloads(cache_dir: Path | None, target: Target) -> list[PythonListing]:
    """Every CPython build uv can download for ``target``'s platform, any version (no
    installed interpreter is looked for: 0.02–0.05 s). The answer is built into the uv binary,
    so it is kept in ``cache_dir`` per uv binary and platform
    (:func:`~harness.resolve.uvtool.downloads_list_file`) and read from there afterwards.
    Asking for one platform, not all, keeps it small: a lock reads ≈ 160 rows, not ≈ 2,600."""
    from harness.resolve.uvtool import downloads_list_args, downloads_list_file

    key = python_list_key(target)
    kept = downloads_list_file(cache_dir, key) if cache_dir is not None else None
    if kept is not None:
        from harness.store.entries import read_own

        held = read_own(kept, limit=_LIST_LIMIT)  # this user's own file, never through a link
        if held is not None:
            try:
                return parse_python_list(held.decode("utf-8", errors="replace"))
            except HarnessError:
                pass
    with tempfile.TemporaryDirectory(prefix="harness-python-list-") as neutral:  # no project around
        proc = run_uv(
            downloads_list_args(key), cache_dir=cache_dir, python_downloads="automatic", cwd=Path(neutral), timeout=120
        )
    listings = parse_python_list(proc.stdout)
    if kept is not None:
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            temp = kept.with_name(f".{kept.name}.{os.getpid()}")
            temp.write_text(proc.stdout, encoding="utf-8")
            os.replace(temp, kept)
        except OSError:
            pass  # asked again next time
        _drop_whole_lists(kept.parent)
    return listings


def _drop_whole_lists(folder: Path) -> None:
    """Delete the lists of every platform's downloads (``<32 hex>.json``, 1 MB each) that
    harness kept there before it asked for one platform's: nothing reads them any more."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if _WHOLE_LIST.fullmatch(name):
            try:
                os.unlink(folder / name)
            except OSError:
                pass  # another member's, in a shared home: theirs to drop


_WHOLE_LIST = re.compile(r"[0-9a-f]{32}\.json")


def _probe(path: str, version: str) -> Path | None:
    """The real executable behind ``path`` if it runs and is ``version`` (pyenv shims can fail)."""
    code = "import platform, sys; print(sys.executable); print(platform.python_version())"
    try:
        proc = subprocess.run(
            [path, "-I", "-c", code], check=False, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.split()
    if proc.returncode != 0 or len(lines) != 2 or lines[1] != version:
        return None
    return Path(lines[0])


def find_interpreter(
    request: str, *, platform: str | None = None, cache_dir: Path | None, pin: str | None = None
) -> tuple[Interpreter, Path | None]:
    """Pin ``request`` to an exact CPython for ``platform`` (default :func:`host_platform`).

    Returns the :class:`Interpreter` and the path of an installed interpreter of exactly that
    version on this machine (None when there is none, or when the target is another platform
    than this machine's). See the module doc for the choice.
    """
    target = parse_platform(platform if platform is not None else host_platform())
    listings = list_pythons(cache_dir)
    version, source = choose_version(request, listings, platform=target.platform, pin=pin)
    path = None
    for candidate in installed_paths(version, listings, platform=target.platform):
        path = _probe(candidate, version)
        if path is not None:
            break
    return Interpreter(implementation="cpython", version=version, platform=target.platform, source=source), path
