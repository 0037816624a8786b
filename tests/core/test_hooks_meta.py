"""Every hook has a docs entry and a test (walks the real hook table)."""

from __future__ import annotations

import abc
import inspect
import pathlib

import pytest

from yeto_core import hookspecs, ports
from yeto_core.plugins import REGISTRATION_HOOKS, Plugins
from yeto_core.testing.examples import load_example

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


@pytest.mark.parametrize("port", ports.PORTS)
def test_every_port_example_is_a_plugin_that_registers(port):
    """The example runs as a module, and its hookimpl registers a class of that port."""
    module = load_example(port)
    pm = Plugins(entry_points=False)
    pm.add(module, f"example-{port.__name__.lower()}")
    info = [i for i in pm.infos() if i.name == f"example-{port.__name__.lower()}"][0]
    assert info.error is None, info.error
    assert list(info.provides) == [port.PORT]
    (name,) = info.provides[port.PORT]
    assert issubclass(pm.resolve(port.PORT, name), port)


@pytest.mark.parametrize("port", ports.PORTS)
def test_every_port_has_a_contract_run_by_its_builtins_and_its_example(port):
    """yeto_core.testing.contracts has a suite per port; test_port_contracts runs it on the
    port's docstring example (TestExample<Port>) and on each built-in it names."""
    from yeto_core.testing.contracts import CONTRACTS

    contract = CONTRACTS[port]
    runner = (ROOT / "tests" / "core" / "test_port_contracts.py").read_text()
    assert f"class TestExample{port.__name__}({contract.__name__})" in runner
    builtins = {reg.cls for reg in Plugins(entry_points=False)._registry[port.PORT].values()}
    for cls in builtins:
        assert f"({contract.__name__})" in runner and cls.__name__ in runner, cls
