"""Records shared across ports. All are ``@attrs.frozen``; change them with ``attrs.evolve``.

JSON goes through :mod:`yeto_core.serde`. Arrays (token ids, log-probs, masks,
routed experts) never travel as JSON: they go into one safetensors payload per
group (see :mod:`yeto_core.sample_buffer`).
"""

from __future__ import annotations

import enum
from typing import Any, Optional

import attrs
import numpy as np


class SampleStatus(str, enum.Enum):
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@attrs.frozen(eq=False)
class Sample:
    """One sampled sequence: prompt followed by response.

    ``logprobs`` and ``loss_mask`` cover the response only (length
    ``len(tokens) - prompt_len``). ``routed_experts`` (MoE engines) has shape
    ``(len(tokens) - 1, layers, top_k)``.
    """

    tokens: np.ndarray
    prompt_len: int
    logprobs: np.ndarray
    loss_mask: np.ndarray
    reward: float
    weight_version: int
    status: SampleStatus = SampleStatus.COMPLETED
    routed_experts: Optional[np.ndarray] = None

    @property
    def response_len(self) -> int:
        return int(len(self.tokens) - self.prompt_len)


@attrs.frozen(eq=False)
class SampleGroup:
    """G samples for one prompt, written to the buffer as a unit."""

    group_id: str
    prompt_id: str
    sampler_host: str
    sampler_incarnation: int
    samples: tuple[Sample, ...]
    task: str = ""
    #: How the behavior log-probs were processed (``temperature``, ``top_k`` and
    #: ``top_p`` of the sampler's :class:`SamplingParams`; the other fields are not
    #: recorded). None: not recorded (payloads written before it was).
    sampling: Optional[SamplingParams] = None


class Trigger(str, enum.Enum):
    """Why a consistent cut was taken."""

    MANUAL = "MANUAL"
    SCHEDULED = "SCHEDULED"
    PREEMPT = "PREEMPT"
    FINAL = "FINAL"


class StopReason(str, enum.Enum):
    """Why a trainer incarnation is drained; each maps to a cut trigger."""

    STOPPED = "STOPPED"
    PREEMPTED = "PREEMPTED"
    FINISHED = "FINISHED"

    @property
    def trigger(self) -> Trigger:
        return {
            StopReason.STOPPED: Trigger.SCHEDULED,
            StopReason.PREEMPTED: Trigger.PREEMPT,
            StopReason.FINISHED: Trigger.FINAL,
        }[self]


@attrs.frozen
class ShardDigest:
    """One file of a cut or release, with its sha256."""

    name: str
    sha256: str
    size: int


@attrs.frozen
class Backlog:
    """What waits in the buffer for the trainer (computed incrementally)."""

    groups: int
    samples: int
    watermark: int
    head_position: int
    oldest_version: Optional[int] = None
    oldest_appended_at: Optional[float] = None
    data_ended: bool = False


@attrs.frozen
class RoundSpec:
    """What the trainer asks the buffer for."""

    max_groups: int
    current_version: int
    max_policy_age: int


class LifecycleState(str, enum.Enum):
    """States of a trainer incarnation as the head sees them."""

    STOPPED = "STOPPED"  # no incarnation
    STARTING = "STARTING"  # launched, JOIN/restore in progress
    READY = "READY"  # joined and restored, holding at a round boundary
    TRAINING = "TRAINING"  # inside train(n)
    DRAINING = "DRAINING"  # taking its final cut
    LEFT = "LEFT"  # left with a cut; can be released
    FAILED = "FAILED"  # died or refused; must be released


class Action(str, enum.Enum):
    START = "START"
    STOP = "STOP"
    HOLD = "HOLD"
    FINISH = "FINISH"


@attrs.frozen
class Event:
    """One line of an event stream (``events/<island>.jsonl``, the head journal)."""

    kind: str
    time: float
    source: str
    data: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class SamplingParams:
    """How a sampler engine samples (shared by every engine)."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: Optional[int] = None


@attrs.frozen(eq=False)
class Completion:
    """One generated response: token ids and their behavior log-probs.

    ``logprobs`` are processed at the sampling temperature (the probabilities
    the tokens were actually drawn with), one per response token.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    finish_reason: str = "stop"
    weight_version: int = 0
    routed_experts: Optional[np.ndarray] = None


@attrs.frozen(eq=False)
class Batch:
    """What a trainer backend trains in one round.

    ``groups`` are whole groups (G samples each) in buffer position order,
    ``positions`` their buffer positions. ``padding`` holds loss-free samples
    (``loss_mask`` all zero) that fill a short round; they carry no gradient.
    """

    groups: tuple[SampleGroup, ...]
    positions: tuple[int, ...]
    policy_version: int
    padding: tuple[Sample, ...] = ()
    metrics: dict[str, float] = attrs.field(factory=dict)

    @property
    def n_real_samples(self) -> int:
        return sum(len(g.samples) for g in self.groups)
