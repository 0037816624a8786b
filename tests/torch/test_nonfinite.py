"""A round whose loss or gradient norm is not finite is refused before the optimizer step."""

from __future__ import annotations

import math

import attrs
import numpy as np
import torch

from yeto_torch.backend import TorchBackend
from yeto_torch.testing import fixed_batches


def _poison(batch, group: int = 0):
    """``batch`` with the behaviour log-probs of one group NaN (its loss is then NaN)."""
    spread = [i for i, g in enumerate(batch.groups) if len({s.reward for s in g.samples}) > 1]
    group = spread[0] if group == 0 else spread[-1]  # a group that is trained (not all equal)
    g = batch.groups[group]
    bad = tuple(
        attrs.evolve(s, logprobs=np.full(len(s.logprobs), np.nan, dtype=np.float32))
        for s in g.samples
    )
    groups = list(batch.groups)
    groups[group] = attrs.evolve(g, samples=bad)
    return attrs.evolve(batch, groups=tuple(groups))


def _state(be):
    return {k: v.clone() for k, v in be.state_tensors().items()}


def test_a_nan_loss_is_refused_the_weights_kept_and_the_next_round_trains_as_if_it_never_came(
    sort_base,
):
    good, nxt = fixed_batches(sort_base, 2)
    be = TorchBackend(str(sort_base))
    be.restore(None)
    be.train_round(good)
    before = _state(be)
    steps = be.counters["optimizer_steps"]
    m = be.train_round(_poison(nxt))
    assert m["nonfinite"] == 1.0 and m["stepped"] == 0.0 and m["updates"] == 0.0
    assert m["loss_finite"] == 0.0
    assert all(math.isfinite(v) for v in m.values())  # metrics go to JSON events
    assert be.counters["optimizer_steps"] == steps and be.counters["nonfinite_rounds"] == 1
    after = be.state_tensors()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    # the refused round left no trace: training on goes exactly like a backend that never saw it
    m2 = be.train_round(nxt)
    ref = TorchBackend(str(sort_base))
    ref.restore(None)
    ref.train_round(good)
    ref.train_round(nxt)
    assert m2["nonfinite"] == 0.0 and m2["stepped"] == 1.0
    assert all(torch.equal(ref.state_tensors()[k], v) for k, v in be.state_tensors().items())


def test_a_nan_in_a_later_update_of_the_round_reverts_the_whole_round(sort_base):
    (batch,) = fixed_batches(sort_base, 1)
    spread = [i for i, g in enumerate(batch.groups) if len({s.reward for s in g.samples}) > 1]
    first = [i for i in spread if i < len(batch.groups) // 2]
    assert first and spread[-1] >= len(batch.groups) // 2  # a first update runs, the second is bad
    be = TorchBackend(str(sort_base), updates_per_round=2)
    be.restore(None)
    before = _state(be)
    m = be.train_round(_poison(batch, group=-1))  # in the second update
    assert m["nonfinite"] == 1.0 and m["stepped"] == 0.0
    assert be.counters["optimizer_steps"] == 0
    assert all(torch.equal(before[k], v) for k, v in be.state_tensors().items())
