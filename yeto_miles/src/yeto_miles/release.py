"""A policy release from Miles' HF export (``--save-hf``), or from the base itself.

Miles writes the weights and a ``config.json`` it built; a release must load
like the base. So the publisher copies the weight files, puts back every
top-level key of the base ``config.json`` that the export dropped (never
``quantization_config``: a release holds the trained, unquantized weights),
copies the base's tokenizer files and computes the weight checksum engines
compare against after loading: sha256 over (name, dtype, shape, bytes) of
every tensor, in name order.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from yeto_core.errors import ReleaseError
from yeto_core.hf_release import copy_tokenizer_files, restore_dropped_keys
from yeto_core.records import ReleaseInfo

#: Files of an export that a release carries besides ``config.json``.
WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")
EXTRA_FILES = ("generation_config.json",)


def weight_checksum(weight_dir: Path) -> str:
    """The checksum of every tensor in ``weight_dir``'s ``*.safetensors`` files."""
    from safetensors import safe_open

    tensors: dict[str, Any] = {}
    for path in sorted(Path(weight_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name in tensors:
                    raise ReleaseError(f"tensor {name!r} appears twice in {weight_dir}")
                tensors[name] = f.get_tensor(name)
    if not tensors:
        raise ReleaseError(f"{weight_dir} holds no *.safetensors weights to release")
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(repr(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(_u8()).numpy().tobytes() if t.numel() else b"")
    return "sha256:" + h.hexdigest()


def _u8() -> Any:
    import torch

    return torch.uint8


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def publish_from_export(export_dir: Path, base_dir: Path, out_dir: Path) -> ReleaseInfo:
    """Write a release of ``export_dir`` (an HF export, or the base) into ``out_dir``."""
    export_dir, base_dir, out_dir = Path(export_dir), Path(base_dir), Path(out_dir)
    if not (export_dir / "config.json").is_file():
        raise ReleaseError(
            f"Miles' HF export {export_dir} has no config.json; check --save-hf and the Miles log"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for path in sorted(export_dir.iterdir()):
        if path.is_file() and (path.name.endswith(WEIGHT_SUFFIXES) or path.name in EXTRA_FILES):
            _link_or_copy(path, out_dir / path.name)
            files.append(path.name)
    base_cfg = json.loads((base_dir / "config.json").read_text())
    exported = json.loads((export_dir / "config.json").read_text())
    merged = restore_dropped_keys(base_cfg, exported)
    (out_dir / "config.json").write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    copy_tokenizer_files(base_dir, out_dir)
    extra = {"restored_config_keys": sorted(set(merged) - set(exported))}
    return ReleaseInfo(kind="full", weight_checksum=weight_checksum(out_dir), extra=extra)
