"""Which accelerator variant of a lock this machine runs (a manifest's ``[environment.variants]``).

A lab runs one service on a laptop without a GPU, a server whose driver supports CUDA 12.6 and
a newer one on 12.8; one lock holds every variant (``harness/lock/platforms.py``) and each
machine realizes and runs the one it can:

* forced: ``--variant`` (the CLI sets ``HARNESS_VARIANT``), else the deploy's ``variant`` key
  (also through ``HARNESS_VARIANT``), names one; a name the lock lacks is an error listing them;
* else, with an NVIDIA driver: the variant whose ``cuda`` is the newest the driver supports
  (NVML's driver CUDA version: what the driver can run, not what is installed);
* else (no driver, no GPU): a variant without ``cuda`` (cpu);
* none fits: an error naming what each variant needs and what this machine has.

:func:`choose_variant` is pure; :func:`driver_cuda` is the one look at the machine (NVML, or
``HARNESS_CUDA_DRIVER``, which says what the driver supports: ``12.6``, or ``none``; tests and a
user planning for another machine set it). It never raises: no driver is a normal machine.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from types import ModuleType
from typing import NamedTuple

from harness.errors import HarnessError, InputError

#: Names a variant to use instead of the machine's choice (``--variant`` and a deploy's
#: ``variant`` set it).
VARIANT_VARIABLE = "HARNESS_VARIANT"
#: What the NVIDIA driver supports, instead of asking NVML: ``12.8``, or ``none``.
DRIVER_VARIABLE = "HARNESS_CUDA_DRIVER"


class Choice(NamedTuple):
    """The variant chosen and why, in words a run record and ``plan`` show."""

    variant: str
    reason: str


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def choose_variant(
    variants: list[tuple[str, str | None]], *, driver: str | None, forced: str | None = None, what: str = "the lock"
) -> Choice:
    """The variant of ``variants`` (name, CUDA version it needs or None) a machine whose driver
    supports CUDA ``driver`` (None: no NVIDIA driver) runs, or the ``forced`` one (module doc).
    Pure. InputError for a forced name ``what`` lacks; HarnessError when none can run here."""
    names = [name for name, _ in variants]
    if forced:
        if forced not in names:
            raise InputError(
                f"{what} has no variant {forced!r} ({VARIANT_VARIABLE}, --variant or the deploy's variant); "
                f"it has {', '.join(names)}"
            )
        return Choice(forced, f"named by {VARIANT_VARIABLE} (--variant or the deploy's variant)")
    anywhere = [name for name, cuda in variants if cuda is None]
    if driver is None:
        if anywhere:
            return Choice(anywhere[0], "no NVIDIA driver here: the variant that needs no CUDA")
        raise HarnessError(
            f"{what} cannot run here: no NVIDIA driver, and every variant needs one ("
            + ", ".join(f"{name}: CUDA {cuda}" for name, cuda in variants)
            + ")",
            hint=f"run it on a machine with a GPU, or add a variant without cuda; {DRIVER_VARIABLE} says "
            "what a driver supports when planning for another machine",
        )
    runnable = [(name, cuda) for name, cuda in variants if cuda is not None and _version(cuda) <= _version(driver)]
    if runnable:
        name, cuda = max(runnable, key=lambda item: _version(item[1] or "0"))
        return Choice(name, f"the NVIDIA driver supports CUDA {driver}: {name} (CUDA {cuda}) is the newest it runs")
    if anywhere:
        return Choice(
            anywhere[0],
            f"the NVIDIA driver supports CUDA {driver}, older than every CUDA variant: the one that needs none",
        )
    raise HarnessError(
        f"{what} cannot run here: the NVIDIA driver supports CUDA {driver}, and its variants need "
        + ", ".join(f"{name}: CUDA {cuda}" for name, cuda in variants),
        hint="update the driver, or add a variant for an older CUDA",
    )


def variant_reason(variant: str, cuda: str | None) -> str:
    """Why this machine takes ``variant`` (needing CUDA ``cuda``, or None) of a lock, as
    :func:`choose_variant` chose it here: for a run record, ``plan`` and ``doctor``."""
    if forced_variant() == variant:
        return f"named by {VARIANT_VARIABLE} (--variant or the deploy's variant)"
    driver = driver_cuda()
    if driver is None:
        return "no NVIDIA driver here: the variant that needs no CUDA"
    if cuda is None:
        return f"the NVIDIA driver supports CUDA {driver}, older than every CUDA variant: the one that needs none"
    return f"the NVIDIA driver supports CUDA {driver}: {variant} (CUDA {cuda}) is the newest it runs"


def reason_problem(variants: list[tuple[str, str | None]], variant: str, reason: str) -> str | None:
    """What is wrong with a record saying a machine took ``variant`` of a lock offering
    ``variants`` (name, CUDA it needs) for ``reason`` (:func:`variant_reason`'s words), or None
    when :func:`choose_variant` gives exactly that variant for that reason. Pure: a record whose
    variant the lock lacks, or whose reason does not lead to it (a driver that supports CUDA
    12.6 never takes cu128), is told."""
    names = [name for name, _ in variants]
    if variant not in names:
        return f"variant {variant!r} is not one the lock holds ({', '.join(names) or 'none'})"
    forced = reason.startswith("named by ")
    said = re.match(r"the NVIDIA driver supports CUDA ([0-9]+(?:\.[0-9]+)*)[:,]", reason)
    if not forced and said is None and not reason.startswith("no NVIDIA driver here"):
        return f"reason {reason!r} is none harness gives for choosing a variant"
    driver = said.group(1) if said else None
    try:
        choice = choose_variant(variants, driver=driver, forced=variant if forced else None)
    except HarnessError as exc:
        return f"reason {reason!r} chooses no variant: {exc.message}"
    if choice.variant != variant:
        return f"reason {reason!r} chooses {choice.variant}, not {variant}"
    if choice.reason != reason:
        return f"reason {reason!r} is not what choosing {variant} says ({choice.reason!r})"
    return None


#: A lock's record of what a variant's wheel needs, by its wheel-variant metadata (PEP 817):
#: ``tvar==1.0+cu128 [cu128] nvidia :: cuda_version_lower_bound :: 12.9`` (package, the label
#: read, one property).
_WHEEL_ENTRY = re.compile(r"^(?P<pin>\S+==\S+) \[(?P<label>[0-9a-z._]+)\] (?P<property>\S+ :: \S+ :: \S+)$")
#: The property of the NVIDIA provider saying which CUDA a driver must support.
CUDA_LOWER_BOUND = ("nvidia", "cuda_version_lower_bound")


def wheel_entry(name: str, version: str, label: str, prop: str) -> str:
    """One entry of a lock's ``wheel-variants``: package ``name`` ``version``'s wheel of
    variant ``label`` needs ``prop`` (``namespace :: feature :: value``). Pure."""
    return f"{name}=={version} [{label}] {prop}"


def check_wheel_entry(entry: str) -> str:
    """``entry`` when it is spelled as :func:`wheel_entry` writes one, else ValueError (a
    lock's validation)."""
    if not _WHEEL_ENTRY.match(entry):
        raise ValueError(f"{entry!r} is not NAME==VERSION [LABEL] NAMESPACE :: FEATURE :: VALUE")
    return entry


def wheel_cuda(entries: list[str]) -> tuple[str, str] | None:
    """The CUDA version a variant's wheels need by their wheel-variant metadata, and which
    package says so: the highest of the packages' ``nvidia :: cuda_version_lower_bound``
    (a package listing several values needs the lowest of them), None when none says. Pure."""
    bounds: dict[str, str] = {}
    for entry in entries:
        match = _WHEEL_ENTRY.match(entry)
        if match is None:
            continue
        namespace, feature, value = match.group("property").split(" :: ")
        if (namespace, feature) != CUDA_LOWER_BOUND or not re.fullmatch(r"[0-9]+(\.[0-9]+)*", value):
            continue
        pin = match.group("pin")
        if pin not in bounds or _version(value) < _version(bounds[pin]):
            bounds[pin] = value
    if not bounds:
        return None
    pin = max(bounds, key=lambda p: (_version(bounds[p]), p))
    return bounds[pin], pin


def needed_cuda(declared: str | None, entries: list[str]) -> str | None:
    """What a variant needs of the driver: its wheels' metadata when the lock recorded it
    (:func:`wheel_cuda`), the manifest's ``cuda`` otherwise. Pure."""
    found = wheel_cuda(entries)
    return found[0] if found is not None else declared


def cuda_source(declared: str | None, entries: list[str]) -> str:
    """Which source decided what a variant needs of the driver, in words for ``plan`` and
    ``doctor``. Pure."""
    found = wheel_cuda(entries)
    if found is not None:
        return f"CUDA {found[0]} from the wheel-variant metadata of {found[1]} ({CUDA_LOWER_BOUND[0]} :: {CUDA_LOWER_BOUND[1]})"
    if declared is not None:
        return f"CUDA {declared} as the manifest declares (no wheel-variant metadata)"
    return "no CUDA (the manifest declares none, and no wheel-variant metadata says one)"


def forced_variant() -> str | None:
    """The variant ``HARNESS_VARIANT`` names, if any."""
    return os.environ.get(VARIANT_VARIABLE) or None


def driver_cuda() -> str | None:
    """The CUDA version this machine's NVIDIA driver supports (``12.8``), None without a
    driver or GPU: ``HARNESS_CUDA_DRIVER`` when set (``none`` for none), else NVML."""
    given = os.environ.get(DRIVER_VARIABLE)
    if given is not None:
        given = given.strip().lower()
        if given in ("", "none"):
            return None
        try:
            _version(given)
        except ValueError:
            raise InputError(f"{DRIVER_VARIABLE}={given!r}: expected a CUDA version like 12.8, or none") from None
        return given
    return _nvml_driver_cuda()


def load_nvml() -> ModuleType | None:
    """``pynvml``, or None where NVML cannot answer: not installed, or, on Linux, no NVIDIA
    library to load. That is told first by loading ``libnvidia-ml.so.1`` as pynvml itself
    does, before pynvml is imported: its import alone takes 0.02-0.05 s, on the way of every
    run that plans (a cluster shard's node asks twice), where a machine without a GPU would
    only learn that its library is missing. A ``pynvml`` already imported is used as is."""
    if "pynvml" not in sys.modules and sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


@functools.lru_cache(maxsize=1)
def _nvml_driver_cuda() -> str | None:
    pynvml = load_nvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no library, no driver: a machine without a GPU
        return None
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        version = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())
        return f"{version // 1000}.{(version % 1000) // 10}"
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
