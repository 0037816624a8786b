"""How much a delta chunk could gain from temporal context (the previous steps' changes).

    nice -n 15 .venv/bin/python scripts/delta-context.py --hidden 1024 --layers 6 --rounds 7

Builds the model of ``yeto bench releases`` (the same builder, batches and torch GRPO
step, float32 masters, bf16 export), trains ``--rounds`` rounds at ``--lr`` and, for
every export ``R`` after the first, measures per bf16 tensor (``P`` the parent export,
``G`` the one before it, ``k`` the ordered integer of docs/releases.md,
``d = k_R - k_P``, ``d1 = k_P - k_G``, ``d2`` the change before that):

* ``codec``: the chunk the ``numpy-zstd`` codec writes today (``diff``: zigzag of ``d``
  grouped by the parent's exponent, byte planes, zstd level 1; or ``sparse``/``same``);
* ``d-d1|exp``: zigzag of ``d - d1`` (a second-order difference) grouped the same way;
* ``d|d1,exp``: zigzag of ``d`` grouped by ``(clip(d1, -15, 15), exponent)``;
* ``d|d1,d2,exp``: the same with ``clip(d2, -15, 15)`` as well (two earlier releases);
* ``H(...)``: the empirical conditional entropy of zigzag(``d``) given each context (values
  above 4095 share one symbol), the bound for a coder with that context.

Every figure is the bytes as a percentage of the full export. One JSON object per step on
stdout. Reads each export once and keeps the last four in memory (4 x 200 MB at the
defaults); scratch goes to a temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
import zstandard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "yeto-bench" / "src"))


def load_bf16(path: Path) -> tuple[dict[str, np.ndarray], int]:
    """The bf16 tensors of a safetensors file as uint16 arrays; ``(tensors, file size)``."""
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__" or e["dtype"] != "BF16":
            continue
        start, end = e["data_offsets"]
        out[name] = np.frombuffer(raw, "<u2", count=(end - start) // 2, offset=8 + n + start)
    return out, len(raw)


def entropy_bytes(z: np.ndarray, ctx: np.ndarray) -> float:
    """Bytes of ``sum -log2 p(z | ctx)`` with the empirical distribution."""
    key = ctx.astype(np.int64) * 4096 + np.minimum(z, 4095).astype(np.int64)
    _, joint = np.unique(key, return_counts=True)
    _, marg = np.unique(ctx, return_counts=True)
    n = z.size
    bits = -(joint * np.log2(joint / n)).sum() + (marg * np.log2(marg / n)).sum()
    return float(bits) / 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from yeto_bench.releases import build_base, fixed_batches
    from yeto_torch import delta as codec_mod
    from yeto_torch.backend import TorchBackend

    torch.set_num_threads(args.threads)
    codec = codec_mod.NumpyZstdCodec()
    zc = zstandard.ZstdCompressor(level=codec.level)

    def zbytes(z: np.ndarray, order: np.ndarray) -> int:
        z = z[order]
        planes = codec_mod._planes(z.tobytes(), z.dtype.itemsize)
        return 1 + len(zc.compress(planes))

    work = Path(tempfile.mkdtemp(prefix="yeto-delta-context-"))
    try:
        base, n_params = build_base(work / "base", hidden=args.hidden, layers=args.layers)
        batches = fixed_batches(base, args.rounds, 4, 4, seed=7)
        backend = TorchBackend(
            str(base), lr=args.lr, seed=0, export_dtype="bfloat16", micro_batch=64
        )
        backend.restore(None)
        history: list[dict[str, np.ndarray]] = []  # ordered integers, newest last
        raws: list[dict[str, np.ndarray]] = []
        for version in range(args.rounds + 1):
            if version:
                backend.train_round(batches[version - 1])
            out = work / "export"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            backend.publish_release(out)
            tensors, full = load_bf16(out / "model.safetensors")
            raws = (raws + [tensors])[-2:]
            history = (history + [{k: codec_mod._ordered(v) for k, v in tensors.items()}])[-4:]
            if version == 0:
                continue
            acc: dict[str, float] = {}

            def add(key: str, v: float, acc: dict[str, float] = acc) -> None:
                acc[key] = acc.get(key, 0.0) + v

            parent_raw = raws[-2]
            for name, kr in history[-1].items():
                kp = history[-2][name]
                d = (kr.astype(np.int32) - kp.astype(np.int32)).astype(np.int32)
                add("changed", float(np.count_nonzero(d)))
                add("elements", float(d.size))
                enc, chunk = codec.encode(
                    memoryview(parent_raw[name]).cast("B"),
                    memoryview(raws[-1][name]).cast("B"),
                    2,
                    "BF16",
                )
                add("codec", len(chunk))
                if not d.any():
                    continue
                z = codec_mod._zigzag(d.view(np.uint32))
                ex = ((parent_raw[name] >> 7) & 0xFF).astype(np.int32)
                add("H(d|exp)", entropy_bytes(z, ex))
                if len(history) < 3:
                    continue
                d1 = kp.astype(np.int32) - history[-3][name].astype(np.int32)
                by_exp = np.argsort(ex, kind="stable")
                add("d-d1|exp", zbytes(codec_mod._zigzag((d - d1).view(np.uint32)), by_exp))
                ctx1 = (np.clip(d1, -15, 15) + 15) * 256 + ex
                add("d|d1,exp", zbytes(z, np.argsort(ctx1, kind="stable")))
                add("H(d|d1,exp)", entropy_bytes(z, ctx1))
                if len(history) < 4:
                    continue
                d2 = history[-3][name].astype(np.int32) - history[-4][name].astype(np.int32)
                ctx2 = (np.clip(d2, -15, 15) + 15) * 31 * 256 + ctx1
                add("d|d1,d2,exp", zbytes(z, np.argsort(ctx2, kind="stable")))
                add("H(d|d1,d2,exp)", entropy_bytes(z, ctx2))
            row: dict[str, object] = {"step": version, "parameters": n_params, "full": full}
            row["changed_pct"] = round(100 * acc.pop("changed") / acc.pop("elements"), 1)
            row.update({k: round(100 * v / full, 2) for k, v in acc.items()})
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
