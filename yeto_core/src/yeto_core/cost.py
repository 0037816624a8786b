"""The cost ledger: island-seconds times each island's price per hour.

The head records when each island incarnation starts and when its release is
verified, in ``cost.jsonl`` in the run dir (one JSON object per line, appended
and flushed). The cost so far is a pure function of those lines, the prices
and the clock, so ``yeto cost RUN`` from another terminal computes the same
figure the budget backstop uses. An island whose stop line is missing (a head
that was killed) counts until the restarted head records its release.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Optional

import attrs

COST_FILE = "cost.jsonl"


@attrs.frozen
class CostLine:
    """One start or stop of an island incarnation."""

    event: str  # "start" or "stop"
    island: str
    handle: str
    time: float


@attrs.frozen
class IslandCost:
    """What one island (all its incarnations) cost so far."""

    island: str
    seconds: float
    price_per_hour: float
    usd: float
    running: bool


def island_costs(
    lines: Iterable[CostLine], prices: Mapping[str, float], now: float
) -> list[IslandCost]:
    """Seconds and dollars per island; open intervals count up to ``now``.

    A price is looked up by island name and then by the island's group (the
    name before its last ``-<n>``, or before ``-i<n>`` for trainer
    incarnations); a missing price is 0.
    """
    open_: dict[str, tuple[str, float]] = {}
    seconds: dict[str, float] = {}
    for line in lines:
        seconds.setdefault(line.island, 0.0)
        if line.event == "start":
            if line.handle not in open_:
                open_[line.handle] = (line.island, line.time)
        elif line.event == "stop":
            started = open_.pop(line.handle, None)
            if started is not None:
                seconds[started[0]] += max(0.0, line.time - started[1])
    running = set()
    for island, start in open_.values():
        seconds[island] += max(0.0, now - start)
        running.add(island)
    out = []
    for island in sorted(seconds):
        price = _price(island, prices)
        out.append(
            IslandCost(
                island=island,
                seconds=seconds[island],
                price_per_hour=price,
                usd=seconds[island] * price / 3600.0,
                running=island in running,
            )
        )
    return out


def _price(island: str, prices: Mapping[str, float]) -> float:
    if island in prices:
        return float(prices[island])
    group = island.rsplit("-", 1)[0] if "-" in island else island
    return float(prices.get(group, 0.0))


def total_usd(lines: Iterable[CostLine], prices: Mapping[str, float], now: float) -> float:
    """Dollars spent so far by every island."""
    return sum(c.usd for c in island_costs(lines, prices, now))


class CostLedger:
    """Appends start/stop lines to ``<run_dir>/cost.jsonl`` and sums them.

    :param run_dir: the run directory.
    :param prices: dollars per hour by island name (or island group).
    :param clock: seconds since the epoch (injected for tests).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        prices: Mapping[str, float],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(run_dir) / COST_FILE
        self.prices = dict(prices)
        self.clock = clock

    def _append(self, line: CostLine) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(attrs.asdict(line), sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def started(self, island: str, handle: str, at: Optional[float] = None) -> None:
        """Record that ``handle`` (an incarnation of ``island``) started."""
        self._append(CostLine("start", island, handle, self.clock() if at is None else at))

    def stopped(self, island: str, handle: str, at: Optional[float] = None) -> None:
        """Record that ``handle``'s release was verified."""
        self._append(CostLine("stop", island, handle, self.clock() if at is None else at))

    def lines(self) -> list[CostLine]:
        """Every complete line (a torn last line from a killed head is ignored)."""
        return read_lines(self.path)

    def open_handles(self) -> dict[str, str]:
        """Handles started and not stopped, with their island."""
        out: dict[str, str] = {}
        for line in self.lines():
            if line.event == "start":
                out[line.handle] = line.island
            else:
                out.pop(line.handle, None)
        return out

    def costs(self, now: Optional[float] = None) -> list[IslandCost]:
        return island_costs(self.lines(), self.prices, self.clock() if now is None else now)

    def total_usd(self, now: Optional[float] = None) -> float:
        return sum(c.usd for c in self.costs(now))


def read_lines(path: str | os.PathLike[str]) -> list[CostLine]:
    """Parse ``cost.jsonl``; a missing file is empty, a torn line is skipped."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for raw in text.splitlines():
        try:
            d = json.loads(raw)
            out.append(
                CostLine(str(d["event"]), str(d["island"]), str(d["handle"]), float(d["time"]))
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out
