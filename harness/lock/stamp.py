"""The no-op re-lock: keep a lock without resolving when none of its inputs changed.

Re-locking unchanged inputs gives a byte-identical lock (DESIGN invariant 4), so once a lock
is written, harness can remember what it was made from and, next time, answer "unchanged"
without running uv, git or a hub client. After each lock that resolved, a stamp
(``$HARNESS_HOME/cache/up-to-date/lock-<project and user>.json``) records per manifest a fingerprint
of every input of that lock:

* the manifest's bytes and where it lives (``services/`` or ``benchmarks/``);
* the lock file's bytes as written (an edited, replaced or deleted lock resolves again);
* the settings that shape a lock: the bytes of the project's ``harness.toml`` and of
  ``$HARNESS_HOME/config.toml`` (indexes, hubs, git mirrors, ``[lock]`` platforms and Python
  pins), and every ``HARNESS_*``, ``UV_*``, ``HF_*`` and ``MODELSCOPE_*`` variable;
* ``lock --platform`` and this machine's architecture and C library (the default target);
* harness's version and the stat of its own modules and of the libraries that shape a lock's
  bytes (pydantic, tomlkit, packaging, blake3, and the ``uv`` package, whose binary resolves);
* the stat (device, inode, size, mtime, ctime) of every file under the manifest's ``path``
  weights; a file changed within two seconds of the fingerprint gives no stamp (a second
  write in the same clock tick could leave its stat unchanged).

With all of them the same, ``harness lock`` answers from the stamp before loading pydantic or
any model (:func:`quick_outcomes`, when every manifest of the project is as stamped: the
project is then known to validate) or, once the manifests are validated, per manifest
(:meth:`LockStamps.unchanged`). Any difference takes the full path, which decides and errors
exactly as before. ``harness lock --check`` asks :meth:`LockStamps.quick` first too: every named
lock as stamped is up to date (a lock of the same inputs would be the same bytes), answered
without loading a model; otherwise :func:`harness.lock.check.check_locks` decides.

**What is not an input, and what ``lock`` promises about it.** Upstreams are not asked:

* a manifest that names something that can move upstream gets no stamp, so it resolves on
  every lock as before and follows the move: a git source whose ``rev`` is a branch or tag
  (not a full commit), a Hugging Face weight set without a commit ``revision``, any
  ModelScope weight set not pinned to a commit (its tags are re-checked, its branches
  followed), a ``url`` weight without ``sha256``; and a lock whose interpreter is a ``host``
  one (found installed, which can change), not uv's download;
* a package index is not asked again: the full path keeps the previous pins too (uv reads
  them as preferences), but it would notice files an index added to or removed from a
  pinned version since. ``harness lock --refresh`` resolves again without moving pins;
  ``--upgrade`` and ``--upgrade-package`` resolve again and move them. All three bypass the
  stamp.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3

from harness.lock.outcome import Outcome

if TYPE_CHECKING:  # the types only: the no-op re-lock answers without loading them
    from harness.manifests.model import BenchmarkManifest, ServiceManifest
    from harness.manifests.project import Project

#: Bump when what a stamp records or means changes.
STAMP_VERSION = 2
#: Variables that may change what a lock holds (see the module doc).
_ENV_PREFIXES = ("HARNESS_", "UV_", "HF_", "MODELSCOPE_")
#: Libraries whose code shapes a lock's bytes (besides harness's own modules).
_LIBRARIES = ("pydantic", "pydantic_core", "tomlkit", "packaging", "blake3", "uv")
#: Inputs changed this recently get no stamp (see the module doc).
_RACY_NS = 2_000_000_000
_COMMIT = re.compile(r"[0-9a-f]{40}")


def _digest(data: bytes) -> str:
    # blake3, not hashlib's sha256: loading OpenSSL for hashlib costs ≈ 2.5 ms before every
    # lock's first uv run, and blake3 is loaded for the store anyway.
    return blake3.blake3(data).hexdigest()


def manifest_files(project: Project) -> dict[str, Path] | None:
    """Manifest name → file, as :func:`harness.lock.generate.load_manifests` finds them,
    from the folder listings alone; None when a name is both a service and a benchmark (the
    full path says so)."""
    found: dict[str, Path] = {}
    for folder in (project.services_dir, project.benchmarks_dir):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            if path.is_file():
                if path.stem in found:
                    return None
                found[path.stem] = path
    return found


@dataclass
class _Snapshot:
    """What :class:`LockStamps` read before a lock began, to check nothing moved meanwhile."""

    common: str
    project: str
    manifests: dict[str, str]
    #: name → (path weight roots, their fingerprint) taken once validated, before resolving.
    weights: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    #: names locked in this run whose result may be stamped.
    stampable: set[str] = field(default_factory=set)


class LockStamps:
    """The stamps of one project's locks in one home (module doc)."""

    def __init__(self, cache_dir: Path, project: Project, *, platform: str | None) -> None:
        self.project = project
        self.platform = platform
        self.cache_dir = cache_dir
        # Each user's own: in a home a lab shares, another member's stamp (made from other
        # settings, forged, or a fifo where this user's would be) decides nothing here.
        key = _digest(f"{project.root}\0{os.geteuid()}".encode())[:32]
        self.file = cache_dir / "up-to-date" / f"lock-{key}.json"

    # --- fingerprints -------------------------------------------------------------------------

    def common(self) -> str:
        """The inputs shared by every manifest's lock: settings, variables, target, code."""
        import harness

        digest = blake3.blake3(f"harness-lock-stamp-v{STAMP_VERSION}\0{harness.__version__}\0".encode())

        def add(*parts: object) -> None:
            digest.update(json.dumps(parts).encode() + b"\n")

        for label, path in (("project", self.project.root / "harness.toml"), ("home", self._home_config())):
            try:
                add(label, _digest(path.read_bytes()))
            except OSError:
                add(label, None)
        add("env", sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)))
        add("platform", self.platform)
        confstr = getattr(os, "confstr", None)
        try:
            libc = confstr("CS_GNU_LIBC_VERSION") if confstr is not None else None
        except (OSError, ValueError):
            libc = None
        add("host", sys.platform, os.uname().machine if hasattr(os, "uname") else "", libc)
        for label, st in code_stats():
            add(label, st.st_size, st.st_mtime_ns)
        return digest.hexdigest()

    def _home_config(self) -> Path:
        return self.cache_dir.parent / "config.toml"  # cache_dir is $HARNESS_HOME/cache

    def project_digest(self, files: dict[str, Path]) -> str:
        """Every manifest of the project, by name, folder and bytes."""
        digest = blake3.blake3(b"harness-lock-project-v1\0")
        for name in sorted(files):
            digest.update(f"{name}\0{self._relative(files[name])}\0".encode())
            digest.update(_digest(files[name].read_bytes()).encode())
        return digest.hexdigest()

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.project.root).as_posix()

    @staticmethod
    def weights_fingerprint(common: str, roots: list[str]) -> tuple[str, bool]:
        """``common`` and the stat of every file under the ``path`` weight roots; and whether
        one of them changed too recently to be stamped (module doc)."""
        digest = blake3.blake3(common.encode())
        now, racy = time.time_ns(), False
        for root in roots:
            for label, st in tree_stats(Path(root)):
                digest.update(
                    json.dumps([root, label, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]).encode()
                )
                racy = racy or now - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS
        return digest.hexdigest(), racy

    def _lock_digest(self, name: str) -> str | None:
        try:
            return _digest((self.project.locks_dir / f"{name}.lock.toml").read_bytes())
        except OSError:
            return None

    # --- reading ------------------------------------------------------------------------------

    def _load(self) -> dict[str, Any]:
        from harness.store.entries import read_own

        raw = read_own(self.file, limit=16 << 20)  # a link, a fifo, a huge file or another's: none
        try:
            data = json.loads(raw) if raw is not None else None
        except ValueError:
            return {}
        if (
            not isinstance(data, dict)
            or data.get("version") != STAMP_VERSION
            or not isinstance(data.get("locks"), dict)
        ):
            return {}
        return data["locks"]

    def _matches(self, entry: Any, name: str, path: Path, common: str) -> bool:
        """Whether ``entry`` holds for manifest ``name`` (at ``path``) as it is now."""
        try:
            return (
                isinstance(entry, dict)
                and entry.get("manifest") == self._relative(path)
                and entry.get("manifest-digest") == _digest(path.read_bytes())
                and entry.get("lock-digest") == self._lock_digest(name)
                and entry.get("inputs") == self.weights_fingerprint(common, list(entry.get("weights", [])))[0]
            )
        except (OSError, TypeError, ValueError):
            return False

    def quick(self, names: list[str]) -> list[Outcome] | None:
        """The outcomes of a lock of ``names`` (all when empty) that has nothing to do, decided
        without loading any model; None unless every named manifest is as stamped and the
        project's manifests are all as they were when the stamps were made (so it validates)."""
        try:
            files = manifest_files(self.project)
            if not files:
                return None
            chosen = list(dict.fromkeys(names)) if names else sorted(files)
            if any(name not in files for name in chosen):
                return None
            stamps = self._load()
            if not all(name in stamps for name in chosen):
                return None
            common, project = self.common(), self.project_digest(files)
        except (OSError, ValueError):
            return None
        outcomes = []
        for name in chosen:
            entry = stamps[name]
            if not isinstance(entry, dict) or entry.get("project") != project:
                return None
            if not self._matches(entry, name, files[name], common):
                return None
            outcomes.append(_unchanged(self.project, name, entry))
        return outcomes

    def unchanged(self, name: str, path: Path, common: str) -> Outcome | None:
        """The outcome of manifest ``name`` (validated, at ``path``) when its stamp holds."""
        entry = self._load().get(name)
        if not isinstance(entry, dict) or not self._matches(entry, name, path, common):
            return None
        return _unchanged(self.project, name, entry)

    # --- writing ------------------------------------------------------------------------------

    def snapshot(self) -> _Snapshot | None:
        """The inputs before a lock reads any manifest; None when they cannot be read."""
        try:
            files = manifest_files(self.project)
            if files is None:
                return None
            return _Snapshot(
                common=self.common(),
                project=self.project_digest(files),
                manifests={name: _digest(path.read_bytes()) for name, path in files.items()},
            )
        except (OSError, ValueError):
            return None

    def before_resolving(self, snapshot: _Snapshot, name: str, manifest: ServiceManifest | BenchmarkManifest) -> None:
        """Note the ``path`` weights of validated ``manifest`` (their stat, taken before they
        are hashed), or that it names something that moves upstream (no stamp)."""
        if moving_inputs(manifest):
            return
        root = self.project.root
        roots = []
        for weights in manifest.weights:
            if weights.provider == "path":
                location = Path(weights.location)
                roots.append(os.fspath(location if location.is_absolute() else root / location))
        try:
            fingerprint, racy = self.weights_fingerprint(snapshot.common, roots)
        except OSError:
            return
        if not racy:
            snapshot.weights[name] = (roots, fingerprint)
            snapshot.stampable.add(name)

    def save(self, snapshot: _Snapshot, locks: dict[str, Any]) -> None:
        """Record the manifests of ``locks`` (name → the lock just written or kept) that may be
        stamped, if nothing they were made from changed since ``snapshot``."""
        names = [n for n in locks if n in snapshot.stampable and _stampable_lock(locks[n])]
        if not names:
            return
        from harness.store.entries import BadEntry, write_entry

        files = manifest_files(self.project)
        try:
            if files is None or self.common() != snapshot.common or self.project_digest(files) != snapshot.project:
                return
            entries = self._load()
            for name in names:
                roots, fingerprint = snapshot.weights[name]
                if self.weights_fingerprint(snapshot.common, roots) != (fingerprint, False):
                    continue
                lock_digest = self._lock_digest(name)
                if lock_digest is None:
                    continue
                entries[name] = {
                    "manifest": self._relative(files[name]),
                    "manifest-digest": snapshot.manifests[name],
                    "lock-digest": lock_digest,
                    "weights": roots,
                    "inputs": fingerprint,
                    "project": snapshot.project,
                    "environment": locks[name].environment.store,
                }
            self.file.parent.mkdir(parents=True, exist_ok=True)
            document = json.dumps({"version": STAMP_VERSION, "locks": entries}, sort_keys=True)
            write_entry(self.file, document.encode())  # never through a planted link
        except (OSError, ValueError, BadEntry):
            pass  # no stamp: the next lock resolves


def _unchanged(project: Any, name: str, entry: dict[str, Any]) -> Outcome:
    path = project.locks_dir / f"{name}.lock.toml"
    return Outcome(name, path, changed=False, environment=entry.get("environment"), resolved=False)


def moving_inputs(manifest: ServiceManifest | BenchmarkManifest) -> list[str]:
    """What ``manifest`` (validated) names that can change upstream without any local change
    (module doc); empty when re-locking it with the same local inputs must give the same lock."""
    moving = [
        f"source {source.repo} at {source.rev}"
        for source in manifest.environment.sources
        if not _COMMIT.fullmatch(source.rev)
    ]
    for weights in manifest.weights:
        provider = weights.provider
        if provider in ("huggingface_model", "modelscope_model"):
            if weights.revision is None or not _COMMIT.fullmatch(weights.revision):
                moving.append(f"weights {weights.dir} at {weights.revision or 'the default branch'}")
        elif provider == "url" and weights.sha256 is None:
            moving.append(f"weights {weights.dir} (a url without sha256)")
    return moving


def _stampable_lock(lock: Any) -> bool:
    """A lock whose interpreters are all uv's downloads: a ``host`` one depends on what is
    installed on this machine, which the fingerprint does not cover."""
    sources: Iterable[str] = [lock.python.source, *(t.source for t in lock.targets)]
    return all(source == "uv-managed" for source in sources)


def tree_stats(root: Path) -> list[tuple[str, os.stat_result]]:
    """(relative path, stat following links) of ``root`` and everything under it, sorted: the
    part of an input fingerprint that stands for a folder of files (``path`` weights)."""
    found = [(".", os.stat(root))]
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            found.append((os.path.relpath(full, root), os.stat(full)))
    return found


@functools.lru_cache(maxsize=4)
def code_stats(libraries: tuple[str, ...] = _LIBRARIES) -> list[tuple[str, os.stat_result]]:
    """The stat of harness's own modules and of ``libraries`` (those that shape what is being
    fingerprinted: a lock's bytes, a manifest's meaning). Once per process, since the code that
    runs is the code imported when it started."""
    import importlib.util

    import harness

    found: list[tuple[str, os.stat_result]] = []
    package = Path(harness.__file__).parent
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                full = os.path.join(dirpath, name)
                found.append((os.path.relpath(full, package), os.stat(full)))
    for library in libraries:
        spec = importlib.util.find_spec(library)
        if spec is not None and spec.origin:
            found.append((library, os.stat(spec.origin)))
    return found
