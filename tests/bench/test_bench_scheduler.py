"""`yeto bench scheduler`: the simulation conserves groups and the CLI replays a trace file."""

from __future__ import annotations

import json

from click.testing import CliRunner

from yeto_bench.scheduler import builtin_traces, command, simulate


def test_simulation_conserves_groups_and_s1_pays_less_on_bursts():
    arrivals = builtin_traces(2 * 3600.0)["bursty"]
    s1 = simulate("s1", arrivals)
    ao = simulate("always-on", arrivals)
    for r in (s1, ao):
        assert r["groups_trained"] + r["stale_groups"] + r["groups_left_in_buffer"] == len(arrivals)
        assert r["groups_left_in_buffer"] < 8  # less than one round is left at the data end
        assert r["busy_s"] <= r["paid_trainer_s"]
    assert s1["stale_groups"] == 0
    assert s1["paid_trainer_s"] < ao["paid_trainer_s"]
    assert s1["starts"] >= 2


def test_cli_replays_a_trace_file(tmp_path):
    trace = tmp_path / "fleet.jsonl"
    trace.write_text("\n".join(json.dumps({"t": 100.0 + i}) for i in range(48)) + "\n")
    res = CliRunner().invoke(
        command, ["--json", "--trace", str(trace), "--start-s", "30", "--round-s", "5"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out["results"]) == {"fleet"}
    assert out["results"]["fleet"]["s1"]["groups_trained"] == 48
    assert out["params"]["start_s"] == 30.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\n')
    res = CliRunner().invoke(command, ["--trace", str(bad)])
    assert res.exit_code != 0 and "bad.jsonl:1" in res.output


def test_lora_fleet_starts_for_the_first_policy_and_full_does_not():
    arrivals = builtin_traces(3600.0)["bursty"]  # the first group arrives at t=600
    full = simulate("s1", arrivals)
    lora = simulate("s1", arrivals, tuning="lora")
    for r in (full, lora):
        assert r["groups_trained"] + r["stale_groups"] + r["groups_left_in_buffer"] == len(arrivals)
    # the LoRA trainer idles from t=0 for its first release; the full one starts on a backlog
    assert lora["paid_trainer_s"] > full["paid_trainer_s"]
    assert lora["busy_s"] == full["busy_s"]
