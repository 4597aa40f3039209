"""Wheel-variant metadata (WheelNext: PEP 817, PEP 825) where an index serves it.

An index that publishes variant wheels serves, beside a release's wheels and linked from the
same project page, ``{name}-{version}-variants.json``: the release's ``default-priorities``
(namespaces in order of preference), its ``providers`` (one per namespace: the plugin that
says what a machine supports) and ``variants``, each variant label (``cu128``) with the
properties a wheel of that label needs, ``{namespace: {feature: [values]}}`` (``nvidia`` →
``cuda_version_lower_bound`` → ``["12.8"]``). A variant wheel carries its label as one more
part of its file name: ``torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64-cu128.whl``.

harness reads that metadata at lock time for the packages an accelerator variant of a
manifest names (``harness/lock/generate.py``): the properties of the label the variant takes
are recorded in the lock, and their CUDA lower bound is what realize compares with the
driver (``harness/lock/variants.py``). Variant-labelled wheel files themselves are not
installed: uv (0.13) does not resolve them, and harness says so (:func:`variant_label`,
``harness/resolve/python.py``).

:func:`parse_variants_json`, :func:`variants_file_name`, :func:`variant_label` and
:func:`label_properties` are pure; :func:`fetch_variants_file` reads the file through the
index client (``harness/resolve/indexpages.py``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from harness.errors import HarnessError

#: The most bytes of a variants.json harness reads (the real ones are a few KiB).
MAX_BYTES = 1 << 20
#: PEP 825: a variant label is 1 to 16 of lowercase letters, digits, ``_`` and ``.``.
_LABEL = re.compile(r"^[0-9a-z._]{1,16}$")
#: Namespaces, features and values (PEP 825's patterns).
_NAME = re.compile(r"^[a-z0-9_]+$")
_VALUE = re.compile(r"^[a-z0-9_.]+$")


@dataclass(frozen=True)
class VariantsFile:
    """A ``{name}-{version}-variants.json`` as read: where it came from, the namespaces in
    order of preference, the providers' namespaces, and every label's properties."""

    where: str  # the file and the index it came from, for messages
    priorities: tuple[str, ...]
    providers: tuple[str, ...]
    variants: dict[str, dict[str, dict[str, tuple[str, ...]]]]


def variants_file_name(name: str, version: str) -> str:
    """The file name of ``name`` ``version``'s variant metadata: name and version normalized
    as in a wheel's file name (``torch-2.8.0-variants.json``)."""
    from packaging.utils import canonicalize_version

    dist = re.sub(r"[-_.]+", "_", name).lower()
    return f"{dist}-{canonicalize_version(version, strip_trailing_zero=False)}-variants.json"


def variant_label(filename: str) -> str | None:
    """The variant label of a wheel file name (``...-manylinux_2_28_x86_64-cu128.whl`` →
    ``cu128``), None for a wheel without one. A wheel name of six parts has either a build tag
    (third part, starting with a digit) or a label (last part); seven parts have both."""
    if not filename.endswith(".whl"):
        return None
    parts = filename[: -len(".whl")].split("-")
    if len(parts) == 7 or (len(parts) == 6 and not parts[2][:1].isdigit()):
        return parts[-1] if _LABEL.match(parts[-1]) else None
    return None


def parse_variants_json(data: bytes, where: str) -> VariantsFile:
    """The variant metadata in ``data`` (``where`` names the file in errors). HarnessError
    naming the file and the key of anything that is not PEP 825's shape. Pure."""
    if len(data) > MAX_BYTES:
        raise HarnessError(f"{where}: {len(data)} bytes, more than the {MAX_BYTES} a variants.json may have")
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:  # an index's file nested deeper than the parser goes
        raise HarnessError(f"{where}: not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise HarnessError(f"{where}: expected a JSON object")
    priorities = document.get("default-priorities", {})
    if not isinstance(priorities, dict):
        raise HarnessError(f"{where}: default-priorities must be an object")
    namespaces = priorities.get("namespace", [])
    if not isinstance(namespaces, list) or not all(isinstance(n, str) and _NAME.match(n) for n in namespaces):
        raise HarnessError(f"{where}: default-priorities.namespace must be a list of namespace names")
    providers = document.get("providers", {})
    if not isinstance(providers, dict):
        raise HarnessError(f"{where}: providers must be an object")
    variants = document.get("variants")
    if not isinstance(variants, dict):
        raise HarnessError(f"{where}: variants must be an object of labels")
    found: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {}
    for label, properties in variants.items():
        if not _LABEL.match(label):
            raise HarnessError(f"{where}: variants.{label}: not a variant label (1-16 of a-z 0-9 _ .)")
        found[label] = _properties(properties, f"{where}: variants.{label}")
    return VariantsFile(where, tuple(namespaces), tuple(sorted(providers)), found)


def _properties(value: object, at: str) -> dict[str, dict[str, tuple[str, ...]]]:
    if not isinstance(value, dict):
        raise HarnessError(f"{at}: expected an object of namespaces")
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for namespace, features in value.items():
        if not _NAME.match(namespace) or not isinstance(features, dict):
            raise HarnessError(f"{at}.{namespace}: expected a namespace name and an object of features")
        out[namespace] = {}
        for feature, values in features.items():
            if not _NAME.match(feature) or not isinstance(values, list) or not values:
                raise HarnessError(f"{at}.{namespace}.{feature}: expected a feature name and a list of values")
            if not all(isinstance(v, str) and _VALUE.match(v) for v in values):
                raise HarnessError(f"{at}.{namespace}.{feature}: values must be strings of a-z 0-9 _ .")
            out[namespace][feature] = tuple(values)
    return out


def label_properties(metadata: VariantsFile, label: str) -> list[str]:
    """The properties variant ``label`` needs, ``namespace :: feature :: value`` each (PEP
    817's spelling), sorted. Pure."""
    return sorted(
        f"{namespace} :: {feature} :: {value}"
        for namespace, features in metadata.variants[label].items()
        for feature, values in features.items()
        for value in values
    )


def choose_label(metadata: VariantsFile, variant: str, wheel_labels: list[str]) -> str:
    """The label of ``metadata`` that describes the wheel a manifest's ``variant`` locked: the
    locked wheel's own label, else the label named like the variant, else the only one.
    HarnessError naming the labels the file has when none of these is there. Pure."""
    for label in [*wheel_labels, variant]:
        if label in metadata.variants:
            return label
    if len(metadata.variants) == 1:
        return next(iter(metadata.variants))
    raise HarnessError(
        f"{metadata.where} describes labels {', '.join(sorted(metadata.variants)) or '(none)'}, none of them "
        f"{variant!r}, the accelerator variant that locked it",
        hint="name the manifest's variant like the label its wheels are built for",
    )


def fetch_variants_file(index_url: str, project: str, version: str, *, index_name: str) -> VariantsFile | None:
    """The variant metadata ``index_url`` serves for ``project`` ``version`` (linked from the
    project's page, as PEP 825 asks), None when it serves none. HarnessError when it cannot
    be read or is malformed, naming the index and the file."""
    from harness.resolve.indexpages import read_linked_file

    name = variants_file_name(project, version)
    data = read_linked_file(index_url, project, name, index_name=index_name, limit=MAX_BYTES)
    if data is None:
        return None
    return parse_variants_json(data, f"{name} on index {index_name!r}")


__all__ = [
    "VariantsFile",
    "choose_label",
    "fetch_variants_file",
    "label_properties",
    "parse_variants_json",
    "variant_label",
    "variants_file_name",
]
