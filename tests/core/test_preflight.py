"""Preflight: core checks, plugin checks, and the messages that say what to do."""

from __future__ import annotations

import types
from pathlib import Path

import attrs

from yeto_core import hookimpl
from yeto_core.config.load import parse_config
from yeto_core.config.preflight import run_preflight
from yeto_core.testing.minimal import minimal_plugins

_plugins = minimal_plugins


def _config(tmp_path: Path, **edits):
    data = {
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(tmp_path / "base"), "base_options": {"task": "fake-task"}},
        "task": {"name": "fake-task"},
        "samplers": [{"engine": "fake-engine", "group_size": 4, "backlog_cap": 8}],
        "trainer": {"backend": "fake-backend", "groups_per_round": 2},
        "backstops": {"wall_clock_s": 60},
    }
    for path, value in edits.items():
        node = data
        *head, last = path.split("__")
        for k in head:
            node = node[k] if not isinstance(node, list) else node[int(k)]
        node[last] = value
    return parse_config(data, source="test.toml")


def _by_name(report):
    return {c.name: c for c in report.checks}


def test_a_consistent_config_passes(tmp_path: Path) -> None:
    report = run_preflight(_config(tmp_path), _plugins())
    assert report.passed, report.render()
    checks = _by_name(report)
    assert checks["store"].status == "ok"
    assert "writable" in checks["store"].detail
    assert list((tmp_path / "run" / "store").rglob("probe-*")) == []  # the probe is removed
    assert checks["model.path"].status == "warn"  # missing, but the backend builds it
    for name in (
        "samplers[0].provider",
        "trainer.provider",
        "trainer.lifecycle",
        "buffer.kind",
        "conversion.name",
    ):
        assert checks[name].status == "ok", name


def test_missing_plugins_say_what_to_install(tmp_path: Path) -> None:
    cfg = _config(tmp_path, samplers=[{"engine": "hf"}], trainer={"backend": "torch"})
    report = run_preflight(cfg, _plugins())
    checks = _by_name(report)
    assert not report.passed
    assert checks["samplers[0].engine"].detail == "Unknown sampler engine 'hf'. Install yeto-torch."
    assert (
        checks["trainer.backend"].detail == "Unknown trainer backend 'torch'. Install yeto-torch."
    )


def test_budget_zero_with_prices_fails(tmp_path: Path) -> None:
    cfg = _config(tmp_path, trainer={"backend": "fake-backend", "price_per_hour": 3.0})
    check = _by_name(run_preflight(cfg, _plugins()))["backstops.budget_usd"]
    assert check.status == "fail"
    assert "trainer" in check.detail and "set backstops.budget_usd" in check.detail


def test_batch_not_a_multiple_of_g_and_unfillable_rounds_fail(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        trainer={
            "backend": "fake-backend",
            "backend_options": {"batch_size": 6},
            "groups_per_round": 9,
        },
    )
    checks = _by_name(run_preflight(cfg, _plugins()))
    assert checks["trainer.backend_options.batch_size"].status == "fail"
    assert "multiple of G" in checks["trainer.backend_options.batch_size"].detail
    assert checks["trainer.groups_per_round"].status == "fail"
    assert "backlog_cap" in checks["trainer.groups_per_round"].detail


def test_unwritable_store_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = attrs.evolve(_config(tmp_path), store=str(blocker / "store"))
    check = _by_name(run_preflight(cfg, _plugins()))["store"]
    assert check.status == "fail"
    assert str(blocker) in check.detail


def test_plugin_preflight_hooks_add_checks_and_a_raising_one_fails(tmp_path: Path) -> None:
    seen = []

    def good(config, report):
        seen.append(config.task.name)
        report.warn("fake:gpu", "no GPU; sampling runs on CPU")

    def bad(config, report):
        raise RuntimeError("boom")

    pm = _plugins(
        types.SimpleNamespace(yeto_preflight=hookimpl(good)),
        types.SimpleNamespace(yeto_preflight=hookimpl(bad)),
    )
    report = run_preflight(_config(tmp_path), pm)
    checks = _by_name(report)
    assert seen == ["fake-task"]
    assert checks["fake:gpu"].status == "warn"
    assert checks["preflight:extra1"].status == "fail"
    assert "RuntimeError: boom" in checks["preflight:extra1"].detail
    assert "[FAIL] preflight:extra1" in report.render()


def test_s1_start_threshold_above_the_backlog_cap_fails(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        trainer={"backend": "fake-backend", "groups_per_round": 2, "max_policy_age": 5},
        scheduler={"name": "s1"},
    )
    check = _by_name(run_preflight(cfg, _plugins()))["samplers.backlog_cap"]
    assert check.status == "fail"
    assert "12 groups wait" in check.detail and "backlog of 8" in check.detail


def test_a_mistyped_model_path_is_a_preflight_error_not_a_toy_base(tmp_path: Path) -> None:
    """Regression: a missing model.path only warned, and the backend built a tiny base there."""
    cfg = _config(tmp_path, model={"path": str(tmp_path / "modle")})
    report = run_preflight(cfg, _plugins())
    check = _by_name(report)["model.path"]
    assert not report.passed and check.status == "fail"
    assert "modle" in check.detail and "typo" in check.detail


def test_a_directory_that_is_not_a_model_fails_in_preflight(tmp_path: Path) -> None:
    """Regression: a directory without a model failed after the warm-up with a traceback."""
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "README").write_text("hello")
    for options in ({}, {"task": "fake-task"}):
        cfg = _config(
            tmp_path, model={"path": str(tmp_path / "notamodel"), "base_options": options}
        )
        check = _by_name(run_preflight(cfg, _plugins()))["model.path"]
        assert check.status == "fail", (options, check)
        assert "no config.json" in check.detail


def test_an_existing_model_passes_and_the_build_is_asked_for_explicitly(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    ok = _by_name(run_preflight(_config(tmp_path, model={"path": str(tmp_path / "m")}), _plugins()))
    assert ok["model.path"].status == "ok"
    build = _config(tmp_path, model={"path": str(tmp_path / "new"), "base_options": {"task": "x"}})
    assert _by_name(run_preflight(build, _plugins()))["model.path"].status == "warn"
