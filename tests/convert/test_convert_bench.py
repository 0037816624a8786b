"""`yeto bench scheduler` has a fleet with a convertible node on the same traces."""

from __future__ import annotations

from yeto_bench.convert_sim import FLEETS, run_convertible_bench, simulate_fleets
from yeto_bench.scheduler import builtin_traces


def test_every_fleet_trains_every_group_of_every_trace_and_pays_its_nodes() -> None:
    out = run_convertible_bench(builtin_traces(2 * 3600.0))
    for name, fleets in out["results"].items():
        assert set(fleets) == set(FLEETS), name
        for kind, r in fleets.items():
            assert r["finished"], (name, kind)
            assert r["groups_trained"] + r["stale_groups"] == r["groups_target"], (name, kind)
            held = 2 if kind == "s1" else 3
            extra = r["trainer_paid_s"] if kind == "s1" else 0.0
            assert abs(r["gpu_s_paid"] - (held * r["time_to_train_s"] + extra)) < 1.0
            assert r["usd_per_trained_group"] is not None
        assert fleets["fixed_split"]["conversions"] == fleets["s1"]["conversions"] == 0
    assert out["results"]["diurnal"]["convertible"]["conversions"] >= 2
    assert set(out["summary"]["diurnal"]) >= {"gpu_s_vs_fixed_split", "gpu_s_vs_s1", "time_vs_s1"}


def test_a_conversion_finishes_or_abandons_the_group_in_flight() -> None:
    trace = [i * 10.0 for i in range(120)] + [3000.0 + i * 10.0 for i in range(120)]
    near = simulate_fleets(trace, drain_bound_s=25.0)["convertible"]
    far = simulate_fleets(trace, drain_bound_s=0.5)["convertible"]
    assert near["conversions"] >= 2 and far["conversions"] >= 2
    assert near["abandoned_groups"] == 0 and near["in_flight_finished_at_conversion"] >= 1
    assert far["abandoned_groups"] >= 1
