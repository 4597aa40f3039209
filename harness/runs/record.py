"""Run records: ``$HARNESS_HOME/runs/<id>/`` says exactly what a run computed with.

Modelled on Harbor's trial directory::

    runs/<id>/config.json   what was asked: command, agent config and overrides, deploy, plan
    runs/<id>/lock.json     the closure: every store path with its content hash and lock
    runs/<id>/result.json   how it ended: start, end, exit status, the command's result file
    runs/<id>/logs/         the command's output and each service's log
    runs/<id>/work/         the benchmark worker's working folder, with workdir = "run"

``lock.json`` is written before the command starts and ``result.json`` when it ends (also
on failure or SIGINT), so a record exists for every run that started. Files are written
atomically; nothing here needs the network.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from harness import __version__
from harness.errors import HarnessError
from harness.store.entries import is_regular, read_regular

if TYPE_CHECKING:
    from collections.abc import Mapping

    from harness.lock.document import Lock
    from harness.runtime.launch import LaunchSpec
    from harness.runtime.session import Prepared
    from harness.store.store import Store


def runs_dir(home: Path) -> Path:
    return home / "runs"


def work_dir(run_dir: Path) -> Path:
    """The working folder of the run's benchmark worker when its manifest says
    ``workdir = "run"``: what the worker writes by relative path stays with the record.

    One per run record, so one per worker: ``harness run`` starts one worker, and each
    cluster shard is a record of its own (``shards/<I>/work/`` on its node)."""
    return run_dir / "work"


def new_run_id(now: float | None = None) -> str:
    """``20261201-034512-123-ab12``: sorts by start time to the millisecond (``latest`` and
    listings rely on that), unique across processes."""
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return f"{stamp}-{int(now * 1000) % 1000:03d}-{secrets.token_hex(2)}"


def make_record_dir(path: Path) -> Path:
    """Create the folder ``path`` of a run record, and its missing parents, writable by this
    user only (``0755`` less the umask): in a shared home the CLI's umask gives the group
    write access to what it creates, which the store and the caches need, but a member with
    write access to another's run folder could delete or replace the files of their record
    (``result.json``, the logs an audit reads) or plant some there. Folders that exist are
    left as they are (``runs/`` itself stays the shared home's sticky one). Returns ``path``."""
    missing: list[Path] = []
    folder = path
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o755)  # never group-writable, not even for a moment
        except FileExistsError:
            pass
    return path


@contextmanager
def private_umask() -> Iterator[None]:
    """For the block, create nothing the group or others may write (the umask gains
    ``022``; the one before is restored after): what a library writes into a run record for
    harness (submitit's job folders and pickles, which the head unpickles) is then as safe
    from another member of a shared home as :func:`make_record_dir`'s folders."""
    current = os.umask(0o077)  # never less strict than before, not even for a moment
    os.umask(current | 0o022)
    try:
        yield
    finally:
        os.umask(current)


@contextmanager
def new_record_dir(path: Path) -> Iterator[Path]:
    """The run record's folder ``path``, made (:func:`make_record_dir`) for the block that
    prepares the run: a folder made here goes again if the block fails (a bad manifest
    leaves no run behind). A folder of that name that this user did not make (another
    member of a shared home who guessed the run's id and made it first, to write into the
    record) is refused, not used."""
    make_record_dir(path.parent)
    try:
        path.mkdir(mode=0o755)
        made = True
    except FileExistsError:
        made = False
        refuse_foreign_dir(path)
    try:
        yield path
    except BaseException:
        if made:
            shutil.rmtree(path, ignore_errors=True)
        raise


def refuse_foreign_dir(path: Path) -> None:
    """Raise :class:`HarnessError` unless ``path`` is a folder (not a link to one) of this
    user's own."""
    from harness.store.shared import is_own_folder

    if is_own_folder(path):
        return
    info = os.lstat(path)
    what = "a link" if stat.S_ISLNK(info.st_mode) else "a folder" if stat.S_ISDIR(info.st_mode) else "a file"
    raise HarnessError(
        f"{path}: {what} of another user (uid {info.st_uid}) is already there, so this run's record cannot go there",
        hint="a member of this shared home made it first; run again (a new run gets a new id) "
        "and tell the home's owner",
    )


def open_record_file(path: Path, *, append: bool = False, fresh: bool = False) -> BinaryIO:
    """Open a run record's file for writing (or appending), created ``0644`` less the umask:
    readable by the group of a shared home, writable by this user only (its folder as
    :func:`make_record_dir` makes one). Never through a link another user planted; with
    ``fresh``, never a file that is already there (whoever made it)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    flags |= os.O_EXCL if fresh else 0
    make_record_dir(path.parent)
    fd = os.open(path, flags, 0o644)
    return os.fdopen(fd, "ab") if append else os.fdopen(fd, "wb")


def write_json(path: Path, data: object) -> None:
    """Atomic, stable JSON (sorted keys) so records diff cleanly; its folder is made as
    :func:`make_record_dir` makes one."""
    make_record_dir(path.parent)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True, ensure_ascii=False)
            handle.write("\n")
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any]:
    """One JSON object of a run record; a missing file, bad JSON or another JSON value is a
    :class:`HarnessError` naming the file."""
    from harness.store.entries import RUN_FILE_LIMIT, BadEntry, read_entry

    try:
        raw, _ = read_entry(path, limit=RUN_FILE_LIMIT)  # never a link, a fifo, a huge file
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise HarnessError(f"{path} is missing: the run record is incomplete") from None
    except BadEntry as exc:
        raise HarnessError(f"{path}: {exc.reason}: the run record is damaged") from None
    except (ValueError, RecursionError) as exc:
        raise HarnessError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{path} holds a JSON {type(data).__name__}, not an object: the run record is damaged")
    return data


@dataclass
class ClosureEntry:
    """One store path of a run's closure."""

    path: str  # store path name
    kind: str
    content: str  # content hash recorded at registration
    manifest: str  # which manifest's lock named it
    impure: str | None = None


@dataclass
class Closure:
    """Everything a run computed with, as ``lock.json`` records it."""

    entries: list[ClosureEntry] = field(default_factory=list)
    locks: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> digest, packages, ...
    project_files: dict[str, str] = field(default_factory=dict)  # service code from the checkout

    def as_json(self) -> dict[str, Any]:
        return {
            "store_paths": [e.__dict__ for e in sorted(self.entries, key=lambda e: e.path)],
            "locks": self.locks,
            "project_files": dict(sorted(self.project_files.items())),
        }


def closure_of(
    store: Store,
    locks: Mapping[str, Lock],
    lock_files: Mapping[str, Path],
    project_root: Path,
    service_files: list[Path],
    *,
    code: dict[str, str] | None = None,
) -> Closure:
    """The closure of a run from its locks (read) and the store's records.

    Every path must be registered (the runtime realizes first). ``code`` maps a manifest to
    the store path of the project files its command runs (realized by the runtime, so they
    are audited like any store path). ``service_files`` are project files used from the
    checkout itself: not store paths, so their sha256 is recorded (the caller names them as
    an impurity).
    """
    from harness.lock.storepaths import interpreter_path
    from harness.lock.variants import variant_reason
    from harness.realize.builder import lock_objects
    from harness.store.hashing import file_blake3, file_sha256

    closure = Closure()
    seen: set[str] = set()
    for name in sorted(locks):
        lock = locks[name]
        for path in lock_objects(lock):
            record = store.record(path)
            if record is None:
                raise HarnessError(f"{path} of {name} is not realized")
            if path in seen:
                continue
            seen.add(path)
            closure.entries.append(ClosureEntry(path, record.kind, record.content, name, record.impure))
        if code and name in code:
            record = store.record(code[name])
            if record is None:
                raise HarnessError(f"{code[name]} (the code {name} runs) is not realized")
            if code[name] not in seen:
                seen.add(code[name])
                closure.entries.append(ClosureEntry(code[name], record.kind, record.content, name))
        closure.locks[name] = {
            "lock": str(lock_files[name].relative_to(project_root)),
            "lock_blake3": file_blake3(lock_files[name]),
            "manifest_digest": lock.manifest_digest,
            "python": f"{lock.python.implementation} {lock.python.version} {lock.python.platform}",
            "environment": lock.environment.store,
            "interpreter": lock.python.store,
            # The lock's own interpreter when a host copy stood in for it (realize/standin.py).
            "standing_in_for": own if (own := interpreter_path(lock)) != lock.python.store else None,
            "packages": {p.name: p.version for p in lock.packages},
            "sources": {
                s.name: {
                    "repo": s.repo,
                    "commit": s.commit,
                    "tree": s.tree,
                    "install": s.install,
                    "subdirectory": s.subdirectory,
                }
                for s in lock.sources
            },
            "weights": {w.dir: {f.path: f.sha256 for f in w.files} for w in lock.weights},
            "code": (code or {}).get(name),
            "platform": lock.python.platform,
            # A lock of accelerator variants: the one this machine took, and why (lock/variants.py).
            **(
                {
                    "variant": lock.variant,
                    "variant_reason": variant_reason(lock.variant, lock.needs_cuda),
                    "variants": offered_variants(lock_files[name], lock.python.platform),
                }
                if lock.variant
                else {}
            ),
        }
    for file in service_files:
        closure.project_files[str(file.relative_to(project_root))] = "sha256:" + file_sha256(file)
    return closure


def offered_variants(lock_file: Path, platform: str) -> list[list[str | None]]:
    """The variants the lock file holds for ``platform``, each [name, CUDA it needs]: what the
    audit checks a recorded variant and its reason against once the lock file has changed."""
    from harness.lock.lockfile import read
    from harness.lock.projection import variants_of

    return [[name, cuda] for name, cuda in variants_of(read(lock_file, whole=True), platform)]


#: A store path named inside a launch: ``<store>/<32 hash chars>-<name>``.
_STORE_NAME = r"([0-9a-df-np-sv-z]{32}-[A-Za-z0-9+._-]+)"


def store_paths_named(texts: list[str], store_root: Path) -> list[str]:
    """The store path names that ``texts`` (argv, a working directory) refer to, sorted."""
    import re

    pattern = re.compile(re.escape(str(store_root)) + "/" + _STORE_NAME)
    return sorted({m.group(1) for text in texts for m in pattern.finditer(text)})


def service_launch(spec: LaunchSpec, store_root: Path) -> dict[str, Any]:
    """What a service's launch spec says that shapes the computation (``config.json``'s
    ``launch.services``): the argv after templates, the working directory, the variables
    harness sets (:data:`~harness.runtime.launch.SERVICE_VARIABLES` and the GPU), the
    store paths they name, the port and URL; and ``environment``, every variable the service
    saw (:func:`harness.runtime.launch.recorded_environment`: a secret-like one's value as
    a keyed hash only), which ``diff`` compares but for per-session variables."""
    from harness.runtime.launch import SERVICE_VARIABLES, recorded_environment
    from harness.runtime.recordkey import record_key

    keys = sorted({*SERVICE_VARIABLES, "CUDA_VISIBLE_DEVICES"})
    argv = [str(a) for a in spec.argv]
    return {
        "argv": argv,
        "cwd": str(spec.cwd),
        "env": {k: spec.env[k] for k in keys if k in spec.env},
        "store_paths": store_paths_named([*argv, str(spec.cwd)], store_root),
        "port": spec.port,
        "url": spec.url,
        "environment": recorded_environment(spec.env, record_key()),
    }


#: Variables harness sets whose values a record must never hold (and any other secret-like
#: name: :func:`harness.runtime.launch.is_secret_name`).
SECRET_VARIABLES = frozenset({"HARNESS_BROKER_TOKEN"})


def command_launch(argv: list[str], cwd: Path, env: dict[str, str], store_root: Path) -> dict[str, Any]:
    """The run's own command or benchmark worker as launched (``launch.command``): argv,
    working directory, the ``HARNESS_*`` variables harness sets (never a secret: the
    broker's token, and any variable of a secret-like name, is named, not recorded), the
    store paths named, and every variable it was given (``environment``, a secret-like
    one's value as a keyed hash only)."""
    from harness.runtime.launch import is_secret_name, recorded_environment
    from harness.runtime.recordkey import record_key

    return {
        "argv": list(argv),
        "cwd": str(cwd),
        "env": {
            k: ("(secret)" if k in SECRET_VARIABLES or is_secret_name(k) else v)
            for k, v in sorted(env.items())
            if k.startswith("HARNESS_")
        },
        "store_paths": store_paths_named([*argv, str(cwd)], store_root),
        "environment": recorded_environment(env, record_key()),
    }


def host_facts() -> dict[str, Any]:
    """The host a run ran on: name, GPUs and driver (empty without NVML)."""
    facts: dict[str, Any] = {"hostname": socket.gethostname(), "gpus": [], "driver": None}
    try:
        from harness.runtime.inventory import detect_gpus

        facts["gpus"] = [g.__dict__ for g in detect_gpus()]
    except Exception:  # an inventory problem never stops a record being written
        facts["gpus"] = []
    try:
        from harness.lock.variants import load_nvml

        pynvml = load_nvml()
        if pynvml is None:  # no NVIDIA library here (or no pynvml): no driver to name
            return facts
        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            facts["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        facts["driver"] = None
    return facts


def tool_versions(cache_dir: Path | None = None) -> dict[str, str]:
    """harness's and uv's versions; uv's kept in ``cache_dir`` when given (the home's
    ``cache``: :func:`harness.resolve.uvtool.uv_version`)."""
    from harness.resolve.uvtool import uv_version

    return {"harness": __version__, "uv": uv_version(cache_dir)}


def run_config(
    run_id: str,
    started: float,
    command: list[str],
    prepared: Prepared,
    *,
    agent: str | None,
    sets: tuple[str, ...],
) -> dict[str, Any]:
    """The ``config.json`` fields that every kind of run writes alike (a local run, a shard
    on its node, a cluster head): what was asked and what it was planned onto.

    ``command`` is the command as given; when empty, the benchmark's worker as its manifest
    writes it (templates unexpanded), so two runs of the same command compare equal even
    when a store path inside the resolved argv moved. The host's facts and the tools'
    versions are read now. The caller adds what only it knows: the deploy, the resolved
    argv and launches, the broker, the shard or the cluster.
    """
    manifest = prepared.benchmark_manifest
    return {
        "id": run_id,
        "started": started,
        "command": list(command) if command else list((manifest.worker if manifest else None) or ()),
        "project": {"root": str(prepared.project.root)},
        "agent": {"name": agent, "skills": prepared.skills} if agent else None,
        "overrides": list(sets),
        "services": sorted(prepared.specs),
        "benchmark": prepared.benchmark,
        "plan": prepared.plan.as_json(),
        "host": host_facts(),
        "versions": tool_versions(prepared.home / "cache"),
        "impurities": list(prepared.impurities),
    }


def run_folders(home: Path) -> list[Path]:
    """Every run folder, newest first by id (ids sort by start time); names starting with
    ``.`` (``runs/.trash``, where ``runs prune`` removes records from) are not runs.
    Reads the folder's listing only, no file of any run."""
    folder = runs_dir(home)
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if not p.name.startswith(".") and p.is_dir()), reverse=True)


def list_runs(home: Path, last: int | None = None) -> list[dict[str, Any]]:
    """The newest ``last`` runs (every run when None), newest first, with id, command,
    start, end and exit status. Only the records returned are read: a listing of the last
    20 of thousands of runs parses 40 small files, whatever the number of runs."""
    rows: list[dict[str, Any]] = []
    for run in run_folders(home):
        if last is not None and len(rows) >= last:
            break
        if not (run / "config.json").is_file():
            continue  # a run still preparing, or not a run record at all
        config = _maybe(run / "config.json")
        result = _maybe(run / "result.json")
        agent = config.get("agent")
        rows.append(
            {
                "id": run.name,
                "command": config.get("command"),
                "agent": agent.get("name") if isinstance(agent, dict) else None,
                "started": (result or config).get("started"),
                "ended": (result or {}).get("ended"),
                "exit_status": (result or {}).get("exit_status"),
                "score": (result or {}).get("score"),
                "pinned": is_regular(run / "pinned"),
            }
        )
    return rows


def _maybe(path: Path) -> dict[str, Any]:
    """A record's JSON object, or {} for anything else there (missing, a link, a fifo, not
    an object)."""
    raw = read_regular(path)
    try:
        data = json.loads(raw.decode("utf-8")) if raw is not None else {}
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def find_run(home: Path, run_id: str) -> Path:
    """A run folder by id, unique id prefix, or ``latest``: this user's newest run (in a
    shared home another member's run, or a folder named for a later date, is never it)."""
    runs = run_folders(home)[::-1]
    if run_id == "latest":
        from harness.store.shared import is_own_folder

        own = [run for run in runs if is_own_folder(run)]
        if not own:
            raise HarnessError(
                "no runs of yours recorded yet" if runs else "no runs recorded yet",
                hint="name another member's run by its id (`harness runs` lists them)" if runs else None,
            )
        return own[-1]
    matches = [p for p in runs if p.name == run_id] or [p for p in runs if p.name.startswith(run_id)]
    if len(matches) != 1:
        raise HarnessError(
            f"no run {run_id!r}"
            if not matches
            else f"run id {run_id!r} is ambiguous: {', '.join(p.name for p in matches)}"
        )
    return matches[0]
