"""The one cattrs converter every yeto record goes through.

Unknown keys are refused, and a structuring error names the path of every bad
value (``$.trainer.batch``) so a user can find it in their TOML or JSON.
"""

from __future__ import annotations

import enum
import json
from functools import lru_cache
from typing import Any, TypeVar

import cattrs
from cattrs.gen import make_dict_unstructure_fn, override

from yeto_core.errors import ConfigError
from yeto_core.records import SamplingParams

T = TypeVar("T")


def make_converter() -> cattrs.Converter:
    """Build a converter that refuses unknown keys and validates in detail."""
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    # Tuples come back from JSON as lists; attrs records use tuples to stay hashable.
    conv.register_unstructure_hook(tuple, lambda t: [conv.unstructure(x) for x in t])
    # The engine's filter order is written only when it is not the default, so a run
    # config (whose samplers never set it) reads in a yeto that predates the field.
    conv.register_unstructure_hook(
        SamplingParams,
        make_dict_unstructure_fn(SamplingParams, conv, filter_order=override(omit_if_default=True)),
    )

    def _enum_structure(value: Any, cls: type[enum.Enum]) -> enum.Enum:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"{value!r} is not one of {allowed}") from None

    conv.register_structure_hook_func(
        lambda t: isinstance(t, type) and issubclass(t, enum.Enum), _enum_structure
    )
    # Scalars exactly as written: cattrs would turn ``true`` into 1.0, ``1.5`` into 1
    # and ``"3"`` into 3, so a typo in a TOML file would pass as another value.
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(bool, _strict_bool)
    return conv


def _strict_int(value: Any, _: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


def _strict_float(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


def _strict_str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _strict_bool(value: Any, _: type) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{value!r} is not true or false")
    return value


@lru_cache(maxsize=1)
def converter() -> cattrs.Converter:
    """The shared converter (built once)."""
    return make_converter()


def structure(data: Any, cls: type[T], *, what: str = "record", root: str = "$") -> T:
    """Structure ``data`` into ``cls``; raise :class:`ConfigError` naming every bad path.

    :param data: plain data (dicts, lists, scalars) from JSON or TOML.
    :param cls: the attrs class to build.
    :param what: a word for the error message ("config", "cut manifest", ...).
    :param root: the path prefix shown in errors (a TOML table name, a file).
    """
    try:
        return converter().structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, cattrs.BaseValidationError):
            lines = cattrs.transform_error(exc, path=root)
        else:
            lines = [f"{exc} @ {root}"]
        raise ConfigError(f"invalid {what}:\n  " + "\n  ".join(lines)) from None


def unstructure(obj: Any) -> Any:
    """Turn a record into plain JSON-able data."""
    return converter().unstructure(obj)


def dumps(obj: Any) -> str:
    """A record as one line of compact, key-sorted JSON."""
    return json.dumps(unstructure(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def loads(text: str | bytes, cls: type[T], *, what: str = "record", root: str = "$") -> T:
    """Parse JSON text into ``cls`` (see :func:`structure`)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid {what}: not JSON ({exc}) @ {root}") from None
    return structure(data, cls, what=what, root=root)
