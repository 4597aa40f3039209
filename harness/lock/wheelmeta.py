"""Wheel-variant metadata at lock time: what each accelerator variant's wheels need.

For every package an accelerator variant of a manifest names (its ``package-index`` keys and
its ``requirements``), ``harness lock`` asks the package's index for the pinned release's
``{name}-{version}-variants.json`` (``harness/resolve/wheelvariants.py``). Where the index
serves one, the properties of the label the variant's wheel is (the wheel's own label, else
the label named like the variant) are recorded in the lock's target
(``wheel-variants``), and checked against the manifest: a variant that declares ``cuda =
"12.8"`` whose wheel's metadata says ``nvidia :: cuda_version_lower_bound :: 12.9`` is refused
naming both (:func:`declaration_problem`, pure). Realize then compares the driver with the
metadata's bound, the manifest's ``cuda`` where no metadata was recorded
(``harness/lock/variants.py:needed_cuda``).

``lock --offline`` reads no index: it keeps what the previous lock recorded for the same pins.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from harness.config import Settings
from harness.errors import HarnessError, InputError
from harness.lock.document import Lock
from harness.lock.variants import wheel_cuda, wheel_entry
from harness.manifests.model import Environment
from harness.resolve.pins import Package


def variant_packages(environment: Environment, variant: str) -> set[str]:
    """The normalized names of the packages ``variant`` of ``environment`` names: its
    package indexes' keys and its requirements' names. Pure."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    spec = environment.variants[variant]
    names: set[str] = {canonicalize_name(name) for name in spec.package_index}
    for line in spec.requirements:
        try:
            names.add(canonicalize_name(Requirement(line).name))
        except InvalidRequirement:
            continue  # the manifest's validation names it
    return names


def read_wheel_variants(
    packages: Iterable[Package],
    names: set[str],
    variant: str,
    *,
    settings: Settings,
    cache_dir: Path,
    seen: dict[tuple[str, str, str], object],
) -> list[str]:
    """The ``wheel-variants`` entries of one variant's target: for each of ``packages`` named
    in ``names`` whose index serves variant metadata for its pinned version, the properties of
    its label, sorted. ``seen`` caches what an index said per (index, name, version) across
    the lock's targets. HarnessError naming the index and file when one is malformed."""
    from harness.resolve.indexpages import index_address
    from harness.resolve.wheelvariants import (
        VariantsFile,
        choose_label,
        fetch_variants_file,
        label_properties,
        variant_label,
    )

    entries: list[str] = []
    for package in packages:
        if package.name not in names:
            continue
        key = (package.index, package.name, package.version)
        if key not in seen:
            url = index_address(package.index, settings, cache_dir)
            seen[key] = fetch_variants_file(url, package.name, package.version, index_name=package.index)
        metadata = seen[key]
        if not isinstance(metadata, VariantsFile):
            continue
        labels = [label for w in package.wheels if (label := variant_label(w.file)) is not None]
        label = choose_label(metadata, variant, labels)
        entries += [
            wheel_entry(package.name, package.version, label, prop) for prop in label_properties(metadata, label)
        ]
    return sorted(entries)


def previous_wheel_variants(
    previous: Lock | None, platform: str, variant: str, packages: Iterable[Package]
) -> list[str]:
    """What ``previous`` recorded for ``variant`` on ``platform``, kept for the pins that did
    not change (``lock --offline`` reads no index). Pure."""
    if previous is None:
        return []
    if previous.targets:
        target = next((t for t in previous.targets if t.platform == platform and t.variant == variant), None)
        recorded = list(target.wheel_variants) if target is not None else []
    else:
        recorded = list(previous.wheel_variants) if previous.variant == variant else []
    pins = {f"{p.name}=={p.version}" for p in packages}
    return [entry for entry in recorded if entry.split(" ", 1)[0] in pins]


def declaration_problem(variant: str, declared: str | None, entries: list[str]) -> InputError | None:
    """The error for a variant whose manifest declares less CUDA than its wheels' metadata
    says they need (or none at all), naming both; None when they agree. Pure."""
    found = wheel_cuda(entries)
    if found is None:
        return None
    bound, pin = found
    key = f"environment.variants.{variant}.cuda"
    said = f"the wheel-variant metadata of {pin} says nvidia :: cuda_version_lower_bound :: {bound}"
    if declared is None:
        return InputError(
            f"{key} is not set (a variant that runs without a GPU), but {said}",
            hint=f'declare cuda = "{bound}" for this variant, or pin a build that needs no CUDA',
        )
    if _version(bound) > _version(declared):
        return InputError(
            f'{key} = "{declared}", but {said}: the wheel needs a driver that supports CUDA {bound}',
            hint=f'declare cuda = "{bound}", or pin a build of {pin.split("==")[0]} made for CUDA {declared}',
        )
    return None


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        raise HarnessError(f"{text!r} is not a CUDA version") from None
