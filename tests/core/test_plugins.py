"""The plugin manager: built-ins, inline plugins, errors that say what to do."""

from __future__ import annotations

import json
import re
import types

import pytest
from click.testing import CliRunner

from yeto_core import hookimpl
from yeto_core.errors import DuplicatePluginError, UnknownPluginError
from yeto_core.plugins import Plugins
from yeto_core.ports import ObjectStore, TrainerScheduler


def _store_class(name: str, scheme: str):
    class _S(ObjectStore):
        PLUGIN_NAME = name
        URL_SCHEMES = (scheme,)

        @classmethod
        def from_url(cls, url, **options):
            inst = cls()
            inst.opened = url
            return inst

        def get(self, key):
            return b""

        def put(self, key, data):
            pass

        def put_if_absent(self, key, data):
            return True

        def exists(self, key):
            return False

        def list(self, prefix="", after=None):
            return iter(())

        def delete(self, key):
            pass

    _S.__qualname__ = f"Store_{name.replace('-', '_')}"
    return _S


def _plugin(**hooks):
    mod = types.SimpleNamespace()
    for name, fn in hooks.items():
        setattr(mod, name, hookimpl(fn))
    return mod


def test_core_builtins_registered_without_entry_points():
    pm = Plugins(entry_points=False)
    assert "dir" in pm.names("ObjectStore")
    [core] = [i for i in pm.infos() if i.name == "core"]
    assert core.error is None
    assert "dir" in core.provides["ObjectStore"]


def test_missing_known_plugin_says_install():
    pm = Plugins(entry_points=False)
    with pytest.raises(UnknownPluginError, match=r"Unknown object store 's3'\. Install yeto-s3\."):
        pm.object_store("s3")
    with pytest.raises(UnknownPluginError, match="Install yeto-s3"):
        pm.open_store("s3://bucket/run")
    with pytest.raises(UnknownPluginError, match="Install yeto-sglang"):
        pm.sampler_engine("sglang")


def test_an_installed_distribution_that_does_not_implement_a_name_says_planned():
    """engine = "sglang" with the empty yeto-sglang installed: not implemented yet."""
    import types

    pm = Plugins(entry_points=False)
    pm.add(types.SimpleNamespace(), "sglang", distribution="yeto-sglang", version="0.1.0")
    with pytest.raises(UnknownPluginError) as err:
        pm.sampler_engine("sglang")
    assert "not implemented yet" in str(err.value) and "planned" in str(err.value)
    assert "Install yeto-sglang" not in str(err.value)
    (info,) = [i for i in pm.infos() if i.name == "sglang"]
    assert info.provides == {} and info.planned == {"SamplerEngine": ["sglang"]}


def test_unknown_name_lists_installed():
    pm = Plugins(entry_points=False)
    with pytest.raises(UnknownPluginError, match="Installed: dir"):
        pm.object_store("nosuch")


def test_inline_plugin_registers_and_resolves_by_url():
    pm = Plugins(entry_points=False)
    cls = _store_class("mem", "mem")
    pm.add(_plugin(yeto_register_object_stores=lambda register: register(cls)), "inline")
    assert pm.object_store("mem") is cls
    store = pm.open_store("mem://x")
    assert isinstance(store, cls) and store.opened == "mem://x"
    [info] = [i for i in pm.infos() if i.name == "inline"]
    assert info.provides == {"ObjectStore": ["mem"]}


def test_duplicate_name_is_an_error_naming_both_classes():
    pm = Plugins(entry_points=False)
    a, b = _store_class("twin", "twin-a"), _store_class("twin", "twin-b")
    a.__qualname__, b.__qualname__ = "FirstTwin", "SecondTwin"
    pm.add(_plugin(yeto_register_object_stores=lambda register: register(a)), "one")
    pm.add(_plugin(yeto_register_object_stores=lambda register: register(b)), "two")
    with pytest.raises(DuplicatePluginError) as exc:
        pm.object_store("twin")
    msg = str(exc.value)
    assert "FirstTwin" in msg and "SecondTwin" in msg and "'one'" in msg and "'two'" in msg
    errors = {i.name: i.error for i in pm.infos()}
    assert "registered twice" in errors["one"] and "registered twice" in errors["two"]
    assert "dir" in pm.names("ObjectStore")  # the rest still works


def test_registration_hook_that_raises_marks_only_that_plugin():
    def boom(register):
        raise RuntimeError("kaput")

    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_register_object_stores=boom), "broken")
    errors = {i.name: i.error for i in pm.infos()}
    assert "RuntimeError: kaput" in errors["broken"]
    assert errors["core"] is None
    assert pm.names("ObjectStore") == ["dir"]


def test_registering_a_non_port_class_is_refused():
    class NotAStore:
        PLUGIN_NAME = "x"

    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_register_object_stores=lambda register: register(NotAStore)), "bad")
    [info] = [i for i in pm.infos() if i.name == "bad"]
    assert "does not subclass yeto_core.ports.ObjectStore" in info.error


def test_wrong_port_registration_is_refused():
    class S(TrainerScheduler):
        PLUGIN_NAME = "s"

        def decide(self, inputs):
            return None

    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_register_object_stores=lambda register: register(S)), "confused")
    [info] = [i for i in pm.infos() if i.name == "confused"]
    assert info.error and "ObjectStore" in info.error


def test_event_observer_and_cli_hook_errors_are_isolated(capsys):
    seen = []

    def good(event):
        seen.append(event)

    def bad(event):
        raise ValueError("observer broke")

    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_event=bad), "bad-observer")
    pm.add(_plugin(yeto_event=good), "good-observer")
    pm.emit("e1")
    assert seen == ["e1"]
    assert "observer broke" in capsys.readouterr().err


class _Report:
    def __init__(self):
        self.lines = []

    def ok(self, name, detail=""):
        self.lines.append(("ok", name, detail))

    def warn(self, name, detail=""):
        self.lines.append(("warn", name, detail))

    def fail(self, name, detail=""):
        self.lines.append(("fail", name, detail))


def test_preflight_hook_collects_checks_and_isolates_errors():
    def check(config, report):
        report.ok("store", f"reachable {config['url']}")

    def crash(config, report):
        raise OSError("disk gone")

    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_preflight=check), "checker")
    pm.add(_plugin(yeto_preflight=crash), "crasher")
    report = _Report()
    pm.preflight({"url": "/tmp/x"}, report)
    assert ("ok", "store", "reachable /tmp/x") in report.lines
    assert any(k == "fail" and "disk gone" in d for k, _n, d in report.lines)


def test_cli_hook_adds_a_command(monkeypatch):
    import click

    from yeto_core import plugins as plugins_mod
    from yeto_core.cli import cli

    @click.command(name="hello-plugin")
    def hello():
        click.echo("hello from a plugin")

    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_cli=lambda group: group.add_command(hello)), "greeter")
    monkeypatch.setattr(plugins_mod, "get_plugins", lambda: pm)
    cli._plugins_added = False
    try:
        result = CliRunner().invoke(cli, ["hello-plugin"])
    finally:
        cli.commands.pop("hello-plugin", None)
        cli._plugins_added = False
    assert result.exit_code == 0, result.output
    assert "hello from a plugin" in result.output


def test_yeto_plugins_json_shape(monkeypatch):
    from yeto_core import plugins as plugins_mod
    from yeto_core.cli import cli

    pm = Plugins(entry_points=False)
    monkeypatch.setattr(plugins_mod, "get_plugins", lambda: pm)
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [d["name"] for d in data] == ["core"]
    assert set(data[0]) == {
        "name",
        "distribution",
        "version",
        "provides",
        "error",
        "planned",
        "disabled",
    }
    assert data[0]["distribution"] == "yeto-core"
    table = CliRunner().invoke(cli, ["plugins"])
    assert table.exit_code == 0 and "core" in table.output


def test_version_lists_plugins(monkeypatch):
    from yeto_core import plugins as plugins_mod
    from yeto_core.cli import cli

    pm = Plugins(entry_points=False)
    monkeypatch.setattr(plugins_mod, "get_plugins", lambda: pm)
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("yeto ") and "core (yeto-core" in result.output


# -- registration refuses what cannot work (issue 44, item 4) ---------------------------


def _abstract_store():
    """A store that forgot ``from_url`` and ``delete``: abstract, cannot be instantiated."""

    class HalfStore(ObjectStore):
        PLUGIN_NAME = "half"
        URL_SCHEMES = ("half",)

        def get(self, key):
            return b""

        def put(self, key, data):
            pass

        def put_if_absent(self, key, data):
            return True

        def exists(self, key):
            return False

        def list(self, prefix="", after=None):
            return iter(())

    return HalfStore


def test_an_abstract_class_is_refused_naming_the_port_and_the_missing_methods():
    """Regression: an abstract store registered, `yeto plugins` listed it, and
    open_store("half://demo") returned None (the abstract from_url's body)."""
    half = _abstract_store()
    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_register_object_stores=lambda register: register(half)), "halfway")
    errors = {i.name: i.error for i in pm.infos()}
    assert errors["core"] is None
    err = errors["halfway"]
    assert "ObjectStore" in err and "delete, from_url" in err and "HalfStore" in err
    [info] = [i for i in pm.infos() if i.name == "halfway"]
    assert info.provides == {}
    assert pm.names("ObjectStore") == ["dir"]  # it registers nothing; the rest works
    # selecting it raises an error that quotes the load error, never returns None
    with pytest.raises(UnknownPluginError, match="halfway.*does not implement delete, from_url"):
        pm.open_store("half://demo")
    with pytest.raises(UnknownPluginError, match="failed to load.*from_url"):
        pm.object_store("half")
    assert pm.open_store(".").PLUGIN_NAME == "dir"


def test_an_abstract_class_refuses_the_whole_plugin_like_any_broken_one():
    """The plugin's good registrations go too (a plugin loads whole or not at all)."""
    good, half = _store_class("good", "good"), _abstract_store()

    def register_both(register):
        register(good)
        register(half)

    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_register_object_stores=register_both), "mixed")
    assert "good" not in pm.names("ObjectStore")
    with pytest.raises(UnknownPluginError, match="plugin 'mixed' failed to load"):
        pm.object_store("good")


def test_yeto_plugins_shows_the_refusal(monkeypatch):
    from yeto_core import plugins as plugins_mod
    from yeto_core.cli import cli

    half = _abstract_store()
    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_register_object_stores=lambda register: register(half)), "halfway")
    monkeypatch.setattr(plugins_mod, "get_plugins", lambda: pm)
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    [info] = [d for d in json.loads(result.output) if d["name"] == "halfway"]
    assert info["provides"] == {} and "does not implement delete, from_url" in info["error"]


def test_open_store_refuses_a_from_url_that_returns_no_store():
    """A concrete store whose from_url forgot its `return`: a clear error, not None."""
    from yeto_core.errors import PluginError

    cls = _store_class("forgetful", "forgetful")
    cls.from_url = classmethod(lambda cls, url, **options: None)
    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_register_object_stores=lambda register: register(cls)), "forgetful")
    with pytest.raises(PluginError, match=r"from_url\('forgetful://x'\) returned NoneType"):
        pm.open_store("forgetful://x")


# -- YETO_DISABLE_PLUGINS and the preflight hook (issue 44, item 5) ----------------------


def test_a_disabled_plugin_shows_as_disabled_not_planned(monkeypatch):
    """Regression: a plugin named in YETO_DISABLE_PLUGINS was listed with its
    implementations "planned"."""
    from importlib import metadata

    from yeto_core import plugins as plugins_mod
    from yeto_core.cli import cli

    if not any(ep.name == "s3" for ep in metadata.entry_points(group="yeto")):
        pytest.skip("needs yeto-s3 installed (make install)")
    monkeypatch.setenv("YETO_DISABLE_PLUGINS", "s3")
    pm = Plugins()
    [info] = [i for i in pm.infos() if i.name == "s3"]
    assert info.disabled and info.planned == {} and info.provides == {}
    with pytest.raises(UnknownPluginError, match="yeto-s3 is installed but disabled"):
        pm.object_store("s3")
    monkeypatch.setattr(plugins_mod, "get_plugins", lambda: pm)
    data = json.loads(CliRunner().invoke(cli, ["plugins", "--json"]).output)
    [row] = [d for d in data if d["name"] == "s3"]
    assert row["disabled"] is True and row["planned"] == {}
    table = CliRunner().invoke(cli, ["plugins"], terminal_width=200, env={"COLUMNS": "200"})
    [line] = [ln for ln in table.output.splitlines() if ln.startswith("│ s3 ")]
    assert "disabled" in line and "planned" not in line
    version = CliRunner().invoke(cli, ["--version"]).output
    assert re.search(r"^  s3 \(yeto-s3 [^)]*\)  \[disabled\]$", version, re.M), version


def test_preflight_hook_gets_offline_and_old_hooks_without_it_still_run():
    seen = []

    def new_style(config, report, offline):
        seen.append(("new", offline))

    def old_style(config, report):
        seen.append(("old", None))

    pm = Plugins(entry_points=False)
    pm.add(_plugin(yeto_preflight=new_style), "new")
    pm.add(_plugin(yeto_preflight=old_style), "old")
    assert all(i.error is None for i in pm.infos())
    pm.preflight({}, _Report(), offline=True)
    pm.preflight({}, _Report())
    assert sorted(seen) == [("new", False), ("new", True), ("old", None), ("old", None)]
