"""No ``getattr`` capability probe on a port object remains in yeto_core.

An optional capability is a default method (or attribute) on its port, so the core
calls it directly; ``getattr(obj, "name", default)`` with ``name`` a member of a port
would hide a missing or misspelt capability behind the default. This walks every
core module for ``getattr`` calls whose attribute is a literal naming a port member.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import yeto_core
from yeto_core import ports

CORE = Path(yeto_core.__file__).resolve().parent


def _port_members() -> set[str]:
    names: set[str] = set()
    for obj in vars(ports).values():
        if inspect.isclass(obj) and issubclass(obj, ports.Port) and obj is not ports.Port:
            names |= {n for n in vars(obj) if not n.startswith("_")}
    return names - {"PORT", "PLUGIN_NAME"}


def _probes(source: str, members: set[str]) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in members
        ):
            out.append((node.lineno, node.args[1].value))
    return out


def test_the_port_members_are_found():
    members = _port_members()
    assert {"prompt_logprobs", "vocab_size", "append_many", "watch", "local_root"} <= members
    assert _probes('getattr(engine, "prompt_logprobs", None)\n', members) == [
        (1, "prompt_logprobs")
    ]


def test_no_core_module_probes_a_port_member_with_getattr():
    members = _port_members()
    found = [
        f"{path.relative_to(CORE)}:{line}: getattr(..., {name!r})"
        for path in sorted(CORE.rglob("*.py"))
        for line, name in _probes(path.read_text(), members)
    ]
    assert not found, "call the port's (default) member directly:\n" + "\n".join(found)
