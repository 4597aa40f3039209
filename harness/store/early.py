"""Start ``harness store verify --check-contents``'s hashing before the CLI is loaded.

A verify of 1 GiB hashes for ≈0.2 s; before it starts, the interpreter, click, the CLI and the
store modules load (≈0.06–0.1 s). :func:`start_hashing` (called by :mod:`harness.entry`, which
read the command line with the standard library) hashes the named store paths in one
background thread — blake3 releases the GIL and hashes on every core — while the main thread
loads the CLI. The CLI's verify (:func:`harness.store.verify.verify_store`) then asks
:func:`take_digest` for each path: it is a guess that can only save time, never change a
result.

Why a digest taken here can stand for one the CLI would take itself: the thread takes the
path's stat fingerprint (:func:`harness.store.fingerprint.take_fingerprint`: every entry's
inode, size, mode, mtime and ctime, and the device; what the launch check keeps) before and
after hashing it, and keeps the digest only when both agree; :func:`take_digest` takes it
once more and hands the digest over only when it is still the same. Any write, truncation,
chmod, rename, new or removed entry, or change of link count in between changes some entry's
ctime (the kernel sets it on every such change, and no user can set it back), its inode or
the set of entries. The one gap is a second change in the same tick of the file system's
clock: a path with an entry changed less than ``RACY_NS`` (2 s) before the first fingerprint
is not hashed here at all (git's "racily clean" entries, as the launch check does). A path
that cannot be hashed (a fifo, an unreadable file) is left to the CLI too, which then
reports it in its own words.

Light on purpose: the hashing and fingerprint modules and the few standard modules the
interpreter has loaded already at start-up (no click, no pydantic, and not even pathlib,
typing or threading: each would delay the hashing's start by milliseconds; ``_thread`` is
built in).
"""

from __future__ import annotations

import _thread
import os
import time

from harness.store.fingerprint import racy, take_fingerprint
from harness.store.hashing import check_store_name, nar_digest

TYPE_CHECKING = False  # not typing's: see the module doc
if TYPE_CHECKING:
    from harness.store.fingerprint import Entry
    from harness.store.hashing import NarDigest

    Fingerprint = tuple[int, dict[str, Entry]]


class _Early:
    """One path's early hashing: ``running`` is released once ``digest`` and ``fingerprint`` are final."""

    def __init__(self, path: str) -> None:
        self.path = path
        # Held until the digest is final (a threading.Event without importing threading).
        self.running = _thread.allocate_lock()
        self.running.acquire()
        self.fingerprint: Fingerprint | None = None
        self.digest: NarDigest | None = None

    def wait(self) -> None:
        """Return once the background thread is done with this path."""
        with self.running:
            pass


#: Paths being (or already) hashed early, by absolute path; each is taken over once.
_STARTED: dict[str, _Early] = {}


def start_hashing(home: str | os.PathLike[str], names: list[str]) -> int:
    """Start hashing, in one background thread, the store paths of ``home`` that ``harness
    store verify --check-contents NAMES`` will hash (every registered one when ``names`` is
    empty), in the order it will; returns how many. Names that are not store path names, not
    registered or gone are skipped (the CLI reports them). Never raises."""
    try:
        store = os.path.abspath(os.path.join(home, "store"))
        meta = os.path.join(store, ".meta")
        if not names:  # as Store.records: every record, sorted by name
            names = sorted(entry[: -len(".json")] for entry in os.listdir(meta) if entry.endswith(".json"))
        jobs: list[_Early] = []
        for name in dict.fromkeys(names):
            try:
                check_store_name(name)
            except ValueError:
                continue  # nothing outside the store is ever named
            path = os.path.join(store, name)
            if path in _STARTED or not os.path.isfile(os.path.join(meta, f"{name}.json")):
                continue
            if not os.path.lexists(path):
                continue
            jobs.append(_Early(path))
        if not jobs:
            return 0
        for job in jobs:
            _STARTED[job.path] = job
        # A bare thread (daemonic, as _thread's are): the process never waits for it at exit.
        _thread.start_new_thread(_hash_all, (jobs,))
        return len(jobs)
    except Exception:  # only a guess: the CLI decides and reports
        return 0


def take_digest(path: str | os.PathLike[str]) -> NarDigest | None:
    """The digest :func:`start_hashing` took of ``path``, when it took one and the path is
    still, entry for entry, what it hashed; None otherwise (the caller hashes it itself). Waits
    for the background thread to finish that path. Each digest is handed over once."""
    job = _STARTED.pop(os.path.abspath(path), None)
    if job is None:
        return None
    job.wait()
    if job.digest is None or job.fingerprint is None:
        return None
    try:
        if take_fingerprint(job.path) != job.fingerprint:
            return None
    except OSError:
        return None
    return job.digest


def _hash_all(jobs: list[_Early]) -> None:
    for job in jobs:
        try:
            _hash_one(job)
        except Exception:  # a guess: the CLI hashes this path itself, and reports what fails
            job.digest, job.fingerprint = None, None
        finally:
            job.running.release()


def _hash_one(job: _Early) -> None:
    now = time.time_ns()
    before = take_fingerprint(job.path)
    if racy(before[1], now):
        return  # changed too recently for the fingerprint to show a second change
    digest = nar_digest(job.path)
    if take_fingerprint(job.path) == before:
        job.fingerprint, job.digest = before, digest
