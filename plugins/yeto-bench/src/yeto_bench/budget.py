"""Budgeted traces of ``yeto bench scheduler``: the cost guard on a simulated priced fleet.

A fleet of sampler islands (each at its price per hour) and one trainer (at its
price) runs a trace on a simulated clock, as in :mod:`yeto_bench.scheduler`, with
the real parts of the head: the real :class:`~yeto_core.trainer.loop.TrainerLoop`
and S1 behind the guard's :class:`~yeto_core.cost.guard.GuardedScheduler`, the
real :class:`~yeto_core.trainer.lifecycle.DriverLifecycle` (fake CPU backend, real cuts
in a temporary dir store), the real resource ledger
(:class:`~yeto_core.cost.ledger.CostLedger`, in that store) and the guard's pure policy
(:func:`~yeto_core.cost.guard.guard_decide`), fed as the head feeds it.

Only the fleet is simulated: arrival ``i`` of the trace comes from sampler
``i mod N`` (a released sampler's arrivals never come), a sampler outage sends
nothing while it is still paid, a spot-price jump raises the samplers' price
(the provider reports it; the ledger records it at the next tick), a sampler's
release takes ``release_s``, a trainer start ``start_s``, a round ``round_s`` and
a drain with its cut ``cut_s``, and the head is blocked while it releases or
drains, as the real head is.

Every budgeted trace runs twice: without a budget (what the run would spend) and
with one below that; the bench reports both, and for the guarded run whether the
ledger and the bill (the provider's price timeline, a jump counted from the
moment it happened) stayed within the budget and whether the stop left a cut.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from yeto_bench.scheduler import HOUR, SimLifecycle, _Sim
from yeto_core.cost.guard import (
    Burn,
    GuardAction,
    GuardedScheduler,
    GuardInputs,
    Reaction,
    guard_decide,
)
from yeto_core.cost.ledger import CostLedger, cost_figures
from yeto_core.records import LifecycleState, StopReason
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, make_group
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle
from yeto_core.trainer.loop import Journal, LoopConfig, TrainerLoop
from yeto_core.trainer.s1 import S1Scheduler

S = LifecycleState

#: The default prices: a sampler GPU and a trainer node (dollars per hour).
SAMPLER_USD_PER_HOUR = 2.0
TRAINER_USD_PER_HOUR = 8.0


def budgeted_traces(horizon_s: float = 2 * HOUR) -> dict[str, dict[str, Any]]:
    """The budgeted traces: arrivals, sampler price changes and a budget each.

    Each budget (dollars per hour of the horizon) is below what the run would
    spend (the bench shows both), except ``steady_fits``, whose budget is enough
    for the whole trace.
    """
    hours = horizon_s / HOUR
    steady = [i * 6.0 for i in range(int(horizon_s / 6.0))]
    bursty = [
        h * 1800.0 + 300.0 + i * 1.0 for h in range(int(horizon_s / 1800.0)) for i in range(240)
    ]
    diurnal, t = [], 0.0
    while t < horizon_s:  # 0.02 to 0.3 groups/s over one "day" per horizon
        t += 1.0 / (0.02 + 0.28 * (1 - math.cos(2 * math.pi * t / horizon_s)) / 2)
        diurnal.append(t)
    outage = [a for a in steady if not (0.3 * horizon_s <= a < 0.6 * horizon_s)]
    jump = [(0.35 * horizon_s + 2.5, 3.0)]  # the samplers' spot price triples, between ticks
    return {
        "bursty": {"arrivals": bursty, "budget_usd": 6.0 * hours, "price_changes": []},
        "diurnal": {"arrivals": diurnal, "budget_usd": 6.0 * hours, "price_changes": []},
        "sampler_outage": {"arrivals": outage, "budget_usd": 6.0 * hours, "price_changes": []},
        "spot_price_jump": {"arrivals": steady, "budget_usd": 8.0 * hours, "price_changes": jump},
        "steady_fits": {"arrivals": steady, "budget_usd": 20.0 * hours, "price_changes": []},
    }


class _FleetSim(_Sim):
    """The trace's arrivals, arrival ``i`` from sampler ``i mod n``; released samplers send none."""

    def __init__(self, arrivals: list[float], cap_groups: int, n: int) -> None:
        super().__init__(arrivals, cap_groups)
        self.n = n
        self.active = set(range(n))
        self.dropped = 0

    def deliver(self) -> None:
        while self.next < len(self.queue) and self.queue[self.next] <= self.t:
            if self.next % self.n not in self.active:
                self.next += 1
                self.dropped += 1
                continue
            if self.buffer.head_position - self.buffer.watermark >= self.cap:
                return
            self.wait_s += self.t - self.queue[self.next]
            self.buffer.append(make_group(self.next, self.version, g=1))
            self.next += 1
        if self.next >= len(self.queue) and not self.buffer.data_ended():
            self.buffer.mark_data_end()


class _PricedLifecycle(SimLifecycle):
    """The simulated trainer whose drain (with its cut) takes ``cut_s``."""

    def __init__(self, sim: _Sim, driver: DriverLifecycle, start_s, round_s, cut_s) -> None:
        super().__init__(sim, driver, start_s, round_s)
        self.cut_s = cut_s

    def drain(self, reason):
        cut = super().drain(reason)
        self.sim.advance(self.cut_s)
        return cut

    def wait_ready(self) -> LifecycleState:
        """A stop waits for a starting trainer (paid meanwhile), as the real head does."""
        if self._ready_at is not None and self.sim.t < self._ready_at:
            self.sim.advance(self._ready_at - self.sim.t)
        return self.state()


def store_cut(store: Any, sim: _Sim) -> Any:
    return CutStore(store, keep=2, clock=sim.clock).latest_id()


def _billed_usd(ledger: CostLedger, true_price: Any, now: float) -> float:
    """The provider's bill: every incarnation at its price timeline (second by second)."""
    usd = 0.0
    for inc in ledger.spend(now).incarnations:
        end = inc.stopped_at if inc.stopped_at is not None else now
        usd += true_price(inc.island, inc.started_at, end)
    return usd


def simulate_budgeted(
    arrivals: list[float],
    *,
    budget_usd: float,
    price_changes: list[tuple[float, float]] = (),
    samplers: int = 4,
    sampler_usd_per_hour: float = SAMPLER_USD_PER_HOUR,
    trainer_usd_per_hour: float = TRAINER_USD_PER_HOUR,
    start_s: float = 120.0,
    round_s: float = 20.0,
    cut_s: float = 30.0,
    release_s: float = 10.0,
    groups_per_round: int = 8,
    a_hard: int = 2,
    tick_s: float = 5.0,
    soft_fraction: float = 0.8,
    min_samplers: int = 1,
) -> dict[str, Any]:
    """One priced fleet over one trace with the cost guard (``budget_usd`` 0: no budget)."""
    sim = _FleetSim(arrivals, (a_hard + 1) * groups_per_round, samplers)
    names = [f"sampler-{k}" for k in range(samplers)]
    changes = sorted(price_changes)

    def factor_at(t: float) -> float:
        f = 1.0
        for at, factor in changes:
            if t >= at:
                f = factor
        return f

    def provider_price(island: str, t: float) -> float:
        if island == "trainer":
            return trainer_usd_per_hour
        return sampler_usd_per_hour * factor_at(t)

    def true_price(island: str, a: float, b: float) -> float:
        points = [a] + [at for at, _ in changes if a < at < b] + [b]
        return sum(
            provider_price(island, lo) * (hi - lo) / 3600.0
            for lo, hi in zip(points, points[1:], strict=False)
        )

    decisions: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="yeto-bench-budget-") as tmp:
        store = DirStore(Path(tmp) / "store", fsync=False)
        roles = {n: "sampler" for n in names}

        def describe(island: str, handle: str) -> dict[str, Any]:
            return {
                "role": roles.get(island, "trainer"),
                "provider": "sim",
                "usd_per_hour": provider_price(island, sim.t),
                "source": "provider",
            }

        ledger = CostLedger(Path(tmp) / "run", {}, clock=sim.clock, store=store, describe=describe)
        releases = ReleaseStore(store, clock=sim.clock)
        driver = DriverLifecycle(
            lambda inc: FakeBackend(seed=0),
            sim.buffer,
            CutStore(store, keep=2, clock=sim.clock),
            releases,
            groups_per_round=groups_per_round,
            max_policy_age=a_hard,
            clock=sim.clock,
            workdir=Path(tmp) / "work",
        )
        life = _PricedLifecycle(sim, driver, start_s, round_s, cut_s)
        state: dict[str, Any] = {"last": None, "held": False, "launched_at": None}

        def on_loop_event(e: Any) -> None:
            handle = f"trainer-i{e.data.get('incarnation')}"
            if e.kind == "head_start":
                ledger.started("trainer", handle)
                state["launched_at"] = sim.t
            elif e.kind in ("head_stop", "head_release") and handle in ledger.open_handles():
                ledger.stopped("trainer", handle)

        def allow_start() -> bool:
            return state["last"] is None or state["last"].allow_trainer_start

        scheduler = (
            S1Scheduler() if budget_usd <= 0 else GuardedScheduler(S1Scheduler(), allow_start)
        )
        loop = TrainerLoop(
            scheduler,
            life,
            lambda: sim.buffer.backlog(driver.counters.policy_version, a_hard),
            lambda: releases.latest() is not None,
            Journal(None),
            LoopConfig(
                groups_per_round=groups_per_round,
                a_hard=a_hard,
                round_s=round_s,
                start_seconds_fallback=start_s,
                drain_limit_s=24 * HOUR,
                first_policy_start=False,
            ),
            clock=sim.clock,
            emit=on_loop_event,
        )
        running = dict.fromkeys(names, True)
        for n in names:
            ledger.started(n, f"{n}-i0")
        reaction = Reaction(tick_s)
        recorded_factor = 1.0

        def release(island: str) -> None:
            sim.advance(release_s)  # the head waits for the verified release
            ledger.stopped(island, f"{island}-i0", release_s=release_s)
            running[island] = False
            sim.active.discard(names.index(island))

        def inputs() -> GuardInputs:
            sp = ledger.spend(sim.t)
            prices = {i.island: i.usd_per_hour for i in sp.running()}
            st = life.state()
            trainer = None
            if st not in (S.STOPPED, S.FAILED, S.LEFT):
                stop = cut_s
                if st == S.STARTING and state["launched_at"] is not None:
                    stop += max(0.0, start_s - (sim.t - state["launched_at"]))
                trainer = Burn("trainer", prices.get("trainer", trainer_usd_per_hour), stop)
            react = reaction.seconds()
            return GuardInputs(
                now=sim.t,
                budget_usd=budget_usd,
                spent_usd=sp.total_usd,
                soft_fraction=soft_fraction,
                react_s=react,
                samplers=tuple(Burn(n, prices.get(n, 0.0), release_s) for n in names if running[n]),
                trainer=trainer,
                trainer_start=Burn("trainer", trainer_usd_per_hour, cut_s),
                trainer_start_s=start_s + react,
                min_samplers=min_samplers,
                trainer_held=state["held"],
                samplers_waiting=sim.buffer.head_position - sim.buffer.watermark >= sim.cap,
            )

        stopped_by = None
        stop_at = None
        cut_at_stop = None
        while True:
            sim.deliver()
            reaction.mark(sim.t)
            f = factor_at(sim.t)
            if f != recorded_factor:  # the provider reports the new price; the head records it
                recorded_factor = f
                for n in names:
                    if running[n]:
                        ledger.priced(n, f"{n}-i0", provider_price(n, sim.t), "provider")
            if budget_usd > 0:
                d = guard_decide(inputs())
                state["last"] = d
                if (
                    d.action != GuardAction.CONTINUE
                    or not decisions
                    or (decisions[-1]["reason"] != d.reason)
                ):
                    decisions.append(
                        {
                            "t": round(sim.t, 1),
                            "action": d.action.value,
                            "reason": d.reason,
                            "island": d.island,
                            "spent_usd": round(d.inputs.spent_usd, 4),
                            "projected_usd": round(d.projected_usd, 4),
                        }
                    )
                if d.action == GuardAction.STOP_RUN:
                    stopped_by, stop_at = f"budget ({d.reason})", sim.t
                    for n in names:
                        if running[n]:
                            release(n)
                    cut = loop.stop(StopReason.FINISHED)
                    # a trainer stopped earlier (S1's idle stop, the soft stage) left its cut
                    cut_at_stop = cut.cut_id if cut is not None else store_cut(store, sim)
                    break
                if d.action == GuardAction.RELEASE_SAMPLER:
                    release(d.island)
                elif d.action == GuardAction.STOP_TRAINER:
                    state["held"] = True
                    cut = loop.stop(StopReason.STOPPED)
                    cut_at_stop = cut.cut_id if cut is not None else cut_at_stop
            before = sim.t
            loop.tick()
            if loop.finished is not None:
                stopped_by = f"finished ({loop.finished})"
                for n in names:
                    if running[n]:
                        release(n)
                break
            if sim.t == before:
                sim.advance(tick_s)
        now = sim.t
        spent = ledger.spend(now)
        billed = _billed_usd(ledger, true_price, now)
        latest_cut = CutStore(store, keep=2, clock=sim.clock).latest_id()
        c = driver.counters
        figures = cost_figures(
            spent,
            {"groups_trained": c.trained_groups, "releases_published": c.policy_version},
        )
    return {
        "budget_usd": budget_usd or None,
        "usd_total": round(spent.total_usd, 4),
        "usd_billed": round(billed, 4),
        "over_budget": bool(budget_usd) and max(spent.total_usd, billed) > budget_usd,
        "stopped_by": stopped_by,
        "stop_at_s": round(stop_at, 1) if stop_at is not None else None,
        "cut_at_stop": cut_at_stop,
        "latest_cut": latest_cut,
        "trainer_running_at_end": life.state() not in (S.STOPPED, S.FAILED, S.LEFT),
        "groups_trained": c.trained_groups,
        "groups_arrived": sim.buffer.head_position,
        "groups_not_sampled": sim.dropped + (len(arrivals) - sim.next),
        "stale_groups": c.stale_groups,
        "usd_per_trained_group": figures["usd_per_trained_group"],
        "usd_per_release": figures["usd_per_release"],
        "by_role": figures["by_role"],
        "guard_actions": {
            a: sum(1 for d in decisions if d["action"] == a)
            for a in ("release_sampler", "stop_trainer", "stop_run")
        },
        "guard_decisions": decisions,
        "end_s": round(now, 1),
    }


def run_budgeted(horizon_s: float = 2 * HOUR, **kw: Any) -> dict[str, Any]:
    """Every budgeted trace without a budget and with one; the acceptance figures."""
    prices = {
        "sampler_usd_per_hour": kw.get("sampler_usd_per_hour", SAMPLER_USD_PER_HOUR),
        "trainer_usd_per_hour": kw.get("trainer_usd_per_hour", TRAINER_USD_PER_HOUR),
        "samplers": kw.get("samplers", 4),
    }
    results: dict[str, Any] = {}
    for name, tr in budgeted_traces(horizon_s).items():
        common = dict(kw, price_changes=tr["price_changes"])
        unguarded = simulate_budgeted(tr["arrivals"], budget_usd=0.0, **common)
        guarded = simulate_budgeted(tr["arrivals"], budget_usd=tr["budget_usd"], **common)
        results[name] = {
            "budget_usd": tr["budget_usd"],
            "price_changes": tr["price_changes"],
            "unguarded": {k: v for k, v in unguarded.items() if k != "guard_decisions"},
            "guarded": guarded,
        }
    guarded = [r["guarded"] for r in results.values()]
    stopped = [g for g in guarded if str(g["stopped_by"]).startswith("budget")]
    return {
        "prices": prices,
        "results": results,
        "summary": {
            "traces": len(guarded),
            "traces_over_budget": sum(1 for g in guarded if g["over_budget"]),
            "traces_stopped_by_budget": len(stopped),
            "budget_stops_without_cut": sum(
                1 for g in stopped if not g["cut_at_stop"] or g["trainer_running_at_end"]
            ),
            "unguarded_traces_over_budget": sum(
                1 for r in results.values() if r["unguarded"]["usd_total"] > r["budget_usd"]
            ),
            "goals": {"traces_over_budget": 0, "budget_stops_without_cut": 0},
        },
    }


def add_money(
    results: dict[str, Any],
    *,
    sampler_usd_per_hour: float = SAMPLER_USD_PER_HOUR,
    trainer_usd_per_hour: float = TRAINER_USD_PER_HOUR,
    samplers: int = 4,
) -> dict[str, Any]:
    """``usd_total`` and ``usd_per_trained_group`` for every result of the S1/always-on traces.

    Those fleets' samplers run the whole trace (``end_s``); the trainer is paid its
    ``paid_trainer_s``. Returns the prices used.
    """
    for per_trace in results.values():
        for r in per_trace.values():
            if not isinstance(r, dict) or "paid_trainer_s" not in r:
                continue
            usd = (
                samplers * sampler_usd_per_hour * float(r["end_s"])
                + trainer_usd_per_hour * float(r["paid_trainer_s"])
            ) / 3600.0
            r["usd_total"] = round(usd, 4)
            trained = r.get("groups_trained") or 0
            r["usd_per_trained_group"] = round(usd / trained, 6) if trained else None
    return {
        "sampler_usd_per_hour": sampler_usd_per_hour,
        "trainer_usd_per_hour": trainer_usd_per_hour,
        "samplers": samplers,
    }
