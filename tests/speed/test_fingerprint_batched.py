"""The fingerprint's probes are scored in one forward per probe length (not one per probe),
with the same log-probs, in the prompts' order."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


class CountingModel(torch.nn.Module):
    """A tiny causal LM (embedding, a position-mixing layer, logits); counts its forwards."""

    def __init__(self, vocab: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, 8)
        self.out = torch.nn.Linear(8, vocab)
        self.calls: list[tuple[int, ...]] = []

    def forward(self, input_ids):
        self.calls.append(tuple(input_ids.shape))
        h = self.emb(input_ids).cumsum(dim=1)  # causal: position t sees tokens <= t
        return type("Out", (), {"logits": self.out(torch.tanh(h))})()


def _one_by_one(model, prompts):
    out = []
    for p in prompts:
        ids = torch.as_tensor([list(p)])
        lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        out.append([float(x) for x in lp.gather(-1, ids[0, 1:, None])[:, 0]])
    return out


def test_probes_of_one_length_take_one_forward_with_the_same_logprobs():
    from yeto_core.sampler import fingerprint
    from yeto_torch.sampling import prompt_logprobs

    model = CountingModel()
    probes = fingerprint.probe_set(16)
    want = _one_by_one(model, probes)
    model.calls.clear()
    got = prompt_logprobs(model, probes)
    assert model.calls == [(len(probes), len(probes[0]))]  # one batched forward
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=1e-6)


def test_prompts_of_mixed_lengths_keep_their_order():
    from yeto_torch.sampling import prompt_logprobs

    model = CountingModel()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11], [3], [2, 2, 2, 2, 2]]
    want = _one_by_one(model, prompts)
    model.calls.clear()
    got = prompt_logprobs(model, prompts)
    assert sorted(model.calls) == [(1, 1), (2, 3), (2, 5)]
    assert [len(g) for g in got] == [2, 4, 2, 0, 4]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=1e-6)
