"""The ``hf`` engine's lean forward computes what the ``transformers`` forward computes.

Each check runs the lean forward and ``LlamaForCausalLM.forward`` on the same
weights and compares: whole sequences, decoding step by step from a KV cache,
several tokens after a cache, sampling with a fixed generator, and the policy
fingerprint's scores. A wrong rotary table, a missing norm, a head split the
wrong way, or a cache that drops a position moves the logits far past these
tolerances.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from yeto_torch import model as tiny
from yeto_torch.engine import HFEngine
from yeto_torch.lean import LeanLlama, lean_for
from yeto_torch.sampling import prompt_logprobs, sample


def _llama(seed: int = 0, dtype: torch.dtype = torch.float32, **over) -> LlamaForCausalLM:
    cfg = dict(
        vocab_size=16,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    cfg.update(over)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    with torch.no_grad():  # larger weights than the init's: differences show up clearly
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.to(dtype)


VARIANTS = {
    "tiny_base": {},
    "grouped_query": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "head_dim_not_hidden_over_heads": dict(num_attention_heads=4, head_dim=32),
    "rope_base": dict(rope_parameters={"rope_type": "default", "rope_theta": 500.0}),
    "tied_embeddings": dict(tie_word_embeddings=True),
    "three_layers_eps": dict(num_hidden_layers=3, rms_norm_eps=1e-3),
}


def _ids(b: int, t: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 16, (b, t), generator=g)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_whole_sequences_match_the_transformers_forward(name):
    model = _llama(**VARIANTS[name])
    lean = lean_for(model)
    assert isinstance(lean, LeanLlama)
    ids = _ids(5, 12)
    with torch.no_grad():
        want = model(input_ids=ids).logits
    got, cache = lean(ids)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert len(cache) == model.config.num_hidden_layers
    last, _ = lean(ids, last_only=True)
    assert torch.allclose(last[:, 0], want[:, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_kept_positions_match_the_transformers_forward_and_skip_the_rest(name):
    """``keep_from``: the logits of the kept positions (right-padded rows too) are those
    of the whole forward, their gradients too, and the last layer's MLP sees only the
    kept positions (so the work is skipped, not just the output sliced)."""
    model = _llama(**VARIANTS[name])
    lean = lean_for(model)
    ids = _ids(5, 12)
    want = model(input_ids=ids).logits
    seen = []
    hook = model.model.layers[-1].mlp.down_proj.register_forward_hook(
        lambda mod, args, out: seen.append(tuple(args[0].shape))
    )
    try:
        got, _ = lean.forward(ids, keep_from=7)
    finally:
        hook.remove()
    assert got.shape == (5, 5, 16) and seen == [(5, 5, 256)]
    assert torch.allclose(got, want[:, 7:], atol=1e-5, rtol=0), (got - want[:, 7:]).abs().max()
    weights = torch.randn(5, 5, 16)
    grads = []
    for logits in (want[:, 7:], got):
        model.zero_grad()
        (logits * weights).sum().backward(retain_graph=logits is want[:, 7:])
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        assert torch.allclose(grads[1][n], g, atol=1e-4, rtol=1e-4), n
    for bad in (0, 12, -1):
        with pytest.raises(ValueError, match="keep_from"):
            lean.forward(ids, keep_from=bad) if bad else lean.forward(
                ids, keep_from=3, last_only=True
            )


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_decoding_from_the_cache_matches_the_whole_sequence(name):
    model = _llama(**VARIANTS[name])
    lean = lean_for(model)
    ids = _ids(3, 14, seed=2)
    with torch.no_grad():
        want = model(input_ids=ids).logits
    logits, cache = lean(ids[:, :6])
    steps = [logits]
    for t in range(6, 10):  # one token at a time
        out, cache = lean(ids[:, t : t + 1], cache)
        steps.append(out)
    out, cache = lean(ids[:, 10:], cache)  # several tokens after a cache
    steps.append(out)
    got = torch.cat(steps, dim=1)
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert cache[0][0].shape[2] == 14


def test_positions_past_the_configured_maximum_still_match():
    model = _llama(max_position_embeddings=8)
    lean = lean_for(model)
    ids = _ids(2, 11, seed=3)
    with torch.no_grad():
        want = model(input_ids=ids).logits
    assert torch.allclose(lean(ids)[0], want, atol=1e-5, rtol=0)


def test_bfloat16_matches_within_its_precision():
    model = _llama(dtype=torch.bfloat16)
    lean = lean_for(model)
    ids = _ids(4, 10, seed=4)
    with torch.no_grad():
        want = model(input_ids=ids).logits.float()
    got = lean(ids)[0].float()
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, atol=0.1, rtol=0), (got - want).abs().max()


def test_weights_loaded_in_place_are_served_at_once():
    model = _llama()
    lean = lean_for(model)
    ids = _ids(2, 7, seed=5)
    before = lean(ids)[0]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
        want = model(input_ids=ids).logits
    after = lean(ids)[0]
    assert not torch.allclose(before, after, atol=1e-3)
    assert torch.allclose(after, want, atol=1e-5, rtol=0)


def test_sampling_draws_the_same_tokens_as_the_transformers_path():
    model = _llama(seed=7)
    lean = lean_for(model)
    prompts = [[1, 5, 6, 7, 8], [1, 9, 3, 4, 5], [1, 4, 4], [1, 12, 11, 3, 3]]
    kw = dict(max_new_tokens=6, temperature=1.0, eos_ids=[2])
    for seed in range(5):
        a = sample(model, prompts, 4, generator=torch.Generator().manual_seed(seed), **kw)
        b = sample(
            model, prompts, 4, generator=torch.Generator().manual_seed(seed), lean=lean, **kw
        )
        for ga, gb in zip(a, b, strict=True):
            assert len(ga) == len(gb) == 4
            for (ta, la, ra), (tb, lb, rb) in zip(ga, gb, strict=True):
                assert (ta, ra) == (tb, rb)
                assert max(abs(x - y) for x, y in zip(la, lb, strict=True)) < 1e-5


def test_fingerprint_scores_match():
    model = _llama(seed=8)
    probes = [[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1], [7, 7, 7]]
    want = prompt_logprobs(model, probes)
    got = prompt_logprobs(model, probes, lean_for(model))
    for w, g in zip(want, got, strict=True):
        assert len(w) == len(g)
        assert max(abs(x - y) for x, y in zip(w, g, strict=True)) < 1e-5


def test_models_it_does_not_cover_keep_their_own_forward():
    moe = tiny.build_model(tiny.build_moe_config(), seed=0)
    assert lean_for(moe) is None
    scaled = _llama(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    assert lean_for(scaled) is None
    with pytest.raises(ValueError, match="not a dense default-rope Llama"):
        LeanLlama(moe)


def test_the_engine_takes_the_lean_path_unless_told_not_to(tmp_path):
    base = tmp_path / "base"
    tiny.build_model(tiny.build_config(), seed=0).save_pretrained(base)
    tiny.build_tokenizer().save_pretrained(base)
    fast = HFEngine(str(base), seed=3)
    plain = HFEngine(str(base), seed=3, lean=False)
    assert isinstance(fast.lean, LeanLlama) and plain.lean is None
    prompts = [[1, 4, 5, 6], [1, 7, 8, 9]]
    a = fast.generate(prompts, 3)
    b = plain.generate(prompts, 3)
    for ga, gb in zip(a, b, strict=True):
        for ca, cb in zip(ga, gb, strict=True):
            assert list(ca.tokens) == list(cb.tokens)
            assert abs(ca.logprobs - cb.logprobs).max() < 1e-5
    probes = [[1, 3, 5, 7, 9]]
    assert fast.prompt_logprobs(probes)[0] == pytest.approx(
        plain.prompt_logprobs(probes)[0], abs=1e-5
    )


@pytest.mark.parametrize(
    "opts",
    [{}, {"tuning": "lora"}, {"kl_coef": 0.1}, {"updates_per_round": 2, "loss": "decoupled"}],
    ids=["full", "lora", "kl", "two_updates"],
)
def test_training_rounds_through_the_lean_forward_equal_the_transformers_ones(sort_base, opts):
    """Right-padded rows of different lengths (answers stop at <eos>), so a padding the
    lean forward mishandled would change the loss and the weights."""
    from yeto_torch.backend import TorchBackend
    from yeto_torch.tasks import SortDigits
    from yeto_torch.testing import rollout_batch

    eng = HFEngine(str(sort_base), seed=11)
    batches = [rollout_batch(eng, SortDigits(seed=11), 16 * r, 8, 8, 0) for r in range(3)]
    lengths = {len(s.tokens) for b in batches for g in b.groups for s in g.samples}
    assert len(lengths) > 1, "every sample has the same length: no padding is exercised"
    runs = {}
    for lean in (True, False):
        be = TorchBackend(str(sort_base), lr=3e-3, seed=1, lean=lean, **opts)
        be.restore(None)
        if lean:
            assert be._lean(be.model) is not None, "the trainer's model takes its own forward"
        losses = [be.train_round(b)["loss"] for b in batches]
        runs[lean] = (losses, {n: p.detach().clone() for n, p in be.model.named_parameters()})
    assert runs[True][0] == pytest.approx(runs[False][0], rel=1e-5, abs=1e-8)
    assert any(abs(x) > 1e-6 for x in runs[False][0]), "zero losses: the test checks nothing"
    # the lean forward skips the last layer's work before the shortest prompt's last
    # token: its gradients differ from the whole forward's by float rounding (~1e-7
    # relative). Adam divides each step by the gradient's running magnitude, so on
    # elements whose gradient is near zero (~eps) that rounding moves a weight by up to
    # ~1e-5 in 3 rounds; 1e-4 is 3% of one step at lr 3e-3, and a wrong forward moves
    # the losses above past their 1e-5
    for name, w in runs[False][1].items():
        assert torch.allclose(runs[True][1][name], w, atol=1e-4, rtol=0), name
