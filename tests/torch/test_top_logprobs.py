"""The hf engine returns the top-K log-probs ``[[samplers]] top_logprobs = K`` asks for."""

from __future__ import annotations

import numpy as np
import pytest

from yeto_core.records import SamplingParams
from yeto_torch.engine import HFEngine


@pytest.mark.parametrize("sp", [dict(temperature=1.0), dict(temperature=0.7, top_k=3)])
def test_top_logprobs_are_the_behaviour_distributions_best_k(sort_base, sp):
    engine = HFEngine(str(sort_base), seed=1)
    prompt = engine.encode("3 1 2")
    k = 4
    (group,) = engine.generate([prompt], 3, SamplingParams(max_new_tokens=5, top_logprobs=k, **sp))
    for c in group:
        n = len(c.tokens)
        assert c.top_logprobs.shape == (n, k) and c.top_token_ids.shape == (n, k)
        finite = np.isfinite(c.top_logprobs)
        # best first; an entry outside the top-k nucleus has no token
        assert np.all(np.diff(np.where(finite, c.top_logprobs, -1e9), axis=-1) <= 1e-6)
        assert np.all((c.top_token_ids >= 0) == finite)
        if sp.get("top_k"):
            assert not finite[:, 3:].any()
        # the sampled token's behaviour log-prob is its entry, where it is in the top k
        for t, (tok, lp) in enumerate(zip(c.tokens, c.logprobs, strict=True)):
            row = c.top_token_ids[t].tolist()
            if int(tok) in row:
                assert c.top_logprobs[t, row.index(int(tok))] == pytest.approx(lp, abs=1e-4)
    (plain,) = engine.generate([prompt], 2, SamplingParams(max_new_tokens=3))
    assert all(c.top_logprobs is None and c.top_token_ids is None for c in plain)
