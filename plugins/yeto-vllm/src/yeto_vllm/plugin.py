"""Entry point of yeto-vllm (group ``yeto``, name ``vllm``).

Registers the ``vllm`` sampler engine (:class:`yeto_vllm.engine.VLLMEngine`),
imported lazily so ``yeto plugins`` stays fast.
"""

from __future__ import annotations

from yeto_core import hookimpl


@hookimpl
def yeto_register_sampler_engines(register):
    from yeto_vllm.engine import VLLMEngine

    register(VLLMEngine)
