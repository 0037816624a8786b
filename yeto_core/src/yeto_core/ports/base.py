"""The base of every port, and the helpers the ports share."""

from __future__ import annotations

import abc
import inspect
from collections.abc import Mapping
from typing import Any, ClassVar, Optional


class Port(abc.ABC):  # noqa: B024 (a marker base; the ports below are abstract)
    """Common base: every implementation has a ``PLUGIN_NAME``."""

    PORT: ClassVar[str] = ""
    PLUGIN_NAME: ClassVar[str] = ""

    @classmethod
    def implements(cls, method: str) -> bool:
        """Whether this class overrides the optional capability ``method`` of its port."""
        port = next((b for b in cls.__mro__ if b.__dict__.get("PORT")), None)
        if port is None or method not in dir(port):
            raise AttributeError(f"{method!r} is not a method of a yeto port ({cls.__name__})")
        mine = inspect.getattr_static(cls, method)
        base = inspect.getattr_static(port, method)
        return _func(mine) is not _func(base)


def _func(attr: Any) -> Any:
    return attr.__func__ if isinstance(attr, (classmethod, staticmethod)) else attr


def accepts(cls: type, name: str) -> bool:
    """Whether ``cls(...)`` takes a keyword argument ``name`` (or ``**kwargs``)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def names(cls: type, name: str) -> bool:
    """Whether ``cls(...)`` names a keyword argument ``name`` itself (``**kwargs`` does not
    count: an engine that takes ``**options`` to refuse unknown ones asks for nothing)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(name)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _with_model_and_seed(
    cls: type, options: Mapping[str, Any], model_dir: Optional[str], seed: int
) -> dict[str, Any]:
    out = dict(options)
    if model_dir is not None and "model_dir" not in out and accepts(cls, "model_dir"):
        out["model_dir"] = str(model_dir)
    if "seed" not in out and accepts(cls, "seed"):
        out["seed"] = seed
    return out
