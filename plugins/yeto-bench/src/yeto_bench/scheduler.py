"""``yeto bench scheduler``: trace-driven simulation of S1 against the always-on baseline.

The simulation runs the real :class:`~yeto_core.trainer.loop.TrainerLoop`, the real
schedulers and the real :class:`~yeto_core.trainer.lifecycle.DriverLifecycle` (CPU fake
backend, real cuts in a temporary dir store) on a simulated clock. Only the fleet
is simulated: group arrivals come from a trace, a trainer start takes ``start_s``
seconds and a round ``round_s`` seconds, and samplers wait while the backlog is at
its cap (``A_hard + 1`` rounds by default, so no group can go stale).

The fleet is full-parameter by default (``tuning="full"``): its samplers serve the
base model, which is policy version 0, so the head does not start the trainer to
publish a first policy (``LoopConfig.first_policy_start=False``). A LoRA fleet
(``tuning="lora"``) waits for the first adapter release, so S1 starts the trainer at
t=0 (rule ``first_policy``); the bench reports that variant as ``s1-lora``.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any, Optional

import click

from yeto_core.cli import exit_codes
from yeto_core.ports import TrainerLifecycle
from yeto_core.records import LifecycleState
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, MemoryBuffer, make_group
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle
from yeto_core.trainer.loop import Journal, LoopConfig, TrainerLoop
from yeto_core.trainer.s1 import AlwaysOnScheduler, S1Scheduler

S = LifecycleState
HOUR = 3600.0


def builtin_traces(horizon_s: float = 4 * HOUR) -> dict[str, list[float]]:
    """Arrival times (seconds) of groups for the built-in traces (deterministic)."""
    steady = [i * 10.0 for i in range(int(horizon_s / 10.0))]
    bursty = [h * HOUR + 600.0 + i * 1.5 for h in range(int(horizon_s / HOUR)) for i in range(400)]
    diurnal, t, period = [], 0.0, horizon_s
    while t < horizon_s:  # rate between 0.01 and 0.2 groups/s, one "day" per horizon
        rate = 0.01 + 0.19 * (1 - math.cos(2 * math.pi * t / period)) / 2
        t += 1.0 / rate
        diurnal.append(t)
    outage = [t for t in steady if not (HOUR <= t < 2.5 * HOUR)]
    return {"steady": steady, "bursty": bursty, "diurnal": diurnal, "sampler_outage": outage}


class _Sim:
    """The simulated clock, the sampler fleet (a trace with a backlog cap) and the buffer."""

    def __init__(self, arrivals: list[float], cap_groups: int) -> None:
        self.t = 0.0
        self.queue = sorted(arrivals)
        self.next = 0
        self.cap = cap_groups
        self.buffer = MemoryBuffer(clock=lambda: self.t)
        self.version = 0
        self.wait_s = 0.0

    def clock(self) -> float:
        return self.t

    def deliver(self) -> None:
        while self.next < len(self.queue) and self.queue[self.next] <= self.t:
            if self.buffer.head_position - self.buffer.watermark >= self.cap:
                return  # samplers wait at the cap
            self.wait_s += self.t - self.queue[self.next]
            self.buffer.append(make_group(self.next, self.version, g=1))
            self.next += 1
        if self.next >= len(self.queue) and not self.buffer.data_ended():
            self.buffer.mark_data_end()

    def advance(self, dt: float) -> None:
        end = self.t + dt
        while self.next < len(self.queue) and self.queue[self.next] <= end:
            self.t = max(self.t, self.queue[self.next])
            before = self.next
            self.deliver()
            if self.next == before:
                break  # at the cap until the trainer commits
        self.t = end
        self.deliver()


class SimLifecycle(TrainerLifecycle):
    """A DriverLifecycle whose start takes ``start_s`` and rounds ``round_s`` simulated seconds."""

    PLUGIN_NAME = "sim"

    def __init__(self, sim: _Sim, driver: DriverLifecycle, start_s: float, round_s: float) -> None:
        self.sim, self.driver = sim, driver
        self.start_s = start_s
        self.round_s = round_s
        self._ready_at: Optional[float] = None
        self._paid_from: Optional[float] = None
        self.paid_s = self.busy_s = 0.0
        self.starts = 0
        self.ages: list[float] = []
        self._positions: list[int] = []
        driver._emit = self._on_event

    def _on_event(self, e: Any) -> None:
        if e.kind == "trainer_round":
            self._positions = list(e.data["positions"])

    @property
    def counters(self):
        return self.driver.counters

    @property
    def start_seconds(self) -> Optional[float]:
        return self.start_s

    def state(self) -> LifecycleState:
        if self._ready_at is not None:
            if self.sim.t < self._ready_at:
                return S.STARTING
            self.driver.start(self._inc, None)
            self._ready_at = None
        return self.driver.state()

    def start(self, incarnation: int, cut: Any) -> None:
        self._inc, self._ready_at, self._paid_from = (
            incarnation,
            self.sim.t + self.start_s,
            self.sim.t,
        )
        self.starts += 1

    def train(self, rounds: int, for_s: Optional[float] = None) -> int:
        done = 0
        began = self.sim.t
        for _ in range(rounds):
            if done and for_s is not None and self.sim.t - began >= for_s:
                break
            if not self.driver.train(1):
                break
            # Samplers reload the release of the round being trained while it trains.
            self.sim.version = self.driver.counters.policy_version
            self.sim.advance(self.round_s)
            self.busy_s += self.round_s
            entries = self.sim.buffer.entries()
            self.ages.extend(self.sim.t - entries[p].appended_at for p in self._positions)
            done += 1
        return done

    def drain(self, reason):
        return self.driver.drain(reason)

    def release(self) -> None:
        if self.driver.state() != S.STOPPED:
            self.driver.release()
        self._ready_at = None
        if self._paid_from is not None:
            self.paid_s += self.sim.t - self._paid_from
            self._paid_from = None


def simulate(
    scheduler: str,
    arrivals: list[float],
    *,
    start_s: float = 120.0,
    round_s: float = 20.0,
    groups_per_round: int = 8,
    a_hard: int = 2,
    tick_s: float = 5.0,
    alpha: Optional[float] = None,
    tuning: str = "full",
) -> dict[str, Any]:
    """Run one scheduler over one trace; return its figures.

    ``tuning``: ``full`` (samplers serve the base model as policy 0) or ``lora``
    (samplers wait for the first release: S1 starts the trainer for it at t=0).
    """
    if tuning not in ("full", "lora"):
        raise ValueError(f"tuning must be 'full' or 'lora', got {tuning!r}")
    sim = _Sim(arrivals, cap_groups=(a_hard + 1) * groups_per_round)
    with tempfile.TemporaryDirectory(prefix="yeto-bench-sched-") as tmp:
        store = DirStore(Path(tmp) / "store", fsync=False)
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
        life = SimLifecycle(sim, driver, start_s, round_s)
        cfg = LoopConfig(
            groups_per_round=groups_per_round,
            a_hard=a_hard,
            alpha=alpha,
            round_s=round_s,
            start_seconds_fallback=start_s,
            drain_limit_s=24 * HOUR,
            first_policy_start=tuning == "lora",
        )
        sched = S1Scheduler() if scheduler == "s1" else AlwaysOnScheduler()
        loop = TrainerLoop(
            sched,
            life,
            lambda: sim.buffer.backlog(driver.counters.policy_version, a_hard),
            lambda: releases.latest() is not None,
            Journal(None),
            cfg,
            clock=sim.clock,
        )
        while loop.finished is None:
            sim.deliver()
            before = sim.t
            loop.tick()
            if sim.t == before and loop.finished is None:
                sim.advance(tick_s)
        c = driver.counters
    ages = life.ages
    return {
        "paid_trainer_s": round(life.paid_s, 1),
        "busy_s": round(life.busy_s, 1),
        "paid_over_busy": round(life.paid_s / life.busy_s, 3) if life.busy_s else None,
        "groups_trained": c.trained_groups,
        "groups_arrived": len(arrivals),
        "groups_left_in_buffer": sim.buffer.head_position - sim.buffer.watermark,
        "stale_groups": c.stale_groups,
        "mean_sample_age_s": round(sum(ages) / len(ages), 1) if ages else None,
        "starts": life.starts,
        "groups_skipped_by_reason": {r: n for r, n in driver.skipped_by_reason.items() if n},
        "sampler_wait_s": round(sim.wait_s, 1),
        "end_s": round(sim.t, 1),
    }


def _read_trace(path: str) -> list[float]:
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            v = json.loads(line)
            out.append(float(v["t"] if isinstance(v, dict) else v))
        except (ValueError, KeyError, TypeError):
            raise click.BadParameter(
                f"{path}:{n}: expected a number or an object with 't' (seconds), got {line[:60]!r}"
            ) from None
    return out


def run_bench(
    traces: dict[str, list[float]], *, budgeted: bool = True, **kw: Any
) -> dict[str, Any]:
    results = {
        name: {
            "s1": simulate("s1", arr, **kw),
            "always-on": simulate("always-on", arr, **kw),
            "s1-lora": simulate("s1", arr, tuning="lora", **kw),
        }
        for name, arr in traces.items()
    }
    key = "bursty" if "bursty" in results else next(iter(results))
    s1, ao = results[key]["s1"], results[key]["always-on"]

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    summary = {
        "trace": key,
        "s1_paid_over_busy": s1["paid_over_busy"],
        "always_on_paid_over_busy": ao["paid_over_busy"],
        "s1_cost_vs_always_on": ratio(s1["paid_trainer_s"], ao["paid_trainer_s"]),
        "s1_age_vs_always_on": ratio(s1["mean_sample_age_s"], ao["mean_sample_age_s"]),
        "s1_stale_groups": sum(r["s1"]["stale_groups"] for r in results.values()),
        "tuning": "full",
        "lora_s1_paid_over_busy": results[key]["s1-lora"]["paid_over_busy"],
        "lora_s1_cost_vs_always_on": ratio(
            results[key]["s1-lora"]["paid_trainer_s"], ao["paid_trainer_s"]
        ),
        "lora_s1_age_vs_always_on": ratio(
            results[key]["s1-lora"]["mean_sample_age_s"], ao["mean_sample_age_s"]
        ),
        "lora_s1_stale_groups": sum(r["s1-lora"]["stale_groups"] for r in results.values()),
        "goals": {
            "s1_paid_over_busy": 1.3,
            "s1_cost_vs_always_on": 0.6,
            "s1_age_vs_always_on": 1.5,
            "s1_stale_groups": 0,
        },
    }
    out = {"bench": "scheduler", "params": kw, "results": results, "summary": summary}
    out["convertible"] = convertible_part(traces, kw)
    _add_budget_results(out, budgeted=budgeted)
    return out


def convertible_part(traces: dict[str, list[float]], kw: dict[str, Any]) -> dict[str, Any]:
    """The fleet with a convertible node on the same traces (yeto_bench.convert_sim)."""
    from yeto_bench.convert_sim import run_convertible_bench

    keys = ("start_s", "round_s", "groups_per_round", "a_hard")
    return run_convertible_bench(traces, **{k: kw[k] for k in keys if k in kw})


def _add_budget_results(out: dict[str, Any], *, budgeted: bool) -> None:
    """Money in every result, and the cost guard's budgeted traces (yeto_bench.budget)."""
    from yeto_bench.budget import add_money, run_budgeted

    out["prices"] = add_money(out["results"])
    key = out["summary"]["trace"]
    out["summary"]["usd_total"] = out["results"][key]["s1"]["usd_total"]
    out["summary"]["usd_per_trained_group"] = out["results"][key]["s1"]["usd_per_trained_group"]
    if budgeted:
        out["budgeted"] = run_budgeted()
        out["summary"]["budgeted_traces_over_budget"] = out["budgeted"]["summary"][
            "traces_over_budget"
        ]


@click.command("scheduler", epilog=exit_codes())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the default output).")
@click.option(
    "--trace",
    "trace_file",
    type=click.Path(exists=True, dir_okay=False),
    help="JSONL of group arrival times (seconds).",
)
@click.option(
    "--start-s", type=float, default=120.0, show_default=True, help="Trainer start time T_s."
)
@click.option(
    "--round-s", type=float, default=20.0, show_default=True, help="Seconds per training round."
)
@click.option("--groups-per-round", type=int, default=8, show_default=True)
@click.option("--a-hard", type=int, default=2, show_default=True, help="Hard policy-age limit.")
@click.option(
    "--alpha", type=float, default=None, help="S1 cost slack (Q_on = min(Q_s1, A_hard+1))."
)
@click.option(
    "--hours", type=float, default=4.0, show_default=True, help="Length of the built-in traces."
)
@click.option(
    "--budgeted/--no-budgeted",
    default=None,
    help="Also run the cost guard's built-in budgeted traces (docs/cost.md); "
    "default: yes, unless --trace is given.",
)
def command(
    as_json, trace_file, start_s, round_s, groups_per_round, a_hard, alpha, hours, budgeted
):
    """Simulate S1 and always-on on arrival traces; print paid/busy seconds, ages, stale groups."""
    traces = (
        {Path(trace_file).stem: _read_trace(trace_file)}
        if trace_file
        else builtin_traces(hours * HOUR)
    )
    out = run_bench(
        traces,
        start_s=start_s,
        round_s=round_s,
        groups_per_round=groups_per_round,
        a_hard=a_hard,
        alpha=alpha,
        budgeted=not trace_file if budgeted is None else budgeted,
    )
    click.echo(json.dumps(out, indent=None if as_json else 2, sort_keys=True))
