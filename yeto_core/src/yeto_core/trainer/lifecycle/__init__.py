"""Trainer lifecycles: JOIN → restore the newest cut → rounds → drain with a cut → LEAVE.

``DriverLifecycle`` runs the trainer in this process; ``RemoteTrainerLifecycle``
drives one in another process or cloud through a command channel in the
store, where an ``IslandTrainerAgent`` wraps a ``DriverLifecycle``.

States and transitions (anything else raises :class:`IllegalTransitionError`)::

    STOPPED  --start-->  STARTING --restored--> READY <--round--> TRAINING
    READY    --drain-->  DRAINING --cut-->      LEFT  --release--> STOPPED
    STARTING/READY/TRAINING/DRAINING --error--> FAILED --release--> STOPPED

A drain is only taken at a round boundary (READY): a round is never cut in half.
The stop reason picks the cut trigger (STOPPED → SCHEDULED, PREEMPTED → PREEMPT,
FINISHED → FINAL) and the LEAVE code (:data:`LEAVE_CODES`).

Remote channel (keys under the run's store), one object per line so that any
object store can hold it (an object cannot be appended to)::

    trainer/<incarnation>/commands/<seq:08d>.json   head → trainer (put_if_absent)
    trainer/<incarnation>/events/<seq:08d>.json     trainer → head (put_if_absent)

Reading ``commands/`` in key order gives the ``commands.jsonl`` of the design.
"""

from __future__ import annotations

from yeto_core.trainer.lifecycle.driver import DriverLifecycle
from yeto_core.trainer.lifecycle.remote import Channel, IslandTrainerAgent, RemoteTrainerLifecycle
from yeto_core.trainer.lifecycle.states import (
    LEAVE_CODES,
    TRANSITIONS,
    StateMachine,
    TrainerCounters,
    TrainerFailedError,
)

__all__ = [
    "LEAVE_CODES",
    "TRANSITIONS",
    "Channel",
    "DriverLifecycle",
    "IslandTrainerAgent",
    "RemoteTrainerLifecycle",
    "StateMachine",
    "TrainerCounters",
    "TrainerFailedError",
]
