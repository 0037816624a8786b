"""``yeto run scale RUN --samplers GROUP=N`` on the fake run (issue 52 item 8).

A real head process (fake sampler islands, the real trainer island with the fake
backend, the ``local`` provider, a ``dir`` store) is scaled from another process
through the CLI, as a user would; ``tests/integration/test_quickstart_scale.py``
scales the real quickstart.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner

from tests.core.test_run_head import (
    _config,
    _journal,
    _no_islands_left,
    _start_head,
    _status,
    _wait,
)
from yeto_core.cli import cli
from yeto_core.head.scale import ScaleRefused, check_scale, parse_samplers
from yeto_core.testing.streams import stream_events, stream_text


def _head_events(config) -> list[dict]:
    return stream_events(Path(config.run_dir) / "store", "head")


def _appended(config, island: str) -> int:
    return stream_text(Path(config.run_dir) / "store", island).count('"kind":"group_appended"')


def _scale(config, *args: str):
    return CliRunner().invoke(
        cli, ["run", "scale", config.run_dir, *args, "--timeout", "240", "--json"]
    )


def _running_samplers(config) -> set[str]:
    return set((_status(config).get("samplers") or {}).keys())


def test_parse_and_rules_name_what_is_wrong(tmp_path: Path) -> None:
    assert parse_samplers(["sampler=4", "other=1"]) == {"sampler": 4, "other": 1}
    for bad in (["sampler"], ["sampler=x"], ["=3"], ["a=1", "a=2"]):
        with pytest.raises(ValueError, match="--samplers"):
            parse_samplers(bad)
    config = _config(tmp_path)
    with pytest.raises(ScaleRefused, match="'trainer' is the trainer, not a sampler group"):
        check_scale(config, {"trainer": 2})
    with pytest.raises(ScaleRefused, match="no sampler group 'samplers'; its groups are: sampler"):
        check_scale(config, {"samplers": 2})
    with pytest.raises(ScaleRefused, match="between 1 and 100000"):
        check_scale(config, {"sampler": 0})
    conv = attrs.evolve(
        config, samplers=[attrs.evolve(config.samplers[0], node_class="convertible")]
    )
    with pytest.raises(ScaleRefused, match="convertible"):
        check_scale(conv, {"sampler": 3})
    check_scale(config, {"sampler": 4})


def test_scale_a_running_run_up_and_down_and_a_resumed_head_keeps_the_count(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, total_rounds=0)
    head = _start_head(config, tmp_path)
    try:
        _wait(lambda: (_status(config).get("trained_rounds") or 0) >= 2, "two trained rounds", 240)
        assert _running_samplers(config) == {"sampler-0", "sampler-1"}

        res = _scale(config, "--samplers", "sampler=4")
        assert res.exit_code == 0, res.output
        answer = json.loads(res.output)
        assert answer["ok"] and answer["samplers"] == {"sampler": 4}
        assert answer["launched"] == ["sampler-2", "sampler-3"] and answer["released"] == []
        _wait(lambda: _appended(config, "sampler-3") >= 3, "the new islands append groups", 240)
        _wait(lambda: len(_running_samplers(config)) == 4, "four samplers in the status", 240)

        res = _scale(config, "--samplers", "sampler=2")
        assert res.exit_code == 0, res.output
        answer = json.loads(res.output)
        assert answer["released"] == ["sampler-2", "sampler-3"] and answer["launched"] == []
        _wait(lambda: _running_samplers(config) == {"sampler-0", "sampler-1"}, "two samplers", 240)
        # the islands read the config in the store; the run dir's copy says the same
        stored = json.loads((Path(config.run_dir) / "store" / "run" / "config.json").read_text())
        assert stored["samplers"][0]["count"] == 2

        # refusals: the trainer (exit 2, from the CLI's own check) and the budget (the
        # head's cost guard: 5000 more islands at $36/h pass a $100 budget at once)
        res = _scale(config, "--samplers", "trainer=2")
        assert res.exit_code == 2 and "is the trainer, not a sampler group" in res.output
        res = _scale(config, "--samplers", "sampler=5000")
        assert res.exit_code == 1, res.output
        assert "beyond the budget" in res.output and "budget_usd $100" in res.output
        assert _running_samplers(config) == {"sampler-0", "sampler-1"}

        res = _scale(config, "--samplers", "sampler=3")
        assert res.exit_code == 0, res.output
        _wait(lambda: _appended(config, "sampler-2") >= 1, "sampler-2 back", 240)
        head.send_signal(signal.SIGKILL)  # the head dies: the scale must survive it
        head.communicate(timeout=60)
    finally:
        if head.poll() is None:
            head.kill()
    scales = [(r["group"], r["count"]) for r in _journal(config) if r["kind"] == "scale"]
    assert scales == [("sampler", 4), ("sampler", 2), ("sampler", 3)]

    # a new head from the original config (count = 2; a finite total_rounds now, so that
    # it finishes and every group can be accounted for) keeps the journaled count of 3
    trained = _status(config).get("trained_rounds") or 0
    finite = attrs.evolve(config, trainer=attrs.evolve(config.trainer, total_rounds=trained + 10))
    assert finite.samplers[0].count == 2
    second = _start_head(finite, tmp_path)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out[-3000:]
    events = _head_events(config)
    resumed = [e for e in events if e["kind"] == "sampler_scale_resumed"]
    assert resumed and resumed[-1]["data"]["samplers"] == {"sampler": 3}
    last_up = max(i for i, e in enumerate(events) if e["kind"] == "run_up")
    launched = {e["data"]["island"] for e in events[last_up:] if e["kind"] == "sampler_launch"}
    assert launched == {"sampler-0", "sampler-1", "sampler-2"}
    stored = json.loads((Path(config.run_dir) / "config.json").read_text())
    assert stored["samplers"][0]["count"] == 3
    s = json.loads((Path(config.run_dir) / "summary.json").read_text())
    assert s["groups_untrained"] == 0, s
    assert s["groups_trained"] + sum(s["groups_skipped"].values()) == s["groups_appended"]
    _no_islands_left(config)
    res = CliRunner().invoke(cli, ["ledger", "check", config.run_dir])
    assert res.exit_code == 0, res.output
    # no head runs now: nothing to scale
    res = _scale(config, "--samplers", "sampler=4")
    assert res.exit_code == 1 and "no head runs" in res.output


def test_the_exit_codes_of_run_scale_are_in_run_config_md_and_the_help() -> None:
    import re

    from tests.core.test_exit_codes import _table_codes

    documented = _table_codes("### Exit codes of `yeto run scale`")
    out = CliRunner().invoke(cli, ["run", "scale", "--help"]).output
    helped = {int(m[1]) for m in re.finditer(r"^\s+(\d+)\s+\S", out, re.M)}
    assert set(documented) == helped == {0, 1, 2}, out
    assert "beyond the budget" in documented[1] and "the trainer" in documented[2]
