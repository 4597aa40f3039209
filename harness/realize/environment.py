"""Building the environment store object: a virtual environment that moves with the store.

:func:`build_environment` fills an empty directory ``out`` with a virtual environment made by
uv, **offline**, from exactly the files it is given (realized wheels and sdists, realized
source trees, realized build-requirement wheels), every file hash-checked:

1. ``uv venv --relocatable`` on the realized interpreter;
2. every locked sdist built into a wheel (``uv build --wheel``, offline, uv's cache off so
   nothing an earlier build left can stand in, its build requirements only from the build
   wheels, ``SOURCE_DATE_EPOCH`` fixed, the scratch folder and the store mapped to fixed
   names in compilers' debug information); then ``uv pip sync --offline --no-index
   --no-build`` of a PEP 751 document whose entries point at the realized wheels and those
   built ones (``path = …``) with their sha256 (the lock's, when ``hashes`` is given), so uv
   refuses a file whose bytes differ. Wheels no store path holds (``remote_wheels``: with
   ``[gc] keep-wheel-files = false`` the store keeps none) are entries of their index URL
   (``url = …``) instead, and that sync alone is not ``--offline``: uv downloads them,
   unpacking each as it streams in and refusing bytes that do not match the sha256 (or,
   offline, takes them from its cache, which keeps a streamed wheel under its address);
3. the source trees with ``uv pip install --offline --no-index --no-deps`` (their
   dependencies are locked packages, already installed): ``regular`` ones built into the
   environment, ``editable`` ones installed editable, ``path`` ones not built at all: a
   ``.pth`` line puts their tree on ``sys.path`` (a project that runs from its checkout with
   it on ``PYTHONPATH``). Each built one is built from a scratch *copy*: a
   realized source tree is read-only, and backends write into the tree they build (setuptools'
   ``build/`` and ``*.egg-info``). Build requirements come only from ``build_wheels``
   (``--find-links`` a folder of them, ``--build-constraints`` pinning each to its hash,
   ``--require-build-hashes``). uv's cache is not used for this step, because it would keep a
   built wheel per scratch path forever.

**Relocation** (``docs/relocation.md``): the environment and its interpreter are siblings in
the store, ``<store>/<hash>-cpython-3.11.7`` and ``<store>/<hash>-<name>-env``. Then:

* ``bin/python`` is the *relative* symlink ``../../<interpreter store name>/bin/python3.X``;
* ``pyvenv.cfg`` has no ``home`` key. CPython's getpath (3.10 to 3.13 alike) treats a
  ``pyvenv.cfg`` without ``home`` as no venv, so the base prefix is found from the *resolved*
  executable, i.e. the interpreter's store path wherever the store is; ``site`` still reads
  the file next to ``sys.executable`` and makes ``sys.prefix`` the environment. (A relative
  ``home`` would be resolved against the working directory, an absolute one pins the store's
  location.) Everything that does not care about ``home`` — activation scripts, uv's
  ``--relocatable`` entry-point scripts — already finds itself.
* an editable source's ``.pth`` line becomes relative to ``site-packages``
  (``../../../../<source store name>[/subdir…]``): ``site`` joins a relative line to the
  site-packages folder. setuptools is asked for its ``compat`` editable mode (a plain path
  in a ``.pth``) rather than its default import-hook finder, which writes absolute paths into
  Python code.
* installer metadata is not written (``UV_NO_INSTALLER_METADATA``): ``direct_url.json`` would
  name the scratch copy, and ``uv_cache.json`` holds a timestamp.
* the environment's own ``.py`` files are compiled to unchecked-hash pycs with relative file
  names (:func:`harness.realize.bytecode.compile_tree`), not with uv's
  ``--compile-bytecode``, whose timestamp pycs embed the build path and go stale when the
  store fixes mtimes. Their bytes depend only on the interpreter, the source, its relative
  name and the optimization level (``harness/realize/bytecode.py``), so a pyc another
  environment on the same interpreter already holds is taken from the store's pool instead
  of compiled again (``harness/store/bytecode.py``).

Finally every file the build itself wrote or rewrote (outside ``site-packages``, its top-level
files, and the files of dists built from sources) is scanned for an absolute path of the
build (``out``, the store folder, the scratch copies, the sources, uv's cache), and so is
every symlink: a text file or link naming one is a :class:`HarnessError` listing them, so an
environment that would break when moved is never returned; a binary file naming one (debug
information of a compiled extension) is reported in
:attr:`EnvironmentBuild.embedded_paths`. Installed wheel contents are not scanned: an
installer never writes its target's location into a wheel's files.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import os
import re
import shutil
import stat
import tempfile
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import tomlkit
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from harness.progress import QUIET, Reporter
from harness.realize.bytecode import CompileReport, ReuseFrom
from harness.realize.bytecode import compile_tree
from harness.realize.interpreter import replace_file_bytes
from harness.download import redact
from harness.errors import HarnessError
from harness.resolve.uvtool import run_uv
from harness.store.hashing import STORE_HASH_CHARS, NIX_BASE32_ALPHABET, file_sha256

INSTALL_MODES = ("editable", "regular", "path")
_STORE_PREFIX = re.compile(rf"^[{NIX_BASE32_ALPHABET}]{{{STORE_HASH_CHARS}}}-")


@dataclass(frozen=True)
class EnvironmentBuild:
    """What :func:`build_environment` made: paths relative to the environment.

    ``python`` is the interpreter to launch (``bin/python``), ``site_packages`` its
    ``site-packages`` folder, ``interpreter_link`` the target of the ``bin/python`` symlink
    (``../../<interpreter store name>/bin/python3.X``), ``editable`` the relative ``.pth``
    entries written for editable sources, one per entry. ``embedded_paths`` lists binary
    files built from source trees that record an absolute build path (compilers write the
    build and include folders into debug information): harmless when the store moves, but
    their bytes depend on where the build ran, so such an environment is not reproducible
    across homes; the caller decides (warn, or keep the store location in the hash).
    ``bytecode`` is what the compile reused and compiled (None without ``bytecode``).
    """

    python: str
    site_packages: str
    interpreter_link: str
    editable: tuple[str, ...] = ()
    embedded_paths: tuple[str, ...] = ()
    bytecode: CompileReport | None = None


class RemoteWheel(NamedTuple):
    """A wheel uv downloads into the environment itself (no store path holds it): its file
    name, its address on its index, and the sha256 uv checks its bytes against as they
    stream in."""

    filename: str
    url: str
    sha256: str


@dataclass(frozen=True)
class _Dist:
    """A realized distribution file: where it is and the name it must be known by; or, with
    ``url``, a wheel uv downloads itself (``path`` is then its bare file name)."""

    path: Path
    filename: str
    name: str
    version: str
    is_wheel: bool
    url: str | None = None
    sha256: str | None = None


class _Source(NamedTuple):
    """One entry of ``sources``, build isolation filled in (default on)."""

    tree: Path
    mode: str
    subdirectory: str | None
    isolated: bool


@dataclass(frozen=True)
class _Inputs:
    """What :func:`build_environment` was given, checked and named (:func:`_checked_inputs`).

    ``exe`` is the interpreter to run uv with, ``link_target`` what ``bin/python`` will point
    at (``../../<interpreter store name>/<exe>``)."""

    exe: Path
    link_target: str
    dists: list[_Dist]
    builds: list[_Dist]
    sources: list[_Source]
    #: The store folder the interpreter is in (its headers are what extensions compile against).
    store_dir: Path
    #: Packages whose sdist is built against the environment, after the rest is installed.
    against: frozenset[str] = frozenset()


#: uv writes no installer metadata (module doc: it would name the scratch copies).
_UV_ENV = {"UV_NO_INSTALLER_METADATA": "1"}


@dataclass(frozen=True)
class _Scratch:
    """The scratch folder of one build and the uv flags every install there shares: build
    requirements only from the given wheels, each pinned to its hash."""

    work: Path
    cache_dir: Path
    build_flags: tuple[str | os.PathLike[str], ...]
    #: Whether the sync may download the wheels it names by address (else uv's cache alone).
    online: bool = True

    def uv(self, args: Sequence[str | os.PathLike[str]], *, cached: bool = True) -> None:
        """Run uv in the scratch folder, with uv's cache unless ``cached`` is false."""
        run_uv(args, cache_dir=self.cache_dir if cached else None, cwd=self.work, env_extra=_UV_ENV)


@dataclass(frozen=True)
class _Installed:
    """What the install phase (:func:`_install`) left: the environment's ``site-packages``,
    the scratch copies of the built sources (copy → realized tree) and the dist-info folders
    those builds added."""

    site_packages: Path
    copies: dict[Path, Path]
    from_sources: set[str]


def build_environment(
    out: Path,
    *,
    interpreter_dir: Path,
    interpreter_exe: str,
    wheels: Sequence[Path],
    sources: Sequence[tuple[Path, str, str | None] | tuple[Path, str, str | None, bool]] = (),
    build_wheels: Sequence[Path] = (),
    cache_dir: Path,
    remote_wheels: Sequence[RemoteWheel] = (),
    offline: bool = False,
    interpreter_store_name: str | None = None,
    hashes: Mapping[str, str] | None = None,
    prompt: str = "env",
    bytecode: bool = True,
    progress: Reporter = QUIET,
    jobs: int | None = None,
    bytecode_from: ReuseFrom | None = None,
    against_environment: Iterable[str] = (),
) -> EnvironmentBuild:
    """Fill the empty directory ``out`` with a virtual environment (module doc).

    * ``interpreter_dir`` is the realized interpreter (its store path), ``interpreter_exe``
      the executable inside it (``bin/python3.11``). ``interpreter_store_name`` is the name
      the environment's ``bin/python`` link points at (``../../<name>/<exe>``), default
      ``interpreter_dir.name``: the environment must end up beside the interpreter.
    * ``wheels`` are realized wheel files and sdists of locked packages, each named either by
      its file name or by a store name ``<32-char hash>-<file name>`` (or a folder holding
      exactly one such file). ``hashes`` maps file names to the lock's sha256; without it each
      file's own sha256 is used (the store checked the bytes when it realized them).
    * ``sources`` are ``(realized source tree, "editable" | "regular" | "path", subdirectory
      or None[, build isolation])``; an editable or path one is imported from its store path,
      which must be a sibling of the environment's final location too. A source without build
      isolation (``False``) is built with uv's ``--no-build-isolation``, against the
      environment's own packages, after the isolated ones.
    * ``build_wheels`` are the realized wheels of the locked build requirements, the only
      things a build may use.
    * ``cache_dir`` is uv's cache (on the store's filesystem, so installs hardlink).
    * ``remote_wheels`` are wheels of locked packages that no store path holds: the sync
      downloads them (the only uv call that is not ``--offline``), each checked against its
      sha256 as it streams in, unpacking one while the others still download. The
      environment holds the same bytes as one built from the files (uv writes no installer
      metadata that could tell them apart). ``offline``: uv takes them from its cache alone
      (it streamed them into an earlier environment under the same addresses); one it no
      longer holds is a :class:`HarnessError` naming it (:func:`not_cached`).
    * ``prompt`` is the activation prompt (written into the environment, so it is fixed).
    * ``bytecode`` writes reproducible pycs for the environment's own files, compiled over up
      to ``jobs`` workers (default: the CPUs) except those ``bytecode_from`` (the store's
      bytecode index for this interpreter) already holds, which are placed instead;
      :attr:`EnvironmentBuild.bytecode` says which, for the caller to record after
      registration.
    * ``progress`` shows the install and the bytecode compilation.
    * ``against_environment`` names packages (normalized) whose sdist is built against the
      environment itself (``--no-build-isolation``), once everything else is installed.

    Nothing else is fetched: every uv call is ``--no-index``, and ``--offline`` but for the
    sync of ``remote_wheels``. Raises
    :class:`HarnessError` (naming uv's explanation or the offending files) on any failure;
    ``out`` is then left for the caller to delete.
    """
    out, interpreter_dir, cache_dir = out.absolute(), interpreter_dir.absolute(), cache_dir.absolute()
    inputs = _checked_inputs(
        out,
        interpreter_dir,
        interpreter_exe,
        wheels=wheels,
        sources=sources,
        build_wheels=build_wheels,
        link_name=interpreter_store_name or interpreter_dir.name,
        remote_wheels=remote_wheels,
    )
    inputs = dataclasses.replace(inputs, against=frozenset(canonicalize_name(n) for n in against_environment))
    # Scratch beside ``out``: in the store's stage folder, on the store's file system, and
    # removed with it when a killed realize leaves it (``Store.clean``), never in /tmp.
    with tempfile.TemporaryDirectory(prefix="harness-env-", dir=out.parent) as tmp:
        scratch = dataclasses.replace(_prepare_scratch(Path(tmp), inputs.builds, hashes, cache_dir), online=not offline)
        count = f"{len(inputs.dists)} package(s)" + (f" and {len(inputs.sources)} source(s)" if inputs.sources else "")
        how = "taking" if offline else "downloading"
        streamed = (
            f", {how} {len(remote_wheels)} of them" + (" from uv's cache" if offline else "") if remote_wheels else ""
        )
        with progress.phase(f"installing {count} into environment {prompt} (uv{streamed})"):
            installed = _install(out, inputs, scratch, hashes, prompt)
        editable = _relocate(out, installed, inputs.sources, inputs.link_target)
        report = (
            _compile_bytecode(out, inputs.exe, installed, prompt, progress, jobs, bytecode_from) if bytecode else None
        )
        needles = {out, interpreter_dir, interpreter_dir.parent, scratch.work, cache_dir, *installed.copies.values()}
        embedded = _check_paths(out, installed.site_packages, installed.from_sources, needles)

    return EnvironmentBuild(
        python="bin/python",
        site_packages=installed.site_packages.relative_to(out).as_posix(),
        interpreter_link=inputs.link_target,
        editable=editable,
        embedded_paths=embedded,
        bytecode=report,
    )


@dataclass(frozen=True)
class WheelBuild:
    """What :func:`build_sdist_wheel` made: the wheel's file name in ``out`` and its sha256;
    ``embedded_paths`` lists the wheel's binary members that name where it was built (the
    store's location: an extension linked against a host interpreter copy keeps its path as
    a run path), so another home builds other bytes for them."""

    wheel: str
    sha256: str
    embedded_paths: tuple[str, ...] = ()

    @property
    def compiled(self) -> bool:
        """Whether the wheel holds compiled code (its platform tag is not ``any``): built with
        this machine's compilers and headers, which no lock names."""
        return any(tag.platform != "any" for tag in parse_wheel_filename(self.wheel)[3])


def host_toolchain() -> str:
    """What compiles an extension here, as a build backend finds it: ``$CC`` or ``cc``, and
    the first line of its ``--version`` (``gcc (Debian 12.2.0-14) 12.2.0``)."""
    import shlex
    import subprocess

    command = shlex.split(os.environ.get("CC", "")) or ["cc"]
    found = shutil.which(command[0])
    if found is None:
        return f"no {command[0]} on PATH"
    try:
        out = subprocess.run([found, *command[1:], "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return found
    first = (out.stdout or out.stderr).strip().splitlines()
    return f"{found}: {first[0]}" if first else found


def build_sdist_wheel(
    out: Path,
    *,
    interpreter_dir: Path,
    interpreter_exe: str,
    sdist: Path,
    build_wheels: Sequence[Path] = (),
    cache_dir: Path,
    hashes: Mapping[str, str] | None = None,
) -> WheelBuild:
    """Fill the empty directory ``out`` with the one wheel built from ``sdist`` (a realized
    sdist: its file, or its store folder), as :func:`build_environment` builds an sdist: the
    sdist checked against its sha256 in ``hashes`` (the lock's), unpacked in a scratch folder,
    ``uv build --wheel`` with the interpreter ``interpreter_dir/interpreter_exe`` offline, uv's
    cache off, its build requirements only from ``build_wheels`` (each pinned to its hash),
    ``SOURCE_DATE_EPOCH`` fixed and the scratch folder and the store mapped out of compilers'
    debug information. The wheel's members are scanned for the build's absolute paths: a
    text member naming one is a :class:`HarnessError` (the wheel would not work elsewhere), a
    binary one is reported (:attr:`WheelBuild.embedded_paths`). A failed build names the
    package and the last lines of its log, or says to re-lock when the lock lacks a
    requirement; ``out`` is then left for the caller to delete."""
    out, interpreter_dir, cache_dir = out.absolute(), interpreter_dir.absolute(), cache_dir.absolute()
    _check_empty(out)
    exe = interpreter_dir / interpreter_exe
    if not exe.is_file():
        raise HarnessError(f"{exe}: no interpreter there")
    dist = _dist(sdist)
    if dist.is_wheel:
        raise HarnessError(f"{dist.path}: not an sdist")
    builds = [_dist(path) for path in build_wheels]
    for build in builds:
        if not build.is_wheel:
            raise HarnessError(f"{build.path}: build requirements must be wheels, got {build.filename}")
    with tempfile.TemporaryDirectory(prefix="harness-wheel-", dir=out.parent) as tmp:  # as build_environment's
        scratch = _prepare_scratch(Path(tmp), builds, hashes, cache_dir)
        [wheel], own, _ = _build_sdists(exe, [dist], scratch, hashes, interpreter_dir.parent)
        shutil.copyfile(wheel.path, out / wheel.filename)
        needles = (scratch.work, interpreter_dir.parent, cache_dir, out)
        embedded = wheel_embedded_paths(out / wheel.filename, needles, label=f"{dist.name} {dist.version}")
    return WheelBuild(wheel.filename, own[wheel.filename], embedded)


def wheel_embedded_paths(wheel: Path, roots: Iterable[Path], *, label: str) -> tuple[str, ...]:
    """The binary members of ``wheel`` that name one of the absolute ``roots`` (module doc:
    debug information, a run path); a text member naming one is a :class:`HarnessError`
    naming ``label`` and the members (the installed file would point at a build folder)."""
    import zipfile

    needles = _needles(roots)
    offenders: list[str] = []
    binaries: list[str] = []
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            if member.is_dir():
                continue
            data = archive.read(member)
            if any(needle in data for needle in needles):
                (binaries if b"\0" in data else offenders).append(member.filename)
    if offenders:
        raise HarnessError(
            f"the wheel built from {label} names absolute build paths, so it would not work elsewhere: "
            + ", ".join(sorted(offenders))
        )
    return tuple(sorted(binaries))


def _needles(roots: Iterable[Path]) -> list[bytes]:
    """Each root as bytes, as given and resolved, longest first. A very short path
    (``/tmp``) would match unrelated text; build paths are never that short."""
    return sorted(
        {
            os.fsencode(p)
            for root in roots
            for p in (root.absolute(), Path(os.path.realpath(root)))
            if len(os.fsencode(p)) >= 8
        },
        key=len,
        reverse=True,
    )


# --------------------------------------------------------------------------- phases


def _checked_inputs(
    out: Path,
    interpreter_dir: Path,
    interpreter_exe: str,
    *,
    wheels: Sequence[Path],
    sources: Sequence[tuple[Path, str, str | None] | tuple[Path, str, str | None, bool]],
    build_wheels: Sequence[Path],
    link_name: str,
    remote_wheels: Sequence[RemoteWheel] = (),
) -> _Inputs:
    """Check everything :func:`build_environment` was given before anything is built: ``out``
    empty, the interpreter there, every file a wheel or sdist by name (build requirements
    wheels only), every source tree there in a known mode (an editable or path one beside the
    interpreter). Raises :class:`HarnessError` naming the first problem."""
    _check_empty(out)
    exe = interpreter_dir / interpreter_exe
    if not exe.is_file():
        raise HarnessError(f"{exe}: no interpreter there")
    dists = [_dist(path) for path in wheels] + [_remote_dist(wheel) for wheel in remote_wheels]
    builds = [_dist(path) for path in build_wheels]
    for dist in builds:
        if not dist.is_wheel:
            raise HarnessError(f"{dist.path}: build requirements must be wheels, got {dist.filename}")
    entries = [_source_entry(entry) for entry in sources]
    for entry in entries:
        _check_source(entry, interpreter_dir)
    return _Inputs(exe, f"../../{link_name}/{interpreter_exe}", dists, builds, entries, interpreter_dir.parent)


def _check_source(source: _Source, interpreter_dir: Path) -> None:
    """A source tree must exist in a known install mode; an editable or path one must be
    realized beside the interpreter (its ``.pth`` line is relative to the store folder)."""
    tree, mode, subdirectory = source.tree, source.mode, source.subdirectory
    if mode not in INSTALL_MODES:
        raise HarnessError(f"{tree}: install mode {mode!r}, expected one of {', '.join(INSTALL_MODES)}")
    if not (tree / (subdirectory or "")).is_dir():
        raise HarnessError(f"{tree}: no source tree{f' subdirectory {subdirectory}' if subdirectory else ''}")
    if mode in ("editable", "path") and tree.absolute().parent != interpreter_dir.parent:
        # The .pth line is relative to the store folder (module doc).
        raise HarnessError(
            f"{tree}: an {mode} source must be realized in the interpreter's store folder ({interpreter_dir.parent})"
        )


def _prepare_scratch(
    work: Path, builds: Sequence[_Dist], hashes: Mapping[str, str] | None, cache_dir: Path
) -> _Scratch:
    """Lay out the scratch folder ``work``: the build wheels under their file names (for
    ``--find-links``) and, when there are any, their hash-pinned constraints."""
    links = _find_links(work / "build-wheels", builds)
    # Build requirements: only the given wheels, each pinned to its hash. (uv 0.13 calls
    # build-dependency hashes a preview feature; naming it silences the warning.)
    build_flags: list[str | os.PathLike[str]] = [
        "--offline",
        "--no-index",
        "--find-links",
        links,
        "--require-build-hashes",
        "--preview-features",
        "build-dependency-hashes",
    ]
    if builds:
        constraints = work / "build-constraints.txt"
        constraints.write_text(_build_constraints(builds, hashes))
        build_flags += ["--build-constraints", constraints]
    return _Scratch(work, cache_dir, tuple(build_flags))


def _install(
    out: Path, inputs: _Inputs, scratch: _Scratch, hashes: Mapping[str, str] | None, prompt: str
) -> _Installed:
    """uv's part (module doc, steps 1 to 3): the relocatable venv, the locked packages
    synced into it, then the source trees built and installed."""
    scratch.uv(["venv", out, "--python", inputs.exe, "--relocatable", "--prompt", prompt, "--offline", "--no-project"])
    python = out / "bin" / "python"
    site_packages = _site_packages(out)
    built: set[str] = set()
    later = [d for d in inputs.dists if not d.is_wheel and d.name in inputs.against]
    first = [d for d in inputs.dists if d not in later]
    if first:
        dists, built_hashes, built = _build_sdists(python, first, scratch, hashes, inputs.store_dir)
        _sync_packages(python, dists, scratch, None if hashes is None else {**hashes, **built_hashes})
    if later:
        # Built against what is installed now (a CUDA extension against the installed torch).
        wheels, _, infos = _build_sdists(python, later, scratch, hashes, inputs.store_dir, isolated=False)
        scratch.uv(
            ["pip", "install", "--python", python, "--no-deps", "--offline", "--no-index", *[w.path for w in wheels]],
            cached=False,
        )
        built |= infos
    before = _dist_infos(site_packages)
    copies = _install_sources(python, inputs.sources, scratch)
    return _Installed(site_packages, copies, (_dist_infos(site_packages) - before) | built)


#: The time every sdist build writes (PEP 517 backends and wheel writers honour
#: ``SOURCE_DATE_EPOCH``): 1980-01-01, the earliest a zip entry can say.
SOURCE_DATE_EPOCH = "315532800"
#: The folder a compiled extension's debug information names as where it was built, whatever
#: the scratch folder's name (``-ffile-prefix-map``): the same bytes in every home.
BUILD_PREFIX = "/harness-build"
#: The same for the store the interpreter's headers are read from.
STORE_PREFIX = "/harness-store"


def _build_sdists(
    python: Path,
    dists: Sequence[_Dist],
    scratch: _Scratch,
    hashes: Mapping[str, str] | None,
    store_dir: Path,
    *,
    isolated: bool = True,
) -> tuple[list[_Dist], dict[str, str], set[str]]:
    """Build every sdist of ``dists`` into a wheel before the sync, so the environment
    installs wheels only: (the dists with each sdist replaced by its wheel, the wheels' own
    sha256 by file name, the dist-info folders of those wheels).

    Each build starts from the sdist checked against its locked sha256 and unpacked under
    the scratch folder, runs offline with uv's cache off (a temporary one under the scratch
    folder: nothing an earlier build or another environment left can stand in for a package
    the lock does not name), its build requirements only from the lock's build wheels, with
    ``SOURCE_DATE_EPOCH`` fixed, and the scratch folder and the store (``store_dir``: the
    interpreter's headers) mapped to :data:`BUILD_PREFIX` and :data:`STORE_PREFIX` in
    compilers' debug information. A failed build names the package and the last lines of
    its log; one asking for a requirement the lock lacks says to re-lock."""
    from harness.resolve.sdists import unpack_sdist

    out: list[_Dist] = []
    own: dict[str, str] = {}
    infos: set[str] = set()
    for dist in dists:
        if dist.is_wheel:
            out.append(dist)
            continue
        expected = _sha256(dist, hashes)
        if hashes is not None and file_sha256(dist.path) != expected:
            raise HarnessError(f"{dist.filename}: sha256 {file_sha256(dist.path)}, the lock says {expected}")
        root = unpack_sdist(dist.path, scratch.work / "sdists" / f"{dist.name}-{dist.version}")
        target = scratch.work / "built" / f"{dist.name}-{dist.version}"
        _build_one_sdist(python, dist, root, target, scratch, store_dir, isolated=isolated)
        wheels = sorted(target.glob("*.whl"))
        if len(wheels) != 1:
            raise HarnessError(f"{dist.name} {dist.version}: its build left {len(wheels)} wheels, expected one")
        wheel = _dist(wheels[0])
        out.append(wheel)
        own[wheel.filename] = file_sha256(wheel.path)
        infos.add(_wheel_dist_info(wheel.path))
    return out, own, infos


def _build_one_sdist(
    python: Path, dist: _Dist, root: Path, target: Path, scratch: _Scratch, store_dir: Path, *, isolated: bool = True
) -> None:
    from harness.resolve.uvtool import UvError

    temp = scratch.work / "tmp"
    temp.mkdir(exist_ok=True)
    mapped = f"-ffile-prefix-map={scratch.work}={BUILD_PREFIX} -ffile-prefix-map={store_dir.absolute()}={STORE_PREFIX}"
    env = {
        **_UV_ENV,
        "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
        "PYTHONHASHSEED": "0",
        "TMPDIR": os.fspath(temp),
        "CFLAGS": f"{os.environ.get('CFLAGS', '')} {mapped}".strip(),
        "CXXFLAGS": f"{os.environ.get('CXXFLAGS', '')} {mapped}".strip(),
    }
    args: list[str | os.PathLike[str]] = ["build", "--wheel", root, "--out-dir", target, "--python", python]
    if not isolated:
        args.append("--no-build-isolation")
    try:
        run_uv([*args, *scratch.build_flags], cache_dir=None, cwd=scratch.work, env_extra=env)
    except UvError as exc:
        raise _sdist_build_error(dist, exc.stderr) from None


def _sdist_build_error(dist: _Dist, log: str) -> HarnessError:
    """The error of a failed sdist build: its package, and either the requirement the lock
    lacks (re-lock) or the last lines of the build's log."""
    missing = re.search(r"No solution found when resolving: `([^`]+)`", log)
    if missing:
        return HarnessError(
            f"re-lock: {dist.name} {dist.version} needs {missing.group(1)} to build, and the lock does not name it",
            hint="`harness lock --refresh` locks each sdist's build requirements",
        )
    tail = "\n".join(log.strip().splitlines()[-25:])
    return HarnessError(f"building {dist.name} {dist.version} from its sdist failed:\n{tail}")


def _wheel_dist_info(wheel: Path) -> str:
    """The ``*.dist-info`` folder a wheel installs."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            top = name.split("/", 1)[0]
            if top.endswith(".dist-info"):
                return top
    raise HarnessError(f"{wheel.name}: a wheel without a .dist-info folder")


def _sync_packages(python: Path, dists: Sequence[_Dist], scratch: _Scratch, hashes: Mapping[str, str] | None) -> None:
    """``uv pip sync`` of a PEP 751 document naming exactly ``dists`` (sdists built there;
    ``--no-build`` when all are wheels)."""
    pylock = scratch.work / "pylock.toml"
    pylock.write_text(_pylock(dists, hashes))
    from harness.resolve.uvtool import UvError

    flags = scratch.build_flags
    remote = [d for d in dists if d.url is not None]
    if remote and scratch.online:  # wheels uv downloads itself, checked as they stream
        flags = tuple(flag for flag in flags if flag != "--offline")
    try:
        scratch.uv(
            [
                "pip",
                "sync",
                pylock,
                "--python",
                python,
                "--preview-features",
                "pylock",
                *flags,
                *(["--no-build"] if all(d.is_wheel for d in dists) else []),
            ]
        )
    except UvError as exc:
        mismatch = hash_mismatch(exc.stderr, remote) or not_cached(exc.stderr, remote)
        if mismatch is not None:
            raise mismatch from None
        raise


_MISMATCH = re.compile(
    r"Hash mismatch for `(?P<name>[^=`]+)==(?P<version>[^`]+)`.*?Expected:\s*(?P<expected>\S+).*?Computed:\s*(?P<actual>\S+)",
    re.DOTALL,
)


def hash_mismatch(stderr: str, remote: Sequence[_Dist]) -> HarnessError | None:
    """The error naming the wheel uv refused as it streamed in (its file, its address, the
    sha256 expected and the one its bytes have) when uv's ``stderr`` says so, else None. Pure."""
    found = _MISMATCH.search(stderr)
    if found is None:
        return None
    name, version = canonicalize_name(found["name"]), found["version"]
    dist = next((d for d in remote if canonicalize_name(d.name) == name and d.version == version), None)
    if dist is None:
        return None
    expected, actual = (value.removeprefix("sha256:") for value in (found["expected"], found["actual"]))
    return HarnessError(
        f"{dist.filename}: sha256 mismatch as it downloaded from {redact(str(dist.url))}: "
        f"expected {expected}, got {actual}",
        hint="the index serves other bytes than the lock names: nothing was registered; "
        "re-lock if the file changed on purpose",
    )


_NOT_CACHED = "Network connectivity is disabled, but the requested data wasn't found in the cache"


class NotCached(HarnessError):
    """An offline sync wanted a streamed wheel that uv's cache no longer holds
    (:func:`not_cached`): online, realize then reads its address from the index again."""


def not_cached(stderr: str, remote: Sequence[_Dist]) -> HarnessError | None:
    """The error naming the wheels an offline sync wanted from uv's cache and did not find
    there (uv names each by its address), when uv's ``stderr`` says so, else None. Pure.
    uv wraps its messages to the terminal's width: they are read with each run of
    whitespace as one space."""
    flat = " ".join(stderr.split())
    if _NOT_CACHED not in flat:
        return None
    missing = sorted(d.filename for d in remote if d.url is not None and d.url in flat)
    if not missing:
        return None
    return NotCached(
        f"offline, and neither the store nor uv's cache holds {', '.join(missing)}: "
        "with `[gc] keep-wheel-files = false` the store keeps no wheel file, and uv's cache "
        "no longer has the one it streamed",
        hint="run `harness realize` once with network, or pull from a cache",
    )


def _install_sources(python: Path, sources: Sequence[_Source], scratch: _Scratch) -> dict[Path, Path]:
    """Build and install the ``regular`` and ``editable`` sources, each from a scratch copy;
    returns scratch copy → realized tree. Isolated builds first (their requirements only from
    the build wheels), then the sources built against the environment itself (build-isolation
    = false: a CUDA extension compiles against the installed torch), which may import the
    first ones. ``path`` sources are not built (:func:`_path_sources_pth`)."""
    copies: dict[Path, Path] = {}
    for isolated in (True, False):
        chosen = [(i, s) for i, s in enumerate(sources) if s.isolated is isolated and s.mode != "path"]
        if not chosen:
            continue
        args: list[str | os.PathLike[str]] = ["pip", "install", "--python", python, "--no-deps", *scratch.build_flags]
        if not isolated:
            args.append("--no-build-isolation")
        for index, source in chosen:
            copy = scratch.work / "sources" / str(index) / source.tree.name
            _copy_tree(source.tree, copy)
            copies[copy] = source.tree
            args += _install_args(source, copy / source.subdirectory if source.subdirectory else copy)
        # No cache: built wheels would be cached under the scratch path, never reused.
        scratch.uv(args, cached=False)
    return copies


def _install_args(source: _Source, target: Path) -> list[str | os.PathLike[str]]:
    """``uv pip install``'s arguments for one source built from ``target``: an editable one
    in setuptools' ``compat`` mode (module doc), a regular one as a plain path."""
    if source.mode != "editable":
        return [target]
    name = _setuptools_project(target)
    compat: list[str | os.PathLike[str]] = ["--config-settings-package", f"{name}:editable_mode=compat"] if name else []
    return [*compat, "--editable", target]


def _relocate(out: Path, installed: _Installed, sources: Sequence[_Source], link_target: str) -> tuple[str, ...]:
    """Make the environment move with the store (module doc, "Relocation"): ``.pth`` lines
    relative to ``site-packages``, the path sources' ``.pth``, ``bin/python`` the relative link,
    no ``home`` in ``pyvenv.cfg``, uv's ``.lock`` gone. Returns the ``.pth`` lines written."""
    site_packages = installed.site_packages
    depth = len(site_packages.relative_to(out).parts) + 1  # up to the store folder
    editable = _relativize_pth(site_packages, installed.copies, depth)
    editable += _path_sources_pth(site_packages, [(s.tree, s.subdirectory) for s in sources if s.mode == "path"], depth)
    _link_interpreter(out, link_target)
    _drop_home(out / "pyvenv.cfg")
    for stray in (out / ".lock",):
        if stray.exists():
            stray.unlink()
    return editable


def _compile_bytecode(
    out: Path,
    exe: Path,
    installed: _Installed,
    prompt: str,
    progress: Reporter,
    jobs: int | None,
    reuse: ReuseFrom | None,
) -> CompileReport:
    """Reproducible pycs of the environment's ``site-packages`` (module doc), the store's
    pool reused where it holds them."""
    with progress.phase(f"compiling bytecode of environment {prompt}") as phase:
        return compile_tree(exe, [installed.site_packages], root=out, jobs=jobs, progress=phase.callback(), reuse=reuse)


# --------------------------------------------------------------------------- inputs


def _source_entry(
    entry: tuple[Path, str, str | None] | tuple[Path, str, str | None, bool],
) -> _Source:
    """``(tree, mode, subdirectory[, build isolation])`` with isolation filled in (default on)."""
    if len(entry) == 3:
        return _Source(entry[0], entry[1], entry[2], True)
    return _Source(entry[0], entry[1], entry[2], bool(entry[3]))


def _check_empty(out: Path) -> None:
    if not out.is_dir():
        raise HarnessError(f"{out}: the build directory must exist")
    if any(out.iterdir()):
        raise HarnessError(f"{out}: the build directory must be empty")


def _dist(path: Path) -> _Dist:
    """Name a realized wheel or sdist: its own file name, or a store name with the hash
    prefix taken off, or the single distribution file inside a store folder."""
    if path.is_dir():
        inside = [p for p in path.iterdir() if p.suffix == ".whl" or p.name.endswith((".tar.gz", ".zip"))]
        if len(inside) != 1:
            raise HarnessError(f"{path}: expected one wheel or sdist inside, found {len(inside)}")
        path = inside[0]
    if not path.is_file():
        raise HarnessError(f"{path}: no such file")
    # The store name first: parse_sdist_filename would take "<hash>-name" for a project name.
    for filename in dict.fromkeys([_STORE_PREFIX.sub("", path.name), path.name]):
        try:
            if filename.endswith(".whl"):
                name, version, _, _ = parse_wheel_filename(filename)
                return _Dist(path, filename, name, str(version), True)
            name, version = parse_sdist_filename(filename)
            return _Dist(path, filename, name, str(version), False)
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
    raise HarnessError(f"{path}: not a wheel or sdist file name")


def _remote_dist(wheel: RemoteWheel) -> _Dist:
    """Name a wheel uv downloads itself (:class:`RemoteWheel`)."""
    try:
        name, version, _, _ = parse_wheel_filename(wheel.filename)
    except InvalidWheelFilename:
        raise HarnessError(f"{wheel.url}: {wheel.filename} is not a wheel file name") from None
    return _Dist(Path(wheel.filename), wheel.filename, name, str(version), True, url=wheel.url, sha256=wheel.sha256)


def _sha256(dist: _Dist, hashes: Mapping[str, str] | None) -> str:
    if dist.sha256 is not None:
        return dist.sha256
    if hashes is None:
        return file_sha256(dist.path)
    try:
        return hashes[dist.filename]
    except KeyError:
        raise HarnessError(f"{dist.filename}: no locked sha256 given for it") from None


def _pylock(dists: Iterable[_Dist], hashes: Mapping[str, str] | None) -> str:
    """A PEP 751 document installing exactly ``dists`` (several wheels of one release are
    one package entry: uv picks the one that fits)."""
    groups: dict[tuple[str, str], list[_Dist]] = {}
    for dist in dists:
        groups.setdefault((dist.name, dist.version), []).append(dist)
    doc = tomlkit.document()
    doc["lock-version"] = "1.0"
    doc["created-by"] = "harness"
    packages = tomlkit.aot()
    for (name, version), members in sorted(groups.items()):
        table = tomlkit.table()
        table["name"] = name
        table["version"] = version
        wheels = tomlkit.array()
        for dist in sorted(members, key=lambda d: d.filename):
            entry = tomlkit.inline_table()
            entry["name"] = dist.filename
            if dist.url is not None:
                entry["url"] = dist.url
            else:
                entry["path"] = os.fspath(dist.path.absolute())
            entry["hashes"] = {"sha256": _sha256(dist, hashes)}
            if dist.is_wheel:
                wheels.append(entry)
            elif "sdist" in table:
                raise HarnessError(f"{name} {version}: two sdists given ({table['sdist']['name']}, {dist.filename})")
            else:
                table["sdist"] = entry
        if wheels:
            table["wheels"] = wheels.multiline(len(wheels) > 1)
        packages.append(table)
    doc["packages"] = packages
    return tomlkit.dumps(doc)


def _find_links(folder: Path, builds: Iterable[_Dist]) -> Path:
    """A folder where each build wheel appears under its wheel file name (store names carry
    a hash prefix, which ``--find-links`` would not parse)."""
    folder.mkdir(parents=True)
    for dist in builds:
        link = folder / dist.filename
        if not link.exists():
            os.symlink(dist.path.absolute(), link)
    return folder


def _build_constraints(builds: Iterable[_Dist], hashes: Mapping[str, str] | None) -> str:
    """Pins every build requirement to its version and hashes (``--require-build-hashes``
    then refuses anything else). One line per project: a project locked at two versions
    keeps both files' hashes and no version pin."""
    by_name: dict[str, list[_Dist]] = {}
    for dist in builds:
        by_name.setdefault(str(canonicalize_name(dist.name)), []).append(dist)
    lines = []
    for name, members in sorted(by_name.items()):
        versions = {d.version for d in members}
        pin = f"=={versions.pop()}" if len(versions) == 1 else ""
        digests = sorted({_sha256(d, hashes) for d in members})
        lines.append(f"{name}{pin} " + " ".join(f"--hash=sha256:{h}" for h in digests))
    return "".join(line + "\n" for line in lines)


def _copy_tree(tree: Path, copy: Path) -> None:
    """A writable copy of a (read-only) realized source tree, symlinks kept as they are."""
    shutil.copytree(tree, copy, symlinks=True)
    for folder, dirs, names in os.walk(copy):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
    copy.chmod(copy.stat().st_mode | stat.S_IWUSR)


def _setuptools_project(target: Path) -> str | None:
    """The project name when ``target`` builds with setuptools (declared, or by PEP 517's
    fallback with a static name), else None."""
    pyproject = target / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text()) if pyproject.is_file() else {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    backend = str(data.get("build-system", {}).get("build-backend", "setuptools.build_meta:__legacy__"))
    name = data.get("project", {}).get("name")
    return str(name) if backend.startswith("setuptools") and isinstance(name, str) else None


# --------------------------------------------------------------------------- post-processing


def _site_packages(out: Path) -> Path:
    found = sorted(out.glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise HarnessError(f"{out}: expected one lib/python3.X/site-packages, found {len(found)}")
    return found[0]


def _dist_infos(site_packages: Path) -> set[str]:
    return {p.name for p in site_packages.glob("*.dist-info")}


def _relativize_pth(site_packages: Path, copies: Mapping[Path, Path], depth: int) -> tuple[str, ...]:
    """Rewrite ``.pth`` path lines that name a scratch copy (or its realized tree) to the
    tree's place relative to ``site-packages``, and fix the owning RECORD. Returns the new
    lines."""
    up = "/".join([".."] * depth)
    roots: list[tuple[str, str]] = []
    for copy, tree in copies.items():
        for absolute in dict.fromkeys(
            [os.fspath(copy), os.path.realpath(copy), os.fspath(tree), os.path.realpath(tree)]
        ):
            roots.append((absolute, f"{up}/{tree.name}"))
    roots.sort(key=lambda r: -len(r[0]))  # longest first: nested paths win
    written: list[str] = []
    changed: dict[str, bytes] = {}
    for pth in sorted(site_packages.glob("*.pth")):
        lines = pth.read_text(encoding="utf-8").splitlines()
        new_lines = []
        for line in lines:
            new = line
            if not line.startswith(("import ", "import\t", "#")):
                for absolute, relative in roots:
                    if line == absolute or line.startswith(absolute + "/"):
                        new = relative + line[len(absolute) :]
                        written.append(new)
                        break
            new_lines.append(new)
        if new_lines != lines:
            data = ("\n".join(new_lines) + "\n").encode("utf-8")
            replace_file_bytes(pth, data)
            changed[pth.name] = data
    if changed:
        _update_records(site_packages, changed)
    return tuple(written)


#: The ``path`` sources' ``.pth``. site reads ``.pth`` files in name order and appends their
#: lines to ``sys.path`` in that order, so this name sorts before every installer's
#: (``__editable__.*.pth``, ``_<name>.pth``, ``distutils-precedence.pth``…): the checkouts come
#: first, as they do on ``PYTHONPATH`` in the launch scripts this mode stands in for (RoboDojo's
#: puts its checkout ahead of XPolicyLab's, and both hold a top-level ``utils``).
PATH_SOURCES_PTH = "00-harness-path-sources.pth"


def _path_sources_pth(site_packages: Path, trees: Sequence[tuple[Path, str | None]], depth: int) -> tuple[str, ...]:
    """Write one ``.pth`` file (:data:`PATH_SOURCES_PTH`) listing the ``path`` sources' trees
    (or their subdirectories), each relative to ``site-packages`` as an editable one is, in
    the order given; returns the lines. The file belongs to no distribution (no RECORD names
    it), as nothing was installed."""
    if not trees:
        return ()
    up = "/".join([".."] * depth)
    lines = tuple(f"{up}/{tree.name}" + (f"/{subdirectory}" if subdirectory else "") for tree, subdirectory in trees)
    (site_packages / PATH_SOURCES_PTH).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return lines


def _update_records(site_packages: Path, changed: Mapping[str, bytes]) -> None:
    """Put the new hash and size of rewritten top-level files into the RECORD that lists
    them, so the environment stays self-consistent (``uv pip check``, ``pip`` uninstall)."""
    for record in sorted(site_packages.glob("*.dist-info/RECORD")):
        rows = list(csv.reader(io.StringIO(record.read_text(encoding="utf-8"))))
        touched = False
        for row in rows:
            if row and row[0] in changed:
                data = changed[row[0]]
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                row[1:] = [f"sha256={digest}", str(len(data))]
                touched = True
        if touched:
            buffer = io.StringIO()
            csv.writer(buffer, lineterminator="\n").writerows(rows)
            replace_file_bytes(record, buffer.getvalue().encode("utf-8"))


def _link_interpreter(out: Path, target: str) -> None:
    """Make ``bin/python`` the relative link to the interpreter (the other names uv made,
    ``python3`` and ``python3.X``, already point at ``python``)."""
    python = out / "bin" / "python"
    if not python.is_symlink():
        raise HarnessError(f"{python}: uv made a copy, not a link; cannot relocate it")
    python.unlink()
    os.symlink(target, python)
    for other in sorted((out / "bin").glob("python*")):
        if other.is_symlink() and os.path.isabs(os.readlink(other)):
            raise HarnessError(f"{other}: an absolute link to {os.readlink(other)}")


def _drop_home(cfg: Path) -> None:
    """Remove ``home`` from ``pyvenv.cfg`` (module doc)."""
    lines = cfg.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.partition("=")[0].strip().lower() != "home"]
    replace_file_bytes(cfg, ("\n".join(kept) + "\n").encode("utf-8"))


def _scanned(out: Path, site_packages: Path, from_sources: Iterable[str]) -> Iterator[Path]:
    """The files the build wrote itself (module doc): everything outside site-packages, its
    top-level files, and every file of a dist built from a source tree."""
    for folder, dirs, names in os.walk(out):
        if Path(folder) == site_packages:
            dirs.clear()  # installed wheel contents: not scanned (module doc)
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                yield path
    for info in sorted(from_sources):
        record = site_packages / info / "RECORD"
        if not record.is_file():
            continue
        for row in csv.reader(io.StringIO(record.read_text(encoding="utf-8"))):
            if row and not row[0].startswith(".."):
                path = site_packages / row[0]
                if path.is_file() and not path.is_symlink() and path.parent != site_packages:
                    yield path


def _absolute_links(out: Path) -> Iterator[str]:
    """Every symlink under ``out`` with an absolute target: one ``scandir`` per folder, whose
    entry types need no ``lstat`` per file (an environment holds tens of thousands)."""
    folders = [os.fspath(out)]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                if entry.is_symlink():
                    target = os.readlink(entry.path)
                    if os.path.isabs(target):
                        yield f"{Path(entry.path).relative_to(out).as_posix()} -> {target}"
                elif entry.is_dir():
                    folders.append(entry.path)


def _check_paths(out: Path, site_packages: Path, from_sources: Iterable[str], roots: Iterable[Path]) -> tuple[str, ...]:
    """Scan what the build wrote (:func:`_scanned`) for the absolute ``roots``. A text file
    naming one is an error (it would break when the store moves or the scratch folder goes);
    a binary one (debug information of an extension compiled from a source tree records its
    build and include folders) is returned, relative to ``out``, for the caller to weigh."""
    needles = _needles(roots)
    offenders: list[str] = []
    binaries: list[str] = []
    for path in _scanned(out, site_packages, from_sources):
        data = path.read_bytes()
        if any(needle in data for needle in needles):
            (binaries if b"\0" in data else offenders).append(path.relative_to(out).as_posix())
    offenders += _absolute_links(out)
    if offenders:
        raise HarnessError(
            "the environment names absolute build paths, so it would not move with the store: "
            + ", ".join(sorted(set(offenders))),
            hint="an editable source whose build backend writes an import hook with absolute paths "
            "cannot be relocated; install it as regular",
        )
    return tuple(sorted(set(binaries)))
