"""At identical weights, the torch trainer scores SGLang's samples exactly as they were drawn,
with top-k and top-p both set: SGLang filters jointly, each group records it, and the
trainer scores the group under the joint filter."""

from __future__ import annotations

import attrs

from yeto_core.records import SamplingParams
from yeto_torch.backend import TorchBackend
from yeto_torch.tasks import SortDigits
from yeto_torch.testing import rollout_batch

#: a near-flat tiny model: the top 4 hold little mass, so the joint nucleus (over the full
#: distribution) keeps all 4 where the sequential one (over the renormalised 4) keeps fewer
BOTH = SamplingParams(max_new_tokens=6, temperature=1.0, top_k=4, top_p=0.5)


def _round(model_dir, batch):
    be = TorchBackend(str(model_dir))
    be.restore(None)
    return be.train_round(batch)


def test_sglang_samples_score_with_zero_mismatch_under_top_k_and_top_p(target, engine_for):
    eng = engine_for(target.url)
    batch = rollout_batch(eng, SortDigits(seed=4), 0, 6, 4, 0, sampling=BOTH)
    assert {g.sampling.filter_order for g in batch.groups} == {"joint"}
    # the groups' rewards must differ somewhere, or nothing is trained and measured
    batch = attrs.evolve(
        batch,
        groups=tuple(
            attrs.evolve(
                g,
                samples=tuple(
                    attrs.evolve(s, reward=float(k % 2)) for k, s in enumerate(g.samples)
                ),
            )
            for g in batch.groups
        ),
    )
    m = _round(target.model, batch)
    assert m["on_policy_tokens"] == m["tokens"] > 0
    assert m["tokens_outside_support"] == 0, m
    bound = 1e-6 if not target.real else target.atol  # a real server's kernels differ
    assert m["mismatch_kl"] < bound and m["mismatch_kl_on_policy"] < bound, m
    # the same tokens scored under the sequential filter (what the trainer did before the
    # record): some fall outside its support, and the rest are renormalised otherwise
    seq = attrs.evolve(
        batch,
        groups=tuple(
            attrs.evolve(g, sampling=attrs.evolve(g.sampling, filter_order="sequential"))
            for g in batch.groups
        ),
    )
    wrong = _round(target.model, seq)
    assert wrong["tokens_outside_support"] > 0 and wrong["mismatch_kl"] > 1e-3, wrong
