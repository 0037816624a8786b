"""Prices the provider reports (IslandProvider.price_per_hour) reach the ledger at launch and
when they change; a provider that reports none is priced from the config."""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest

from yeto_core.config.load import CostConfig
from yeto_core.cost.guard import HeadCostGuard
from yeto_core.cost.ledger import CostLedger, read_store_lines
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_run import fake_run_config


class _Spot:
    """A provider's price hook (the only part of IslandProvider the guard calls here)."""

    def __init__(self) -> None:
        self.usd = {"sampler-0-i0": 1.5}

    def price_per_hour(self, handle):
        return self.usd.get(handle)


class _Events:
    def __init__(self) -> None:
        self.got = []

    def emit(self, kind, **data):
        self.got.append((kind, data))


def _head(tmp_path, prices: str = "provider"):
    config = fake_run_config(tmp_path)  # samplers 36 $/h, trainer 72 $/h in the config
    config = attrs.evolve(config, cost=CostConfig(prices=prices))
    t = [0.0]
    spot = _Spot()
    head = SimpleNamespace(
        config=config,
        clock=lambda: t[0],
        provider_of=lambda island: spot,
        _group_of=lambda island: ("spot", {}),
        events=_Events(),
    )
    guard = HeadCostGuard(head)
    store = DirStore(tmp_path / "store", fsync=False)
    head.costs = CostLedger(
        tmp_path / "run",
        config.island_prices(),
        clock=head.clock,
        store=store,
        describe=guard.describe,
    )
    return head, guard, spot, t, store


def test_reported_prices_are_recorded_at_launch_and_when_they_change(tmp_path) -> None:
    head, guard, spot, t, store = _head(tmp_path)
    head.costs.started("sampler-0", "sampler-0-i0")
    head.costs.started("sampler-1", "sampler-1-i0")  # the provider knows no price for it
    lines = read_store_lines(store)
    assert [(ln.usd_per_hour, ln.source, ln.provider) for ln in lines] == [
        (1.5, "provider", "spot"),
        (36.0, "config", "spot"),
    ]
    t[0] = 3600.0
    spot.usd["sampler-0-i0"] = 4.5  # the spot price jumped
    guard.poll_prices(t[0])
    assert (
        "cost_price_changed",
        {
            "island": "sampler-0",
            "handle": "sampler-0-i0",
            "usd_per_hour": 4.5,
            "previous_usd_per_hour": 1.5,
        },
    ) in head.events.got
    t[0] = 7200.0
    guard.poll_prices(t[0])  # no change: no record
    assert len(read_store_lines(store)) == 3
    inc = {i.handle: i for i in head.costs.spend(7200.0).incarnations}
    assert inc["sampler-0-i0"].usd == pytest.approx(1.5 + 4.5)
    assert inc["sampler-1-i0"].usd == pytest.approx(72.0)


def test_prices_config_ignores_what_the_provider_reports(tmp_path) -> None:
    head, guard, spot, t, store = _head(tmp_path, prices="config")
    head.costs.started("sampler-0", "sampler-0-i0")
    (line,) = read_store_lines(store)
    assert (line.usd_per_hour, line.source) == (36.0, "config")
