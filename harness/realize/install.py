"""Install on first use: realize whatever a set of manifests needs and is missing.

This is the one entry point the CLI (``realize``, ``install``) and the runtime use. Locks
come from ``locks/``; a stale lock is refused (the manifest says something the lock does
not), a missing one is locked first when ``lock_missing`` is set.

**No-op fast path.** Deciding that there is nothing to do needs the manifests validated
(pydantic), their digests compared with the locks', ``path`` weights re-hashed and every
store path checked: most of a second, mostly imports. After a realize that found or left
everything in place, a small stamp (``$HARNESS_HOME/cache/up-to-date/<key>.json``) records a
fingerprint of every input of that decision (each user's own stamp: in a shared home, one
that another member wrote, or a link, is never read): the bytes of every manifest of the project and
of the locks realized, the stat (device, inode, size, mtime, ctime) of every file under
their ``path`` weights, and the stat of harness's own code and of pydantic (which define
what a manifest means). The next realize of the same names in the same project that finds
the same fingerprint and every store path still registered reports "up to date" without
loading a model or a resolver; any difference takes the full path, which decides (and
errors) exactly as before. Settings are not an input: they only say where missing things
are fetched from. The one exception: while a host interpreter stands in for a lock's own
(``harness/realize/standin.py``), the stamp also holds a digest of the binary caches and the
interpreter download settings, so configuring a cache or a download list makes the next
realize try again for the lock's own interpreter. Files changed within two seconds of the fingerprint do not get a stamp
(a second write in the same clock tick could leave their stat unchanged).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError, InputError

if TYPE_CHECKING:  # the models load pydantic: the no-op path loads none of them
    from harness.config import Settings
    from harness.lock.document import Lock
    from harness.manifests.deploy import Deploy
    from harness.manifests.project import Project, ProjectState
    from harness.realize.builder import Report
    from harness.realize.fetch import LocalWeights

#: Bump when what the stamp records or means changes.
_STAMP_VERSION = 4  # 3: a wheel built from an sdist is a store path of its own; 4: objects: the runtime closure
#: The variables that say where a lock's interpreter may come from (see _Stamp._sources).
_SOURCE_VARIABLES = (
    "HARNESS_SUBSTITUTERS",
    "HARNESS_TRUSTED_KEYS",
    "HARNESS_PYTHON_DOWNLOADS_JSON_URL",
    "HARNESS_PYTHON_INSTALL_MIRROR",
    "UV_PYTHON_DOWNLOADS_JSON_URL",
    "UV_PYTHON_INSTALL_MIRROR",
    "UV_PYTHON_DOWNLOADS",
)
#: Inputs changed this recently get no stamp (see the module doc).
_RACY_NS = 2_000_000_000


def realize_names(
    state: ProjectState,
    names: list[str],
    *,
    offline: bool,
    jobs: int,
    lock_missing: bool,
    show_progress: bool = True,
    fail_fast: bool = False,
    refresh: bool = False,
) -> list[Report]:
    """Realize the named manifests (all locked ones when none named); returns reports.
    ``refresh`` takes the full path and asks uv for a lock's interpreter even where a failed
    download is remembered (``harness/realize/unreachable.py``)."""
    project = state.project()
    home: Path = state.home
    if not names:
        names = sorted(p.name[: -len(".lock.toml")] for p in project.locks_dir.glob("*.lock.toml"))
        if not names:
            raise HarnessError("no locks to realize", hint="run `harness lock` first")
    stamp = _Stamp(home, project, names, getattr(state, "deploy_path", None))
    quick = None if refresh else stamp.reports()
    if quick is not None:
        return quick
    reports = _realize_names(
        state,
        project,
        home,
        names,
        offline=offline,
        jobs=jobs,
        lock_missing=lock_missing,
        show_progress=show_progress,
        fail_fast=fail_fast,
        refresh=refresh,
    )
    stamp.remember(reports)
    return reports


def _realize_names(
    state: ProjectState,
    project: Project,
    home: Path,
    names: list[str],
    *,
    offline: bool,
    jobs: int,
    lock_missing: bool,
    show_progress: bool,
    fail_fast: bool = False,
    refresh: bool = False,
) -> list[Report]:
    from harness.config import load_settings
    from harness.lock.check import check_locks
    from harness.lock.lockfile import lock_path, read

    settings = load_settings(home, project.root)
    hash_cache = home / "cache" / "sha256-stat.json"
    stale = {s.name: s for s in check_locks(project, names, settings=settings, hash_cache=hash_cache)}
    missing_locks = [n for n, s in stale.items() if s.reason == "missing"]
    if missing_locks and lock_missing:
        if offline:
            raise HarnessError(f"offline, and {', '.join(missing_locks)} has no lock")
        from harness.lock.generate import LockOptions, lock_project

        outcomes = lock_project(
            project, missing_locks, settings=settings, cache_dir=home / "cache", options=LockOptions(jobs=jobs)
        )
        failed = [o.error for o in outcomes if o.error]
        if failed:
            raise HarnessError("\n".join(e or "" for e in failed))
        for name in missing_locks:
            stale.pop(name)
    if stale:
        lines = [f"{s.name}: lock {s.reason}" for s in stale.values()]
        # A lock that does not read (hand-edited, from a newer harness) is bad input: exit 2.
        error = InputError if any(s.reason.startswith("unreadable") for s in stale.values()) else HarnessError
        raise error("\n".join(lines), hint="run `harness lock` to bring the locks up to date")
    locks = [read(lock_path(project.locks_dir, name)) for name in names]  # this machine's platform
    _check_platforms(locks, project)
    deploy_path = getattr(state, "deploy_path", None)
    deploy = project.load_deploy(deploy_path) if deploy_path is not None else None
    substituters, trusted, local_weights = deploy_inputs(settings, deploy, deploy_path)
    return realize(
        home,
        project.root,
        locks,
        settings=settings,
        offline=offline,
        jobs=jobs,
        show_progress=show_progress,
        substituters=tuple(substituters),
        trusted_keys=tuple(trusted),
        fail_fast=fail_fast,
        local_weights=local_weights,
        refresh=refresh,
    )


def deploy_inputs(
    settings: Settings, deploy: Deploy | None, deploy_path: Path | None
) -> tuple[tuple[str, ...], tuple[str, ...], LocalWeights | None]:
    """What a realize takes from a machine's deploy (None: nothing): the settings' binary
    caches and trusted keys with the deploy's added, and its weights folder
    (:func:`deploy_local_weights`)."""
    substituters, trusted = list(settings.substituters), list(settings.trusted_keys)
    if deploy is None or deploy_path is None:
        return tuple(substituters), tuple(trusted), None
    substituters += [u for u in deploy.substituters if u not in substituters]
    trusted += [k for k in deploy.trusted_keys if k not in trusted]
    return tuple(substituters), tuple(trusted), deploy_local_weights(deploy, deploy_path)


def deploy_local_weights(deploy: Deploy, deploy_path: Path) -> LocalWeights | None:
    """The deploy's ``weights`` folder as a :class:`~harness.realize.fetch.LocalWeights`
    (errors name ``<deploy file>: weights``), or None when the deploy does not set it."""
    from harness.manifests.loading import display_path
    from harness.realize.fetch import LocalWeights

    folder = deploy.weights_folder(deploy_path)
    return None if folder is None else LocalWeights(folder, f"{display_path(deploy_path)}: weights")


def realize(
    home: Path,
    project_root: Path,
    locks: list[Lock],
    *,
    settings: Settings,
    offline: bool,
    jobs: int,
    show_progress: bool = True,
    substituters: tuple[str, ...] | None = None,
    trusted_keys: tuple[str, ...] | None = None,
    fail_fast: bool = False,
    local_weights: LocalWeights | None = None,
    refresh: bool = False,
) -> list[Report]:
    """Realize already-read locks into ``home``'s store, asking binary caches first
    (``substituters``; default: the settings' ``[cache]``), and taking weight files from
    ``local_weights`` (a deploy's folder, :class:`~harness.realize.fetch.LocalWeights`)
    where it holds them. ``refresh``: ask uv for the interpreters even where a failed
    download is remembered (``harness/realize/unreachable.py``)."""
    from harness.realize.builder import Context, realize_locks
    from harness.store.store import Store

    ctx = Context(
        store=Store.in_home(home),
        project_root=project_root,
        settings=settings,
        cache_dir=home / "cache",
        offline=offline,
        jobs=jobs,
        show_progress=show_progress,
        substituters=tuple(settings.substituters) if substituters is None else substituters,
        trusted_keys=tuple(settings.trusted_keys) if trusted_keys is None else trusted_keys,
        local_weights=local_weights,
        refresh=refresh,
    )
    return realize_locks(ctx, locks, fail_fast=fail_fast)


def _check_platforms(locks: list[Lock], project: Project) -> None:
    """A clear error, before anything is fetched, for a lock of one platform this machine
    does not run (a lock of several has already been narrowed to this machine's by ``read``)."""
    from harness.lock.lockfile import lock_path
    from harness.lock.platforms import fits_host, no_platform_error

    for lock in locks:
        if not fits_host(lock.python.platform):
            raise no_platform_error(lock, lock_path(project.locks_dir, lock.name))


class _Stamp:
    """The no-op fast path's record for one (home, project, names); see the module doc."""

    def __init__(self, home: Path, project: Project, names: list[str], deploy_path: Path | None = None) -> None:
        self.home = home
        self.project = project
        self.deploy_path = deploy_path
        self.names = sorted(set(names))
        self._racy = False
        # Each user's own: in a home a lab shares, another member's stamp (forged, or made with
        # another variant forced) decides nothing for this user.
        key = hashlib.sha256(json.dumps([str(project.root), self.names, os.geteuid()]).encode()).hexdigest()[:32]
        self.file = home / "cache" / "up-to-date" / f"{key}.json"
        try:
            self.fingerprint: str | None = self._fingerprint()
        except (OSError, ValueError, KeyError, TypeError, RecursionError, HarnessError):
            # Whatever is wrong with a lock, the full path says it properly (file and key).
            self.fingerprint = None

    def reports(self) -> list[Report] | None:
        """The reports of a realize with nothing to do, or None when that is not certain."""
        if self.fingerprint is None:
            return None
        from harness.store.entries import read_own

        raw = read_own(self.file, limit=16 << 20)  # a link, a fifo, a huge file or another member's: no stamp
        try:
            data = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("fingerprint") != self.fingerprint:
            return None
        if any(entry.get("standin") for entry in data["locks"]) and data.get("sources") != self._sources():
            return None  # a host copy stands in, and a cache or download may provide the real one now
        from harness.realize.builder import Report
        from harness.store.gc import register_project
        from harness.store.store import Store

        from harness.store.roots import hold

        store = Store.in_home(self.home)
        # Rooted before they are checked, so what is found registered stays registered.
        hold(store, [name for entry in data["locks"] for name in entry["objects"]])
        reports = []
        for entry in data["locks"]:
            objects = list(entry["objects"])
            if not all(store.is_registered(name) for name in objects):
                return None  # deleted or collected since: the full path rebuilds it
            report = Report(entry["name"], entry["environment"], present=sorted(objects))
            report.impure = list(entry.get("notes", []))
            reports.append(report)
        register_project(store, self.project.root, {e["name"]: e.get("recorded", e["objects"]) for e in data["locks"]})
        return reports

    def remember(self, reports: list[Report]) -> None:
        """Record that the fingerprint taken before the full path left nothing to do."""
        if self.fingerprint is None or self._racy:
            return
        from harness.lock.lockfile import lock_path, read
        from harness.lock.objects import all_objects, lock_objects
        from harness.realize.standin import realized_lock
        from harness.store.store import Store

        store = Store.in_home(self.home)
        entries: list[dict[str, Any]] = []
        for report in reports:
            own = read(lock_path(self.project.locks_dir, report.name))
            lock = realized_lock(store, own)
            if lock.environment.store != report.environment:
                return  # the lock changed while realizing: no stamp
            # A host interpreter standing in is part of what is up to date; its note is
            # repeated by every quick report, so a realize never hides it.
            entries.append(
                {
                    "name": report.name,
                    "environment": report.environment,
                    "python": lock.python.store,
                    "objects": lock_objects(lock),
                    # What the project's root records: the files the environment was built
                    # from too, where the store keeps them (`[gc] keep-wheel-files`).
                    "recorded": [name for name in all_objects(lock) if store.is_registered(name)],
                    "notes": list(report.impure),
                    "standin": lock is not own,
                }
            )
        if sorted(e["name"] for e in entries) != self.names:
            return
        data = {
            "version": _STAMP_VERSION,
            "fingerprint": self.fingerprint,
            "locks": entries,
            "sources": self._sources(),
        }
        from harness.store.entries import BadEntry, write_entry

        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            write_entry(self.file, json.dumps(data, sort_keys=True).encode())  # never through a planted link
        except (OSError, BadEntry):
            pass  # no stamp: the next no-op takes the full path

    def _sources(self) -> str:
        """A digest of what decides whether a lock's own interpreter can be had instead of a
        host copy standing in: the settings files and the deploy (binary caches, trusted keys,
        interpreter downloads), and the variables that override them or ``UV_PYTHON_DOWNLOADS``.
        Any change sends a realize whose stand-in is otherwise up to date down the full path,
        which tries again. Raw bytes, not parsed settings: the fast path loads no models."""
        digest = hashlib.sha256(b"harness-standin-sources-v1\0")
        for path in (self.project.root / "harness.toml", self.home / "config.toml", self.deploy_path):
            try:
                data = path.read_bytes() if path is not None else b""
            except OSError:
                data = b""
            digest.update(hashlib.sha256(data).digest())
        for key in _SOURCE_VARIABLES:
            digest.update(f"{key}={os.environ.get(key, '')}\0".encode())
        return digest.hexdigest()

    def _fingerprint(self) -> str | None:
        """A digest of every input of the "nothing to do" decision; None when a lock is missing."""
        from harness.manifests.tomlfile import loads_bounded

        import harness
        from harness.lock.stamp import code_stats, tree_stats  # light: no pydantic, no resolver

        digest = hashlib.sha256(f"harness-up-to-date-v{_STAMP_VERSION}\0{harness.__version__}\0".encode())
        self._racy = False

        def add(*parts: object) -> None:
            digest.update(json.dumps(parts).encode() + b"\n")

        def add_stat(label: str, st: os.stat_result) -> None:
            add(label, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < _RACY_NS:
                self._racy = True

        root = self.project.root
        for folder in (self.project.services_dir, self.project.benchmarks_dir):
            if folder.is_dir():
                for path in sorted(folder.glob("*.toml")):
                    add("manifest", path.name, hashlib.sha256(path.read_bytes()).hexdigest())
        add("names", self.names)
        for name in self.names:
            path = self.project.locks_dir / f"{name}.lock.toml"
            if not path.is_file():
                return None
            data = path.read_bytes()
            add("lock", name, hashlib.sha256(data).hexdigest())
            if b"\nvariant = " in data:  # which variant this machine takes is an input too
                from harness.lock.variants import driver_cuda, forced_variant

                add("variant", name, forced_variant(), driver_cuda())
            for weights in loads_bounded(data.decode("utf-8"), str(path)).get("weights", []):
                if weights.get("provider") == "path":
                    for label, st in tree_stats(
                        Path(weights["repo"]) if os.path.isabs(weights["repo"]) else root / weights["repo"]
                    ):
                        add_stat(f"weights {weights['dir']}/{label}", st)
        for label, st in code_stats(("pydantic", "pydantic_core")):  # what gives a manifest its meaning
            add(label, st.st_size, st.st_mtime_ns)
        return digest.hexdigest()
