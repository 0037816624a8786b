"""A stand-in for Miles' ``train.py`` behind the miles backend's command-line seam.

It follows the facts of Miles' synchronous loop at the pinned commit that the
backend relies on: the start rollout id is the loaded iteration + 1 (0 with
no checkpoint in ``--load``); per rollout it calls the rollout function
(legacy form, or the class form with ``RolloutFnConstructorInput``), then the
custom rollout log function with the flattened samples, trains, saves
(``--save-interval 1``: ``--save``/``iter_NNNNNNN/`` plus
``latest_checkpointed_iteration.txt``, then the HF export to ``--save-hf``:
the weights and a ``config.json`` of the architecture keys only, for an export
drops the base's other keys), calls the post-save hook on "rank 0", and exits
after ``--num-rollout``. Its "training" is a deterministic update of one
weight: a fixed step plus the group-normalized rewards times each sample's
loss-mask sum, so padding (mask 0, reward 0) adds nothing to it.
Every rollout is logged to ``<save>/../fake_miles_rollouts.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from pathlib import Path

import fake_miles
import numpy as np
import torch
from safetensors.torch import load_file, save_file

LR = 0.01
PARAM = "model.norm.weight"
ARCH = (
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)


def load_function(path):
    module, attr = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), attr)


def parse():
    p = argparse.ArgumentParser()
    for flag in ("--rollout-function-path", "--custom-rollout-log-function-path",
                 "--custom-megatron-post-save-hook-path", "--hf-checkpoint", "--load", "--save",
                 "--save-hf", "--custom-config-path", "--ref-load"):  # fmt: skip
        p.add_argument(flag)
    for flag in ("--save-interval", "--num-rollout", "--rollout-batch-size",
                 "--n-samples-per-prompt", "--global-batch-size", "--seed"):  # fmt: skip
        p.add_argument(flag, type=int)
    for flag in ("--debug-train-only", "--debug-skip-weight-update",
                 "--disable-rollout-global-dataset", "--disable-rollout-trim-samples",
                 "--use-rollout-routing-replay"):  # fmt: skip
        p.add_argument(flag, action="store_true")
    p.add_argument("--fake-fail-at", type=int, default=None)  # tests: exit in this rollout
    args = p.parse_args()
    for k, v in json.loads(Path(args.custom_config_path).read_text()).items():
        setattr(args, k, v)
    assert args.debug_train_only and args.debug_skip_weight_update and args.save_interval == 1
    return args


def group_advantages(rewards):
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean()) / (r.std() + 1e-6)


def main() -> int:
    args = parse()
    save = Path(args.save)
    log_path = save.parent / "fake_miles_rollouts.jsonl"
    fake_miles.install(log_path=save.parent / "fake_miles_default_log.jsonl")
    tracker = Path(args.load) / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        loaded = int(tracker.read_text())
        state = load_file(str(Path(args.load) / f"iter_{loaded:07d}" / "model.safetensors"))
        start = loaded + 1
    else:
        state = load_file(str(Path(args.hf_checkpoint) / "model.safetensors"))
        start = 0
    fn = load_function(args.rollout_function_path)
    is_class = isinstance(fn, type)
    if is_class:
        base = sys.modules["miles.rollout.base_types"]
        fn = fn(base.RolloutFnConstructorInput(args=args, data_source=None))
    log_fn = load_function(args.custom_rollout_log_function_path)
    hook = load_function(args.custom_megatron_post_save_hook_path)
    base_conf = json.loads((Path(args.hf_checkpoint) / "config.json").read_text())
    export_conf = {k: base_conf[k] for k in ARCH if k in base_conf}  # an export rebuilds it
    for rollout_id in range(start, args.num_rollout):
        if args.fake_fail_at == rollout_id:
            print(f"fake miles: failing in rollout {rollout_id}", flush=True)
            return 3
        if is_class:
            base = sys.modules["miles.rollout.base_types"]
            out = asyncio.run(
                fn(base.RolloutFnTrainInput(rollout_id=rollout_id, weight_version=None))
            )
            groups, metrics = out.samples, out.metrics
        else:
            groups, metrics = fn(args, rollout_id, None, evaluation=False), None
        flat = [s for g in groups for s in g]
        assert len(flat) == args.global_batch_size, (len(flat), args.global_batch_size)
        assert len(groups) == args.rollout_batch_size
        log_fn(rollout_id, args, flat, metrics, 0.0)
        delta = 0.0
        for g in groups:
            adv = group_advantages([s.reward for s in g])
            for s, a in zip(g, adv, strict=True):
                delta += a * sum(s.loss_mask) * (0 if s.remove_sample else 1)
        state[PARAM] = state[PARAM] + LR * (1.0 + delta / args.global_batch_size)
        ckpt = save / f"iter_{rollout_id:07d}"
        ckpt.mkdir(parents=True, exist_ok=True)
        weights = {k: v.contiguous() for k, v in state.items()}
        save_file(weights, str(ckpt / "model.safetensors"))
        (save / "latest_checkpointed_iteration.txt").write_text(str(rollout_id))
        hf = Path(args.save_hf.format(rollout_id=rollout_id))
        hf.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(hf / "model.safetensors"), metadata={"format": "pt"})
        (hf / "config.json").write_text(json.dumps(export_conf, indent=1))
        with open(log_path, "a") as f:
            f.write(json.dumps({
                "rollout_id": rollout_id, "n": len(flat),
                "padding": sum(1 for s in flat if s.metadata.get("yeto_padding")),
                "positions": sorted({s.metadata["yeto_position"] for s in flat if "yeto_position" in s.metadata}),
                "weight": float(state[PARAM][0]), "form": type(fn).__name__,
            }) + "\n")  # fmt: skip
        hook(args, rollout_id, str(ckpt), str(hf))
    print("fake miles: done", flush=True)
    return 0


if __name__ == "__main__":
    torch.manual_seed(0)
    sys.exit(main())
