"""Building the interpreter store object: a relocatable CPython of exactly the locked version.

:func:`build_interpreter` fills an empty directory ``out`` with a CPython installation whose
``bin/python3.X`` runs from wherever ``out`` is later moved or copied (``sys.prefix`` follows
the directory; nothing inside it names the directory). Two ways to get one:

* **uv-managed** (the lock says ``source = "uv-managed"``): ``uv python install`` of exactly
  ``cpython-<version>-<os>-<arch>-<libc>`` into a scratch folder inside ``out``, then the
  installation is moved up into ``out``. uv downloads python-build-standalone builds, which
  are relocatable (``$ORIGIN`` RUNPATHs), but uv rewrites the ``/install`` placeholder of
  their ``_sysconfigdata`` and ``.pc`` files to the absolute folder it installed into; that
  folder is a scratch path, so it is rewritten back to ``/install`` (and ``.pc`` prefixes to
  ``${pcfiledir}/../..``) before the paths are made dynamic (below).
  When uv cannot download (``offline`` without the archive in uv's cache,
  ``UV_PYTHON_DOWNLOADS=never`` in the caller's environment, or the download fails),
  :func:`build_uv_managed` raises :class:`DownloadUnavailable`; realize then registers a host
  copy under a store path of its own (``harness/realize/standin.py``), never the lock's.
* **host**: an installed interpreter of exactly the locked version (uv's discovery, pyenv's
  ``versions/`` folders, ``PATH``, common prefixes), copied minimally:

  - ``bin/python3.X`` (the real executable; ``python3`` and ``python`` as relative symlinks);
  - the standard library ``<platlibdir>/python3.X`` with ``lib-dynload``, but without the
    contents of ``site-packages`` (the folder stays, empty: environments bring their own),
    without ``test/`` (CPython's own test suite, 120 MB, never imported by services) or the
    test suites some packages carry (``ctypes/test``, ``idlelib/idle_test``…), and
    without ``config-3.X-*`` (``libpython3.X.a`` and the Makefile serve static embedding,
    not building extensions);
  - ``libpython3.X.so*`` when the build is shared (``Py_ENABLE_SHARED``);
  - ``include/python3.X`` (1.5 MB): building a locked sdist or source tree with C extensions
    needs ``Python.h``, and a host interpreter's headers may not stay where they were.

  An absolute ``RUNPATH``/``RPATH`` that points into the original installation (pyenv links
  ``bin/python3.X`` and ``libpython`` with ``RUNPATH=<prefix>/lib``) is rewritten in place to
  the equivalent ``$ORIGIN``-relative entry, so the copy loads *its own* libpython and not the
  original's (which would still be found on this machine and hide the bug). Entries outside
  the installation (a custom OpenSSL, say) are the host's and stay. The result records
  ``host: <path>`` so the lock and run records can name the impurity: the copy still uses the
  host's system libraries (libc, libssl, libffi, libsqlite3…).

Both ways then: ``_sysconfigdata_*.py`` gets a short appended stanza that maps the build-time
prefix in its values to ``sys.base_prefix`` at import (so ``sysconfig`` and extension builds
see the interpreter where it is); every ``__pycache__`` is dropped and the standard library
is compiled again as *unchecked-hash* pycs (PEP 552) with ``PYTHONHASHSEED=0`` and relative
file names, over several worker processes whose output does not depend on their number
(:func:`harness.realize.bytecode.compile_tree`): the store canonicalizes mtimes,
which would make timestamp pycs stale forever (and the store is read-only, so they could not
be rewritten). The copy is run once before that: its ``sys.prefix`` must be ``out`` and a
shared libpython must be mapped from inside ``out``.

Nothing here knows about the store: directory in, directory out. Linux only for copies
(ELF); uv-managed installs work wherever uv's do.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.lock.document import LockedInterpreter
from harness.progress import QUIET, Reporter
from harness.realize.bytecode import compile_tree
from harness.resolve.interpreter import installed_paths, list_pythons, parse_platform
from harness.resolve.uvtool import UvError, run_stoppable, run_uv

#: How ``python -c`` describes an interpreter (runs on CPython 3.8+).
_PROBE = r"""
import json, os, platform, sys, sysconfig
var = sysconfig.get_config_var
print(json.dumps({
    "version": platform.python_version(),
    "implementation": sys.implementation.name,
    "executable": os.path.realpath(sys.executable),
    "prefix": sys.prefix, "base_prefix": sys.base_prefix,
    "exec_prefix": sys.exec_prefix, "base_exec_prefix": sys.base_exec_prefix,
    "abiflags": getattr(sys, "abiflags", ""),
    "platlibdir": getattr(sys, "platlibdir", "lib"),
    "machine": platform.machine(),
    "stdlib": sysconfig.get_path("stdlib"),
    "include": sysconfig.get_path("include"),
    "shared": bool(var("Py_ENABLE_SHARED")),
    "libdir": var("LIBDIR"), "ldlibrary": var("LDLIBRARY"), "instsoname": var("INSTSONAME"),
}))
"""

#: The placeholder prefix of python-build-standalone builds, which uv rewrites at install.
PBS_PLACEHOLDER = "/install"

_SYSCONFIG_STANZA = """

# Added by harness: this interpreter may live anywhere, so build-time paths that pointed into
# its installation follow it (sys.base_prefix) instead of naming {old!r}.
def _harness_relocate(old={old!r}):
    import sys
    new = sys.base_prefix
    def fix(value):
        out, start = [], 0
        while True:
            at = value.find(old, start)
            if at < 0:
                return "".join(out) + value[start:]
            end = at + len(old)
            before = value[at - 2:at] if at >= 2 else value[:at]
            left = at == 0 or value[at - 1] in " \\t=:,;'\\"" or before in ("-I", "-L", "-R")
            right = end == len(value) or value[end] in "/ \\t:,;'\\""
            out.append(value[start:at] + (new if left and right else old))
            start = end
    for key, value in build_time_vars.items():
        if isinstance(value, str) and old in value:
            build_time_vars[key] = fix(value)
_harness_relocate()
del _harness_relocate
"""


@dataclass(frozen=True)
class InterpreterBuild:
    """What :func:`build_interpreter` made.

    ``source`` is ``"uv-managed"`` or ``"host: <path of the copied executable>"``;
    ``executable`` the interpreter's path relative to ``out`` (``"bin/python3.11"``);
    ``fallback_reason`` why a lock's ``uv-managed`` interpreter came from the host instead
    (None otherwise); ``shared_libpython`` whether the executable loads ``lib/libpython3.X.so``.
    """

    source: str
    executable: str
    version: str
    shared_libpython: bool
    fallback_reason: str | None = None

    @property
    def is_host(self) -> bool:
        return self.source.startswith("host")


@dataclass(frozen=True)
class _Probe:
    version: str
    implementation: str
    executable: Path
    prefix: Path
    base_prefix: Path
    abiflags: str
    platlibdir: str
    machine: str
    stdlib: Path
    include: Path | None
    shared: bool
    libdir: Path | None
    ldlibrary: str | None
    instsoname: str | None


# --------------------------------------------------------------------------- entry point


class DownloadUnavailable(HarnessError):
    """uv cannot provide the lock's interpreter here; ``reason`` says why in one line (no
    addresses: it is recorded in store records and run records). ``tried``: uv really tried
    to download it and failed (not offline, downloads not forbidden), which realize remembers
    for a while (``harness/realize/unreachable.py``)."""

    def __init__(self, reason: str, *, tried: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.tried = tried


def build_interpreter(
    python: LockedInterpreter,
    out: Path,
    *,
    cache_dir: Path,
    offline: bool,
    allow_host: bool = True,
    uv_env: Mapping[str, str] | None = None,
    jobs: int | None = None,
) -> InterpreterBuild:
    """Fill the empty directory ``out`` with CPython ``python.version``, relocatable.

    Contract: on return ``out/<result.executable>`` runs, ``sys.prefix`` is ``out`` wherever
    ``out`` is later moved, and no file in ``out`` names ``out`` or any scratch path, so two
    builds from the same origin have the same content hash. ``cache_dir`` is uv's cache;
    downloaded Python archives are kept in ``cache_dir/python-archives`` so a later offline
    build finds them. ``uv_env`` adds variables for uv (a download list or mirror, say). With
    ``offline`` nothing is downloaded. ``allow_host=False`` refuses the host fallback.
    ``jobs`` bounds the bytecode compile's workers (default: the CPUs).

    This is :func:`build_uv_managed` with :func:`build_host_copy` as the fallback, for callers
    that do not care which they get; realize calls the two itself, since a host copy goes to
    a store path of its own.

    Raises :class:`HarnessError` when neither way works, naming the version and what was
    searched; ``out`` is then left for the caller to delete.
    """
    out = out.absolute()
    reason: str | None = None
    if python.source == "uv-managed":
        try:
            return build_uv_managed(python, out, cache_dir=cache_dir, offline=offline, uv_env=uv_env, jobs=jobs)
        except DownloadUnavailable as exc:
            reason = exc.reason
            _empty(out)
        if not allow_host:
            raise HarnessError(
                f"CPython {python.version}: {reason}",
                hint="realize once with network access, or allow a host interpreter",
            )
    build = build_host_copy(python, out, jobs=jobs)
    return (
        build
        if reason is None
        else InterpreterBuild(
            build.source, build.executable, build.version, build.shared_libpython, fallback_reason=reason
        )
    )


def build_uv_managed(
    python: LockedInterpreter,
    out: Path,
    *,
    cache_dir: Path,
    offline: bool,
    uv_env: Mapping[str, str] | None = None,
    progress: Reporter = QUIET,
    jobs: int | None = None,
) -> InterpreterBuild:
    """Fill the empty directory ``out`` with the uv-managed CPython the lock names (module doc);
    ``progress`` shows the install and the bytecode compilation, whose workers ``jobs`` bounds.

    Raises :class:`DownloadUnavailable` when uv may not or cannot install it (downloads
    forbidden, offline without the archive in uv's cache, no such download, a network
    failure), leaving ``out`` for the caller to empty; other errors as :class:`HarnessError`.
    """
    out = out.absolute()
    _check_empty(out)
    _check_cpython(python)
    reason = why_no_download()
    if reason is not None:
        raise DownloadUnavailable(reason)
    try:
        return _build_uv_managed(
            python, out, cache_dir=cache_dir, offline=offline, uv_env=uv_env, progress=progress, jobs=jobs
        )
    except UvError as exc:
        progress.check()  # the realize is being stopped: nobody falls back, nothing is learnt
        detail = _last_line(exc.stderr) or str(exc)
        if offline:
            raise DownloadUnavailable(f"offline, and uv's archive cache lacks it ({detail})") from None
        # uv ended by Ctrl-C (the terminal's SIGINT reaches it before this thread hears of
        # it) says nothing about the network: not remembered as a failed download.
        interrupted = exc.returncode in (-signal.SIGINT, 128 + signal.SIGINT)
        raise DownloadUnavailable(f"uv could not install it: {detail}", tried=not interrupted) from None


def build_host_copy(
    python: LockedInterpreter, out: Path, *, progress: Reporter = QUIET, jobs: int | None = None
) -> InterpreterBuild:
    """Fill the empty directory ``out`` with a relocatable copy of an installed CPython of
    exactly ``python.version`` (module doc) or, where none is installed, of the newest other
    release of its series (same ABI: a fresh machine's own 3.11.x for a lock's 3.11.7;
    :attr:`InterpreterBuild.version` says which); :class:`HarnessError` naming what was
    searched when there is neither. ``progress`` shows the copy and the bytecode
    compilation, whose workers ``jobs`` bounds (default: the CPUs)."""
    out = out.absolute()
    _check_empty(out)
    _check_cpython(python)
    return _build_host(python, out, progress, jobs=jobs)


def _check_cpython(python: LockedInterpreter) -> None:
    if python.implementation != "cpython":
        raise HarnessError(f"interpreter {python.implementation} {python.version}: harness builds CPython only")


def why_no_download() -> str | None:
    """Why uv must not even try a download, or None. (An offline try still runs: uv then
    reads its archive cache and fails in milliseconds when the archive is not there.)"""
    if os.environ.get("UV_PYTHON_DOWNLOADS", "").lower() == "never":
        return "UV_PYTHON_DOWNLOADS=never forbids downloading it"
    return None


def _last_line(text: str) -> str:
    """uv's last line of explanation, addresses elided: the reason may be recorded in locks
    and run records, which name hosts by configuration only (DESIGN invariant 4)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return re.sub(r"[a-z][a-z0-9+.-]*://[^\s`'\"]+", "<url>", lines[-1]) if lines else ""


def _check_empty(out: Path) -> None:
    if not out.is_dir():
        raise HarnessError(f"{out}: the build directory must exist")
    if any(out.iterdir()):
        raise HarnessError(f"{out}: the build directory must be empty")


def _empty(out: Path) -> None:
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


# --------------------------------------------------------------------------- uv-managed


#: What uv says of a download that could not even connect: the host's name does not resolve
#: (a machine without network, or one whose resolver knows no outside names) or nothing
#: answers there. Retrying that within seconds changes nothing.
_CANNOT_CONNECT = re.compile(r"dns error|error resolving DNS|failed to lookup address|client error \(Connect\)")


def _install_python(
    args: Sequence[str | os.PathLike[str]], *, cache_dir: Path, env: Mapping[str, str], stop: Callable[[], None]
) -> None:
    """``uv python install``: first with no HTTP retries, then, should that fail for another
    reason than a connection that could not be made, again with uv's own. uv retries a
    download that cannot connect with a growing pause, 5 to 11 s that every empty home of an
    offline machine waited before its host copy stood in, and that the environment's build
    then waited for (its store path depends on the interpreter); a name that does not resolve
    does not resolve a second later. ``UV_HTTP_RETRIES`` set by the user or the settings is
    obeyed as it is."""
    if "UV_HTTP_RETRIES" in os.environ or "UV_HTTP_RETRIES" in env:
        run_uv(args, cache_dir=cache_dir, env_extra=env, python_downloads="manual", timeout=1800, stop=stop)
        return
    try:
        quick = {**env, "UV_HTTP_RETRIES": "0"}
        run_uv(args, cache_dir=cache_dir, env_extra=quick, python_downloads="manual", timeout=1800, stop=stop)
    except UvError as exc:
        if "--offline" in args or _CANNOT_CONNECT.search(exc.stderr):
            raise
        run_uv(args, cache_dir=cache_dir, env_extra=env, python_downloads="manual", timeout=1800, stop=stop)


def _build_uv_managed(
    python: LockedInterpreter,
    out: Path,
    *,
    cache_dir: Path,
    offline: bool,
    uv_env: Mapping[str, str] | None,
    progress: Reporter,
    jobs: int | None = None,
) -> InterpreterBuild:
    target = parse_platform(python.platform)
    request = f"cpython-{python.version}-{target.os}-{target.arch}-{target.libc}"
    # Inside ``out``: same filesystem (the move is a rename) and no stray siblings in the store.
    scratch = out / ".uv-python"
    scratch.mkdir()
    archives = cache_dir / "python-archives"
    archives.mkdir(parents=True, exist_ok=True)
    args: list[str | os.PathLike[str]] = ["python", "install", request, "--install-dir", scratch, "--no-bin"]
    if offline:
        args.append("--offline")
    env = {"UV_PYTHON_CACHE_DIR": os.fspath(archives), **(uv_env or {})}
    with progress.phase(f"installing CPython {python.version} (uv python install)") as phase:
        phase.failure = "unavailable"  # the caller may fall back to a host copy (DownloadUnavailable)
        _install_python(args, cache_dir=cache_dir, env=env, stop=phase.check)
    installs = [
        p
        for p in scratch.iterdir()
        if p.is_dir() and not p.is_symlink() and p.name.startswith(f"cpython-{python.version}-")
    ]
    if len(installs) != 1:
        raise HarnessError(
            f"uv python install left {[p.name for p in scratch.iterdir()]} in {scratch}, "
            f"expected one cpython-{python.version}-* installation"
        )
    install = installs[0]
    for child in install.iterdir():
        child.rename(out / child.name)
    # uv wrote the scratch installation's absolute path where the archive had ``/install``.
    for written in dict.fromkeys([os.fspath(install), os.path.realpath(install)]):
        _unpatch_uv_prefix(out, written)
    shutil.rmtree(scratch)
    minor = _minor(python.version)
    exe = f"bin/python{minor}"
    if not (out / exe).is_file():
        raise HarnessError(f"uv's CPython {python.version} has no {exe}")
    shared = _needs_libpython(out / exe)
    _finish(
        out,
        exe,
        minor=minor,
        old_prefix=PBS_PLACEHOLDER,
        version=python.version,
        shared=shared,
        progress=progress,
        jobs=jobs,
    )
    return InterpreterBuild("uv-managed", exe, python.version, shared)


def _unpatch_uv_prefix(out: Path, scratch_prefix: str) -> None:
    """Put ``/install`` back where uv wrote the scratch install path (module doc). ``.pc``
    files get ``${pcfiledir}/../..``, which pkg-config resolves wherever the file is."""
    needle = scratch_prefix.encode()
    for path in _files(out):
        data = path.read_bytes()
        if needle not in data:
            continue
        if b"\0" in data:
            raise HarnessError(
                f"{path}: a binary file names the scratch install folder {scratch_prefix}; "
                "cannot make this uv-managed interpreter relocatable"
            )
        replacement = b"${pcfiledir}/../.." if path.suffix == ".pc" else PBS_PLACEHOLDER.encode()
        replace_file_bytes(path, data.replace(needle, replacement))


# --------------------------------------------------------------------------- host copies


def _build_host(
    python: LockedInterpreter, out: Path, progress: Reporter, *, jobs: int | None = None
) -> InterpreterBuild:
    if sys.platform != "linux":
        raise HarnessError(
            f"CPython {python.version}: harness copies host interpreters on Linux only",
            hint="use a uv-managed interpreter (lock with a version uv can download)",
        )
    target = parse_platform(python.platform)
    searched: list[str] = []
    found = None
    series: list[_Probe] = []  # other patch releases of the same series, as a fallback
    # Looking for a copy runs uv and each candidate: an interrupt ends those too
    # (``progress.check``), not only the copy's phases.
    for candidate in _candidates(python.version, python.platform, searched, stop=progress.check):
        probe = _probe(candidate, stop=progress.check)
        if probe is None:
            continue
        if _acceptable(probe, python.version, target.arch):
            found = probe
            break
        if _acceptable(probe, probe.version, target.arch) and _minor(probe.version) == _minor(python.version):
            series.append(probe)
    if found is None and series:
        # No exact copy here (a fresh machine has its distribution's own 3.11.x): the newest
        # patch release of the series stands in. Same ABI, so the lock's wheels install; the
        # copy is named by its own content and version, and recorded as an impurity.
        found = max(series, key=lambda p: tuple(int(x) for x in p.version.split(".")))
    if found is None:
        raise HarnessError(
            f"no installed CPython {_minor(python.version)} to copy (the lock's {python.version}, or another "
            f"{_minor(python.version)}.x); searched: " + ", ".join(searched),
            hint=f"install it (e.g. `pyenv install {python.version}`), or realize with network access "
            "so uv can download it",
        )
    minor = _minor(python.version)
    layout = _host_layout(found, minor)
    with progress.phase(f"copying CPython {found.version} from {found.executable}") as phase:
        _copy_host(found, layout, out, check=phase.check)
    exe = layout["exe"]
    _finish(
        out,
        exe,
        minor=minor,
        old_prefix=os.fspath(found.base_prefix),
        version=found.version,
        shared=found.shared,
        progress=progress,
        jobs=jobs,
    )
    # Py_ENABLE_SHARED alone does not say the executable loads libpython: Debian's python3.X
    # links it statically and ships the shared library for embedders only.
    return InterpreterBuild(
        f"host: {found.executable}", exe, found.version, found.shared and _needs_libpython(out / exe)
    )


def _candidates(
    version: str, platform_name: str, searched: list[str], *, stop: Callable[[], None] = lambda: None
) -> Iterator[str]:
    """Executables that may be CPython ``version`` (or another release of its series), most
    specific first, each once; appends what it looked at to ``searched`` (for the error).
    ``stop`` raises to end the search (it ends ``uv python list`` while that runs)."""
    minor = _minor(version)
    seen: set[str] = set()

    def offer(path: str | os.PathLike[str]) -> Iterator[str]:
        text = os.fspath(path)
        if text not in seen:
            seen.add(text)
            searched.append(text)
            if os.access(text, os.X_OK) and os.path.isfile(text):
                yield text

    # Version managers keep each version in its own prefix; uv's discovery sees only the one
    # their shims select, so look in their folders directly.
    managers = [Path(os.environ["PYENV_ROOT"]) / "versions"] if os.environ.get("PYENV_ROOT") else []
    managers += [Path("~/.pyenv/versions").expanduser(), Path("~/.asdf/installs/python").expanduser()]
    for folder in dict.fromkeys(managers):
        yield from offer(folder / version / "bin" / f"python{minor}")
    try:
        for installed in installed_paths(version, list_pythons(None, stop=stop), platform=platform_name):
            yield from offer(installed)
        searched.append("uv python list")
    except HarnessError:
        searched.append("uv python list (failed)")
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if entry:
            yield from offer(Path(entry) / f"python{minor}")
    for prefix in ("/usr/local", "/usr", f"/opt/python/{version}", f"/opt/python{minor}"):
        yield from offer(Path(prefix) / "bin" / f"python{minor}")
    # Other patch releases of the series the version managers keep (the fallback when none
    # of the above is exactly ``version``), newest first.
    for folder in dict.fromkeys(managers):
        others = [p for p in folder.glob(f"{minor}.*") if p.name.removeprefix(f"{minor}.").isdigit()]
        for other in sorted(others, key=lambda p: -int(p.name.rsplit(".", 1)[1])):
            yield from offer(other / "bin" / f"python{minor}")


def _probe(executable: str, *, stop: Callable[[], None] = lambda: None) -> _Probe | None:
    """Describe the interpreter at ``executable``, or None when it does not run (a pyenv shim
    for a version that is not selected, say). What ``stop`` raises ends the probe and is raised."""
    try:
        proc = run_stoppable([executable, "-I", "-S", "-c", _PROBE], stop, timeout=60, env=_clean_env())
        if proc.returncode != 0:
            return None
        data = json.loads(proc.stdout)
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return None

    def path(key: str) -> Path | None:
        return Path(data[key]) if data.get(key) else None

    return _Probe(
        version=data["version"],
        implementation=data["implementation"],
        executable=Path(data["executable"]),
        prefix=Path(data["prefix"]),
        base_prefix=Path(data["base_prefix"]),
        abiflags=data["abiflags"],
        platlibdir=data["platlibdir"],
        machine=data["machine"],
        stdlib=Path(data["stdlib"]),
        include=path("include"),
        shared=data["shared"],
        libdir=path("libdir"),
        ldlibrary=data["ldlibrary"],
        instsoname=data["instsoname"],
    )


def _acceptable(probe: _Probe, version: str, arch: str) -> bool:
    """Exactly ``version``, CPython, a base installation (not a venv), the default ABI (no
    debug or free-threaded build), the target's architecture."""
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(probe.machine.lower(), probe.machine.lower())
    return (
        probe.version == version
        and probe.implementation == "cpython"
        and probe.prefix == probe.base_prefix
        and probe.abiflags == ""
        and machine == arch
    )


def _host_layout(probe: _Probe, minor: str) -> dict[str, str]:
    """Where the copied parts go in ``out``: the same paths relative to the installation's
    prefix, which is what getpath's landmark search and the ``$ORIGIN`` rewrite rely on."""
    prefix = probe.base_prefix
    where = f"CPython {probe.version} at {probe.executable}"

    def inside(path: Path, what: str) -> str:
        try:
            return path.relative_to(prefix).as_posix()
        except ValueError:
            raise HarnessError(
                f"{where}: its {what} ({path}) is outside its prefix {prefix}; cannot make a relocatable copy"
            ) from None

    layout = {"exe": f"bin/python{minor}", "stdlib": inside(probe.stdlib, "standard library")}
    if layout["stdlib"] != f"{probe.platlibdir}/python{minor}":
        raise HarnessError(
            f"{where}: unusual layout (standard library at {layout['stdlib']}); cannot make a relocatable copy"
        )
    if probe.include is not None and probe.include.is_dir():
        layout["include"] = inside(probe.include, "include folder")
    if probe.shared:
        if probe.libdir is None or not probe.instsoname:
            raise HarnessError(f"{where}: a shared build that does not say where libpython is")
        layout["libdir"] = inside(probe.libdir, "libpython folder")
    return layout


#: The test suites some standard library packages carry inside themselves (3.8 to 3.13), left
#: out of a host copy as ``test/`` is: never imported by a service, and a quarter of the
#: files a copy would compile (``ctypes/test``, ``idlelib/idle_test``, ...: 236 of 969 in 3.11).
_PACKAGE_TESTS = frozenset(
    {
        ("ctypes", "test"),
        ("distutils", "tests"),
        ("idlelib", "idle_test"),
        ("lib2to3", "tests"),
        ("sqlite3", "test"),
        ("tkinter", "test"),
        ("unittest", "test"),
    }
)


def _copy_host(probe: _Probe, layout: dict[str, str], out: Path, *, check: Callable[[], None] = lambda: None) -> None:
    """Copy the installation ``probe`` found into ``out``; ``check`` is called for every
    folder (an interrupted realize stops there: :meth:`harness.progress.Phase.check`)."""
    prefix = probe.base_prefix
    minor = layout["exe"].removeprefix("bin/python")
    (out / "bin").mkdir()
    shutil.copy2(probe.executable, out / layout["exe"])
    for alias in ("python3", "python"):
        os.symlink(f"python{minor}", out / "bin" / alias)

    stdlib = prefix / layout["stdlib"]

    def ignore(folder: str, names: list[str]) -> set[str]:
        check()
        skip = {n for n in names if n == "__pycache__"}
        where = Path(folder)
        if where == stdlib:
            skip |= {n for n in names if n in ("test", "site-packages", "dist-packages") or n.startswith("config-")}
        elif where.parent == stdlib:
            skip |= {n for n in names if (where.name, n) in _PACKAGE_TESTS}
        return skip

    shutil.copytree(stdlib, out / layout["stdlib"], ignore=ignore, symlinks=False)
    (out / layout["stdlib"] / "site-packages").mkdir()
    if "include" in layout:
        shutil.copytree(prefix / layout["include"], out / layout["include"], symlinks=False)
    if "libdir" in layout:
        assert probe.instsoname is not None
        source, target = prefix / layout["libdir"], out / layout["libdir"]
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / probe.instsoname, target / probe.instsoname)
        # The development name (libpython3.X.so) as a link, and the stable-ABI shim
        # (libpython3.so, a few KB) that embedders of the limited API load.
        if probe.ldlibrary and probe.ldlibrary != probe.instsoname:
            os.symlink(probe.instsoname, target / probe.ldlibrary)
        abi3 = source / f"libpython{minor.split('.')[0]}.so"
        if abi3.is_file() and not abi3.is_symlink():
            shutil.copy2(abi3, target / abi3.name)
    # Point every absolute RUNPATH into the original installation at the copy instead (a
    # module's source is never a shared object: not opened to look).
    for path in _files(out):
        if not path.name.endswith(".py") and _is_elf(path):
            _relocate_runpath(path, original=prefix / path.relative_to(out), prefix=prefix)


# --------------------------------------------------------------------------- both ways


def _finish(
    out: Path,
    exe: str,
    *,
    minor: str,
    old_prefix: str,
    version: str,
    shared: bool,
    progress: Reporter = QUIET,
    jobs: int | None = None,
) -> None:
    """Empty site-packages, dynamic sysconfig, fresh pycs, and a check that the result runs
    from ``out`` (module doc)."""
    stdlib = _stdlib_dir(out, minor)
    site = stdlib / "site-packages"
    if site.is_dir():
        _empty(site)
    else:
        site.mkdir()
    for data in stdlib.glob("_sysconfigdata_*.py"):
        text = data.read_text(encoding="utf-8")
        if old_prefix in text and "_harness_relocate" not in text:
            replace_file_bytes(data, (text + _SYSCONFIG_STANZA.format(old=old_prefix)).encode("utf-8"))
    for cache in sorted(out.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)
    _verify(out, exe, version=version, shared=shared)
    with progress.phase(f"compiling bytecode of CPython {version}'s standard library") as phase:
        compile_tree(out / exe, [stdlib], root=out, jobs=jobs, progress=phase.callback())


def _stdlib_dir(out: Path, minor: str) -> Path:
    for platlibdir in ("lib", "lib64"):
        candidate = out / platlibdir / f"python{minor}"
        if (candidate / "os.py").is_file():
            return candidate
    raise HarnessError(f"{out}: no standard library (lib/python{minor}/os.py)")


def _verify(out: Path, exe: str, *, version: str, shared: bool) -> None:
    """Run the built interpreter: right version, ``sys.prefix`` inside ``out``, and (Linux,
    shared builds) its libpython mapped from ``out``, not from the original installation."""
    code = (
        "import json, platform, sys\n"
        "maps = open('/proc/self/maps').read() if sys.platform == 'linux' else ''\n"
        # address perms offset dev inode path: the path (6th field) may hold spaces
        "libs = sorted({l.split(None, 5)[5] for l in maps.splitlines() if 'libpython' in l})\n"
        "print(json.dumps([platform.python_version(), sys.prefix, sys.exec_prefix, libs]))"
    )
    try:
        proc = subprocess.run(
            [os.fspath(out / exe), "-I", "-S", "-B", "-c", code],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            env=_clean_env(),
        )
    except OSError as exc:
        raise HarnessError(f"{out / exe}: the built interpreter does not start: {exc}") from None
    if proc.returncode != 0:
        raise HarnessError(f"{out / exe}: the built interpreter does not start:\n{proc.stderr.strip()[-3000:]}")
    got_version, prefix, exec_prefix, libs = json.loads(proc.stdout)
    real = os.path.realpath(out)
    if got_version != version or os.path.realpath(prefix) != real or os.path.realpath(exec_prefix) != real:
        raise HarnessError(
            f"{out / exe}: runs as CPython {got_version} with prefix {prefix} "
            f"(exec prefix {exec_prefix}); expected {version} with prefix {out}"
        )
    strays = [lib for lib in libs if not os.path.realpath(lib).startswith(real + os.sep)]
    if shared and strays:
        raise HarnessError(f"{out / exe}: loads libpython from outside the copy ({', '.join(strays)})")


def _clean_env() -> dict[str, str]:
    """The caller's environment without what changes how Python starts or compiles."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH")
    }


def _files(root: Path) -> Iterator[Path]:
    """Regular files under ``root`` (symlinks not followed), in a stable order."""
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                yield path


def replace_file_bytes(path: Path, data: bytes) -> None:
    """Replace a file's bytes with a fresh inode: the old one may be a hardlink shared with
    uv's cache or the original installation, which must not change."""
    mode = path.stat().st_mode & 0o7777
    tmp = path.with_name(path.name + ".harness-tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- ELF RUNPATH

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 14, 15, 29


@dataclass(frozen=True)
class _Dynamic:
    """The parts of an ELF file's dynamic section harness reads."""

    strtab_offset: int  # file offset of .dynstr
    needed: tuple[str, ...]
    paths: tuple[tuple[int, int, str], ...]  # (tag, file offset of the string, value): RPATH/RUNPATH
    string_offsets: tuple[int, ...]  # file offsets of every other string the section names


def _is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def _read_dynamic(data: bytes) -> _Dynamic | None:
    """Parse a little-endian ELF64 file's dynamic section; None when it has none (static) or
    is another ELF flavour (harness builds for x86_64 and aarch64 Linux)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None
    entries = []
    for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == _DT_NULL:
            break
        entries.append((tag, value))
    strtab = next((v for t, v in entries if t == _DT_STRTAB), None)
    if strtab is None:
        return None
    base = next((off + strtab - vaddr for vaddr, off, size in loads if vaddr <= strtab < vaddr + size), None)
    if base is None:
        return None

    def string(offset: int) -> str:
        end = data.index(b"\0", base + offset)
        return data[base + offset : end].decode("utf-8", "surrogateescape")

    needed = tuple(string(v) for t, v in entries if t == _DT_NEEDED)
    paths = tuple((t, base + v, string(v)) for t, v in entries if t in (_DT_RPATH, _DT_RUNPATH))
    others = tuple(base + v for t, v in entries if t in (_DT_NEEDED, _DT_SONAME))
    return _Dynamic(base, needed, paths, others)


def _needs_libpython(path: Path) -> bool:
    dynamic = _read_dynamic(path.read_bytes())
    return dynamic is not None and any(name.startswith("libpython") for name in dynamic.needed)


def _relocate_runpath(path: Path, *, original: Path, prefix: Path) -> None:
    """Rewrite ``path``'s RPATH/RUNPATH entries that point inside ``prefix`` to ``$ORIGIN``-
    relative ones, as seen from ``original`` (the file's place in the original installation),
    in place. The new string must fit in the old one's bytes (it is NUL-padded): patchelf
    could grow the string table, but an in-place shrink needs no new dependency and the
    ``$ORIGIN`` form is always shorter than an absolute install path in practice."""
    dynamic = _read_dynamic(path.read_bytes())
    if dynamic is None or not dynamic.paths:
        if dynamic is not None and any(n.startswith("libpython") for n in dynamic.needed):
            raise HarnessError(
                f"{original}: loads libpython without a RUNPATH (from the system's library "
                "path), so a copy would not load its own; cannot make a relocatable copy"
            )
        return
    patches: list[tuple[int, bytes]] = []
    for _, offset, value in dynamic.paths:
        entries = []
        for entry in value.split(":"):
            resolved = Path(
                entry.replace("$ORIGIN", os.fspath(original.parent)).replace("${ORIGIN}", os.fspath(original.parent))
            )
            if entry.startswith("/") and (resolved == prefix or prefix in resolved.parents):
                rel = os.path.relpath(resolved, original.parent)
                entries.append("$ORIGIN" if rel == "." else f"$ORIGIN/{rel}")
            else:
                entries.append(entry)
        new = ":".join(entries).encode()
        old = value.encode("utf-8", "surrogateescape")
        if new == old:
            continue
        if len(new) > len(old):
            raise HarnessError(f"{original}: RUNPATH {value!r} is too short to rewrite to {new.decode()!r} in place")
        if any(offset < other <= offset + len(old) for other in dynamic.string_offsets):
            raise HarnessError(f"{original}: its RUNPATH string is shared with another entry; cannot rewrite it")
        patches.append((offset, new + b"\0" * (len(old) - len(new))))
    if patches:
        _patch_copy(path, patches)


def _patch_copy(path: Path, patches: list[tuple[int, bytes]]) -> None:
    """Write ``(offset, bytes)`` patches into ``path`` in place: a file :func:`_copy_host`
    just copied, an inode of its own (rewriting a whole libpython cost a second copy)."""
    mode = os.stat(path).st_mode & 0o7777
    if not mode & 0o200:
        os.chmod(path, mode | 0o200)
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for offset, data in patches:
            os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
        if not mode & 0o200:
            os.chmod(path, mode)
