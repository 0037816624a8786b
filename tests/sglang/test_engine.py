"""The sglang engine against the SGLang 0.5.23 protocol test server (a real tiny model).

Tests taking ``target`` also run against a real SGLang server (``YETO_SGLANG_URL``,
``scripts/gpu-check-sglang.sh``); those taking ``server`` need the protocol
server's failure injection and are skipped there.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from sgl_helpers import (
    filtered_logprob,
    hf_model,
    make_full_release,
    make_lora_release,
    merged_model,
    prompt_scores,
    token_logits,
)

from yeto_core.errors import ReleaseError
from yeto_core.records import SamplingParams
from yeto_core.sampler import fingerprint as fp

PROMPTS = ["3142:", "9087:", "5511:"]


def test_samples_carry_behaviour_logprobs_at_the_sampling_temperature(target, engine_for) -> None:
    tiny_base = target.model
    eng = engine_for(target.url)
    ids = [eng.encode(p) for p in PROMPTS]
    sp = SamplingParams(max_new_tokens=6, temperature=0.6)
    groups = eng.generate(ids, 4, sp)
    model = hf_model(tiny_base)
    assert [len(g) for g in groups] == [4, 4, 4]
    for prompt, group in zip(ids, groups, strict=True):
        for c in group:
            assert c.weight_version == 0 and c.finish_reason in ("stop", "length")
            assert len(c.logprobs) == len(c.tokens) > 0
            want = torch.log_softmax(token_logits(model, prompt, c.tokens.tolist()) / 0.6, dim=-1)
            ref = [float(want[t, tok]) for t, tok in enumerate(c.tokens.tolist())]
            np.testing.assert_allclose(c.logprobs, ref, atol=target.atol)
            raw = torch.log_softmax(token_logits(model, prompt, c.tokens.tolist()), dim=-1)
            raw_ref = [float(raw[t, tok]) for t, tok in enumerate(c.tokens.tolist())]
            assert np.max(np.abs(np.asarray(raw_ref) - c.logprobs)) > 1e-3  # T matters
    if target.real:
        return
    body = [b for r, b in target.srv.log if r == "/generate"][-1]
    assert body["sampling_params"]["top_k"] == -1  # yeto's 0 is SGLang's -1 (off)
    assert body["sampling_params"]["temperature"] == 0.6 and body["return_logprob"] is True
    assert len(body["input_ids"]) == 12 and body["logprob_start_len"] == -1


def test_top_k_and_top_p_logprobs_are_renormalised_over_the_kept_set(target, engine_for) -> None:
    tiny_base = target.model
    eng = engine_for(target.url)
    ids = [eng.encode(p) for p in PROMPTS]
    sp = SamplingParams(max_new_tokens=5, temperature=0.8, top_k=5, top_p=0.7)
    groups = eng.generate(ids, 3, sp)
    if not target.real:
        body = [b for r, b in target.srv.log if r == "/generate"][-1]
        assert body["top_logprobs_num"] == 5 and body["sampling_params"]["top_k"] == 5
    model = hf_model(tiny_base)
    for prompt, group in zip(ids, groups, strict=True):
        for c in group:
            logits = token_logits(model, prompt, c.tokens.tolist())
            ref = [
                filtered_logprob(logits[t], tok, 0.8, 5, 0.7)
                for t, tok in enumerate(c.tokens.tolist())
            ]
            np.testing.assert_allclose(c.logprobs, ref, atol=target.atol)


def test_top_p_without_top_k_is_refused_unless_the_nucleus_is_requested(target, engine_for) -> None:
    tiny_base = target.model
    eng = engine_for(target.url)
    ids = [eng.encode("1234:")]
    with pytest.raises(ValueError, match="nucleus_top_logprobs"):
        eng.generate(ids, 2, SamplingParams(max_new_tokens=3, top_p=0.9))
    eng2 = engine_for(target.url, nucleus_top_logprobs=16)
    (group,) = eng2.generate(ids, 2, SamplingParams(max_new_tokens=3, temperature=1.0, top_p=0.9))
    model = hf_model(tiny_base)
    for c in group:
        logits = token_logits(model, ids[0], c.tokens.tolist())
        ref = [filtered_logprob(logits[t], tok, 1.0, 0, 0.9) for t, tok in enumerate(c.tokens)]
        np.testing.assert_allclose(c.logprobs, ref, atol=target.atol)


def test_prompt_logprobs_are_the_fingerprint_scores(target, engine_for) -> None:
    tiny_base = target.model
    eng = engine_for(target.url)
    probes = fp.probe_set(int(eng.vocab_size))
    got = eng.prompt_logprobs(probes)
    model = hf_model(tiny_base)
    want = fp.record(lambda ps: [prompt_scores(model, p) for p in ps], probes)
    check = fp.compare(want, got)
    assert check.ok and check.max_abs_dev < target.atol, check.detail
    if not target.real:
        body = [b for r, b in target.srv.log if r == "/generate"][-1]
        assert body["logprob_start_len"] == 0


def test_full_release_is_served_under_its_version(target, engine_for, tmp_path) -> None:
    tiny_base = target.model
    eng = engine_for(target.url)
    rel = make_full_release(tiny_base, tmp_path / "r1", seed=1)
    assert eng.served_checksum() == f"base:{tiny_base.name}"
    eng.load_release(rel)
    if not target.real:
        log = target.srv.log
        routes = [r for r, _ in log]
        i = routes.index("/update_weights_from_disk")
        assert routes[i - 1] == "/pause_generation" and routes[i + 1] == "/continue_generation"
        body = log[i][1]
        assert body == {"model_path": rel.path, "weight_version": "1", "flush_cache": True}
        assert log[i - 1][1] == {"mode": "abort"}
    assert eng.served_checksum() == rel.weight_checksum
    new = hf_model(Path(rel.path))
    probes = fp.probe_set(16)
    want = fp.record(lambda ps: [prompt_scores(new, p) for p in ps], probes)
    assert fp.compare(want, eng.prompt_logprobs(probes), overrides={"float32": target.atol}).ok
    (group,) = eng.generate([eng.encode("4321:")], 2, SamplingParams(max_new_tokens=4))
    assert all(c.weight_version == 1 for c in group)


@pytest.mark.parametrize("kind", ["success_false", "http_500", "drop_before"])
def test_a_failed_reload_keeps_the_previous_policy_serving(
    server, engine_for, tiny_base, tmp_path, kind
) -> None:
    eng = engine_for(server.url)
    good = make_full_release(tiny_base, tmp_path / "r1", seed=1)
    eng.load_release(good)
    probes = fp.probe_set(16)
    before = eng.prompt_logprobs(probes)
    bad = make_full_release(tiny_base, tmp_path / "r2", seed=2)
    server.inject("/update_weights_from_disk", kind)
    with pytest.raises(ReleaseError, match="keeps serving"):
        eng.load_release(bad)
    assert server.paused is None  # continued after the failure
    assert eng.served_checksum() == good.weight_checksum
    np.testing.assert_allclose(eng.prompt_logprobs(probes), before, atol=0)
    (group,) = eng.generate([eng.encode("12:")], 2, SamplingParams(max_new_tokens=3))
    assert all(c.weight_version == 1 for c in group)
    assert eng.counters.load_failures == 1


def test_a_connection_dropped_after_the_reload_is_checked_by_reading_the_version_back(
    server, engine_for, tiny_base, tmp_path
) -> None:
    eng = engine_for(server.url)
    rel = make_full_release(tiny_base, tmp_path / "r3", seed=3)
    server.inject("/update_weights_from_disk", "drop_after")
    eng.load_release(rel)  # the server did load it: weight_version reads "3"
    assert eng.served_checksum() == rel.weight_checksum and eng.version == 3


def test_a_broken_release_dir_is_refused_by_the_server(target, engine_for, tmp_path) -> None:
    tiny_base = target.model
    eng = engine_for(target.url)
    rel = make_full_release(tiny_base, tmp_path / "r4", seed=4)
    (Path(rel.path) / "model.safetensors").unlink()
    with pytest.raises(ReleaseError, match="refused to load"):
        eng.load_release(rel)
    assert eng.served_checksum() == f"base:{tiny_base.name}"


def test_lora_releases_load_switch_and_roll_back(target, engine_for, tmp_path) -> None:
    tiny_base = target.model
    eng = engine_for(target.url)
    tol = {"float32": target.atol}
    probes = fp.probe_set(16)
    base_scores = eng.prompt_logprobs(probes)
    releases = [make_lora_release(tiny_base, tmp_path / f"l{k}", seed=k) for k in (1, 2, 3)]
    for rel in releases:
        eng.load_release(rel)
        merged = merged_model(tiny_base, rel)
        want = fp.record(lambda ps, m=merged: [prompt_scores(m, p) for p in ps], probes)
        check = fp.compare(want, eng.prompt_logprobs(probes), overrides=tol)
        assert check.ok, check.detail
        assert eng.served_checksum() == rel.weight_checksum
        (group,) = eng.generate([eng.encode("77:")], 2, SamplingParams(max_new_tokens=3))
        assert all(c.weight_version == rel.version for c in group)
        if not target.real:
            body = [b for r, b in target.srv.log if r == "/generate"][-1]
            assert body["lora_path"] == [f"yeto-{rel.release_id}"] * 2
    # the current and the previous adapter stay loaded; the one before is unloaded
    assert sorted(eng._adapters) == ["yeto-2", "yeto-3"]
    if not target.real:
        assert sorted(target.srv.adapters) == ["yeto-2", "yeto-3"]
        unloads = [b for r, b in target.srv.log if r == "/unload_lora_adapter"]
        assert unloads == [{"lora_name": "yeto-1"}]
    eng.rollback()
    assert eng.version == 2 and sorted(eng._adapters) == ["yeto-2"]
    merged = merged_model(tiny_base, releases[1])
    want = fp.record(lambda ps: [prompt_scores(merged, p) for p in ps], probes)
    assert fp.compare(want, eng.prompt_logprobs(probes), overrides=tol).ok
    base_fp = fp.record(lambda ps: base_scores, probes)
    assert not fp.compare(base_fp, eng.prompt_logprobs(probes), overrides=tol).ok


def test_lora_the_server_would_refuse_is_refused_first(server, engine_for, tiny_base, tmp_path):
    eng = engine_for(server.url)
    big = make_lora_release(tiny_base, tmp_path / "big", seed=5, rank=16)
    with pytest.raises(ReleaseError, match="max-lora-rank"):
        eng.load_release(big)
    other = make_lora_release(tiny_base, tmp_path / "o", seed=6, targets=("q_proj", "o_proj"))
    with pytest.raises(ReleaseError, match="o_proj"):
        eng.load_release(other)
    assert "/load_lora_adapter" not in [r for r, _ in server.log]
    ok = make_lora_release(tiny_base, tmp_path / "ok", seed=7)
    server.inject("/load_lora_adapter", "success_false")
    with pytest.raises(ReleaseError, match="refused the LoRA adapter"):
        eng.load_release(ok)
    assert eng.version == 0 and eng.served_checksum() == "base:tiny"


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_a_reload_during_generation_pauses_and_redraws_what_it_interrupted(
    tiny_base, engine_for, tmp_path, mode
) -> None:
    if os.environ.get("YETO_SGLANG_URL"):
        pytest.skip("needs the protocol server's slowed decode steps to land a reload mid-batch")
    from yeto_sglang.testing.server import ProtocolServer

    srv = ProtocolServer(str(tiny_base), weight_version="0", step_delay_s=0.02).start()
    try:
        eng = engine_for(srv.url, pause_mode=mode, server={})
        rel = make_full_release(tiny_base, tmp_path / "r", seed=9)
        ids = [eng.encode(p) for p in PROMPTS]
        sp = SamplingParams(max_new_tokens=12, temperature=1.0, stop_token_ids=())
        result: dict = {}

        def run() -> None:
            result["groups"] = eng.generate(ids, 4, sp)

        t = threading.Thread(target=run)
        t.start()
        srv.wait_for_steps(3)  # the batch is mid-generation
        eng.load_release(rel)
        t.join(120)
        assert not t.is_alive()
        groups = result["groups"]
        assert [len(g) for g in groups] == [4, 4, 4]
        versions = {c.weight_version for g in groups for c in g}
        assert versions <= {0, 9}
        interrupted = eng.counters.aborted_redrawn + eng.counters.mixed_version_dropped
        assert interrupted > 0
        if mode == "abort":
            assert eng.counters.aborted_redrawn > 0
        else:
            assert eng.counters.mixed_version_dropped > 0
        upd = [b for r, b in srv.log if r == "/update_weights_from_disk"][-1]
        assert upd["flush_cache"] is (mode != "in_place")
        assert [b for r, b in srv.log if r == "/pause_generation"] == [{"mode": mode}]
        # every redrawn sample came from the new weights, each with its behaviour log-probs
        new = hf_model(Path(rel.path))
        for prompt, g in zip(ids, groups, strict=True):
            for c in g:
                if c.weight_version == 9:
                    lp = torch.log_softmax(token_logits(new, prompt, c.tokens.tolist()), dim=-1)
                    ref = [float(lp[t, tok]) for t, tok in enumerate(c.tokens.tolist())]
                    np.testing.assert_allclose(c.logprobs, ref, atol=1e-5)
        if mode == "in_place":
            eng.generate(ids[:1], 2, SamplingParams(max_new_tokens=2))
            assert eng.counters.cache_flushes == 1
            assert "/flush_cache" in [r for r, _ in srv.log]
        assert srv.violations == []
    finally:
        srv.stop()


def test_the_protocol_server_refuses_unknown_fields(server) -> None:
    r = httpx.post(f"{server.url}/generate", json={"input_id": [1, 2], "sampling_params": {}})
    assert r.status_code == 400 and "input_id" in r.json()["error"]["message"]
    r = httpx.post(
        f"{server.url}/generate", json={"input_ids": [1, 2], "sampling_params": {"max_tokens": 2}}
    )
    assert r.status_code == 400 and "max_tokens" in r.text
    r = httpx.post(
        f"{server.url}/generate", json={"input_ids": [1, 2], "sampling_params": {"top_k": 0}}
    )
    assert r.status_code == 400 and "top_k must be -1" in r.text
    assert len(server.violations) == 3
    server.violations.clear()


def test_attach_checks_the_server_arguments(target, tmp_path) -> None:
    tiny_base = target.model
    from yeto_sglang.engine import EngineError, SGLangEngine

    with pytest.raises(ValueError, match="enable_return_routed_experts"):
        SGLangEngine(str(tiny_base), base_url=target.url, routed_experts=True)
    other = tmp_path / "other"
    other.mkdir()
    for f in Path(tiny_base).iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    with pytest.raises(EngineError, match="tokenizer_path"):
        SGLangEngine(str(other), base_url=target.url)
    with pytest.raises(ValueError, match="exactly one of base_url"):
        SGLangEngine(str(tiny_base))
