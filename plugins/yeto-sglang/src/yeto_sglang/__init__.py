"""yeto-sglang: the sglang sampler engine (talks to an SGLang server over HTTP; SGLang itself only on the island image)."""

__version__ = "0.1.0"
