"""Tiny causal LMs built offline: a Llama config and a character-level tokenizer.

The tokenizer is a real Hugging Face fast tokenizer (``tokenizer.json`` from
the ``tokenizers`` library, a WordLevel model over single characters) so
``transformers.AutoTokenizer.from_pretrained`` reloads it offline, and so do
inference servers. The model shape keeps ``head_dim`` at 32 (vLLM's CPU
backend accepts 32, 64, 80 or more). Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

#: Special tokens first, then the characters the built-in tasks use (16 symbols).
SPECIALS = ("<pad>", "<bos>", "<eos>")
CHARS = tuple("0123456789") + ("+", "=", ":")
VOCAB = SPECIALS + CHARS
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


def build_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` over :data:`VOCAB` that adds ``<bos>`` in front."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=PAD
    )


def build_config(
    *, hidden: int = 64, layers: int = 2, head_dim: int = 32, max_positions: int = 64
) -> Any:
    """A float32 Llama config for the character vocabulary."""
    from transformers import LlamaConfig

    if hidden % head_dim:
        raise ValueError(f"hidden={hidden} is not a multiple of head_dim={head_dim}")
    heads = hidden // head_dim
    return LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        pad_token_id=VOCAB.index(PAD),
        bos_token_id=VOCAB.index(BOS),
        eos_token_id=VOCAB.index(EOS),
        tie_word_embeddings=False,
        dtype="float32",
        architectures=["LlamaForCausalLM"],
    )


def build_model(config: Any, seed: int) -> Any:
    """A freshly initialised ``LlamaForCausalLM`` (deterministic given ``seed``)."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(torch.float32)


def load_model(model_dir: str | Path) -> Any:
    """Load a local HF checkpoint as float32 (never downloads)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True
    )
    return model


def load_tokenizer(model_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def eos_id(tokenizer: Any) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token; yeto needs one to end responses")
    return int(tokenizer.eos_token_id)
