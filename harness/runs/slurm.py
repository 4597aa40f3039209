"""What a ``--cluster slurm`` run asks Slurm for: partition, account, QOS, time, memory, GPUs.

From the deploy's ``[slurm]`` table (:class:`harness.manifests.deploy.SlurmDeploy`) and
``--slurm KEY=VALUE`` on the command line, which wins key by key; checked by the same model,
so a bad value is an error naming ``--slurm KEY`` or the deploy's key. The result is plain
data recorded in the run's ``config.json`` (``cluster.slurm``, so ``--resume`` asks again
for the same) and turned into submitit's executor parameters by :func:`submitit_parameters`
(pure): submitit writes them into the array job's sbatch script.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.errors import InputError

#: The keys ``--slurm`` and ``[slurm]`` take.
KEYS = ("partition", "account", "qos", "time", "mem", "gpus")

#: A task's time limit when none is given: a day.
DEFAULT_MINUTES = 24 * 60


def slurm_options(deploy: Mapping[str, Any] | None, given: tuple[str, ...]) -> dict[str, Any]:
    """The Slurm options of a run: the deploy's ``[slurm]`` (as JSON), then each ``--slurm
    KEY=VALUE`` of ``given`` over it. Only the keys set are kept. Raises :class:`InputError`."""
    from pydantic import ValidationError

    from harness.manifests.deploy import SlurmDeploy

    options = {k: v for k, v in (deploy or {}).items() if v is not None}
    for item in given:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in KEYS:
            raise InputError(
                f"--slurm {item!r}: give KEY=VALUE with KEY one of {', '.join(KEYS)}",
                hint="e.g. --slurm partition=gpu --slurm time=4:00:00 --slurm mem=64G",
            )
        options[key] = value.strip()
    try:
        model = SlurmDeploy.model_validate(options)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "slurm"
        raise InputError(
            f"--slurm {where}: {error['msg']}",
            hint="the deploy's [slurm] table or --slurm KEY=VALUE; see the cluster guide",
        ) from None
    return model.model_dump(exclude_none=True)


def submitit_parameters(
    options: Mapping[str, Any], *, cpus: float, gpus: int, local: bool, count: int
) -> dict[str, Any]:
    """submitit's ``AutoExecutor.update_parameters`` for one shard per array task. Pure.

    ``gpus`` is what the head's plan places services on; ``options['gpus']`` (the node kind's)
    wins. The ``slurm_`` keys are Slurm's alone (the local executor ignores them)."""
    from harness.manifests.deploy import slurm_minutes

    params: dict[str, Any] = {
        "timeout_min": slurm_minutes(str(options["time"])) if options.get("time") else DEFAULT_MINUTES,
        "cpus_per_task": max(1, int(cpus)),
        "nodes": 1,
        "tasks_per_node": 1,
    }
    wanted = int(options["gpus"]) if options.get("gpus") is not None else gpus
    if wanted:
        params["gpus_per_node"] = wanted
    if local:
        return params
    params["slurm_array_parallelism"] = count
    # Slurm does not requeue a task on its own (its default for a node's failure): the head
    # submits a lost shard again, counted by --retries, and a requeued task would run its shard
    # a second time after the head recorded it.
    params["slurm_additional_parameters"] = {"no_requeue": True}
    for key in ("partition", "account", "qos", "mem"):
        if options.get(key):
            params[f"slurm_{key}"] = str(options[key])
    return params
