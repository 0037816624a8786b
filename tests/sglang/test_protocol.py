"""Decoding of recorded SGLang 0.5.23 answers, behaviour log-probs, server options."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from yeto_sglang import protocol as P
from yeto_sglang.options import ServerOptions, check_options, server_args, server_options_from

SHARED = Path("/work/shared/engines/sglang")
PACKAGED = Path(P.__file__).parent / "testing" / "recorded"


def recorded(name: str):
    """The recorded answer (the shared copy when present, else the packaged one)."""
    src = SHARED / name if (SHARED / name).is_file() else PACKAGED / name
    return json.loads(src.read_text())


def test_packaged_recordings_equal_the_shared_ones() -> None:
    if not SHARED.is_dir():
        pytest.skip("the shared recordings are not on this machine")
    for f in PACKAGED.iterdir():
        assert f.read_bytes() == (SHARED / f.name).read_bytes(), f.name


def test_decodes_the_recorded_generate_answer() -> None:
    item = recorded("generate_logprobs.json")
    out = P.decode_generate(item, prompt_len=3)
    assert out.output_ids == (230, 87, 271, 99)
    assert out.finish_type == "length"
    assert out.weight_version == "default"
    assert out.weight_spans == (("default", 0, 4),)
    assert out.versions == ("default",)
    assert out.token_logprobs is not None
    np.testing.assert_allclose(
        out.token_logprobs,
        [-5.340977191925049, -5.174460411071777, -5.24571418762207, -5.248183250427246],
    )
    assert out.top_logprobs is not None and len(out.top_logprobs) == 4
    assert out.top_logprobs[0][0] == (-5.340977191925049, 230)
    # logprob_start_len 0: a null first entry, then one per prompt token
    assert out.input_logprobs == [None, -6.036215782165527, -5.611472129821777]


def test_mismatched_logprob_rows_are_protocol_errors() -> None:
    item = recorded("generate_logprobs.json")
    item["meta_info"]["output_token_logprobs"] = item["meta_info"]["output_token_logprobs"][:3]
    with pytest.raises(P.ProtocolError, match="3 entries for 4"):
        P.decode_generate(item, prompt_len=3)
    item = recorded("generate_logprobs.json")
    item["meta_info"]["output_token_logprobs"][1][1] = 5
    with pytest.raises(P.ProtocolError, match="does not match"):
        P.decode_generate(item, prompt_len=3)


def test_routed_experts_round_trip_and_shape_check() -> None:
    arr = np.arange(6 * 2 * 2, dtype=np.int32).reshape(6, 2, 2) % 4
    data = P.encode_routed_experts(arr)
    back = P.decode_routed_experts(data, tokens=7, layers=2, top_k=2)
    assert back.dtype == np.int32 and back.shape == (6, 2, 2)
    np.testing.assert_array_equal(back, arr)
    with pytest.raises(P.ProtocolError, match="needs 28"):
        P.decode_routed_experts(data, tokens=8, layers=2, top_k=2)
    item = recorded("generate_logprobs.json")
    item["meta_info"]["routed_experts"] = P.encode_routed_experts(np.zeros((6, 2, 2), np.int32))
    out = P.decode_generate(item, prompt_len=3, routed_shape=(2, 2))
    assert out.routed_experts is not None and out.routed_experts.shape == (6, 2, 2)
    del item["meta_info"]["routed_experts"]
    with pytest.raises(P.ProtocolError, match="enable-return-routed-experts"):
        P.decode_generate(item, prompt_len=3, routed_shape=(2, 2))


def _fake_output(logits_rows, tokens, temperature, top_n):
    """SGLang's values for ``tokens`` drawn from ``logits_rows``: pre-filter log_softmax(z/T)."""
    lps, tops = [], []
    for z, tok in zip(logits_rows, tokens, strict=True):
        x = np.asarray(z, np.float64) / temperature
        lp = x - (x.max() + math.log(np.exp(x - x.max()).sum()))
        lps.append(lp[tok])
        order = np.argsort(-lp)[:top_n]
        tops.append([(float(lp[i]), int(i)) for i in order])
    return P.GenerateOutput(
        output_ids=tuple(tokens),
        finish_type="length",
        finish_message="",
        weight_version="0",
        weight_spans=(),
        token_logprobs=np.asarray(lps),
        top_logprobs=tops,
        input_logprobs=None,
        routed_experts=None,
        raw_meta={},
    )


def _filtered(z, tok, temperature, top_k, top_p):
    x = np.asarray(z, np.float64) / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p)
    before = np.cumsum(p[order]) - p[order]
    keep = np.zeros_like(p, dtype=bool)
    for rank, i in enumerate(order):
        keep[i] = (top_k <= 0 or rank < top_k) and before[rank] <= top_p
    q = np.where(keep, p, 0.0)
    return math.log(q[tok] / q.sum())


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (5, 0.6), (3, 0.9), (0, 1.0)])
def test_behaviour_logprobs_renormalise_over_the_kept_set(top_k: int, top_p: float) -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(6, 16)) * 2
    temperature = 0.7
    tokens = [int(np.argsort(-r)[k % 2]) for k, r in enumerate(rows)]  # inside every kept set
    out = _fake_output(rows, tokens, temperature, top_n=top_k or 0)
    got = P.behaviour_logprobs(out, temperature=temperature, top_k=top_k, top_p=top_p)
    want = [_filtered(r, t, temperature, top_k, top_p) for r, t in zip(rows, tokens, strict=True)]
    np.testing.assert_allclose(got, want, atol=1e-6)
    if top_k and top_p < 1.0:
        raw = out.token_logprobs
        assert np.all(got > raw)  # renormalised over fewer tokens


def test_top_p_without_top_k_needs_a_nucleus_cap_and_full_coverage() -> None:
    with pytest.raises(ValueError, match="nucleus_top_logprobs"):
        P.top_logprobs_needed(0.8, 0, 0.9, 0)
    assert P.top_logprobs_needed(0.8, 0, 0.9, 16) == 16
    assert P.top_logprobs_needed(0.8, 4, 0.9, 0) == 4
    assert P.top_logprobs_needed(1.0, 0, 1.0, 0) == 0
    assert P.top_logprobs_needed(0.0, 0, 0.5, 0) == 0
    rows = np.zeros((1, 16))  # uniform: the 0.9 nucleus holds 15 of 16 tokens
    out = _fake_output(rows, [0], 1.0, top_n=4)
    with pytest.raises(P.ProtocolError, match="do not cover"):
        P.behaviour_logprobs(out, temperature=1.0, top_k=0, top_p=0.9)
    out = _fake_output(rows, [0], 1.0, top_n=16)
    got = P.behaviour_logprobs(out, temperature=1.0, top_k=0, top_p=0.9, vocab_size=16)
    np.testing.assert_allclose(got, [math.log(1 / 15)], atol=1e-6)


def test_greedy_is_probability_one_and_a_token_outside_the_kept_set_is_refused() -> None:
    rows = np.random.default_rng(1).normal(size=(2, 16))
    out = _fake_output(rows, [int(np.argmax(r)) for r in rows], 1.0, top_n=0)
    np.testing.assert_array_equal(
        P.behaviour_logprobs(out, temperature=0.0, top_k=0, top_p=1.0), [0.0, 0.0]
    )
    worst = [int(np.argmin(r)) for r in rows]
    out = _fake_output(rows, worst, 1.0, top_n=3)
    with pytest.raises(P.ProtocolError, match="outside the 3 tokens"):
        P.behaviour_logprobs(out, temperature=1.0, top_k=3, top_p=1.0)


def test_wire_top_k_and_version_labels() -> None:
    assert P.wire_top_k(0) == -1 and P.wire_top_k(7) == 7
    assert P.version_number("default", {}) == 0
    assert P.version_number("12", {}) == 12
    assert P.version_number("12-r1", {}) == 12
    with pytest.raises(P.ProtocolError, match="another client"):
        P.version_number("v-other", {})


def test_field_sets_cover_the_recorded_request() -> None:
    body = {
        "input_ids": [71, 72, 73],
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "logprob_start_len": 0,
    }
    assert P.unknown_fields(body, P.GENERATE_FIELDS) == []
    assert P.unknown_fields(body["sampling_params"], P.SAMPLING_FIELDS) == []
    assert P.unknown_fields({"max_tokens": 3}, P.SAMPLING_FIELDS) == ["max_tokens"]


LLAMA = {"num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 2}


@pytest.mark.parametrize(
    ("opts", "kw", "needle"),
    [
        (ServerOptions(enable_lora=True), {}, "max_lora_rank and lora_target_modules"),
        (
            ServerOptions(
                enable_lora=True,
                max_lora_rank=8,
                lora_target_modules=("q_proj",),
                max_loaded_loras=4,
            ),
            {},
            "max_loaded_loras = 4 < max_loras_per_batch = 8",
        ),
        (
            ServerOptions(enable_lora=True, max_lora_rank=8, lora_target_modules=("all", "q_proj")),
            {},
            "'all' together",
        ),
        (ServerOptions(max_lora_rank=8), {}, "enable_lora is not"),
        (ServerOptions(tp_size=3), {"model_config": LLAMA}, "does not divide"),
        (ServerOptions(mem_fraction_static=1.5), {}, "(0, 1)"),
        (ServerOptions(max_loras_per_batch=0), {}, "must be positive"),
        (ServerOptions(), {"routed_experts": True}, "enable_return_routed_experts"),
        (
            ServerOptions(enable_return_routed_experts=True),
            {"routed_experts": True, "model_config": LLAMA},
            "routes no experts",
        ),
        (ServerOptions(), {"pause_mode": "wait"}, "abort, retract, in_place"),
        (ServerOptions(), {"release_kind": "lora"}, "--enable-lora"),
    ],
)
def test_check_options_refuses_what_sglang_refuses(opts, kw, needle) -> None:
    errors = check_options(opts, **kw)
    assert any(needle in e for e in errors), errors


def test_accepted_options_and_the_command_line(tmp_path: Path) -> None:
    opts = server_options_from(
        {
            "enable_lora": True,
            "max_lora_rank": 8,
            "lora_target_modules": ["q_proj", "v_proj"],
            "enable_fp32_lm_head": True,
            "enable_return_routed_experts": True,
            "mem_fraction_static": 0.7,
            "tp_size": 2,
        }
    )
    assert check_options(opts, model_config=LLAMA, pause_mode="in_place") == []
    args = server_args(
        opts, model_dir=str(tmp_path), host="127.0.0.1", port=1234, weight_version="0"
    )
    assert args[args.index("--tokenizer-path") + 1] == str(tmp_path.absolute())
    assert args[args.index("--model-path") + 1] == str(tmp_path.absolute())
    for flag in ("--enable-fp32-lm-head", "--enable-return-routed-experts", "--enable-lora"):
        assert flag in args
    assert args[
        args.index("--lora-target-modules") + 1 : args.index("--lora-target-modules") + 3
    ] == [
        "q_proj",
        "v_proj",
    ]
    assert args[args.index("--mem-fraction-static") + 1] == "0.7"
    assert args[args.index("--tp-size") + 1] == "2"
    with pytest.raises(TypeError, match="unknown keys"):
        server_options_from({"enable_loras": True})
