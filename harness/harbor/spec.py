"""Which harness environment a Harbor task runs in: ``environment/harness.toml`` plus ``--ek``.

The file lives in the task's ``environment/`` folder, so Harbor's task digest (``task.digest``
in ``lock.json``, which hashes every file of ``environment/``) covers it. Three forms::

    # 1. a manifest of a harness project, pinned to the store path its lock realizes to
    manifest = "reach"
    environment = "i61fpgkmw3ayk5f5biz973c10bq9iq0k-reach-env"
    project = "../../.."          # optional: else the nearest folder above holding services/

    # 2. a lock carried by the task itself (its bytes are then part of the task digest)
    lock = "reach.lock.toml"      # relative to this file
    project = "../../.."          # optional: resolves the lock's `path` weights

    # 3. a realized store path alone (pulled from the configured substituters if missing)
    environment = "i61fpgkmw3ayk5f5biz973c10bq9iq0k-reach-env"

``--ek`` (Harbor's environment kwargs, recorded in ``lock.json`` too) may override any of
``manifest``, ``lock``, ``project`` and ``environment``; naming ``manifest`` or ``lock`` there
drops the file's pin and the other form's key (the override names a different environment).
Relative paths given with ``--ek`` are relative to the current directory.

Pure: text and paths in, an :class:`EnvironmentSpec` out; nothing is realized here.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.errors import InputError
from harness.manifests.tomlfile import loads_bounded

FILE_NAME = "harness.toml"
KEYS = ("manifest", "lock", "project", "environment")
_STORE_NAME = r"^[0-9a-z]{32}-[A-Za-z0-9._+-]+$"


@dataclass(frozen=True)
class EnvironmentSpec:
    """What a task asks for. Exactly one of manifest, lock or (alone) environment names it."""

    manifest: str | None = None
    lock: Path | None = None
    project: Path | None = None
    environment: str | None = None  # a store path name: the pin, or the whole spec (form 3)
    source: str = ""  # where it was read from, for messages

    @property
    def form(self) -> str:
        if self.manifest:
            return "manifest"
        if self.lock:
            return "lock"
        return "store"

    def describe(self) -> str:
        if self.manifest:
            return f"manifest {self.manifest}"
        if self.lock:
            return f"lock {self.lock}"
        return f"store path {self.environment}"

    def as_json(self) -> dict[str, Any]:
        return {
            "form": self.form,
            "manifest": self.manifest,
            "lock": str(self.lock) if self.lock else None,
            "project": str(self.project) if self.project else None,
            "environment": self.environment,
            "source": self.source,
        }


def read_spec(
    environment_dir: Path,
    overrides: dict[str, Any] | None = None,
    *,
    cwd: Path | None = None,
    default: EnvironmentSpec | None = None,
) -> EnvironmentSpec:
    """The spec of a task whose ``environment/`` folder is ``environment_dir``.

    ``default`` (the environment a rootfs template names, :mod:`harness.harbor.rootfs`)
    stands in when neither the file nor the overrides name one. Raises :class:`InputError`
    naming the file and key for a malformed file, an unknown key, or a spec that names
    nothing (no file, no override, no default).
    """
    path = environment_dir / FILE_NAME
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = loads_bounded(path.read_text(encoding="utf-8"), str(path))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise InputError(
            f"{path}: unknown key(s) {', '.join(unknown)}",
            hint=f"the keys are {', '.join(KEYS)} (see docs/src/content/docs/guides/harbor.md)",
        )
    for key, value in data.items():
        if not isinstance(value, str) or not value:
            raise InputError(f"{path}: {key} must be a non-empty string")
    base = environment_dir
    spec = EnvironmentSpec(
        manifest=data.get("manifest"),
        lock=_path(base, data.get("lock")),
        project=_path(base, data.get("project")),
        environment=data.get("environment"),
        source=str(path) if path.is_file() else "",
    )
    spec = apply_overrides(spec, overrides or {}, cwd=cwd or Path.cwd())
    if default is not None and not (spec.manifest or spec.lock or spec.environment):
        spec = replace(default, project=spec.project or default.project)
    return validate(spec, where=spec.source or "the environment kwargs")


def apply_overrides(spec: EnvironmentSpec, overrides: dict[str, Any], *, cwd: Path) -> EnvironmentSpec:
    """``spec`` with the ``--ek`` keys that name an environment applied (see the module doc)."""
    given = {k: v for k, v in overrides.items() if k in KEYS and v not in (None, "")}
    if not given:
        return spec
    for key, value in given.items():
        if not isinstance(value, str):
            raise InputError(f"environment kwarg {key} must be a string, not {value!r}")
    changes: dict[str, Any] = {}
    if "manifest" in given or "lock" in given:
        changes.update(manifest=None, lock=None, environment=None)
    if "manifest" in given:
        changes["manifest"] = given["manifest"]
    if "lock" in given:
        changes["lock"] = _path(cwd, given["lock"])
    if "project" in given:
        changes["project"] = _path(cwd, given["project"])
    if "environment" in given:
        changes["environment"] = given["environment"]
    where = "--ek " + ", ".join(f"{k}={v}" for k, v in sorted(given.items()))
    source = f"{spec.source} with {where}" if spec.source else where
    return replace(spec, source=source, **changes)


def validate(spec: EnvironmentSpec, *, where: str) -> EnvironmentSpec:
    import re

    if spec.manifest and spec.lock:
        raise InputError(f"{where}: name either manifest or lock, not both")
    if not (spec.manifest or spec.lock or spec.environment):
        raise InputError(
            f"{where}: names no environment"
            if where != "the environment kwargs"
            else f"the task has no environment/{FILE_NAME} and no --ek manifest, lock or environment",
            hint=f"write environment/{FILE_NAME} (manifest and environment, a lock, or a store path); "
            "see docs/src/content/docs/guides/harbor.md",
        )
    if spec.environment and not re.match(_STORE_NAME, spec.environment):
        raise InputError(
            f"{where}: environment = {spec.environment!r} is not a store path name (<32 characters>-<name>)"
        )
    return spec


def _path(base: Path, value: str | None) -> Path | None:
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path)
