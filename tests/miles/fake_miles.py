"""A stand-in ``miles`` package built from a recorded description of Miles' interfaces.

Nothing here is Miles' code: ``Sample`` is a dataclass made from the fields and
types the description lists (``miles_interface.json``, recorded from Miles'
source at the pinned commit), its ``validate`` checks the length facts the
description's commit enforces, and the rollout records and the default log
function have the recorded fields and parameters. ``install`` puts the modules
into ``sys.modules`` so yeto's adapter and its doctor import them as Miles.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import types
from pathlib import Path
from typing import Any, Optional

from yeto_miles.doctor import recorded

MODULES = (
    "miles",
    "miles.utils",
    "miles.utils.types",
    "miles.utils.arguments",
    "miles.rollout",
    "miles.rollout.base_types",
    "miles.ray",
    "miles.ray.rollout",
    "miles.ray.rollout.metrics",
)


def _default(type_text: str, status: Any) -> Any:
    if type_text == "Status":
        return dataclasses.field(default=status.PENDING)
    head = type_text.split("[", 1)[0].split(" ", 1)[0]
    if " | None" in type_text or "None" == type_text:
        return dataclasses.field(default=None)
    factory = {"list": list, "dict": dict}.get(head)
    if factory is not None:
        return dataclasses.field(default_factory=factory)
    plain = {"int": 0, "float": 0.0, "bool": False, "str": ""}
    if head in plain:
        return dataclasses.field(default=plain[head])
    return dataclasses.field(default=None)


def _validate(self: Any) -> None:
    n = self.response_length
    assert n >= 0 and len(self.tokens) >= n, "tokens shorter than response_length"
    for name in ("loss_mask", "rollout_log_probs"):
        value = getattr(self, name)
        assert value is None or len(value) == n, f"{name} length {len(value)} != {n}"
    re = self.rollout_routed_experts
    assert re is None or len(re) == len(self.tokens) - 1, "routed experts length != tokens - 1"


def make_sample_class(description: dict[str, Any]) -> type:
    desc = description["sample"]
    status = enum.Enum("Status", {v.upper(): v for v in desc["status"]})
    fields = [(name, tp, _default(tp, status)) for name, tp in desc["fields"].items()]
    cls = dataclasses.make_dataclass("Sample", fields)
    cls.Status = status
    if "validate" in desc["methods"]:
        cls.validate = _validate
    if "to_dict" in desc["methods"]:
        cls.to_dict = lambda self: dict(self.__dict__, status=self.status.value)
    if "from_dict" in desc["methods"]:
        cls.from_dict = staticmethod(lambda d: cls(**dict(d, status=status(d["status"]))))
    return cls


def build(description: Optional[dict[str, Any]] = None, log_path: Optional[Path] = None):
    """The fake modules (name -> module); the default log function appends to ``log_path``."""
    description = description or recorded()
    mods = {name: types.ModuleType(name) for name in MODULES}
    mods["miles.utils.types"].Sample = make_sample_class(description)
    base = mods["miles.rollout.base_types"]
    for name, fields in description["classes"].items():
        setattr(base, name, dataclasses.make_dataclass(name, [(f, Any, None) for f in fields]))

    def call_rollout_fn(fn, *args, evaluation, **kwargs):
        return fn(*args, **kwargs, evaluation=evaluation)

    base.call_rollout_fn = call_rollout_fn
    params = description["functions"]["miles.ray.rollout.metrics.log_rollout_data"]
    ns: dict[str, Any] = {"_record": lambda *a: _record(log_path, *a)}
    exec(f"def log_rollout_data({', '.join(params)}):\n    _record({', '.join(params)})\n", ns)
    mods["miles.ray.rollout.metrics"].log_rollout_data = ns["log_rollout_data"]
    flags = list(description["flags"])

    def get_miles_extra_args_provider(add_custom_arguments=None):
        def add(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
            for flag in flags:
                parser.add_argument(flag)
            return parser

        return add

    mods["miles.utils.arguments"].get_miles_extra_args_provider = get_miles_extra_args_provider
    return mods


def _record(path: Optional[Path], rollout_id, args, samples, extra, rollout_time) -> None:
    if path is None:
        return
    line = {
        "rollout_id": rollout_id,
        "n": len(samples),
        "padding": sum(1 for s in samples if (s.metadata or {}).get("yeto_padding")),
        "extra": extra,
        "custom_path": getattr(args, "custom_rollout_log_function_path", None),
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def install(description: Optional[dict[str, Any]] = None, log_path: Optional[Path] = None):
    mods = build(description, log_path)
    sys.modules.update(mods)
    return mods


def uninstall() -> None:
    for name in MODULES:
        sys.modules.pop(name, None)
