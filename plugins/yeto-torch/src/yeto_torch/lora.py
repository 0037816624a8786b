"""LoRA in plain torch: a frozen base ``nn.Linear`` plus a trainable low-rank update.

``y = W x + (B A x) * alpha / r`` with ``A`` (``[r, in]``) initialised like
PEFT (Kaiming-uniform, seeded) and ``B`` (``[out, r]``) at zero, so a fresh
adapter leaves the model unchanged. :func:`merge` computes ``W + (B @ A) *
scale`` — the trainer (for the release checksum) and the engine (to serve the
adapter) call the same function, so both hold bitwise the same merged weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha = rank, float(alpha)
        self.scale = self.alpha / rank
        a = torch.empty(rank, base.in_features, dtype=base.weight.dtype)
        bound = 1.0 / math.sqrt(base.in_features)  # kaiming_uniform_(a=sqrt(5)), as PEFT does
        a.uniform_(-bound, bound, generator=generator)
        self.lora_A = nn.Parameter(a)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale


def apply_lora(
    model: nn.Module, *, rank: int, alpha: float, seed: int, targets=DEFAULT_TARGETS
) -> list[str]:
    """Replace every target ``nn.Linear`` by a :class:`LoRALinear`; freeze everything else.

    :returns: the dotted names of the wrapped modules (in module order).
    """
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    wrapped = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, LoRALinear(module, rank, alpha, gen))
            wrapped.append(name)
    if not wrapped:
        raise ValueError(f"no nn.Linear named one of {targets} in the model; nothing to adapt")
    return wrapped


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def merge(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """The merged weight ``W + (B @ A) * scale`` (one definition for trainer and engine)."""
    return weight + (b @ a) * scale


def merged_named_parameters(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's parameters as a plain (un-adapted) model names them, with LoRA merged in."""
    mods = lora_modules(model)
    out = []
    for name, p in model.named_parameters():
        if name.endswith((".lora_A", ".lora_B")):
            continue
        mod_name = name.rsplit(".base.", 1)[0] if ".base." in name else None
        if mod_name in mods and name.endswith(".base.weight"):
            m = mods[mod_name]
            out.append(
                (
                    f"{mod_name}.weight",
                    merge(p.detach(), m.lora_A.detach(), m.lora_B.detach(), m.scale),
                )
            )
        elif mod_name in mods:
            out.append((name.replace(".base.", ".", 1), p.detach()))
        else:
            out.append((name, p.detach()))
    return out
