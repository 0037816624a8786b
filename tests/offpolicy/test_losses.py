"""Every loss option of the torch backend against the plain-torch reference in reference.py,
on real groups sampled 3 versions before the trainer's weights (and at identical weights)."""

from __future__ import annotations

import copy

import attrs
import numpy as np
import pytest
import torch

from yeto_core.errors import ConfigError
from yeto_core.records import SamplingParams
from yeto_torch.backend import TorchBackend
from yeto_torch.engine import HFEngine
from yeto_torch.tasks import SortDigits
from yeto_torch.testing import rollout_batch

from . import reference as ref

PROCESSED = SamplingParams(max_new_tokens=6, temperature=0.9, top_k=6, top_p=0.9)


class _Spy:
    """Records the gradients (and the weights they were taken at) of every optimizer step."""

    def __init__(self, backend: TorchBackend) -> None:
        self.steps: list[tuple[dict, dict]] = []
        inner = backend.optimizer.step
        params = dict(backend._trainable())

        def step(*a, **kw):
            self.steps.append(
                (
                    {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None},
                    {n: p.detach().clone() for n, p in params.items()},
                )
            )
            return inner(*a, **kw)

        backend.optimizer.step = step


def _stale_backend(base, stale: int, **opts) -> TorchBackend:
    """A backend ``stale`` optimizer steps past the base (at the default lr)."""
    be = TorchBackend(str(base), max_grad_norm=0.0, **opts)
    be.restore(None)
    eng, task = HFEngine(str(base), seed=5), SortDigits(seed=5)
    r = 0
    while be.counters["optimizer_steps"] < stale:
        be.train_round(rollout_batch(eng, task, 1000 + 8 * r, 8, 8, r))
        r += 1
    return be


def _batch(base, sampling, version, *, n_prompts=8, g=4, seed=9):
    eng = HFEngine(str(base), seed=seed)
    b = rollout_batch(eng, SortDigits(seed=seed), 0, n_prompts, g, version, sampling=sampling)
    # mask the first response token of each group's first sample (exercises the mask)
    groups = []
    for grp in b.groups:
        s0 = grp.samples[0]
        m = np.asarray(s0.loss_mask, np.float32).copy()
        m[0] = 0.0
        groups.append(attrs.evolve(grp, samples=(attrs.evolve(s0, loss_mask=m), *grp.samples[1:])))
    return attrs.evolve(b, groups=tuple(groups))


def _compare(be, batch, model_start, **ref_kw):
    spy = _Spy(be)
    m = be.train_round(batch)
    assert len(spy.steps) == 1, "one optimizer step per round"
    grads, weights = spy.steps[0]
    model_now = copy.deepcopy(model_start)
    with torch.no_grad():
        for n, p in model_now.named_parameters():
            p.copy_(weights[n])
    model_now.zero_grad()
    want, figures = ref.loss(model_now, model_start, list(batch.groups), **ref_kw)
    want.backward()
    ref_grads = {n: p.grad for n, p in model_now.named_parameters() if p.grad is not None}
    assert set(ref_grads) == set(grads)
    num = sum(float((grads[n] - ref_grads[n]).pow(2).sum()) for n in grads) ** 0.5
    den = sum(float(ref_grads[n].pow(2).sum()) for n in grads) ** 0.5
    assert den > 0, "the reference gradient is zero: the test checks nothing"
    assert num / den < 2e-4, (num / den, ref_kw)
    assert m["loss"] == pytest.approx(float(want.detach()), rel=1e-4, abs=1e-7)
    return m, figures


@pytest.fixture(scope="module")
def stale3(sort_base):
    """(batch sampled from the base, the trainer's model 3 versions later as a state dict)."""
    be = _stale_backend(sort_base, 3)
    return _batch(sort_base, PROCESSED, 3), copy.deepcopy(be.model.state_dict())


def _at(base, state, **opts):
    be = TorchBackend(str(base), lr=3e-3, max_grad_norm=0.0, **opts)
    be.restore(None)
    be.model.load_state_dict(state)
    return be, copy.deepcopy(be.model)


CASES = [
    dict(kind="ppo-clip"),
    dict(kind="decoupled"),
    dict(kind="tis", level="token", cap=1.1),
    dict(kind="tis", level="sequence", cap=1.1),
    dict(kind="mis", level="token", cap=1.1, cap_low=0.9),
    dict(kind="mis", level="sequence", cap=1.5, cap_low=0.5),
    dict(kind="tis", level="sequence-geo", cap=1.02),
    dict(kind="mis", level="sequence-geo", cap=1.2, cap_low=0.9),
    dict(kind="ppo-clip", clip_c=1.05),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_loss_options_match_the_reference_at_staleness_3(sort_base, stale3, case):
    batch, state = stale3
    opts = {"loss": case["kind"]}
    if "level" in case:
        opts.update(is_level=case["level"], is_cap=case["cap"], is_cap_low=case.get("cap_low", 0))
    if "clip_c" in case:
        opts["clip_ratio_c"] = case["clip_c"]
    be, start = _at(sort_base, state, **opts)
    m, fig = _compare(be, batch, start, **case)
    assert m["clip_frac_dual"] == pytest.approx(fig["clip_frac_dual"], abs=1e-9)
    if "clip_c" in case:
        assert m["clip_frac_dual"] > 0  # the dual clip binds on some tokens
    assert m["clip_frac"] == pytest.approx(fig["clip_frac"], abs=1e-9)
    assert m["behav_ratio_mean"] == pytest.approx(fig["behav_ratio_mean"], rel=1e-5)
    assert m["mismatch_kl"] == pytest.approx(fig["mismatch_kl"], rel=1e-4)
    assert m["tokens_outside_support"] == fig["tokens_outside_support"]
    assert m["mismatch_kl"] > 1e-3  # 3 versions stale: the behaviour policy is visibly other
    assert m["on_policy_tokens"] == 0  # every sample is from version 0, the trainer at 3
    if case["kind"] == "ppo-clip":
        assert m["clip_frac"] > 0  # the stale tokens are clipped against the behaviour
    else:
        assert m["clip_frac"] == 0  # one step: the proximal ratio is exactly 1
        assert m["prox_ratio_min"] == m["prox_ratio_max"] == 1.0
    if case["kind"] == "tis":
        assert m["is_truncated_frac"] == pytest.approx(fig["is_truncated_frac"])
        assert 0 < m["is_truncated_frac"] < 1
    if case["kind"] == "mis":
        assert m["is_masked_frac"] == pytest.approx(fig["is_masked_frac"])
        assert 0 < m["is_masked_frac"] < 1


@pytest.mark.parametrize(
    "estimator, case",
    [
        ("k3", {}),
        ("k3-is", {}),
        ("k3-is", dict(kind="decoupled")),
        ("k3-is", dict(kind="tis", level="token", cap=1.1)),
    ],
    ids=["k3", "k3-is-ppo-clip", "k3-is-decoupled", "k3-is-tis"],
)
def test_kl_estimators_match_the_reference(sort_base, stale3, estimator, case):
    batch, state = stale3
    opts = {"loss": case.get("kind", "ppo-clip")}
    if "level" in case:
        opts.update(is_level=case["level"], is_cap=case["cap"])
    be, start = _at(sort_base, state, kl_coef=0.5, kl_estimator=estimator, **opts)
    base_model = copy.deepcopy(be.ref_model)
    m, _ = _compare(
        be, batch, start, kl_coef=0.5, kl_estimator=estimator, ref_model=base_model, **case
    )
    assert m["kl"] > 1e-4


def test_kl_estimators_differ_off_policy(sort_base, stale3):
    batch, state = stale3
    got = {}
    for est in ("k3", "k3-is"):
        be, _ = _at(sort_base, state, kl_coef=0.5, kl_estimator=est)
        got[est] = be.train_round(batch)["loss"]
    assert abs(got["k3"] - got["k3-is"]) > 1e-6


def test_decoupled_ppo_with_two_updates_clips_against_the_proximal_policy(sort_base, stale3):
    """updates_per_round = 2: the second step's ratio is against the round-start weights."""
    batch, state = stale3
    be, start = _at(sort_base, state, loss="decoupled", updates_per_round=2, clip_eps=0.01)
    spy = _Spy(be)
    m = be.train_round(batch)
    assert len(spy.steps) == 2 and m["updates"] == 2
    half = len(batch.groups) // 2
    clipped_total = 0.0
    for k, groups in enumerate((batch.groups[:half], batch.groups[half:])):
        grads, weights = spy.steps[k]
        now = copy.deepcopy(start)
        with torch.no_grad():
            for n, p in now.named_parameters():
                p.copy_(weights[n])
        now.zero_grad()
        want, fig = ref.loss(now, start, list(groups), kind="decoupled", clip_eps=0.01)
        want.backward()
        num = sum(float((grads[n] - p.grad).pow(2).sum()) for n, p in now.named_parameters())
        den = sum(float(p.grad.pow(2).sum()) for _, p in now.named_parameters())
        assert den > 0 and (num / den) ** 0.5 < 2e-4, (k, (num / den) ** 0.5)
        clipped_total += fig["clip_frac"]
    assert clipped_total > 0  # the second step moved past the 1% band on some tokens
    assert m["prox_ratio_min"] < 1.0 < m["prox_ratio_max"]


def test_identical_weights_and_settings_give_zero_mismatch(sort_base):
    """The hf engine and the trainer on the same weights: the behaviour ratio is 1 and the
    mismatch KL 0 to float precision, with plain and with processed sampling."""
    settings = [
        SamplingParams(max_new_tokens=6),
        SamplingParams(max_new_tokens=6, temperature=0.7),
        SamplingParams(max_new_tokens=6, top_k=4),
        SamplingParams(max_new_tokens=6, top_p=0.8),
        SamplingParams(max_new_tokens=6, temperature=0.7, top_k=4, top_p=0.8),
    ]
    for sp in settings:
        be = TorchBackend(str(sort_base))
        be.restore(None)
        m = be.train_round(_batch(sort_base, sp, 0, seed=3))
        assert m["on_policy_tokens"] == m["tokens"] > 0
        assert m["mismatch_kl"] < 1e-9 and m["mismatch_kl_on_policy"] < 1e-9, (sp, m)
        assert abs(m["mismatch_k1"]) < 1e-5, (sp, m)
        assert 1 - 1e-4 < m["behav_ratio_min"] <= m["behav_ratio_max"] < 1 + 1e-4, (sp, m)
        assert m["clip_frac"] == 0 and m["tokens_outside_support"] == 0


def test_processing_left_out_is_what_the_mismatch_kl_catches(sort_base):
    """Without the record (legacy groups), top-k tokens are scored under the full softmax."""
    batch = _batch(sort_base, SamplingParams(max_new_tokens=6, top_k=4), 0, seed=3)
    legacy = attrs.evolve(batch, groups=tuple(attrs.evolve(g, sampling=None) for g in batch.groups))
    be = TorchBackend(str(sort_base))
    be.restore(None)
    m = be.train_round(legacy)
    print(m)
    assert m["behav_ratio_max"] < 0.95 and m["mismatch_kl"] > 0.01


def test_trainer_temperature_other_than_the_groups_is_refused(sort_base):
    batch = _batch(sort_base, SamplingParams(max_new_tokens=6, temperature=1.0), 0)
    be = TorchBackend(str(sort_base), temperature=0.7)
    be.restore(None)
    with pytest.raises(ConfigError, match="temperature 1, but trainer.backend_options"):
        be.train_round(batch)
    same = TorchBackend(str(sort_base), temperature=1.0)
    same.restore(None)
    assert same.train_round(batch)["mismatch_kl"] < 1e-9


@pytest.mark.parametrize(
    "opts, ref_kw",
    [
        ({}, {}),
        ({"adv_std": "sample", "adv_eps": 1e-4}, {"ddof": 1, "eps": 1e-4}),
        (
            {"adv_std": "sample", "adv_eps": 1e-4, "min_reward_spread": 0.3},
            {"ddof": 1, "eps": 1e-4, "min_spread": 0.3},
        ),
    ],
    ids=["population", "sample", "sample-spread"],
)
def test_advantage_options_match_the_reference(sort_base, stale3, opts, ref_kw):
    batch, state = stale3
    # rewards with a nearly-equal group and a spread of 0.25
    noisy = [0.5, 0.5, 0.5, 0.5 + 1e-5]
    spread = [0.5, 0.75, 0.5, 0.5]
    groups = list(batch.groups)
    for k, rs in ((0, noisy), (1, spread)):
        groups[k] = attrs.evolve(
            groups[k],
            samples=tuple(
                attrs.evolve(s, reward=r) for s, r in zip(groups[k].samples, rs, strict=True)
            ),
        )
    batch = attrs.evolve(batch, groups=tuple(groups))
    be, start = _at(sort_base, state, **opts)
    m, _ = _compare(be, batch, start, **ref_kw)
    want_equal = sum(
        ref.advantages(
            [s.reward for s in g.samples],
            ddof=ref_kw.get("ddof", 0),
            eps=ref_kw.get("eps", 1e-6),
            min_spread=ref_kw.get("min_spread", 0.0),
        )
        is None
        for g in batch.groups
    )
    assert m["groups_skipped_equal"] == want_equal
    if "min_reward_spread" in opts:
        assert m["groups_equal_by_spread"] >= 2  # the noisy and the 0.25 group at least
    else:
        assert m["groups_equal_by_spread"] == 0


def test_sample_std_and_eps_tame_a_nearly_equal_group():
    from . import reference as r

    pop = r.advantages([0.5, 0.5, 0.5, 0.5 + 1e-5], ddof=0, eps=1e-6, min_spread=0)
    trl = r.advantages([0.5, 0.5, 0.5, 0.5 + 1e-5], ddof=1, eps=1e-4, min_spread=0)
    assert pop[0] == pytest.approx(-0.47, abs=0.01) and pop[3] == pytest.approx(1.41, abs=0.01)
    assert trl[0] == pytest.approx(-0.0238, abs=1e-3) and trl[3] == pytest.approx(0.0714, abs=1e-3)


def test_bad_options_are_refused(sort_base):
    for kw, word in [
        ({"loss": "grpo"}, "loss"),
        ({"is_level": "batch"}, "is_level"),
        ({"kl_estimator": "k2"}, "kl_estimator"),
        ({"adv_std": "mad"}, "adv_std"),
        ({"is_cap": 1.0, "is_cap_low": 1.5}, "is_cap"),
        ({"updates_per_round": 0}, "updates_per_round"),
        ({"temperature": 0}, "temperature"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c"),
    ]:
        with pytest.raises(ConfigError, match=word):
            TorchBackend(str(sort_base), **kw)
