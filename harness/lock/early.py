"""Start uv's resolutions before the manifests are validated, so uv and the imports overlap.

``harness lock`` spends its first ≈0.25 s importing pydantic and the lock models and
validating the manifests; uv needs 0.3–0.7 s to resolve. :func:`prestart_locks` reads each
manifest to lock as raw TOML (tomllib), works out the ``uv pip compile`` run that
:func:`harness.resolve.python.resolve_packages` will make for it (the same
:func:`harness.resolve.compile.compile_command`, the same settings, previous pins and target),
and starts it, with ``uv --version`` and uv's interpreter download list, through
:func:`harness.resolve.uvtool.prestart`. The full path then validates everything as before;
a run started here is used only where the validated path asks for exactly the same command,
environment and input files, and is otherwise stopped unused (a manifest that does not
validate, a guess that was wrong): it can save time, never change a result.

Nothing is started for a manifest whose lock the stamp will keep (:mod:`harness.lock.stamp`).
Only the plain case is guessed: a manifest without git sources (their dependencies need the
source exported first) and without ``package-index``, whose requirements name no URL or path
(validation refuses those, and uv must never fetch or build one before it does), and whose
exact Python version is known without asking uv (a ``[lock.python]`` pin, the previous
lock's version, or an exact request).
Anything unexpected in the raw TOML just means nothing is started for that manifest.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import InputError
from harness.lock.outcome import LockOptions
from harness.manifests.tomlfile import loads_bounded, read_bounded

if TYPE_CHECKING:
    from harness.manifests.project import Project


def prestart_locks(home: Path, project: Project, names: list[str], options: LockOptions) -> int:
    """Start the resolutions a lock of ``names`` (all when empty) will run; returns how many
    ``uv pip compile`` runs were started. Never raises."""
    try:
        return _prestart(home, project, names, options)
    except Exception:  # a guess only: whatever goes wrong here, the full path decides
        return 0


def _prestart(home: Path, project: Project, names: list[str], options: LockOptions) -> int:
    from harness.config import load_settings
    from harness.lock.stamp import LockStamps, manifest_files
    from harness.resolve.compile import build_interpreter, compile_command, index_addresses
    from harness.resolve.uvtool import prestart

    files = manifest_files(project)
    if not files:
        return 0
    chosen = list(dict.fromkeys(names)) if names else sorted(files)
    settings = load_settings(home, project.root)
    targets = _targets(settings, options)
    cache_dir = home / "cache"
    stamps = LockStamps(cache_dir, project, platform=options.platform)
    common = None if options.resolves_anyway else stamps.common()
    started = 0
    for name in chosen:
        if name not in files:
            continue
        if common is not None and stamps.unchanged(name, files[name], common) is not None:
            continue  # kept as it is, once the project validates: nothing to resolve
        try:
            environment = _bounded(files[name]).get("environment")
        except (OSError, ValueError, InputError):
            continue  # the project's validation reports it, naming the file and the key
        if not isinstance(environment, dict) or any(
            environment.get(key) for key in ("sources", "package-index", "variants")
        ):
            continue
        request = environment.get("python")
        requirements = environment.get("requirements", [])
        indexes = environment.get("indexes", [])
        if not isinstance(request, str) or not _strings(requirements) or not _strings(indexes):
            continue
        if not all(_PLAIN.match(r) and not _NOT_PLAIN.search(r) for r in requirements):
            continue  # a URL or a path: refused by validation, and never handed to uv before it
        previous = _previous(project.locks_dir / f"{name}.lock.toml")
        version = _version(request, settings.python_pins, previous, options)
        if version is None:
            continue
        addresses = index_addresses(indexes, settings)
        for target in targets:
            command = compile_command(
                requirements,
                version=version,
                platform=target,
                addresses=addresses,
                offline=options.offline,
                upgrade=options.upgrade,
                upgrade_packages=options.upgrade_packages,
                previous=_previous_pins(previous, target, options),
                build_python=build_interpreter(version),
            )
            prestart(command.args, cache_dir=cache_dir, files=command.files)
            started += 1
    if started:
        # What every lock also asks uv, unless this process already knows the answer
        # (resolve.uvtool.uv_version, generate._pin_interpreter).
        from harness.resolve.uvtool import downloads_list_args, downloads_list_file, uv_version

        if not uv_version.cache_info().currsize:
            prestart(["--version"])
        generate = sys.modules.get("harness.lock.generate")
        for key in dict.fromkeys(_list_key(target) for target in targets):
            known = generate is not None and (cache_dir, key) in generate._DOWNLOADS
            if not known and not downloads_list_file(cache_dir, key).is_file():
                prestart(downloads_list_args(key), cache_dir=cache_dir, python_downloads="automatic")
    return started


def _list_key(platform: str) -> str:
    """:func:`harness.resolve.interpreter.python_list_key` of a canonical platform; a manylinux
    one without importing that module."""
    match = _CANONICAL.fullmatch(platform)
    if match:
        return f"linux-{match.group(1)}-gnu"
    from harness.resolve.interpreter import parse_platform, python_list_key

    return python_list_key(parse_platform(platform))


def _strings(values: object) -> bool:
    return isinstance(values, list) and all(isinstance(v, str) for v in values)


def _targets(settings: Any, options: LockOptions) -> list[str]:
    """:func:`harness.lock.generate.lock_targets`'s platforms (the canonical spellings). A
    name in uv's canonical manylinux spelling is taken as it is, without importing
    :mod:`harness.resolve.interpreter` (packaging's tags: tens of milliseconds)."""
    if options.platform:
        wanted = [options.platform]
    elif settings.lock_platforms:
        wanted = list(settings.lock_platforms)
    else:
        wanted = []
    if all(_CANONICAL.fullmatch(p) for p in wanted) and wanted:
        return list(dict.fromkeys(wanted))
    from harness.resolve.interpreter import host_platform, parse_platform

    return list(dict.fromkeys(parse_platform(p).platform for p in wanted or [host_platform()]))


#: A requirement that names an index package: a name first, and no URL or path anywhere
#: (uv would fetch, and could build, one of those before validation refuses the manifest).
_PLAIN = re.compile(r"[A-Za-z0-9]")
_NOT_PLAIN = re.compile(r"[@/\\]|://")
_CANONICAL = re.compile(r"(x86_64|aarch64)-manylinux_2_\d+")


def _previous(path: Path) -> dict[str, Any] | None:
    try:
        return _bounded(path)
    except (OSError, ValueError, InputError):
        return None


def _bounded(path: Path) -> dict[str, Any]:
    """``path`` parsed within the limits of every document harness reads
    (:mod:`harness.manifests.tomlfile`)."""
    return loads_bounded(read_bounded(path, str(path)).decode("utf-8"), str(path))


def _version(request: str, pins: dict[str, str], previous: dict[str, Any] | None, options: LockOptions) -> str | None:
    """The exact version the lock will resolve for, as generate._python_version chooses it
    when it knows it up front; None when only uv's interpreter listing can say."""
    pin = pins.get(request)
    if pin is None and previous is not None and not options.upgrade:
        version = previous.get("python", {}).get("version")
        if isinstance(version, str) and (version == request or version.startswith(request + ".")):
            pin = version
    return pin or (request if request.count(".") == 2 else None)


def _previous_pins(previous: dict[str, Any] | None, target: str, options: LockOptions) -> list[tuple[str, str]] | None:
    """The previous lock's (name, version) pins for ``target``, as generate._previous_for and
    platforms.for_platform give them: its own platform's, else its first platform's."""
    if previous is None or options.upgrade:
        return None
    targets = [t.get("platform") for t in previous.get("targets", [])]
    held = target if not targets or target in targets else targets[0]
    return [
        (str(p["name"]), str(p["version"]))
        for p in previous.get("packages", [])
        if not p.get("platforms") or held in p["platforms"]
    ]
