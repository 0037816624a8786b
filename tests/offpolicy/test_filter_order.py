"""How an engine combines top-k and top-p is recorded with each group, and the trainer scores
the group under that filter order (``sequential``: the hf engine and vLLM; ``joint``: SGLang)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from yeto_core.buffer.group_codec import decode_group, encode_group
from yeto_core.config.load import parse_config
from yeto_core.errors import ConfigError, SampleBufferError
from yeto_core.records import Sample, SampleGroup, SamplingParams
from yeto_torch.engine import HFEngine
from yeto_torch.sampling import process_logits

#: the issue's example: SGLang can draw token 1; the sequential filter keeps token 0 only
PROBS = [0.5, 0.2, 0.1, 0.1, 0.05, 0.05]


def test_joint_filters_keep_what_sglang_samples_from_in_the_issue_example():
    logits = torch.log(torch.tensor([PROBS]))
    joint = process_logits(logits, 1.0, 2, 0.6, "joint")[0]
    assert joint[1].item() == pytest.approx(math.log(0.2 / 0.7), abs=1e-6)  # -1.2528
    assert joint[1].item() == pytest.approx(-1.2528, abs=1e-4)
    assert joint[0].item() == pytest.approx(math.log(0.5 / 0.7), abs=1e-6)
    assert torch.isinf(joint[2:]).all()
    seq = process_logits(logits, 1.0, 2, 0.6, "sequential")[0]
    assert seq[0].item() == 0.0 and torch.isinf(seq[1:]).all()
    assert torch.equal(process_logits(logits, 1.0, 2, 0.6)[0], seq)  # the default: sequential


def _reference(z: torch.Tensor, top_k: int, top_p: float, order: str) -> torch.Tensor:
    """Written out from the definitions, one row and one token at a time."""
    out = torch.full_like(z, float("-inf"))
    for r in range(z.shape[0]):
        p = torch.softmax(z[r].double(), -1)
        rank = sorted(range(len(p)), key=lambda j: -float(p[j]))
        kept = set(rank[:top_k]) if top_k else set(rank)
        if order == "sequential":
            mass = sum(float(p[j]) for j in kept)
            q = {j: float(p[j]) / mass for j in kept}
        else:
            q = {j: float(p[j]) for j in rank}
        before, nucleus = 0.0, set()
        for j in [j for j in rank if j in q]:
            if before > top_p:
                break
            nucleus.add(j)
            before += q[j]
        kept &= nucleus
        total = sum(float(p[j]) for j in kept)
        for j in kept:
            out[r, j] = math.log(float(p[j]) / total)
    return out


@pytest.mark.parametrize("order", ["sequential", "joint"])
@pytest.mark.parametrize("top_k, top_p", [(0, 0.7), (5, 1.0), (5, 0.7), (3, 0.5), (12, 0.9)])
def test_process_logits_matches_the_definition(order, top_k, top_p):
    z = torch.randn(6, 24, generator=torch.Generator().manual_seed(top_k * 7 + 1)) * 2.0
    got = process_logits(z, 0.8, top_k, top_p, order)
    want = _reference(z / 0.8, top_k, top_p, order)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = ~torch.isinf(want)
    assert torch.allclose(got[fin], want[fin], atol=1e-5)


def test_the_orders_differ_only_with_both_filters():
    z = torch.randn(64, 24, generator=torch.Generator().manual_seed(3)) * 2.0
    for k, p in [(0, 0.6), (4, 1.0)]:
        assert torch.equal(process_logits(z, 1.0, k, p, "joint"), process_logits(z, 1.0, k, p))
    joint, seq = process_logits(z, 1.0, 4, 0.6, "joint"), process_logits(z, 1.0, 4, 0.6)
    # the sequential nucleus is taken over renormalised (larger) probabilities: never more
    assert (torch.isinf(joint) <= torch.isinf(seq)).all()
    assert (torch.isinf(seq) & ~torch.isinf(joint)).any()


def test_an_unknown_filter_order_is_refused():
    with pytest.raises(ValueError, match="filter_order='topk-last'"):
        process_logits(torch.zeros(1, 4), 1.0, 2, 0.5, "topk-last")


def _group(sampling):
    s = Sample(
        tokens=np.array([1, 2, 3, 4]),
        prompt_len=2,
        logprobs=np.array([-0.5, -0.25], np.float32),
        loss_mask=np.ones(2, np.float32),
        reward=1.0,
        weight_version=3,
    )
    return SampleGroup("g", "p", "h", 0, (s, s), task="t", sampling=sampling)


def test_the_filter_order_travels_with_the_group_and_old_payloads_read_as_sequential():
    joint = SamplingParams(temperature=0.7, top_k=4, top_p=0.8, filter_order="joint")
    assert decode_group(encode_group(_group(joint))).sampling == joint
    seq = SamplingParams(temperature=0.7, top_k=4, top_p=0.8)
    payload = encode_group(_group(seq))
    # a sequential group is written as before the field existed (same bytes, same sha256)
    header = json.loads(payload[8 : 8 + int.from_bytes(payload[:8], "little")])
    assert "filter_order" not in json.loads(header["__metadata__"]["sampling"])
    assert decode_group(payload).sampling.filter_order == "sequential"


def test_a_payload_with_an_unknown_filter_order_is_refused():
    odd = SamplingParams(top_k=4, top_p=0.8, filter_order="min-p-first")
    with pytest.raises(SampleBufferError, match="filter_order 'min-p-first'"):
        decode_group(encode_group(_group(odd)))


def test_engines_state_their_filter_order(sort_base):
    sp = SamplingParams(top_k=4, top_p=0.8)
    assert HFEngine(str(sort_base)).behaviour_sampling(sp) == sp  # sequential
    from yeto_sglang.engine import SGLangEngine
    from yeto_vllm.engine import VLLMEngine

    assert SGLangEngine.FILTER_ORDER == "joint" and VLLMEngine.FILTER_ORDER == "sequential"


def test_a_config_may_not_set_the_filter_order(tmp_path: Path):
    with pytest.raises(ConfigError, match="samplers\\[0\\].sampling.filter_order = 'joint'"):
        parse_config(
            {
                "run_dir": str(tmp_path / "run"),
                "model": {"path": str(tmp_path / "base")},
                "task": {"name": "sort4"},
                "samplers": [
                    {"engine": "hf", "group_size": 4, "sampling": {"filter_order": "joint"}}
                ],
                "trainer": {"backend": "torch", "groups_per_round": 2},
            }
        )


def test_hf_samples_score_with_zero_mismatch_under_top_k_and_top_p(sort_base):
    """The hf engine filters sequentially and its groups say so; scored under the joint
    filter instead, the same tokens show the mismatch the record prevents."""

    from yeto_torch.tasks import SortDigits
    from yeto_torch.testing import rollout_batch, train_under_each_filter_order

    sp = SamplingParams(max_new_tokens=6, temperature=1.5, top_k=6, top_p=0.5)
    batch = rollout_batch(HFEngine(str(sort_base), seed=3), SortDigits(seed=3), 0, 8, 4, 0, sp)
    assert {g.sampling.filter_order for g in batch.groups} == {"sequential"}
    got = train_under_each_filter_order(batch, sort_base)
    m = got["sequential"]
    assert m["on_policy_tokens"] == m["tokens"] > 0 and m["tokens_outside_support"] == 0
    assert m["mismatch_kl"] < 1e-6 and m["mismatch_kl_on_policy"] < 1e-6, m
    assert got["joint"]["mismatch_kl"] > 1e-3, got["joint"]


def test_a_run_config_is_written_without_the_default_filter_order():
    """A sampler's settings in config.json read in a yeto that predates the field."""
    from yeto_core import serde

    conv = serde.make_converter()
    out = conv.unstructure(SamplingParams(top_k=4, top_p=0.8))
    assert "filter_order" not in out and out["top_k"] == 4
    assert conv.unstructure(SamplingParams(filter_order="joint"))["filter_order"] == "joint"
    assert conv.structure(out, SamplingParams) == SamplingParams(top_k=4, top_p=0.8)
