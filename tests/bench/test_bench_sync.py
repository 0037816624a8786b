"""``yeto bench sync``: its accounting (bytes per outer step, sync waits, time to target,
the report's checks), its store wrapper's byte log and bandwidth, its run configs, and
its fault (an island SIGKILLed mid-horizon). The real runs are a soak
(``yeto bench sync --quick``, docs/sync.md); these use fakes and finish in a second."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from yeto_bench import faulty_store
from yeto_bench.faulty_store import FaultyStore
from yeto_bench.sync_bench import Case, KillIsland, case_toml, plan
from yeto_bench.sync_figures import (
    assemble,
    bytes_moved,
    case_figures,
    fault_ok,
    kind_of,
    sync_wait,
)
from yeto_core.events.stream import EventStream
from yeto_core.stores.dir_store import DirStore


def test_bodies_are_counted_by_what_they_are_and_per_outer_step() -> None:
    log = [
        {"op": "put_if_absent", "key": "sync/00000001/trainer-0.safetensors", "bytes": 100},
        {"op": "put_if_absent", "key": "sync/00000001/trainer-1.safetensors", "bytes": 100},
        {"op": "get", "key": "sync/00000001/trainer-0.safetensors", "bytes": 100},
        {"op": "get", "key": "sync/00000001/trainer-1.safetensors", "bytes": 100},
        {"op": "put", "key": "sync/00000001/_merged.abcdef012345.safetensors", "bytes": 120},
        {"op": "get", "key": "sync/00000001/_merged.abcdef012345.safetensors", "bytes": 120},
        {"op": "get", "key": "sync/00000001/_merged.abcdef012345.safetensors", "bytes": 120},
        {"op": "put_if_absent", "key": "sync/00000001/_commit.json", "bytes": 30},
        {"op": "put_if_match", "key": "sync/HEAD.json", "bytes": 10},
        {"op": "get", "key": "sync/deals/000001.json", "bytes": 20},
        {"op": "put", "key": "releases/v1/model.safetensors", "bytes": 500},
        # the base (step 0) and a step the run stopped before committing: in the total only
        {"op": "put", "key": "sync/00000000/_merged.0123456789ab.safetensors", "bytes": 120},
        {"op": "put_if_absent", "key": "sync/00000003/trainer-0.safetensors", "bytes": 100},
    ]
    assert kind_of("get", "sync/tape/0000000001.jsonl") == "sync_control"
    assert kind_of("put", "sync/00000002/trainer-1.dup.0123456789ab.json") == "sync_control"
    out = bytes_moved(log, outer_steps=2)
    assert out["total"] == {
        "delta_up": 300,
        "delta_down": 200,
        "merged_up": 240,
        "merged_down": 240,
        "sync_control": 60,
        "release": 500,
    }
    assert out["per_outer_step"]["merged_down"] == 120.0
    assert out["per_outer_step"]["delta_up"] == 100.0
    assert out["per_outer_step"]["merged_up"] == 60.0
    assert out["sync_per_outer_step"] == (200 + 200 + 120 + 240 + 60) / 2
    assert bytes_moved(log, outer_steps=0)["per_outer_step"] is None


def _ev(kind: str, t: float, **data) -> dict:
    return {"kind": kind, "time": t, "data": data}


def test_sync_wait_share_is_the_waits_over_the_islands_active_time() -> None:
    streams = {
        "trainer-0": [
            _ev("island_round", 100.0),
            _ev("sync_timing", 104.0, sync_wait_seconds=1.0),
            _ev("sync_timing", 108.0, sync_wait_seconds=3.0),
            _ev("island_round", 110.0),
        ],
        "trainer-1": [_ev("island_round", 100.0)],  # never synced: not reported
    }
    out = sync_wait(streams)
    assert set(out) == {"trainer-0"}
    assert out["trainer-0"] == {
        "outer_steps": 2,
        "sync_wait_s": 4.0,
        "active_s": 10.0,
        "share": 0.4,
        "median_wait_s": 2.0,
    }


def _trained(t: float, reward: float, positions: list[int], island: str, step: int) -> dict:
    return _ev(
        "round_trained",
        t,
        positions=positions,
        rewards=[reward] * 16,
        island=island,
        outer_step=step,
    )


def test_case_figures_count_rounds_and_outer_steps_to_the_target() -> None:
    events = []
    for i in range(8):  # 8 rounds of 16 groups, 2 per outer step; reward 0.5 then 1.0
        reward = 0.5 if i < 4 else 1.0
        events.append(
            _trained(10.0 + i, reward, list(range(16 * i, 16 * i + 16)), f"trainer-{i % 2}", i // 2)
        )
        if i % 2:
            events.append(_ev("pool_outer_step", 10.0 + i, outer_step=i // 2 + 1))
    events.append(_ev("round_trained", 20.0, positions=[], rewards=[], skipped={}))
    fig = case_figures(trainer_events=events, t0=5.0, target=0.9, byte_lines=(), island_streams={})
    # the rolling mean of the last 64 groups is 1.0 from the 8th round (4 rounds of 1.0)
    assert fig["time_to_target_s"] == 12.0
    assert fig["rounds_to_target"] == 8
    assert fig["outer_steps_to_target"] == 4
    assert fig["rounds_trained"] == 8
    assert fig["rounds_per_island"] == {"trainer-0": 4, "trainer-1": 4}
    assert fig["outer_steps"] == 4
    assert fig["positions_trained_twice"] == 0
    # a position in two rounds is counted
    events.append(_trained(21.0, 1.0, [3, 4], "trainer-0", 5))
    again = case_figures(
        trainer_events=events, t0=5.0, target=0.9, byte_lines=(), island_streams={}
    )
    assert again["positions_trained_twice"] == 2
    missed = case_figures(
        trainer_events=events, t0=5.0, target=1.1, byte_lines=(), island_streams={}
    )
    assert missed["time_to_target_s"] is None and missed["rounds_to_target"] is None


def _fault(**over) -> dict:
    fault = {
        "time_to_target_s": 50.0,
        "killed": {"island": "trainer-1"},
        "killed_left_roster": True,
        "ledger_check_exit": 0,
        "sync_replay_exit": 0,
        "positions_trained_twice": 0,
    }
    return {**fault, **over}


@pytest.mark.parametrize(
    "over",
    [
        {"time_to_target_s": None},
        {"killed": None},
        {"killed_left_roster": False},
        {"ledger_check_exit": 1},
        {"sync_replay_exit": 1},
        {"positions_trained_twice": 3},
        {"late_join_delay_s": 10.0, "replacement": None},
        {"late_join_delay_s": 10.0, "replacement": {"joined_at_outer_step": None}},
        {
            "late_join_delay_s": 10.0,
            "replacement": {"joined_at_outer_step": 5, "rounds_trained": 0},
        },
    ],
)
def test_the_fault_case_fails_on_any_failed_check(over: dict) -> None:
    assert fault_ok(_fault())
    assert not fault_ok(_fault(**over))
    report = assemble(
        {"single@20ms": {"time_to_target_s": 1.0}},
        faults={"elastic-3@20ms+kill": _fault(**over)},
        settings={},
    )
    assert report["faults"]["elastic-3@20ms+kill"]["ok"] is False and report["ok"] is False


def test_the_report_compares_each_case_with_the_single_island_of_its_latency() -> None:
    cases = {
        "single@20ms": {"time_to_target_s": 100.0},
        "strict-2@20ms": {"time_to_target_s": 150.0},
        "single@200ms": {"time_to_target_s": 200.0},
        "elastic-2@200ms": {"time_to_target_s": 100.0},
        "elastic-3@200ms": {"time_to_target_s": None},
    }
    report = assemble(cases, faults={"elastic-2@200ms+kill": _fault()}, settings={"seed": 0})
    ratios = {k: v["vs_single"] for k, v in report["cases"].items()}
    assert ratios == {
        "single@20ms": 1.0,
        "strict-2@20ms": 1.5,
        "single@200ms": 1.0,
        "elastic-2@200ms": 0.5,
        "elastic-3@200ms": None,
    }
    kill = report["faults"]["elastic-2@200ms+kill"]
    assert kill["ok"] is True and kill["vs_single"] == 0.25
    assert report["all_reached_target"] is False and report["ok"] is False
    del cases["elastic-3@200ms"]
    assert assemble(cases, faults={}, settings={})["ok"] is True


def test_the_wrapper_logs_sync_and_release_bodies_and_delays_them_by_the_bandwidth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(faulty_store.time, "sleep", slept.append)
    store = FaultyStore(
        DirStore(tmp_path / "s"),
        rate=0.0,
        bandwidth_bytes_per_s=1000.0,
        bytes_log=str(tmp_path / "bytes"),
    )
    store.put("sync/00000001/trainer-0.safetensors", b"x" * 500)
    store.put("buffer/groups/000001", b"y" * 2000)
    assert store.get("sync/00000001/trainer-0.safetensors") == b"x" * 500
    assert store.put_if_absent("releases/v1/info.json", b"{}")
    assert slept == [0.5, 2.0, 0.5, 0.002]
    lines = [
        json.loads(ln)
        for p in (tmp_path / "bytes").glob("*.jsonl")
        for ln in p.read_text().splitlines()
    ]
    assert [(ln["op"], ln["key"], ln["bytes"]) for ln in lines] == [
        ("put", "sync/00000001/trainer-0.safetensors", 500),
        ("get", "sync/00000001/trainer-0.safetensors", 500),
        ("put_if_absent", "releases/v1/info.json", 2),
    ]


def test_the_plan_and_its_run_configs_pass_the_config_checks(tmp_path: Path) -> None:
    from yeto_core.config.load import load_config

    cases = plan((1, 2, 3), ("strict", "elastic"), (20.0, 200.0), ("kill",))
    names = [c.name for c in cases]
    assert names[:5] == [
        "single@20ms",
        "strict-2@20ms",
        "strict-3@20ms",
        "elastic-2@20ms",
        "elastic-3@20ms",
    ]
    assert len(names) == 11 and names[-1] == "elastic-3@20ms+kill"
    cases = (
        Case("single", 1, 20.0),
        Case("elastic", 3, 200.0),
        Case("strict", 2, 20.0),
        Case("decoupled", 2, 20.0),
    )
    for case in cases:
        run_dir = tmp_path / case.name
        run_dir.mkdir()
        toml = run_dir / "run.toml"
        text = case_toml(
            case,
            run_dir,
            base_dir=tmp_path / "base",
            seed=0,
            timeout_s=60.0,
            local_steps=2,
            lr=0.0005,
            scale_lr=True,
            store=f"faulty://{run_dir}/store",
        )
        toml.write_text(text)
        config = load_config(toml)
        assert config.trainer.islands == case.islands
        if case.islands > 1:
            assert config.sync.preset == case.preset
            assert config.trainer.backend_options["lr"] == pytest.approx(0.0005 * case.islands)
        if case.preset == "decoupled":  # half the model a local step, every island's delta
            assert (config.sync.fragments, config.sync.quorum) == (2, 2)


def test_the_kill_fault_kills_an_island_mid_horizon_only(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    run_dir = tmp_path / "run"
    (run_dir / "islands").mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (run_dir / "islands" / "trainer-1-i0.json").write_text(json.dumps({"pid": proc.pid}))
        head = EventStream(store, "trainer", flush_s=0.0)
        island = EventStream(store, "trainer-1", flush_s=0.0)
        fault = KillIsland(after=2)
        head.emit("pool_outer_step", outer_step=1)
        island.emit("island_round", outer_step=2)
        fault.poll(store, run_dir)
        assert fault.killed is None  # one outer step committed, two asked
        head.emit("pool_outer_step", outer_step=2)
        island.emit("delta_submitted", outer_step=2)
        fault.poll(store, run_dir)
        assert fault.killed is None  # between horizons: its delta is in
        island.emit("island_round", outer_step=3)
        fault.poll(store, run_dir)
        assert fault.killed is not None and fault.killed["outer_step"] == 3
        assert proc.wait(timeout=30) == -9
        head.emit("pool_leave", island="trainer-1", reason="exited")
        figures = fault.figures()
        assert figures["killed_left_roster"] is True
        assert figures["killed_after_submitting"] is False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_late_join_fault_delays_the_replacement_and_reports_its_join(tmp_path: Path) -> None:
    """``late-join``: the head's environment delays the first replacement's start
    (``trainer-<N>``), and the figures name the replacement, the outer step it joined at
    and the rounds it trained; ``fault_ok`` passes once it joined and trained."""
    from yeto_bench.sync_bench import FAULTS
    from yeto_core.sync.members import START_DELAY_ENV, start_delay_s

    fault = FAULTS["late-join"](2)
    env = fault.env(3)
    assert env == {START_DELAY_ENV: "trainer-3=10"}
    assert start_delay_s(env, "trainer-3") == 10.0 and start_delay_s(env, "trainer-1") == 0.0
    assert FAULTS["kill"](2).env(3) == {}
    store = DirStore(tmp_path / "store")
    fault._store = store
    fault.killed = {"island": "trainer-1", "outer_step": 3}
    head = EventStream(store, "trainer", flush_s=0.0)
    head.emit("pool_leave", island="trainer-1", reason="exited")
    assert fault.figures()["replacement"] is None  # none launched yet
    head.emit("pool_launched", island="trainer-3", reason="replace", replaces="trainer-1")
    late = EventStream(store, "trainer-3", flush_s=0.0)
    head.emit("pool_join", island="trainer-3", outer_step=6, reason="replace")
    late.emit("island_round", outer_step=6)
    late.emit("island_round", outer_step=6)
    figures = fault.figures()
    assert figures["replacement"] == {
        "island": "trainer-3",
        "joined_at_outer_step": 6,
        "rounds_trained": 2,
    }
    assert figures["late_join_delay_s"] == 10.0
    assert fault_ok({**_fault(), **figures})


def test_a_case_run_with_several_seeds_reports_the_median_and_the_worst_checks() -> None:
    from yeto_bench.sync_figures import merge_seeds

    def seed(t, rounds, ledger=0, twice=0):
        return {
            "time_to_target_s": t,
            "rounds_to_target": rounds,
            "ledger_check_exit": ledger,
            "sync_replay_exit": 0,
            "positions_trained_twice": twice,
        }

    merged = merge_seeds({0: seed(300.0, 100), 1: seed(None, None), 2: seed(100.0, 50)})
    # a miss counts as longer than any: the median of (100, 300, miss) is 300
    assert merged["time_to_target_s"] == 300.0 and merged["reached"] == "2/3"
    assert merged["times_to_target_s"] == {"0": 300.0, "1": None, "2": 100.0}
    assert merged["rounds_to_target"] == 75.0 and set(merged["per_seed"]) == {"0", "1", "2"}
    assert merged["ledger_check_exit"] == 0 and merged["positions_trained_twice"] == 0
    # two misses of three: no time; a failed check in one seed is the case's
    worse = merge_seeds(
        {0: seed(None, None), 1: seed(None, None, ledger=1, twice=2), 2: seed(9.0, 9)}
    )
    assert worse["time_to_target_s"] is None and worse["reached"] == "1/3"
    assert worse["ledger_check_exit"] == 1 and worse["positions_trained_twice"] == 2
    report = assemble(
        {"single@20ms": merge_seeds({0: seed(50.0, 9), 1: seed(70.0, 9)}), "strict-2@20ms": merged},
        faults={},
        settings={},
    )
    assert report["cases"]["strict-2@20ms"]["vs_single"] == 5.0  # 300 over the median 60
    kill = {**_fault(), "time_to_target_s": 10.0}
    bad_kill = {**kill, "killed_left_roster": False}
    assert fault_ok(merge_seeds({0: kill, 1: kill}))
    assert not fault_ok(merge_seeds({0: kill, 1: bad_kill}))
