"""check_group's group-wide check of dense samples answers as the sample-by-sample one:
the same verdict and words for every kind of malformed sample, and only the good groups
skip the per-sample loop."""

from __future__ import annotations

import numpy as np
import pytest

from yeto_core.buffer import reader_batches
from yeto_core.buffer.reader_batches import _sample_problem, check_group
from yeto_core.records import Sample, SampleGroup

VOCAB = 16


def _sample(**over) -> Sample:
    fields = dict(
        tokens=np.array([1, 5, 6, 7, 2], dtype=np.int64),
        prompt_len=2,
        logprobs=np.array([-0.5, -1.0, -0.1], dtype=np.float32),
        loss_mask=np.ones(3, dtype=np.float32),
        reward=1.0,
        weight_version=0,
    )
    fields.update(over)
    return Sample(**fields)


def _group(bad: Sample, at: int = 2) -> SampleGroup:
    samples = [_sample(reward=float(i % 2)) for i in range(4)]
    samples[at] = bad
    return SampleGroup(
        group_id="g", prompt_id="p", sampler_host="h", sampler_incarnation=0, samples=tuple(samples)
    )


def _one_by_one(group: SampleGroup, vocab_size):
    """The verdict of the sample-by-sample check alone (what check_group said before)."""
    for i, s in enumerate(group.samples):
        detail = _sample_problem(
            s, vocab_size=vocab_size, expected_layers=None, top_k=None, num_experts=None
        )
        if detail is not None:
            return "unconvertible", f"sample {i}: {detail}"
    return None


CASES = {
    "good": _sample(),
    "negative_token": _sample(tokens=np.array([1, -5, 6, 7, 2])),
    "token_past_vocab": _sample(tokens=np.array([1, 5, 16, 7, 2])),
    "nan_logprob": _sample(logprobs=np.array([-0.5, np.nan, -0.1], dtype=np.float32)),
    "inf_logprob": _sample(logprobs=np.array([-0.5, -np.inf, -0.1])),
    "short_logprobs": _sample(logprobs=np.array([-0.5, -0.1], dtype=np.float32)),
    "long_mask": _sample(loss_mask=np.ones(4, dtype=np.float32)),
    "two_d_tokens": _sample(tokens=np.array([[1, 5], [6, 7]])),
    "float_tokens": _sample(tokens=np.array([1.0, 5, 6, 7, 2])),
    "prompt_len_zero": _sample(prompt_len=0, logprobs=np.zeros(5), loss_mask=np.ones(5)),
    "prompt_len_past_end": _sample(prompt_len=6),
    "list_logprobs": _sample(logprobs=[-0.5, -1.0, -0.1]),
    "list_logprobs_nan": _sample(logprobs=[-0.5, float("nan"), -0.1]),
    "float16_logprobs": _sample(logprobs=np.array([-0.5, -1.0, -0.1], dtype=np.float16)),
    "uint_tokens": _sample(tokens=np.array([1, 5, 6, 7, 2], dtype=np.uint8)),
    "empty_response": _sample(
        tokens=np.array([1, 5]), logprobs=np.zeros(0, np.float32), loss_mask=np.zeros(0)
    ),
    "routed_on_a_dense_model": _sample(routed_experts=np.zeros((4, 1, 1), dtype=np.int64)),
    "routed_bad_shape": _sample(routed_experts=np.zeros((2, 1, 1), dtype=np.int64)),
}


@pytest.mark.parametrize("vocab_size", [VOCAB, None])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("at", [0, 3])
def test_the_group_check_answers_as_the_sample_by_sample_one(case, vocab_size, at):
    group = _group(CASES[case], at)
    got = check_group(group, group_size=4, vocab_size=vocab_size)
    assert got == _one_by_one(group, vocab_size)
    if case in ("negative_token", "nan_logprob", "two_d_tokens", "prompt_len_past_end"):
        assert got is not None and got[1].startswith(f"sample {at}: ")


def test_a_good_dense_group_skips_the_per_sample_loop(monkeypatch):
    calls = []
    real = reader_batches._sample_problem
    monkeypatch.setattr(
        reader_batches, "_sample_problem", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    assert check_group(_group(_sample()), group_size=4, vocab_size=VOCAB) is None
    assert calls == []
    # a group the group-wide check cannot clear goes sample by sample
    assert check_group(_group(CASES["nan_logprob"]), group_size=4, vocab_size=VOCAB) is not None
    assert calls
    # a model with routed experts is always checked sample by sample
    calls.clear()
    check_group(_group(_sample()), group_size=4, vocab_size=VOCAB, expected_layers=1)
    assert calls
