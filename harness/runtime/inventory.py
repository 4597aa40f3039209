"""The GPU inventory: what this machine has (NVML), what a user says it has (``--gpus``), and
what a deploy lets the project use.

:func:`detect_gpus` is the only function here that touches the machine; it never raises,
because a machine without a GPU or a driver is a normal machine with an empty inventory
(DESIGN: "no GPU must degrade to an empty inventory"); nor does :func:`gpu_memory_by_pid`,
which says how much GPU memory each process holds, for ``harness status``.
:func:`parse_gpus`, :func:`visible` and :func:`tree_gpu_memory` are pure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from harness.errors import InputError
from harness.runtime.plan import Gpu

if TYPE_CHECKING:
    from harness.manifests.deploy import Deploy

_GIB = 1024**3
# GB figures are shown to people and compared with manifests' vram_gb (one decimal there);
# two decimals keep NVML's byte counts readable without changing any placement decision.
_DIGITS = 2

_GPUS_EXAMPLE = "e.g. --gpus 4x24 (four 24 GB GPUs), --gpus 24,24,80, or --gpus none"
_COUNT_X_SIZE = re.compile(r"^(\d+)\s*[xX*]\s*(\d+(?:\.\d+)?)$")
_SIZE = re.compile(r"^\d+(?:\.\d+)?$")
#: Bounds that catch typos (``--gpus 24x4`` is allowed; ``--gpus 4x2400`` is not a GPU).
MAX_GPUS = 64
MAX_GPU_GB = 4096.0


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """The devices ``CUDA_VISIBLE_DEVICES`` in ``env`` names, in order (Ray and Slurm set it to
    the GPUs they assigned a task; a user may too), None when it is unset. Pure.

    As CUDA reads it: indices or UUIDs (``GPU-…``, a unique prefix will do) separated by
    commas; an empty value, or one starting with an entry CUDA cannot read (``-1``,
    ``NoDevFiles``), hides every GPU from there on."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    devices = []
    for part in value.split(","):
        part = part.strip()
        if not (part.isdigit() or part.startswith(("GPU-", "MIG-"))):
            break  # CUDA stops at the first entry it cannot read
        devices.append(part)
    return devices


def restrict(gpus: tuple[Gpu, ...], devices: list[str], uuids: Mapping[int, str]) -> tuple[Gpu, ...]:
    """The GPUs of ``gpus`` (NVML's, by physical index; ``uuids`` their UUIDs) that
    ``devices`` names, in that order, numbered as CUDA numbers them inside the process: 0, 1…
    (an engine's ``CUDA_VISIBLE_DEVICES=2,3`` makes physical GPU 3 the process's GPU 1). An
    entry that names no GPU, and every one after it, is dropped, as CUDA does. Pure."""
    by_index = {gpu.index: gpu for gpu in gpus}
    chosen: list[Gpu] = []
    for device in devices:
        if device.isdigit():
            gpu = by_index.get(int(device))
        else:
            matches = [by_index[i] for i, uuid in uuids.items() if i in by_index and uuid.startswith(device)]
            gpu = matches[0] if len(matches) == 1 else None
        if gpu is None or gpu in chosen:
            break
        chosen.append(gpu)
    return tuple(Gpu(i, gpu.name, gpu.total_gb, gpu.free_gb) for i, gpu in enumerate(chosen))


def detect_gpus(env: Mapping[str, str] | None = None) -> tuple[Gpu, ...]:
    """The GPUs NVML reports, in index order, or, where ``CUDA_VISIBLE_DEVICES`` names some
    (``env``, default this process's: an engine assigned them), those alone, numbered as the
    process sees them (:func:`restrict`); ``()`` when there is no driver, no GPU, or any NVML
    error. Never raises: callers plan with whatever this returns."""
    devices = visible_devices(os.environ if env is None else env)
    if devices == []:
        return ()
    from harness.lock.variants import load_nvml

    pynvml = load_nvml()
    if pynvml is None:
        return ()
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no usable GPU
        return ()
    try:
        gpus = []
        uuids: dict[int, str] = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):  # older bindings return bytes
                name = name.decode("utf-8", "replace")
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                Gpu(
                    index=index,
                    name=str(name),
                    total_gb=round(memory.total / _GIB, _DIGITS),
                    free_gb=round(memory.free / _GIB, _DIGITS),
                )
            )
            if devices is not None:
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                uuids[index] = uuid.decode("ascii", "replace") if isinstance(uuid, bytes) else str(uuid)
        return tuple(gpus) if devices is None else restrict(tuple(gpus), devices, uuids)
    except Exception:  # a GPU that falls off the bus mid-query: plan as if there were none
        return ()
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def gpu_memory_by_pid() -> dict[int, int] | None:
    """GPU memory in use (bytes) by each process NVML reports, summed over the GPUs it uses
    (compute and graphics contexts); None when NVML cannot answer (no driver, no GPU, any
    error). Never raises. A process whose usage the driver hides (no permission to see it,
    as in some containers) counts 0."""
    from harness.lock.variants import load_nvml

    pynvml = load_nvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: nothing to report, which is not zero
        return None
    try:
        usage: dict[int, int] = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            seen: set[int] = set()
            for query in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                for process in query(handle):
                    if process.pid in seen:  # a process with both contexts holds one allocation
                        continue
                    seen.add(process.pid)
                    used = process.usedGpuMemory
                    usage[process.pid] = usage.get(process.pid, 0) + (used if isinstance(used, int) else 0)
        return usage
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def tree_gpu_memory(pids: list[int] | None, usage: dict[int, int] | None) -> int | None:
    """The GPU memory (bytes) of a process tree (``pids``: the root and its descendants) in
    ``usage`` (:func:`gpu_memory_by_pid`); None when either is unknown. Pure."""
    if pids is None or usage is None:
        return None
    return sum(usage.get(pid, 0) for pid in pids)


def parse_gpus(spec: str) -> tuple[Gpu, ...]:
    """Parse a ``--gpus`` override into an inventory of idle GPUs (free == total).

    ``4x24`` is four 24 GB GPUs, ``24,24,80`` one GPU per size, ``0`` or ``none`` no GPU.
    Indexes count from 0 in the order given. A malformed or out-of-range spec raises
    :class:`InputError` with an example.
    """
    text = spec.strip().lower()
    if not text:
        raise InputError(f"--gpus: empty value; {_GPUS_EXAMPLE}")
    if text in ("0", "none"):
        return ()
    sizes: list[float]
    match = _COUNT_X_SIZE.match(text)
    if match:
        count = int(match.group(1))
        if count < 1 or count > MAX_GPUS:
            raise InputError(f"--gpus {spec!r}: count must be 1 to {MAX_GPUS}; {_GPUS_EXAMPLE}")
        sizes = [float(match.group(2))] * count
    else:
        parts = [part.strip() for part in text.split(",")]
        if not all(_SIZE.match(part) for part in parts):
            raise InputError(f"--gpus {spec!r}: not a GPU list; {_GPUS_EXAMPLE}")
        sizes = [float(part) for part in parts]
        if len(sizes) > MAX_GPUS:
            raise InputError(f"--gpus {spec!r}: at most {MAX_GPUS} GPUs; {_GPUS_EXAMPLE}")
    for size in sizes:
        if size <= 0 or size > MAX_GPU_GB:
            raise InputError(
                f"--gpus {spec!r}: a GPU's memory must be more than 0 and at most {MAX_GPU_GB:g} GB; {_GPUS_EXAMPLE}"
            )
    return tuple(Gpu(index=i, name=f"planned {size:g} GB", total_gb=size, free_gb=size) for i, size in enumerate(sizes))


def visible(gpus: tuple[Gpu, ...], deploy: Deploy | None) -> tuple[Gpu, ...]:
    """The GPUs the project may use under ``deploy``: those in its ``gpus`` list (all when it
    has none), each capped at ``gpu_memory_gb`` (total and free) when that is set.

    A deploy index missing from ``gpus`` is simply absent here; whoever pins work to it
    reports that (see :func:`harness.runtime.placement.plan`).
    """
    if deploy is None:
        return tuple(gpus)
    allowed = None if deploy.gpus is None else set(deploy.gpus)
    cap = deploy.gpu_memory_gb
    result = []
    for gpu in gpus:
        if allowed is not None and gpu.index not in allowed:
            continue
        if cap is not None:
            # The cap is the project's share of the GPU; memory others already use still
            # counts against it only when less than the cap remains free.
            gpu = Gpu(gpu.index, gpu.name, min(gpu.total_gb, cap), min(gpu.free_gb, cap))
        result.append(gpu)
    return tuple(result)


def describe(gpus: tuple[Gpu, ...]) -> str:
    """One line for people: ``GPU 0 (NVIDIA H200): 139.5 of 140.4 GB free; …`` or ``no GPU``."""
    if not gpus:
        return "no GPU"
    return "; ".join(f"GPU {g.index} ({g.name}): {g.free_gb:g} of {g.total_gb:g} GB free" for g in gpus)
