"""Tiny model, tokenizer, tasks, release export (loaded back with transformers' own loader)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from yeto_core.plugins import Plugins
from yeto_torch import plugin
from yeto_torch.backend import TorchBackend
from yeto_torch.engine import HFEngine
from yeto_torch.export import restore_dropped_keys
from yeto_torch.tasks import TASKS

from .conftest import rollout_batch


def test_plugin_registers_backend_engine_and_tasks():
    pm = Plugins(entry_points=False)
    pm.add(plugin, "torch", distribution="yeto-torch")
    assert pm.trainer_backend("torch") is TorchBackend
    assert pm.sampler_engine("hf") is HFEngine
    assert sorted(pm.names("Task")) == ["add1", "add2", "dataset", "sort4"]  # dataset: the core's
    # the hooks: yeto_register_trainer_backends, yeto_register_sampler_engines, yeto_register_tasks


def test_tasks_are_deterministic_and_score():
    t = TASKS["sort4"](seed=3)
    assert t.prompt(7) == TASKS["sort4"](seed=3).prompt(7)
    text, ans = t.prompt(7)
    assert text.endswith(":") and ans == "".join(sorted(text[:4]))
    assert t.reward(ans, ans) == 1.0 and t.reward(ans, ans[::-1] + "0") == 0.0
    assert TASKS["add2"](partial=True).reward("68", "67") == 0.5
    a, b = TASKS["add1"]().prompt(1)[0][:-1].split("+")
    assert TASKS["add1"]().prompt(1)[1] == str(int(a) + int(b))


def test_base_is_a_real_hf_checkpoint(sort_base):
    info = json.loads((sort_base / "yeto_base.json").read_text())
    assert 0.15 <= info["sampled_reward"] < 0.6
    cfg = json.loads((sort_base / "config.json").read_text())
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == cfg["head_dim"] == 32
    tok = AutoTokenizer.from_pretrained(str(sort_base), local_files_only=True)
    ids = tok("3142:")["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 6
    assert tok.decode(ids, skip_special_tokens=True) == "3142:"
    assert len(tok) == 16


@pytest.mark.parametrize("tuning", ["full", "lora"])
def test_release_export_matches_trainer(sort_base, tmp_path, tuning):
    eng = HFEngine(str(sort_base), seed=1)
    be = TorchBackend(str(sort_base), tuning=tuning, lr=5e-3, seed=0)
    be.restore(None)
    task = TASKS["sort4"]()
    for r in range(3):
        be.train_round(rollout_batch(eng, task, r * 16, 16, 8, r))
    out = tmp_path / "rel"
    info = be.publish_release(out)
    assert info["kind"] == tuning
    ids = torch.tensor([eng.encode("3142:1234")])
    with torch.no_grad():
        want = be.model(input_ids=ids).logits
    if tuning == "full":
        files = sorted(p.name for p in out.iterdir())
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
        assert (out / "tokenizer.json").read_bytes() == (sort_base / "tokenizer.json").read_bytes()
        loaded = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
        with torch.no_grad():
            got = loaded(input_ids=ids).logits
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    else:
        assert {"adapter_config.json", "adapter_model.safetensors"} == {
            p.name for p in out.iterdir()
        }
    # the engine serves exactly the checksum the export announced, and the same logits
    eng.load_release(type("R", (), {"version": 5, "path": out})())
    assert eng.served_checksum() == info["weight_checksum"]
    with torch.no_grad():
        assert torch.allclose(eng.model(input_ids=ids).logits, want, atol=1e-5)
    assert eng.generate([eng.encode("1234:")], 2)[0][0].weight_version == 5
    # the weights moved away from the base
    base = HFEngine(str(sort_base))
    assert base.served_checksum() != info["weight_checksum"]


def test_export_puts_back_dropped_config_keys_but_never_quantization_config(sort_base, tmp_path):
    base = {"a": 1, "custom_rope_note": "x", "quantization_config": {"bits": 4}, "b": 2}
    assert restore_dropped_keys(base, {"a": 3}) == {"a": 3, "custom_rope_note": "x", "b": 2}
    assert "quantization_config" not in restore_dropped_keys(base, {"quantization_config": {}})
    # end to end: a base whose config.json has a key transformers does not write back
    import shutil

    custom = tmp_path / "base"
    shutil.copytree(sort_base, custom)
    cfg = json.loads((custom / "config.json").read_text())
    cfg["yeto_test_extra_key"] = {"kept": True}
    (custom / "config.json").write_text(json.dumps(cfg))
    be = TorchBackend(str(custom))
    be.restore(None)
    be.publish_release(tmp_path / "rel")
    out = json.loads((tmp_path / "rel" / "config.json").read_text())
    assert out["yeto_test_extra_key"] == {"kept": True}
    assert "quantization_config" not in out


def test_a_release_never_carries_compression_or_quantization_config(sort_base, tmp_path):
    """A release holds trained, unquantized, uncompressed weights: neither config is copied
    from the base, nor kept from the export (issue 52 item 6)."""
    base = {"a": 1, "compression_config": {"format": "pack"}, "quantization_config": {"bits": 4}}
    out = restore_dropped_keys(base, {"a": 2, "compression_config": {"format": "dense"}})
    assert out == {"a": 2}
    # end to end: the torch backend's full release of a base whose config has both
    import shutil

    custom = tmp_path / "base"
    shutil.copytree(sort_base, custom)
    cfg = json.loads((custom / "config.json").read_text())
    cfg["compression_config"] = {"format": "dense", "yeto_test": True}
    (custom / "config.json").write_text(json.dumps(cfg))
    be = TorchBackend(str(custom))
    be.restore(None)
    be.publish_release(tmp_path / "rel")
    released = json.loads((tmp_path / "rel" / "config.json").read_text())
    assert "compression_config" not in released and "quantization_config" not in released


def test_engine_logprobs_are_at_the_sampling_temperature(sort_base):
    eng = HFEngine(str(sort_base), seed=2)
    from yeto_core.records import SamplingParams

    p = eng.encode("5021:")
    comp = eng.generate([p], 1, SamplingParams(max_new_tokens=6, temperature=0.7, seed=4))[0][0]
    full = torch.tensor([p + comp.tokens.tolist()])
    with torch.no_grad():
        logits = eng.model(input_ids=full).logits[0, len(p) - 1 : -1] / 0.7
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(comp.tokens)[:, None])[:, 0]
    np.testing.assert_allclose(comp.logprobs, want.numpy(), atol=1e-5)


def test_every_export_writes_the_same_files_as_the_first(sort_base, tmp_path):
    """The config, generation config and tokenizer files of later exports are the bytes
    transformers wrote for the first one (only the weights are written anew), and a
    change of dtype writes them anew."""
    be = TorchBackend(str(sort_base), lr=5e-3, seed=0)
    be.restore(None)
    eng = HFEngine(str(sort_base), seed=1)
    task = TASKS["sort4"]()
    be.publish_release(tmp_path / "r0")
    be.train_round(rollout_batch(eng, task, 0, 16, 8, 0))
    be.publish_release(tmp_path / "r1")
    names = sorted(p.name for p in (tmp_path / "r0").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "r1").iterdir())
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= set(names)
    for name in names:
        same = (tmp_path / "r0" / name).read_bytes() == (tmp_path / "r1" / name).read_bytes()
        assert same == (name != "model.safetensors"), name
    # what a fresh export (transformers writing every file) gives is the same bytes
    fresh = TorchBackend(str(sort_base), lr=5e-3, seed=0)
    fresh.restore(None)
    fresh.publish_release(tmp_path / "f")
    for name in names:
        if name != "model.safetensors":
            assert (tmp_path / "f" / name).read_bytes() == (tmp_path / "r1" / name).read_bytes()
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "r1"), local_files_only=True)
    assert loaded.config.vocab_size == be.model.config.vocab_size
    # another serving dtype: its own config.json (dtype) written by transformers
    from yeto_torch import export

    info = export.export_full(be.model, sort_base, tmp_path / "bf", dtype=torch.bfloat16)
    assert json.loads((tmp_path / "bf" / "config.json").read_text())["dtype"] == "bfloat16"
    assert "config.json" in info["files"]
