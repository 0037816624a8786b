"""The weight checksum both sides compute: the trainer on what it exports, the engine on what it serves."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def weight_checksum(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda kv: kv[0]):
        t = t.detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(repr(tuple(t.shape)).encode())
        h.update(t.view(torch.uint8).numpy() if t.numel() else b"")  # no copy of the bytes
    return "sha256:" + h.hexdigest()


def model_checksum(model: torch.nn.Module) -> str:
    """Checksum of a model's parameters as it holds them now (read back from the tensors)."""
    return weight_checksum(model.named_parameters())
