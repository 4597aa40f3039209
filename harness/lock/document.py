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

from harness.lock.variants import check_wheel_entry, needed_cuda
from harness.manifests.model import Strict
from harness.resolve.pins import WeightFile, WeightSet

LOCK_VERSION = 1
#: The version of a lock whose sources have ``links`` (source views): a harness from before them
#: refuses it by its version, naming what to do, rather than by an unknown key. Every other
#: lock stays version 1, byte for byte.
LINKS_LOCK_VERSION = 2
#: The lock versions this harness reads.
READABLE_LOCK_VERSIONS = (1, 2)

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
WheelEntry = Annotated[str, AfterValidator(check_wheel_entry)]
FileName = Annotated[str, AfterValidator(_file_name)]
InsidePath = Annotated[str, AfterValidator(_inside)]


class LockedInterpreter(Strict):
    """The interpreter the environment is built on (for a lock of several platforms: the first's)."""

    implementation: str = Field(description="The Python implementation: cpython.")
    version: str = Field(description="The exact release, 3.X.Y: the manifest's request as pinned.")
    platform: str = Field(description="The target platform the lock resolved for, in uv's vocabulary.")
    source: Literal["uv-managed", "host"] = Field(
        description="uv-managed: uv offers a download of this release for the platform, and realize installs "
        "it; host: it offers none, and an installed CPython of this version is copied in."
    )
    store: StorePath = Field(default="", description="The store path the interpreter realizes to.")


class LockedFile(Strict):
    """A wheel or sdist, by name, size and hash; ``store`` is the path it realizes to."""

    file: FileName = Field(description="The file name as the index serves it (a plain name, never a URL).")
    size: int = Field(ge=0, description="Its size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Its sha256; realize refuses a file that differs.")
    store: StorePath = Field(default="", description="The store path the file realizes to.")


class LockedPackage(Strict):
    """One pinned Python package and the files that install it."""

    name: str = Field(description="The normalized package name.")
    version: str = Field(description="The exact version uv resolved (a local label such as +cu128 included).")
    index: str = Field(description="The name of the index its files come from (pypi, or a name from the settings).")
    marker: str = Field(default="", description="The environment marker under which it is installed (empty: always).")
    #: In a lock for several platforms: the platforms this pin is for (empty: every one).
    platforms: list[str] = Field(
        default_factory=list,
        description="In a lock for several platforms: the platforms this pin is for (empty: every one).",
    )
    #: In a lock of accelerator variants: the variants this pin is for (empty: every one).
    variants: list[str] = Field(
        default_factory=list,
        description="In a lock of accelerator variants: the variants this pin is for (empty: every one).",
    )
    wheels: list[LockedFile] = Field(default_factory=list, description="The wheels that fit the target platform(s).")
    sdist: LockedFile | None = Field(
        default=None, description="The source distribution, recorded only when no wheel fits; realize builds it."
    )
    #: False: its sdist is built against the environment's own packages (``--no-build-isolation``).
    build_isolation: bool = Field(
        default=True,
        alias="build-isolation",
        description="false: its sdist is built against the environment's own packages, after the rest is "
        "installed (the manifest's no-build-isolation).",
    )
    #: The build packages (``name==version``) its sdist's isolated build uses; empty: all of them.
    build_requires: list[str] = Field(
        default_factory=list,
        alias="build-requires",
        description="An sdist built in isolation: the build packages (name==version) its build environment is "
        "made of, resolved for its own build requirements alone; empty (a lock written before): every build "
        "package.",
    )
    model_config = Strict.model_config | {"populate_by_name": True}


class LockedSubmodule(Strict):
    """A git submodule of a source: its path in the tree, canonical URL and commit."""

    path: InsidePath = Field(description="Its path in the parent's tree.")
    url: str = Field(
        description="Its canonical URL, from the commit's .gitmodules (a relative URL resolved against the parent's)."
    )
    commit: str = Field(pattern=r"^[0-9a-f]{40}$", description="The commit the parent's tree pins it to.")


class LockedSource(Strict):
    """One git source pinned: the manifest's entry, the commit it resolved to and the hash of its files."""

    name: str = Field(description="A short name: the repository's last path component ({source:NAME}).")
    repo: str = Field(description="The canonical repository URL, as the manifest writes it (never a mirror's).")
    rev: str = Field(description="The rev the manifest asked for.")
    commit: str = Field(pattern=r"^[0-9a-f]{40}$", description="The full commit rev resolved to.")
    tree: str = Field(
        pattern=r"^blake3:[0-9a-f]{64}$",
        description="The content hash of the commit's files, submodules included (the store's NAR hash); "
        "realize checks the export against it.",
    )
    install: Literal["editable", "regular", "path", "none"] = Field(description="As the manifest's install.")
    subdirectory: InsidePath | None = Field(default=None, description="As the manifest's subdirectory.")
    #: False: built against the environment's own packages (``--no-build-isolation``).
    build_isolation: bool = Field(
        default=True,
        alias="build-isolation",
        description="false: built against the environment's own packages (--no-build-isolation).",
    )
    #: The build packages (``name==version``) its isolated build uses; empty: all of them.
    build_requires: list[str] = Field(
        default_factory=list,
        alias="build-requires",
        description="A source built in isolation: the build packages (name==version) its build environment is "
        "made of (the sources' build requirements, resolved together); empty (a lock written before): every "
        "build package.",
    )
    model_config = Strict.model_config | {"populate_by_name": True}
    #: Every submodule, recursively, sorted by path; ``tree`` covers their files.
    submodules: list[LockedSubmodule] = Field(
        default_factory=list, description="Every submodule, recursively, sorted by path; tree covers their files."
    )
    store: StorePath = Field(default="", description="The store path of the exported checkout.")
    links: dict[InsidePath, InsidePath] = Field(
        default_factory=dict,
        description="The manifest's links: path in the checkout → path in the weights view "
        "(robodojo/Assets); {source:NAME} and sys.path then name a view of the checkout with them added.",
    )


class LockedWeightFile(Strict):
    """One file of a weight set, by path, size and hash."""

    path: InsidePath = Field(description="Its path inside the weight set's folder.")
    size: int = Field(ge=0, description="Its size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Its sha256; realize refuses a download that differs.")
    revision: str | None = Field(
        default=None, description="ModelScope only: the commit that last changed the file, fetched at that revision."
    )

    def pin(self) -> WeightFile:
        """This file as the resolver pins it (:class:`harness.resolve.pins.WeightFile`): what
        ``fetch_weight_file`` downloads and checks."""
        return WeightFile(self.path, self.size, self.sha256, self.revision)


class LockedWeights(Strict):
    """One weight set pinned: where it comes from and every file it holds."""

    dir: InsidePath = Field(description="The manifest's dir: the folder {weights}/<dir>.")
    provider: Literal["huggingface_model", "modelscope_model", "url", "path"] = Field(
        description="Which manifest key it came from."
    )
    repo: str = Field(description="That key's value: the hub repository, the URL or the path.")
    revision: str | None = Field(
        default=None,
        description="Hugging Face: the commit the revision resolved to; ModelScope: the tag or branch asked for.",
    )
    #: Hugging Face repository type; written to the lockfile only when not "model".
    repo_type: Literal["model", "dataset"] = Field(
        default="model", description="The Hugging Face repository type; written only when not model."
    )
    files: list[LockedWeightFile] = Field(default_factory=list, description="Every file kept, sorted by path.")
    store: StorePath = Field(default="", description="The store path of the weight set.")

    def pin(self) -> WeightSet:
        """This weight set as the resolver pins it (:class:`harness.resolve.pins.WeightSet`),
        every file in the lock's order: what realize fetches from and a re-lock starts from.
        Everything but the store path, which only the lock knows."""
        return WeightSet(
            dir=self.dir,
            provider=self.provider,
            repo=self.repo,
            revision=self.revision,
            repo_type=self.repo_type,
            files=tuple(f.pin() for f in self.files),
        )


class LockedTarget(Strict):
    """One platform of a lock for several (``[lock] platforms``): where its interpreter comes
    from and the store paths its interpreter and environment realize to."""

    platform: str = Field(description="The platform, in uv's vocabulary.")
    source: Literal["uv-managed", "host"] = Field(description="Where its interpreter comes from, as python.source.")
    python: StorePath = Field(default="", description="The store path of its interpreter.")
    environment: StorePath = Field(default="", description="The store path of its environment.")
    variant: str = Field(default="", description="The manifest's accelerator variant it is (empty: no variants).")
    cuda: str | None = Field(
        default=None, description="The CUDA version the driver must support to run the variant (none: anywhere)."
    )
    wheel_variants: list[WheelEntry] = Field(
        default_factory=list,
        alias="wheel-variants",
        description="What the variant's wheels need by the wheel-variant metadata (PEP 817) their index serves: "
        "NAME==VERSION [LABEL] NAMESPACE :: FEATURE :: VALUE each. Its nvidia :: cuda_version_lower_bound, when "
        "there, is what realize compares with the driver instead of cuda.",
    )
    # Spelled out (not Strict.model_config | {...}) so the pydantic mypy plugin sees it.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, populate_by_name=True)

    @property
    def needs_cuda(self) -> str | None:
        """What the variant needs of the driver: its wheels' metadata, else ``cuda``."""
        return needed_cuda(self.cuda, self.wheel_variants)


class LockedEnvironment(Strict):
    """The virtual environment built from the interpreter, packages and sources."""

    store: StorePath = Field(default="", description="The store path of the environment.")


class Lock(Strict):
    """A whole lockfile."""

    lock_version: int = Field(
        alias="lock-version",
        strict=True,  # an integer as written: "1" is not a lock version
        description="The lock format's version; this harness reads 1 and 2 (2: a source has links).",
    )
    name: str = Field(description="The manifest's name.")
    type: Literal["service", "benchmark"] = Field(description="Which kind of manifest it locks.")
    manifest: str = Field(description="The manifest's path, relative to the project root.")
    manifest_digest: str = Field(
        alias="manifest-digest",
        description="blake3 of the manifest's [environment] and [[weights]] (defaults filled in): the keys that "
        "shape a lock. lock --check, up and run call the lock stale when it differs.",
    )
    uv: str = Field(description="The version of uv that resolved it.")
    python: LockedInterpreter = Field(description="The interpreter.")
    variant: str = Field(
        default="",
        description="A manifest with accelerator variants: the variant this lock is (for several targets: the "
        "first's); empty without variants.",
    )
    cuda: str | None = Field(
        default=None, description="The CUDA version the driver must support to run the variant (none: anywhere)."
    )
    wheel_variants: list[WheelEntry] = Field(
        default_factory=list,
        alias="wheel-variants",
        description="A lock of one variant: what its wheels need by their wheel-variant metadata (as in targets).",
    )
    environment: LockedEnvironment = Field(default_factory=LockedEnvironment, description="The environment.")
    #: Several platforms in one lock: one entry each, in ``[lock] platforms`` order; empty for a
    #: lock of one platform. ``python`` and ``environment`` then describe the first, and
    #: :func:`harness.lock.platforms.for_platform` gives any one as a lock of its own.
    targets: list[LockedTarget] = Field(
        default_factory=list,
        description="A lock for several platforms: one entry each, in [lock] platforms order (python and "
        "environment describe the first); empty for one platform.",
    )
    packages: list[LockedPackage] = Field(default_factory=list, description="Every package installed, sorted.")
    build_packages: list[LockedPackage] = Field(
        default_factory=list,
        alias="build-packages",
        description="The build requirements of the sources and of the sdists built in isolation (what their "
        "PEP 517 backends ask for), so realize builds them offline; each names its own in build-requires.",
    )
    sources: list[LockedSource] = Field(default_factory=list, description="The git sources, pinned.")
    weights: list[LockedWeights] = Field(default_factory=list, description="The weight sets, every file hashed.")

    # Spelled out (not Strict.model_config | {...}) so the pydantic mypy plugin sees it.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, populate_by_name=True)

    @property
    def needs_cuda(self) -> str | None:
        """What this lock's variant needs of the driver: its wheels' metadata, else ``cuda``."""
        return needed_cuda(self.cuda, self.wheel_variants)

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
