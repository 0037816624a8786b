"""The head's state between ticks, the backstops it checks, and what it reports about
its run: ``status.json``, ``summary.json`` and the rewards behind them
(:class:`HeadReport`, a mixin of :class:`~yeto_core.head.run.Head`).

It reads the head's buffer, lifecycle, cost ledger and event streams and writes
only the run dir's reports; it takes no decision.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

import attrs

from yeto_core.cost.ledger import cost_figures
from yeto_core.errors import YetoError
from yeto_core.events.stream import read_all
from yeto_core.events.summary import eval_summary, summarize
from yeto_core.head.run_dir import EXIT_OK, SUMMARY_FILE, write_json_atomic


def backstop_reason(
    *,
    cost_usd: float,
    budget_usd: float,
    elapsed_s: float,
    wall_clock_s: float,
    silent_s: float,
    silence_s: float,
) -> Optional[str]:
    """Which backstop (``budget``, ``wall_clock``, ``silence``) is hit, if any; 0 = no limit."""
    if budget_usd > 0 and cost_usd >= budget_usd:
        return "budget"
    if wall_clock_s > 0 and elapsed_s >= wall_clock_s:
        return "wall_clock"
    if silence_s > 0 and silent_s >= silence_s:
        return "silence"
    return None


@attrs.define
class HeadState:
    """What the head tracks between ticks (not persisted: a restarted head starts fresh)."""

    started_at: float
    last_head_position: int = -1
    last_arrival_at: float = 0.0
    sampler_restarts: dict[str, int] = attrs.field(factory=dict)
    stop_reason: Optional[str] = None
    exit_code: int = EXIT_OK
    trainer_starts: int = 0
    trainer_stops: int = 0
    finishing: bool = False
    last_rewards: list[float] = attrs.field(factory=list)
    #: the newest evaluation (``[eval]``): :func:`eval_status` of the ``eval`` stream
    last_eval: Optional[dict[str, Any]] = None


class HeadReport:
    """The head's reports; the attributes it reads are :class:`~yeto_core.head.run.Head`'s."""

    clock: Any
    buffer: Any
    state: Any
    trainer_loop: Any
    lifecycle: Any
    config: Any
    costs: Any
    conversion: Any
    sampler_handles: dict[str, str]
    events: Any
    store: Any
    run_dir: Any
    _stop_requested: Optional[str]
    provider_of: Any  # HeadIslands.provider_of
    read_backlog: Any  # HeadTrainer.read_backlog

    def status(self) -> dict[str, Any]:
        """The status dict (``status.json``, the progress display)."""
        now = self.clock()
        b = self.read_backlog()  # HeadTrainer: kept for the scheduler's decision that follows
        if b.head_position != self.state.last_head_position:
            self.state.last_head_position = b.head_position
            self.state.last_arrival_at = now
        loop = self.trainer_loop
        lifecycle_state = self.lifecycle.state().value if self.lifecycle is not None else "STOPPED"
        report = dict(self.lifecycle.report()) if self.lifecycle is not None else {}
        return {
            "run": self.config.name,
            "state": "finishing" if self.state.finishing else "running",
            "pid": os.getpid(),
            "updated_at": now,
            "elapsed_s": round(now - self.state.started_at, 1),
            "backlog_groups": b.groups,
            "groups_appended": b.head_position,
            "watermark": b.watermark,
            "trainer_state": lifecycle_state,
            "policy_version": report.get("policy_version"),
            "trained_rounds": report.get("trained_rounds"),
            "incarnation": loop.incarnation if loop is not None else None,
            "mean_reward": _mean(self.state.last_rewards),
            "cost_usd": round(self.costs.total_usd(now), 4),
            "samplers": {
                island: str(self.provider_of(island).status(h).value)
                for island, h in self.sampler_handles.items()
            },
            "convertible_nodes": self.conversion.capacity(),
            "stop_reason": self._stop_requested,
            **({"eval": self.state.last_eval} if self.state.last_eval else {}),
        }

    def update_rewards(self, trainer_events: list[Any]) -> None:
        """The mean reward of the last trained groups (from the trainer's event stream)."""
        rewards: list[float] = []
        for e in trainer_events:
            if e.kind == "round_trained":
                rewards.extend(float(r) for r in e.data.get("rewards", ()))
        self.state.last_rewards = rewards[-16:]

    def update_eval(self, eval_events: list[Any]) -> None:
        """The newest and best evaluation (from the ``eval`` stream; ``[eval]``)."""
        self.state.last_eval = eval_status(eval_summary({"eval": eval_events}))

    def write_summary(self, **extra: Any) -> dict[str, Any]:
        """``summary.json``: figures from the event streams, the buffer and the cost ledger."""
        self.events.flush()
        streams = read_all(self.store)
        appended = self.appended_rewards()
        now = self.clock()
        first_up = min((ln.time for ln in self.costs.lines()), default=self.state.started_at)
        summary = summarize(
            streams,
            appended=appended,
            cost_usd=self.costs.total_usd(now),
            wall_s=now - min(first_up, self.state.started_at),
            extra=extra,
        )
        summary["cost"] = cost_figures(self.costs.spend(now), summary)
        write_json_atomic(self.run_dir / SUMMARY_FILE, summary)
        return summary

    def appended_rewards(self) -> dict[int, float]:
        """Mean reward of the first tenth of the appended groups, read from the buffer."""
        entries = self.buffer.entries(0)
        n = _ceil_tenth(len(entries))
        out: dict[int, float] = {}
        # a quarantined index line's stand-in has no payload: no group to read
        todo = [e for e in entries[:n] if e.payload]
        # read at once where the buffer can (a pack of several groups is read once)
        many = self.buffer.load_many(todo) if len(todo) > 1 else None
        for i, entry in enumerate(todo):
            try:
                if many is None:
                    group = self.buffer.load(entry)
                else:
                    group, error = many[i]
                    if error is not None:
                        raise error
            except YetoError:  # a damaged payload (skipped as unconvertible by the trainer)
                out[entry.position] = math.nan
                continue
            rewards = [float(s.reward) for s in group.samples]
            out[entry.position] = sum(rewards) / len(rewards) if rewards else 0.0
        for entry in entries[n:]:
            out.setdefault(entry.position, math.nan)
        return out


def eval_status(evaluated: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The evaluation figures of ``status.json``: the newest release evaluated, its
    metrics, the best per metric and how many releases were evaluated (None: none)."""
    if not evaluated or evaluated.get("last") is None:
        return None
    last = evaluated["last"]
    return {
        "version": last["version"],
        "release_id": last["release_id"],
        "metrics": dict(last["metrics"]),
        "best": {k: v["value"] for k, v in evaluated["best"].items()},
        "releases": len(evaluated["releases"]),
    }


def _mean(xs: list[float]) -> Optional[float]:
    return round(sum(xs) / len(xs), 4) if xs else None


def _ceil_tenth(n: int) -> int:
    return max(1, math.ceil(n / 10)) if n else 0
