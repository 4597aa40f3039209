"""Resolving an environment's Python requirements to exact, named, hashed files with uv.

:func:`resolve_packages` runs one ``uv pip compile`` for exactly one target (an exact CPython
version and one ``--python-platform``) and writes PEP 751 output, which uv 0.13 fills with,
per package: name, version, marker (rare: single-target output is already evaluated), and
every wheel that fits the target (plus the sdist where the index has one), each with URL,
sha256 and — when the index publishes it (PEP 691 JSON with PEP 700 ``size``) — size.

From that harness keeps, per package, the wheels whose tags fit the target (checked again
here with :func:`wheel_fits`, so a lock never names a file the target cannot install) and the
sdist only where no wheel fits; maps each file's URL to the *name* of the index that served
it (:func:`index_for_url`) and drops the URL (DESIGN invariant 4). An index that serves HTML
only (PEP 503, no sizes; many mirrors and the PyTorch indexes) leaves sizes out of uv's
output; uv has no command that reports them, so harness asks the file's server with one
HTTP ``HEAD`` (``Content-Length``; a streamed ``GET`` checked against the sha256 if the
server will not say). Offline, a missing size is an error.

**Indexes.** ``pypi`` is uv's default index: ``--default-index URL`` only when configured
(else uv's own default, which harness never names). Each extra index of the manifest becomes
``--index NAME=URL`` in manifest order, which puts it *before* the default index. uv's
``first-index`` strategy (its default, and harness's) then takes each package from the
first index that has it, and only from that index: deterministic and safe against dependency
confusion. With a PyTorch-style index listed that means ``torch`` (and anything else that
index mirrors) comes from it and everything else from ``pypi`` — what CUDA builds need. A
mirror that only partly copies a package (few versions) can make that fail; then
``index_strategy="unsafe-best-match"`` (all indexes, best version) is the escape hatch, at the
cost of that safety.

**Per-package indexes** (``package-index = { torch = "pytorch-cu128" }``) are uv's *explicit*
indexes: an explicit index serves only the packages pinned to it. ``uv pip`` has no flag for
that, but ``uv pip compile pyproject.toml`` honours a project's ``[tool.uv.sources]`` and
``[[tool.uv.index]] explicit = true`` (even under ``--no-config``), so harness writes such a
throw-away pyproject (:func:`explicit_pyproject`) holding the requirements as the project's
dependencies. uv pins an index only for a *direct* dependency, so every package named in
``package-index`` becomes one: naming a package there also puts it in the environment.

**Determinism.** ``--no-config`` and a scrubbed environment (:mod:`harness.resolve.uvtool`),
no ``--exclude-newer`` unless given, outputs sorted by name and file name. Re-locking keeps
previous pins: uv reads an existing ``-o`` output file as preferences, so harness writes the
previous pins there (a minimal pylock of names and versions) unless upgrading;
``--upgrade`` / ``--upgrade-package`` pass through. uv builds a source distribution (to read
its metadata) with harness's own interpreter when its minor version is the target's
(:func:`harness.resolve.compile.build_interpreter`), not with whatever ``PATH`` holds.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from typing import TYPE_CHECKING

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from harness.config import DEFAULT_INDEX, Settings
from harness.errors import HarnessError, InputError
from harness.manifests.tomlfile import loads_bounded
from harness.resolve.compile import INDEX_STRATEGIES as INDEX_STRATEGIES
from harness.resolve.compile import OUTPUT, build_interpreter, compile_command
from harness.resolve.compile import index_addresses as index_addresses
from harness.resolve.compile import index_flags as index_flags
from harness.resolve.compile import preferences_pylock as preferences_pylock
from harness.resolve.interpreter import target_tags
from harness.resolve.pins import DistFile, Interpreter, Package
from harness.resolve.uvtool import UvError, run_uv

if TYPE_CHECKING:
    import tomlkit.items

#: PEP 517's fallback when a source tree declares no ``[build-system]``.
DEFAULT_BUILD_REQUIREMENTS = ("setuptools>=40.8.0",)


# --- pure helpers ---------------------------------------------------------------------------


def wheel_fits(filename: str, tags: frozenset[Tag]) -> bool:
    """Whether wheel ``filename`` has a tag in ``tags`` (see :func:`~harness.resolve.interpreter.target_tags`)."""
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return not tags.isdisjoint(wheel_tags)


def explicit_pyproject(
    requirements: Sequence[str], package_index: Mapping[str, str], addresses: Mapping[str, str | None]
) -> str:
    """A pyproject.toml whose dependencies are ``requirements`` plus every package named in
    ``package_index`` not already among them, each such package pinned to its explicit index
    (module doc, "Per-package indexes"). ``addresses`` must hold every index named. Pure."""
    import tomlkit  # here: a lock without per-package indexes never needs it (≈ 15 ms to import)

    named = {canonicalize_name(Requirement(r).name) for r in requirements}
    extra = sorted(n for n in package_index if canonicalize_name(n) not in named)
    doc = tomlkit.document()
    project = tomlkit.table()
    project["name"] = "harness-environment"
    project["version"] = "0"
    project["dependencies"] = [*requirements, *extra]
    doc["project"] = project
    sources = tomlkit.table()
    for package, index in sorted(package_index.items()):
        pin = tomlkit.inline_table()
        pin["index"] = index
        sources[package] = pin
    indexes = tomlkit.aot()
    for index in sorted(set(package_index.values())):
        table = tomlkit.table()
        table["name"] = index
        table["url"] = addresses[index]
        table["explicit"] = True
        indexes.append(table)
    doc["tool"] = {"uv": {"sources": sources, "index": indexes}}
    return tomlkit.dumps(doc)


def _segments(path: str) -> list[str]:
    return [part for part in unquote(path).split("/") if part]


def index_for_url(url: str, addresses: Mapping[str, str | None]) -> str:
    """The name of the index that served the file at ``url``. Pure.

    The configured index on the same scheme, host and port whose path shares the longest
    leading run of segments with the file's path wins (ties: the earlier index). A URL under
    no configured address belongs to ``pypi`` — uv's default index, whose files commonly live
    on another host than its pages. (So an *extra* index must serve its files from under its
    own host, as the PyTorch indexes and lab servers do.)
    """
    file = urlsplit(url)
    best, best_len = None, -1
    for name, address in addresses.items():
        if address is None:
            continue
        base = urlsplit(address)
        if (base.scheme, base.hostname, base.port) != (file.scheme, file.hostname, file.port):
            continue
        length = 0
        for a, b in zip(_segments(base.path), _segments(file.path), strict=False):
            if a != b:
                break
            length += 1
        if length > best_len:
            best, best_len = name, length
    return best if best is not None else DEFAULT_INDEX


@dataclass(frozen=True)
class _File:
    """A file as uv's pylock names it (URL kept only inside this module)."""

    name: str
    url: str
    sha256: str
    size: int | None


@dataclass(frozen=True)
class _Entry:
    name: str
    version: str
    marker: str
    wheels: tuple[_File, ...]
    sdist: _File | None
    local: bool  # a directory / archive / vcs source, not an index package


def _file(table: Mapping[str, object], what: str) -> _File:
    url = table.get("url")
    hashes = table.get("hashes") or {}
    sha256 = hashes.get("sha256") if isinstance(hashes, dict) else None
    if not isinstance(url, str) or not isinstance(sha256, str):
        raise HarnessError(f"uv's pylock lists {what} without a URL and sha256")
    name = table.get("name") if isinstance(table.get("name"), str) else unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    size = table.get("size")
    return _File(str(name), url, sha256.lower(), size if isinstance(size, int) else None)


def parse_pylock(text: str) -> list[_Entry]:
    """The packages of a PEP 751 document as uv writes it. Pure."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(f"cannot read uv's pylock output: {exc}") from None
    entries = []
    for package in data.get("packages", []):
        name = canonicalize_name(str(package["name"]))
        what = f"{name} {package.get('version', '')}".strip()
        local = any(key in package for key in ("directory", "archive", "vcs"))
        wheels = tuple(_file(wheel, what) for wheel in package.get("wheels", []))
        sdist = _file(package["sdist"], what) if "sdist" in package else None
        entries.append(
            _Entry(name, str(package.get("version", "")), str(package.get("marker", "")), wheels, sdist, local)
        )
    return entries


def to_packages(
    entries: Iterable[_Entry],
    *,
    tags: frozenset[Tag],
    addresses: Mapping[str, str | None],
    size_of: Callable[[_File], int],
) -> list[Package]:
    """Pins from parsed pylock entries (module doc): fitting wheels, else the sdist; index
    names, no URLs; sorted. ``size_of`` supplies a size the index did not publish. Pure but
    for ``size_of``."""
    packages = []
    for entry in entries:
        if entry.local:
            continue
        wheels = sorted((w for w in entry.wheels if wheel_fits(w.name, tags)), key=lambda w: w.name)
        chosen = wheels or ([entry.sdist] if entry.sdist else [])
        if not chosen:
            raise HarnessError(f"{entry.name} {entry.version}: no wheel fits the target and there is no sdist")
        names = {index_for_url(f.url, addresses) for f in chosen}
        if len(names) != 1:
            raise HarnessError(
                f"{entry.name} {entry.version}: files come from several indexes ({', '.join(sorted(names))})"
            )

        def dist(f: _File) -> DistFile:
            return DistFile(file=f.name, sha256=f.sha256, size=f.size if f.size is not None else size_of(f))

        packages.append(
            Package(
                name=entry.name,
                version=entry.version,
                index=names.pop(),
                marker=entry.marker,
                wheels=tuple(dist(w) for w in wheels),
                sdist=None if wheels else dist(chosen[0]),
            )
        )
    return sorted(packages)


# --- build requirements ----------------------------------------------------------------------


def build_requirements(source_dir: Path, subdirectory: str | None = None) -> list[str]:
    """``[build-system] requires`` of the source tree at ``source_dir[/subdirectory]``.

    With no pyproject.toml or no ``[build-system]`` table: PEP 517's fallback
    ``setuptools>=40.8.0``. A table without ``requires``, or a requirement that is not PEP
    508, is an InputError. Lock the result as a second resolution so the tree builds offline.
    """
    root = source_dir / subdirectory if subdirectory else source_dir
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return list(DEFAULT_BUILD_REQUIREMENTS)
    try:
        data = loads_bounded(pyproject.read_text(), str(pyproject))  # a source's: bounded like ours
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{pyproject}: cannot read: {exc}") from None
    table = data.get("build-system")
    if table is None:
        return list(DEFAULT_BUILD_REQUIREMENTS)
    requires = table.get("requires") if isinstance(table, dict) else None
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise InputError(f"{pyproject}: build-system.requires must be a list of strings")
    for requirement in requires:
        try:
            Requirement(requirement)
        except InvalidRequirement as exc:
            raise InputError(f"{pyproject}: build-system.requires: {requirement!r}: {exc}") from None
    return list(requires)


#: Asks a PEP 517 backend for its dynamic build requirements: argv is the backend reference,
#: the backend-path entries (JSON) and the hook's name; prints a JSON list.
_HOOK_SCRIPT = """
import importlib, json, os, sys
sys.path[:0] = [os.path.abspath(p) for p in json.loads(sys.argv[2])]
module, _, attribute = sys.argv[1].partition(":")
backend = importlib.import_module(module)
for part in filter(None, attribute.split(".")):
    backend = getattr(backend, part)
hook = getattr(backend, sys.argv[3], None)
if hook is None and sys.argv[3] == "get_requires_for_build_editable":
    hook = getattr(backend, "get_requires_for_build_wheel", None)
sys.stdout.write("\\n" + json.dumps(list(hook({})) if hook is not None else []))
"""


def dynamic_build_requirements(
    root: Path,
    static: Sequence[str],
    *,
    editable: bool,
    key: str,
    indexes: Sequence[str],
    settings: Settings,
    cache_dir: Path,
    offline: bool = False,
) -> list[str]:
    """What the PEP 517 backend of the source tree ``root`` asks for on top of its static
    ``build-system.requires``: ``get_requires_for_build_editable`` (``editable``) or
    ``_wheel`` (hatchling asks for ``editables``, setuptools' legacy backend for ``wheel``).

    The backend runs in a throw-away environment holding ``static``, made by uv with this
    interpreter; the answer is cached under ``cache_dir/build-requires/`` by ``key`` (the
    caller's digest of the tree, subdirectory and mode), so a re-lock asks again only when
    the tree changes. A backend that fails is a HarnessError with its output.
    """
    import json
    import subprocess
    import sys

    from harness.resolve.answercache import cached_answer, remember_answer

    cached = cache_dir / "build-requires" / f"{key}.json"
    remembered = cached_answer(cached)
    if remembered is not None:
        return remembered
    data: dict[str, object] = {}
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = loads_bounded(pyproject.read_text(), str(pyproject))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise InputError(f"{pyproject}: cannot read: {exc}") from None
    table = data.get("build-system") if isinstance(data.get("build-system"), dict) else {}
    assert isinstance(table, dict)
    backend = str(table.get("build-backend") or "setuptools.build_meta:__legacy__")
    backend_path = [str(p) for p in table.get("backend-path", []) if isinstance(p, str)]
    hook = "get_requires_for_build_editable" if editable else "get_requires_for_build_wheel"
    addresses = index_addresses(indexes, settings)
    with tempfile.TemporaryDirectory(prefix="harness-build-requires-") as tmp:
        venv = Path(tmp) / "venv"
        run_uv(["venv", venv, "--python", sys.executable, "--no-project", "--quiet"], cache_dir=cache_dir)
        if static:
            run_uv(
                [
                    "pip",
                    "install",
                    "--python",
                    venv / "bin" / "python",
                    "--quiet",
                    *index_flags(addresses),
                    *(["--offline"] if offline else []),
                    *static,
                ],
                cache_dir=cache_dir,
            )
        work = Path(tmp) / "tree"
        shutil.copytree(root, work, symlinks=True)  # backends may write into the tree they read
        for folder, dirs, names in os.walk(work):
            for name in [*dirs, *names]:
                path = Path(folder) / name
                if not path.is_symlink():
                    path.chmod(path.stat().st_mode | 0o200)
        proc = subprocess.run(
            [os.fspath(venv / "bin" / "python"), "-c", _HOOK_SCRIPT, backend, json.dumps(backend_path), hook],
            cwd=work,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=600,
        )
    if proc.returncode != 0:
        raise HarnessError(
            f"{root}: build backend {backend} failed answering {hook}:\n{(proc.stderr or proc.stdout).strip()[-3000:]}"
        )
    try:
        found = json.loads(proc.stdout.rsplit("\n", 1)[-1])
    except ValueError:
        raise HarnessError(f"{root}: build backend {backend} gave no answer to {hook}") from None
    requirements = []
    for requirement in found:
        try:
            requirements.append(str(Requirement(str(requirement))))
        except InvalidRequirement as exc:
            raise HarnessError(f"{root}: build backend {backend} asks for {requirement!r}: {exc}") from None
    remember_answer(cached, requirements)
    return requirements


# --- resolving ------------------------------------------------------------------------------


def resolve_packages(
    requirements: Sequence[str],
    *,
    interpreter: Interpreter,
    indexes: Sequence[str],
    settings: Settings,
    cache_dir: Path,
    offline: bool = False,
    upgrade: bool = False,
    upgrade_packages: Sequence[str] = (),
    previous: Sequence[Package] | None = None,
    extra_paths: Sequence[Path | tuple[Path, Sequence[str]]] = (),
    exclude_newer: str | None = None,
    index_strategy: str = "first-index",
    timeout: float | None = 900,
    package_index: Mapping[str, str] | None = None,
) -> list[Package]:
    """Pin ``requirements`` (plus the dependencies of the local source trees ``extra_paths``)
    for exactly ``interpreter``'s version and platform. See the module doc; ``package_index``
    maps package names to the explicit index each comes from ("Per-package indexes").

    The local trees themselves are sources, not packages: they are not in the result. Raises
    HarnessError with uv's explanation when the requirements cannot be satisfied, and a
    clear HarnessError when ``offline`` and uv's cache lacks something.
    """
    package_index = dict(package_index or {})
    addresses = index_addresses(indexes, settings)
    explicit = {name: settings.index_url(name) for name in sorted(set(package_index.values()))}
    # Every index a file may come from, for naming it; the explicit ones are no --index flags.
    all_addresses = {**explicit, **addresses}
    tags = target_tags(interpreter.version, interpreter.platform)
    cache_dir.mkdir(parents=True, exist_ok=True)
    command = compile_command(
        requirements,
        version=interpreter.version,
        platform=interpreter.platform,
        addresses=addresses,
        offline=offline,
        upgrade=upgrade,
        upgrade_packages=upgrade_packages,
        previous=[(p.name, p.version) for p in previous or ()],
        paths=[_path_line(p) for p in extra_paths],
        pyproject=explicit_pyproject(requirements, package_index, all_addresses) if package_index else None,
        exclude_newer=exclude_newer,
        index_strategy=index_strategy,
        build_python=build_interpreter(interpreter.version),
    )
    with tempfile.TemporaryDirectory(prefix="harness-resolve-") as tmp:
        work = Path(tmp)
        for name, content in command.files.items():
            (work / name).write_text(content)
        try:
            run_uv(command.args, cache_dir=cache_dir, cwd=work, timeout=timeout)
        except UvError as exc:
            raise _resolution_error(exc, interpreter, offline) from None
        text = (work / OUTPUT).read_text()
    entries = parse_pylock(text)
    _remember_urls(entries)
    return to_packages(
        entries,
        tags=tags,
        addresses=all_addresses,
        size_of=lambda f: _remote_size(f, offline=offline, addresses=all_addresses),
    )


#: Where uv found each file it resolved in this process, by sha256: a lock keeps no URL
#: (DESIGN invariant 4), but the sdists it fetches right after resolving need no page lookup.
_URLS: dict[str, str] = {}


def _remember_urls(entries: Iterable[_Entry]) -> None:
    for entry in entries:
        for file in (*entry.wheels, *([entry.sdist] if entry.sdist else [])):
            _URLS[file.sha256] = file.url


def resolved_url(sha256: str) -> str | None:
    """The URL a resolution in this process found the file of ``sha256`` at, if any (the
    caller checks what it downloads against the sha256, as always)."""
    return _URLS.get(sha256)


def _path_line(entry: Path | tuple[Path, Sequence[str]]) -> str:
    """A local project as a requirement line: its absolute path, extras in brackets."""
    path, extras = (entry, ()) if isinstance(entry, Path) else entry
    line = os.fspath(Path(path).resolve())
    return f"{line}[{','.join(extras)}]" if extras else line


def _resolution_error(exc: UvError, interpreter: Interpreter, offline: bool) -> HarnessError:
    explanation = exc.stderr.strip() or str(exc)
    target = f"CPython {interpreter.version} on {interpreter.platform}"
    if offline and re.search(
        r"in the cache|network (?:was|is) disabled|network connectivity is disabled", explanation, re.IGNORECASE
    ):
        return HarnessError(
            f"cannot resolve for {target} offline: uv's cache lacks what it needs:\n{explanation}",
            hint="lock once with network access (without --offline) to fill the cache",
        )
    if "wheel variants" in explanation:
        # An index serving a release only as variant-labelled wheels (PEP 825's
        # ``...-manylinux_2_28_x86_64-cu128.whl``): uv resolves none of them, and neither does harness.
        return HarnessError(
            f"cannot resolve the requirements for {target}: an index serves a release only as variant-labelled "
            f"wheels (PEP 825), which harness does not install yet:\n{explanation}",
            hint="give each accelerator variant an index serving plain wheels of its build (torch 2.7.0+cu128 "
            "from a per-variant index: [environment.variants.<name>] package-index); harness reads the "
            "-variants.json such an index serves beside them",
        )
    return HarnessError(f"cannot resolve the requirements for {target}:\n{explanation}")


#: Sizes :func:`_remote_size` was told, by (URL, sha256), with a lock per file: the platforms
#: of a lock resolve side by side and share their pure-Python wheels, asked for once.
_SIZES: dict[tuple[str, str], int] = {}
_SIZE_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_SIZE_LOCKS_LOCK = threading.Lock()


def _remote_size(file: _File, *, offline: bool, addresses: Mapping[str, str | None]) -> int:
    """The size of a file whose index did not publish one (module doc), asked once per process."""
    key = (file.url, file.sha256)
    with _SIZE_LOCKS_LOCK:
        one_at_a_time = _SIZE_LOCKS.setdefault(key, threading.Lock())
    with one_at_a_time:
        if key not in _SIZES:
            _SIZES[key] = _ask_size(file, offline=offline, addresses=addresses)
        return _SIZES[key]


def _ask_size(file: _File, *, offline: bool, addresses: Mapping[str, str | None]) -> int:
    import urllib.error  # here: urllib.request (http.client, ssl, email) is slow to import
    import urllib.request

    index = index_for_url(file.url, addresses)
    if offline:
        raise HarnessError(
            f"{file.name}: index {index!r} publishes no file sizes, and harness is offline",
            hint="lock once with network access",
        )
    try:
        with urllib.request.urlopen(urllib.request.Request(file.url, method="HEAD"), timeout=60) as resp:
            length = resp.headers.get("Content-Length")
            if length is not None and length.isdigit():
                return int(length)
    except urllib.error.HTTPError as exc:
        if exc.code not in (405, 501):
            raise HarnessError(f"{file.name}: index {index!r} answered {exc.code} to a size query") from None
    except (urllib.error.URLError, OSError) as exc:
        raise HarnessError(f"{file.name}: cannot ask index {index!r} for the file's size: {exc}") from None
    digest, size = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(file.url, timeout=60) as resp:
            while chunk := resp.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except (urllib.error.URLError, OSError) as exc:
        raise HarnessError(f"{file.name}: cannot download it from index {index!r}: {exc}") from None
    if digest.hexdigest() != file.sha256:
        raise HarnessError(f"{file.name}: the file from index {index!r} does not match its sha256")
    return size


# --- installing -----------------------------------------------------------------------------


def pylock_for_install(packages: Iterable[Package], wheel_paths: Mapping[str, Path]) -> str:
    """A minimal PEP 751 document installing ``packages`` from realized local files.

    ``wheel_paths`` maps file names to realized files. Per package, every locked wheel present
    there becomes a ``wheels`` entry with ``path``, size and the lock's sha256 (so uv checks
    the realized bytes against the lock). A package with none falls back to its locked sdist
    if present, else to any other wheel of that name and version given there (a wheel built
    from the sdist; hashed here). Install with ``uv pip sync --offline --preview-features
    pylock FILE`` where FILE is named ``pylock.toml`` or ``pylock.<name>.toml``.
    """
    import tomlkit  # here: see explicit_pyproject

    doc = tomlkit.document()
    doc["lock-version"] = "1.0"
    doc["created-by"] = "harness"
    entries = tomlkit.aot()
    for package in sorted(packages):
        table = tomlkit.table()
        table["name"] = package.name
        table["version"] = package.version
        if package.marker:
            table["marker"] = package.marker
        wheels = [
            _local(w.file, wheel_paths[w.file], w.sha256, w.size) for w in package.wheels if w.file in wheel_paths
        ]
        if not wheels and package.sdist is not None and package.sdist.file in wheel_paths:
            s = package.sdist
            table["sdist"] = _local(s.file, wheel_paths[s.file], s.sha256, s.size)
        else:
            if not wheels:
                wheels = [
                    _local(name, path, None, None)
                    for name, path in sorted(wheel_paths.items())
                    if _is_wheel_of(name, package)
                ]
            if not wheels:
                raise HarnessError(f"{package.name} {package.version}: no realized file given to install")
            array = tomlkit.array()
            array.extend(wheels)
            table["wheels"] = array.multiline(len(wheels) > 1)
        entries.append(table)
    doc["packages"] = entries
    return tomlkit.dumps(doc)


def _is_wheel_of(filename: str, package: Package) -> bool:
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return name == canonicalize_name(package.name) and str(version) == package.version


def _local(name: str, path: Path, sha256: str | None, size: int | None) -> tomlkit.items.InlineTable:
    import tomlkit

    path = Path(path)
    if sha256 is None:
        sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        size = path.stat().st_size
    table = tomlkit.inline_table()
    table["name"] = name
    table["path"] = os.fspath(path.absolute())
    if size is not None:
        table["size"] = size
    hashes = tomlkit.inline_table()
    hashes["sha256"] = sha256
    table["hashes"] = hashes
    return table
