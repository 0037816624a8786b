"""yeto-vllm: the vllm sampler engine (talks to a vLLM OpenAI-compatible server; vLLM itself only on the island image)."""

__version__ = "0.1.0"
