"""``yeto bench scheduler``, part ``convertible``: a fleet with a convertible node.

The same arrival traces as the S1 bench (``builtin_traces``), read as the groups
that two fixed sampler nodes produce. Three fleets train the same number of
groups (every group of the trace):

- ``fixed_split``: three nodes held, two sample and one trains, always on;
- ``s1``: two sampler nodes held, the trainer on a third machine that S1 starts
  (cold, ``start_s``) and stops;
- ``convertible``: three nodes held, two fixed samplers and one convertible node
  that samples at the per-node rate of the trace (every second arrival of the
  trace is one it would produce) and runs the trainer when S1, gated by the real
  :func:`~yeto_core.conversion.convertible.decide_conversion`, converts it (``conversion_s``
  to drain its sampler and start the trainer warm; ``back_s`` to sample again).
  A conversion applies the P0-S rule to the node's group in flight: finished if
  it completes within ``drain_bound_s``, else abandoned and counted.

The decisions are the real pure functions (:func:`~yeto_core.trainer.s1.s1_decide` and
:func:`~yeto_core.conversion.convertible.decide_conversion`); the fleet, the clock (1 s
steps) and the trainer (``round_s`` per round of ``groups_per_round`` groups, a
round's groups older than ``a_hard`` versions consumed as stale) are simulated.
Figures: GPU-seconds paid, the time to train the trace's groups, stale and
abandoned groups, conversions, and dollars at ``price_per_hour`` per node.
"""

from __future__ import annotations

import collections
from typing import Any, Optional

from yeto_core.conversion.convertible import (
    IDLE,
    SAMPLER,
    TRAINER,
    ConversionInputs,
    NodeView,
    decide_conversion,
)
from yeto_core.records import LifecycleState, SchedulerInputs
from yeto_core.trainer.s1 import always_on_decide, s1_decide

S = LifecycleState
FLEETS = ("fixed_split", "s1", "convertible")


class _Fleet:
    """One fleet over one trace (module docstring)."""

    def __init__(self, kind: str, arrivals: list[float], p: dict[str, Any]) -> None:
        self.kind, self.p = kind, p
        self.fixed = collections.deque(sorted(arrivals))
        # the convertible node's own groups: the per-node share of the trace
        self.extra = collections.deque(sorted(arrivals)[1::2]) if kind == "convertible" else None
        self.target = len(arrivals)
        self.t = 0.0
        self.buffer: collections.deque[tuple[float, int]] = collections.deque()
        self.produced = self.trained = self.stale = self.abandoned = self.finished_in_flight = 0
        self.version = 0
        self.state = S.STOPPED
        self.ready_at: Optional[float] = None
        self.busy_until: Optional[float] = None
        self.idle_since: Optional[float] = None
        self.rounds_this = 0
        self.trainer_paid_s = 0.0
        self.trainer_on_since: Optional[float] = None
        self.node_role = SAMPLER  # the convertible node
        self.node_back_at: Optional[float] = None
        self.conversions = 0
        self.starts = 0
        self.ages: list[float] = []
        self.decisions: collections.Counter[str] = collections.Counter()
        self.done_at: Optional[float] = None

    # -- the samplers ------------------------------------------------------------------

    def _cap(self) -> int:
        return (self.p["a_hard"] + 1) * self.p["groups_per_round"]

    def _append(self, at: float) -> None:
        if self.produced >= self.target:
            return
        self.buffer.append((at, self.version))
        self.produced += 1

    def deliver(self) -> None:
        while self.fixed and self.fixed[0] <= self.t and len(self.buffer) < self._cap():
            self.fixed.popleft()
            self._append(self.t)
        if self.extra is not None:
            if (
                self.node_role == IDLE
                and self.node_back_at is not None
                and self.t >= self.node_back_at
            ):
                self.node_role, self.node_back_at = SAMPLER, None
            while self.extra and self.extra[0] <= self.t:
                x = self.extra.popleft()
                if self.node_role == SAMPLER and len(self.buffer) < self._cap():
                    self._append(self.t)
                elif self.node_role == SAMPLER:
                    self.extra.appendleft(x)  # waits at the cap like the others
                    break
                # not sampling: the node never produces this group

    def data_ended(self) -> bool:
        return self.produced >= self.target

    # -- the trainer -------------------------------------------------------------------

    def _pay_trainer(self, on: bool) -> None:
        if on and self.trainer_on_since is None:
            self.trainer_on_since = self.t
        if not on and self.trainer_on_since is not None:
            self.trainer_paid_s += self.t - self.trainer_on_since
            self.trainer_on_since = None

    def _train_round(self) -> None:
        gpr, a_hard = self.p["groups_per_round"], self.p["a_hard"]
        take = min(gpr, len(self.buffer))
        for _ in range(take):
            at, v = self.buffer.popleft()
            if self.version - v > a_hard:
                self.stale += 1
            else:
                self.trained += 1
                self.ages.append(self.t - at)
        self.busy_until = self.t + self.p["round_s"]
        self.rounds_this += 1
        # samplers reload the release of the round being trained while it trains
        self.version += 1

    def _inputs(self) -> SchedulerInputs:
        p = self.p
        start_s = p["conversion_s"] if self.kind == "convertible" else p["start_s"]
        groups, gpr = len(self.buffer), p["groups_per_round"]
        if self.data_ended() and groups % gpr:  # the short last round counts as a round
            groups += gpr - groups % gpr
        return SchedulerInputs(
            now=self.t,
            state=self.state,
            backlog_groups=groups,
            backlog_samples=groups,
            groups_per_round=p["groups_per_round"],
            a_hard=p["a_hard"],
            start_s=start_s,
            idle_since=self.idle_since,
            data_ended=self.data_ended(),
            failures=0,
            max_failures=3,
            has_release=True,
            first_policy_incarnation=False,
            rounds_this_incarnation=self.rounds_this,
            alpha=None,
            round_s=p["round_s"],
        )

    def _conversion(self, d: Any) -> str:
        """The convertible fleet's gate (as ConversionGate in the head): the action to take."""
        p = self.p
        trainer_node = "flex-0" if self.node_role == TRAINER else None
        nodes = (
            NodeView("sampler-0", SAMPLER, False, p["price_per_hour"]),
            NodeView("sampler-1", SAMPLER, False, p["price_per_hour"]),
            NodeView("flex-0", self.node_role, True, p["price_per_hour"], in_flight=1),
        )
        rate = self._rate()
        cd = decide_conversion(
            ConversionInputs(
                now=self.t,
                scheduler_action=d.action.value,
                scheduler_reason=d.reason,
                trainer_node=trainer_node,
                backlog_groups=len(self.buffer),
                groups_per_round=p["groups_per_round"],
                q_on_rounds=d.q_on,
                arrival_groups_per_s=rate,
                conversion_s=p["conversion_s"] + p["back_s"],
                nodes=nodes,
                data_ended=self.data_ended(),
            )
        )
        self.decisions[f"{cd.action}:{cd.reason}"] += 1
        if self.state == S.STOPPED and cd.action == "to_trainer":
            return "START"
        if d.action.value == "START":
            return "HOLD"
        if d.action.value == "STOP" and cd.action == "hold":
            return "HOLD"
        return d.action.value

    def _rate(self) -> float:
        """Groups per second appended (as the head measures it: ConversionGate.arrival_rate)."""
        window = self._window
        window.append((self.t, self.produced))
        while len(window) > 2 and self.t - window[1][0] >= 30.0:
            window.popleft()

        def rate(since: float) -> float:
            part = [(t, n) for t, n in window if t >= since] or [window[-1]]
            (t0, n0), (t1, n1) = part[0], part[-1]
            return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

        # the lower of the 30 s and 5 s rates, as ConversionGate.arrival_rate
        return min(rate(self.t - 30.0), rate(self.t - 5.0))

    _window: collections.deque[tuple[float, int]]

    def _to_trainer(self) -> None:
        p = self.p
        self.conversions += 1
        nxt = self.extra[0] if self.extra else None
        if nxt is not None and nxt - self.t <= p["drain_bound_s"] and not self.data_ended():
            self.extra.popleft()
            self._append(nxt)  # P0-S: the in-flight group finishes within the bound
            self.finished_in_flight += 1
        elif nxt is not None and nxt - self.t <= p["group_s"] and not self.data_ended():
            self.extra.popleft()
            self.abandoned += 1  # in flight, past the bound: abandoned and counted
        self.node_role = TRAINER

    def step(self) -> None:
        p = self.p
        self.deliver()
        if self.busy_until is not None:
            if self.t < self.busy_until:
                return
            self.busy_until = None
        if self.state == S.STARTING and self.ready_at is not None and self.t >= self.ready_at:
            self.state, self.ready_at = S.READY, None
        rounds = len(self.buffer) // p["groups_per_round"]
        if self.state == S.READY and rounds < 1 and not (self.data_ended() and self.buffer):
            if self.idle_since is None:
                self.idle_since = self.t
        else:
            self.idle_since = None
        i = self._inputs()
        d = always_on_decide(i) if self.kind == "fixed_split" else s1_decide(i)
        action = self._conversion(d) if self.kind == "convertible" else d.action.value
        if action == "START":
            self.starts += 1
            self.state, self.rounds_this = S.STARTING, 0
            start = p["conversion_s"] if self.kind == "convertible" else p["start_s"]
            self.ready_at = self.t + start
            self._pay_trainer(True)
            if self.kind == "convertible":
                self._to_trainer()
        elif action in ("STOP", "FINISH") and self.state == S.READY:
            self.state = S.STOPPED
            self.idle_since = None
            self._pay_trainer(False)
            if self.kind == "convertible" and self.node_role == TRAINER:
                self.node_role, self.node_back_at = IDLE, self.t + p["back_s"]
                self.conversions += 1
        elif self.state == S.READY and (rounds >= 1 or (self.data_ended() and self.buffer)):
            self._train_round()
        if self.trained + self.stale >= self.target and self.done_at is None:
            self.done_at = self.t

    def run(self, limit_s: float) -> dict[str, Any]:
        self._window = collections.deque()
        while self.done_at is None and self.t < limit_s:
            self.step()
            self.t += 1.0
        end = self.done_at if self.done_at is not None else self.t
        self._pay_trainer(False)
        p = self.p
        nodes_held = 2 if self.kind == "s1" else 3
        if self.kind == "s1":
            gpu_s = 2 * end + self.trainer_paid_s
        else:
            gpu_s = nodes_held * end
        usd = gpu_s / 3600.0 * p["price_per_hour"]
        return {
            "gpu_s_paid": round(gpu_s, 1),
            "time_to_train_s": round(end, 1),
            "groups_target": self.target,
            "groups_trained": self.trained,
            "stale_groups": self.stale,
            "abandoned_groups": self.abandoned,
            "in_flight_finished_at_conversion": self.finished_in_flight,
            "conversions": self.conversions if self.kind == "convertible" else 0,
            "trainer_starts": self.starts,
            "trainer_paid_s": round(self.trainer_paid_s, 1),
            "mean_sample_age_s": round(sum(self.ages) / len(self.ages), 1) if self.ages else None,
            "usd_total": round(usd, 4),
            "usd_per_trained_group": round(usd / self.trained, 6) if self.trained else None,
            "finished": self.done_at is not None,
            "decisions": dict(sorted(self.decisions.items())) if self.decisions else {},
        }


def simulate_fleets(
    arrivals: list[float],
    *,
    start_s: float = 120.0,
    conversion_s: float = 40.0,
    back_s: float = 20.0,
    drain_bound_s: float = 5.0,
    group_s: float = 20.0,
    round_s: float = 20.0,
    groups_per_round: int = 8,
    a_hard: int = 2,
    price_per_hour: float = 2.0,
) -> dict[str, Any]:
    """The three fleets (module docstring) over one trace."""
    p = dict(
        start_s=start_s,
        conversion_s=conversion_s,
        back_s=back_s,
        drain_bound_s=drain_bound_s,
        group_s=group_s,
        round_s=round_s,
        groups_per_round=groups_per_round,
        a_hard=a_hard,
        price_per_hour=price_per_hour,
    )
    limit = (max(arrivals) if arrivals else 0.0) * 3 + 10 * 3600.0
    return {kind: _Fleet(kind, arrivals, p).run(limit) for kind in FLEETS}


def run_convertible_bench(traces: dict[str, list[float]], **kw: Any) -> dict[str, Any]:
    """Every trace through the three fleets, with a summary against the two baselines."""
    results = {name: simulate_fleets(arr, **kw) for name, arr in traces.items()}

    def ratio(a: Any, b: Any) -> Optional[float]:
        return round(a / b, 3) if a is not None and b else None

    summary = {
        name: {
            "gpu_s_vs_fixed_split": ratio(
                r["convertible"]["gpu_s_paid"], r["fixed_split"]["gpu_s_paid"]
            ),
            "gpu_s_vs_s1": ratio(r["convertible"]["gpu_s_paid"], r["s1"]["gpu_s_paid"]),
            "time_vs_fixed_split": ratio(
                r["convertible"]["time_to_train_s"], r["fixed_split"]["time_to_train_s"]
            ),
            "time_vs_s1": ratio(r["convertible"]["time_to_train_s"], r["s1"]["time_to_train_s"]),
            "conversions": r["convertible"]["conversions"],
            "stale_groups": {k: v["stale_groups"] for k, v in r.items()},
            "abandoned_groups": r["convertible"]["abandoned_groups"],
        }
        for name, r in results.items()
    }
    return {"params": dict(kw), "results": results, "summary": summary}
