"""Service and benchmark manifests: the user's intent, validated.

A manifest (``services/<name>.toml``) says how to start a model service, the environment it
runs in and where its weights come from; a benchmark manifest (``benchmarks/<name>.toml``)
says the same for a benchmark's or simulator's environment and its worker. Models are
strict: an unknown key, a wrong type or a missing field is an error, and every string that
will be expanded as a template may only use the templates harness fills in.
"""

from __future__ import annotations

import re
import string
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

#: Templates a command, client or checkpoint may use, and what fills them (at launch).
TEMPLATES: dict[str, str] = {
    "python": "the interpreter of the service's own realized environment",
    "weights": "the realized weights view of the service (one folder per [[weights]] dir)",
    "port": "the port the plan gives the service",
    "url": "the service's base URL (http://127.0.0.1:{port}, ws://… for WebSocket protocols, or the external url)",
    "source": "{source:NAME}: the realized checkout of the [[environment.sources]] entry named NAME",
}

#: A benchmark's ``worker`` may use these too. ``{run}`` belongs to a run, so a service's
#: command (started by a broker that ``harness up`` may share among runs) cannot have it.
WORKER_TEMPLATES: dict[str, str] = {
    **TEMPLATES,
    "run": "the run record's folder ($HARNESS_RUN_DIR; a cluster shard's own folder on its node)",
}

WEIGHT_PROVIDERS = ("modelscope_model", "huggingface_model", "url", "path")

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_PYTHON_REQUEST = re.compile(r"^3\.\d{1,2}(\.\d{1,3})?$")
_HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class Strict(BaseModel):
    """Base of every user-facing model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


def check_templates(text: str, allowed: frozenset[str] | None = None) -> str:
    """Raise ValueError if ``text`` uses a template outside ``allowed`` or is malformed."""
    names = frozenset(TEMPLATES) if allowed is None else allowed
    try:
        fields = [(field, spec) for _, field, spec, _ in string.Formatter().parse(text) if field is not None]
    except ValueError as exc:
        raise ValueError(f"malformed template in {text!r}: {exc} (write '{{{{' for a brace)") from None
    for field, spec in fields:
        if field == "run" and field not in names:
            raise ValueError(
                f"{{run}} in {text!r} is a benchmark worker's only (the run's record folder): a service "
                "may outlive a run (harness up) and serve several"
            )
        if field not in names:
            known = ", ".join("{" + ("source:NAME" if n == "source" else n) + "}" for n in sorted(names))
            raise ValueError(f"unknown template {{{field}}} in {text!r}; known: {known}")
        if field == "source" and not spec:
            raise ValueError(f"{{source}} in {text!r} needs a source name: {{source:NAME}}")
    return text


def source_names(text: str) -> list[str]:
    """The NAMEs of the ``{source:NAME}`` templates in ``text`` (already checked)."""
    return [spec or "" for _, field, spec, _ in string.Formatter().parse(text) if field == "source"]


def _check_source_templates(texts: list[str], sources: list[Source]) -> None:
    """Every ``{source:NAME}`` names one of ``sources`` (by :attr:`Source.name`)."""
    known = {s.name for s in sources}
    for text in texts:
        for name in source_names(text):
            if name not in known:
                listed = ", ".join(sorted(known)) or "none"
                raise ValueError(
                    f"{{source:{name}}} in {text!r} names no [[environment.sources]] entry (their names: {listed})"
                )


def _relative_path(value: str, what: str) -> str:
    path = PurePosixPath(value)
    if not value or value.startswith("/") or ".." in path.parts or "\\" in value:
        raise ValueError(f"{what} must be a relative path inside the folder, got {value!r}")
    return value


Port = Annotated[int, Field(ge=1, le=65535)]


def _health_path(value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise ValueError(f"health must be a URL path starting with '/', got {value!r}")
    return value


#: The path of a service's health URL; readiness is probed there (else the port).
HealthPath = Annotated[str | None, AfterValidator(_health_path)]
#: A string that may use the templates in TEMPLATES; errors are located at the string.
Template = Annotated[str, AfterValidator(check_templates)]
#: The same for a benchmark's worker, which may also use WORKER_TEMPLATES' ``{run}``.
WorkerTemplate = Annotated[str, AfterValidator(lambda text: check_templates(text, frozenset(WORKER_TEMPLATES)))]


class Source(Strict):
    """A git repository pinned to a revision, installed into the environment."""

    repo: str = Field(
        description="A git URL (https://, ssh, file://) or a local path; a repository on this machine is fetched "
        "whichever user owns it (a lab's or a colleague's: git's safe.directory is set for that fetch alone). "
        "[git-mirrors] in the settings can "
        "fetch it from elsewhere; the lock keeps this URL."
    )
    rev: str = Field(
        min_length=1,
        description="A branch, tag or commit; the lock resolves it to a full commit and the content hash of "
        "that commit's files (submodules included). Prefer a commit: branches move.",
    )
    install: Literal["editable", "regular", "path", "none"] = Field(
        default="regular",
        description="editable: install the realized (read-only) checkout in place, for projects that read "
        "files from it; regular: build and install it as a package; path: put the checkout (or its "
        "subdirectory) on the environment's sys.path, as PYTHONPATH would (ahead of what editable installs "
        "add), without building anything (a project that is not a package and runs from its checkout); none: realize the checkout without "
        "installing it (scripts, or a project whose pins conflict with the environment's).",
    )
    subdirectory: str | None = Field(
        default=None,
        description="The package inside the repository (source/isaaclab), a relative path; list the same "
        "repo once per package.",
    )
    extras: list[str] = Field(
        default_factory=list,
        description="The project's extras whose dependencies are locked and installed too (as "
        'pip install -e ".[cu12]").',
    )
    build_isolation: bool = Field(
        default=True,
        alias="build-isolation",
        description="false: build against the environment's own packages (uv's --no-build-isolation), as "
        "CUDA extensions that compile against the installed torch need; its build requirements are then "
        "locked into the environment, and it is built after the isolated sources.",
    )

    links: dict[str, str] = Field(
        default_factory=dict,
        description="Paths inside the checkout that are links into the manifest's weights, as "
        '{ Assets = "{weights}/robodojo/Assets" }: for a project that finds its assets next to its code '
        "(RoboDojo's <checkout>/Assets). Realize makes a view of the checkout (a store path: its folders, "
        "its files hard-linked, each of these paths a relative link into the weight set; the checkout itself "
        "untouched); {source:NAME} and the environment's "
        'sys.path name that view. Only for install = "path" or "none", whose checkout is used in place.',
    )

    model_config = Strict.model_config | {"populate_by_name": True}

    @field_validator("links")
    @classmethod
    def _links(cls, values: dict[str, str]) -> dict[str, str]:
        for path, target in values.items():
            _relative_path(path, f"links: {path!r}")
            if path.rstrip("/") in ("", ".") or PurePosixPath(path).name in (".git",):
                raise ValueError(f"links: {path!r} is not a path a link can take")
            rest = target.removeprefix("{weights}/")
            if rest == target or not rest:
                raise ValueError(f'links.{path}: {target!r} must be "{{weights}}/<dir>/<path>": a weight set\'s files')
            _relative_path(rest, f"links.{path}")
        return values

    @field_validator("extras")
    @classmethod
    def _extras(cls, values: list[str]) -> list[str]:
        for value in values:
            if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$", value):
                raise ValueError(f"extras: {value!r} is not an extra name")
        return values

    @model_validator(mode="after")
    def _isolation(self) -> Source:
        if self.install in ("none", "path") and (self.extras or not self.build_isolation):
            raise ValueError(f'extras and build-isolation apply to built sources, not install = "{self.install}"')
        if self.links and self.install not in ("none", "path"):
            # An editable or built install reads the checkout itself, not a view of it.
            raise ValueError(f'links apply to install = "path" or "none" sources, not install = "{self.install}"')
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Defaults stay out of the canonical form, so locks made before these keys existed
        # keep their manifest-digest.
        data = handler(self)
        for key in ("extras", "links"):
            if not data.get(key):
                data.pop(key, None)
        for key in ("build-isolation", "build_isolation"):
            if data.get(key) is True:
                data.pop(key, None)
        return data

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("repo must not be empty")
        return value

    @field_validator("subdirectory")
    @classmethod
    def _subdirectory(cls, value: str | None) -> str | None:
        return None if value is None else _relative_path(value, "subdirectory")

    @property
    def name(self) -> str:
        """A short name for store paths: the repository's last path component."""
        tail = self.repo.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
        tail = tail.removesuffix(".git") or "source"
        return re.sub(r"[^A-Za-z0-9._-]", "-", tail)


class Variant(Strict):
    """One accelerator variant of an environment (``[environment.variants.<name>]``): the
    per-package indexes and extra requirements that make it, and the CUDA version the
    machine's driver must support to run it (none: it runs anywhere, as a cpu build does)."""

    cuda: str | None = Field(
        default=None,
        description="The CUDA version (12.6) the NVIDIA driver must support to run this variant; leave it out for "
        "one that runs without a GPU (cpu). Realize picks, on a machine with a GPU, the variant with the newest "
        "CUDA its driver supports; without one, a variant without cuda.",
    )
    indexes: list[str] = Field(
        default_factory=list,
        description="Extra indexes by name for this variant, consulted before the environment's own.",
    )
    package_index: dict[str, str] = Field(
        default_factory=dict,
        alias="package-index",
        description="Package name = index name for this variant (torch = pytorch-cu128), over the environment's.",
    )
    requirements: list[str] = Field(
        default_factory=list,
        description="Requirements this variant adds to the environment's (PEP 508, no URLs).",
    )
    model_config = Strict.model_config | {"populate_by_name": True}

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d{1,3}\.\d{1,3}", value):
            raise ValueError(f"cuda must be a CUDA version like '12.8', got {value!r}")
        return value

    @field_validator("indexes")
    @classmethod
    def _indexes(cls, values: list[str]) -> list[str]:
        for value in values:
            _index_name(value)
        return values

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, values: list[str]) -> list[str]:
        return _checked_requirements(values)

    @field_validator("package_index")
    @classmethod
    def _package_index(cls, values: dict[str, str]) -> dict[str, str]:
        return _checked_package_index(values)


class Environment(Strict):
    """Where a service or benchmark runs: a Python version, pinned requirements, sources."""

    python: str = Field(
        description="The CPython version, 3.X or 3.X.Y; the lock pins the exact patch release "
        "([lock.python] in the settings can choose it)."
    )
    requirements: list[str] = Field(
        default_factory=list,
        description="PEP 508 requirements, extras and markers allowed, no URLs (git repositories go in "
        "sources). Pin with ==: the lock records what a range resolved to, but the manifest is the intent. "
        "A package may repeat only with an environment marker.",
    )
    sources: list[Source] = Field(
        default_factory=list, description="Git repositories installed into the environment, each pinned."
    )
    indexes: list[str] = Field(
        default_factory=list,
        description="Extra package indexes by name (pytorch-cu128), consulted before the default index; each "
        "package comes from the first index that has it. Addresses come from the settings' [indexes], never "
        "from the manifest.",
    )
    package_index: dict[str, str] = Field(
        default_factory=dict,
        alias="package-index",
        description="Package name = index name: that package comes only from that index, and the index serves "
        "no other package (a CUDA index cannot hand out numpy). A package named here is installed even if "
        "nothing else requires it.",
    )

    no_build_isolation: list[str] = Field(
        default_factory=list,
        alias="no-build-isolation",
        description="Packages (by name) whose sdist is built against the environment's own packages, after "
        "the rest is installed (uv's --no-build-isolation): a CUDA extension that compiles against the "
        "installed torch (flash-attn). Their backends' build requirements are locked into the environment.",
    )

    variants: dict[str, Variant] = Field(
        default_factory=dict,
        description="Accelerator variants (cpu, cu126, cu128), each a table of its own: one lock holds every "
        "variant's pins and store paths, and realize picks the one this machine's driver runs (or the one "
        "--variant, the deploy's variant or HARNESS_VARIANT names).",
    )

    model_config = Strict.model_config | {"populate_by_name": True}

    @field_validator("variants")
    @classmethod
    def _variants(cls, values: dict[str, Variant]) -> dict[str, Variant]:
        for name in values:
            if not re.fullmatch(r"[a-z0-9][a-z0-9_]{0,31}", name):
                raise ValueError(
                    f"variants: {name!r} must be a short name (lowercase letters, digits, '_'; e.g. cpu, cu128)"
                )
        return values

    @model_validator(mode="after")
    def _variants_apart(self) -> Environment:
        for name in self.variants:  # each variant's environment must hold as a manifest's would
            merged = self.for_variant(name)
            _checked_requirements(merged.requirements)
            both = sorted(set(merged.package_index.values()) & set(merged.indexes))
            if both:
                raise ValueError(f"variants.{name}: index {both[0]!r} is in both indexes and package-index")
        return self

    def for_variant(self, name: str) -> Environment:
        """The environment as variant ``name`` makes it: its indexes first, its package
        indexes over the environment's, its requirements added; no variants of its own."""
        variant = self.variants[name]
        return self.model_copy(
            update={
                "indexes": [*variant.indexes, *(i for i in self.indexes if i not in variant.indexes)],
                "package_index": {**self.package_index, **variant.package_index},
                "requirements": [*self.requirements, *variant.requirements],
                "variants": {},
            }
        )

    @field_validator("no_build_isolation")
    @classmethod
    def _no_build_isolation(cls, values: list[str]) -> list[str]:
        names = []
        for value in values:
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", value):
                raise ValueError(f"no-build-isolation: {value!r} is not a package name")
            names.append(re.sub(r"[-_.]+", "-", value).lower())
        if len(set(names)) != len(names):
            raise ValueError("no-build-isolation names a package twice")
        return sorted(names)

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        if not _PYTHON_REQUEST.match(value):
            raise ValueError(f"python must be a CPython 3 version like '3.11' or '3.11.7', got {value!r}")
        return value

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, values: list[str]) -> list[str]:
        return _checked_requirements(values)

    @field_validator("indexes")
    @classmethod
    def _indexes(cls, values: list[str]) -> list[str]:
        for value in values:
            _index_name(value)
        return values

    @field_validator("package_index")
    @classmethod
    def _package_index(cls, values: dict[str, str]) -> dict[str, str]:
        return _checked_package_index(values)

    @model_validator(mode="after")
    def _explicit_indexes_apart(self) -> Environment:
        both = sorted(set(self.package_index.values()) & set(self.indexes))
        if both:
            raise ValueError(
                f"index {both[0]!r} is in both indexes and package-index: an index named in "
                "package-index serves only the packages named there; remove it from indexes"
            )
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Keys left at their defaults are left out, so manifests written before a key existed
        # keep their canonical form (and so their locks' manifest-digest).
        data = handler(self)
        for key in _ENVIRONMENT_OPTIONAL:
            if not data.get(key):
                data.pop(key, None)
        return data


#: Environment keys dropped from the canonical form while unset (see Environment._dump).
def _checked_package_index(values: dict[str, str]) -> dict[str, str]:
    """``values`` (package name = index name) when each names a package once and an index by
    name, never the default one; a ValueError naming the first that does not."""
    seen: dict[str, str] = {}
    for package, index in values.items():
        key = re.sub(r"[-_.]+", "-", package).lower()
        if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$", package):
            raise ValueError(f"package-index: {package!r} is not a package name")
        if key in seen:
            raise ValueError(f"package-index: {package!r} and {seen[key]!r} name the same package")
        seen[key] = package
        _index_name(index)
        if index == "pypi":
            raise ValueError(
                f"package-index: {package} = 'pypi': the default index serves every package; "
                "leave the package out of package-index instead"
            )
    return values


def _checked_requirements(values: list[str]) -> list[str]:
    """``values`` when each is a PEP 508 requirement without a URL, a package listed once
    (again only with a marker); a ValueError naming the first that is not."""
    seen: dict[str, str] = {}
    for value in values:
        try:
            requirement = Requirement(value)
        except InvalidRequirement as exc:
            raise ValueError(f"invalid requirement {value!r}: {exc}") from None
        if requirement.url:
            raise ValueError(
                f"requirement {value!r} names a URL; use [[environment.sources]] for git "
                "repositories and named indexes for other packages"
            )
        key = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if key in seen and not requirement.marker:
            raise ValueError(f"requirement {requirement.name!r} is listed twice")
        seen[key] = value
    return values


_ENVIRONMENT_OPTIONAL = ("package-index", "package_index", "variants")


def _index_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"index {value!r} must be a name (lowercase letters, digits, '-', '_', '.'); "
            "its address belongs in configuration, not in a manifest"
        )
    return value


class Weights(Strict):
    """One weight set: a folder ``dir`` inside ``{weights}``, from exactly one provider."""

    dir: str = Field(
        description="The folder {weights}/<dir> these files appear in, a relative path; unique within a manifest."
    )
    modelscope_model: str | None = Field(default=None, description="A ModelScope model repository, owner/name.")
    huggingface_model: str | None = Field(
        default=None,
        description='A Hugging Face repository, owner/name: a model, or a dataset with repo_type = "dataset".',
    )
    url: str | None = Field(
        default=None,
        description="One file over http(s):// or file://, named by the URL's last path component; give sha256 "
        "to have the lock check it.",
    )
    path: str | None = Field(
        default=None,
        description="A file or folder, project-relative or absolute; every file is hashed at lock time, and a "
        "changed file makes lock --check fail.",
    )
    revision: str | None = Field(
        default=None,
        description="Hub weights only: the branch, tag or commit to pin (default: main on Hugging Face, master "
        "on ModelScope). Hugging Face locks the commit it resolves to; ModelScope locks the tag and each "
        "file's own revision, and refuses a tag whose files changed.",
    )
    include: list[str] = Field(
        default_factory=list,
        description="Glob patterns of the files to keep (default: every file): a pattern matches the whole "
        "relative path, * also crosses /, and a pattern ending in / keeps a folder. Keeping no file is an error.",
    )
    sha256: str | None = Field(
        default=None,
        description="url only: the expected sha256 (64 lowercase hex digits); the lock fails if the file differs.",
    )
    repo_type: Literal["model", "dataset"] | None = Field(
        default=None,
        description="huggingface_model only: which kind of repository it names; unset means model.",
    )

    @field_validator("dir")
    @classmethod
    def _dir(cls, value: str) -> str:
        return _relative_path(value, "dir")

    @field_validator("modelscope_model", "huggingface_model")
    @classmethod
    def _hub_repo(cls, value: str | None) -> str | None:
        if value is not None and not _HUB_REPO.match(value):
            raise ValueError(f"expected a hub repository 'owner/name', got {value!r}")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^(https?|file)://[^\s]+$", value):
            raise ValueError(f"url must be an http(s):// or file:// address, got {value!r}")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256.match(value):
            raise ValueError("sha256 must be 64 lowercase hexadecimal digits")
        return value

    @model_validator(mode="after")
    def _one_provider(self) -> Weights:
        given = [key for key in WEIGHT_PROVIDERS if getattr(self, key) is not None]
        if len(given) != 1:
            listed = ", ".join(WEIGHT_PROVIDERS)
            found = f"found {', '.join(given)}" if given else "found none"
            raise ValueError(f"exactly one of {listed} is required ({found})")
        if self.sha256 is not None and self.url is None:
            raise ValueError("sha256 applies to a url download only; hub files are hashed by the lock")
        if self.revision is not None and self.provider not in ("modelscope_model", "huggingface_model"):
            raise ValueError("revision applies to hub weights (modelscope_model, huggingface_model) only")
        if self.repo_type is not None and self.provider != "huggingface_model":
            raise ValueError("repo_type applies to huggingface_model weights only")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An unset repo_type is left out, so manifests written before the key existed keep
        # their canonical form (and so their locks' manifest-digest).
        data = handler(self)
        if self.repo_type is None:
            data.pop("repo_type", None)
        return data

    @property
    def hf_repo_type(self) -> str:
        """The Hugging Face repository type: ``repo_type``, or ``"model"`` when unset."""
        return self.repo_type or "model"

    @property
    def provider(self) -> str:
        """Which provider key is set: one of :data:`WEIGHT_PROVIDERS`."""
        return next(key for key in WEIGHT_PROVIDERS if getattr(self, key) is not None)

    @property
    def location(self) -> str:
        """The provider's value: a hub repository, a URL or a path."""
        return str(getattr(self, self.provider))


OverrideValue = str | int | float | bool


class XPolicyLab(Strict):
    """How XPolicyLab's own ``setup_policy_server.py`` serves a learned policy."""

    policy: str = Field(
        description="The policy folder inside the XPolicyLab checkout (policy/SmolVLA), a relative path."
    )
    checkpoint: str = Field(
        description="The checkpoint path, usually under {weights}; {weights} and {source:NAME} are expanded at launch."
    )
    overrides: dict[str, OverrideValue] = Field(
        default_factory=dict,
        description="Keys of the policy's deploy.yml to override, passed as setup_policy_server.py --overrides "
        "key=value; string values may use {weights} and {source:NAME}.",
    )

    @field_validator("overrides")
    @classmethod
    def _override_templates(cls, values: dict[str, OverrideValue]) -> dict[str, OverrideValue]:
        for value in values.values():
            if isinstance(value, str):
                check_templates(value, frozenset({"weights", "source"}))
        return values

    source: int = Field(
        default=0, ge=0, description="Which [[environment.sources]] entry (from 0) is the XPolicyLab checkout."
    )

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        return _relative_path(value, "policy")

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint(cls, value: str) -> str:
        return check_templates(value, frozenset({"weights", "source"}))


def _check_command(values: list[str]) -> list[str]:
    if not values:
        raise ValueError("command must not be empty")
    return values


class ServiceManifest(Strict):
    """``services/<name>.toml``: one model service."""

    kind: str = Field(
        description="What the service is for, a lowercase name (segmenter, pointer, policy, world_model); "
        "agent skills name kinds as the roles they need."
    )
    summary: str = Field(description="One line shown by harness services.")
    protocol: Literal["http", "websocket", "xpolicylab"] = Field(
        default="http",
        description="http: harness runs command, ready when health answers 2xx (else when the port accepts); "
        "websocket: its {url} is ws://, ready when a WebSocket opens and answers a ping; xpolicylab: "
        "XPolicyLab's setup_policy_server.py serves the [xpolicylab] policy over WebSocket.",
    )
    command: list[Template] | None = Field(
        default=None,
        description="The argv that starts the service, templates allowed ({python}, {weights}, {port}, {url}, "
        "{source:NAME}); required for http and websocket.",
    )
    port: Port = Field(description="The port the service listens on, 1-65535; a deploy may give another.")
    vram_gb: float = Field(
        default=0.0,
        ge=0,
        le=4096,
        description="GPU memory the service needs once loaded, in GB; placement packs GPUs by it (0: no GPU).",
    )
    load_seconds: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="How long loading may take before the service must be ready; the wait allowed for a start.",
    )
    health: HealthPath = Field(
        default=None,
        description="The URL path (starting with /) that answers once the service is ready, e.g. /health.",
    )
    client: dict[str, Template] = Field(
        default_factory=dict,
        description='What an agent\'s client of this service is given (url = "{url}"), filled as the command is '
        "at launch ({url}, {port}, {python}, {weights}, {source:NAME}; an external service's may use {url} "
        "alone). Every broker lease carries it (harness.client.Lease.client), and harness run passes it to its "
        "command as HARNESS_SERVICE_<NAME>_CLIENT (JSON, sorted keys) beside HARNESS_SERVICE_<NAME>_URL.",
    )
    scoped: bool = Field(
        default=False,
        description="A policy with memory of past frames: swapped out and back in, it starts that memory "
        "afresh, and the run records each such reset.",
    )
    environment: Environment = Field(description="The environment the service runs in.")
    weights: list[Weights] = Field(
        default_factory=list, description="Weight sets, one folder of {weights} each; no two may share a dir."
    )
    xpolicylab: XPolicyLab | None = Field(
        default=None, description='Required with protocol = "xpolicylab", refused otherwise.'
    )

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"kind must be a lowercase name, got {value!r}")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, values: list[str] | None) -> list[str] | None:
        return None if values is None else _check_command(values)

    @model_validator(mode="after")
    def _protocol_keys(self) -> ServiceManifest:
        if self.protocol in ("http", "websocket") and self.command is None:
            raise ValueError(f"protocol {self.protocol!r} needs a command")
        if self.protocol == "xpolicylab":
            if self.xpolicylab is None:
                raise ValueError("protocol 'xpolicylab' needs an [xpolicylab] table")
            if self.xpolicylab.source >= len(self.environment.sources):
                raise ValueError("xpolicylab.source must index the XPolicyLab checkout in environment.sources")
        elif self.xpolicylab is not None:
            raise ValueError("[xpolicylab] applies to protocol = 'xpolicylab' only")
        _unique_dirs(self.weights)
        _check_source_links(self.environment.sources, self.weights)
        texts = [*(self.command or []), *self.client.values()]
        if self.xpolicylab is not None:
            texts += [
                self.xpolicylab.checkpoint,
                *(v for v in self.xpolicylab.overrides.values() if isinstance(v, str)),
            ]
        _check_source_templates(texts, self.environment.sources)
        return self


class BenchmarkManifest(Strict):
    """``benchmarks/<name>.toml``: a benchmark's or simulator's official environment.

    Its ``[[weights]]`` are the assets; ``worker`` starts one simulator worker (the runtime
    starts ``[sim] workers_per_gpu`` of them per GPU on ports from ``base_port``);
    ``observation`` names the observation contract the agent is evaluated under. With
    ``simulator = "external"`` the simulator is a service elsewhere (a task from The
    Simulator): ``[environment]`` is its client's alone, and ``worker`` is that client.
    """

    kind: Literal["benchmark", "simulator"] = Field(
        default="benchmark",
        description="A benchmark's official environment, or a simulator whose tasks a run draws from.",
    )
    summary: str = Field(description="One line shown by harness services.")
    worker: list[WorkerTemplate] | None = Field(
        default=None,
        description="The argv of one simulator worker, templates allowed (a service command's, and {run}: the "
        "run record's folder); harness run starts it, and the deploy's [sim] plans workers_per_gpu of them on "
        "each [sim] gpus GPU, on ports from base_port.",
    )
    workdir: Literal["project", "run"] = Field(
        default="project",
        description='Where the worker starts, so where its relative paths land: "project", the project folder '
        '(the store copy of the project files it names, when it names any); or "run", a fresh folder of the '
        "run record, <run>/work/, for a client that writes its results relative to its working folder "
        "(harness runs prune removes it with the record).",
    )
    vram_gb: float = Field(default=0.0, ge=0, le=4096, description="GPU memory of one worker, in GB.")
    load_seconds: float = Field(default=60.0, gt=0, le=86400, description="How long a worker may take to start.")
    health: HealthPath = Field(default=None, description="A URL path that answers when a worker is ready.")
    observation: str | None = Field(
        default=None,
        description="The name of the observation contract the agent is evaluated under (descriptive; harness "
        "does not interpret it).",
    )
    simulator: Literal["local", "external"] = Field(
        default="local",
        description='Where the simulator runs: "local", here, realized from [environment] with its workers '
        'placed on the deploy\'s [sim] GPUs; "external", elsewhere (a task from The Simulator): [environment] '
        "is then only its client's, the deploy's [benchmarks.<name>] url says where the simulator answers, "
        "the worker is its client (no GPU placed for it, {url} the simulator's address, also "
        "HARNESS_SIMULATOR_URL), and every run names the simulator as an impurity.",
    )
    identity: HealthPath = Field(
        default=None,
        description='simulator = "external" only: a URL path on the simulator (e.g. /info) that answers GET with '
        "a JSON object naming its version and task; a run asks it before the worker starts, records the answer "
        "(diff names a change) and refuses to start when it does not answer.",
    )
    environment: Environment = Field(
        description='The environment the benchmark and its workers run in (with simulator = "external": '
        "its client's only)."
    )
    weights: list[Weights] = Field(default_factory=list, description="Assets, as a service's weight sets.")

    @property
    def external(self) -> bool:
        """The simulator runs elsewhere: only its client is realized here."""
        return self.simulator == "external"

    @model_validator(mode="after")
    def _remote_simulator(self) -> BenchmarkManifest:
        if self.identity is not None and not self.external:
            raise ValueError('identity applies to simulator = "external" only (a local simulator is in the closure)')
        if self.external:
            if not self.worker:
                raise ValueError('simulator = "external" needs a worker: the client that drives the remote simulator')
            if self.vram_gb > 0:
                raise ValueError(
                    'simulator = "external": vram_gb must be 0, no GPU is placed for the simulator\'s workers here '
                    "(the simulator's GPUs are the remote machine's)"
                )
        return self

    @model_validator(mode="after")
    def _weights_unique(self) -> BenchmarkManifest:
        _unique_dirs(self.weights)
        _check_source_links(self.environment.sources, self.weights)
        _check_source_templates(list(self.worker or []), self.environment.sources)
        return self

    @field_validator("worker")
    @classmethod
    def _worker(cls, values: list[str] | None) -> list[str] | None:
        return None if values is None else _check_command(values)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The default stays out of the canonical form, so a manifest written before the key
        # existed keeps it (and so its lock's legacy whole-manifest digest).
        data = handler(self)
        if data.get("workdir") == "project":
            data.pop("workdir")
        if data.get("simulator") == "local":
            data.pop("simulator")
        if data.get("identity") is None:
            data.pop("identity", None)
        return data


def _check_source_links(sources: list[Source], weights: list[Weights]) -> None:
    """Every source link's target lies inside one of the manifest's weight sets."""
    dirs = [w.dir.strip("/") for w in weights]
    for index, source in enumerate(sources):
        for path, target in source.links.items():
            rest = target.removeprefix("{weights}/")
            if not any(rest == d or rest.startswith(d + "/") for d in dirs):
                listed = ", ".join(sorted(dirs)) or "none"
                raise ValueError(
                    f"environment.sources[{index}].links.{path}: {target!r} is in no weight set of this manifest "
                    f"(their dirs: {listed})"
                )


def _unique_dirs(weights: list[Weights]) -> None:
    dirs = [w.dir for w in weights]
    duplicates = sorted({d for d in dirs if dirs.count(d) > 1})
    if duplicates:
        raise ValueError(f"weights dir {duplicates[0]!r} is used twice")


def manifest_name(stem: str) -> str:
    """Validate a manifest's file stem as its name (names become store path parts)."""
    if not _NAME.match(stem):
        raise ValueError(f"manifest name {stem!r} must be lowercase letters, digits, '.', '_' or '-'")
    return stem


def model_keys(model: type[BaseModel]) -> list[str]:
    """The TOML keys a model accepts (for docs and error messages)."""
    return [field.alias or name for name, field in model.model_fields.items()]


def as_plain(value: Any) -> Any:
    """A model as plain JSON-able data with defaults filled in (for ``--json`` output)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value
