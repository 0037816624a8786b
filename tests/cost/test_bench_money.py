"""Every bench prices its runs' ledgers: `yeto bench e2e` and `yeto bench chaos` money."""

from __future__ import annotations

import pytest

from yeto_bench.chaos import campaign_report
from yeto_bench.e2e import combine, one_report
from yeto_bench.money import BENCH_PRICES, run_money
from yeto_core.cost.ledger import CostLedger
from yeto_core.events.stream import EventStream
from yeto_core.stores.dir_store import DirStore


def test_run_money_prices_the_ledger_by_role_and_counts_trained_groups(tmp_path) -> None:
    store = DirStore(tmp_path / "store", fsync=False)
    t = [0.0]
    roles = {"trainer": "trainer"}
    ledger = CostLedger(
        tmp_path,
        {},
        clock=lambda: t[0],
        store=store,
        describe=lambda i, h: {"role": roles.get(i, "sampler")},
    )
    ledger.started("sampler-0", "s0")
    ledger.started("trainer", "t0")
    t[0] = 1800.0
    ledger.stopped("trainer", "t0")
    t[0] = 3600.0
    ledger.stopped("sampler-0", "s0")
    ev = EventStream(store, "trainer", flush_s=0.0)
    ev.emit("round_trained", positions=[0, 1], rewards=[0.1, 0.2])
    ev.emit("round_trained", positions=[1, 2], rewards=[0.1, 0.2])  # 1 again: counted once
    m = run_money(tmp_path)
    usd = BENCH_PRICES["sampler"] * 1.0 + BENCH_PRICES["trainer"] * 0.5
    assert m["usd_total"] == pytest.approx(usd)
    assert m["groups_trained"] == 3
    assert m["usd_per_trained_group"] == pytest.approx(usd / 3)


def test_e2e_and_chaos_reports_carry_usd_and_the_prices() -> None:
    run = {
        "time_to_target_s": 10.0,
        "startup_s": 1.0,
        "trainer_paid_s": 5.0,
        "trainer_busy_s": 4.0,
        "max_policy_lag": 1,
        "reward_curve": [],
        "rounds_trained": 3,
        "groups_appended": 48,
        "head_exit_code": 0,
        "usd_total": 0.5,
        "usd_per_trained_group": 0.01,
    }
    r = one_report(run, dict(run, usd_total=1.0), None, task="t", target=0.8, timeout_s=60)
    assert r["usd_total"] == {"async": 0.5, "sync": 1.0}
    assert r["usd_per_trained_group"]["async"] == 0.01
    assert r["prices"] == {"sampler_usd_per_hour": 2.0, "trainer_usd_per_hour": 8.0}
    both = combine([r, r], [0, 1])
    assert both["usd_total"] == {"async": 0.5, "sync": 1.0} and both["prices"] == r["prices"]
    per_run = {
        "kills": [],
        "completed": True,
        "groups_lost": 0,
        "groups_trained_twice": 0,
        "ledger_replay_mismatch": 0,
        "torn_records_visible": 0,
        "ledger_check_failures": 0,
        "ledger_unrecorded_tail_skips": 0,
        "usd_total": 0.3,
        "usd_groups_trained": 30,
    }
    c = campaign_report([per_run, per_run], seed=0, kills=0, replay=True)
    assert c["usd_total"] == pytest.approx(0.6)
    assert c["usd_per_trained_group"] == pytest.approx(0.01)
    assert c["prices"]["trainer_usd_per_hour"] == 8.0
