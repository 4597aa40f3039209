"""From a manifest, a placement and realized store paths to the exact process to start.

:func:`launch_spec` is pure (data in, data out): it expands a service's command templates,
builds the clean environment the service runs in and says how to tell that it is ready. The
supervisor (:mod:`harness.runtime.supervisor`) starts what it describes; nothing here touches
a process or a file.

Templates (see :data:`harness.manifests.model.TEMPLATES`):

* ``{python}``  — the interpreter of the service's realized environment (``<env>/bin/python``);
* ``{weights}`` — the service's realized weights view (one folder per ``[[weights]] dir``);
* ``{port}``, ``{url}`` — from the placement;
* ``{run}`` — a benchmark worker's only (:data:`harness.manifests.model.WORKER_TEMPLATES`):
  the run record's folder, filled by ``harness run`` (``runs/run.py:_benchmark_command``).

A manifest's ``client`` table (what an agent's client of the service is given) is filled
from the same values (:func:`render_client`) into :attr:`LaunchSpec.client`; the broker
hands it out with every lease and ``harness run`` passes it to its command. An
``external`` service has no launch: harness runs nothing of it, so its table may use only
``{url}`` (the deploy's; checked when the deploy is loaded) and the plan carries it
rendered (:attr:`~harness.runtime.plan.ServicePlacement.client`).

Protocol ``xpolicylab`` has no command of its own: XPolicyLab's ``setup_policy_server.py``
in the realized XPolicyLab source serves the policy. Its command line (XPolicyLab's
argparse, read from the upstream repository) is::

    python setup_policy_server.py --config_path <policy>/deploy.yml
        [--protocol ws|legacy_tcp] [--host H] [--port P] --overrides k=v k=v ...

``--overrides`` takes the rest of the line (``argparse.REMAINDER``), so it comes last; each
``k=v`` overwrites key ``k`` of the policy's ``deploy.yml`` and values are parsed with
``ast.literal_eval`` (a path stays a string). harness passes ``policy_name`` (the policy's
folder name, which ``setup_policy_server.py`` imports as ``XPolicyLab.policy.<name>.model``),
``checkpoint_path`` (the manifest's checkpoint; XPolicyLab's adapters accept
``pretrained_path``/``model_path``/``checkpoint_path``) and then the manifest's overrides,
so an override naming another checkpoint key takes precedence in the adapter.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import HarnessError

if TYPE_CHECKING:  # pydantic stays out of the broker process's imports
    from harness.manifests.model import BenchmarkManifest, ServiceManifest
    from harness.runtime.plan import ServicePlacement

#: Variables of the caller that must not leak into a service: they would make the service
#: import the caller's packages or interpreter instead of its own realized environment.
SCRUBBED_VARIABLES = frozenset(
    {
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "PYTHONSAFEPATH",
        "PYTHONINSPECT",
        "PYTHONBREAKPOINT",
        "__PYVENV_LAUNCHER__",
        "VIRTUAL_ENV",
        "VIRTUAL_ENV_PROMPT",
        "UV_PROJECT_ENVIRONMENT",
        "PIP_PREFIX",
        "PIP_TARGET",
        "CUDA_VISIBLE_DEVICES",
    }
)
#: Prefixes of the same kind (conda's activation variables).
SCRUBBED_PREFIXES = ("CONDA_", "_CE_", "_CONDA_")

#: Set for every service. Bytecode is not written because realized environments are
#: read-only store paths; user site-packages would let ~/.local shadow the locked wheels;
#: unbuffered output keeps the log current, so a crash's tail shows its last words.
SERVICE_VARIABLES = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONUNBUFFERED": "1",
}

#: Names of variables whose values are credentials (matched on the upper-cased name):
#: ``HF_TOKEN`` and every ``*_TOKEN``, ``*_KEY`` (``*_KEY_ID``), ``*_AUTH``, ``*_PASS``,
#: ``*_COOKIE``, and any name holding ``SECRET``, ``PASSWORD``, ``PASSWD``, ``CREDENTIAL``,
#: ``PRIVATE``, ``APIKEY`` or ``ACCESS_KEY``. Files harness writes (the broker's
#: configuration, run records) name them and never hold their values.
SECRET_NAME = re.compile(
    r"SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|APIKEY|ACCESS_?KEY|(?:^|_)(?:TOKENS?|KEYS?|AUTH|PASS|COOKIES?)(?:_ID)?(?:_|$)"
)


def is_secret_name(name: str) -> bool:
    """Whether variable ``name`` looks like it holds a credential (:data:`SECRET_NAME`)."""
    return SECRET_NAME.search(name.upper()) is not None


def recorded_environment(env: Mapping[str, str], key: bytes) -> dict[str, str]:
    """``env`` as a record may hold it: every variable, the value of a secret-like one
    (:func:`is_secret_name`) replaced by ``hmac:<key id>:`` and 16 hex digits of its
    HMAC-SHA256 under ``key`` (the user's record key, ``runtime/recordkey.py``), so a changed
    secret shows as a change without its value ever being written, nor guessable from it. Pure."""
    import hmac

    kid = hashlib.sha256(key).hexdigest()[:8]

    def hidden(value: str) -> str:
        digest = hmac.new(key, value.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()[:16]
        return f"hmac:{kid}:{digest}"

    return {name: hidden(value) if is_secret_name(name) else value for name, value in sorted(env.items())}


def secret_hash_key_id(recorded: str) -> str | None:
    """The key id of a value :func:`recorded_environment` hid (None for anything else)."""
    parts = recorded.split(":")
    return parts[1] if len(parts) == 3 and parts[0] == "hmac" else None


def env_as_delta(env: Mapping[str, str], base: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``env`` told relative to ``base`` (the environment of the process that will rebuild it):
    the variables to drop from ``base`` (``unset``), those harness set to other values
    (``set``: never a secret-like one) and the names of the secret-like variables it holds
    (``secrets``: names only). Returns that description and the secret-like variables whose
    values ``base`` does not already hold (to be handed over privately, never written to a
    file). :func:`env_from_delta` is its inverse."""
    delta: dict[str, Any] = {
        "unset": sorted(k for k in base if k not in env),
        "set": {k: v for k, v in sorted(env.items()) if base.get(k) != v and not is_secret_name(k)},
        "secrets": sorted(k for k in env if is_secret_name(k)),
    }
    private = {k: v for k, v in env.items() if base.get(k) != v and is_secret_name(k)}
    return delta, private


def env_from_delta(delta: Mapping[str, Any], base: Mapping[str, str], private: Mapping[str, str]) -> dict[str, str]:
    """The environment :func:`env_as_delta` described, rebuilt on ``base`` with ``private``."""
    unset = set(delta.get("unset", ()))
    env = {k: v for k, v in base.items() if k not in unset}
    env.update({str(k): str(v) for k, v in (delta.get("set") or {}).items()})
    env.update(private)
    return env


#: Default host for local services: loopback only.
LOCAL_HOST = "127.0.0.1"


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one service process and to know when it is ready.

    ``argv[0]`` is an absolute interpreter path. ``env`` is the complete environment (not
    merged with the caller's). ``health_url`` is None when the manifest names no health
    path: then the service is ready when ``port`` accepts connections. ``load_seconds``
    bounds the wait for readiness. ``log_path`` receives stdout and stderr (appended).
    ``protocol`` (the manifest's) chooses the readiness check (see
    :data:`harness.runtime.supervisor.READINESS`). ``closure`` names the absolute store paths
    the process runs from, checked against their registration before it starts
    (:mod:`harness.store.launchcheck`); empty checks nothing. ``client`` is the manifest's
    ``client`` table with its templates filled (:func:`render_client`), handed to callers.
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(hash=False)
    cwd: Path
    port: int
    url: str
    health_url: str | None
    load_seconds: float
    log_path: Path
    protocol: str = "http"
    closure: tuple[str, ...] = ()
    client: Mapping[str, str] = field(default_factory=dict, hash=False)

    def as_json(self) -> dict[str, Any]:
        """JSON-able form (for handing specs to a detached broker process)."""
        return {
            "name": self.name,
            "argv": list(self.argv),
            "env": dict(self.env),
            "cwd": str(self.cwd),
            "port": self.port,
            "url": self.url,
            "health_url": self.health_url,
            "load_seconds": self.load_seconds,
            "log_path": str(self.log_path),
            "protocol": self.protocol,
            "closure": list(self.closure),
            "client": dict(self.client),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchSpec:
        """Inverse of :meth:`as_json`."""
        return cls(
            name=str(data["name"]),
            argv=tuple(str(a) for a in data["argv"]),
            env={str(k): str(v) for k, v in data["env"].items()},
            cwd=Path(data["cwd"]),
            port=int(data["port"]),
            url=str(data["url"]),
            health_url=None if data["health_url"] is None else str(data["health_url"]),
            load_seconds=float(data["load_seconds"]),
            log_path=Path(data["log_path"]),
            protocol=str(data.get("protocol", "http")),
            closure=tuple(str(p) for p in data.get("closure", ())),
            client={str(k): str(v) for k, v in (data.get("client") or {}).items()},
        )


class LaunchError(HarnessError):
    """A service cannot be launched as placed (a missing path, template or port)."""


#: Protocols whose clients speak WebSocket: their URLs are ``ws://`` and their readiness is
#: a WebSocket that connects and answers a ping (XPolicyLab's server runs ``--protocol ws``).
WEBSOCKET_PROTOCOLS = frozenset({"websocket", "xpolicylab"})


def local_url(port: int, protocol: str = "http") -> str:
    """The URL of a service this machine runs: ``ws://`` for WebSocket protocols."""
    return f"{'ws' if protocol in WEBSOCKET_PROTOCOLS else 'http'}://{LOCAL_HOST}:{port}"


def log_path(state_dir: Path, name: str) -> Path:
    """Where a service's output goes: ``<state>/logs/<name>.log``."""
    return state_dir / "logs" / f"{name}.log"


def clean_environment(base: Mapping[str, str], gpu: int | None) -> dict[str, str]:
    """The environment a service runs in: ``base`` without the caller's Python setup.

    Drops :data:`SCRUBBED_VARIABLES` and conda's variables, removes the caller's virtualenv
    and conda ``bin`` folders from ``PATH`` (so a bare ``python`` in a service's own scripts
    cannot find the caller's), keeps everything else (``PATH``, ``HOME``, ``LANG``,
    ``TMPDIR``, proxies, ``HF_*``…), adds :data:`SERVICE_VARIABLES` and sets
    ``CUDA_VISIBLE_DEVICES`` to ``gpu`` (``""`` for a CPU-only service, which hides every GPU).
    Where ``base`` has ``CUDA_VISIBLE_DEVICES`` already (Ray or Slurm assigned this process
    its GPUs; the inventory then numbers those alone, ``inventory.restrict``), ``gpu`` is
    an index into that list and the service gets the device it names: an engine's
    assignment is narrowed, never overwritten.
    """
    leaked_bins = set()
    for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = base.get(variable)
        if prefix:
            leaked_bins.add(os.path.normpath(os.path.join(prefix, "bin")))
    env = {
        key: value
        for key, value in base.items()
        if key not in SCRUBBED_VARIABLES and not key.startswith(SCRUBBED_PREFIXES)
    }
    if "PATH" in env and leaked_bins:
        parts = [p for p in env["PATH"].split(os.pathsep) if os.path.normpath(p) not in leaked_bins]
        env["PATH"] = os.pathsep.join(parts)
    env.update(SERVICE_VARIABLES)
    env["CUDA_VISIBLE_DEVICES"] = "" if gpu is None else assigned_device(base, gpu)
    return env


def assigned_device(base: Mapping[str, str], gpu: int) -> str:
    """The device ``CUDA_VISIBLE_DEVICES`` gives a service placed on the process's GPU
    ``gpu``: the ``gpu``-th entry of ``base``'s own ``CUDA_VISIBLE_DEVICES`` where an engine
    set one, else ``gpu`` itself. Pure."""
    from harness.runtime.inventory import visible_devices

    devices = visible_devices(base)
    if devices is not None and 0 <= gpu < len(devices):
        return devices[gpu]
    return str(gpu)


def _expand(text: str, values: Mapping[str, str], service: str) -> str:
    """Fill ``{name}`` templates; an unknown or unavailable one is a :class:`LaunchError`."""
    out: list[str] = []
    for literal, name, spec, conversion in string.Formatter().parse(text):
        out.append(literal)
        if name is None:
            continue
        if name == "source" and spec and not conversion:
            name = f"source:{spec}"  # {source:NAME}: a realized checkout (source_values)
        elif spec or conversion:
            raise LaunchError(f"{service}: template {{{name}}} in {text!r} takes no format spec")
        if name not in values:
            raise LaunchError(
                f"{service}: {{{name}}} in {text!r} has no value",
                hint="{weights} needs the service's weights realized" if name == "weights" else None,
            )
        out.append(values[name])
    return "".join(out)


def render_client(service: str, table: Mapping[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """A manifest's ``client`` table with its templates filled from ``values`` (sorted by key).

    ``values`` are those a service's command gets at launch (``launch_spec``), or only
    ``{url}`` for an external service. A template without a value is a :class:`LaunchError`
    naming the service and the key (``sam3: client.token: {weights} in '…' has no value``).
    """
    return {key: _expand(table[key], values, f"{service}: client.{key}") for key in sorted(table)}


def source_values(manifest: ServiceManifest | BenchmarkManifest, sources: Mapping[int, Path]) -> dict[str, str]:
    """``{source:NAME}`` values: each realized source (``sources`` maps an index of
    ``manifest.environment.sources`` to its tree) under its name; the first of a name wins."""
    values: dict[str, str] = {}
    for index, source in enumerate(manifest.environment.sources):
        if index in sources:
            values.setdefault(f"source:{source.name}", str(sources[index]))
    return values


def _override_value(value: object) -> str:
    """An override as XPolicyLab's ``ast.literal_eval`` reads it back."""
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def launch_spec(
    name: str,
    manifest: ServiceManifest,
    placement: ServicePlacement,
    *,
    python: Path,
    weights: Path | None,
    cwd: Path,
    state_dir: Path,
    sources: Mapping[int, Path] | None = None,
    base_env: Mapping[str, str] | None = None,
) -> LaunchSpec:
    """The launch of service ``name`` as ``placement`` places it.

    ``python`` is the realized environment's interpreter, ``weights`` its realized weights
    view (None when it has no weights; a template naming ``{weights}`` is then an error),
    ``sources`` maps an index of ``manifest.environment.sources`` to its realized tree (the
    xpolicylab protocol needs its XPolicyLab source), ``cwd`` is where the process starts
    (relative paths in a command resolve there), ``state_dir`` holds its log. ``base_env``
    (default ``os.environ``) is cleaned by :func:`clean_environment`.

    Only ``resident`` and ``on_demand`` placements launch anything; ``external`` and ``off``
    are a :class:`LaunchError` (the broker serves them without a process).
    """
    if placement.mode not in ("resident", "on_demand"):
        raise LaunchError(f"{name}: mode {placement.mode!r} launches no process")
    if placement.port is None:
        raise LaunchError(f"{name}: the plan gives it no port")
    port = int(placement.port)
    url = placement.url or local_url(port, manifest.protocol)
    values = {"python": str(python), "port": str(port), "url": url}
    if weights is not None:
        values["weights"] = str(weights)
    values.update(source_values(manifest, sources or {}))

    if manifest.protocol == "xpolicylab":
        argv = _xpolicylab_argv(name, manifest, values, port, sources or {})
    else:
        assert manifest.command is not None  # the model requires a command for http
        argv = [_expand(part, values, name) for part in manifest.command]

    client = render_client(name, manifest.client, values)

    env = clean_environment(os.environ if base_env is None else base_env, placement.gpu)
    health_url = url.rstrip("/") + manifest.health if manifest.health else None
    return LaunchSpec(
        name=name,
        argv=tuple(argv),
        env=env,
        cwd=cwd,
        port=port,
        url=url,
        health_url=health_url,
        load_seconds=float(manifest.load_seconds),
        log_path=log_path(state_dir, name),
        protocol=manifest.protocol,
        client=client,
    )


def _xpolicylab_argv(
    name: str,
    manifest: ServiceManifest,
    values: Mapping[str, str],
    port: int,
    sources: Mapping[int, Path],
) -> list[str]:
    """XPolicyLab's own policy server on ``port`` (see the module docstring)."""
    config = manifest.xpolicylab
    assert config is not None  # the model requires [xpolicylab] for this protocol
    if config.source not in sources:
        raise LaunchError(
            f"{name}: XPolicyLab (environment.sources[{config.source}]) is not realized",
            hint=f"harness install {name}",
        )
    root = Path(sources[config.source])
    script = root / "setup_policy_server.py"
    policy_dir = root / config.policy
    argv = [
        values["python"],
        str(script),
        "--config_path",
        str(policy_dir / "deploy.yml"),
        "--protocol",
        "ws",
        "--host",
        LOCAL_HOST,
        "--port",
        str(port),
        "--overrides",
        f"policy_name={Path(config.policy).name}",
        f"checkpoint_path={_expand(config.checkpoint, values, name)}",
    ]
    for key, value in config.overrides.items():
        text = _expand(value, values, name) if isinstance(value, str) else _override_value(value)
        argv.append(f"{key}={text}")
    return argv


def specs_to_json(specs: Mapping[str, LaunchSpec]) -> str:
    """Serialize launch specs by service name (for a detached broker)."""
    return json.dumps({n: s.as_json() for n, s in sorted(specs.items())}, indent=1)


def specs_from_json(text: str) -> dict[str, LaunchSpec]:
    """Inverse of :func:`specs_to_json`."""
    return {n: LaunchSpec.from_json(d) for n, d in json.loads(text).items()}
