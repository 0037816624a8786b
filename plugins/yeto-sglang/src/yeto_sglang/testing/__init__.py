"""Test helpers of yeto-sglang: the SGLang 0.5.23 protocol test server.

:class:`~yeto_sglang.testing.server.ProtocolServer` stands in for a real SGLang
server on 127.0.0.1 (needs the ``test`` extra: torch, transformers,
safetensors). The ``sglang`` engine itself needs none of them.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "ProtocolServer":
        from yeto_sglang.testing.server import ProtocolServer

        return ProtocolServer
    raise AttributeError(name)


__all__ = ["ProtocolServer"]
