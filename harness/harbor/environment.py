"""``HarnessEnvironment``: Harbor's ``BaseEnvironment`` on a realized harness environment.

Select it with ``harbor run -e harness.harbor:HarnessEnvironment``. Per session (the agent's
environment, and each separate verifier's):

1. the task's ``environment/harness.toml`` and the ``--ek`` overrides name an environment
   (:mod:`harness.harbor.spec`); problems there fail *this trial* when it starts, never the
   job (Harbor constructs every trial's environment before running it);
2. its closure is resolved in ``$HARNESS_HOME``'s store, realized on first use unless
   ``--ek realize=false`` (:mod:`harness.harbor.resolve`); a pin that no longer matches the
   lock fails the trial as drifted;
3. a native sandbox (:mod:`harness.harbor.sandbox`) starts with its root in
   ``<trial>/harness/<role>/`` (``env`` for the agent, ``verifier__<key>`` for a separate
   verifier), the closure bound read-only; the root is deleted on stop unless Harbor's
   ``--no-delete``;
4. a harness record, ``<trial>/harness/<role>.json``, names every store path of the closure
   with its content hash, the interpreter, the locks (packages, sources, weights), the
   environment digest, the sandbox (users, limits, what of the task was ignored), the host
   (OS, kernel, libc, the executables the sandbox exposes: :mod:`harness.harbor.host`), the
   environment variables given to commands, and the task digest Harbor put in ``lock.json``.

A task's ``docker_image`` label (a separate verifier's ``[verifier.environment]`` one) names a
rootfs template of the project when ``harbor/images/<label>.toml`` exists above the task
(:mod:`harness.harbor.rootfs`): realized on first use, it is laid as the base of the session's
root (its ``/usr`` and ``/etc`` merged with the host's, the task users added to its
``/etc/passwd`` with the uids the sandbox gives them), a verifier's template bringing its
``/tests``; the environment it names stands in for a missing ``environment/harness.toml``;
the record's ``rootfs`` names it. A Dockerfile's ``FROM`` naming a template (its label, or a
base it ``provides``) chooses the template the same way.

A task's ``environment/Dockerfile`` is applied or refused, never dropped
(:mod:`harness.harbor.image`): its ``ENV``, ``WORKDIR``, ``COPY``, ``USER`` (and ``ARG``,
``RUN pip install`` checked against the lock, ``RUN apt-get install`` checked against the
template's lock, ``useradd``, ``mkdir``) shape the session; any
other step, and a compose file, fails the trial with Harbor's ``SandboxBuildFailedError``
naming it; the record's ``dockerfile`` lists every step and what was done with it.

Task users (``[agent] user``, ``[verifier] user``, read from the task's ``task.toml``) run
under ids of their own where the machine allows (:mod:`harness.harbor.ids`): the workdir,
``/logs/agent`` and ``/logs/artifacts`` belong to the agent's user, ``/logs/verifier`` to
the verifier's (root when it names none), ``/tests`` and ``/solution`` to root. ``cpus``
and ``memory_mb`` are enforced as :mod:`harness.harbor.limits` can; the trial log and the
record say how, or why not (a session the memory watchdog stopped raises Harbor's
``MemoryLimitExceededError``).

Phases of an agent session (:meth:`HarnessEnvironment._enter_phase`): ``/tests`` and
``/logs/verifier`` are out of the agent phase's reach; Harbor's first verifier step (removing
stale rewards as root, or an upload into those folders) ends it: every
process of the agent phase is killed and those folders are made afresh before the step runs;
the record's ``sandbox.verifier_isolation`` says what held.

Options (``--ek key=value``): ``home`` (else ``$HARNESS_HOME``, else ``~/.cache/harness``),
``manifest``, ``lock``, ``project``, ``environment`` (see the spec), ``realize`` (default
true), ``offline`` (realize without network), ``broker`` (else ``$HARNESS_BROKER``),
``deploy`` (else ``$HARNESS_DEPLOY``: a realize on first use takes weight files from its
``weights`` folder and asks its binary caches, as ``harness realize --deploy`` does).
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import time
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.trial.paths import EnvironmentPaths

from harness.errors import HarnessError, InputError
from harness.harbor import host, image
from harness.harbor.dockerfile import ImagePlan
from harness.harbor.limits import Enforcement, MemoryLimitExceededError, enforce
from harness.harbor.resolve import EnvironmentUnavailable, ResolvedEnvironment, resolve
from harness.harbor.sandbox import Sandbox, SandboxConfig, SandboxError, unavailable_reason
from harness.harbor.spec import EnvironmentSpec, read_spec
from harness.manifests.tomlfile import loads_bounded
from harness.runtime.launch import is_secret_name

RECORD_SCHEMA = "harness-harbor-record/1"
#: Variables of the commands' base environment recorded by name only.
_SECRETS = frozenset({"HARNESS_BROKER_TOKEN"})
DEFAULT_WORKDIR = "/app"


class HarnessOptions(EnvironmentOptions):
    """``--ek`` options of :class:`HarnessEnvironment` (see the module doc)."""

    home: str | None = None
    manifest: str | None = None
    lock: str | None = None
    project: str | None = None
    environment: str | None = None
    realize: bool = True
    offline: bool = False
    broker: str | None = None
    deploy: str | None = None


class HarnessEnvironment(BaseEnvironment):
    """A Harbor environment whose sandbox runs a realized harness environment; module doc."""

    options_model = HarnessOptions
    options: HarnessOptions

    _spec: EnvironmentSpec | None = None
    _spec_error: HarnessError | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sandbox: Sandbox | None = None
        self._resolved: ResolvedEnvironment | None = None
        self._base_env: dict[str, str] = {}
        self._record: dict[str, Any] = {}
        self._users: set[str] = set()
        self._env_names: set[str] = set()
        self._limits: Enforcement | None = None
        self._used_mb: float | None = None
        self._execs = 0
        self._phase = "agent"  # "verifier" from the verifier's first step; "after" once it is done
        self._image: ImagePlan | None = None  # the task's Dockerfile, as applied
        self._image_copied: list[tuple[str, str | None]] = []
        self._image_given: dict[str, str] = {}  # COPY --chown: path -> the owner, or why not
        self._template: tuple[Path, str] | None = None  # (project, label): docker_image names a template
        self._rootfs: dict[str, Any] | None = None  # the template as laid, for the record
        self._bases: dict[str, str] = {}  # the project's templates by the bases they stand in for
        self._label_template: str | None = None  # the template docker_image names
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "harness"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, gpus=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        """Fractional CPUs are always accepted (a cgroup enforces them exactly, CPU affinity in
        whole CPUs otherwise); hard limits are declared only where a cgroup can be made here."""
        cpu, memory = _cgroup_capable()
        return EnvironmentResourceCapabilities(cpu_limit=cpu, memory_limit=memory, fractional_cpus=True)

    def _validate_network_policy_support(self) -> None:
        # Harbor raises this one from the constructor too (ending the job); defer it to start().
        try:
            super()._validate_network_policy_support()
        except ValueError as exc:
            self._spec_error = self._spec_error or EnvironmentUnavailable(str(exc))

    def _validate_definition(self) -> None:
        # Never raise here: Harbor builds every trial's environment before running any, so an
        # error would end the whole job. start() raises it, failing this trial only.
        try:
            self._spec = read_spec(self.environment_dir, self.options.model_dump(), default=self._template_spec())
        except HarnessError as exc:
            self._spec_error = exc

    def _template_spec(self) -> EnvironmentSpec | None:
        """The environment the task's ``docker_image`` template names, if the label names a
        template (:mod:`harness.harbor.rootfs`) that names one."""
        from harness.harbor import rootfs

        label = self.task_env_config.docker_image or ""
        hint = Path(self.options.project).expanduser().absolute() if self.options.project else None
        project = rootfs.find_project(self.environment_dir.parent, label, hint)
        if project is not None:
            self._template, self._label_template = (project, label), label
        found = rootfs.dockerfile_base(self.environment_dir, hint or project)
        if found is not None:
            self._bases = found[1]
            if project is None and found[2] is not None:  # FROM <template>: that template is the root
                self._template = (found[0], found[2])
        if self._template is None:
            return None
        return rootfs.environment_spec(*self._template)

    # ------------------------------------------------------------------- paths

    @property
    def home(self) -> Path:
        raw = self.options.home or os.environ.get("HARNESS_HOME") or "~/.cache/harness"
        return Path(raw).expanduser().absolute()  # as harness names it: venvs embed this path

    @property
    def deploy_path(self) -> Path | None:
        raw = self.options.deploy or os.environ.get("HARNESS_DEPLOY")
        return Path(raw).expanduser().absolute() if raw else None

    @property
    def role(self) -> str:
        prefix = f"{self.trial_paths.trial_dir.name}__"
        role = self.session_id[len(prefix) :] if self.session_id.startswith(prefix) else self.session_id
        return "".join(c if c.isalnum() or c in "-._" else "_" for c in role) or "env"

    @property
    def session_dir(self) -> Path:
        """The sandbox's root: ``<trial>/harness/<role>/``."""
        return self.trial_paths.trial_dir.resolve() / "harness" / self.role

    @property
    def record_path(self) -> Path:
        return self.trial_paths.trial_dir.resolve() / "harness" / f"{self.role}.json"

    @property
    def workdir(self) -> str:
        """task.toml's workdir, else the Dockerfile's last ``WORKDIR``, else ``/app``."""
        return self.task_env_config.workdir or (self._image.workdir if self._image else None) or DEFAULT_WORKDIR

    @property
    def is_verifier_session(self) -> bool:
        """A separate verifier's session (Harbor names it ``<trial>__verifier__<key>``): it has
        no agent phase to guard against."""
        return self.role.startswith("verifier")

    # --------------------------------------------------------------- lifecycle

    async def start(self, force_build: bool) -> None:
        try:
            await self._start()
        except BaseException as exc:
            if isinstance(exc, (HarnessError, SandboxBuildFailedError)):
                # The message first, on its own line: Harbor's log would bury it under a traceback.
                self.logger.error(f"harness: {self.session_id} cannot start: {exc}")
            sandbox, self._sandbox = self._sandbox, None
            if sandbox is not None:  # started, then something after it failed
                await sandbox.stop(delete=False)
            elif self._limits is not None:
                self._limits.release()
            raise

    async def _start(self) -> None:
        """Start this session (module doc, steps 1-4): check the spec, choose the sandbox,
        resolve the closure, plan the sandbox (forwarded ports, task users, limits), make its
        root afresh, start it, set the commands' base environment, write the record."""
        started = time.time()
        spec = self._checked_spec()
        confined = await self._needs_confinement()
        await self._plan_image({})  # a refused step fails the trial before anything is realized
        resolved = self._resolved = await self._resolve(spec)
        self._image = await self._read_image(resolved)
        paths = EnvironmentPaths.for_os(self.os)
        broker = self.options.broker or os.environ.get("HARNESS_BROKER")
        ports = await asyncio.to_thread(_loopback_ports, broker) if broker and self._network_disabled else []
        users = _task_users(self.environment_dir.parent, self._image.user if self._image else None)
        await self._enforce_limits()
        ignored = self._warn_ignored()
        config = self._sandbox_config(resolved, paths, ports, users)
        template = await self._realize_template()
        await self._fresh_session_dir()
        if template is not None:
            await self._lay_template(template, config)
        if self._image is not None:
            self._image_copied = await self._copy_image_files(self._image)
        await self._start_sandbox(config, confined)
        await self._give_copied()
        self._base_env = self._commands_env(resolved.environment_path, broker)
        await self._write_start_record(config, broker, started, ignored)
        self.logger.info(
            f"harness: {self.session_id} runs {resolved.environment} "
            f"({len(resolved.paths)} store paths, digest {resolved.digest})"
        )

    async def _realize_template(self) -> tuple[Path, Any] | None:
        """The store path of the task's ``docker_image`` template (realized on first use)."""
        if self._template is None:
            return None
        from harness.harbor import rootfs

        project, label = self._template
        try:
            return await asyncio.to_thread(
                rootfs.ensure, self.home, project, label, realize=self.options.realize, offline=self.options.offline
            )
        except HarnessError as exc:
            raise EnvironmentUnavailable(f"docker_image = {label!r}: {exc}") from None

    async def _lay_template(self, template: tuple[Path, Any], config: SandboxConfig) -> None:
        """The template as the base of the fresh root; the sandbox binds the host's /usr and
        /etc where the template merges its own with them (:func:`harness.harbor.rootfs.lay`)."""
        from harness.harbor import rootfs
        from harness.store.store import Store

        path, lock = template
        laid = await asyncio.to_thread(rootfs.lay, path, self.session_dir)
        config.read_only = [p for p in config.read_only if p not in laid.host_binds]
        config.host_binds = dict(laid.host_binds)
        config.store_paths = [*config.store_paths, path]  # the template's /usr links point into it
        config.users = [*config.users, *(u for u in lock.users if u not in config.users)]
        # The task's users beside the template's in the root's /etc/passwd (`id agent` answers
        # even where commands run as one id), and the same uids for the sandbox's own table.
        names = [u for u in config.users if isinstance(u, str) and not u.isdigit() and u != "root"]
        config.fixed_ids = await asyncio.to_thread(rootfs.add_users, self.session_dir, names)
        if config.fixed_ids:  # the sandbox's own table keeps the root's other users (a package's)
            config.etc_base = {
                n: (self.session_dir / "etc" / n).read_text(encoding="utf-8") for n in ("passwd", "group")
            }
        record = Store.in_home(self.home).record(lock.store)
        self._rootfs = {
            "label": lock.label,
            "store": lock.store,
            "path": str(path),
            "content": record.content if record else None,
            "packages": [f"{p.name}={p.version}" for p in lock.packages],
            "files": len(lock.files),
            "maintainer_scripts": "not run (see /.harness-rootfs.json in the root)",
            "laid": {"copied": laid.copied, "host_links": laid.linked, "host_binds": laid.host_binds},
        }
        self.logger.info(f"harness: {self.session_id} root from template {lock.label} ({lock.store})")

    def _checked_spec(self) -> EnvironmentSpec:
        """The spec read when Harbor made this environment; its error, deferred to here, is
        raised as :class:`EnvironmentUnavailable` (failing this trial only)."""
        if self._spec_error is not None:
            raise EnvironmentUnavailable(str(self._spec_error))
        assert self._spec is not None
        return self._spec

    async def _needs_confinement(self) -> bool:
        """Whether this session runs confined by Landlock and PRoot (no namespaces here) rather
        than in the bubblewrap sandbox; :class:`SandboxError` when neither can run."""
        reason = await asyncio.to_thread(unavailable_reason)
        if reason is None:
            return False
        from harness.harbor import confine

        why_not = await asyncio.to_thread(confine.unavailable_reason)
        if why_not is not None:
            raise SandboxError(
                f"cannot sandbox this trial: {reason}; nor confine it with Landlock and PRoot: {why_not}"
            )
        self.logger.warning(f"harness: {self.session_id}: {reason}: confined with Landlock and PRoot instead")
        return True

    async def _read_image(self, resolved: ResolvedEnvironment) -> ImagePlan | None:
        """The task's Dockerfile as this session applies it (None without one); Harbor's
        ``SandboxBuildFailedError`` naming each step, with its line, that cannot be applied,
        and for a compose file (:mod:`harness.harbor.image`)."""
        variables = {"PATH": _path_var(resolved.environment_path), "HOME": "/root", "LANG": "C.UTF-8"}
        plan = await self._plan_image(variables)
        problems = (
            []
            if plan is None
            else await asyncio.to_thread(image.check, plan, resolved.environment_path, host.os_release())
        )
        if problems:
            raise SandboxBuildFailedError(f"harness: environment/{image.DOCKERFILE}: " + "; ".join(problems))
        if plan is not None:
            for step in plan.steps:
                self.logger.info(f"harness: {self.session_id} Dockerfile line {step.line}: {step.action}: {step.text}")
        return plan

    async def _plan_image(self, variables: dict[str, str]) -> ImagePlan | None:
        """:func:`harness.harbor.image.read` of this task, its refusal as Harbor's error."""
        try:
            plan = await asyncio.to_thread(
                functools.partial(
                    image.read,
                    tests_bundled=self.is_verifier_session,
                    templates=self._bases,
                    label_template=self._label_template,
                ),
                self.environment_dir,
                variables,
            )
        except image.ImageRefused as exc:
            raise SandboxBuildFailedError(f"harness: {exc}") from None
        if plan is not None and plan.packages:
            await self._check_packages(plan)
        return plan

    async def _check_packages(self, plan: ImagePlan) -> None:
        """``RUN apt-get install``: every package must be pinned by the trial's template's lock
        (the packages come from the lock, never from the network at trial time); Harbor's
        ``SandboxBuildFailedError`` naming each one that is not."""
        from harness.harbor import rootfs

        if self._template is None or plan.template != self._template[1]:
            raise SandboxBuildFailedError(
                f"harness: environment/{image.DOCKERFILE}: apt-get install: no rootfs template found for {plan.template}"
            )
        problems = await asyncio.to_thread(rootfs.unpinned_packages, self._template[0], plan)
        if problems:
            raise SandboxBuildFailedError(f"harness: environment/{image.DOCKERFILE}: " + "; ".join(problems))

    async def _copy_image_files(self, plan: ImagePlan) -> list[tuple[str, str | None]]:
        """The Dockerfile's ``COPY`` steps, into the fresh session root (before it starts)."""
        store = str(self._resolved.store_root) if self._resolved else None
        for step in plan.copies:
            if store and (step.dest == store or step.dest.startswith(store.rstrip("/") + "/")):
                raise SandboxBuildFailedError(
                    f"harness: environment/{image.DOCKERFILE}: line {step.line}: COPY to {step.dest}: the store is read-only"
                )
        try:
            return await asyncio.to_thread(image.copy_into, plan, self.environment_dir, self.session_dir)
        except image.ImageRefused as exc:
            raise SandboxBuildFailedError(f"harness: {exc}") from None

    async def _give_copied(self) -> None:
        """``COPY --chown``: the copied files to their user, where task users have ids."""
        assert self._sandbox is not None
        for path, owner in self._image_copied:
            if owner is None:
                continue
            given = await self._sandbox.give(path, owner)
            self._image_given[path] = (
                f"{owner} (uid {given.uid})"
                if given
                else f"not enforced: {self._sandbox.idmap.reason or 'one id here'}"
            )

    async def _resolve(self, spec: EnvironmentSpec) -> ResolvedEnvironment:
        """The closure ``spec`` names in ``home``'s store, realized first unless the options say not."""
        return await asyncio.to_thread(
            resolve,
            spec,
            self.home,
            realize=self.options.realize,
            offline=self.options.offline,
            task_dir=self.environment_dir.parent,
            log=self.logger.info,
            deploy=self.deploy_path,
        )

    async def _enforce_limits(self) -> None:
        """Enforce the task's CPU and memory limits as this machine can; logged when any is."""
        self._limits = await asyncio.to_thread(
            enforce, self.session_id, self._effective_cpus, self._effective_memory_mb
        )
        if self._limits.cpus is not None or self._limits.memory_mb is not None:
            self.logger.info(f"harness: {self.session_id} limits: {self._limits.describe()}")

    def _warn_ignored(self) -> list[str]:
        """What of the task's environment definition this session does not use, each warned of."""
        label = None if self._template is not None else self.task_env_config.docker_image
        ignored = _ignored(self.environment_dir, label, self._effective_storage_mb)
        for line in ignored:
            self.logger.warning(f"harness: {self.session_id} ignores {line}")
        return ignored

    def _sandbox_config(
        self, resolved: ResolvedEnvironment, paths: EnvironmentPaths, ports: list[int], users: TaskUsers
    ) -> SandboxConfig:
        """The sandbox of this session: the closure bound, Harbor's folders made (owned by the
        task users), the GPUs when the task asks for any, the limits enforced."""
        owners: dict[str, str | int] = {}
        if users.agent is not None:
            owners.update(
                {self.workdir: users.agent, str(paths.agent_dir): users.agent, str(paths.artifacts_dir): users.agent}
            )
        if users.verifier is not None:
            owners[str(paths.verifier_dir)] = users.verifier
        made = [*self._image.workdirs, *self._image.dirs] if self._image else []
        extra_users: list[str | int] = [u for u in (self._image.users if self._image else []) if u not in users]
        return SandboxConfig(
            root=self.session_dir,
            guarded=[] if self.is_verifier_session else [str(paths.tests_dir), str(paths.verifier_dir)],
            store_paths=[resolved.store_root / name for name in resolved.paths],
            devices=self._gpu_devices(),
            dirs=[
                str(p)
                for p in (paths.agent_dir, paths.verifier_dir, paths.artifacts_dir, paths.tests_dir, paths.solution_dir)
            ]
            + [self.workdir, *made],
            network=not self._network_disabled,
            forward_ports=ports,
            hostname=_hostname(self.environment_name),
            users=[*dict.fromkeys(u for u in users if u is not None), *extra_users],
            owners=owners,
            limits=self._limits,
        )

    async def _fresh_session_dir(self) -> None:
        """Make the sandbox's root empty, removing what an earlier session left there."""
        if self.session_dir.exists():
            from harness.harbor.sandbox import remove_root

            await asyncio.to_thread(remove_root, self.session_dir)
        self.session_dir.mkdir(parents=True)

    async def _start_sandbox(self, config: SandboxConfig, confined: bool) -> None:
        """Start the session's sandbox (held in ``_sandbox`` before it starts, so that a failed
        start is stopped) and log which ids the task users run under."""
        if confined:
            from harness.harbor.confine import ConfinedSandbox

            self._sandbox = ConfinedSandbox(config, log=self.logger.info)
        else:
            self._sandbox = Sandbox(config, log=self.logger.info)
        await self._sandbox.start()
        if self._sandbox.idmap.multi:
            self.logger.info(
                f"harness: {self.session_id} users: "
                + ", ".join(f"{u.name} uid {u.uid}" for u in self._sandbox.users.users.values())
            )
        elif config.users:
            self.logger.warning(
                f"harness: {self.session_id} runs every command as the sandbox's root, not as "
                f"{', '.join(map(str, config.users))}: {self._sandbox.idmap.reason}"
            )

    def _commands_env(self, env: Path, broker: str | None) -> dict[str, str]:
        """The base environment of every command: the harness environment ``env`` first on
        ``PATH``, and the broker's address (and token) when there is one."""
        assert self._sandbox is not None
        base = {
            "PATH": _path_var(env),
            "HOME": "/root",
            "USER": "root",
            "LOGNAME": "root",
            "SHELL": self._sandbox.tools.shell,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "VIRTUAL_ENV": str(env),
            "HARNESS_ENVIRONMENT": str(env),
            "HARNESS_PYTHON": f"{env}/bin/python",
            "HARNESS_SESSION": self.session_id,
        }
        if broker:
            base["HARNESS_BROKER"] = broker
            token = os.environ.get("HARNESS_BROKER_TOKEN")
            if token:  # the broker answers only with its token (its owner runs this trial)
                base["HARNESS_BROKER_TOKEN"] = token
        return base

    async def _write_start_record(
        self, config: SandboxConfig, broker: str | None, started: float, ignored: list[str]
    ) -> None:
        """Write the host's executables listing beside the record, then the record itself."""
        executables = await asyncio.to_thread(host.executables, self.home / "cache")
        # In sha256sum's format: `sha256sum -c host-executables.sha256` re-checks the host.
        listing = self.record_path.parent / "host-executables.sha256"
        await asyncio.to_thread(
            listing.write_text, "".join(f"{h}  {p}\n" for p, h in sorted(executables.items())), encoding="utf-8"
        )
        self._record = self._make_record(config, broker, started)
        self._record["host"] = {
            **host.summary(),
            "executables": {
                "dirs": list(host.BIN_DIRS),
                "count": len(executables),
                "digest": host.digest(executables),
                "list": listing.name,
            },
        }
        self._record["host"]["libraries"] = await self._host_libraries(config, list(executables))
        self._record["sandbox"]["ignored"] = ignored
        self._record["rootfs"] = self._rootfs
        self._record["dockerfile"] = self._image_record()
        await asyncio.to_thread(_write_record, self.record_path, self._record)

    def _image_record(self) -> dict[str, Any] | None:
        """The record's ``dockerfile``: every step and what this session did with it."""
        plan = self._image
        if plan is None:
            return None
        import hashlib

        text = (self.environment_dir / image.DOCKERFILE).read_bytes()
        return {
            "path": f"environment/{image.DOCKERFILE}",
            "sha256": hashlib.sha256(text).hexdigest(),
            "base": plan.base,
            "host_base": f"rootfs template {plan.template}: the record's rootfs"
            if plan.base_is_template
            else "the host's /usr and /etc (read-only) stand in for the base image",
            "template": plan.template,
            "packages": [p for _, p in plan.packages],
            "steps": [s.as_json() for s in plan.steps],
            "env": {k: ("<withheld: a credential>" if is_secret_name(k) else v) for k, v in plan.env.items()},
            "workdir": plan.workdir,
            "user": plan.user,
            "copied": [path for path, _ in self._image_copied],
            "owners": self._image_given,
            "requirements_checked": [r for _, r in plan.requirements],
        }

    async def _host_libraries(self, config: SandboxConfig, executables: list[str]) -> dict[str, Any]:
        """The host's shared libraries that the executables on PATH and the closure's ELF files
        (its interpreter, extension modules) load, hashed, listed beside the record."""
        assert self._resolved is not None
        store = str(self._resolved.store_root)
        started = time.monotonic()
        files = executables + await asyncio.to_thread(host.elf_files, config.store_paths)
        found, missing = await asyncio.to_thread(host.libraries, files, self.home / "cache", exclude=(store,))
        listing = self.record_path.parent / "host-libraries.sha256"
        await asyncio.to_thread(
            listing.write_text, "".join(f"{h}  {p}\n" for p, h in sorted(found.items())), encoding="utf-8"
        )
        return {
            "count": len(found),
            "digest": host.digest(found),
            "list": listing.name,
            "not_found": missing,
            "of": "PT_INTERP and DT_NEEDED of the executables above and of the closure's ELF files, "
            "resolved as the loader does (RPATH/RUNPATH, ldconfig's cache, the default folders); "
            "libraries in the store are covered by their store path's content hash",
            "seconds": round(time.monotonic() - started, 3),
        }

    async def stop(self, delete: bool) -> None:
        sandbox, self._sandbox = self._sandbox, None
        self._used_mb = None
        if sandbox is not None and sandbox.watchdog is not None and self._record:
            self._record["sandbox"]["limits"]["watchdog"] = sandbox.watchdog.as_json()
        if sandbox is not None:
            if delete and self._record:  # measured before the root goes
                await sandbox.stop(delete=False)
                self._used_mb = await asyncio.to_thread(_size_mb, self.session_dir)
                from harness.harbor.sandbox import remove_root

                await asyncio.to_thread(remove_root, self.session_dir)
            else:
                await sandbox.stop(delete=delete)
        elif self._limits is not None:
            self._limits.release()
        if self._record:
            used = await asyncio.to_thread(_size_mb, self.session_dir) if not delete else self._used_mb
            self._record["session"].update(
                stopped=_iso(time.time()),
                root_deleted=bool(delete),
                commands=self._execs,
                users_requested=sorted(self._users),
            )
            self._record["sandbox"]["storage"]["used_mb_at_stop"] = used
            self._record["commands_env"]["given_by_harbor"] = sorted(self._env_names)
            await asyncio.to_thread(_write_record, self.record_path, self._record)

    # -------------------------------------------------------------------- exec

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        self._require()
        self._check_memory()
        await self._enter_phase(user in ("root", 0) and command == self._reward_removal())
        sandbox = self._require()
        wanted = self._resolve_user(user)
        as_user: dict[str, str] = {}
        if wanted not in (None, "root", 0, "0"):
            self._users.add(str(wanted))
            task_user = await sandbox.ensure_user(wanted)
            if task_user is not None:
                as_user = {"HOME": task_user.home, "USER": task_user.name, "LOGNAME": task_user.name}
        self._execs += 1
        given = self._merge_env(env) or {}
        self._env_names.update(given)
        image_env = self._image.env if self._image else {}
        outcome = await sandbox.exec(
            command,
            cwd=cwd or self.workdir,
            env={**self._base_env, **as_user, **image_env, **given},
            timeout=timeout_sec,
            on_output=self._output_callback(),
            user=wanted,
        )
        self._check_memory()
        return ExecResult(stdout=outcome.stdout, stderr=outcome.stderr, return_code=outcome.return_code)

    def _resolve_user(self, user: str | int | None) -> str | int | None:
        """As Docker: the given user, else Harbor's default (the task's), else the
        Dockerfile's ``USER``."""
        resolved = super()._resolve_user(user)
        if resolved is None and self._image is not None:
            return self._image.user
        return resolved

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = Path(source_path)
        if not source.is_file():
            raise FileNotFoundError(f"Source file not found: {source}")
        self._require()
        await self._enter_phase(self._touches_verifier(target_path))
        await self._require().upload_file(source, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        self._require()
        await self._enter_phase(self._touches_verifier(target_dir))
        await self._require().upload_dir(Path(source_dir), target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._require().download_file(source_path, Path(target_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        if self._sandbox is None and self._record == {}:
            # Never started (the start failed, and said why first): Harbor's recovery of the
            # logs finds nothing, rather than burying that error under a second traceback.
            Path(target_dir).mkdir(parents=True, exist_ok=True)
            return
        await self._require().download_dir(source_dir, Path(target_dir))
        verifier_dir = str(EnvironmentPaths.for_os(self.os).verifier_dir)
        if self._phase == "verifier" and os.path.normpath(source_dir) == verifier_dir:
            self._phase = "after"  # the verifier's last step: a next agent phase is guarded again

    def _check_memory(self) -> None:
        """Harbor's memory error once the watchdog stopped the session (no cgroup here)."""
        watchdog = self._sandbox.watchdog if self._sandbox is not None else None
        if watchdog is not None and watchdog.exceeded:
            raise MemoryLimitExceededError(f"harness: {self.session_id}: {watchdog.exceeded}")

    def _require(self) -> Sandbox:
        if self._sandbox is None or not self._sandbox.started:
            raise RuntimeError("harness environment not started")
        return self._sandbox

    # ------------------------------------------------------------------ helpers

    def _gpu_devices(self) -> list[str]:
        if self._effective_gpus <= 0:
            return []
        dev = Path("/dev")
        devices = sorted(str(p) for p in dev.glob("nvidia*") if not p.is_dir())
        devices += sorted(str(p) for p in (dev / "dri").glob("*")) if (dev / "dri").is_dir() else []
        if not any("nvidia" in d for d in devices):
            raise EnvironmentUnavailable(
                f"the task asks for {self._effective_gpus} GPU(s), and this machine has no /dev/nvidia* device"
            )
        return devices

    def _isolation_plan(self, config: SandboxConfig) -> dict[str, Any]:
        """What keeps the verifier out of the agent's reach in this session (completed when the
        verifier phase begins: ``begun``)."""
        assert self._sandbox is not None
        if self.is_verifier_session:
            return {"session": "a separate verifier's: fresh, no agent process ever ran in it"}
        return {
            "guarded": list(config.guarded),
            "agent_phase_writes": _guard_how(self._sandbox),
            "before_verifier": "every process of the agent phase killed; the guarded folders made afresh",
            "begun": None,
        }

    # ------------------------------------------------------------------- phases

    def _reward_removal(self) -> str:
        """The command Harbor's verifier runs first (as root): removing stale rewards."""
        from harbor.utils.scripts import quote_shell_arg

        paths = EnvironmentPaths.for_os(self.os)
        return "rm -f -- " + " ".join(
            quote_shell_arg(path, self.os) for path in (paths.reward_text_path, paths.reward_json_path)
        )

    def _touches_verifier(self, path: str) -> bool:
        paths = EnvironmentPaths.for_os(self.os)
        inside = os.path.normpath("/" + str(path).lstrip("/"))
        return any(
            inside == str(p) or inside.startswith(str(p).rstrip("/") + "/")
            for p in (paths.tests_dir, paths.verifier_dir)
        )

    async def _enter_phase(self, verifier: bool) -> None:
        """Harbor's verifier steps (removing stale rewards as root, uploading into /tests or
        /logs/verifier) begin the verifier phase: the agent phase's processes are killed and
        the guarded folders made afresh first. After the verifier's logs are downloaded (a
        multi-step task's next agent phase), the next step of any kind guards them again."""
        sandbox = self._sandbox
        if sandbox is None or self.is_verifier_session:
            return
        if self._phase == "after":
            # The next step after a verifier is the next agent phase's (a multi-step task
            # empties the verifier's folders first: that is not a verifier beginning).
            self._phase = "agent"
            await sandbox.begin_agent_phase()
            return
        if verifier and self._phase == "agent":
            self._phase = "verifier"
            began = time.monotonic()
            outcome = await sandbox.begin_verifier_phase()
            outcome["seconds"] = round(time.monotonic() - began, 3)
            outcome["at"] = _iso(time.time())
            if not outcome["agent_processes_killed"]:
                self.logger.warning(
                    f"harness: {self.session_id}: {outcome['survivors']} process(es) of the agent phase survived"
                )
            if self._record:
                self._record["sandbox"]["verifier_isolation"]["begun"] = outcome
                await asyncio.to_thread(_write_record, self.record_path, self._record)

    async def empty_dirs(self, dirs: Any, *, chmod: bool = True) -> ExecResult | None:
        """Harbor's emptying of folders; the guarded ones are empty throughout an agent phase
        (made afresh when it began, written by nothing since), so there it leaves them be:
        a multi-step task empties them both before a verifier and before the next agent
        phase, so this is no sign of either (Harbor's removal of stale rewards is)."""
        await self._enter_phase(False)
        if self._phase == "agent" and not self.is_verifier_session:
            dirs = [d for d in dirs if not self._touches_verifier(str(d))]
            if not dirs:
                return ExecResult(stdout=None, stderr=None, return_code=0)
        return await super().empty_dirs(dirs, chmod=chmod)

    def _make_record(self, config: SandboxConfig, broker: str | None, started: float) -> dict[str, Any]:
        resolved = self._resolved
        assert resolved is not None and self._sandbox is not None
        spec = self._spec
        assert spec is not None
        python = resolved.store_root / resolved.python if resolved.python else None
        return {
            "schema": RECORD_SCHEMA,
            "tools": {**_tool_versions(), "harbor": _harbor_version(), **self._sandbox.tools.versions()},
            "session": {
                "id": self.session_id,
                "role": self.role,
                "trial": self.trial_paths.trial_dir.name,
                "trial_id": str(self.context_id) if self.context_id else None,
                "started": _iso(started),
                "root": str(config.root),
                "hostname": socket.gethostname(),
            },
            "task": {
                "name": self.environment_name,
                "environment_dir": str(self.environment_dir),
                "spec": spec.as_json(),
                **_task_digests(self.environment_dir.parent, self.trial_paths),
            },
            "environment": {
                "store": resolved.environment,
                "path": str(resolved.environment_path),
                "digest": resolved.digest,
                "realized_now": resolved.realized,
                "impure": resolved.impure,
                "store_root": str(resolved.store_root),
            },
            "interpreter": {
                "store": resolved.python,
                "path": str(python) if python else None,
                "executable": f"{resolved.environment_path}/bin/python",
            },
            "closure": resolved.closure,
            "sandbox": {
                "backend": (
                    "landlock+proot"
                    if not self._sandbox.namespaces
                    else "bwrap+nsenter" + ("+userns-map" if self._sandbox.idmap.multi else "")
                ),
                "confinement": getattr(self._sandbox, "describe", lambda: None)(),
                "network": "host" if config.network else "none",
                "forwarded_ports": list(self._sandbox.forwarded),
                "broker": broker,
                "read_only": [*config.read_only, "/sys"],
                "store_paths_bound": len(config.store_paths),
                "devices": config.devices,
                "workdir": self.workdir,
                "limits": self._limits.as_json() if self._limits else None,
                "storage": {"storage_mb": self._effective_storage_mb, "enforced": False},
                "udp": (
                    "allowed (the host's network)"
                    if config.network
                    else "loopback only (a network namespace of its own)"
                    if self._sandbox.namespaces
                    else (self._sandbox.describe() or {}).get("udp")  # type: ignore[attr-defined]
                ),
                "verifier_isolation": self._isolation_plan(config),
                "users": {
                    "enforced": self._sandbox.idmap.multi,
                    "ids": self._sandbox.idmap.as_json(),
                    "table": [u.as_json() for u in self._sandbox.users.users.values()],
                    "owners": {k: str(v) for k, v in config.owners.items()},
                },
            },
            "commands_env": {
                "base": {
                    k: ("<withheld: a credential>" if k in _SECRETS or is_secret_name(k) else v)
                    for k, v in self._base_env.items()
                },
                "given_by_harbor": [],  # names only: values may be credentials
                "note": "base: set by harness for every command (values); given_by_harbor: "
                "the names of the variables Harbor, the task or the agent added",
            },
        }


def _guard_how(sandbox: Sandbox) -> str:
    if not sandbox.namespaces:
        return "Landlock: commands of the agent phase may not write them"
    return "read-only binds in the agent phase (bubblewrap)"


class TaskUsers(NamedTuple):
    """The users a task's agent and verifier run as (None: root, or unset)."""

    agent: str | int | None
    verifier: str | int | None


def _task_users(task_dir: Path, image_user: str | None = None) -> TaskUsers:
    """``[agent] user`` and ``[verifier] user`` of the task's ``task.toml`` (None: root/unset);
    the first step's, for a multi-step task that sets them per step; either unset is the
    Dockerfile's ``USER`` (``image_user``), as in Docker."""
    try:
        data = loads_bounded((task_dir / "task.toml").read_text(encoding="utf-8"), str(task_dir / "task.toml"))
    except (OSError, ValueError, InputError):
        return TaskUsers(image_user, image_user)

    def user(table: Any) -> str | int | None:
        value = table.get("user") if isinstance(table, dict) else None
        return None if value in (None, "") else value

    agent, verifier = user(data.get("agent")), user(data.get("verifier"))
    for step in data.get("steps", []) if isinstance(data.get("steps"), list) else []:
        if isinstance(step, dict):
            agent = agent or user(step.get("agent"))
            verifier = verifier or user(step.get("verifier"))

    def effective(value: str | int | None) -> str | int | None:
        value = image_user if value is None else value  # an explicit root stays root
        return None if value in ("root", 0, "0") else value

    return TaskUsers(effective(agent), effective(verifier))


def _ignored(environment_dir: Path, docker_image: str | None, storage_mb: int | None) -> list[str]:
    """What of the task's environment definition this environment does not use, and why."""
    out = []
    if docker_image:
        out.append(
            f"docker_image = {docker_image!r}: no template harbor/images/{docker_image}.toml above the task; "
            "the software is the harness environment and the host's /usr"
        )
    if storage_mb is not None:
        out.append(f"storage_mb = {storage_mb}: not enforced (the session's disk use is recorded at stop)")
    return out


def _path_var(env: Path) -> str:
    """The commands' ``PATH``: the environment ``env`` first, then the host's folders."""
    return f"{env}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _size_mb(root: Path) -> float | None:
    """Disk use of ``root`` in MiB (allocated blocks; links not followed), None if it is gone."""
    if not root.exists():
        return None
    total = 0
    for folder, dirs, files in os.walk(root):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return round(total / (1024 * 1024), 3)


@functools.lru_cache(maxsize=1)
def _cgroup_capable() -> tuple[bool, bool]:
    """Whether this process can make a cgroup limiting (cpu, memory): tried once, removed."""
    probe = enforce("probe", 1, 64)
    try:
        return probe.cpu_how.startswith("cgroup"), probe.memory_how.startswith("cgroup")
    finally:
        probe.release()


def _task_digests(task_dir: Path, trial_paths: Any) -> dict[str, Any]:
    """The task digest as Harbor computes it, and the one its ``lock.json`` recorded."""
    out: dict[str, Any] = {"digest": None, "lock_json_digest": None}
    try:
        from harbor.publisher.packager import Packager

        out["digest"] = "sha256:" + Packager.compute_content_hash(task_dir)[0]
    except Exception:  # a record is written even when Harbor's internals moved
        pass
    try:
        import json

        lock = json.loads(Path(trial_paths.lock_path).read_text(encoding="utf-8"))
        out["lock_json_digest"] = lock.get("task", {}).get("digest")
    except (OSError, ValueError, AttributeError):
        pass
    return out


def _loopback_ports(broker: str) -> list[int]:
    """The broker's port and its local services' ports, when they are on this host's loopback."""
    import json
    import urllib.request

    parts = urlsplit(broker)
    if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
        return []
    ports = [parts.port]
    token = os.environ.get("HARNESS_BROKER_TOKEN")
    request = urllib.request.Request(
        broker.rstrip("/") + "/status", headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            status = json.loads(response.read())
        for service in status.get("services", []):
            url = urlsplit(str(service.get("url") or ""))
            if url.hostname in ("127.0.0.1", "localhost") and url.port and url.port not in ports:
                ports.append(url.port)
    except (OSError, ValueError):
        pass  # the broker may come up later; its own port is forwarded regardless
    return ports


def _hostname(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "-" else "-" for c in name).strip("-")[:63]
    return cleaned or "harness"


@functools.lru_cache(maxsize=1)
def _tool_versions() -> dict[str, str]:
    from harness.runs.record import tool_versions

    return tool_versions()


@functools.lru_cache(maxsize=1)
def _harbor_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("harbor")
    except Exception:
        return None


def _iso(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def _write_record(path: Path, data: dict[str, Any]) -> None:
    from harness.runs.record import write_json

    write_json(path, data)


__all__ = ["HarnessEnvironment", "HarnessOptions", "EnvironmentUnavailable"]
