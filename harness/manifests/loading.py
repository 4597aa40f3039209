"""Reading TOML files into validated models, with errors that name the file and the key.

The contract: :func:`load_model` either returns a validated model or raises
:class:`~harness.errors.InputError` whose message names the file and, for each problem, the
dotted key, what is wrong, and (for an unknown key) the closest valid key. Malformed TOML is
reported with its line and column. No other exception escapes for any byte string on disk.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from harness.errors import InputError

# Re-exported: TOML reading lives in a module without pydantic, for the light paths
# (settings, ``harness lock``'s start) that read TOML before any model is loaded.
from harness.manifests.tomlfile import display_path as display_path
from harness.manifests.tomlfile import parse_toml as parse_toml
from harness.manifests.tomlfile import read_toml as read_toml

M = TypeVar("M", bound=BaseModel)


def load_model(model: type[M], path: Path, *, context: dict[str, Any] | None = None) -> M:
    """Read ``path`` and validate it as ``model``; every problem is reported at once."""
    data = read_toml(path)
    return validate_data(model, data, display_path(path), context=context)


def validate_data(
    model: type[M],
    data: Any,
    shown: str,
    *,
    context: dict[str, Any] | None = None,
    sets: Sequence[tuple[str, ...]] = (),
) -> M:
    """Validate already-parsed ``data`` from ``shown`` as ``model``; ``sets`` are the keys
    ``--set`` overrode in it (a problem at or under one is the option's, not the file's)."""
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise InputError(format_validation_error(exc, model, shown, sets=sets)) from None
    except RecursionError:
        raise InputError(f"{shown}: nested too deeply") from None


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], shown: str, *, sets: Sequence[tuple[str, ...]] = ()
) -> str:
    """Turn pydantic's error list into lines of ``file: key: problem`` (``--set key: problem``
    for a key at or under one of ``sets``, the keys ``--set`` gave)."""
    lines: list[str] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error.get("loc", ()))
        key = dotted_key(loc)
        kind = error.get("type", "")
        given = any(tuple(str(part) for part in loc[: len(keys)]) == keys for keys in sets)
        where = f"--set {key}" if given else f"{shown}: {key}"
        if kind == "extra_forbidden":
            valid = _valid_keys_at(model, loc[:-1])
            unknown = str(loc[-1]) if loc else "?"
            close = closest_key(unknown, valid)
            suggestion = f" (did you mean '{close}'?)" if close else ""
            known = f"; valid keys: {', '.join(sorted(valid))}" if valid and not close else ""
            lines.append(f"{where}: unknown key{suggestion}{known}")
        elif kind == "missing":
            lines.append(f"{where}: missing required key")
        else:
            message = _clean_message(str(error.get("msg", "invalid value")))
            lines.append(f"{where if key else f'{shown}: (top level)'}: {message}")
    # One line per problem, in a stable order, without repeats (unions can repeat them).
    unique = list(dict.fromkeys(lines))
    return "\n".join(unique)


def closest_key(unknown: str, valid: list[str]) -> str | None:
    """The valid key a user most likely meant: a prefix match first, then the most similar."""
    lowered = unknown.lower()
    prefixed = sorted(k for k in valid if k.startswith(lowered) or lowered.startswith(k))
    if prefixed:
        return min(prefixed, key=lambda k: abs(len(k) - len(lowered)))
    close = difflib.get_close_matches(lowered, valid, n=1, cutoff=0.5)
    return close[0] if close else None


def dotted_key(loc: tuple[Any, ...]) -> str:
    """``('environment', 'sources', 0, 'rev')`` → ``environment.sources[0].rev``."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif _is_union_tag(item):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _is_union_tag(item: Any) -> bool:
    # pydantic adds the union member's type name ('int', 'literal[...]', 'function-after[...]')
    # to the location of errors inside a union; users never wrote those keys.
    text = str(item)
    return text in {"int", "str", "float", "bool", "list", "dict"} or "[" in text


def _clean_message(message: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def _valid_keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the model accepts at ``loc`` (following nested models), by their TOML names."""
    current: Any = model
    for item in loc:
        if isinstance(item, int) or _is_union_tag(item):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            # A mapping of user-named entries (deploy services, say): step into its values.
            current = _value_model(current)
            if current is None:
                return []
            continue
        field = _field_by_alias(current, str(item))
        if field is None:
            return []
        current = _model_in(field.annotation)
        if current is None:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or name for name, f in current.model_fields.items()]
    return []


def _field_by_alias(model: type[BaseModel], key: str) -> Any:
    for name, field in model.model_fields.items():
        if (field.alias or name) == key:
            return field
    return None


def _model_in(annotation: Any) -> Any:
    """The BaseModel inside an annotation like ``list[X]``, ``X | None`` or ``dict[str, X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found if _is_mapping(annotation) is False else _Mapping(found)
    return None


class _Mapping:
    """Marks a ``dict[str, Model]`` step: the next location item is a user-chosen name."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model


def _is_mapping(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is dict


def _value_model(current: Any) -> Any:
    if isinstance(current, _Mapping):
        return current.model
    return None
