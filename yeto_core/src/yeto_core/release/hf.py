"""What every HF-checkpoint release does besides its weights (stdlib only).

A trainer's export (torch's ``save_pretrained``, Miles' ``--save-hf``) may drop
keys of the base ``config.json`` and carries no tokenizer; a release must load
like the base. Both backends call these, so the rule is written once.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from yeto_core.errors import ReleaseError

#: Never on a release, neither copied from the base config nor kept from the export: a
#: release holds the trained, unquantized and uncompressed weights, and an engine that
#: read either key would load them as quantized or compressed.
NEVER_RESTORE = ("quantization_config", "compression_config")
#: Files of the tokenizer that a release copies from the base checkpoint.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


def restore_dropped_keys(base: dict[str, Any], exported: dict[str, Any]) -> dict[str, Any]:
    """``exported`` plus every top-level key of ``base`` it lacks, without the keys of
    :data:`NEVER_RESTORE` (``quantization_config``, ``compression_config``)."""
    out = dict(exported)
    for key, value in base.items():
        if key not in out and key not in NEVER_RESTORE:
            out[key] = value
    for key in NEVER_RESTORE:
        out.pop(key, None)
    return out


def copy_tokenizer_files(base_dir: Path, out_dir: Path) -> list[str]:
    """Copy the base checkpoint's tokenizer files into ``out_dir``; their names."""
    copied = []
    for name in TOKENIZER_FILES:
        src = Path(base_dir) / name
        if src.is_file():
            shutil.copyfile(src, Path(out_dir) / name)
            copied.append(name)
    if not copied:
        raise ReleaseError(
            f"no tokenizer file ({', '.join(TOKENIZER_FILES[:2])}, ...) in the base checkpoint "
            f"{base_dir}; a release must carry the base's tokenizer"
        )
    return copied
