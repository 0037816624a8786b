"""The resource ledger: what each island incarnation cost, second by second.

The head records every island incarnation's start, every change of the price
its provider reports, and the moment its release is verified, as records of a
store log (``cost/ledger/<seq:010d>.json``, :class:`~yeto_core.stores.log.StoreLog`)
and as lines of ``cost.jsonl`` in the run dir (a local copy for readers that
have only the run dir). Each record names the island, its role (``sampler`` or
``trainer``), its provider and the dollars per hour it is billed at from that
moment (the price the provider reports through
:meth:`~yeto_core.ports.IslandProvider.price_per_hour`, or the config's
``price_per_hour``). The trainer's record starts at its launch and stops at its
verified release, so its start-up, drain and cut are paid for.

What a run cost so far is a pure function of those records and the clock
(:func:`island_costs`, :func:`spend`), so ``yeto cost RUN`` on any machine that
reaches the store computes the figure the cost guard uses. An incarnation whose
stop record is missing (a head that was killed) counts up to now until the
restarted head records its release.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core.errors import StoreError

COST_FILE = "cost.jsonl"
#: The store log of the resource ledger (one record per start, price change, stop).
LEDGER_PREFIX = "cost/ledger"


@attrs.frozen
class CostLine:
    """One start, price change or verified stop of an island incarnation (``handle``).

    ``usd_per_hour`` is the price from ``time`` on; None (lines of older runs): the
    config's price of the island.
    """

    event: str  # "start", "price" or "stop"
    island: str
    handle: str
    time: float
    role: str = ""
    provider: str = ""
    usd_per_hour: Optional[float] = None
    #: where the price came from: "provider" (it reported one) or "config"
    source: str = ""
    #: stop lines: seconds from the release request to the verified release
    release_s: Optional[float] = None


@attrs.frozen
class IslandCost:
    """What one island (all its incarnations) cost so far."""

    island: str
    seconds: float
    price_per_hour: float  # the latest price
    usd: float
    running: bool
    role: str = ""
    provider: str = ""


@attrs.frozen
class IncarnationCost:
    """What one incarnation (a handle) cost so far."""

    handle: str
    island: str
    role: str
    provider: str
    started_at: float
    stopped_at: Optional[float]
    seconds: float
    usd: float
    usd_per_hour: float  # the price now (or at its stop)
    source: str
    release_s: Optional[float] = None


def config_price(island: str, prices: Mapping[str, float]) -> float:
    """The config's price of ``island``: by name, else by its group; a missing price is 0.

    The group is the name before its last ``-<n>`` (``sampler-1`` → ``sampler``).
    """
    if island in prices:
        return float(prices[island])
    group = island.rsplit("-", 1)[0] if "-" in island else island
    return float(prices.get(group, 0.0))


_price = config_price  # the name older callers used


def incarnation_costs(
    lines: Iterable[CostLine], prices: Mapping[str, float], now: float
) -> list[IncarnationCost]:
    """Seconds and dollars of every incarnation, in start order; open ones count to ``now``.

    A second start of a handle is ignored; a price line starts a new price segment;
    a line of a handle that is not open is ignored.
    """
    open_: dict[str, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for ln in lines:
        if ln.event == "start":
            if ln.handle in open_:
                continue
            price = ln.usd_per_hour
            open_[ln.handle] = {
                "handle": ln.handle,
                "island": ln.island,
                "role": ln.role,
                "provider": ln.provider,
                "started_at": ln.time,
                "stopped_at": None,
                "seconds": 0.0,
                "usd": 0.0,
                "usd_per_hour": config_price(ln.island, prices) if price is None else float(price),
                "source": ln.source or ("config" if price is None else ""),
                "release_s": None,
                "_from": ln.time,
            }
            continue
        rec = open_.get(ln.handle)
        if rec is None:
            continue
        dt = max(0.0, ln.time - rec["_from"])
        rec["seconds"] += dt
        rec["usd"] += dt * rec["usd_per_hour"] / 3600.0
        rec["_from"] = max(rec["_from"], ln.time)
        if ln.event == "price":
            if ln.usd_per_hour is not None:
                rec["usd_per_hour"] = float(ln.usd_per_hour)
                rec["source"] = ln.source or rec["source"]
        elif ln.event == "stop":
            rec["stopped_at"] = ln.time
            rec["release_s"] = ln.release_s
            done.append(open_.pop(ln.handle))
    for rec in open_.values():
        dt = max(0.0, now - rec["_from"])
        rec["seconds"] += dt
        rec["usd"] += dt * rec["usd_per_hour"] / 3600.0
        done.append(rec)
    done.sort(key=lambda r: (r["started_at"], r["handle"]))
    return [IncarnationCost(**{k: v for k, v in r.items() if k != "_from"}) for r in done]


def island_costs(
    lines: Iterable[CostLine], prices: Mapping[str, float], now: float
) -> list[IslandCost]:
    """Seconds and dollars per island (sorted by name); open intervals count up to ``now``.

    A price is the line's own (what the provider reported) or, for lines without one,
    looked up by island name and then by the island's group (:func:`config_price`).
    """
    lines = list(lines)
    by: dict[str, dict[str, Any]] = {}
    for ln in lines:
        by.setdefault(
            ln.island,
            {"seconds": 0.0, "usd": 0.0, "price": None, "running": False, "role": "", "prov": ""},
        )
    for inc in incarnation_costs(lines, prices, now):
        b = by[inc.island]
        b["seconds"] += inc.seconds
        b["usd"] += inc.usd
        b["price"] = inc.usd_per_hour
        b["running"] = b["running"] or inc.stopped_at is None
        b["role"] = inc.role or b["role"]
        b["prov"] = inc.provider or b["prov"]
    return [
        IslandCost(
            island=island,
            seconds=b["seconds"],
            price_per_hour=config_price(island, prices) if b["price"] is None else b["price"],
            usd=b["usd"],
            running=b["running"],
            role=b["role"],
            provider=b["prov"],
        )
        for island, b in sorted(by.items())
    ]


def total_usd(lines: Iterable[CostLine], prices: Mapping[str, float], now: float) -> float:
    """Dollars spent so far by every island."""
    return sum(c.usd for c in incarnation_costs(lines, prices, now))


@attrs.frozen
class Spend:
    """A run's spend so far (:func:`spend`)."""

    total_usd: float
    #: dollars per hour of the incarnations running now
    burn_usd_per_hour: float
    by_island: dict[str, float]
    by_role: dict[str, float]
    by_provider: dict[str, float]
    incarnations: tuple[IncarnationCost, ...]

    def running(self) -> list[IncarnationCost]:
        return [i for i in self.incarnations if i.stopped_at is None]


def spend(lines: Iterable[CostLine], prices: Mapping[str, float], now: float) -> Spend:
    """Spend by island, role and provider, and the burn rate now."""
    incs = incarnation_costs(lines, prices, now)
    by_island: dict[str, float] = {}
    by_role: dict[str, float] = {}
    by_provider: dict[str, float] = {}
    for i in incs:
        by_island[i.island] = by_island.get(i.island, 0.0) + i.usd
        role = i.role or "unknown"
        by_role[role] = by_role.get(role, 0.0) + i.usd
        prov = i.provider or "unknown"
        by_provider[prov] = by_provider.get(prov, 0.0) + i.usd
    return Spend(
        total_usd=sum(i.usd for i in incs),
        burn_usd_per_hour=sum(i.usd_per_hour for i in incs if i.stopped_at is None),
        by_island=dict(sorted(by_island.items())),
        by_role=dict(sorted(by_role.items())),
        by_provider=dict(sorted(by_provider.items())),
        incarnations=tuple(incs),
    )


#: ``describe(island, handle)`` → the fields of a start line: role, provider,
#: usd_per_hour, source (the head's cost guard supplies it).
Describe = Callable[[str, str], Mapping[str, Any]]


class CostLedger:
    """Writes the resource ledger (the store log and ``<run_dir>/cost.jsonl``) and sums it.

    :param run_dir: the run directory (its ``cost.jsonl`` is the local copy).
    :param prices: the config's dollars per hour by island name (or island group),
        for lines that carry no price.
    :param clock: seconds since the epoch (injected for tests and the simulator).
    :param store: the run's object store; None: only ``cost.jsonl`` (readers of a
        run dir, older callers).
    :param describe: fills role, provider and price of a start line (None: no price
        on the line; the config's is used).

    The records of a store log are read once when the ledger is built; after that
    the writer (the one head) keeps them in memory. A record the store refused
    (an outage) stays queued and is written, in order, by the next append or
    :meth:`flush`.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        prices: Mapping[str, float],
        *,
        clock: Callable[[], float] = time.time,
        store: Optional[Any] = None,
        describe: Optional[Describe] = None,
    ) -> None:
        self.path = Path(run_dir) / COST_FILE
        self.prices = dict(prices)
        self.clock = clock
        self.store = store
        self.describe = describe
        self._log: Any = None
        self._cache: Optional[list[CostLine]] = None
        self._pending: list[CostLine] = []
        if store is not None:
            from yeto_core.stores.log import StoreLog

            self._log = StoreLog(store, LEDGER_PREFIX, width=10)
            self._cache = read_store_lines(store)
            if not self._cache:  # a run from before the store ledger: its local copy
                self._cache = read_lines(self.path)

    def _append(self, line: CostLine) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(_line_dict(line), sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self._cache is not None:
            self._cache.append(line)
        if self._log is not None:
            self._pending.append(line)
            self.flush()

    def flush(self) -> bool:
        """Write queued records to the store; False when the store still refuses them."""
        while self._pending:
            line = self._pending[0]
            data = json.dumps(_line_dict(line), sort_keys=True, allow_nan=False).encode()
            try:
                self._log.append(lambda seq, data=data: data)
            except (StoreError, OSError):
                return False
            self._pending.pop(0)
        return True

    def started(self, island: str, handle: str, at: Optional[float] = None) -> None:
        """Record that ``handle`` (an incarnation of ``island``) started."""
        fields = dict(self.describe(island, handle)) if self.describe is not None else {}
        t = self.clock() if at is None else at
        self._append(CostLine("start", island, handle, t, **fields))

    def priced(
        self, island: str, handle: str, usd_per_hour: float, source: str, at: Optional[float] = None
    ) -> None:
        """Record that ``handle`` is billed at ``usd_per_hour`` from now on."""
        t = self.clock() if at is None else at
        self._append(
            CostLine("price", island, handle, t, usd_per_hour=float(usd_per_hour), source=source)
        )

    def stopped(
        self,
        island: str,
        handle: str,
        at: Optional[float] = None,
        *,
        release_s: Optional[float] = None,
    ) -> None:
        """Record that ``handle``'s release was verified (``release_s``: how long it took)."""
        t = self.clock() if at is None else at
        self._append(CostLine("stop", island, handle, t, release_s=release_s))

    def lines(self) -> list[CostLine]:
        """Every record (a torn last line of ``cost.jsonl`` from a killed head is ignored)."""
        if self._cache is not None:
            return list(self._cache)
        return read_lines(self.path)

    def open_handles(self) -> dict[str, str]:
        """Handles started and not stopped, with their island."""
        out: dict[str, str] = {}
        for line in self.lines():
            if line.event == "start":
                out[line.handle] = line.island
            elif line.event == "stop":
                out.pop(line.handle, None)
        return out

    def costs(self, now: Optional[float] = None) -> list[IslandCost]:
        return island_costs(self.lines(), self.prices, self.clock() if now is None else now)

    def spend(self, now: Optional[float] = None) -> Spend:
        return spend(self.lines(), self.prices, self.clock() if now is None else now)

    def total_usd(self, now: Optional[float] = None) -> float:
        return total_usd(self.lines(), self.prices, self.clock() if now is None else now)


def _line_dict(line: CostLine) -> dict[str, Any]:
    return {k: v for k, v in attrs.asdict(line).items() if v is not None and v != ""}


def _parse(d: Any) -> CostLine:
    def opt(key: str) -> Optional[float]:
        v = d.get(key)
        return None if v is None else float(v)

    return CostLine(
        event=str(d["event"]),
        island=str(d["island"]),
        handle=str(d["handle"]),
        time=float(d["time"]),
        role=str(d.get("role", "")),
        provider=str(d.get("provider", "")),
        usd_per_hour=opt("usd_per_hour"),
        source=str(d.get("source", "")),
        release_s=opt("release_s"),
    )


def read_lines(path: str | os.PathLike[str]) -> list[CostLine]:
    """Parse ``cost.jsonl``; a missing file is empty, a torn line is skipped."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for raw in text.splitlines():
        try:
            out.append(_parse(json.loads(raw)))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def read_store_lines(store: Any) -> list[CostLine]:
    """The resource ledger of the run in ``store`` (``cost/ledger/``), in order."""
    from yeto_core.stores.log import StoreLog

    out = []
    for _key, data in StoreLog(store, LEDGER_PREFIX, width=10).read():
        try:
            out.append(_parse(json.loads(data)))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def _per(usd: float, n: Optional[float]) -> Optional[float]:
    return round(usd / n, 8) if n else None


def cost_figures(sp: Spend, summary: Mapping[str, Any]) -> dict[str, Any]:
    """Spend by island, role and provider, and what the run's results cost.

    :param summary: the run's figures (:func:`yeto_core.events.summary.summarize`):
        ``groups_trained``, ``releases_published``, ``reward_first``, ``reward_last``.

    A reward point is 0.01 of mean reward (one percentage point for rewards in
    [0, 1]), gained from the first tenth of the appended groups to the last tenth
    of the trained ones; no gain: None.
    """
    trained = int(summary.get("groups_trained") or 0)
    releases = int(summary.get("releases_published") or 0)
    first, last = summary.get("reward_first"), summary.get("reward_last")
    gained = None
    if first is not None and last is not None:
        gained = round((float(last) - float(first)) * 100.0, 4)
    prices = {  # the latest price of each island and where it came from
        inc.island: {"usd_per_hour": inc.usd_per_hour, "source": inc.source}
        for inc in sp.incarnations
    }
    return {
        "usd_total": round(sp.total_usd, 6),
        "burn_usd_per_hour": round(sp.burn_usd_per_hour, 6),
        "by_island": {k: round(v, 6) for k, v in sp.by_island.items()},
        "by_role": {k: round(v, 6) for k, v in sp.by_role.items()},
        "by_provider": {k: round(v, 6) for k, v in sp.by_provider.items()},
        "incarnations": len(sp.incarnations),
        "groups_trained": trained,
        "releases_published": releases,
        "reward_points_gained": gained,
        "usd_per_trained_group": _per(sp.total_usd, trained),
        "usd_per_release": _per(sp.total_usd, releases),
        "usd_per_reward_point": _per(sp.total_usd, gained) if gained and gained > 0 else None,
        "prices": prices,
    }
