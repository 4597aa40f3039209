"""A harness project: the directory holding ``services/``, and everything loaded from it.

Layout (all but ``services/`` optional)::

    services/<name>.toml        service manifests; services/servers/ holds service code
    benchmarks/<name>.toml      benchmark and simulator environments
    configs/agents/<name>.toml  agent configurations
    configs/deploy/<machine>.toml   deploys (only example-*.toml are tracked)
    locks/                      lockfiles

Loading collects every problem across all files before raising, so one run of
``harness services`` shows the user everything that is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from harness.errors import InputError, ProjectNotFound

if TYPE_CHECKING:
    from pydantic import BaseModel

    from harness.manifests.agent import AgentConfig, Override
    from harness.manifests.deploy import Deploy
    from harness.manifests.model import BenchmarkManifest, ServiceManifest

    M = TypeVar("M", bound=BaseModel)


def find_project(start: Path) -> Project:
    """The nearest directory at or above ``start`` that holds a ``services/`` folder."""
    start = start.resolve()
    for candidate in (start, *start.parents):
        if (candidate / "services").is_dir():
            return Project(candidate)
    raise ProjectNotFound(
        f"no harness project at or above {start} (a project is a directory holding services/)",
        hint="run inside a project or pass --project DIR",
    )


@dataclass(frozen=True)
class Project:
    """A project on disk. Cheap to construct; loading happens on demand."""

    root: Path

    @property
    def services_dir(self) -> Path:
        return self.root / "services"

    @property
    def benchmarks_dir(self) -> Path:
        return self.root / "benchmarks"

    @property
    def agents_dir(self) -> Path:
        return self.root / "configs" / "agents"

    @property
    def deploy_dir(self) -> Path:
        return self.root / "configs" / "deploy"

    @property
    def locks_dir(self) -> Path:
        return self.root / "locks"

    def service_paths(self) -> dict[str, Path]:
        """Manifest name → file, sorted by name."""
        return _toml_files(self.services_dir)

    def benchmark_paths(self) -> dict[str, Path]:
        return _toml_files(self.benchmarks_dir)

    def load_services(self) -> dict[str, ServiceManifest]:
        """Every service manifest, validated; all problems reported together."""
        from harness.manifests.model import ServiceManifest

        return _load_all(ServiceManifest, self.service_paths())

    def load_benchmarks(self) -> dict[str, BenchmarkManifest]:
        """Every benchmark manifest, validated; names must not clash with services."""
        from harness.manifests.model import BenchmarkManifest

        benchmarks = _load_all(BenchmarkManifest, self.benchmark_paths())
        clash = sorted(set(benchmarks) & set(self.service_paths()))
        if clash:
            raise InputError(
                f"benchmarks/{clash[0]}.toml: name {clash[0]!r} is also a service; "
                "store paths are named by manifest, so names must be unique"
            )
        return benchmarks

    def load_deploy(self, path: Path) -> Deploy:
        """A deploy file, validated on its own and against the project's manifests: it names
        only services that have one, an external service's ``client`` uses only ``{url}``, and a
        ``[benchmarks.<name>]`` names a benchmark whose simulator runs elsewhere."""
        from harness.manifests.deploy import (
            Deploy,
            check_deploy_against,
            check_deploy_benchmarks,
            check_external_clients,
        )
        from harness.manifests.loading import display_path, load_model
        from harness.manifests.model import ServiceManifest

        deploy = load_model(Deploy, path)
        paths = self.service_paths()
        check_deploy_against(deploy, set(paths), display_path(path))
        # An external service's client table is filled from its url alone: check it here,
        # naming both files, rather than when a run first needs it.
        external = [name for name, entry in deploy.services.items() if entry.mode == "external"]
        clients = {
            name: (display_path(paths[name]), load_model(ServiceManifest, paths[name]).client) for name in external
        }
        check_external_clients(deploy, clients, display_path(path))
        if deploy.benchmarks:
            simulators = {name: manifest.simulator for name, manifest in self.load_benchmarks().items()}
            check_deploy_benchmarks(deploy, simulators, display_path(path))
        return deploy

    def agent_path(self, name_or_path: str) -> Path:
        """``default`` → ``configs/agents/default.toml``; a path is taken as it is."""
        candidate = Path(name_or_path)
        if candidate.suffix == ".toml" or candidate.exists():
            return candidate
        return self.agents_dir / f"{name_or_path}.toml"

    def load_agent(self, name_or_path: str, overrides: list[Override] | None = None) -> AgentConfig:
        """An agent config with ``--set`` overrides applied before validation."""
        from harness.manifests.agent import AgentConfig, apply_overrides
        from harness.manifests.loading import display_path, read_toml, validate_data

        path = self.agent_path(name_or_path)
        document = apply_overrides(read_toml(path), overrides or [])
        sets = [override.key for override in overrides or []]
        config = validate_data(AgentConfig, document, display_path(path), sets=sets)
        config._set_keys = tuple(sets)
        return config


class ProjectState(Protocol):
    """What realize and the runtime need of the CLI's state (``harness.cli.State``, a cluster
    shard's ``NodeState``): the home, the deploy file given, and the project."""

    @property
    def home(self) -> Path: ...

    @property
    def deploy_path(self) -> Path | None: ...

    def project(self) -> Project: ...


def _toml_files(folder: Path) -> dict[str, Path]:
    if not folder.is_dir():
        return {}
    return {path.stem: path for path in sorted(folder.glob("*.toml")) if path.is_file()}


def _load_all(model: type[M], paths: dict[str, Path]) -> dict[str, M]:
    from harness.manifests.loading import display_path, load_model
    from harness.manifests.model import manifest_name

    loaded: dict[str, Any] = {}
    problems: list[str] = []
    for name, path in paths.items():
        try:
            manifest_name(name)
            loaded[name] = load_model(model, path)
        except ValueError as exc:
            problems.append(f"{display_path(path)}: {exc}")
        except InputError as exc:
            problems.append(exc.message)
    if problems:
        raise InputError("\n".join(problems))
    return loaded
