"""Reference computations in transformers, and releases made offline, for the engine tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from yeto_core.records import LocalRelease

_MODELS: dict[str, Any] = {}


def hf_model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    key = str(model_dir)
    if key not in _MODELS:
        _MODELS[key] = AutoModelForCausalLM.from_pretrained(
            key, dtype=torch.float32, local_files_only=True
        ).eval()
    return _MODELS[key]


@torch.no_grad()
def token_logits(model: Any, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Logits that predicted each response token (``[len(response), vocab]``)."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) + len(response) - 1]


@torch.no_grad()
def prompt_scores(model: Any, prompt: list[int]) -> list[float]:
    logits = model(input_ids=torch.tensor([prompt])).logits[0, :-1].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[t, prompt[t + 1]]) for t in range(len(prompt) - 1)]


def filtered_logprob(logits: torch.Tensor, tok: int, t: float, top_k: int, top_p: float) -> float:
    """SGLang's sampling distribution: joint top-k / top-p on softmax(z / T), renormalised."""
    p = torch.softmax(logits.double() / t, dim=-1)
    sp, order = torch.sort(p, descending=True)
    before = torch.cumsum(sp, 0) - sp
    keep = torch.ones_like(sp, dtype=torch.bool)
    if top_k > 0:
        keep &= torch.arange(len(sp)) < top_k
    keep &= before <= top_p
    q = torch.zeros_like(p)
    q[order[keep]] = p[order[keep]]
    return float(torch.log(q[tok] / q.sum()))


def make_full_release(base: Path, out: Path, *, seed: int, scale: float = 0.05) -> LocalRelease:
    """The base with seeded noise on every weight, exported as a full HF checkpoint."""
    from transformers import AutoModelForCausalLM

    from yeto_torch.export import export_full

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    info = export_full(model, base, out)
    version = seed
    return LocalRelease(
        version=version,
        release_id=str(version),
        path=str(out),
        kind="full",
        weight_checksum=info["weight_checksum"],
    )


def make_lora_release(
    base: Path,
    out: Path,
    *,
    seed: int,
    rank: int = 4,
    alpha: float = 8.0,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
) -> LocalRelease:
    """A PEFT-layout adapter with seeded A and B (non-zero, so it changes the outputs)."""
    model = hf_model(base)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            a = torch.randn(rank, module.in_features, generator=gen) * 0.3
            b = torch.randn(module.out_features, rank, generator=gen) * 0.3
            tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
            tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    cfg = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(targets),
        "base_model_name_or_path": str(base),
    }
    (out / "adapter_config.json").write_text(json.dumps(cfg))
    return LocalRelease(
        version=seed,
        release_id=str(seed),
        path=str(out),
        kind="lora",
        weight_checksum=f"lora-test:{seed}",
    )


@torch.no_grad()
def merged_model(base: Path, release: LocalRelease) -> Any:
    """The base with the adapter merged (what a LoRA release serves)."""
    import copy

    from safetensors.torch import load_file

    model = copy.deepcopy(hf_model(base))
    cfg = json.loads((Path(release.path) / "adapter_config.json").read_text())
    tensors = load_file(str(Path(release.path) / "adapter_model.safetensors"))
    params = dict(model.named_parameters())
    for key, a in tensors.items():
        if key.endswith(".lora_A.weight"):
            mod = key[len("base_model.model.") : -len(".lora_A.weight")]
            b = tensors[key.replace(".lora_A.", ".lora_B.")]
            w = params[f"{mod}.weight"]
            w.copy_(w + (b @ a) * (cfg["lora_alpha"] / cfg["r"]))
    return model
