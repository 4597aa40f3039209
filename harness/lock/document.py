"""The lockfile: what ``harness lock`` writes and ``harness realize`` builds from.

One lock per manifest, ``locks/<name>.lock.toml``. It holds no addresses: indexes and hubs
are named, files are named and hashed (DESIGN invariant 4). Every object carries the store
path it will realize to, computed by :func:`harness.lock.storepaths.assign_store_paths` from
the lock's own content, so a lock alone says what a store must hold.

The document is a strict pydantic model so a hand-edited or corrupted lock is rejected with
the file and key, like a manifest.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from harness.manifests.model import Strict

LOCK_VERSION = 1


class LockedInterpreter(Strict):
    implementation: str
    version: str
    platform: str
    source: Literal["uv-managed", "host"]
    store: str = ""


class LockedFile(Strict):
    """A wheel or sdist, by name, size and hash; ``store`` is the path it realizes to."""

    file: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    store: str = ""


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

    path: str
    url: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")


class LockedSource(Strict):
    name: str
    repo: str
    rev: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    tree: str = Field(pattern=r"^blake3:[0-9a-f]{64}$")
    install: Literal["editable", "regular", "none"]
    subdirectory: str | None = None
    #: False: built against the environment's own packages (``--no-build-isolation``).
    build_isolation: bool = Field(default=True, alias="build-isolation")
    model_config = Strict.model_config | {"populate_by_name": True}
    #: Every submodule, recursively, sorted by path; ``tree`` covers their files.
    submodules: list[LockedSubmodule] = Field(default_factory=list)
    store: str = ""


class LockedWeightFile(Strict):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    revision: str | None = None


class LockedWeights(Strict):
    dir: str
    provider: Literal["huggingface_model", "modelscope_model", "url", "path"]
    repo: str
    revision: str | None = None
    #: Hugging Face repository type; written to the lockfile only when not "model".
    repo_type: Literal["model", "dataset"] = "model"
    files: list[LockedWeightFile] = Field(default_factory=list)
    store: str = ""


class LockedTarget(Strict):
    """One platform of a lock for several (``[lock] platforms``): where its interpreter comes
    from and the store paths its interpreter and environment realize to."""

    platform: str
    source: Literal["uv-managed", "host"]
    python: str = ""
    environment: str = ""


class LockedEnvironment(Strict):
    """The virtual environment built from the interpreter, packages and sources."""

    store: str = ""


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
