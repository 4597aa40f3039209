"""Running the uv binary that harness pins, the same way every time.

harness drives the ``uv`` executable shipped by the ``uv`` wheel it depends on (pinned in
pyproject.toml; :func:`uv_version` is what locks and run records name). :func:`run_uv` is
the only way the rest of harness should start uv. Every call:

* passes ``--no-config``, so no ``uv.toml`` / ``pyproject.toml [tool.uv]`` of the user or of
  the current directory can change a result (it is a global uv option, valid everywhere);
* passes ``--cache-dir DIR`` when the caller gives a harness-owned cache (keep it on the
  store's filesystem, DESIGN "Notes on calling uv"), else ``--no-cache`` (a throw-away cache),
  never the user's own uv cache;
* sets ``UV_PYTHON_DOWNLOADS=never`` unless the caller asks otherwise, so a Python version
  request never silently tries to download an interpreter;
* starts from the caller's environment minus the variables below, which would otherwise
  change what uv resolves, finds or installs:

  - every ``UV_*`` variable (indexes, ``UV_EXCLUDE_NEWER``, ``UV_PRERELEASE``,
    ``UV_RESOLUTION``, ``UV_INDEX_STRATEGY``, ``UV_CONSTRAINT``, ``UV_PYTHON``,
    ``UV_CACHE_DIR``, ``UV_OFFLINE``, ``UV_PREVIEW``, ``UV_TORCH_BACKEND`` …) except the few
    in :data:`UV_ENV_KEPT`, which only say where or how bytes are fetched: the default-index
    mirror (``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL``; DESIGN names it as configuration — the
    lock records the index by name either way), interpreter download mirrors, timeouts,
    retries, TLS and keyring choices;
  - ``VIRTUAL_ENV`` and ``CONDA_PREFIX``: uv would pick that environment's interpreter;
  - ``PIP_*``: uv does not read them today, but pip-compatible settings must never leak in
    (this machine exports ``PIP_FIND_LINKS``, for one);
  - ``PYTHONPATH``, ``PYTHONHOME``, ``PYTHONSTARTUP``, ``PYTHONUSERBASE``: they change what
    the interpreters uv queries or builds with see;
  - ``MACOSX_DEPLOYMENT_TARGET``: it changes the macOS wheel tags uv accepts for a target.

A failure becomes a :class:`UvError` (a :class:`~harness.errors.HarnessError`) carrying
uv's exit status and stderr, with the command in its message.

**Runs started ahead** (:func:`prestart`): a caller that can tell early which uv command a
later :func:`run_uv` call will make (``harness lock`` starts each resolution from the raw
manifest while pydantic and the models load, :mod:`harness.lock.early`) starts it in a
folder of its own. :func:`run_uv` then takes over such a run instead of starting uv, but
only when everything that decides uv's result is the same: the whole command line, the
environment, and the name and bytes of every file in the working folder (the run's own
output files are copied back into the caller's folder). Anything else runs as usual;
:func:`discard_prestarted` stops and removes the runs nobody took over.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from harness.errors import HarnessError

#: ``UV_*`` variables passed through: they choose where and how files are fetched, not what.
UV_ENV_KEPT = frozenset(
    {
        "UV_DEFAULT_INDEX",
        "UV_INDEX_URL",
        "UV_PYTHON_INSTALL_MIRROR",
        "UV_PYPY_INSTALL_MIRROR",
        "UV_HTTP_TIMEOUT",
        "UV_HTTP_RETRIES",
        "UV_REQUEST_TIMEOUT",
        "UV_CONCURRENT_DOWNLOADS",
        "UV_CONCURRENT_BUILDS",
        "UV_CONCURRENT_INSTALLS",
        "UV_NATIVE_TLS",
        "UV_INSECURE_HOST",
        "UV_KEYRING_PROVIDER",
        "UV_NO_PROGRESS",
    }
)

#: Variables removed outright (besides every ``UV_*`` and ``PIP_*`` not kept); see module doc.
ENV_STRIPPED = frozenset(
    {
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CONDA_DEFAULT_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "MACOSX_DEPLOYMENT_TARGET",
    }
)

#: How much of uv's stderr an error message keeps (the end, where uv explains).
_STDERR_TAIL = 6000


class UvError(HarnessError):
    """uv exited with an error; ``stderr`` is what it printed, ``returncode`` its status."""

    def __init__(
        self, message: str, *, stderr: str = "", returncode: int | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.stderr = stderr
        self.returncode = returncode


@lru_cache(maxsize=1)
def uv_bin() -> str:
    """The path of the uv executable that the installed ``uv`` wheel ships.

    In a virtual environment on a POSIX system that is ``<venv>/bin/uv`` whenever that file
    exists: the first place ``uv.find_uv_bin`` looks (the running interpreter's scripts
    folder, which a venv's scheme puts there), so the answer is the same, without loading
    ``sysconfig`` (≈ 5 ms before every lock's first uv run)."""
    if os.name == "posix" and sys.prefix != sys.base_prefix:
        candidate = os.path.join(sys.prefix, "bin", "uv")
        if os.path.isfile(candidate):
            return candidate
    try:
        import uv
    except ImportError as exc:  # pragma: no cover - uv is a hard dependency
        raise HarnessError("the 'uv' package is not installed", hint="pip install harness") from exc
    try:
        path = uv.find_uv_bin()
    except FileNotFoundError as exc:  # pragma: no cover
        raise HarnessError(f"the uv binary of the 'uv' package is missing: {exc}") from exc
    return os.fsdecode(path)


@lru_cache(maxsize=2)
def uv_version(cache_dir: Path | None = None) -> str:
    """uv's version, e.g. ``"0.13.9"`` (what locks and run records name).

    With ``cache_dir``, the answer is kept there (``uv-version.json``) for this uv binary,
    keyed by its path, inode, size and modification time like the downloads list
    (:func:`downloads_list_file`): a run records it without starting uv (a subprocess on the
    way of every run and cluster shard, before its first service starts). In a home a group
    shares it is kept in the member's own folder (:func:`_own_answers`): another member's file
    would name the uv version this member's run records say they ran with."""
    binary = uv_bin()
    key: list[object] = []
    kept: Path | None = None
    if cache_dir is not None:
        from harness.store.entries import read_own

        try:
            st = os.stat(binary)
            key = [binary, st.st_ino, st.st_size, st.st_mtime_ns]
            kept = _own_answers(cache_dir) / "uv-version.json"
            known = json.loads(read_own(kept) or b"null")
            if isinstance(known, dict) and known.get("binary") == key and isinstance(known.get("version"), str):
                return str(known["version"])
        except (OSError, ValueError, HarnessError):
            pass
    out = run_uv(["--version"]).stdout
    match = re.search(r"\buv (\S+)", out)
    if not match:
        raise HarnessError(f"cannot read uv's version from {out.strip()!r}")
    if kept is not None and key:
        _keep(kept, json.dumps({"binary": key, "version": match.group(1)}))
    return match.group(1)


def _own_answers(cache_dir: Path) -> Path:
    """Where uv's answers that harness keeps (its version, its interpreter downloads) go for a
    home whose cache folder is ``cache_dir``: that folder, or in a home a group shares, the
    member's own uv folder (:func:`harness.store.shared.uv_cache`), which no other member can
    write."""
    from harness.store.shared import uv_cache

    return uv_cache(cache_dir)


def _keep(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole (through a file of this process's own, then renamed),
    or not at all: a cache that cannot be written costs only time."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(text, encoding="utf-8")
        os.replace(temp, path)
    except OSError:
        try:
            temp.unlink()
        except OSError:
            pass  # never made (no folder to make it in), or gone


#: ``uv python list`` of every interpreter uv knows or finds (downloads and installations) for
#: any platform (:func:`harness.resolve.interpreter.list_pythons`).
PYTHON_LIST_ARGS = ("python", "list", "--output-format", "json", "--all-versions", "--all-platforms", "--all-arches")


def downloads_list_args(key: str) -> tuple[str, ...]:
    """``uv python list`` of every CPython build uv can download for one platform, ``key`` in
    uv's spelling ``<os>-<arch>-<libc>`` (``linux-x86_64-gnu``): ≈ 160 rows, where the list
    for every platform has ≈ 2,600 (1 MB of JSON, ≈ 40 ms to parse on every lock). Here, not
    in :mod:`harness.resolve.interpreter`: :mod:`harness.lock.early` starts it, light."""
    return ("python", "list", f"cpython-{key}", "--output-format", "json", "--all-versions", "--only-downloads")


def downloads_list_file(cache_dir: Path, key: str) -> Path:
    """Where :func:`downloads_list_args`'s answer for platform ``key`` is kept for this uv
    binary: the list is built into the binary, so it is keyed by the binary's path, size and
    modification time (see :func:`harness.resolve.interpreter.list_downloads`)."""
    binary = uv_bin()
    try:
        st = os.stat(binary)
        identity = f"{binary}\0{st.st_size}\0{st.st_mtime_ns}"
    except OSError:
        identity = binary
    import blake3

    digest = blake3.blake3(identity.encode()).hexdigest()[:32]
    return _own_answers(cache_dir) / "python-downloads" / f"{digest}-{key}.json"


def uv_env(
    env_extra: Mapping[str, str] | None = None,
    *,
    python_downloads: str = "never",
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment uv runs with: ``base`` (default ``os.environ``) minus what could change
    results (module doc), ``UV_PYTHON_DOWNLOADS``, then ``env_extra`` on top."""
    env = {
        key: value
        for key, value in (os.environ if base is None else base).items()
        if key not in ENV_STRIPPED and not key.startswith("PIP_") and (not key.startswith("UV_") or key in UV_ENV_KEPT)
    }
    env["UV_PYTHON_DOWNLOADS"] = python_downloads
    env["UV_NO_PROGRESS"] = "1"
    env.update(env_extra or {})
    return env


def run_uv(
    args: Sequence[str | os.PathLike[str]],
    *,
    cache_dir: Path | None = None,
    env_extra: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    python_downloads: str = "never",
    check: bool = True,
    stop: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``uv --no-config (--cache-dir DIR | --no-cache) ARGS`` and return its result.

    ``args`` is the subcommand and its arguments (``["pip", "compile", ...]``). Output is
    captured as text. With ``check`` (default), a non-zero exit raises :class:`UvError` with
    uv's stderr; a timeout or a missing binary raises :class:`HarnessError` too.
    ``python_downloads`` is ``UV_PYTHON_DOWNLOADS`` (``never``, ``manual`` or ``automatic``).
    ``stop``: called while uv runs (:func:`run_stoppable`); what it raises ends uv and is raised.
    """
    command = _command(args, cache_dir)
    shown = " ".join(["uv", *command[1:]])
    env = uv_env(env_extra, python_downloads=python_downloads)
    early = _take_prestarted(command, env, cwd) if _PRESTARTED else None
    try:
        if early is not None:
            proc = early.finish(cwd, timeout)
        elif stop is not None:
            proc = run_stoppable(command, stop, cwd=cwd, env=env, timeout=timeout)
        else:
            proc = subprocess.run(
                command,
                check=False,
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
    except subprocess.TimeoutExpired as exc:
        raise UvError(f"{shown}: timed out after {timeout} s", stderr=_text(exc.stderr)) from None
    except OSError as exc:
        raise HarnessError(f"cannot run uv ({command[0]}): {exc}") from None
    if check and proc.returncode != 0:
        stderr = proc.stderr.strip()
        tail = stderr[-_STDERR_TAIL:]
        raise UvError(
            f"{shown} failed (exit {proc.returncode}):\n{tail}", stderr=proc.stderr, returncode=proc.returncode
        )
    return proc


#: How often :func:`run_stoppable` asks whether to stop (seconds).
STOP_POLL = 0.1


def run_stoppable(
    command: Sequence[str | os.PathLike[str]],
    stop: Callable[[], None],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command)``, output captured as text, stdin closed, that calls ``stop``
    every :data:`STOP_POLL` seconds while the command runs: what ``stop`` raises (a realize
    interrupted in another thread, :meth:`harness.progress.Reporter.check`) kills the command
    and is raised at once, rather than after the command's own end. A Ctrl-C reaches only the
    processes running when it is pressed; one started by a worker thread just after would
    otherwise be waited for to its end."""
    stop()
    process = subprocess.Popen(
        [os.fspath(part) for part in command],
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            try:
                out, err = process.communicate(timeout=STOP_POLL)
                return subprocess.CompletedProcess(process.args, process.returncode, out, err)
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(process.args, timeout or 0) from None
                stop()
    except BaseException:
        process.kill()
        process.communicate()
        raise


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def _command(args: Sequence[str | os.PathLike[str]], cache_dir: Path | None) -> list[str]:
    """uv's command line: ``cache_dir`` is a home's cache folder (in a shared home, uv is
    given this member's own: :func:`harness.store.shared.uv_cache`) or another folder."""
    from harness.store.shared import uv_cache

    command = [uv_bin(), "--no-config"]
    command += ["--cache-dir", os.fspath(uv_cache(cache_dir))] if cache_dir is not None else ["--no-cache"]
    return command + [os.fspath(arg) for arg in args]


# --- runs started ahead (module doc) ----------------------------------------------------------


@dataclass
class _Prestarted:
    """A uv run started ahead: its process, its folder (``work`` is its working folder)."""

    process: subprocess.Popen[bytes]
    folder: Path

    @property
    def work(self) -> Path:
        return self.folder / "work"

    def finish(self, cwd: Path | None, timeout: float | None) -> subprocess.CompletedProcess[str]:
        """Wait for the run, put its files into ``cwd`` and return what it printed."""
        import shutil  # here, not at the top: the lock's early start imports this module light

        try:
            try:
                wait_for_exit(self.process, timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
            if cwd is not None:
                for path in self.work.iterdir():
                    if path.is_file():
                        shutil.copyfile(path, cwd / path.name)
            out = (self.folder / "stdout").read_bytes().decode(errors="replace")
            err = (self.folder / "stderr").read_bytes().decode(errors="replace")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
        return subprocess.CompletedProcess(self.process.args, self.process.returncode or 0, out, err)

    def discard(self) -> None:
        import shutil

        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def wait_for_exit(process: subprocess.Popen[bytes], timeout: float | None) -> int:
    """Wait until ``process`` exits and return its exit code; raise
    :class:`subprocess.TimeoutExpired` after ``timeout`` seconds (None: no limit).

    ``Popen.wait(timeout=...)`` polls, sleeping up to 50 ms between looks, so it notices an
    exit up to 50 ms late (25 ms on average, on the critical path of every lock). Here the
    kernel says when: a pidfd (Linux ≥ 5.3) becomes readable at the exit, and the blocking
    ``wait`` after it returns at once. Elsewhere, and for a process already reaped, this is
    ``Popen.wait``."""
    if timeout is None:
        return process.wait()
    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # not Linux, an old kernel, or already reaped
        return process.wait(timeout=timeout)
    try:
        import select

        # poll, not select: select refuses descriptors above 1023 (a busy process has them).
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        ready = poller.poll(timeout * 1000)  # milliseconds; a fraction is rounded up
    finally:
        os.close(fd)
    if not ready:
        raise subprocess.TimeoutExpired(process.args, timeout)
    return process.wait()


_Key = tuple[tuple[str, ...], tuple[tuple[str, str], ...], tuple[tuple[str, bytes], ...]]
_PRESTARTED: dict[_Key, list[_Prestarted]] = {}
_PRESTARTED_LOCK = threading.Lock()


def _folder_files(folder: Path | None) -> tuple[tuple[str, bytes], ...]:
    """Name and bytes of every file directly in ``folder`` (a run's inputs), sorted."""
    if folder is None:
        return ()
    try:
        return tuple(sorted((p.name, p.read_bytes()) for p in folder.iterdir() if p.is_file()))
    except OSError:
        return (("", b"unreadable"),)  # matches nothing started ahead


def _key(command: Sequence[str], env: Mapping[str, str], cwd: Path | None) -> _Key:
    return tuple(command), tuple(sorted(env.items())), _folder_files(cwd)


def _private_folder(prefix: str) -> Path:
    """A new folder only this user can enter, in the temporary directory: what
    ``tempfile.mkdtemp`` makes, without importing :mod:`tempfile` (≈ 4 ms before every lock's
    first uv run) where ``$TMPDIR`` (else ``/tmp``) takes it; ``tempfile`` otherwise."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for _ in range(3):
        path = os.path.join(base, f"{prefix}{os.getpid()}-{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
            return Path(path)
        except FileExistsError:
            continue
        except OSError:
            break
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix))


def prestart(
    args: Sequence[str | os.PathLike[str]],
    *,
    cache_dir: Path | None = None,
    files: Mapping[str, str] | None = None,
    python_downloads: str = "never",
) -> None:
    """Start ``uv ARGS`` now, in a new folder holding ``files``, for a later :func:`run_uv`
    call with the same arguments from a folder holding the same files (module doc). Never
    raises: a run that cannot start is simply not there to take over."""
    try:
        folder = _private_folder("harness-early-uv-")
        work = folder / "work"
        work.mkdir()
        for name, content in (files or {}).items():
            (work / name).write_text(content)
        command = _command(args, cache_dir)
        env = uv_env(python_downloads=python_downloads)
        key = _key(command, env, work)
        with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
            process = subprocess.Popen(command, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    except (OSError, HarnessError, subprocess.SubprocessError):
        return
    with _PRESTARTED_LOCK:
        if not _PRESTARTED:
            atexit.register(discard_prestarted)
        _PRESTARTED.setdefault(key, []).append(_Prestarted(process, folder))


def _take_prestarted(command: Sequence[str], env: Mapping[str, str], cwd: Path | None) -> _Prestarted | None:
    key = _key(command, env, cwd)
    with _PRESTARTED_LOCK:
        runs = _PRESTARTED.get(key)
        if not runs:
            return None
        run = runs.pop(0)
        if not runs:
            del _PRESTARTED[key]
        return run


def prestarted_count() -> int:
    """How many runs started ahead are still waiting to be taken over."""
    with _PRESTARTED_LOCK:
        return sum(len(runs) for runs in _PRESTARTED.values())


def discard_prestarted() -> None:
    """Stop and remove every run started ahead that no :func:`run_uv` took over."""
    with _PRESTARTED_LOCK:
        runs = [run for queue in _PRESTARTED.values() for run in queue]
        _PRESTARTED.clear()
    for run in runs:
        run.discard()
