"""Compiling ``.py`` files to pycs: reproducibly, over several processes, reusing the store's.

:func:`compile_tree` writes *unchecked-hash* pycs (PEP 552) for every ``.py`` file under some
folders of a tree (an interpreter's standard library, an environment's ``site-packages``).
The store fixes every mtime and makes files read-only, so timestamp pycs would be stale
forever; hash-based ones that are not checked against their source are what a read-only
tree wants.

**What a pyc's bytes depend on.** The interpreter, the source bytes, the file name recorded
in the code objects and the optimization level; *and* what else is alive in the compiling
process, because marshal flags a string for back-reference when its reference count is
above one (an interned name that an imported module also uses), and a frozenset's order
follows string hashes. harness therefore compiles in worker processes that all run one
fixed script (:data:`WORKER`: the same imports, ``-S -B``, ``PYTHONHASHSEED=0``, a clean
environment, the tree's root as working directory), hands them file names *relative to the
root* (so pycs do not name the build location; importlib puts the real path back at import),
and compiles each file from the same state:

* CPython 3.11 and 3.13: in a loop. A compile leaves nothing alive behind it that marshal
  would see (the names it interned die with its code objects; one-character strings and
  identifiers the runtime keeps are static), so a file's pyc does not depend on which files
  the worker compiled before. Checked on 3.11.7 and 3.13.0 over the standard library and
  sympy (2,500 files): one worker in walk order, two workers in a shuffled order, and the
  former single-process ``compileall`` give the same bytes.
* every other version: in a child forked from the pristine worker for every file. On 3.10
  and earlier, identifiers the runtime creates lazily and keeps (``_Py_IDENTIFIER``) and the
  latin-1 one-character cache outlive a compile, and a loop gives bytes that depend on the
  order (3.10.13: json, mpmath and pyparsing); on 3.12, whose interned strings are immortal,
  one file of the 2,500 (``ftplib``) did. Forking costs about a millisecond a file, but every
  file is compiled from the same state; a version not checked is treated the same way.

So the bytes of a pyc are a function of (interpreter, source bytes, relative name,
optimization), whatever the number of workers, the order or the chunking, which is what
makes two things sound: compiling in parallel (``jobs`` workers; the files are handed out
largest first, one at a time, to whichever worker is free) and **reusing** a pyc the store
already holds for the same key (:class:`harness.store.bytecode.BytecodeIndex`): each source
file is hashed, looked up, and its pyc, read back and checked (pool digest, pyc header:
unchecked-hash flags, the source hash when the pyc's magic is this interpreter's), is hard
linked from the pool (copied where a link cannot be made); only the rest are compiled.
:attr:`CompileReport.fresh` lists what was compiled, for the caller to record once the tree
is registered.

A file that does not compile (a syntax error: test data, a package's Python 2 leftovers) is
skipped, as pip, uv and ``compileall`` do. Symlinked folders are not followed, ``__pycache__``
folders are not entered (as ``compileall``).
"""

from __future__ import annotations

import collections
import importlib.util
import os
import queue
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError
from harness.progress import Stopped

#: The compile worker (runs on CPython 3.8+). It reads one file name per line (bytes, as
#: the file system spells it) and answers b"1" (compiled) or b"0" (does not compile) per
#: line. Its names are ones the imported modules already hold, so that the set of live
#: interned strings is the standard library's (and the bytes equal those of the former
#: single-process ``compileall`` run); changing it can change pyc bytes: bump
#: ``harness.store.bytecode.SCHEME`` then.
WORKER = r"""
import compileall, py_compile, sys
def main(path=None, fork=sys.version_info[:2] not in ((3, 11), (3, 13)) and hasattr(compileall.os, "fork"),
         os=compileall.os):
    read, write, flush = sys.stdin.buffer.readline, sys.stdout.buffer.write, sys.stdout.flush
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
    while True:
        path = read()
        if not path:
            return
        path = os.fsdecode(path[:-1])
        if fork:
            pid = os.fork()
            if pid == 0:
                try:
                    py_compile.compile(path, doraise=True, invalidation_mode=mode)
                except BaseException:
                    os._exit(1)
                os._exit(0)
            ok = os.waitpid(pid, 0)[1] == 0
        else:
            try:
                py_compile.compile(path, doraise=True, invalidation_mode=mode)
                ok = True
            except Exception:
                ok = False
        path = None
        write(b"1\n" if ok else b"0\n")
        flush()
main()
"""

#: Files handed to a worker ahead of its answers (:func:`_run_workers`).
_IN_FLIGHT = 2

#: pyc header flags of an unchecked hash-based pyc (PEP 552: hash-based, do not check source).
_UNCHECKED_HASH = (1).to_bytes(4, "little")


@dataclass
class CompileReport:
    """What :func:`compile_tree` did. ``fresh`` holds ``(index key, pyc name relative to the
    root)`` of each pyc compiled here (empty without an index), for :func:`fresh_entries` once
    the tree is sealed; ``failed`` the relative names that did not compile."""

    total: int = 0
    reused: int = 0
    compiled: int = 0
    failed: list[str] = field(default_factory=list)
    fresh: list[tuple[str, str]] = field(default_factory=list)


class ReuseFrom:
    """Where :func:`compile_tree` looks pycs up: a store's index for one interpreter."""

    def __init__(self, store_root: Path, interpreter: str) -> None:
        from harness.store.bytecode import BytecodeIndex

        self.index = BytecodeIndex(store_root, interpreter)


def sources(root: Path, folders: Iterable[Path]) -> list[str]:
    """The ``.py`` files under ``folders`` as names relative to ``root``, in ``compileall``'s
    order (sorted per folder, depth first), spelled as ``compileall`` spells them."""
    found: list[str] = []

    def walk(relative: str) -> None:
        # scandir's entry types come with the listing: no stat per file but for symlinks.
        try:
            with os.scandir(os.path.join(root, relative)) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            return
        for entry in entries:
            name = entry.name
            if name == "__pycache__":
                continue
            full = os.path.join(relative, name)
            if entry.is_dir():
                if not entry.is_symlink():
                    walk(full)
            elif name.endswith(".py") and "\n" not in name and entry.is_file():
                found.append(full)

    for folder in folders:
        if folder.is_dir():
            walk(os.fspath(folder.relative_to(root)))
    return found


def compile_tree(
    python: Path,
    folders: Iterable[Path],
    *,
    root: Path,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    reuse: ReuseFrom | None = None,
) -> CompileReport:
    """Write an unchecked-hash pyc beside every ``.py`` under ``folders`` (inside ``root``)
    with interpreter ``python`` (module doc); returns what was reused and compiled.

    ``jobs`` bounds the worker processes (default: the CPUs this process may use); the bytes
    do not depend on it. ``progress(done, total)`` is called (never from two
    threads at once) after the lookups and as files complete. ``reuse`` takes pycs from the
    store instead of compiling them. Raises :class:`HarnessError` when a worker fails (not
    when a file has a syntax error: that file is skipped).
    """
    names = sources(root, folders)
    report = CompileReport(total=len(names))
    if not names:
        return report
    tag = cache_tag(python)
    todo = names
    keys: dict[str, str] = {}
    if reuse is not None:
        todo = []
        for name, (placed, key) in zip(names, _place_all(reuse, root, names, tag, jobs), strict=True):
            if placed:
                report.reused += 1
                continue
            todo.append(name)
            if key is not None:
                keys[name] = key
    lock = threading.Lock()
    done = report.reused
    stopped: list[Stopped] = []

    def tick(name: str, ok: bool) -> bool:
        """Count one file; False once ``progress`` said the work is to stop (:class:`Stopped`,
        raised again here when every worker has let go)."""
        nonlocal done
        with lock:
            done += 1
            if ok:
                report.compiled += 1
            else:
                report.failed.append(name)
            if progress is not None and not stopped:
                try:
                    progress(done, report.total)
                except Stopped as exc:
                    stopped.append(exc)
            return not stopped

    if progress is not None:
        progress(done, report.total)
    if todo:
        _run_workers(python, root, todo, jobs, tick)
    if stopped:
        raise stopped[0]
    report.failed.sort()
    if keys:
        failed = set(report.failed)
        report.fresh = [(keys[name], pyc_name(name, tag)) for name in todo if name in keys and name not in failed]
    return report


def fresh_entries(report: CompileReport, digests: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(index key, pyc blake3)`` of each pyc ``report`` compiled, its digest taken from
    ``digests`` (relative name -> blake3: what the store's seal read for the pool,
    ``Store.add(digests=…)``), so no pyc is read again to be recorded; one the seal did not
    list is left out (the index is a hint: that file is compiled again next time)."""
    return [(key, digests[name]) for key, name in report.fresh if name in digests]


def cache_tag(python: Path) -> str:
    """The interpreter's ``sys.implementation.cache_tag``: from its name (``python3.11``, as
    harness's interpreters and environments spell it), else by asking it."""
    import re

    match = re.fullmatch(r"python(\d+)\.(\d+)", python.name)
    if match:
        return f"cpython-{match.group(1)}{match.group(2)}"
    code = "import sys; print(sys.implementation.cache_tag)"
    try:
        proc = subprocess.run([os.fspath(python), "-S", "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessError(f"{python} does not start: {exc}") from None
    if proc.returncode != 0 or not proc.stdout.strip():
        raise HarnessError(f"{python} does not start:\n{proc.stderr.strip()[-3000:]}")
    return proc.stdout.strip()


def pyc_name(source: str, tag: str) -> str:
    """Where ``importlib`` looks for the pyc of ``source`` (``cache_from_source``, level 0)."""
    head, tail = os.path.split(source)
    return os.path.join(head, "__pycache__", f"{tail[:-3]}.{tag}.pyc")


def _place_all(
    reuse: ReuseFrom, root: Path, names: list[str], tag: str, jobs: int | None
) -> list[tuple[bool, str | None]]:
    """:func:`_place` for every name, on a few threads (reading, hashing and linking thousands
    of small files is mostly system calls, which release the GIL); results in ``names`` order."""
    from concurrent.futures import ThreadPoolExecutor

    reuse.index.load()  # once, before the threads
    chunks = [names[i : i + 128] for i in range(0, len(names), 128)]

    def place(chunk: list[str]) -> list[tuple[bool, str | None]]:
        return [_place(reuse, root, name, tag) for name in chunk]

    with ThreadPoolExecutor(max_workers=max(1, min(4, jobs or cpu_count(), len(chunks)))) as pool:
        return [result for chunk in pool.map(place, chunks) for result in chunk]


def _place(reuse: ReuseFrom, root: Path, name: str, tag: str) -> tuple[bool, str | None]:
    """Put the store's pyc of ``name`` in place: ``(True, key)`` when done, else ``(False,
    the file's index key)`` to record what the workers compile (None: unreadable source)."""
    import blake3

    from harness.store.bytecode import entry_key

    try:
        with open(os.path.join(root, name), "rb") as handle:
            source = handle.read()
    except OSError:
        return False, None
    key = entry_key(reuse.index.interpreter, name, blake3.blake3(source).hexdigest())
    pyc = reuse.index.lookup(key)
    if pyc is None:
        return False, key
    data = reuse.index.read(pyc)
    if data is None or not _header_fits(data, source, tag):
        return False, key
    target = root / pyc_name(name, tag)
    try:
        if not target.parent.is_dir():
            target.parent.mkdir(exist_ok=True)
        if os.path.lexists(target):
            os.unlink(target)  # a wheel's own pyc: ours replaces it, as a compile would
        try:
            os.link(reuse.index.links / pyc, target)
        except OSError:  # another file system, too many links, another member's file
            _write_new(target, data)
    except OSError:
        return False, key
    return True, key


def _header_fits(data: bytes, source: bytes, tag: str) -> bool:
    """Whether ``data`` is an unchecked-hash pyc of ``source``: the flags always; for an
    interpreter of harness's own version also the magic number and the source hash (which
    ``_imp.source_hash`` computes with a key and algorithm of that version)."""
    import sys

    if len(data) < 16 or data[4:8] != _UNCHECKED_HASH:
        return False
    if tag != sys.implementation.cache_tag:
        return True
    return data[:4] == importlib.util.MAGIC_NUMBER and data[8:16] == importlib.util.source_hash(source)


def _write_new(target: Path, data: bytes) -> None:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def cpu_count() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _run_workers(
    python: Path, root: Path, names: list[str], jobs: int | None, tick: Callable[[str, bool], bool]
) -> None:
    """Compile ``names`` on up to ``jobs`` workers, handing out the largest files first;
    ``tick`` counts each file, and every worker stops once it says False."""

    def size(name: str) -> int:
        try:
            return os.stat(os.path.join(root, name)).st_size
        except OSError:
            return 0

    work: queue.SimpleQueue[str] = queue.SimpleQueue()
    for name in sorted(names, key=lambda n: (-size(n), n)):
        work.put(name)
    # A worker starts in tens of milliseconds: not worth it for a handful of files.
    count = max(1, min(jobs or cpu_count(), (len(names) + 15) // 16))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH")
    }
    env["PYTHONHASHSEED"] = "0"
    errors: list[str] = []

    def serve() -> None:
        with tempfile.TemporaryFile() as stderr:
            try:
                proc = subprocess.Popen(
                    [os.fspath(python), "-S", "-B", "-c", WORKER],
                    cwd=root,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    env=env,
                )
            except OSError as exc:
                errors.append(f"{python} does not start: {exc}")
                return
            assert proc.stdin is not None and proc.stdout is not None
            sent: collections.deque[str] = collections.deque()
            try:
                while not errors:
                    # One file queued behind the one being compiled: the worker never waits
                    # for this thread between two files.
                    while len(sent) < _IN_FLIGHT:
                        try:
                            name = work.get_nowait()
                        except queue.Empty:
                            break
                        proc.stdin.write(os.fsencode(name) + b"\n")
                        sent.append(name)
                    if not sent:
                        break
                    proc.stdin.flush()
                    name = sent.popleft()
                    answer = proc.stdout.readline()
                    if answer not in (b"1\n", b"0\n"):
                        raise OSError(f"no answer for {name}")
                    if not tick(name, answer == b"1\n"):
                        break
            except OSError as exc:
                proc.kill()
                proc.wait()
                stderr.seek(0)
                tail = stderr.read().decode("utf-8", "replace").strip()[-3000:]
                errors.append(f"{exc}{':' if tail else ''}\n{tail}".rstrip())
                return
            finally:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            if proc.wait() != 0:
                errors.append(f"a compile worker exited with status {proc.returncode}")

    threads = [threading.Thread(target=serve, name=f"compile-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise HarnessError(f"compiling bytecode with {python} failed: {errors[0]}")
