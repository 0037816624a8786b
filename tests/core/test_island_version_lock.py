"""An island refuses to start when its installed yeto differs from the run's (YETO_VERSIONS)."""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest

from yeto_core.errors import ConfigError
from yeto_core.islands.main import main
from yeto_core.providers.dists import (
    Shipped,
    check_version_lock,
    lock_env,
    run_distributions,
)

CORE = md.version("yeto-core")
ISLAND = {
    "YETO_STORE": "memory://lock-test",
    "YETO_ROLE": "sampler",
    "YETO_ISLAND": "sampler-0",
    "YETO_INCARNATION": "0",
}


def test_no_lock_for_a_local_island():
    assert check_version_lock({}) == {}


def test_the_same_versions_pass():
    want = {"yeto-core": CORE}
    assert check_version_lock({"YETO_VERSIONS": json.dumps(want)}, "sampler-0") == want


def test_other_or_missing_versions_are_refused_naming_both():
    lock = json.dumps({"yeto-core": "9.9.9", "yeto-nothing": "1.0"})
    with pytest.raises(ConfigError) as exc:
        check_version_lock({"YETO_VERSIONS": lock}, "sampler-0")
    msg = str(exc.value)
    assert msg.startswith("island sampler-0 refuses to start")
    assert f"yeto-core {CORE} here, 9.9.9 in the run" in msg
    assert "yeto-nothing not installed here, 1.0 in the run" in msg
    with pytest.raises(ConfigError, match="not a JSON object"):
        check_version_lock({"YETO_VERSIONS": "[1"})


def test_the_island_entry_checks_the_lock_before_anything_else(monkeypatch, capsys):
    for k, v in {**ISLAND, "YETO_VERSIONS": json.dumps({"yeto-core": "9.9.9"})}.items():
        monkeypatch.setenv(k, v)
    assert main() == 2
    assert f"yeto-core {CORE} here, 9.9.9 in the run" in capsys.readouterr().err


def test_the_runs_distributions_come_from_the_source_trees_it_imports():
    shipped = run_distributions(["yeto_core", "yeto_core.records"])
    assert [s.dist for s in shipped] == ["yeto-core"]
    (core,) = shipped
    assert core.how == "build" and core.version == CORE
    assert core.wheel == f"yeto_core-{CORE}-py3-none-any.whl"
    assert json.loads(lock_env(shipped)) == {"yeto-core": CORE}
    with pytest.raises(ConfigError, match="comes from no installed distribution"):
        run_distributions(["no_such_module_here"])
    assert Shipped("yeto-x", "1", "index").requirement == "yeto-x==1"
