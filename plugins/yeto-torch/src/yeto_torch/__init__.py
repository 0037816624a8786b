"""yeto-torch: the torch GRPO trainer backend, the hf sampler engine and built-in verifiable tasks."""

__version__ = "0.1.0"
