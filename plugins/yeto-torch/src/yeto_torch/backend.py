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
import random
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from yeto_core.errors import ConfigError, CutError
from yeto_core.ports import TrainerBackend
from yeto_core.records import Batch, Trigger
from yeto_torch import export
from yeto_torch import lora as lora_mod
from yeto_torch import model as tiny
from yeto_torch.checksum import weight_checksum

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
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


def group_advantages(rewards: np.ndarray, *, std_normalize: bool, eps: float) -> np.ndarray:
    """GRPO advantages of one group: reward minus the group mean, over the group std."""
    r = np.asarray(rewards, dtype=np.float64)
    adv = r - r.mean()
    if std_normalize:
        adv = adv / (r.std() + eps)
    return adv


class TorchBackend(TrainerBackend):
    """GRPO trainer on a local HF checkpoint (``model_dir``). See the module docstring."""

    PLUGIN_NAME = "torch"

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
        kl_coef: float = 0.0,
        loss_agg: str = "token-mean",
        temperature: float = 1.0,
        std_normalize: bool = True,
        adv_eps: float = 1e-6,
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
    ):
        def bad(path: str, value: Any, allowed: str) -> ConfigError:
            return ConfigError(f"trainer.backend_options.{path} = {value!r}: {allowed}")

        if tuning not in TUNINGS:
            raise bad("tuning", tuning, f"allowed values are {', '.join(TUNINGS)}")
        if loss_agg not in LOSS_AGGS:
            raise bad("loss_agg", loss_agg, f"allowed values are {', '.join(LOSS_AGGS)}")
        if lr_schedule not in SCHEDULES:
            raise bad("lr_schedule", lr_schedule, f"allowed values are {', '.join(SCHEDULES)}")
        if not lr > 0:
            raise bad("lr", lr, "must be > 0 (5e-4 suits the tiny models)")
        if not clip_eps > 0:
            raise bad("clip_eps", clip_eps, "must be > 0")
        if temperature <= 0:
            raise bad("temperature", temperature, "must be > 0 and equal the samplers' temperature")
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
            kl_coef=float(kl_coef),
            loss_agg=loss_agg,
            temperature=float(temperature),
            std_normalize=bool(std_normalize),
            adv_eps=float(adv_eps),
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
        )
        if threads:
            torch.set_num_threads(int(threads))
        self.model: Any = None
        self.ref_model: Any = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.counters: dict[str, int] = {}
        self.base_checksum = ""

    # -- set-up -----------------------------------------------------------------------

    def _trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def _build(self) -> None:
        o = self.opts
        self.model = tiny.load_model(self.model_dir)
        self.model.train()
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
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self._trainable()],
            lr=o["lr"],
            betas=tuple(o["betas"]),
            eps=o["adam_eps"],
            weight_decay=o["weight_decay"],
        )
        self.counters = {
            "rounds": 0,
            "optimizer_steps": 0,
            "groups_trained": 0,
            "groups_skipped_equal": 0,
            "samples_trained": 0,
            "last_position": -1,
        }

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
        if state.get("format") != CUT_FORMAT:
            raise CutError(
                f"{state_path}: cut format {state.get('format')!r}, this backend reads {CUT_FORMAT}"
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
        weights = load_file(str(cut / "weights.safetensors"))
        moments = load_file(str(cut / "optimizer.safetensors"))
        params = dict(self._trainable())
        if set(weights) != set(params):
            raise CutError(
                f"{cut}/weights.safetensors does not hold this model's trainable parameters"
            )
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(weights[name])
        for name, p in params.items():
            if f"exp_avg.{name}" in moments:
                self.optimizer.state[p] = {
                    "step": moments[f"step.{name}"].clone(),
                    "exp_avg": moments[f"exp_avg.{name}"].clone(),
                    "exp_avg_sq": moments[f"exp_avg_sq.{name}"].clone(),
                }
        rng = load_file(str(cut / "rng.safetensors"))
        torch.set_rng_state(rng["torch"])
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

    def _logprobs(self, model: Any, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        logp = torch.log_softmax(logits / self.opts["temperature"], dim=-1)
        return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T-1]: logp of token t+1

    def train_round(self, batch: Batch) -> dict[str, float]:
        """One GRPO optimizer step on ``batch`` (see ``docs/algorithms.md``)."""
        if self.model is None:
            raise RuntimeError(
                "train_round before restore(); call restore(None) to start from the base"
            )
        o = self.opts
        n_real = batch.n_real_samples
        total_tokens = sum(
            float(np.asarray(s.loss_mask).sum()) for g in batch.groups for s in g.samples
        )
        items = []  # (tokens, prompt_len, old_lp, mask, adv, per-token weight)
        skipped = 0
        rewards = []
        for g in batch.groups:
            r = np.array([s.reward for s in g.samples], dtype=np.float64)
            rewards.extend(r.tolist())
            equal = bool(np.all(r == r[0]))
            if equal:
                skipped += 1
                if o["kl_coef"] == 0:
                    continue
            adv = (
                np.zeros_like(r)
                if equal
                else group_advantages(r, std_normalize=o["std_normalize"], eps=o["adv_eps"])
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
                if o["loss_agg"] == "token-mean":
                    w = 1.0 / total_tokens
                elif o["loss_agg"] == "seq-mean-token-mean":
                    w = 1.0 / (n_real * n_tok)
                else:
                    w = 1.0 / n_real
                items.append(
                    (
                        np.asarray(s.tokens),
                        int(s.prompt_len),
                        np.asarray(s.logprobs, dtype=np.float32),
                        mask,
                        float(a),
                        w,
                    )
                )
        stats = {
            "loss": 0.0,
            "pg_loss": 0.0,
            "kl": 0.0,
            "clip_frac": 0.0,
            "ratio_mean": 0.0,
            "tokens": 0.0,
        }
        mb = max(1, o["micro_batch"])
        for start in range(0, len(items), mb):
            self._micro_step(items[start : start + mb], stats)
        stepped = bool(items)
        grad_norm = 0.0
        lr = lr_at(
            self.counters["optimizer_steps"],
            lr=o["lr"],
            schedule=o["lr_schedule"],
            warmup_steps=o["warmup_steps"],
            total_steps=o["total_steps"],
            min_lr_ratio=o["min_lr_ratio"],
        )
        if stepped:
            params = [p for _, p in self._trainable()]
            if o["max_grad_norm"] > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, o["max_grad_norm"]))
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.counters["optimizer_steps"] += 1
        self.counters["rounds"] += 1
        self.counters["groups_trained"] += len(batch.groups) - skipped
        self.counters["groups_skipped_equal"] += skipped
        self.counters["samples_trained"] += n_real
        if batch.positions:
            self.counters["last_position"] = max(
                self.counters["last_position"], max(batch.positions)
            )
        tok = max(stats["tokens"], 1.0)
        return {
            "loss": stats["loss"],
            "pg_loss": stats["pg_loss"],
            "kl": stats["kl"] / tok,
            "clip_frac": stats["clip_frac"] / tok,
            "ratio_mean": stats["ratio_mean"] / tok,
            "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
            "groups": float(len(batch.groups)),
            "groups_skipped_equal": float(skipped),
            "grad_norm": grad_norm,
            "lr": lr,
            "stepped": float(stepped),
            "optimizer_steps": float(self.counters["optimizer_steps"]),
        }

    def _micro_step(self, items: list, stats: dict[str, float]) -> None:
        o = self.opts
        width = max(len(t) for t, *_ in items)
        b = len(items)
        ids = torch.zeros((b, width), dtype=torch.long)
        attn = torch.zeros((b, width), dtype=torch.long)
        old = torch.zeros((b, width - 1))
        mask = torch.zeros((b, width - 1))
        adv = torch.zeros((b, 1))
        weight = torch.zeros((b, 1))
        for row, (toks, p_len, lp, m, a, w) in enumerate(items):
            n = len(toks)
            ids[row, :n] = torch.from_numpy(toks.astype(np.int64))
            attn[row, :n] = 1
            # response token k sits at index p_len + k and is predicted at position p_len + k - 1
            old[row, p_len - 1 : n - 1] = torch.from_numpy(lp)
            mask[row, p_len - 1 : n - 1] = torch.from_numpy(m)
            adv[row, 0], weight[row, 0] = a, w
        new = self._logprobs(self.model, ids, attn)
        ratio = torch.exp(new - old)
        clipped = torch.clamp(ratio, 1.0 - o["clip_eps"], 1.0 + o["clip_eps_high"])
        pg = -torch.minimum(ratio * adv, clipped * adv)
        per_tok = pg
        kl = torch.zeros_like(pg)
        if self.ref_model is not None:
            with torch.no_grad():
                ref = self._logprobs(self.ref_model, ids, attn)
            d = ref - new
            kl = torch.exp(d) - d - 1.0
            per_tok = pg + o["kl_coef"] * kl
        loss = (per_tok * mask * weight).sum()
        loss.backward()
        with torch.no_grad():
            stats["loss"] += float(loss)
            stats["pg_loss"] += float((pg * mask * weight).sum())
            stats["kl"] += float((kl * mask).sum())
            stats["clip_frac"] += float((((ratio - clipped).abs() > 0).float() * mask).sum())
            stats["ratio_mean"] += float((ratio * mask).sum())
            stats["tokens"] += float(mask.sum())

    # -- cuts and releases --------------------------------------------------------------

    def save_cut(self, out_dir: Path, trigger: Trigger) -> None:
        """Write weights, AdamW state, RNGs and counters into ``out_dir`` (safetensors + JSON)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        params = self._trainable()
        save_file(
            {n: p.detach().contiguous().clone() for n, p in params},
            str(out / "weights.safetensors"),
        )
        moments = {}
        for n, p in params:
            st = self.optimizer.state.get(p)
            if st:
                moments[f"step.{n}"] = torch.as_tensor(st["step"]).clone()
                moments[f"exp_avg.{n}"] = st["exp_avg"].contiguous().clone()
                moments[f"exp_avg_sq.{n}"] = st["exp_avg_sq"].contiguous().clone()
        save_file(moments, str(out / "optimizer.safetensors"))
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        save_file(
            {
                "torch": torch.get_rng_state(),
                "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64)),
            },
            str(out / "rng.safetensors"),
        )
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

    @property
    def weights_dtype(self) -> str:  # type: ignore[override]
        if self.model is None:
            return "float32"
        return str(next(self.model.parameters()).dtype).replace("torch.", "")

    def prompt_logprobs(self, prompts: Any) -> list[list[float]]:
        """Log-probs of the prompts' tokens under the weights a release would publish now."""
        from yeto_torch.sampling import prompt_logprobs

        return prompt_logprobs(self.model, prompts)

    def publish_release(self, out_dir: Path) -> dict[str, Any]:
        """Write a release (full HF export, or the LoRA adapter) into ``out_dir``."""
        if self.opts["tuning"] == "lora":
            return export.export_lora(
                self.model, self.model_dir, Path(out_dir), base_checksum=self.base_checksum
            )
        return export.export_full(self.model, self.model_dir, Path(out_dir))

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every trainable parameter and AdamW tensor (for bitwise comparisons in tests)."""
        out = {f"param.{n}": p.detach() for n, p in self._trainable()}
        for n, p in self._trainable():
            for k, v in self.optimizer.state.get(p, {}).items():
                out[f"opt.{k}.{n}"] = torch.as_tensor(v)
        return out
