"""`yeto bench scheduler`'s budgeted traces: the cost guard never lets a trace exceed its
budget, each budget stop leaves a cut, and every result reports its money."""

from __future__ import annotations

from yeto_bench.budget import add_money, run_budgeted, simulate_budgeted
from yeto_bench.scheduler import HOUR, builtin_traces, run_bench


def test_no_budgeted_trace_exceeds_its_budget_and_every_budget_stop_leaves_a_cut() -> None:
    out = run_budgeted(horizon_s=1 * HOUR)
    s = out["summary"]
    assert s["traces"] == 5
    assert s["traces_over_budget"] == 0, out
    assert s["budget_stops_without_cut"] == 0, out
    # the budgets are real limits: without the guard, four of the five traces exceed them
    assert s["unguarded_traces_over_budget"] == 4, out
    assert s["traces_stopped_by_budget"] == 4, out
    for name, r in out["results"].items():
        g = r["guarded"]
        assert g["usd_total"] <= r["budget_usd"] and g["usd_billed"] <= r["budget_usd"], name
        assert g["usd_per_trained_group"] and g["groups_trained"] > 0, name
        assert g["stale_groups"] == 0, name
        if name != "steady_fits":
            acts = [d["action"] for d in g["guard_decisions"]]
            assert acts[-1] == "stop_run" and "release_sampler" in acts, (name, acts)
            assert acts.index("release_sampler") < acts.index("stop_run")
    jump = out["results"]["spot_price_jump"]
    assert jump["unguarded"]["usd_total"] > out["results"]["steady_fits"]["unguarded"]["usd_total"]


def test_without_the_guard_the_same_fleet_overspends() -> None:
    arrivals = [i * 6.0 for i in range(600)]
    free = simulate_budgeted(arrivals, budget_usd=0.0)
    assert free["usd_total"] > 5.0 and free["stopped_by"].startswith("finished")
    guarded = simulate_budgeted(arrivals, budget_usd=5.0)
    assert guarded["usd_total"] <= 5.0 < free["usd_total"]
    assert guarded["stopped_by"].startswith("budget") and guarded["cut_at_stop"]


def test_every_scheduler_result_reports_money_with_the_prices_used() -> None:
    results = {"bursty": {"s1": {"paid_trainer_s": 3600.0, "end_s": 7200.0, "groups_trained": 10}}}
    prices = add_money(results, sampler_usd_per_hour=1.0, trainer_usd_per_hour=4.0, samplers=2)
    assert prices == {"sampler_usd_per_hour": 1.0, "trainer_usd_per_hour": 4.0, "samplers": 2}
    assert results["bursty"]["s1"]["usd_total"] == 8.0  # 2 x 1 $/h x 2 h + 4 $/h x 1 h
    assert results["bursty"]["s1"]["usd_per_trained_group"] == 0.8
    out = run_bench({"steady": builtin_traces(1200.0)["steady"]}, budgeted=False)
    assert out["prices"]["samplers"] == 4
    for r in out["results"]["steady"].values():
        assert r["usd_total"] > 0 and r["usd_per_trained_group"] > 0
    assert out["summary"]["usd_per_trained_group"] > 0
