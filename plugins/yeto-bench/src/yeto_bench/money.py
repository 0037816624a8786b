"""What a bench run cost: the run's resource ledger priced at the bench's prices.

The benches' runs are configured without prices (they run on this machine), so
every bench prices the island-seconds of the run's ledger (``cost/ledger/`` in its
store, else the run dir's ``cost.jsonl``) at :data:`BENCH_PRICES` by role, and
reports the prices it used next to ``usd_total`` and ``usd_per_trained_group``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

#: Dollars per hour by role: a sampler GPU and a trainer node.
BENCH_PRICES = {"sampler": 2.0, "trainer": 8.0}


def priced_usd(lines: list[Any], prices: Mapping[str, float], trainer: str = "trainer") -> float:
    """Island-seconds of every incarnation times its role's price (open ones to the last record)."""
    from yeto_core.cost.ledger import incarnation_costs

    now = max((ln.time for ln in lines), default=0.0)
    usd = 0.0
    for inc in incarnation_costs(lines, {}, now):
        role = inc.role or ("trainer" if inc.island == trainer else "sampler")
        usd += inc.seconds * float(prices.get(role, 0.0)) / 3600.0
    return usd


def run_money(
    run_dir: Path, *, store_url: Optional[str] = None, prices: Mapping[str, float] = BENCH_PRICES
) -> dict[str, Any]:
    """``usd_total``, ``groups_trained`` and ``usd_per_trained_group`` of one run."""
    from yeto_core.cost.ledger import COST_FILE, read_lines, read_store_lines
    from yeto_core.events.stream import read_events
    from yeto_core.plugins import get_plugins

    store = get_plugins().open_store(store_url or str(Path(run_dir) / "store"))
    lines = read_store_lines(store) or read_lines(Path(run_dir) / COST_FILE)
    usd = priced_usd(lines, prices)
    trained = {
        int(p)
        for e in read_events(store, "trainer")
        if e.kind == "round_trained"
        for p in e.data.get("positions", ())
    }
    return {
        "usd_total": round(usd, 6),
        "groups_trained": len(trained),
        "usd_per_trained_group": round(usd / len(trained), 8) if trained else None,
    }


def bench_prices(prices: Mapping[str, float] = BENCH_PRICES) -> dict[str, Any]:
    """The prices block of a bench's JSON."""
    return {f"{role}_usd_per_hour": p for role, p in sorted(prices.items())}
