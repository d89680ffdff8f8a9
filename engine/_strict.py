"""The strict cattrs converter used at every edge where untrusted or user data enters.

cattrs coerces silently by default (``"42"`` → 42, ``3.9`` → 3, ``"false"`` → True). Here
every scalar must already have its exact type (bool is not an int), a float must be finite
(TOML allows ``nan`` and ``inf``), an array must be an array (cattrs would spread a string
into its characters and a table into its keys), extra keys are refused,
and errors are flattened into ``"<message> @ <dotted.path>"`` lines that name the key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.cols import (
    homogenous_tuple_structure_factory,
    is_mutable_sequence,
    is_sequence,
    list_structure_factory,
)
from cattrs.gen import make_dict_structure_fn
from cattrs.v import format_exception

T = TypeVar("T")


def _exact(expected: type) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _type: Any) -> Any:
        ok = type(value) is expected or (expected is float and type(value) is int)
        if not ok:
            raise TypeError(f"expected {expected.__name__}, got {type(value).__name__}")
        if expected is float:
            # TOML has nan and inf; no count, size, delay or ratio means either.
            if not math.isfinite(value):
                raise ValueError(f"expected a finite number, got {value}")
            return float(value)
        return value

    return hook


_KINDS: dict[type, str] = {dict: "a table (object)", list: "an array", tuple: "an array",
                          str: "a string", bytes: "bytes", bool: "a boolean",
                          int: "an integer", float: "a number", type(None): "null"}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _is_array(type_: Any) -> bool:
    """Every type structured from a JSON or TOML array: lists, sequences and tuples."""
    return is_sequence(type_) or get_origin(type_) is tuple or type_ is tuple


def _arrays_only(type_: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    if is_mutable_sequence(type_):
        inner = list_structure_factory(type_, converter)
    elif is_sequence(type_):  # tuple[X, ...] and Sequence[X]
        inner = homogenous_tuple_structure_factory(type_, converter)
    else:  # tuple[X, Y]: cattrs checks the length
        def inner(value: Any, t: Any) -> Any:
            return converter._structure_tuple(value, t)

    def hook(value: Any, t: Any) -> Any:
        if type(value) not in (list, tuple):
            raise TypeError(f"expected an array, got {_kind(value)}")
        return inner(value, t)

    return hook


def _tables_only(type_: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """An attrs class is structured from a table (a JSON object) only: given a number it
    said "argument of type 'int' is not iterable", given a string "unknown error"."""
    inner = make_dict_structure_fn(type_, converter)

    def hook(value: Any, t: Any) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table (object), got {_kind(value)}")
        return inner(value, t)

    return hook


def make_strict_converter(*, forbid_extra_keys: bool = True) -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=forbid_extra_keys)
    for scalar in (int, float, str, bool):
        converter.register_structure_hook(scalar, _exact(scalar))
    converter.register_structure_hook_factory(_is_array, _arrays_only)
    converter.register_structure_hook_factory(attrs.has, _tables_only)
    return converter


def _format(exc: BaseException, type_: Any) -> str:
    if get_origin(type_) is Literal:
        allowed = ", ".join(repr(a) for a in get_args(type_))
        return f"must be one of {allowed}"
    if isinstance(exc, (TypeError, ValueError)) and str(exc) and not isinstance(exc, KeyError):
        text = str(exc)
        if not text.startswith(("unknown error", "invalid value")):
            return text
    return format_exception(exc, type_)


def structure_errors(exc: BaseException) -> list[str]:
    """Flatten a cattrs error into ``"message @ dotted.path"`` lines."""
    lines = cattrs.transform_error(exc, path="$", format_exception=_format)
    out = []
    for line in lines:
        message, _, path = line.rpartition(" @ ")
        path = path.removeprefix("$").lstrip(".") or "(top level)"
        out.append(f"{path}: {message}")
    return out


STRICT = make_strict_converter()
# Exact types, other keys ignored: for shapes other tools print (GitHub, Jira), which carry
# many more keys than a report needs and add new ones without notice.
LENIENT = make_strict_converter(forbid_extra_keys=False)
