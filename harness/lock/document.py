"""The lockfile: what ``harness lock`` writes and ``harness realize`` builds from.

One lock per manifest, ``locks/<name>.lock.toml``. It holds no addresses: indexes and hubs
are named, files are named and hashed (DESIGN invariant 4). Every object carries the store
path it will realize to, computed by :func:`harness.lock.storepaths.assign_store_paths` from
the lock's own content, so a lock alone says what a store must hold.

The document is a strict pydantic model so a hand-edited or corrupted lock is rejected with
the file and key, like a manifest.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator

from harness.manifests.model import Strict

LOCK_VERSION = 1
#: The lock versions this harness reads.
READABLE_LOCK_VERSIONS = (1,)

# ``<32 characters of Nix base32>-<name>`` (store/README.md section 3): no ``/``, no ``..``.
_STORE_PATH = re.compile(r"^[0-9a-df-np-sv-z]{32}-[A-Za-z0-9+_-][A-Za-z0-9+._-]{0,199}$")


def _store_path(value: str) -> str:
    # Checked before realize makes anything of it (a lock file, a build folder): a
    # hand-edited name with ``/`` or ``..`` would otherwise point outside the store.
    if value and not _STORE_PATH.match(value):
        raise ValueError(
            f"{value!r} is not a store path name (32 base32 characters, '-', then 1-200 of "
            "A-Z a-z 0-9 + - . _); run `harness lock` to write the lock again"
        )
    return value


def _file_name(value: str) -> str:
    if not value or "/" in value or "\\" in value or value in (".", "..") or "\0" in value:
        raise ValueError(f"{value!r} is not a plain file name")
    return value


def _inside(value: str) -> str:
    path = PurePosixPath(value)
    if not value or value.startswith("/") or ".." in path.parts or "\\" in value or "\0" in value:
        raise ValueError(f"{value!r} must be a relative path inside its folder")
    return value


StorePath = Annotated[str, AfterValidator(_store_path)]
FileName = Annotated[str, AfterValidator(_file_name)]
InsidePath = Annotated[str, AfterValidator(_inside)]


class LockedInterpreter(Strict):
    implementation: str
    version: str
    platform: str
    source: Literal["uv-managed", "host"]
    store: StorePath = ""


class LockedFile(Strict):
    """A wheel or sdist, by name, size and hash; ``store`` is the path it realizes to."""

    file: FileName
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    store: StorePath = ""


class LockedPackage(Strict):
    name: str
    version: str
    index: str
    marker: str = ""
    #: In a lock for several platforms: the platforms this pin is for (empty: every one).
    platforms: list[str] = Field(default_factory=list)
    wheels: list[LockedFile] = Field(default_factory=list)
    sdist: LockedFile | None = None


class LockedSubmodule(Strict):
    """A git submodule of a source: its path in the tree, canonical URL and commit."""

    path: InsidePath
    url: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")


class LockedSource(Strict):
    name: str
    repo: str
    rev: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    tree: str = Field(pattern=r"^blake3:[0-9a-f]{64}$")
    install: Literal["editable", "regular", "none"]
    subdirectory: InsidePath | None = None
    #: False: built against the environment's own packages (``--no-build-isolation``).
    build_isolation: bool = Field(default=True, alias="build-isolation")
    model_config = Strict.model_config | {"populate_by_name": True}
    #: Every submodule, recursively, sorted by path; ``tree`` covers their files.
    submodules: list[LockedSubmodule] = Field(default_factory=list)
    store: StorePath = ""


class LockedWeightFile(Strict):
    path: InsidePath
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    revision: str | None = None


class LockedWeights(Strict):
    dir: InsidePath
    provider: Literal["huggingface_model", "modelscope_model", "url", "path"]
    repo: str
    revision: str | None = None
    #: Hugging Face repository type; written to the lockfile only when not "model".
    repo_type: Literal["model", "dataset"] = "model"
    files: list[LockedWeightFile] = Field(default_factory=list)
    store: StorePath = ""


class LockedTarget(Strict):
    """One platform of a lock for several (``[lock] platforms``): where its interpreter comes
    from and the store paths its interpreter and environment realize to."""

    platform: str
    source: Literal["uv-managed", "host"]
    python: StorePath = ""
    environment: StorePath = ""


class LockedEnvironment(Strict):
    """The virtual environment built from the interpreter, packages and sources."""

    store: StorePath = ""


class Lock(Strict):
    """A whole lockfile."""

    lock_version: int = Field(alias="lock-version")
    name: str
    type: Literal["service", "benchmark"]
    manifest: str
    manifest_digest: str = Field(alias="manifest-digest")
    uv: str
    python: LockedInterpreter
    environment: LockedEnvironment = Field(default_factory=LockedEnvironment)
    #: Several platforms in one lock: one entry each, in ``[lock] platforms`` order; empty for a
    #: lock of one platform. ``python`` and ``environment`` then describe the first, and
    #: :func:`harness.lock.platforms.for_platform` gives any one as a lock of its own.
    targets: list[LockedTarget] = Field(default_factory=list)
    packages: list[LockedPackage] = Field(default_factory=list)
    build_packages: list[LockedPackage] = Field(default_factory=list, alias="build-packages")
    sources: list[LockedSource] = Field(default_factory=list)
    weights: list[LockedWeights] = Field(default_factory=list)

    # Spelled out (not Strict.model_config | {...}) so the pydantic mypy plugin sees it.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, populate_by_name=True)

    @field_validator("lock_version")
    @classmethod
    def _readable(cls, value: int) -> int:
        if value not in READABLE_LOCK_VERSIONS:
            readable = ", ".join(str(v) for v in READABLE_LOCK_VERSIONS)
            raise ValueError(
                f"lock-version {value} is not one this harness reads (it reads {readable}); "
                "upgrade harness, or run `harness lock` to write the lock again"
            )
        return value
