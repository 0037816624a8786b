"""The ``torch`` trainer backend: GRPO on a Hugging Face causal LM, full-parameter or LoRA.

The loss is documented precisely in ``docs/algorithms.md``. In short, for
every response token ``t`` of sample ``i`` in group ``g``::

    A_i     = (r_i - mean_g(r)) / (std_g(r) + adv_eps)        (std: population)
    rho_it  = exp(logp_theta(y_it) - logp_behavior(y_it))
    l_it    = -min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps_high) A_i) + kl_coef k3_it
    L       = sum_it w_it m_it l_it

with ``m`` the loss mask and ``w`` the aggregation weights (``token-mean``:
1 / all masked tokens of the batch's real samples; ``seq-mean-token-mean``:
1 / (n_samples * masked tokens of i); ``seq-mean-token-sum``: 1 / n_samples).
Groups whose rewards are all equal have A = 0; without a KL term they add
nothing, so they are skipped (no forward, no backward). Padding samples carry
no gradient and are never run.

A cut holds ``weights.safetensors`` (trainable parameters), ``optimizer.safetensors``
(AdamW moments and steps), ``rng.safetensors`` (torch and numpy RNG arrays) and
``trainer_state.json`` (counters, LR schedule position, python/numpy RNG
scalars, options, base checksum, trigger). Restoring it in a fresh process
continues bitwise.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from yeto_core.errors import ConfigError, CutError
from yeto_core.ports import TrainerBackend
from yeto_core.records import Batch, ModelFacts, Trigger
from yeto_torch import export, moe, sharded_cut
from yeto_torch import lora as lora_mod
from yeto_torch import model as tiny
from yeto_torch.checksum import weight_checksum
from yeto_torch.device import autocast, resolve_device, resolve_precision, to_host
from yeto_torch.dist import WHOLE, RoundSplit
from yeto_torch.lean import lean_for
from yeto_torch.loss_default import default_options
from yeto_torch.sampling import process_logits

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LOSSES = ("ppo-clip", "decoupled", "tis", "mis")
IS_LEVELS = ("token", "sequence", "sequence-geo")
KL_ESTIMATORS = ("k3", "k3-is")
ADV_STDS = ("population", "sample")
#: Log-probs of tokens outside the processed support (top-k / top-p) are floored here.
LOGP_FLOOR = -1e4
#: Every log-ratio is clamped to ``[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]`` before ``exp``
#: (ratios within e^±20, about 4.9e8: finite in float32, and squares too)
LOG_RATIO_BOUND = 20.0
SCHEDULES = ("constant", "linear", "cosine")
TUNINGS = ("full", "lora")
CUT_FORMAT = 1
#: Options that must be equal between the incarnation that wrote a cut and the one restoring it.
_STRUCTURAL = ("tuning", "lora_rank", "lora_alpha", "lora_targets")


def lr_at(
    step: int, *, lr: float, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> float:
    """The learning rate of optimizer step ``step`` (0-based): linear warm-up, then the schedule."""
    if warmup_steps and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return lr
    frac = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    floor = lr * min_lr_ratio
    if schedule == "linear":
        return floor + (lr - floor) * (1.0 - frac)
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * frac))


def _bounded(log_ratio: torch.Tensor) -> torch.Tensor:
    """``log_ratio`` clamped to ``±LOG_RATIO_BOUND`` (no gradient beyond the bound)."""
    return torch.clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _fusable(params: list[torch.nn.Parameter]) -> bool:
    """Whether torch's fused AdamW kernel takes ``params``: floating point, on a CPU or
    a CUDA device (the devices it ships for in every build)."""
    return bool(params) and all(
        p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params
    )


def _chunk_logprobs(x: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(x / T)[target]`` of each row of ``x`` (``[N, V]``), in float32."""
    x = x.float() / temperature
    return x.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(x, dim=-1)


def chunked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int
) -> torch.Tensor:
    """The log-prob of ``targets`` (``[B, T, 1]``) under ``softmax(logits / T)`` (``[B, T,
    V]``, any float dtype) as ``[B, T]`` float32, ``chunk`` positions at a time: each
    chunk's float32 ``[chunk, V]`` work is recomputed in the backward
    (``torch.utils.checkpoint``), so no float32 ``[tokens, vocab]`` tensor is kept for the
    backward, only the logits themselves (in their own dtype). Only for unfiltered
    sampling (no top-k / top-p); equal to the full log-softmax to float32 rounding."""
    from torch.utils.checkpoint import checkpoint

    b, t, v = logits.shape
    flat, tgt = logits.reshape(b * t, v), targets.reshape(b * t)
    parts = []
    for start in range(0, b * t, chunk):
        sl = slice(start, start + chunk)
        if torch.is_grad_enabled() and flat.requires_grad:
            parts.append(
                checkpoint(_chunk_logprobs, flat[sl], tgt[sl], temperature, use_reentrant=False)
            )
        else:
            parts.append(_chunk_logprobs(flat[sl], tgt[sl], temperature))
    return torch.cat(parts).view(b, t)


def group_advantages(
    rewards: np.ndarray, *, std_normalize: bool, eps: float, ddof: int = 0
) -> np.ndarray:
    """GRPO advantages of one group: reward minus the group mean, over the group std
    (``ddof`` 0: population std, 1: sample std) plus ``eps``."""
    r = np.asarray(rewards, dtype=np.float64)
    adv = r - r.mean()
    if std_normalize:
        adv = adv / (r.std(ddof=ddof) + eps)
    return adv


class _Item:
    """One sample to run: its arrays, advantage, aggregation weight and processing."""

    __slots__ = (
        "tokens",
        "prompt_len",
        "behavior",
        "mask",
        "adv",
        "weight",
        "proc",
        "on_policy",
        "proximal",
        "routed",
    )

    def __init__(self, **kw: Any) -> None:
        self.proximal: Optional[np.ndarray] = None
        self.routed: Optional[np.ndarray] = None  # (tokens - 1, layers, top_k) to replay
        for k, v in kw.items():
            setattr(self, k, v)


class _Stats:
    """Sums over the masked tokens of a round, turned into its metrics."""

    def __init__(self) -> None:
        self.loss = self.pg_loss = self.kl = 0.0
        self.clip_low = self.clip_high = self.out_of_band = self.clip_dual = 0.0
        self.ratio_sum = self.tokens = self.is_w_sum = 0.0
        self.is_truncated = self.is_masked = self.outside = 0.0
        self.step_scales: list[float] = []
        self.prox_ratio: list[np.ndarray] = []
        self.behav_log_ratio: list[np.ndarray] = []
        self.inside_log_ratio: list[np.ndarray] = []
        self.on_policy_log_ratio: list[np.ndarray] = []

    def brake(self, seen: int, target: float) -> float:
        """``mismatch_kl_target``: the factor on this step's learning rate, ``min(1, target /
        KL)`` with KL the k3 mismatch of the step's tokens (those added after the first
        ``seen`` arrays), log-ratios bounded like the loss's."""
        parts = self.inside_log_ratio[seen:]
        d = np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)
        d = np.clip(d, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        kl = float(np.mean(np.expm1(d) - d)) if d.size else 0.0
        scale = 1.0 if kl <= target else target / kl
        self.step_scales.append(scale)
        return scale

    def metrics(self, n_steps: int) -> dict[str, float]:
        tok = max(self.tokens, 1.0)
        out = {
            "loss": self.loss / max(n_steps, 1),
            "pg_loss": self.pg_loss / max(n_steps, 1),
            "kl": self.kl / tok,
            "clip_frac": (self.clip_low + self.clip_high) / tok,
            "clip_frac_low": self.clip_low / tok,
            "clip_frac_high": self.clip_high / tok,
            "clip_frac_dual": self.clip_dual / tok,
            "ratio_out_of_band_frac": self.out_of_band / tok,
            "ratio_mean": self.ratio_sum / tok,
            "is_weight_mean": self.is_w_sum / tok,
            "is_truncated_frac": self.is_truncated / tok,
            "is_masked_frac": self.is_masked / tok,
            "tokens_outside_support": self.outside,
            "tokens": self.tokens,
        }
        if self.step_scales:
            # mismatch_kl_target: the mean factor on the lr and the steps it cut
            out["step_scale"] = float(np.mean(self.step_scales))
            out["steps_braked"] = float(sum(s < 1.0 for s in self.step_scales))
        d = np.concatenate(self.behav_log_ratio) if self.behav_log_ratio else np.zeros(0)
        d = d.astype(np.float64)
        if d.size:
            w = np.exp(d)
            q = np.percentile(w, [5, 50, 95])
            out.update(
                behav_ratio_mean=float(w.mean()),
                behav_ratio_min=float(w.min()),
                behav_ratio_p05=float(q[0]),
                behav_ratio_p50=float(q[1]),
                behav_ratio_p95=float(q[2]),
                behav_ratio_max=float(w.max()),
            )
        d = np.concatenate(self.inside_log_ratio).astype(np.float64) if d.size else d
        if d.size:
            # KL(pi_behavior || pi_trainer) on the sampled tokens inside the trainer's
            # support: k3 (>= 0) and k1
            out.update(mismatch_kl=float(np.mean(np.expm1(d) - d)), mismatch_k1=float(np.mean(-d)))
        on = np.concatenate(self.on_policy_log_ratio) if self.on_policy_log_ratio else d[:0]
        on = on.astype(np.float64)
        out["on_policy_tokens"] = float(on.size)
        if on.size:
            out["mismatch_kl_on_policy"] = float(np.mean(np.expm1(on) - on))
        p = np.concatenate(self.prox_ratio).astype(np.float64) if self.prox_ratio else d[:0]
        if p.size:
            out.update(
                prox_ratio_mean=float(p.mean()),
                prox_ratio_min=float(p.min()),
                prox_ratio_max=float(p.max()),
            )
        return out


#: ``export_dtype``: the serving dtypes a release may be written in (masters stay float32).
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TorchBackend(TrainerBackend):
    """GRPO trainer on a local HF checkpoint (``model_dir``). See the module docstring."""

    PLUGIN_NAME = "torch"

    @classmethod
    def preload(cls, options: Any) -> None:
        """The model classes :func:`yeto_torch.model.load_model` uses (transformers'
        auto classes and the Llama family: most of a start's import time)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: F401

    @classmethod
    def prepare_base(cls, options: dict[str, Any], model_dir: str | Path) -> Path:
        """Build the warm base checkpoint in ``model_dir`` (``yeto run up`` calls this
        when ``[model].path`` holds no model); a base made with the same options is reused.

        :param options: ``task`` (a built-in task), ``seed``, and any option of
            :func:`yeto_torch.warmup.make_base` (``hidden``, ``layers``, ``target_reward``, ...).
        """
        from yeto_torch.warmup import make_base

        opts = dict(options)
        task = opts.pop("task", None)
        if not task:
            raise ConfigError("model.base_options.task is missing: the task the base is warmed on")
        return make_base(model_dir, str(task), seed=int(opts.pop("seed", 0)), **opts)

    @classmethod
    def from_config(cls, options: Any, *, model_dir: Optional[str], seed: int) -> TrainerBackend:
        """The trainer of ``[trainer] backend_options``; on a rank of a ``torchrun`` job
        of several ranks (``[trainer] nproc_per_node > 1``), the sharded one
        (:class:`yeto_torch.fsdp.FsdpTorchBackend`)."""
        if cls is TorchBackend and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from yeto_torch.fsdp import FsdpTorchBackend

            return FsdpTorchBackend.from_config(options, model_dir=model_dir, seed=seed)
        return super().from_config(options, model_dir=model_dir, seed=seed)

    def __init__(
        self,
        model_dir: str,
        *,
        lr: float = 5e-4,
        tuning: str = "full",
        lora_rank: int = 8,
        lora_alpha: float = 16.0,
        lora_targets: tuple[str, ...] = lora_mod.DEFAULT_TARGETS,
        clip_eps: float = 0.2,
        clip_eps_high: Optional[float] = None,
        clip_ratio_c: Optional[float] = None,
        mismatch_kl_target: Optional[float] = None,
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        loss_agg: str = "token-mean",
        loss: Optional[str] = None,
        is_level: str = "token",
        is_cap: float = 2.0,
        is_cap_low: float = 0.0,
        updates_per_round: int = 1,
        temperature: Optional[float] = None,
        std_normalize: bool = True,
        adv_std: str = "population",
        adv_eps: float = 1e-6,
        min_reward_spread: float = 0.0,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        adam_eps: float = 1e-8,
        max_grad_norm: float = 1.0,
        lr_schedule: str = "constant",
        warmup_steps: int = 0,
        total_steps: int = 0,
        min_lr_ratio: float = 0.0,
        micro_batch: int = 64,
        seed: int = 0,
        threads: Optional[int] = None,
        export_dtype: Optional[str] = None,
        routing_replay: bool = True,
        lean: bool = True,
        device: str = "auto",
        precision: str = "fp32",
        activation_checkpointing: bool = False,
        logprob_chunk: int = 0,
        max_policy_age: Optional[int] = None,
    ):
        # a config without ``loss``: ppo-clip, or the measured correction when the data may
        # be more than one version stale (yeto_torch.loss_default; filled in by the run)
        filled = default_options(
            {"loss": loss, "mismatch_kl_target": mismatch_kl_target}, max_policy_age
        )
        loss = filled.get("loss", loss)
        mismatch_kl_target = filled.get("mismatch_kl_target", mismatch_kl_target)

        def bad(path: str, value: Any, allowed: str) -> ConfigError:
            return ConfigError(f"trainer.backend_options.{path} = {value!r}: {allowed}")

        if tuning not in TUNINGS:
            raise bad("tuning", tuning, f"allowed values are {', '.join(TUNINGS)}")
        if loss_agg not in LOSS_AGGS:
            raise bad("loss_agg", loss_agg, f"allowed values are {', '.join(LOSS_AGGS)}")
        for key, value, allowed in (
            ("loss", loss, LOSSES),
            ("is_level", is_level, IS_LEVELS),
            ("kl_estimator", kl_estimator, KL_ESTIMATORS),
            ("adv_std", adv_std, ADV_STDS),
        ):
            if value not in allowed:
                raise bad(key, value, f"allowed values are {', '.join(allowed)}")
        if not is_cap > 0 or not 0 <= is_cap_low < is_cap:
            raise bad(
                "is_cap", (is_cap, is_cap_low), "need is_cap > 0 and 0 <= is_cap_low < is_cap"
            )
        if int(updates_per_round) < 1:
            raise bad("updates_per_round", updates_per_round, "must be >= 1")
        if adv_eps < 0 or min_reward_spread < 0:
            raise bad("adv_eps / min_reward_spread", (adv_eps, min_reward_spread), "must be >= 0")
        if lr_schedule not in SCHEDULES:
            raise bad("lr_schedule", lr_schedule, f"allowed values are {', '.join(SCHEDULES)}")
        if not lr > 0:
            raise bad("lr", lr, "must be > 0 (5e-4 suits the tiny models)")
        if clip_ratio_c is not None and not clip_ratio_c > 1:
            raise bad(
                "clip_ratio_c",
                clip_ratio_c,
                "must be > 1 (the dual clip's bound on a negative advantage's ratio; 3 is "
                "common), or left out (no dual clip)",
            )
        if not clip_eps > 0:
            raise bad("clip_eps", clip_eps, "must be > 0")
        if mismatch_kl_target is not None and not (
            isinstance(mismatch_kl_target, (int, float)) and 0 < mismatch_kl_target < math.inf
        ):
            raise bad(
                "mismatch_kl_target",
                mismatch_kl_target,
                "must be a number > 0 (the per-round KL(behaviour || proximal) above which the "
                "step is scaled down; e.g. 0.05), or left out (off)",
            )
        if temperature is not None and temperature <= 0:
            raise bad(
                "temperature",
                temperature,
                "must be > 0 and equal the samplers' temperature (or leave it out: the trainer "
                "then follows the sampling recorded with each group)",
            )
        if export_dtype is not None and export_dtype not in EXPORT_DTYPES:
            raise bad(
                "export_dtype", export_dtype, f"allowed values are {', '.join(EXPORT_DTYPES)}"
            )
        if int(logprob_chunk) < 0:
            raise bad(
                "logprob_chunk", logprob_chunk, "must be >= 0 (0: off; else positions per chunk)"
            )
        self.device = resolve_device(device, "trainer.backend_options.device")
        #: the autocast dtype of ``precision`` (None: float32 throughout)
        self.compute_dtype = resolve_precision(
            precision, self.device, "trainer.backend_options.precision"
        )
        if not Path(model_dir, "config.json").is_file():
            raise ConfigError(
                f"trainer.backend_options.model_dir = {str(model_dir)!r}: no config.json there; "
                "point it at a local HF checkpoint (yeto_torch.warmup.make_base makes one)"
            )
        self.model_dir = Path(model_dir)
        self.opts = dict(
            lr=float(lr),
            tuning=tuning,
            lora_rank=int(lora_rank),
            lora_alpha=float(lora_alpha),
            lora_targets=list(lora_targets),
            clip_eps=float(clip_eps),
            clip_eps_high=float(clip_eps if clip_eps_high is None else clip_eps_high),
            clip_ratio_c=None if clip_ratio_c is None else float(clip_ratio_c),
            mismatch_kl_target=None if mismatch_kl_target is None else float(mismatch_kl_target),
            kl_coef=float(kl_coef),
            kl_estimator=kl_estimator,
            loss_agg=loss_agg,
            loss=loss,
            is_level=is_level,
            is_cap=float(is_cap),
            is_cap_low=float(is_cap_low),
            updates_per_round=int(updates_per_round),
            temperature=None if temperature is None else float(temperature),
            std_normalize=bool(std_normalize),
            adv_std=adv_std,
            adv_eps=float(adv_eps),
            min_reward_spread=float(min_reward_spread),
            weight_decay=float(weight_decay),
            betas=[float(b) for b in betas],
            adam_eps=float(adam_eps),
            max_grad_norm=float(max_grad_norm),
            lr_schedule=lr_schedule,
            warmup_steps=int(warmup_steps),
            total_steps=int(total_steps),
            min_lr_ratio=float(min_lr_ratio),
            micro_batch=int(micro_batch),
            seed=int(seed),
            export_dtype=export_dtype,
            routing_replay=bool(routing_replay),
            lean=bool(lean),
            device=str(device),
            precision=str(precision),
            activation_checkpointing=bool(activation_checkpointing),
            logprob_chunk=int(logprob_chunk),
        )
        if threads:
            torch.set_num_threads(int(threads))
        self.model: Any = None
        self.ref_model: Any = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.counters: dict[str, int] = {}
        self.base_checksum = ""
        self.moe_shape: Optional[tuple[int, int, int]] = None  # (layers, top_k, experts)
        self._leans: dict[int, Any] = {}  # id(model) -> its LeanLlama (None: its own forward)
        #: how a round's work is split across ranks (one process: all of it here)
        self.split: RoundSplit = WHOLE

    # -- set-up -----------------------------------------------------------------------

    def _lean(self, model: Any) -> Any:
        """The lean forward of ``model`` (:mod:`yeto_torch.lean`), or None: its own forward."""
        return self._leans.get(id(model))

    def _trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def _build(self) -> None:
        o = self.opts
        self.model = tiny.load_model(self.model_dir)
        self.model.train()
        self.moe_shape = moe.moe_shape(self.model)
        self.base_checksum = weight_checksum(self.model.named_parameters())
        if o["tuning"] == "lora":
            lora_mod.apply_lora(
                self.model,
                rank=o["lora_rank"],
                alpha=o["lora_alpha"],
                seed=o["seed"],
                targets=tuple(o["lora_targets"]),
            )
        self.ref_model = None
        if o["kl_coef"] > 0:
            self.ref_model = tiny.load_model(self.model_dir).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self._place()
        # the trained model's and the reference's lean forwards (built once per model)
        self._leans = {
            id(m): lean_for(m) for m in (self.model, self.ref_model) if m is not None and o["lean"]
        }
        if o["activation_checkpointing"]:
            self._checkpoint_layers()
        self._wrap_model()
        trainable = [p for _, p in self._trainable()]
        self.optimizer = torch.optim.AdamW(
            trainable,
            lr=o["lr"],
            betas=tuple(o["betas"]),
            eps=o["adam_eps"],
            weight_decay=o["weight_decay"],
            # one kernel for every tensor instead of a Python loop over them; the same
            # update (moments and step count kept the same way, so cuts carry over)
            fused=_fusable(trainable) or None,
        )
        self.counters = {
            "rounds": 0,
            "optimizer_steps": 0,
            "groups_trained": 0,
            "groups_skipped_equal": 0,
            "samples_trained": 0,
            "last_position": -1,
        }

    def _place(self) -> None:
        """Move the models to ``device`` (built and LoRA-wrapped on the CPU first, so their
        initial values are the CPU's on every device)."""
        if self.device.type != "cpu":
            self.model.to(self.device)
            if self.ref_model is not None:
                self.ref_model.to(self.device)

    def _checkpoint_layers(self) -> None:
        """``activation_checkpointing``: the trained model's decoder layers are recomputed
        in the backward instead of keeping their activations (the lean forward's own
        per-layer checkpoint, or transformers' gradient checkpointing)."""
        lean = self._lean(self.model)
        if lean is not None:
            lean.checkpoint_layers = True
        elif getattr(self.model, "supports_gradient_checkpointing", False):
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        else:
            raise ConfigError(
                f"trainer.backend_options.activation_checkpointing = true, but "
                f"{type(self.model).__name__} supports no gradient checkpointing; set it false"
            )

    def _wrap_model(self) -> None:
        """Called once the model is built, before its optimizer: a sharded trainer shards
        it here (:mod:`yeto_torch.fsdp`). One process: nothing to do."""

    def _placed(self, t: torch.Tensor, p: torch.nn.Parameter) -> torch.Tensor:
        """A whole tensor of a single-process cut, laid out as parameter ``p`` is (one
        process: as it is; a sharded trainer: this rank's shard)."""
        return t

    def _idle_step(self, grad: bool) -> None:
        """A micro-step with no sample of this rank's, so that every rank runs as many
        (:meth:`RoundSplit.parts` pads with empty parts only across several ranks)."""
        raise AssertionError("an empty micro-batch in a single-process round")

    def restore(self, cut_dir: Optional[Path]) -> None:
        """Start from the base (``cut_dir`` None, RNGs seeded) or continue bitwise from a cut."""
        self._build()
        if cut_dir is None:
            seed = self.opts["seed"]
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)
            return
        cut = Path(cut_dir)
        state_path = cut / "trainer_state.json"
        if not state_path.is_file():
            raise CutError(f"{cut} has no trainer_state.json; it is not a cut of the torch backend")
        state = json.loads(state_path.read_text())
        if state.get("format") not in (CUT_FORMAT, sharded_cut.FORMAT):
            raise CutError(
                f"{state_path}: cut format {state.get('format')!r}, this backend reads "
                f"{CUT_FORMAT} and {sharded_cut.FORMAT} (sharded)"
            )
        for key in _STRUCTURAL:
            if state["options"].get(key) != self.opts[key]:
                raise CutError(
                    f"{state_path}: the cut was taken with {key}={state['options'].get(key)!r}, "
                    f"this trainer has {key}={self.opts[key]!r}; restore with the same setting"
                )
        if state["base_checksum"] != self.base_checksum:
            raise CutError(
                f"{state_path}: the cut was trained from a base with checksum "
                f"{state['base_checksum']}, but {self.model_dir} has {self.base_checksum}"
            )
        if state["format"] == sharded_cut.FORMAT:
            # a sharded trainer's cut (DCP): loaded at this trainer's world size
            sharded_cut.load(self, cut, state)
            self.counters = {k: int(v) for k, v in state["counters"].items()}
            return
        weights = load_file(str(cut / "weights.safetensors"))
        moments = load_file(str(cut / "optimizer.safetensors"))
        params = dict(self._trainable())
        if set(weights) != set(params):
            raise CutError(
                f"{cut}/weights.safetensors does not hold this model's trainable parameters"
            )
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(self._placed(weights[name], p))
        for name, p in params.items():
            if f"exp_avg.{name}" in moments:
                # on the parameter's device (fused AdamW keeps its step count there too)
                self.optimizer.state[p] = {
                    "step": moments[f"step.{name}"].clone().to(p.device),
                    "exp_avg": self._placed(moments[f"exp_avg.{name}"].clone(), p).to(p.device),
                    "exp_avg_sq": self._placed(moments[f"exp_avg_sq.{name}"].clone(), p).to(
                        p.device
                    ),
                }
        rng = load_file(str(cut / "rng.safetensors"))
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        np_state = state["rng"]["numpy"]
        np.random.set_state(
            (
                np_state["kind"],
                rng["numpy_keys"].numpy().astype(np.uint32),
                np_state["pos"],
                np_state["has_gauss"],
                np_state["cached_gaussian"],
            )
        )
        py = state["rng"]["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        self.counters = {k: int(v) for k, v in state["counters"].items()}

    # -- training ---------------------------------------------------------------------

    def _processing(self, group: Any) -> tuple[float, int, float, str]:
        """(temperature, top_k, top_p, filter_order) the group's behavior log-probs were
        computed under (a group without the record: sequential, no top-k/top-p)."""
        configured = self.opts["temperature"]
        sp = getattr(group, "sampling", None)
        if sp is None:
            return (1.0 if configured is None else configured, 0, 1.0, "sequential")
        key = (float(sp.temperature), int(sp.top_k), float(sp.top_p), str(sp.filter_order))
        if configured is not None and key[0] != configured:
            raise ConfigError(
                f"group {group.group_id}: sampled at temperature {key[0]:g}, but "
                f"trainer.backend_options.temperature = {configured:g}; the trainer would score "
                "the tokens under another distribution. Remove the trainer's temperature (it "
                "then follows each group's recorded sampling) or make them equal"
            )
        return key

    def _routing(self, items: list) -> Optional[list]:
        """The routed experts to replay for ``items`` (None when no item carries any)."""
        if all(it.routed is None for it in items):
            return None
        return [it.routed for it in items]

    def _logprobs(
        self,
        model: Any,
        ids: torch.Tensor,
        attn: torch.Tensor,
        procs: list[tuple],
        routed: Optional[list] = None,
        keep_from: int = 0,
    ) -> torch.Tensor:
        """Log-prob of token t+1 at every position t (``[B, T-1]``), row ``r`` under the
        processing ``procs[r]`` (temperature, top-k, top-p, filter order: the sampler's
        own function).
        With ``routed`` (per row: ``(tokens - 1, layers, top_k)`` or None), every MoE layer
        uses those experts (routing replay, :mod:`yeto_torch.moe`). Positions before
        ``keep_from`` (no row's response is predicted there) are 0, without a gradient;
        the lean forward then skips their last-layer work."""
        keep_from = max(0, min(int(keep_from), ids.shape[1] - 2))
        with autocast(self.device, self.compute_dtype):
            logits = self._forward(model, ids, attn, routed, keep_from)
        chunk = self.opts["logprob_chunk"]
        logits = logits[:, :-1] if chunk else logits[:, :-1].float()
        targets = ids[:, keep_from + 1 :, None]
        by_key: dict[tuple, list[int]] = {}
        for row, key in enumerate(procs):
            by_key.setdefault(key, []).append(row)
        parts, order = [], []
        for (temp, top_k, top_p, filters), rows in by_key.items():
            idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
            if chunk and not top_k and top_p >= 1.0:
                parts.append(chunked_logprobs(logits[idx], targets[idx], temp, chunk))
            else:
                logp = process_logits(logits[idx], temp, top_k, top_p, filters)
                parts.append(logp.gather(-1, targets[idx]).squeeze(-1))
            order.extend(rows)
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        if order != list(range(len(procs))):
            out = out[torch.argsort(torch.tensor(order, dtype=torch.long, device=out.device))]
        # tokens the processing excludes (outside top-k/top-p) have log-prob -inf: floor them
        # (their gradient is 0 either way) so that ratios stay finite
        out = out.clamp(min=LOGP_FLOOR)
        return torch.nn.functional.pad(out, (keep_from, 0)) if keep_from else out

    def _forward(
        self,
        model: Any,
        ids: torch.Tensor,
        attn: torch.Tensor,
        routed: Optional[list],
        keep_from: int,
    ) -> torch.Tensor:
        """The logits of positions ``keep_from..`` (``[B, T - keep_from, V]``)."""
        if routed is None and (lean := self._lean(model)) is not None:
            # right-padded rows: a position never attends to the padding after it
            return lean.forward(ids, keep_from=keep_from)[0]
        if routed is None:
            logits = model(input_ids=ids, attention_mask=attn).logits
        else:
            experts, where = moe.replay_tensors(routed, ids.shape[1], self.moe_shape)
            with moe.replay(model, experts.to(ids.device), where.to(ids.device)):
                logits = model(input_ids=ids, attention_mask=attn).logits
        return logits[:, keep_from:]

    def _equal(self, r: np.ndarray) -> tuple[bool, bool]:
        """(counts as equal, only because of ``min_reward_spread``)."""
        exact = bool(np.all(r == r[0]))
        if exact:
            return True, False
        spread = float(np.max(r) - np.min(r))
        by_spread = bool(spread <= self.opts["min_reward_spread"])
        return by_spread, by_spread

    def train_round(self, batch: Batch) -> dict[str, float]:
        """One GRPO round on ``batch``: ``updates_per_round`` optimizer steps (see
        ``docs/algorithms.md``)."""
        if self.model is None:
            raise RuntimeError(
                "train_round before restore(); call restore(None) to start from the base"
            )
        o = self.opts
        skipped = by_spread = 0
        rewards: list[float] = []
        chunks = [c for c in np.array_split(np.arange(len(batch.groups)), o["updates_per_round"])]
        steps = []  # per optimizer step: its items
        for chunk in chunks:
            groups = [batch.groups[int(k)] for k in chunk]
            n_real = sum(len(g.samples) for g in groups)
            total_tokens = sum(
                float(np.asarray(s.loss_mask).sum()) for g in groups for s in g.samples
            )
            items = []
            for gi, g in enumerate(groups):
                r = np.array([s.reward for s in g.samples], dtype=np.float64)
                rewards.extend(r.tolist())
                equal, spread_only = self._equal(r)
                proc = self._processing(g)
                if equal:
                    skipped += 1
                    by_spread += int(spread_only)
                    if o["kl_coef"] == 0:
                        continue
                if not self.split.owns(gi, len(groups)):
                    continue  # another rank's group (every rank counts every group above)
                adv = (
                    np.zeros_like(r)
                    if equal
                    else group_advantages(
                        r,
                        std_normalize=o["std_normalize"],
                        eps=o["adv_eps"],
                        ddof=1 if o["adv_std"] == "sample" else 0,
                    )
                )
                for s, a in zip(g.samples, adv, strict=True):
                    mask = np.asarray(s.loss_mask, dtype=np.float32)
                    if len(mask) != s.response_len or len(s.logprobs) != s.response_len:
                        raise ValueError(
                            f"group {g.group_id}: a sample has {len(s.tokens)} tokens, prompt_len "
                            f"{s.prompt_len}, but {len(s.logprobs)} logprobs and {len(mask)} mask "
                            "entries; both must cover the response exactly"
                        )
                    n_tok = float(mask.sum())
                    if n_tok == 0:
                        continue
                    routed = None
                    if o["routing_replay"] and s.routed_experts is not None:
                        routed = moe.check_routed(
                            s.routed_experts,
                            n_tokens=len(s.tokens),
                            shape=self.moe_shape,
                            where=f"group {g.group_id}, sample {g.samples.index(s)}",
                        )
                    if o["loss_agg"] == "token-mean":
                        w = 1.0 / total_tokens
                    elif o["loss_agg"] == "seq-mean-token-mean":
                        w = 1.0 / (n_real * n_tok)
                    else:
                        w = 1.0 / n_real
                    items.append(
                        _Item(
                            tokens=np.asarray(s.tokens),
                            prompt_len=int(s.prompt_len),
                            behavior=np.asarray(s.logprobs, dtype=np.float32),
                            mask=mask,
                            adv=float(a),
                            weight=w,
                            proc=proc,
                            on_policy=int(s.weight_version) == int(batch.policy_version),
                            routed=routed,
                        )
                    )
            # shortest first: a micro-batch pads only to its own longest sample (a stable
            # sort: the same order on every run, and on a resume from a cut)
            items.sort(key=lambda it: len(it.tokens))
            steps.append(items)
        stats = _Stats()
        mb = max(1, o["micro_batch"])
        if o["updates_per_round"] > 1:
            # the proximal policy: this trainer's log-probs before the round's first step
            with torch.no_grad():
                for items in steps:
                    for part in self.split.parts(items, mb):
                        if not part:
                            self._idle_step(grad=False)
                            continue
                        ids, attn, *_ = self._on_device(self._tensors(part))
                        prox = self._logprobs(
                            self.model,
                            ids,
                            attn,
                            [it.proc for it in part],
                            self._routing(part),
                            self._first_predicted(part),
                        )
                        prox = to_host(prox)
                        for row, it in enumerate(part):
                            n = len(it.tokens)
                            it.proximal = prox[row, it.prompt_len - 1 : n - 1].numpy().copy()
        lr = grad_norm = 0.0
        n_steps = 0
        # a round with more than one update is refused whole: keep its start to go back to
        snapshot = self._snapshot() if sum(1 for s in steps if self.split.any(s)) > 1 else None
        steps_before = self.counters["optimizer_steps"]
        refused: Optional[tuple[float, float]] = None
        for items in steps:
            lr = lr_at(
                self.counters["optimizer_steps"],
                lr=o["lr"],
                schedule=o["lr_schedule"],
                warmup_steps=o["warmup_steps"],
                total_steps=o["total_steps"],
                min_lr_ratio=o["min_lr_ratio"],
            )
            if not self.split.any(items):
                continue  # nothing to run: no optimizer step (moments and schedule stay)
            loss_before = stats.loss
            seen = len(stats.inside_log_ratio)
            for part in self.split.parts(items, mb):
                if part:
                    self._micro_step(part, stats)
                else:
                    self._idle_step(grad=True)
            if o["mismatch_kl_target"] is not None:
                lr *= stats.brake(seen, o["mismatch_kl_target"])
            params = [p for _, p in self._trainable()]
            if o["max_grad_norm"] > 0:
                grad_norm = self.split.value(
                    torch.nn.utils.clip_grad_norm_(params, o["max_grad_norm"])
                )
            else:
                grad_norm = self.split.grad_norm(params)
            step_loss = self.split.total(stats.loss - loss_before)
            if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):
                # refused before optimizer.step(): these weights never see a NaN/inf update
                self.optimizer.zero_grad(set_to_none=True)
                refused = (step_loss, grad_norm)
                break
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.counters["optimizer_steps"] += 1
            n_steps += 1
        if refused is not None:
            return self._refuse(snapshot, steps_before, refused, batch, rewards, lr)
        self.counters["rounds"] += 1
        self.counters["groups_trained"] += len(batch.groups) - skipped
        self.counters["groups_skipped_equal"] += skipped
        self.counters["samples_trained"] += batch.n_real_samples
        if batch.positions:
            self.counters["last_position"] = max(
                self.counters["last_position"], max(batch.positions)
            )
        out = self.split.merge(stats).metrics(n_steps)
        out.update(
            reward_mean=float(np.mean(rewards)) if rewards else 0.0,
            groups=float(len(batch.groups)),
            groups_skipped_equal=float(skipped),
            groups_equal_by_spread=float(by_spread),
            grad_norm=grad_norm,
            lr=lr,
            stepped=float(n_steps > 0),
            nonfinite=0.0,
            updates=float(n_steps),
            optimizer_steps=float(self.counters["optimizer_steps"]),
        )
        return out

    def _snapshot(self) -> dict[str, Any]:
        """The trainable weights and AdamW moments, to go back to (a copy on the host)."""
        params = [p for _, p in self._trainable()]
        return {
            "weights": [p.detach().to("cpu", copy=True) for p in params],
            "moments": [
                {k: v.detach().to("cpu", copy=True) for k, v in self.optimizer.state[p].items()}
                if p in self.optimizer.state
                else None
                for p in params
            ],
        }

    def _refuse(
        self,
        snapshot: Optional[dict[str, Any]],
        steps_before: int,
        refused: tuple[float, float],
        batch: Batch,
        rewards: list[float],
        lr: float,
    ) -> dict[str, float]:
        """Undo the round's earlier updates (if any) and report it refused (``nonfinite``)."""
        if snapshot is not None:
            params = [p for _, p in self._trainable()]
            with torch.no_grad():
                for p, w in zip(params, snapshot["weights"], strict=True):
                    p.copy_(w)
            for p, m in zip(params, snapshot["moments"], strict=True):
                if m is None:
                    self.optimizer.state.pop(p, None)
                else:
                    self.optimizer.state[p] = {k: v.to(p.device) for k, v in m.items()}
        self.optimizer.zero_grad(set_to_none=True)
        self.counters["optimizer_steps"] = steps_before
        self.counters["nonfinite_rounds"] = self.counters.get("nonfinite_rounds", 0) + 1
        loss, norm = refused
        finite_rewards = [r for r in rewards if math.isfinite(r)]
        return {
            "nonfinite": 1.0,
            "loss_finite": float(math.isfinite(loss)),
            "grad_norm_finite": float(math.isfinite(norm)),
            "groups": float(len(batch.groups)),
            "reward_mean": float(np.mean(finite_rewards)) if finite_rewards else 0.0,
            "lr": lr,
            "stepped": 0.0,
            "updates": 0.0,
            "optimizer_steps": float(steps_before),
            "nonfinite_rounds": float(self.counters["nonfinite_rounds"]),
        }

    @staticmethod
    def _tensors(items: list) -> tuple[torch.Tensor, ...]:
        """Right-padded ``ids``, ``attn`` and, aligned with the predicting positions, the
        behavior and proximal log-probs, the mask, plus per-row advantage and weight."""
        width = max(len(it.tokens) for it in items)
        b = len(items)
        # filled in numpy (a row's slices cost a fraction of torch's per-op dispatch), then
        # shared with torch without a copy
        ids = np.zeros((b, width), dtype=np.int64)
        attn = np.zeros((b, width), dtype=np.int64)
        behavior = np.zeros((b, width - 1), dtype=np.float32)
        prox = np.zeros((b, width - 1), dtype=np.float32)
        mask = np.zeros((b, width - 1), dtype=np.float32)
        for row, it in enumerate(items):
            n, p = len(it.tokens), it.prompt_len
            ids[row, :n] = it.tokens
            attn[row, :n] = 1
            # response token k sits at index p + k and is predicted at position p + k - 1
            behavior[row, p - 1 : n - 1] = it.behavior
            mask[row, p - 1 : n - 1] = it.mask
            if it.proximal is not None:
                prox[row, p - 1 : n - 1] = it.proximal
        return (
            torch.from_numpy(ids),
            torch.from_numpy(attn),
            torch.from_numpy(behavior),
            torch.from_numpy(prox),
            torch.from_numpy(mask),
        )

    def _on_device(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """``tensors`` (host) on the trainer's device (themselves on the CPU)."""
        if self.device.type == "cpu":
            return tensors
        return tuple(t.to(self.device, non_blocking=True) for t in tensors)

    @staticmethod
    def _first_predicted(items: list) -> int:
        """The first position that predicts a response token of any row (the shortest
        prompt's last): :meth:`_logprobs` needs no logit before it."""
        return min(it.prompt_len for it in items) - 1

    def _micro_step(self, items: list, stats: _Stats) -> None:
        o = self.opts
        dev = self.device
        ids, attn, behavior, prox, mask = self._on_device(self._tensors(items))
        adv = torch.tensor([[it.adv] for it in items], dtype=torch.float32, device=dev)
        weight = torch.tensor([[it.weight] for it in items], dtype=torch.float32, device=dev)
        procs = [it.proc for it in items]
        keep_from = self._first_predicted(items)
        new = self._logprobs(self.model, ids, attn, procs, self._routing(items), keep_from)
        if all(it.proximal is None for it in items):
            prox = new.detach()  # one step per round: the weights are still those of its start
        loss_kind = o["loss"]
        live = mask > 0
        if loss_kind == "ppo-clip":
            anchor = behavior
        else:
            # a token outside the proximal support has weight 0: keep its ratio finite (1)
            anchor = torch.where(prox <= LOGP_FLOOR, new.detach(), prox)
        # a masked token's log-ratio is 0 (ratio 1, no gradient: never 0 * inf), a live
        # one's is bounded before exp (beyond the bound the ratio is constant)
        ratio = torch.exp(_bounded(torch.where(live, new - anchor, torch.zeros_like(new))))
        lo, hi = 1.0 - o["clip_eps"], 1.0 + o["clip_eps_high"]
        clipped = torch.clamp(ratio, lo, hi)
        pg = -torch.minimum(ratio * adv, clipped * adv)
        dual = None
        if o["clip_ratio_c"] is not None:
            # dual clip: with A < 0, the token's loss is at most -c * A however large rho is
            bound = -o["clip_ratio_c"] * adv
            dual = (adv < 0) & (pg > bound)
            pg = torch.where(dual, bound.expand_as(pg), pg)
        # log behavior ratio pi_prox / pi_behavior on the live tokens (0 elsewhere)
        log_w = torch.where(live, prox - behavior, torch.zeros_like(prox))
        if o["is_level"] == "sequence":
            log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
        elif o["is_level"] == "sequence-geo":
            n_live = live.sum(-1, keepdim=True).clamp(min=1)
            log_w = (log_w.sum(-1, keepdim=True) / n_live).expand_as(log_w)
        w = torch.exp(_bounded(log_w))
        if loss_kind == "ppo-clip":
            is_w = torch.ones_like(w)
        elif loss_kind == "decoupled":
            is_w = w
        elif loss_kind == "tis":
            is_w = torch.clamp(w, max=o["is_cap"])
        else:  # mis
            keep = (w <= o["is_cap"]) & (w >= o["is_cap_low"])
            is_w = torch.where(keep, w, torch.zeros_like(w))
        pg = pg * is_w
        per_tok = pg
        kl = torch.zeros_like(pg)
        if self.ref_model is not None:
            with torch.no_grad():
                ref = self._logprobs(self.ref_model, ids, attn, procs, keep_from=keep_from)
            outside = (ref <= LOGP_FLOOR) | (new.detach() <= LOGP_FLOOR) | ~live
            d = _bounded(torch.where(outside, torch.zeros_like(ref), ref - new))
            kl = torch.exp(d) - d - 1.0
            if o["kl_estimator"] == "k3-is":
                # tokens were drawn from the behavior policy: weight by the policy term's
                # ratio (with its gradient) times its behaviour weight (capped or masked as
                # the loss caps it), so the estimate is that of KL(pi_theta || ref)
                kl = kl * ratio * is_w
            per_tok = pg + o["kl_coef"] * kl
        loss = (per_tok * mask * weight).sum()
        loss.backward()
        with torch.no_grad():
            on = torch.tensor([[float(it.on_policy)] for it in items], device=dev) * mask
            sel = mask > 0
            inside = sel & (prox > LOGP_FLOOR)  # the KL is infinite outside: counted apart
            d_b = (prox - behavior)[sel]
            stats.loss += float(loss)
            stats.pg_loss += float((pg * mask * weight).sum())
            stats.kl += float((kl * mask).sum())
            low = (ratio < lo) & (adv < 0)
            high = (ratio > hi) & (adv > 0)
            stats.clip_low += float((low.float() * mask).sum())
            stats.clip_high += float((high.float() * mask).sum())
            stats.out_of_band += float((((ratio < lo) | (ratio > hi)).float() * mask).sum())
            if dual is not None:
                stats.clip_dual += float((dual.float() * mask).sum())
            stats.ratio_sum += float((ratio * mask).sum())
            stats.tokens += float(mask.sum())
            stats.is_w_sum += float((is_w * mask).sum())
            if loss_kind == "tis":
                stats.is_truncated += float(((w > o["is_cap"]).float() * mask).sum())
            if loss_kind == "mis":
                stats.is_masked += float(((is_w == 0).float() * mask).sum())
            stats.outside += float(((new.detach() <= LOGP_FLOOR).float() * mask).sum())
            # the per-token metrics leave the device here
            stats.prox_ratio.append(to_host(torch.exp(new.detach() - prox)[sel]).numpy())
            # each token is in exactly one step: start-of-round figures, once per token
            stats.behav_log_ratio.append(to_host(d_b).numpy())
            stats.inside_log_ratio.append(to_host((prox - behavior)[inside]).numpy())
            stats.on_policy_log_ratio.append(to_host((prox - behavior)[inside & (on > 0)]).numpy())

    # -- cuts and releases --------------------------------------------------------------

    def save_cut(self, out_dir: Path, trigger: Trigger) -> None:
        """Write weights, AdamW state, RNGs and counters into ``out_dir`` (safetensors + JSON)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        params = self._trainable()
        # the cut's tensors leave the device here (a copy on the host)
        save_file(
            {n: to_host(p.detach()).contiguous().clone() for n, p in params},
            str(out / "weights.safetensors"),
        )
        moments = {}
        for n, p in params:
            st = self.optimizer.state.get(p)
            if st:
                moments[f"step.{n}"] = to_host(torch.as_tensor(st["step"])).clone()
                moments[f"exp_avg.{n}"] = to_host(st["exp_avg"]).contiguous().clone()
                moments[f"exp_avg_sq.{n}"] = to_host(st["exp_avg_sq"]).contiguous().clone()
        save_file(moments, str(out / "optimizer.safetensors"))
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        rngs = {
            "torch": torch.get_rng_state(),
            "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64)),
        }
        if self.device.type == "cuda":
            rngs["cuda"] = torch.cuda.get_rng_state(self.device)
        save_file(rngs, str(out / "rng.safetensors"))
        py = random.getstate()
        state = {
            "format": CUT_FORMAT,
            "backend": self.PLUGIN_NAME,
            "trigger": Trigger(trigger).value,
            "options": self.opts,
            "base_checksum": self.base_checksum,
            "counters": self.counters,
            "lr_schedule": {"optimizer_steps": self.counters["optimizer_steps"]},
            "rng": {
                "python": [py[0], list(py[1]), py[2]],
                "numpy": {
                    "kind": kind,
                    "pos": int(pos),
                    "has_gauss": int(has_gauss),
                    "cached_gaussian": float(cached),
                },
            },
        }
        (out / "trainer_state.json").write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")

    @property
    def vocab_size(self) -> Optional[int]:  # type: ignore[override]
        """The model's vocabulary size (for the policy fingerprint's probes)."""
        return int(self.model.config.vocab_size) if self.model is not None else None

    def model_facts(self) -> ModelFacts:
        """The vocabulary and, with ``routing_replay`` on a MoE model, the routed-expert shape
        :func:`~yeto_torch.moe.check_routed` needs: the reader leaves a group that fails them
        out of the round instead of :meth:`train_round` raising on it. A sample without routed
        experts is trained with the model's own routing, so they are not required."""
        vocab = self.vocab_size
        if self.moe_shape is None or not self.opts["routing_replay"]:
            return ModelFacts(vocab_size=vocab)
        layers, top_k, experts = self.moe_shape
        return ModelFacts(
            vocab_size=vocab,
            moe_layers=layers,
            top_k=top_k,
            num_experts=experts,
            routed_experts_required=False,
            distinct_experts=True,  # check_routed refuses a repeated expert
        )

    @property
    def weights_dtype(self) -> str:  # type: ignore[override]
        if self.opts.get("export_dtype"):
            return str(self.opts["export_dtype"])
        if self.model is None:
            return "float32"
        return str(next(self.model.parameters()).dtype).replace("torch.", "")

    def prompt_logprobs(self, prompts: Any) -> list[list[float]]:
        """Log-probs of the prompts' tokens under the weights a release would publish now.

        With ``export_dtype`` the release holds the masters rounded to that dtype, so the
        probes are scored by a copy of the model in it (what an engine serving the release
        computes), not by the float32 masters.
        """
        import copy

        from yeto_torch.sampling import prompt_logprobs

        dtype = self.opts.get("export_dtype")
        model = self.model
        if dtype and EXPORT_DTYPES[dtype] != next(model.parameters()).dtype:
            model = copy.deepcopy(model).to(EXPORT_DTYPES[dtype]).eval()
        return prompt_logprobs(model, prompts)

    def publish_release(self, out_dir: Path) -> dict[str, Any]:
        """Write a release (full HF export, or the LoRA adapter) into ``out_dir``."""
        if self.opts["tuning"] == "lora":
            return export.export_lora(
                self.model, self.model_dir, Path(out_dir), base_checksum=self.base_checksum
            )
        return export.export_full(
            self.model, self.model_dir, Path(out_dir), dtype=self._export_dtype()
        )

    def release_writer(self) -> Optional[Callable[[Path], dict[str, Any]]]:
        """A copy of the weights to export now, written by the returned function later
        (the driver's upload thread); None for LoRA (:meth:`publish_release` then)."""
        if self.opts["tuning"] == "lora":
            return None
        dt = self._export_dtype()
        tensors = export.snapshot_full(self.model, dtype=dt)
        model, base = self.model, self.model_dir

        def write(out_dir: Path) -> dict[str, Any]:
            return export.write_full(tensors, model, base, Path(out_dir), dtype=dt)

        return write

    def _export_dtype(self) -> Optional[torch.dtype]:
        """The dtype a full export writes its weights in (None: the model's own)."""
        dtype = self.opts.get("export_dtype")
        return EXPORT_DTYPES[dtype] if dtype else None

    def parameters(self) -> dict[str, Any]:
        """The trainable parameters as numpy copies (bfloat16 as float32): one of several
        trainer islands submits them, less its horizon's start, to the syncer."""
        out: dict[str, Any] = {}
        for n, p in self._trainable():
            t = p.detach().to("cpu", copy=True)
            if t.dtype == torch.bfloat16:
                t = t.float()
            out[n] = t.numpy()
        return out

    def load_parameters(self, params: Any) -> None:
        """Set the trainable parameters to ``params`` (a merged outer step); the AdamW
        state, the schedule and the RNG stay this island's."""
        trainable = dict(self._trainable())
        missing = sorted(set(trainable) - set(params))
        extra = sorted(set(params) - set(trainable))
        if missing or extra:
            raise CutError(
                f"load_parameters: the parameters differ from the model's (missing "
                f"{missing[:3]}, unknown {extra[:3]}); they come from another model"
            )
        with torch.no_grad():
            for n, p in trainable.items():
                src = torch.from_numpy(np.ascontiguousarray(params[n]))
                if tuple(src.shape) != tuple(p.shape):
                    raise CutError(
                        f"load_parameters: {n} has shape {tuple(src.shape)}, the model's "
                        f"is {tuple(p.shape)}"
                    )
                p.copy_(src.to(dtype=p.dtype, device=p.device))

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every trainable parameter and AdamW tensor (for bitwise comparisons in tests)."""
        out = {f"param.{n}": p.detach() for n, p in self._trainable()}
        for n, p in self._trainable():
            for k, v in self.optimizer.state.get(p, {}).items():
                out[f"opt.{k}.{n}"] = torch.as_tensor(v)
        return out
