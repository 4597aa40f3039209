"""Agent configurations (``configs/agents/*.toml``) and the services a run needs.

An agent config says which skills are on and, per role, which services fill it::

    [agent]
    benchmark = "reach"

    [agent.skills.segment]
    enabled = true
    needs = ["segmenter"]          # roles (kinds of service) the skill calls

    [agent.services]
    segmenter = ["sam3"]           # role -> services; [] turns the role off
    world_models = []

``--set agent.services.world_models=["openwam"]`` style overrides edit the parsed document
before validation (:func:`apply_overrides`). :func:`services_needed` is the pure function
from a configuration to the set of services its run needs: off skills drop out, and so do
skills whose roles have no service.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any

from pydantic import Field, PrivateAttr, field_validator

from harness.errors import InputError
from harness.manifests.model import Strict
from harness.manifests.tomlfile import check_bounds


class Skill(Strict):
    """One skill of the agent: on or off, and the roles it calls."""

    enabled: bool = Field(
        default=True, description="Whether the skill is on; an off skill's services are not installed."
    )
    needs: list[str] = Field(
        default_factory=list,
        description="The roles (service kinds) the skill calls; it drops out of a run when any has no service.",
    )
    summary: str | None = Field(
        default=None, description="What the skill does; a run passes it to the agent in HARNESS_SKILLS."
    )


class AgentSection(Strict):
    """The ``[agent]`` table."""

    name: str | None = Field(default=None, description="A display name (descriptive; harness does not read it).")
    benchmark: str | None = Field(
        default=None, description="The benchmark its runs use; benchmarks/<name>.toml must exist."
    )
    skills: dict[str, Skill] = Field(default_factory=dict, description="The agent's skills by name.")
    services: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Role = the services that fill it; [] turns the role off. An unlisted role uses every "
        "manifest of that kind. Each name must have a manifest and may appear once per role.",
    )
    settings: dict[str, Any] = Field(
        default_factory=dict, description="Free-form settings for the agent itself; harness does not read them."
    )

    @field_validator("services")
    @classmethod
    def _services(cls, values: dict[str, list[str]]) -> dict[str, list[str]]:
        for role, names in values.items():
            if len(set(names)) != len(names):
                raise ValueError(f"role {role!r} lists a service twice")
        return values


class AgentConfig(Strict):
    """A whole agent config file."""

    summary: str | None = Field(default=None, description="One line about the configuration.")
    agent: AgentSection = Field(
        default_factory=AgentSection, description="The agent: its benchmark, skills and services."
    )
    #: the keys ``--set`` gave (:meth:`Project.load_agent`): a problem there is the option's
    _set_keys: tuple[tuple[str, ...], ...] = PrivateAttr(default=())

    def where(self, *key: str) -> str:
        """How an error names ``key``: ``--set KEY`` when ``--set`` gave it (or a table
        above it), else the key alone (the config file's)."""
        given = any(key[: len(keys)] == keys for keys in self._set_keys)
        return f"--set {'.'.join(key)}" if given else ".".join(key)


@dataclass(frozen=True)
class Override:
    """One ``--set KEY=VALUE``: a dotted key and a TOML value (a bare word is a string)."""

    key: tuple[str, ...]
    value: Any
    text: str


def parse_override(text: str) -> Override:
    """Parse ``a.b.c=VALUE``; VALUE is read as TOML, falling back to a plain string."""
    if "=" not in text:
        raise InputError(f"--set {text!r}: expected KEY=VALUE")
    key, raw = text.split("=", 1)
    parts = tuple(part.strip() for part in key.strip().split("."))
    if not all(parts):
        raise InputError(f"--set {text!r}: empty part in key {key!r}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    except (ValueError, RecursionError):  # thousands of digits, or thousands of brackets
        raise InputError(
            f"--set {key.strip()}: an integer of thousands of digits or nesting thousands deep, beyond what harness reads"
        ) from None
    check_bounds(value, "--set", key.strip())
    return Override(parts, value, text)


def apply_overrides(document: dict[str, Any], overrides: list[Override]) -> dict[str, Any]:
    """A copy of ``document`` with each override set at its dotted key (tables created)."""
    import copy

    result = copy.deepcopy(document)
    for override in overrides:
        node = result
        for part in override.key[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InputError(f"--set {override.text!r}: {part!r} is a value, not a table")
            node = child
        node[override.key[-1]] = override.value
    return result


@dataclass(frozen=True)
class Closure:
    """What a run needs: services (with the skills that pulled each in) and a benchmark."""

    services: frozenset[str]
    benchmark: str | None
    skills_on: tuple[str, ...]
    skills_dropped: tuple[tuple[str, str], ...]  # (skill, why)


def services_needed(
    config: AgentConfig,
    kinds: dict[str, str],
    *,
    off: frozenset[str] = frozenset(),
    benchmarks: frozenset[str] | None = None,
) -> Closure:
    """The services a run of ``config`` needs.

    ``kinds`` maps every manifest name to its kind. A role listed in ``[agent.services]``
    uses the services it names; an unlisted role uses every manifest of that kind. A skill
    that is off, or all of whose needed roles have no service (or only services in ``off``,
    the deploy's ``mode = "off"``), drops out with the reason. Unknown service names are
    errors.
    """
    agent = config.agent
    for role, names in agent.services.items():
        for name in names:
            if name not in kinds:
                raise InputError(f"{config.where('agent', 'services', role)}: no manifest services/{name}.toml")
    if agent.benchmark is not None and benchmarks is not None and agent.benchmark not in benchmarks:
        raise InputError(f"{config.where('agent', 'benchmark')}: no manifest benchmarks/{agent.benchmark}.toml")

    needed: set[str] = set()
    on: list[str] = []
    dropped: list[tuple[str, str]] = []
    for skill_name in sorted(agent.skills):
        skill = agent.skills[skill_name]
        if not skill.enabled:
            dropped.append((skill_name, "off"))
            continue
        chosen: set[str] = set()
        missing: list[str] = []
        for role in skill.needs:
            if role in agent.services:
                candidates = set(agent.services[role])
            else:
                candidates = {name for name, kind in kinds.items() if kind == role}
            candidates -= off
            if not candidates:
                missing.append(role)
            chosen |= candidates
        if missing:
            dropped.append((skill_name, f"no service for {', '.join(missing)}"))
            continue
        on.append(skill_name)
        needed |= chosen
    return Closure(frozenset(needed), agent.benchmark, tuple(on), tuple(dropped))
