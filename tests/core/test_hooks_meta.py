"""Every hook has a docs entry and a test (walks the real hook table)."""

from __future__ import annotations

import abc
import inspect
import pathlib

import pytest

from yeto_core import hookspecs, ports
from yeto_core.plugins import REGISTRATION_HOOKS, Plugins

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOOKS = sorted(n for n in dir(Plugins(entry_points=False).pm.hook) if n.startswith("yeto_"))


def test_hook_table_is_what_hookspecs_declares():
    declared = sorted(n for n, _ in inspect.getmembers(hookspecs) if n.startswith("yeto_"))
    assert HOOKS == declared
    assert set(REGISTRATION_HOOKS.values()) <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_docstring_with_params_and_returns(hook):
    doc = getattr(hookspecs, hook).__doc__ or ""
    assert doc.strip(), f"{hook} has no docstring"
    assert ":param" in doc and ":returns:" in doc, f"{hook} docstring lacks :param:/:returns:"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_docs_entry(hook):
    guide = (ROOT / "docs" / "plugins.md").read_text()
    assert f"### `{hook}`" in guide, f"docs/plugins.md has no '### `{hook}`' section"


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook):
    this = pathlib.Path(__file__).resolve()
    for path in (ROOT / "tests").rglob("test_*.py"):
        if path.resolve() != this and hook in path.read_text():
            return
    pytest.fail(f"no test under tests/ mentions {hook}")


@pytest.mark.parametrize("port", ports.PORTS)
def test_every_port_is_abstract_and_documented(port):
    assert isinstance(port, abc.ABCMeta) and inspect.isabstract(port)
    assert port.PORT and "PLUGIN_NAME" in (port.__doc__ or "")
    assert "Complete plugin" in (port.__doc__ or "")
    assert "@hookimpl" in (port.__doc__ or "")


def port_example(port) -> str:
    """The code block of ``port``'s docstring example (after ``Complete plugin ...::``)."""
    doc = inspect.getdoc(port) or ""
    block = doc.split("Complete plugin", 1)[1].split("::\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines)


@pytest.mark.parametrize("port", ports.PORTS)
def test_every_port_example_is_a_plugin_that_registers(port):
    """The example runs as a module, and its hookimpl registers a class of that port."""
    import types

    module = types.ModuleType(f"example_{port.__name__}")
    exec(compile(port_example(port), f"<{port.__name__} example>", "exec"), module.__dict__)
    pm = Plugins(entry_points=False)
    pm.add(module, f"example-{port.__name__.lower()}")
    info = [i for i in pm.infos() if i.name == f"example-{port.__name__.lower()}"][0]
    assert info.error is None, info.error
    assert list(info.provides) == [port.PORT]
    (name,) = info.provides[port.PORT]
    assert issubclass(pm.resolve(port.PORT, name), port)
