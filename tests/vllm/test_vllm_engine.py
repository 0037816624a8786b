"""The vllm engine against a real vLLM server on 127.0.0.1 (one per session, float32)."""

from __future__ import annotations

import json
import signal
import time

import numpy as np
import pytest
import torch

from yeto_core.records import LocalRelease, SamplingParams
from yeto_core.release.store import ReleaseStore
from yeto_core.sampler import fingerprint as fp
from yeto_core.sampler.engine_server import INFRA_FAILED, InfraFailedError
from yeto_core.sampler.follower import PolicyFollower
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.contracts import SamplerEngineContract
from yeto_torch import lora as lora_mod
from yeto_torch import model as tiny
from yeto_torch.export import export_full, export_lora
from yeto_torch.sampling import process_logits, prompt_logprobs
from yeto_torch.tasks import SortDigits

PROMPTS = 4


def task_prompts(engine, n=PROMPTS, start=0):
    task = SortDigits(seed=0)
    return [engine.encode(task.prompt(i)[0]) for i in range(start, start + n)]


def perturbed(base_dir, seed, scale=0.05):
    m = tiny.load_model(base_dir).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return m


def fingerprint_of(model):
    probes = fp.probe_set(int(model.config.vocab_size))
    return fp.record(lambda p: prompt_logprobs(model, p), probes).to_json()


def publish_full(releases, model, base_dir, out_dir, version, tamper=None):
    """Export ``model`` as a release with its fingerprint; ``tamper(out_dir)`` edits the files after."""
    info = export_full(model, base_dir, out_dir)
    info[fp.INFO_KEY] = fingerprint_of(model)
    if tamper is not None:
        tamper(out_dir)
    info["version"] = version
    return releases.publish(out_dir, info)


@pytest.fixture
def follow(vllm_engine, tmp_path):
    events = []
    releases = ReleaseStore(DirStore(tmp_path / "store"))
    follower = PolicyFollower(releases, vllm_engine, work_dir=tmp_path / "work", emit=events.append)
    return releases, follower, events


def transformers_logprobs(model, prompt, tokens, temperature):
    ids = torch.as_tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    lp = process_logits(logits, temperature, 0, 1.0)
    return lp.gather(-1, torch.as_tensor(tokens)[:, None])[:, 0].numpy()


def test_behaviour_logprobs_equal_transformers_at_the_sampling_temperature(vllm_engine, sort_base):
    model = tiny.load_model(sort_base).eval()
    prompts = task_prompts(vllm_engine)
    sp = SamplingParams(max_new_tokens=8, temperature=0.7, seed=5)
    out = vllm_engine.generate(prompts, 4, sp)
    assert len(out) == PROMPTS and all(len(g) == 4 for g in out)
    worst = 0.0
    eos = tiny.eos_id(tiny.load_tokenizer(sort_base))
    for prompt, group in zip(prompts, out, strict=True):
        assert len({tuple(c.tokens) for c in group}) > 1  # n samples, not one repeated
        for c in group:
            assert c.weight_version == 0 and len(c.tokens) == len(c.logprobs) > 0
            assert c.finish_reason in ("stop", "length")
            if c.finish_reason == "length":
                assert len(c.tokens) == sp.max_new_tokens
            else:
                assert int(c.tokens[-1]) == eos
            ref = transformers_logprobs(model, prompt, [int(t) for t in c.tokens], 0.7)
            worst = max(worst, float(np.max(np.abs(ref - c.logprobs))))
            # raw (T=1) log-probs differ: the server really applies the temperature
            raw = transformers_logprobs(model, prompt, [int(t) for t in c.tokens], 1.0)
            assert float(np.max(np.abs(raw - c.logprobs))) > 1e-3
    assert worst < 1e-4, f"vLLM vs transformers behaviour log-probs: max deviation {worst}"


def test_top_k_and_stop_tokens(vllm_engine, sort_base):
    prompts = task_prompts(vllm_engine, 2)
    model = tiny.load_model(sort_base).eval()
    stop = vllm_engine.encode("5")[-1]
    vllm_engine.top_logprobs = 3
    try:
        out = vllm_engine.generate(
            prompts, 3, SamplingParams(max_new_tokens=8, temperature=1.0, top_k=4, seed=3,
                                       stop_token_ids=(stop,))
        )  # fmt: skip
    finally:
        vllm_engine.top_logprobs = 0
    tops = vllm_engine.last_top_logprobs
    assert len(tops) == 6 and all(len(pos) >= 3 for sample in tops for pos in sample)
    for prompt, group in zip(prompts, out, strict=True):
        for c in group:
            toks = [int(t) for t in c.tokens]
            assert stop not in toks[:-1]
            if c.finish_reason == "stop" and toks[-1] == stop:
                pass  # the stop token ends the sample
            ids = torch.as_tensor([list(prompt) + toks])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            ref = process_logits(logits, 1.0, 4, 1.0).gather(-1, torch.as_tensor(toks)[:, None])
            assert np.max(np.abs(ref[:, 0].numpy() - c.logprobs)) < 1e-4  # top-k renormalised


def test_release_changes_outputs_and_its_fingerprint_matches(
    follow, vllm_engine, sort_base, tmp_path
):
    releases, follower, events = follow
    prompts = task_prompts(vllm_engine)
    sp = SamplingParams(max_new_tokens=8, temperature=1.0, seed=11)
    before = vllm_engine.generate(prompts, 2, sp)
    model = perturbed(sort_base, seed=1)
    publish_full(releases, model, sort_base, tmp_path / "r1", 1)
    assert follower.poll() == "loaded"
    loaded = [e for e in events if e.kind == "release_loaded"][-1].data
    assert loaded["verified"] is True and loaded["max_abs_dev"] < 1e-4
    after = vllm_engine.generate(prompts, 2, sp)
    assert all(c.weight_version == 1 for g in after for c in g)
    changed = [
        not np.allclose(a.logprobs[:1], b.logprobs[:1]) for ga, gb in zip(before, after, strict=True)
        for a, b in zip(ga, gb, strict=True)
    ]  # fmt: skip
    assert all(changed)
    # what it serves is the new policy: its log-probs equal transformers' under the release
    ref = transformers_logprobs(model, prompts[0], [int(t) for t in after[0][0].tokens], 1.0)
    assert np.max(np.abs(ref - after[0][0].logprobs)) < 1e-4


def _drop_rope_theta(out_dir):
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["rope_parameters"].pop("rope_theta")
    (out_dir / "config.json").write_text(json.dumps(cfg))


def _flip_one_weight(out_dir):
    from safetensors.torch import load_file, save_file

    path = out_dir / "model.safetensors"
    w = load_file(str(path))
    t = w["model.layers.0.self_attn.q_proj.weight"].view(-1)
    i = int(t.abs().argmax())
    t[i] = -t[i]
    save_file(w, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "tamper, reason",
    [(_drop_rope_theta, "engine_refused"), (_flip_one_weight, "fingerprint_mismatch")],
    ids=["dropped-rope_theta", "one-flipped-weight"],
)
def test_bad_release_is_refused_and_the_previous_policy_keeps_serving(
    follow, vllm_engine, sort_base, tmp_path, tamper, reason
):
    releases, follower, events = follow
    good = perturbed(sort_base, seed=2)
    publish_full(releases, good, sort_base, tmp_path / "r1", 1)
    assert follower.poll() == "loaded"
    publish_full(releases, perturbed(sort_base, seed=3), sort_base, tmp_path / "r2", 2, tamper)
    assert follower.poll() == "refused"
    refused = [e for e in events if e.kind == "release_refused"][-1].data
    assert refused["reason"] == reason and refused["kept_version"] == 1
    if reason == "fingerprint_mismatch":
        assert refused["max_abs_dev"] > 10 * refused["tolerance"]
    else:
        assert "rope_parameters" in refused["detail"]
    # the previous policy keeps serving, stamped with its version
    check = follower.verify_served("test")
    assert check is not None and check.ok and check.max_abs_dev < 1e-4
    out = vllm_engine.generate(task_prompts(vllm_engine, 1), 2, SamplingParams(seed=1))
    assert all(c.weight_version == 1 for c in out[0])


def test_lora_release_load_and_unload(follow, vllm_engine, sort_base, tmp_path):
    releases, follower, events = follow
    model = tiny.load_model(sort_base).eval()
    lora_mod.apply_lora(model, rank=8, alpha=16.0, seed=0, targets=("q_proj", "v_proj"))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for m in lora_mod.lora_modules(model).values():
            m.lora_B.add_(torch.randn(m.lora_B.shape, generator=g) * 0.2)
    out = tmp_path / "lora1"
    info = export_lora(model, sort_base, out, base_checksum="base")
    info[fp.INFO_KEY] = fingerprint_of(model)
    info["version"] = 1
    releases.publish(out, info)
    base_fp = vllm_engine.prompt_logprobs(fp.probe_set(16)[:1])
    assert follower.poll() == "loaded"
    loaded = [e for e in events if e.kind == "release_loaded"][-1].data
    assert loaded["verified"] is True, loaded
    lora_fp = vllm_engine.prompt_logprobs(fp.probe_set(16)[:1])
    assert max(abs(a - b) for a, b in zip(base_fp[0], lora_fp[0], strict=True)) > 1e-2
    gen = vllm_engine.generate(task_prompts(vllm_engine, 1), 2, SamplingParams(seed=2))
    assert all(c.weight_version == 1 for c in gen[0])
    # unload: back to the base
    vllm_engine.rollback()
    again = vllm_engine.prompt_logprobs(fp.probe_set(16)[:1])
    assert max(abs(a - b) for a, b in zip(base_fp[0], again[0], strict=True)) < 1e-5
    models = vllm_engine.http.get(vllm_engine.url + "/v1/models").json()["data"]
    assert [m["id"] for m in models if m.get("parent")] == []


def test_killed_server_is_restarted_and_the_island_keeps_appending(
    follow, vllm_engine, sort_base, tmp_path
):
    from yeto_core.buffer.sample_buffer import FileSampleBuffer
    from yeto_core.sampler.loop import SamplerLoop

    releases, follower, events = follow
    publish_full(releases, perturbed(sort_base, seed=5), sort_base, tmp_path / "r1", 1)
    assert follower.poll() == "loaded"
    checks = []
    vllm_engine._listeners.append(lambda: checks.append(follower.verify_served("restart")))
    buffer = FileSampleBuffer(DirStore(tmp_path / "buf"), host="s-0")
    loop = SamplerLoop(
        buffer, vllm_engine, SortDigits(seed=0), follower, host="s-0", incarnation=0,
        group_size=2, prompts_per_round=2, sampling=SamplingParams(max_new_tokens=6),
    )  # fmt: skip
    try:
        assert len(loop.run_round()) == 2
        pid = vllm_engine.server.pid
        vllm_engine.server.kill(signal.SIGKILL)
        t0 = time.monotonic()
        positions = loop.run_round()  # waits for the restart, then appends
        assert len(positions) == 2 and loop.groups_appended == 4
        assert vllm_engine.server.pid != pid and vllm_engine.server.restarts >= 1
        kinds = [e.kind for e in vllm_engine.test_events]
        assert "engine_server_died" in kinds and "engine_server_restarted" in kinds
        assert "engine_release_restored" in kinds
        # the restarted server serves release 1 again, and its fingerprint says so
        deadline = time.monotonic() + 60
        while not checks and time.monotonic() < deadline:
            time.sleep(0.05)
        assert checks and checks[-1] is not None and checks[-1].ok
        print(f"restart to next appended round: {time.monotonic() - t0:.1f} s")
    finally:
        vllm_engine._listeners.clear()


def test_failed_starts_end_in_infra_failed(vllm_python, sort_base, tmp_path):
    from yeto_vllm.engine import VLLMEngine

    events = []
    with pytest.raises(InfraFailedError) as err:
        VLLMEngine(
            str(sort_base),
            python=vllm_python,
            server_args=["--max-model-len", "100000"],  # over the model's 64 positions
            max_restarts=1,
            backoff_s=0.1,
            start_timeout_s=300,
            emit=events.append,
            log_dir=str(tmp_path),
        )
    assert err.value.code == INFRA_FAILED
    kinds = [e.kind for e in events]
    # the failed construction still stops (and reports) the dead server's process group
    assert kinds == [
        "engine_server_start_failed",
        "engine_server_infra_failed",
        "engine_server_stopped",
    ]
    assert "exited with code" in events[0].data["reason"]
    assert (tmp_path / "vllm-server.log").read_text().strip()


class TestVLLMEngineContract(SamplerEngineContract):
    """The SamplerEngine contract suite, run on the session's real vLLM server."""

    @pytest.fixture
    def make_engine(self, vllm_engine):
        from yeto_vllm.engine import VLLMEngine

        class Shared(VLLMEngine):  # the session's engine: closing it would end its server
            def close(self):
                self.restore_base()

        def make():
            shared = Shared.__new__(Shared)
            shared.__dict__ = vllm_engine.__dict__
            return shared

        return make

    @pytest.fixture
    def make_release(self, sort_base):
        def make(tmp_path, version):
            out = tmp_path / f"contract-{version}"
            info = export_full(perturbed(sort_base, seed=100 + version), sort_base, out)
            return LocalRelease(
                version=version,
                release_id=str(version),
                path=str(out),
                kind="full",
                weight_checksum=info["weight_checksum"],
            )

        return make
