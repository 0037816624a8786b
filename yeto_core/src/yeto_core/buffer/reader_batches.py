"""What the batch reader hands a backend, and the checks and padding it applies per group.

:class:`ReaderBatch` (a :class:`~yeto_core.records.Batch` with the positions its
commit consumes), the reader's errors, the skip reasons, the per-group checks
and the loss-free padding of a short round. The reader itself is
:mod:`yeto_core.buffer.batch_reader`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import attrs
import numpy as np

from yeto_core.errors import YetoError
from yeto_core.records import Batch, Sample, SampleGroup

#: Every reason a group can be left out of training, in the order they are checked.
SKIP_REASONS: tuple[str, ...] = (
    "stale",
    "duplicate",
    "fenced_incarnation",
    "quarantined",
    "too_small",
    "unconvertible",
    "nonfinite_reward",
    "nonfinite_loss",
)


class ReaderError(YetoError):
    """The batch reader could not build a round."""


class SamplerWaitTimeout(ReaderError):
    """No group arrived for ``wait_s`` seconds while a round waited for samples."""


class UnconvertibleRoundError(ReaderError):
    """``max_unconvertible_takes`` takes in a row held only unconvertible groups."""


class EndOfData(ReaderError):
    """The buffer's data ended and no usable group is left for another round."""


@attrs.frozen(eq=False)
class ReaderBatch(Batch):
    """A :class:`~yeto_core.records.Batch` plus what the reader needs to commit it.

    ``skipped`` maps each reason to the positions this batch's commit consumes
    without training; ``watermark_before``/``watermark`` bound the commit;
    ``padding_from`` is ``(position, sample index)`` of the padding template
    (the ledger records it so a replay rebuilds the same padding).
    """

    skipped: Mapping[str, tuple[int, ...]] = attrs.field(factory=dict)
    watermark_before: int = 0
    watermark: int = 0
    padding_from: Optional[tuple[int, int]] = None
    groups_per_round: int = 0
    group_size: int = 0
    rounds: tuple[Any, ...] = ()


# -- pure checks ---------------------------------------------------------------------------


def check_group(
    group: SampleGroup,
    *,
    group_size: int,
    vocab_size: Optional[int] = None,
    expected_layers: Optional[int] = None,
    top_k: Optional[int] = None,
    num_experts: Optional[int] = None,
    routed_experts_required: bool = True,
    distinct_experts: bool = False,
) -> Optional[tuple[str, str]]:
    """Why ``group`` cannot be trained, as ``(reason, detail)``; None when it can.

    Pure: looks only at the loaded group. ``too_small`` is a group with fewer
    than ``group_size`` samples; ``unconvertible`` is a malformed sample
    (arrays of the wrong length, token ids outside the vocabulary, a routed
    expert row with the wrong layer count or out-of-range expert ids, pads
    mixed with ids); ``nonfinite_reward`` is any NaN/inf reward. With
    ``expected_layers`` set, a sample without routed experts is unconvertible
    unless ``routed_experts_required`` is False (the trainer then routes it
    itself); with ``distinct_experts``, a token and layer naming one expert twice
    is unconvertible.
    """
    if len(group.samples) < group_size:
        return "too_small", f"{len(group.samples)} samples, the round needs {group_size}"
    fine = expected_layers is None and _dense_samples_fine(group.samples, vocab_size)
    for i, s in enumerate([] if fine else group.samples):
        detail = _sample_problem(
            s,
            vocab_size=vocab_size,
            expected_layers=expected_layers,
            top_k=top_k,
            num_experts=num_experts,
            routed_experts_required=routed_experts_required,
            distinct_experts=distinct_experts,
        )
        if detail is not None:
            return "unconvertible", f"sample {i}: {detail}"
    for i, s in enumerate(group.samples):
        try:
            reward = float(s.reward)
        except (TypeError, ValueError):
            return "unconvertible", f"sample {i}: reward {s.reward!r} is not a number"
        if not math.isfinite(reward):
            return "nonfinite_reward", f"sample {i}: reward is {reward}"
    return None


def _dense_samples_fine(samples: tuple[Sample, ...], vocab_size: Optional[int]) -> bool:
    """True when every sample passes :func:`_sample_problem` of a model without routed
    experts, checked with a few numpy calls per group instead of several per sample (the
    trainer checks every group it takes). False says only "look sample by sample": the
    per-sample check then finds the first problem and words it."""
    tokens, logprobs = [], []
    for s in samples:
        t, lp, mask = s.tokens, s.logprobs, s.loss_mask
        if s.routed_experts is not None or not (
            isinstance(t, np.ndarray)
            and isinstance(lp, np.ndarray)
            and isinstance(mask, np.ndarray)
            and t.ndim == 1
            and t.dtype.kind in "iu"
            and lp.dtype.kind == "f"
            and isinstance(s.prompt_len, (int, np.integer))
        ):
            return False
        n = int(t.shape[0])
        resp = n - int(s.prompt_len)
        if not (0 < int(s.prompt_len) <= n and lp.shape == (resp,) and mask.shape == (resp,)):
            return False
        tokens.append(t)
        logprobs.append(lp)
    if not tokens:
        return True
    every = np.concatenate(tokens)
    if every.size and (
        int(every.min()) < 0 or (vocab_size is not None and int(every.max()) >= vocab_size)
    ):
        return False
    lps = np.concatenate(logprobs)
    return bool(np.all(np.isfinite(lps.astype(np.float64, copy=False))))


def _sample_problem(
    s: Sample,
    *,
    vocab_size: Optional[int],
    expected_layers: Optional[int],
    top_k: Optional[int],
    num_experts: Optional[int],
    routed_experts_required: bool = True,
    distinct_experts: bool = False,
) -> Optional[str]:
    tokens = np.asarray(s.tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        return f"tokens must be a 1-D integer array, got shape {tokens.shape} {tokens.dtype}"
    n = int(tokens.shape[0])
    if not isinstance(s.prompt_len, (int, np.integer)) or not 0 < int(s.prompt_len) <= n:
        return f"prompt_len {s.prompt_len!r} is outside 1..{n} (the token count)"
    resp = n - int(s.prompt_len)
    for name in ("logprobs", "loss_mask"):
        arr = np.asarray(getattr(s, name))
        if arr.ndim != 1 or arr.shape[0] != resp:
            return f"{name} has shape {arr.shape} for a response of {resp} tokens"
    if not np.all(np.isfinite(np.asarray(s.logprobs, dtype=np.float64))):
        return "logprobs hold NaN or inf"
    if n and (
        int(tokens.min()) < 0 or (vocab_size is not None and int(tokens.max()) >= vocab_size)
    ):
        return (
            f"token ids {int(tokens.min())}..{int(tokens.max())} are outside the vocabulary "
            f"0..{(vocab_size or 0) - 1}"
        )
    re = s.routed_experts
    if re is None:
        if expected_layers is not None and routed_experts_required:
            return "routed_experts missing (this model routes experts)"
        return None
    re = np.asarray(re)
    if re.ndim != 3 or re.shape[0] != n - 1:
        return f"routed_experts has shape {re.shape}, expected ({n - 1}, layers, top_k)"
    if expected_layers is not None and re.shape[1] != expected_layers:
        return f"routed_experts has {re.shape[1]} layers, the model has {expected_layers}"
    if top_k is not None and re.shape[2] != top_k:
        return f"routed_experts has top_k {re.shape[2]}, the model routes {top_k}"
    if re.size and not np.issubdtype(re.dtype, np.integer):
        return f"routed_experts must hold integer expert ids, got {re.dtype}"
    if re.size and (
        int(re.min()) < 0 or (num_experts is not None and int(re.max()) >= num_experts)
    ):
        return (
            f"routed expert ids {int(re.min())}..{int(re.max())} are outside "
            f"0..{(num_experts or 0) - 1}"
        )
    if distinct_experts and re.size and re.shape[2] > 1:
        srt = np.sort(re, axis=-1)
        if np.any(srt[..., 1:] == srt[..., :-1]):
            return "routed_experts names the same expert twice for one token and layer"
    return None


def padding_template(groups: Iterable[tuple[int, SampleGroup]]) -> Optional[tuple[int, int]]:
    """``(position, sample index)`` of the shortest sample that has a response.

    Ties go to the lowest position, then the lowest index. None when every
    sample has an empty response (nothing can serve as padding).
    """
    best: Optional[tuple[int, int, int]] = None
    for pos, g in groups:
        for i, s in enumerate(g.samples):
            if s.response_len <= 0:
                continue
            key = (len(s.tokens), pos, i)
            if best is None or key < best:
                best = key
    return None if best is None else (best[1], best[2])


def make_padding(template: Sample, count: int) -> tuple[Sample, ...]:
    """``count`` loss-free copies of ``template`` (``loss_mask`` all zero, reward 0)."""
    if count <= 0:
        return ()
    pad = attrs.evolve(
        template,
        tokens=np.array(template.tokens, copy=True),
        logprobs=np.array(template.logprobs, copy=True),
        loss_mask=np.zeros_like(np.asarray(template.loss_mask)),
        reward=0.0,
        routed_experts=None
        if template.routed_experts is None
        else np.array(template.routed_experts, copy=True),
    )
    return (pad,) * count


# -- the reader ------------------------------------------------------------------------------
