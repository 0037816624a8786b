"""No ``getattr``/``hasattr`` probe for a named attribute remains in yeto_core.

An optional capability is a default method (or attribute) on its port, so the core
calls it directly; ``getattr(obj, "name", default)`` with ``name`` a member of a port
would hide a missing or misspelt capability behind the default. The core's internal
objects (the policy follower, the release store it follows, the sampler loop the drain
guard wraps, an error's ``reason``) declare what they are read for the same way, as a
protocol or a base class with defaults. This walks every core module for ``getattr``
and ``hasattr`` calls whose attribute is a literal: a port member, or any attribute at
all outside the short allow-list below.
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


#: The only literal probes the core keeps, by (module, attribute), with why: the open
#: flags that a platform's ``os`` module may lack (Windows has neither).
ALLOWED_PROBES = {
    ("stores/files.py", "O_NOFOLLOW"): "os.O_NOFOLLOW is POSIX-only; 0 adds no flag",
    ("stores/fsync.py", "O_DIRECTORY"): "os.O_DIRECTORY is POSIX-only; 0 adds no flag",
}


def _literal_probes(source: str) -> list[tuple[int, str]]:
    """Every ``getattr``/``hasattr`` whose attribute is a literal string."""
    return [
        (node.lineno, node.args[1].value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ]


def _core_literal_probes() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(CORE.rglob("*.py")):
        for line, name in _literal_probes(path.read_text()):
            found.setdefault((path.relative_to(CORE).as_posix(), name), []).append(line)
    return found


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


def test_literal_probes_are_found():
    assert _literal_probes('getattr(self.follower, "load_times", ())\n') == [(1, "load_times")]
    assert _literal_probes('x = hasattr(plugins, "release_codec")\n') == [(1, "release_codec")]
    assert _literal_probes('getattr(exc, "reason")\ngetattr(o, name, None)\n') == [(1, "reason")]
    assert _literal_probes("getattr(o, 3, None)\nsetattr(o, 'x', 1)\n") == []


def test_no_core_module_probes_an_attribute_by_name():
    found = [
        f"{module}:{line}: getattr/hasattr(..., {name!r})"
        for (module, name), lines in sorted(_core_literal_probes().items())
        if (module, name) not in ALLOWED_PROBES
        for line in lines
    ]
    assert not found, (
        "read the attribute directly, declared on the object's port, protocol or base class "
        "(with a default where it is optional):\n" + "\n".join(found)
    )


def test_the_allowed_probes_are_few_present_and_commented():
    assert len(ALLOWED_PROBES) <= 2
    found = _core_literal_probes()
    for (module, name), why in ALLOWED_PROBES.items():
        assert why
        lines = found.get((module, name))
        assert lines, f"{module} no longer probes {name!r}: drop it from ALLOWED_PROBES"
        assert len(lines) == 1, f"{module} probes {name!r} {len(lines)} times"
        source = (CORE / module).read_text().splitlines()
        at = lines[0] - 1
        assert "#" in source[at] or source[at - 1].lstrip().startswith("#"), (
            f"{module}:{lines[0]}: say in a comment why {name!r} is probed"
        )


def _getattr_with_default(source: str) -> list[int]:
    """Lines of every ``getattr(obj, name, default)``, whatever ``name`` is."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) == 3
    ]


def test_getattr_with_a_default_is_found_with_any_name():
    assert _getattr_with_default("getattr(o, name, None)\ngetattr(o, 'x', 0)\ngetattr(o, n)\n") == [
        1,
        2,
    ]


def test_at_most_two_getattr_with_a_default_remain_in_the_core():
    """A default hides a missing or misspelt attribute, computed names included: only the
    allowed ``os`` flag probes keep one."""
    found = {
        f"{path.relative_to(CORE).as_posix()}:{line}"
        for path in sorted(CORE.rglob("*.py"))
        for line in _getattr_with_default(path.read_text())
    }
    allowed = {module for module, _ in ALLOWED_PROBES}
    assert len(found) <= 2, "getattr(obj, name, default) in the core:\n" + "\n".join(sorted(found))
    assert {f.split(":")[0] for f in found} <= allowed, sorted(found)
