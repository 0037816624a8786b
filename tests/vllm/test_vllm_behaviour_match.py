"""At identical weights the torch trainer scores a real vLLM server's samples as they were
drawn, with top-k and top-p both set: vLLM filters sequentially and its groups say so."""

from __future__ import annotations

from yeto_core.records import SamplingParams
from yeto_torch.tasks import SortDigits
from yeto_torch.testing import rollout_batch, train_under_each_filter_order

BOTH = SamplingParams(max_new_tokens=6, temperature=1.5, top_k=6, top_p=0.5, seed=11)


def test_vllm_samples_score_with_zero_mismatch_under_top_k_and_top_p(vllm_engine, sort_base):
    batch = rollout_batch(vllm_engine, SortDigits(seed=3), 0, 4, 4, 0, sampling=BOTH)
    assert {g.sampling.filter_order for g in batch.groups} == {"sequential"}
    got = train_under_each_filter_order(batch, sort_base)
    m = got["sequential"]
    assert m["on_policy_tokens"] == m["tokens"] > 0 and m["tokens_outside_support"] == 0, m
    assert m["mismatch_kl"] < 1e-6 and m["mismatch_kl_on_policy"] < 1e-6, m
    assert got["joint"]["mismatch_kl"] > 1e-3, got["joint"]  # the order is what is checked
