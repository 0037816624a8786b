"""The resource ledger in the store: incarnations, provider prices, spend by role/provider."""

from __future__ import annotations

import pytest

from yeto_core.cost.ledger import (
    CostLedger,
    CostLine,
    cost_figures,
    incarnation_costs,
    read_lines,
    read_store_lines,
    spend,
)
from yeto_core.errors import StoreError
from yeto_core.stores.dir_store import DirStore


def _describe(island: str, handle: str) -> dict:
    if island == "trainer":
        return {"role": "trainer", "provider": "modal", "usd_per_hour": 36.0, "source": "provider"}
    return {"role": "sampler", "provider": "local", "usd_per_hour": 3.6, "source": "config"}


def test_the_ledger_lives_in_the_store_and_any_reader_computes_the_same(tmp_path) -> None:
    store = DirStore(tmp_path / "store", fsync=False)
    t = [0.0]
    ledger = CostLedger(tmp_path / "run", {}, clock=lambda: t[0], store=store, describe=_describe)
    ledger.started("sampler-0", "sampler-0-i0")
    ledger.started("trainer", "trainer-i0")
    t[0] = 100.0
    ledger.priced("trainer", "trainer-i0", 72.0, "provider")  # a spot price jump
    t[0] = 200.0
    ledger.stopped("trainer", "trainer-i0", release_s=4.0)
    t[0] = 3600.0
    # another machine: only the store
    lines = read_store_lines(store)
    assert lines == ledger.lines() == read_lines(tmp_path / "run" / "cost.jsonl")
    sp = spend(lines, {}, 3600.0)
    trainer = 36.0 * 100 / 3600 + 72.0 * 100 / 3600
    assert sp.by_role == pytest.approx({"sampler": 3.6, "trainer": trainer})
    assert sp.by_provider == pytest.approx({"local": 3.6, "modal": trainer})
    assert sp.total_usd == pytest.approx(3.6 + trainer)
    assert sp.burn_usd_per_hour == pytest.approx(3.6)  # only the sampler runs
    inc = {i.handle: i for i in sp.incarnations}
    assert inc["trainer-i0"].usd_per_hour == 72.0 and inc["trainer-i0"].release_s == 4.0
    assert inc["sampler-0-i0"].stopped_at is None
    # a restarted head reads the store back and keeps counting
    again = CostLedger(tmp_path / "run", {}, clock=lambda: t[0], store=store)
    assert again.open_handles() == {"sampler-0-i0": "sampler-0"}
    assert again.total_usd() == pytest.approx(sp.total_usd)


def test_lines_without_a_price_use_the_config_price_by_island_or_group() -> None:
    lines = [
        CostLine("start", "sampler-1", "h1", 0.0),
        CostLine("start", "trainer", "h2", 0.0, usd_per_hour=100.0, source="provider"),
        CostLine("stop", "sampler-1", "h1", 1800.0),
        CostLine("stop", "trainer", "h2", 36.0),
        CostLine("stop", "trainer", "h2", 3600.0),  # a second stop of a closed handle: ignored
    ]
    incs = {i.handle: i for i in incarnation_costs(lines, {"sampler": 2.0, "trainer": 1.0}, 9e9)}
    assert incs["h1"].usd == pytest.approx(1.0) and incs["h1"].source == "config"
    assert incs["h2"].usd == pytest.approx(1.0) and incs["h2"].source == "provider"


def test_a_record_the_store_refused_is_written_later_in_order(tmp_path) -> None:
    class Flaky(DirStore):
        fail = True

        def put_if_absent(self, key, data):
            if self.fail:
                raise StoreError("503 slow down")
            return super().put_if_absent(key, data)

    store = Flaky(tmp_path / "store", fsync=False)
    t = [0.0]
    ledger = CostLedger(tmp_path / "run", {"s": 3600.0}, clock=lambda: t[0], store=store)
    ledger.started("s-0", "a")
    t[0] = 1.0
    ledger.stopped("s-0", "a")
    assert read_store_lines(store) == [] and ledger.total_usd() == pytest.approx(1.0)
    assert ledger.flush() is False
    store.fail = False
    assert ledger.flush() is True
    assert [ln.event for ln in read_store_lines(store)] == ["start", "stop"]


def test_cost_figures_per_trained_group_release_and_reward_point() -> None:
    lines = [
        CostLine("start", "s-0", "a", 0.0, usd_per_hour=36.0),
        CostLine("stop", "s-0", "a", 100.0),
    ]
    f = cost_figures(
        spend(lines, {}, 100.0),
        {"groups_trained": 4, "releases_published": 2, "reward_first": 0.3, "reward_last": 0.8},
    )
    assert f["usd_total"] == pytest.approx(1.0)
    assert f["usd_per_trained_group"] == pytest.approx(0.25)
    assert f["usd_per_release"] == pytest.approx(0.5)
    assert f["reward_points_gained"] == pytest.approx(50.0)
    assert f["usd_per_reward_point"] == pytest.approx(0.02)
    none = cost_figures(
        spend([], {}, 0.0), {"groups_trained": 0, "reward_first": 0.5, "reward_last": 0.4}
    )
    assert none["usd_per_trained_group"] is None and none["usd_per_reward_point"] is None
