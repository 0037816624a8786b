"""Fixtures: tiny models saved offline, and the SGLang protocol test server on 127.0.0.1.

``YETO_SGLANG_URL`` (set by ``scripts/gpu-check-sglang.sh``) points the engine
tests at a real SGLang server instead; tests that need the protocol server's
failure injection are skipped then.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

torch.set_num_threads(2)
# the tests import sgl_helpers (pytest runs with --import-mode=importlib)
sys.path.insert(0, str(Path(__file__).parent))

REAL_URL = os.environ.get("YETO_SGLANG_URL")
REAL_MODEL = os.environ.get("YETO_SGLANG_MODEL")
REAL_MOE_URL = os.environ.get("YETO_SGLANG_MOE_URL")
REAL_MOE_MODEL = os.environ.get("YETO_SGLANG_MOE_MODEL")
#: log-prob agreement with transformers: the protocol server computes in float32 on CPU
#: exactly as the reference does; a real server's kernels differ (set by the GPU check).
REAL_ATOL = float(os.environ.get("YETO_SGLANG_ATOL", "1e-3"))


@dataclass
class Target:
    """The server the engine tests run against: the protocol server, or a real SGLang."""

    url: str
    model: Path
    srv: Optional[Any]  # the ProtocolServer (None: a real SGLang server)
    atol: float

    @property
    def real(self) -> bool:
        return self.srv is None


def _reset_real(url: str, model: Path) -> None:
    """Put a real server back on the base weights and unload the tests' adapters."""
    import httpx

    with httpx.Client(base_url=url, timeout=300) as c:
        r = c.post(
            "/update_weights_from_disk",
            json={"model_path": str(model), "weight_version": "0", "flush_cache": True},
        )
        assert r.status_code == 200 and r.json().get("success"), r.text
        for k in range(1, 10):
            c.post("/unload_lora_adapter", json={"lora_name": f"yeto-{k}"})


def save_tiny_llama(out: Path, seed: int = 0) -> Path:
    from yeto_torch import model as tiny

    cfg = tiny.build_config(hidden=64, layers=2, head_dim=32)
    model = tiny.build_model(cfg, seed)
    model.save_pretrained(out, safe_serialization=True)
    tiny.build_tokenizer().save_pretrained(out)
    return out


def save_tiny_moe(out: Path, seed: int = 0, experts: int = 4, top_k: int = 2) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    from yeto_torch import model as tiny

    vocab = tiny.VOCAB
    cfg = MixtralConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        pad_token_id=vocab.index(tiny.PAD),
        bos_token_id=vocab.index(tiny.BOS),
        eos_token_id=vocab.index(tiny.EOS),
        tie_word_embeddings=False,
        architectures=["MixtralForCausalLM"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MixtralForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    tiny.build_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    if REAL_MODEL:
        return Path(REAL_MODEL)
    return save_tiny_llama(tmp_path_factory.mktemp("sgl") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    return save_tiny_moe(tmp_path_factory.mktemp("sgl") / "moe", seed=3)


@pytest.fixture()
def target(tiny_base):
    """A fresh protocol server with LoRA enabled, or the real server reset to the base."""
    if REAL_URL:
        _reset_real(REAL_URL, Path(REAL_MODEL or tiny_base))
        yield Target(REAL_URL, Path(REAL_MODEL or tiny_base), None, REAL_ATOL)
        return
    from yeto_sglang.testing.server import ProtocolServer

    srv = ProtocolServer(
        str(tiny_base),
        enable_lora=True,
        max_lora_rank=8,
        lora_target_modules=("q_proj", "v_proj"),
        weight_version="0",
        random_seed=1,
    ).start()
    yield Target(srv.url, tiny_base, srv, 1e-5)
    srv.stop()
    assert srv.violations == [], srv.violations


@pytest.fixture()
def moe_target(tiny_moe):
    if REAL_URL:
        if not REAL_MOE_URL:
            pytest.skip("no MoE SGLang server (YETO_SGLANG_MOE_URL) in this check")
        yield Target(REAL_MOE_URL, Path(REAL_MOE_MODEL or tiny_moe), None, REAL_ATOL)
        return
    from yeto_sglang.testing.server import ProtocolServer

    srv = ProtocolServer(
        str(tiny_moe), enable_return_routed_experts=True, weight_version="0", random_seed=2
    ).start()
    yield Target(srv.url, tiny_moe, srv, 1e-5)
    srv.stop()
    assert srv.violations == [], srv.violations


@pytest.fixture()
def server(tiny_base):
    """A protocol server for one test (fresh state), LoRA enabled."""
    if REAL_URL:
        pytest.skip("needs the protocol server (failure injection); YETO_SGLANG_URL is set")
    from yeto_sglang.testing.server import ProtocolServer

    srv = ProtocolServer(
        str(tiny_base),
        enable_lora=True,
        max_lora_rank=8,
        lora_target_modules=("q_proj", "v_proj"),
        weight_version="0",
        random_seed=1,
    ).start()
    yield srv
    srv.stop()
    assert srv.violations == [], srv.violations


@pytest.fixture()
def engine_for(tiny_base):
    """Build an engine against a server URL (closes it after the test)."""
    from yeto_sglang.engine import SGLangEngine

    made = []

    def make(url: str, model_dir=None, **options):
        opts = {
            "server": {
                "enable_lora": True,
                "max_lora_rank": 8,
                "lora_target_modules": ["q_proj", "v_proj"],
            },
            **options,
        }
        eng = SGLangEngine(str(model_dir or tiny_base), base_url=url, **opts)
        made.append(eng)
        return eng

    yield make
    for e in made:
        e.close()
