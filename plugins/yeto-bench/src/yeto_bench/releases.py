"""``yeto bench releases``: bytes and latency of delta releases against full ones.

A Llama is built offline in code (``--hidden`` x ``--layers``, head_dim 64, the
character vocabulary; about 101M parameters by default) and saved in bfloat16.
For every learning rate of ``--lrs`` (the quickstart's, read from
``examples/quickstart/run.toml``, is always among them), a fresh torch
backend (float32 masters, ``export_dtype = "bfloat16"``) starts from that
base and trains ``--rounds`` rounds with its real GRPO step on fixed batches
(answers sampled from the base by the ``hf`` engine; rewards drawn with a fixed
seed so every group has a spread: the bench measures bytes, not learning).

After every round the same export is published twice, to two stores: ``full``
(``[releases] deltas = "off"``) and ``delta`` (``deltas = "on"``, the
``numpy-zstd`` codec, ``full_every`` larger than the run). Per release and
encoding it reports the bytes stored (``stored_bytes``), the time to publish
(``publish_s``: digests, delta encoding, writing to the store; the export
itself, shared, is ``export_s``), and the time from publish to verified serving
on a follower (``serve_s``: one ``PolicyFollower.poll`` right after the publish
on an ``hf`` engine serving bfloat16: fetch with digest checks, for a delta the
rebuild with per-tensor checks, load, served checksum, policy fingerprint; the
polling interval is not included). ``bitwise_equal`` says that the delta
follower's files equal the full export byte for byte and its engine serves the
release's weight checksum.

Per learning rate, ``summary`` holds the medians over the rounds of
``delta_ratio`` (delta bytes / full bytes), both publish times and both serve
times; ``acceptance`` checks ``delta_ratio <= 0.10`` at the quickstart's rate.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import click

from yeto_core.cli import exit_codes

ROOT = Path(__file__).resolve().parents[4]
QUICKSTART = ROOT / "examples" / "quickstart" / "run.toml"


def quickstart_lr(path: Path = QUICKSTART) -> Optional[float]:
    """The torch learning rate of the quickstart's run config (None: not found)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        cfg = tomllib.loads(path.read_text())
        return float(cfg["trainer"]["backend_options"]["lr"])
    except (OSError, KeyError, ValueError):
        return None


def build_base(out: Path, *, hidden: int, layers: int, seed: int = 0) -> tuple[Path, int]:
    """A Llama of the character vocabulary saved in bfloat16; ``(dir, parameters)``."""
    import torch

    from yeto_torch import model as tiny

    cfg = tiny.build_config(hidden=hidden, layers=layers, head_dim=64, max_positions=64)
    model = tiny.build_model(cfg, seed).to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tiny.build_tokenizer().save_pretrained(out)
    return out, sum(p.numel() for p in model.parameters())


def fixed_batches(base: Path, n: int, prompts: int, g: int, seed: int) -> list[Any]:
    """``n`` batches of answers sampled from ``base``; rewards drawn with ``seed``."""
    import attrs
    import numpy as np

    from yeto_core.records import SamplingParams
    from yeto_torch.engine import HFEngine
    from yeto_torch.tasks import SortDigits
    from yeto_torch.testing import rollout_batch

    eng = HFEngine(str(base), seed=seed)
    task = SortDigits(seed=seed)
    rng = np.random.default_rng(seed)
    sp = SamplingParams(max_new_tokens=6, temperature=1.0)
    out = []
    for r in range(n):
        b = rollout_batch(eng, task, r * prompts, prompts, g, r, sampling=sp)
        groups = []
        for grp in b.groups:
            rewards = rng.permutation([1.0] * (g // 2) + [0.0] * (g - g // 2))
            samples = tuple(
                attrs.evolve(s, reward=float(x)) for s, x in zip(grp.samples, rewards, strict=True)
            )
            groups.append(attrs.evolve(grp, samples=samples))
        out.append(attrs.evolve(b, groups=tuple(groups)))
    return out


_KINDS = ("embed_tokens", "lm_head", "norm", "q_proj", "k_proj", "v_proj", "o_proj")
_KINDS += ("gate_proj", "up_proj", "down_proj")
_ITEM = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}


def tensor_kind(name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``q_proj`` (the bench's per-kind rows)."""
    return next((k for k in _KINDS if k in name), "other")


def _nbytes(entry: dict[str, Any]) -> int:
    n = 1
    for d in entry["shape"]:
        n *= int(d)
    return n * _ITEM.get(entry["dtype"], 1)


def compressed_size(d: Path, level: int = 1) -> int:
    """Bytes of the export's weight files, each zstd-compressed whole (a reference only)."""
    import zstandard

    c = zstandard.ZstdCompressor(level=level)
    return sum(len(c.compress(p.read_bytes())) for p in sorted(d.glob("*.safetensors")))


def _digests(d: Path) -> dict[str, str]:
    from yeto_core.stores.manifest import digest_dir

    return {f.name: f.sha256 for f in digest_dir(d)}


def run_lr(
    base: Path,
    work: Path,
    lr: float,
    batches: list[Any],
    rounds: int,
    progress: Any,
) -> dict[str, Any]:
    """Train ``rounds`` rounds at ``lr``; publish each full and as a delta; follow both."""
    from yeto_core.release.store import ReleaseStore
    from yeto_core.sampler import fingerprint
    from yeto_core.sampler.follower import PolicyFollower
    from yeto_core.stores.dir_store import DirStore
    from yeto_torch.backend import TorchBackend
    from yeto_torch.delta import NumpyZstdCodec
    from yeto_torch.engine import HFEngine

    shutil.rmtree(work, ignore_errors=True)
    backend = TorchBackend(str(base), lr=lr, seed=0, export_dtype="bfloat16", micro_batch=64)
    backend.restore(None)
    codec = NumpyZstdCodec()
    stores = {
        "full": ReleaseStore(DirStore(work / "full", fsync=False), deltas="off"),
        "delta": ReleaseStore(
            DirStore(work / "delta", fsync=False),
            codec=codec,
            deltas="on",
            full_every=rounds + 2,
        ),
    }
    events: dict[str, list] = {"full": [], "delta": []}
    followers = {
        enc: PolicyFollower(
            ReleaseStore(rs.store, codec=codec),
            HFEngine(str(base), seed=0, dtype="bfloat16"),
            work_dir=work / f"follower-{enc}",
            emit=events[enc].append,
        )
        for enc, rs in stores.items()
    }
    per: list[dict[str, Any]] = []
    for version in range(rounds + 1):
        train_s = 0.0
        if version:
            t = time.perf_counter()
            metrics = backend.train_round(batches[(version - 1) % len(batches)])
            train_s = time.perf_counter() - t
        else:
            metrics = {}
        out = work / "export"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        t = time.perf_counter()
        info = dict(backend.publish_release(out))
        info[fingerprint.INFO_KEY] = fingerprint.for_backend(backend).to_json()
        info["version"] = version
        export_s = time.perf_counter() - t
        want = _digests(out)
        row: dict[str, Any] = {
            "version": version,
            "train_s": round(train_s, 3),
            "export_s": round(export_s, 3),
            "optimizer_steps": backend.counters["optimizer_steps"],
            "groups_trained": backend.counters["groups_trained"],
            "loss": metrics.get("loss"),
        }
        for enc, rs in stores.items():
            t = time.perf_counter()
            rel = rs.publish(out, info)
            publish_s = time.perf_counter() - t
            t = time.perf_counter()
            result = followers[enc].poll()
            serve_s = time.perf_counter() - t
            loaded = [e.data for e in events[enc] if e.kind == "release_loaded"]
            served_dir = Path(followers[enc]._current.path) if followers[enc]._current else None
            row[enc] = {
                "encoding": rel.encoding,
                "stored_bytes": sum(f.size for f in rel.files),
                "publish_s": round(publish_s, 3),
                "serve_s": round(serve_s, 3),
                "follower": result,
                "verified": bool(result == "loaded" and loaded and loaded[-1].get("verified")),
                "refused": [
                    {k: e.data.get(k) for k in ("reason", "detail")}
                    for e in events[enc]
                    if e.kind == "release_refused" and e.data.get("version") == version
                ],
                "fetched_bytes": loaded[-1].get("fetched_bytes") if loaded else None,
                "fetch_s": loaded[-1].get("fetch_s") if loaded else None,
                "load_s": loaded[-1].get("load_s") if loaded else None,
                "fingerprint_s": loaded[-1].get("fingerprint_s") if loaded else None,
                "chain": loaded[-1].get("chain") if loaded else None,
                "bitwise_equal": bool(
                    result == "loaded"
                    and served_dir is not None
                    and _digests(served_dir) == want
                    and followers[enc].served_checksum == rel.weight_checksum
                ),
            }
        row["full_bytes"] = sum((out / n).stat().st_size for n in want)
        if version == rounds:  # what a follower would fetch if full releases were zstd'd
            row["full_zstd_bytes"] = compressed_size(out)
        row["delta_ratio"] = row["delta"]["stored_bytes"] / row["full"]["stored_bytes"]
        if row["delta"]["encoding"] == "delta":
            spec = stores["delta"].latest().delta["files"]["model.safetensors"]["tensors"]
            counts: dict[str, int] = {}
            kinds: dict[str, list[int]] = {}
            for tname, e in spec.items():
                counts[e["encoding"]] = counts.get(e["encoding"], 0) + 1
                k = kinds.setdefault(tensor_kind(tname), [0, 0, 0])
                k[0] += int(e["length"])
                k[1] += _nbytes(e)
                k[2] += 1
            row["delta"]["tensor_encodings"] = counts
            # per kind of tensor: chunk bytes over the tensor's bytes in the export
            row["delta"]["by_kind"] = {
                k: {"ratio": round(v[0] / v[1], 4), "tensors": v[2], "bytes": v[1]}
                for k, v in sorted(kinds.items())
                if v[1]
            }
        per.append(row)
        progress(
            f"lr={lr:g} v{version}: full {row['full']['stored_bytes'] / 1e6:.1f} MB, "
            f"delta {row['delta']['stored_bytes'] / 1e6:.2f} MB ({row['delta_ratio']:.3f}), "
            f"serve full {row['full']['serve_s']:.2f}s delta {row['delta']['serve_s']:.2f}s"
        )
    deltas = [r for r in per if r["delta"]["encoding"] == "delta"]

    def med(xs: list[float]) -> Optional[float]:
        return round(statistics.median(xs), 4) if xs else None

    return {
        "lr": lr,
        "per_release": per,
        "summary": {
            "delta_releases": len(deltas),
            "delta_ratio_median": med([r["delta_ratio"] for r in deltas]),
            "delta_ratio_max": max((r["delta_ratio"] for r in deltas), default=None),
            "delta_mb_median": med([r["delta"]["stored_bytes"] / 1e6 for r in deltas]),
            "full_mb": per[0]["full"]["stored_bytes"] / 1e6,
            "full_zstd_mb": per[-1]["full_zstd_bytes"] / 1e6,
            "delta_ratio_vs_zstd_full_median": med(
                [r["delta"]["stored_bytes"] / per[-1]["full_zstd_bytes"] for r in deltas]
            ),
            # the quickstart's cadence: one round (one optimizer step) per release
            "optimizer_steps_per_release": med(
                [
                    b["optimizer_steps"] - a["optimizer_steps"]
                    for a, b in zip(per[:-1], per[1:], strict=True)
                ]
            ),
            "by_kind_last": deltas[-1]["delta"].get("by_kind") if deltas else None,
            "publish_s_full_median": med([r["full"]["publish_s"] for r in deltas]),
            "publish_s_delta_median": med([r["delta"]["publish_s"] for r in deltas]),
            "serve_s_full_median": med([r["full"]["serve_s"] for r in deltas]),
            "serve_s_delta_median": med([r["delta"]["serve_s"] for r in deltas]),
            "all_bitwise_equal": all(r["delta"]["bitwise_equal"] for r in per),
            "all_verified": all(r["delta"]["verified"] and r["full"]["verified"] for r in per),
        },
    }


@click.command("releases", epilog=exit_codes())
@click.option("--hidden", type=click.IntRange(min=64), default=1024, show_default=True)
@click.option("--layers", type=click.IntRange(min=1), default=6, show_default=True)
@click.option(
    "--lrs",
    default="1e-6,1e-5",
    show_default=True,
    help="Comma-separated learning rates; the quickstart's is added.",
)
@click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--prompts", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--group-size", type=click.IntRange(min=2), default=4, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--work-dir", type=click.Path(file_okay=False), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(
    hidden: int,
    layers: int,
    lrs: str,
    rounds: int,
    prompts: int,
    group_size: int,
    threads: int,
    work_dir: Optional[str],
    as_json: bool,
) -> None:
    """Delta vs full policy releases on a bf16 Llama trained by the torch GRPO step."""
    import torch

    torch.set_num_threads(threads)
    qs = quickstart_lr()
    rates = [float(x) for x in lrs.split(",") if x.strip()]
    if qs is not None and qs not in rates:
        rates.append(qs)
    rates.sort()

    def progress(msg: str) -> None:
        click.echo(f"[bench releases] {msg}", err=True)

    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="yeto-bench-releases-"))
    t0 = time.perf_counter()
    progress(f"building a {hidden}x{layers} Llama in bf16")
    base, n_params = build_base(work / "base", hidden=hidden, layers=layers)
    progress(f"{n_params / 1e6:.1f}M parameters; sampling {rounds} fixed batches")
    batches = fixed_batches(base, rounds, prompts, group_size, seed=7)
    results = [run_lr(base, work / f"lr-{lr:g}", lr, batches, rounds, progress) for lr in rates]
    at_qs = next((r for r in results if qs is not None and r["lr"] == qs), None)
    ratio = at_qs["summary"]["delta_ratio_max"] if at_qs else None
    out = {
        "bench": "releases",
        "model": {
            "hidden": hidden,
            "layers": layers,
            "parameters": n_params,
            "serving_dtype": "bfloat16",
            "masters": "float32",
        },
        "rounds": rounds,
        "batch": {"prompts": prompts, "group_size": group_size},
        "codec": "numpy-zstd",
        "quickstart_lr": qs,
        "results": results,
        "acceptance": {
            "delta_ratio_at_quickstart_lr": ratio,
            "delta_le_10pct_of_full": ratio is not None and ratio <= 0.10,
            "bitwise_equal": all(r["summary"]["all_bitwise_equal"] for r in results),
        },
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    if as_json:
        click.echo(json.dumps(out, indent=1))
    else:
        for r in results:
            s = r["summary"]
            click.echo(
                f"lr={r['lr']:g}: delta/full {s['delta_ratio_median']} (max {s['delta_ratio_max']}), "
                f"publish {s['publish_s_delta_median']}s vs {s['publish_s_full_median']}s, "
                f"serve {s['serve_s_delta_median']}s vs {s['serve_s_full_median']}s, "
                f"bitwise {s['all_bitwise_equal']}"
            )
