"""The states of a trainer incarnation, its legal transitions, and what a driver counts.

States and transitions (anything else raises :class:`IllegalTransitionError`)::

    STOPPED  --start-->  STARTING --restored--> READY <--round--> TRAINING
    READY    --drain-->  DRAINING --cut-->      LEFT  --release--> STOPPED
    STARTING/READY/TRAINING/DRAINING --error--> FAILED --release--> STOPPED
"""

from __future__ import annotations

from typing import Optional

import attrs

from yeto_core.errors import IllegalTransitionError, YetoError
from yeto_core.records import LEAVE_FAILED, LifecycleState, StopReason

S = LifecycleState


#: LEAVE reason code per stop reason (and for a failed incarnation): ``StopReason.leave_code``.
LEAVE_CODES: dict[Optional[StopReason], str] = {
    **{r: r.leave_code for r in StopReason},
    None: LEAVE_FAILED,
}

#: Legal transitions of a trainer incarnation.
TRANSITIONS: dict[LifecycleState, frozenset[LifecycleState]] = {
    S.STOPPED: frozenset({S.STARTING}),
    S.STARTING: frozenset({S.READY, S.FAILED}),
    S.READY: frozenset({S.TRAINING, S.DRAINING, S.FAILED}),
    S.TRAINING: frozenset({S.READY, S.FAILED}),
    S.DRAINING: frozenset({S.LEFT, S.FAILED}),
    S.LEFT: frozenset({S.STOPPED}),
    S.FAILED: frozenset({S.STOPPED}),
}


class TrainerFailedError(YetoError):
    """A trainer incarnation failed (its state is FAILED; release it and start another)."""


class StateMachine:
    """The explicit state of one lifecycle; an illegal transition raises."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.state = S.STOPPED

    def go(self, new: LifecycleState, action: str) -> None:
        if new not in TRANSITIONS[self.state]:
            allowed = sorted(s.value for s in TRANSITIONS[self.state])
            raise IllegalTransitionError(
                f"{self.what}: cannot {action} in state {self.state.value} "
                f"(→ {new.value}); from {self.state.value} only {allowed} are allowed"
            )
        self.state = new

    def require(self, states: set[LifecycleState], action: str) -> None:
        if self.state not in states:
            raise IllegalTransitionError(
                f"{self.what}: cannot {action} in state {self.state.value}; "
                f"it needs one of {sorted(s.value for s in states)}"
            )


@attrs.frozen
class TrainerCounters:
    """What the driver owns and puts into each cut."""

    policy_version: int = 0
    trained_rounds: int = 0
    buffer_watermark: int = 0
    stale_groups: int = 0
    trained_groups: int = 0
    skipped_groups: int = 0
