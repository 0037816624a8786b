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


#: Names the core gives port objects (``engine``, ``self.buffer``, ``self._store``, ...).
PORT_OBJECTS = {"engine", "backend", "buffer", "store", "provider", "lifecycle", "conversion"}


def _name_of(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr.lstrip("_")
    return node.id.lstrip("_") if isinstance(node, ast.Name) else ""


def _probes(source: str, members: set[str]) -> list[tuple[int, str]]:
    """``getattr``/``hasattr`` with a literal attribute that is a port member, or any
    literal attribute of an object named like a port (a capability the port lacks)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and (node.args[1].value in members or _name_of(node.args[0]) in PORT_OBJECTS)
        ):
            out.append((node.lineno, node.args[1].value))
    return out


def test_the_port_members_are_found():
    members = _port_members()
    assert {"prompt_logprobs", "vocab_size", "append_many", "watch", "local_root"} <= members
    assert _probes('getattr(engine, "prompt_logprobs", None)\n', members) == [
        (1, "prompt_logprobs")
    ]
    assert _probes('hasattr(self.engine, "restore_base")\n', members) == [(1, "restore_base")]
    assert _probes('getattr(self._buffer, name)\ngetattr(os, "O_DIRECTORY", 0)\n', members) == []


def test_no_core_module_probes_a_port_member_with_getattr():
    members = _port_members()
    found = [
        f"{path.relative_to(CORE)}:{line}: getattr(..., {name!r})"
        for path in sorted(CORE.rglob("*.py"))
        for line, name in _probes(path.read_text(), members)
    ]
    assert not found, "call the port's (default) member directly:\n" + "\n".join(found)
