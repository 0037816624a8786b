"""Scheduler S1 (start when enough waits, stop when idle longer than a start costs) and
the always-on baseline. Both are pure functions of :class:`SchedulerInputs`.

Rules of S1, in order (see ``docs/scheduler.md`` for the derivation of ``Q_on``):

1. ``failures >= max_failures`` → FINISH (``gave_up``): that many incarnations in a
   row failed without training a round.
2. data ended and less than one round waits → FINISH (``data_end``), in any state.
3. STOPPED: no policy release yet → START (``first_policy``); ``Q_on`` rounds wait →
   START (``backlog``); data ended and at least one round waits → START (``drain``);
   else HOLD.
4. READY with at least one round waiting → HOLD (``train``: the loop trains).
5. READY with nothing to train: a first-policy incarnation that has not trained a
   round yet is kept (``first_policy_keep``); idle for ``T_s`` → STOP (``idle``).
6. Anything else → HOLD.
"""

from __future__ import annotations

import math
from typing import Optional

from yeto_core.ports import TrainerScheduler
from yeto_core.records import Action, Decision, LifecycleState, SchedulerInputs

S = LifecycleState


def resolve_start_seconds(
    measured: Optional[float], fallback: float, fixed: Optional[float] = None
) -> float:
    """``T_s``: the fixed value when configured, else the last measured start, else the fallback."""
    if fixed is not None:
        return float(fixed)
    if measured is not None:
        return float(measured)
    return float(fallback)


def q_on(inputs: SchedulerInputs) -> int:
    """Backlog rounds that start the trainer: ``A_hard + 1``, or ``min(Q_s1, A_hard + 1)``.

    ``Q_s1 = ceil(2 T_s / (alpha * round_s))`` is the smallest backlog whose training
    time pays for a start and the idle tail before the stop within a factor
    ``1 + alpha`` (docs/scheduler.md).
    """
    cap = inputs.a_hard + 1
    if inputs.alpha is None or not inputs.round_s or inputs.alpha <= 0:
        return cap
    q_s1 = max(1, math.ceil(2.0 * inputs.start_s / (inputs.alpha * inputs.round_s)))
    return min(q_s1, cap)


def _finish_or_give_up(i: SchedulerInputs, q: int) -> Optional[Decision]:
    if i.failures >= i.max_failures:
        return Decision(Action.FINISH, "gave_up", i, q)
    if i.data_ended and i.backlog_rounds < 1:
        return Decision(Action.FINISH, "data_end", i, q)
    return None


def s1_decide(i: SchedulerInputs) -> Decision:
    """S1 (module docstring)."""
    q = q_on(i)
    end = _finish_or_give_up(i, q)
    if end is not None:
        return end
    if i.state == S.STOPPED:
        if not i.has_release:
            return Decision(Action.START, "first_policy", i, q)
        if i.backlog_rounds >= q:
            return Decision(Action.START, "backlog", i, q)
        if i.data_ended and i.backlog_rounds >= 1:
            return Decision(Action.START, "drain", i, q)
        return Decision(Action.HOLD, "wait_backlog", i, q)
    if i.state == S.READY:
        if i.backlog_rounds >= 1:
            return Decision(Action.HOLD, "train", i, q)
        if i.first_policy_incarnation and i.rounds_this_incarnation == 0:
            return Decision(Action.HOLD, "first_policy_keep", i, q)
        if i.idle_since is not None and i.now - i.idle_since >= i.start_s:
            return Decision(Action.STOP, "idle", i, q)
        return Decision(Action.HOLD, "idle_wait", i, q)
    return Decision(Action.HOLD, f"state_{i.state.value.lower()}", i, q)


def always_on_decide(i: SchedulerInputs) -> Decision:
    """The baseline: start whenever stopped, never stop for idleness; same FINISH rules."""
    q = 1
    end = _finish_or_give_up(i, q)
    if end is not None:
        return end
    if i.state == S.STOPPED:
        return Decision(Action.START, "always_on", i, q)
    if i.state == S.READY and i.backlog_rounds >= 1:
        return Decision(Action.HOLD, "train", i, q)
    return Decision(Action.HOLD, f"state_{i.state.value.lower()}", i, q)


class S1Scheduler(TrainerScheduler):
    """S1 as a plugin (``s1``)."""

    PLUGIN_NAME = "s1"

    def decide(self, inputs: SchedulerInputs) -> Decision:
        return s1_decide(inputs)


class AlwaysOnScheduler(TrainerScheduler):
    """The always-on baseline as a plugin (``always-on``)."""

    PLUGIN_NAME = "always-on"

    def decide(self, inputs: SchedulerInputs) -> Decision:
        return always_on_decide(inputs)
