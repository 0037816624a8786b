"""The GRPO losses written out in plain torch, one sample at a time, for the tests.

Nothing here calls the torch backend's own helpers: the processing (temperature,
top-k, top-p), the advantages, the ratios, the importance weights, the KL and
the aggregation are written again from their definitions in docs/algorithms.md.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import torch

NEG = float("-inf")


def processed_logp(model: Any, tokens, prompt_len: int, temp: float, top_k: int, top_p: float):
    """log pi(y_t | ...) of each response token under the processed distribution."""
    ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long)[None]
    z = model(input_ids=ids).logits[0, prompt_len - 1 : -1].float() / temp
    if top_k:
        kth = torch.sort(z, dim=-1, descending=True).values[:, top_k - 1 : top_k]
        z = torch.where(z >= kth, z, torch.full_like(z, NEG))
    if top_p < 1.0:
        probs = torch.softmax(z, dim=-1).detach()
        keep = torch.zeros_like(z, dtype=torch.bool)
        for row in range(z.shape[0]):
            before = 0.0  # probability mass of the tokens ranked above
            for j in torch.argsort(probs[row], descending=True).tolist():
                if before > top_p:
                    break
                keep[row, j] = True
                before += float(probs[row, j])
        z = torch.where(keep, z, torch.full_like(z, NEG))
    lp = torch.log_softmax(z, dim=-1)
    resp = torch.as_tensor(np.asarray(tokens[prompt_len:]), dtype=torch.long)
    return lp[torch.arange(len(resp)), resp]


def advantages(r, *, ddof: int, eps: float, min_spread: float) -> Optional[list[float]]:
    """None when the group counts as equal."""
    r = [float(x) for x in r]
    if max(r) - min(r) <= min_spread:
        return None
    mean = sum(r) / len(r)
    var = sum((x - mean) ** 2 for x in r) / (len(r) - ddof)
    return [(x - mean) / (math.sqrt(var) + eps) for x in r]


def loss(
    model_now: Any,
    model_start: Any,
    groups,
    *,
    kind: str = "ppo-clip",
    level: str = "token",
    cap: float = 2.0,
    cap_low: float = 0.0,
    clip_eps: float = 0.2,
    clip_c: Optional[float] = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    ref_model: Any = None,
    ddof: int = 0,
    eps: float = 1e-6,
    min_spread: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean loss over ``groups`` (a list of SampleGroup) and a few figures."""
    total = sum(float(np.sum(s.loss_mask)) for g in groups for s in g.samples)
    out = torch.zeros(())
    n = {"tokens": 0.0, "clip": 0.0, "w": [], "outside": 0.0, "truncated": 0.0, "masked": 0.0}
    n["dual"] = 0.0
    for g in groups:
        sp = g.sampling
        proc = (sp.temperature, sp.top_k, sp.top_p)
        adv = advantages([s.reward for s in g.samples], ddof=ddof, eps=eps, min_spread=min_spread)
        if adv is None:
            if kl_coef == 0:
                continue
            adv = [0.0] * len(g.samples)
        for s, a in zip(g.samples, adv, strict=True):
            m = torch.as_tensor(np.asarray(s.loss_mask, dtype=np.float32))
            b = torch.as_tensor(np.asarray(s.logprobs, dtype=np.float32))
            new = processed_logp(model_now, s.tokens, s.prompt_len, *proc)
            with torch.no_grad():
                prox = processed_logp(model_start, s.tokens, s.prompt_len, *proc)
            outside = torch.isinf(prox)
            zero = torch.zeros_like(new)
            new_s = torch.where(outside, zero, new)
            prox_s = torch.where(outside, zero, prox)
            if kind == "ppo-clip":
                r = torch.exp(new - b)  # 0 where outside: exp(-inf)
            else:
                r = torch.exp(new_s - prox_s)
            pg = -torch.minimum(r * a, torch.clamp(r, 1 - clip_eps, 1 + clip_eps) * a)
            if clip_c is not None and a < 0:  # dual clip: at most -c * A
                pg = torch.minimum(pg, torch.full_like(pg, -clip_c * a))
                n["dual"] += float(((pg == -clip_c * a).float() * m).sum())
            lw = torch.where(outside, torch.full_like(b, NEG), prox - b)
            if level == "sequence":
                lw = torch.full_like(b, float(torch.sum(torch.where(m > 0, lw, zero))))
            elif level == "sequence-geo":  # the geometric mean of the sequence's weights
                mean = torch.sum(torch.where(m > 0, lw, zero)) / max(float(m.sum()), 1.0)
                lw = torch.full_like(b, float(mean))
            w = torch.exp(lw)
            if kind == "ppo-clip":
                is_w = torch.ones_like(w)
            elif kind == "decoupled":
                is_w = w
            elif kind == "tis":
                is_w = torch.minimum(w, torch.full_like(w, cap))
                n["truncated"] += float(((w > cap).float() * m).sum())
            else:
                keep = (w <= cap) & (w >= cap_low)
                is_w = torch.where(keep, w, zero)
                n["masked"] += float(((~keep).float() * m).sum())
            tok = pg * is_w
            if kl_coef:
                with torch.no_grad():
                    q = processed_logp(ref_model, s.tokens, s.prompt_len, *proc)
                # a token outside either support adds no KL term
                out_kl = torch.isinf(q) | torch.isinf(new.detach())
                d = torch.where(out_kl, zero, q - torch.where(out_kl, zero, new))
                k3 = torch.exp(d) - d - 1
                if kl_estimator == "k3-is":
                    # the policy term's ratio (with its gradient) times its token weight
                    k3 = k3 * r * is_w
                tok = tok + kl_coef * k3
            out = out + (tok * m).sum() / total
            n["tokens"] += float(m.sum())
            clipped = ((r < 1 - clip_eps) & (a < 0)) | ((r > 1 + clip_eps) & (a > 0))
            n["clip"] += float((clipped.float() * m).sum())
            n["w"].extend(torch.exp(prox - b)[m > 0].tolist())
            n["outside"] += float((outside.float() * m).sum())
    t = max(n["tokens"], 1.0)
    w = np.asarray(n["w"])
    figures = {
        "clip_frac": n["clip"] / t,
        "behav_ratio_mean": float(w.mean()) if w.size else 1.0,
        "mismatch_kl": float(np.mean(w[w > 0] - 1 - np.log(w[w > 0]))) if w.size else 0.0,
        "tokens_outside_support": n["outside"],
        "is_truncated_frac": n["truncated"] / t,
        "is_masked_frac": n["masked"] / t,
        "clip_frac_dual": n["dual"] / t,
    }
    return out, figures
