"""The head's cost guard with real island processes (fake samplers, the trainer island with
the fake backend): a run that would exceed its budget scales down, stops with the budget
exit code and a cut, within the budget; resumed with a higher budget it continues from the cut."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner

from yeto_core.config.load import CostConfig
from yeto_core.events.stream import read_events
from yeto_core.head.run import EXIT_BUDGET
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_run import fake_head, fake_run_config

# 2 samplers at 36 $/h and a trainer at 72 $/h: 144 $/h, 4 cents a second. A fake
# island may take the provider's whole 5 s SIGTERM timeout to go: that is the floor.
COST = CostConfig(sampler_release_s=5.0, trainer_stop_s=5.0, react_s=0.5, soft_fraction=0.9)
BUDGET, HIGHER = 2.0, 4.0


def _config(tmp_path: Path, budget: float):
    config = fake_run_config(tmp_path, total_rounds=0, wall_clock_s=300.0)
    options = {**config.scheduler.options, "start_seconds_fallback": 20.0}
    return attrs.evolve(
        config,
        cost=COST,
        backstops=attrs.evolve(config.backstops, budget_usd=budget),
        scheduler=attrs.evolve(config.scheduler, options=options),
    )


def _cost(config) -> dict:
    from yeto_core.cli import cli

    res = CliRunner().invoke(cli, ["cost", config.run_dir, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _journal(config) -> list[dict]:
    root = Path(config.run_dir) / "store" / "head" / "journal"
    return [json.loads(p.read_text()) for p in sorted(root.glob("*.json"))]


@pytest.mark.timeout(300)
def test_the_guard_scales_down_then_stops_within_the_budget_and_a_resume_continues(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, budget=BUDGET)
    assert fake_head(config).run(lambda m: None) == EXIT_BUDGET
    store = DirStore(Path(config.run_dir) / "store", fsync=False)
    head = read_events(store, "head")
    guard = [e.data for e in head if e.kind == "cost_guard"]
    actions = [g["action"] for g in guard]
    # the soft stage first (a sampler, then the trainer when there is time for it);
    # then the stop before the budget
    assert "release_sampler" in actions and actions[-1] == "stop_run", actions
    assert actions.index("release_sampler") < actions.index("stop_run")
    if "stop_trainer" in actions:
        assert actions.index("release_sampler") < actions.index("stop_trainer")
    stop = guard[-1]
    assert stop["budget_usd"] > stop["spent_usd"]
    if stop["reason"] == "budget":
        assert stop["projected_usd"] >= stop["budget_usd"]
    else:  # nothing left to buy: no trainer may start, the samplers wait at the cap
        assert stop["reason"] == "budget_idle" and not stop["allow_trainer_start"]
    assert {"samplers", "trainer", "react_s", "spent_usd"} <= set(stop["inputs"])
    released = [e.data for e in head if e.kind == "sampler_released" and e.data.get("reason")]
    assert [r["island"] for r in released] == ["sampler-1"]
    # a cut was taken when the guard stopped the trainer; nothing runs any more
    stops = [r for r in _journal(config) if r["kind"] == "stop"]
    assert stops and stops[-1]["cut_id"], stops
    cut_id = stops[-1]["cut_id"]
    assert not list((Path(config.run_dir) / "islands").glob("*.json"))
    c = _cost(config)
    assert c["ledger"] == "store" and c["within_budget"] is True, c
    assert 0.5 * BUDGET <= c["usd_total"] <= BUDGET, c
    assert set(c["by_role"]) == {"sampler", "trainer"} and c["by_provider"].keys() == {"local"}
    assert c["usd_per_trained_group"] and c["groups_trained"] > 0
    summary = json.loads((Path(config.run_dir) / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_BUDGET and summary["cost"]["usd_total"] <= BUDGET
    assert not (Path(config.run_dir) / "FINISHED").exists()

    # the same budget again: nothing is launched, the run stops at once
    assert fake_head(config).run(lambda m: None) == EXIT_BUDGET
    assert _cost(config)["usd_total"] <= BUDGET

    # a higher budget: the next trainer incarnation starts from the guard's cut
    higher = _config(tmp_path, budget=HIGHER)
    assert fake_head(higher).run(lambda m: None) == EXIT_BUDGET
    starts = [e.data for e in read_events(store, "trainer") if e.kind == "trainer_start_summary"]
    after = [s for s in starts if s.get("cut_id") == cut_id]
    assert after and after[0]["policy_version"] > 0, starts
    c = _cost(higher)
    assert BUDGET < c["usd_total"] <= HIGHER, c
