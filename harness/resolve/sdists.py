"""What the sdists a lock installs need to build: their backends' build requirements.

A package published only as an sdist (``docopt``, ``iopath``, an old release without wheels
for the target) is built at realize time, offline, in a build environment made of the lock's
``build_packages`` alone (uv's ``--find-links`` of their store files, hash-checked). So the
lock must name what each sdist's build backend needs: its static ``build-system.requires``
(PEP 518; PEP 517's ``setuptools>=40.8.0`` for a tree without a ``[build-system]``) and the
dynamic requirements its backend asks for (``get_requires_for_build_wheel``: setuptools'
legacy backend asks for ``wheel``), exactly as for git sources
(:func:`harness.resolve.python.build_requirements`,
:func:`~harness.resolve.python.dynamic_build_requirements`).

To read them the sdist is fetched (from the index the resolution named, checked against the
size and sha256 it published, into the download cache realize reads, so realize does not
fetch it again), read once, checked again and copied into a scratch folder (another member of a
shared home could change the download after its check), and unpacked there; the backend's answer is cached per sdist
hash. Nothing here decides the pins: the caller resolves these requirements with the git
sources' build requirements into the lock's build packages.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import threading
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from harness.errors import HarnessError

if TYPE_CHECKING:
    from harness.config import Settings
    from harness.resolve.pins import DistFile, Package


@dataclass(frozen=True)
class SdistOptions:
    """How the sdists of one environment are read: its ``indexes`` (for a backend's throw-away
    environment), the ``settings``, the download and answer cache ``cache_dir``, a ``scratch``
    folder to unpack in, ``offline``, and ``on_static``, handed each sdist's static
    requirements as soon as they are read, before its backend is asked for the dynamic ones
    (the caller may start resolving them)."""

    indexes: tuple[str, ...]
    settings: Settings
    cache_dir: Path
    scratch: Path
    offline: bool = False
    on_static: Callable[[list[str]], None] | None = None


def sdist_build_requirements(packages: Sequence[Package], options: SdistOptions) -> list[str]:
    """The build requirements (static and dynamic) of every package of ``packages`` that
    installs from its sdist (no wheel fits the target), sorted and without repeats; [] when
    none does. A fetch, unpack or backend failure is a :class:`HarnessError` naming the package."""
    found: set[str] = set()
    for package in packages:
        if package.wheels or package.sdist is None:
            continue
        try:
            found.update(_one_sdist(package, package.sdist, options))
        except HarnessError as exc:
            raise HarnessError(
                f"{package.name} {package.version} (sdist {package.sdist.file}): {exc.message}", hint=exc.hint
            ) from None
    return sorted(found)


def _one_sdist(package: Package, sdist: DistFile, options: SdistOptions) -> list[str]:
    key = hashlib.sha256(json.dumps(["harness-sdist-build-requires-v1", sdist.sha256]).encode()).hexdigest()[:40]
    # One thread per sdist at a time: the platforms of a lock, resolved side by side, often
    # install the same sdist; the second waits and reads the first's answer from the cache.
    with _SDIST_LOCKS_LOCK:
        one_at_a_time = _SDIST_LOCKS.setdefault(key, threading.Lock())
    with one_at_a_time:
        return _sdist_answer(package, sdist, key, options)


#: A lock per sdist (by its answer's cache key) for :func:`_one_sdist`.
_SDIST_LOCKS: dict[str, threading.Lock] = {}
_SDIST_LOCKS_LOCK = threading.Lock()


def _sdist_answer(package: Package, sdist: DistFile, key: str, options: SdistOptions) -> list[str]:
    from harness.resolve.python import build_requirements, dynamic_build_requirements

    cache_dir = options.cache_dir
    static_cache = cache_dir / "build-requires" / f"{key}-static.json"
    static = _cached(static_cache)
    # dynamic_build_requirements caches its answer under the same key: with both cached (as
    # files of this user's, which alone it reads), the sdist is neither fetched nor unpacked.
    root = options.scratch
    if static is None or _cached(cache_dir / "build-requires" / f"{key}.json") is None:
        archive = _private_copy(
            fetch_sdist(package, sdist, settings=options.settings, cache_dir=cache_dir, offline=options.offline),
            sdist,
            options.scratch,
        )
        root = unpack_sdist(archive, options.scratch / f"sdist-{sdist.sha256[:16]}")
        if static is None:
            static = build_requirements(root)
            _remember(static_cache, static)
    if options.on_static is not None:
        options.on_static(list(static))
    dynamic = dynamic_build_requirements(
        root,
        static,
        editable=False,
        key=key,
        indexes=list(options.indexes),
        settings=options.settings,
        cache_dir=cache_dir,
        offline=options.offline,
    )
    return [*static, *dynamic]


def _private_copy(download: Path, sdist: DistFile, scratch: Path) -> Path:
    """The checked bytes of ``download`` copied into ``scratch``, read once: the download cache
    of a home a group shares is group-writable, and bytes another member put there after the
    check would run their build backend here."""
    from harness.download import read_checked

    data = read_checked(download, sha256=sdist.sha256, size=sdist.size, where=f"sdist {sdist.file}")
    copy = scratch / f"{sdist.sha256[:16]}-{PurePosixPath(sdist.file).name}"
    scratch.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(data)
    return copy


def _cached(path: Path) -> list[str] | None:
    from harness.resolve.answercache import cached_answer

    return cached_answer(path)


def _remember(path: Path, requirements: list[str]) -> None:
    from harness.resolve.answercache import remember_answer

    remember_answer(path, requirements)


def fetch_sdist(package: Package, sdist: DistFile, *, settings: Settings, cache_dir: Path, offline: bool) -> Path:
    """The sdist's file in the download cache (``cache_dir/downloads/<sha256>``, where realize
    looks first), fetched from the package's index when absent or holding other bytes, and
    checked against its size and sha256. Offline, an absent sdist is an error saying to lock online once."""
    from harness.download import download
    from harness.resolve.indexpages import find_file_urls, index_address
    from harness.resolve.python import resolved_url
    from harness.store.hashing import file_sha256
    from harness.store.store import lock_file

    downloads = cache_dir / "downloads"
    dest = downloads / sdist.sha256
    downloads.mkdir(parents=True, exist_ok=True)
    with lock_file(downloads / f"{sdist.sha256}.lock"):
        # Checked, not trusted: in a home a group shares, another member could have planted
        # other bytes under this name, and unpacking them runs their build backend here.
        if dest.is_file() and file_sha256(dest) == sdist.sha256:
            return dest
        if offline:
            raise HarnessError(
                "its build requirements are not known offline (the sdist was never fetched here)",
                hint="lock once without --offline",
            )
        # Where the resolution just found it, else the index's page for the package.
        url = resolved_url(sdist.sha256)
        if url is None:
            address = index_address(package.index, settings, cache_dir)
            url = find_file_urls(address, package.name, [sdist.file], index_name=package.index)[sdist.file]
        download(url, dest, sha256=sdist.sha256, size=sdist.size, label=sdist.file)
    return dest


def unpack_sdist(archive: Path, dest: Path) -> Path:
    """Unpack the sdist ``archive`` (``.tar.gz``, ``.tar.bz2``, ``.tar.xz``, ``.tar`` or
    ``.zip``) into ``dest`` and return its project folder: the one top-level folder. Members
    that would land outside ``dest`` (absolute paths, ``..``, links out) are refused."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as handle:
                for member in handle.namelist():
                    _check_member(member)
                handle.extractall(dest)
        else:
            with tarfile.open(archive) as handle:
                _extract_tar(handle, dest)
    except (OSError, tarfile.TarError, zipfile.BadZipFile, ValueError) as exc:
        raise HarnessError(f"cannot unpack the sdist: {exc}") from None
    tops = [p for p in dest.iterdir() if not p.name.startswith(".")]
    if len(tops) == 1 and tops[0].is_dir():
        return tops[0]
    if (dest / "pyproject.toml").is_file() or (dest / "setup.py").is_file():
        return dest
    raise HarnessError("the sdist holds no single project folder (PEP 625: one top-level folder)")


def _extract_tar(handle: tarfile.TarFile, dest: Path) -> None:
    """Extract with the standard library's ``data`` filter where it has one (CPython 3.11.4
    and later); before that (Debian's 3.11.2), after the same checks made here: only files,
    folders and links that stay inside ``dest``, no devices, no set-id bits."""
    if hasattr(tarfile, "data_filter"):
        handle.extractall(dest, filter="data")
        return
    members = handle.getmembers()
    for member in members:
        _check_member(member.name)
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise HarnessError(f"the sdist has a member {member.name!r} that is no file, folder or link")
        if member.issym() or member.islnk():
            base = PurePosixPath(member.name).parent if member.issym() else PurePosixPath()
            target = PurePosixPath(member.linkname)
            if target.is_absolute() or ".." in (base / target).parts:
                raise HarnessError(f"the sdist has a link {member.name!r} pointing outside it")
        member.mode &= 0o755
    handle.extractall(dest, members=members)  # every member checked above


def _check_member(name: str) -> None:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise HarnessError(f"the sdist has an unsafe member {name!r}")
