"""SGLang 0.5.x HTTP protocol: request field names, answer decoding, behaviour log-probs.

Pure functions over plain JSON data and numpy (no HTTP, no torch), shared by
the engine and the protocol test server. Field names are those of SGLang
0.5.23's ``GenerateReqInput``, ``SamplingParams``,
``UpdateWeightFromDiskReqInput`` and ``LoadLoRAAdapterReqInput``.

Behaviour log-probs. SGLang 0.5.x (``python/sglang/srt/layers/sampler.py``,
``SGLANG_RETURN_ORIGINAL_LOGPROB`` unset) returns, for a sampled token,
``log_softmax(logits / temperature)`` over the whole vocabulary: *after* the
temperature, *before* the top-k / top-p / min-p filters it samples with. A
greedy request (temperature 0) is served as temperature 1 with top-k 1 and
returns the raw ``log_softmax(logits)``. The distribution a token was drawn
from keeps the ``min(top_k, nucleus)`` most likely tokens (both filters are
applied jointly on the temperature-scaled probabilities) and renormalises
them. :func:`behaviour_logprobs` turns SGLang's values into the log-probs of
that distribution from the top log-probs of each position, or refuses when
they cannot be computed. Prompt log-probs (``input_token_logprobs``) are
never temperature-scaled.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import attrs
import numpy as np

#: ``GenerateReqInput`` fields (0.5.23) the engine may send to ``POST /generate``.
GENERATE_FIELDS = frozenset(
    {
        "text",
        "input_ids",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "token_ids_logprob",
        "return_text_in_logprobs",
        "stream",
        "return_hidden_states",
        "return_routed_experts",
        "routed_experts_start_len",
        "lora_path",
        "lora_id",
        "rid",
        "routing_key",
        "priority",
    }
)
#: ``SamplingParams`` API fields (0.5.23).
SAMPLING_FIELDS = frozenset(
    {
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    }
)
#: ``UpdateWeightFromDiskReqInput`` fields (0.5.23).
UPDATE_FROM_DISK_FIELDS = frozenset(
    {
        "model_path",
        "load_format",
        "abort_all_requests",
        "weight_version",
        "is_async",
        "torch_empty_cache",
        "keep_pause",
        "flush_cache",
        "token_step",
        "manifest",
    }
)
#: ``LoadLoRAAdapterReqInput`` fields (0.5.23); unloading takes ``lora_name`` (and ``lora_id``).
LOAD_LORA_FIELDS = frozenset({"lora_name", "lora_path", "pinned", "lora_id"})
UNLOAD_LORA_FIELDS = frozenset({"lora_name", "lora_id"})
#: ``/pause_generation`` modes.
PAUSE_MODES = ("abort", "retract", "in_place")
PAUSE_FIELDS = frozenset({"mode"})
#: SGLang's "whole vocabulary" top-k (``TOP_K_ALL``); ``-1`` on the wire means the same.
TOP_K_ALL = 1 << 30
SAMPLING_EPS = 1e-6
#: The weight version a server reports before any update (``--weight-version`` default).
DEFAULT_WEIGHT_VERSION = "default"


class ProtocolError(RuntimeError):
    """An SGLang answer that does not have the 0.5.x shape."""


def unknown_fields(body: Mapping[str, Any], allowed: frozenset[str]) -> list[str]:
    return sorted(k for k in body if k not in allowed)


@attrs.frozen(eq=False)
class GenerateOutput:
    """One decoded ``/generate`` answer (one sequence)."""

    output_ids: tuple[int, ...]
    finish_type: str  # "stop", "length" or "abort"
    finish_message: str
    weight_version: str
    #: ``(version, start, end)`` spans over the output tokens.
    weight_spans: tuple[tuple[str, int, int], ...]
    token_logprobs: Optional[np.ndarray]  # SGLang's values, one per output token
    top_logprobs: Optional[list[list[tuple[float, int]]]]  # per output token, best first
    input_logprobs: Optional[list[Optional[float]]]  # from logprob_start_len on
    routed_experts: Optional[np.ndarray]  # int32 (tokens - 1, layers, top_k)
    raw_meta: dict[str, Any]

    @property
    def versions(self) -> tuple[str, ...]:
        """The distinct weight versions that served this sequence's tokens."""
        seen = [v for v, _s, _e in self.weight_spans] or [self.weight_version]
        return tuple(dict.fromkeys(seen))


def _triples(rows: Any, what: str) -> list[tuple[Optional[float], int]]:
    if not isinstance(rows, list):
        raise ProtocolError(f"meta_info.{what} is {type(rows).__name__}, expected a list")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) < 2:
            raise ProtocolError(
                f"meta_info.{what}[{i}] = {row!r}; expected [logprob, token_id, text]"
            )
        lp = None if row[0] is None else float(row[0])
        out.append((lp, int(row[1])))
    return out


def decode_routed_experts(data: str, *, tokens: int, layers: int, top_k: int) -> np.ndarray:
    """``meta_info.routed_experts``: base64 of raw int32, shape ``(tokens - 1, layers, top_k)``."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"meta_info.routed_experts is not base64: {exc}") from None
    want = (tokens - 1) * layers * top_k
    arr = np.frombuffer(raw, dtype="<i4")
    if arr.size != want:
        raise ProtocolError(
            f"meta_info.routed_experts holds {arr.size} int32 values; a sequence of {tokens} "
            f"tokens with {layers} MoE layers and top_k {top_k} needs {want} "
            f"(({tokens} - 1) x {layers} x {top_k}). Is the served model the base's MoE config?"
        )
    return arr.reshape(tokens - 1, layers, top_k).astype(np.int32)


def encode_routed_experts(arr: np.ndarray) -> str:
    """The inverse of :func:`decode_routed_experts` (what SGLang sends)."""
    return base64.b64encode(np.ascontiguousarray(arr, dtype="<i4").tobytes()).decode("ascii")


def decode_generate(
    item: Any,
    *,
    prompt_len: int,
    routed_shape: Optional[tuple[int, int]] = None,
) -> GenerateOutput:
    """Decode one element of a ``/generate`` answer.

    :param prompt_len: the prompt's token count (for the routed-experts shape).
    :param routed_shape: ``(layers, top_k)`` when routed experts were requested.
    """
    if not isinstance(item, Mapping):
        raise ProtocolError(f"/generate answered {type(item).__name__}, expected an object")
    if "meta_info" not in item or "output_ids" not in item:
        raise ProtocolError(
            f"/generate answer lacks output_ids or meta_info (keys: {sorted(item)}); "
            "is this an SGLang 0.5.x server started without --skip-tokenizer-init?"
        )
    meta = item["meta_info"]
    ids = tuple(int(t) for t in item["output_ids"])
    fr = meta.get("finish_reason")
    if isinstance(fr, Mapping):
        ftype, fmsg = str(fr.get("type")), str(fr.get("message", ""))
    elif fr is None:
        ftype, fmsg = "abort", "no finish_reason (request still running?)"
    else:
        ftype, fmsg = str(fr), ""
    version = str(meta.get("weight_version", DEFAULT_WEIGHT_VERSION))
    spans = tuple(
        (str(s["version"]), int(s["start"]), int(s["end"]))
        for s in (meta.get("weight_versions") or ())
    )
    token_lps = None
    if "output_token_logprobs" in meta:
        rows = _triples(meta["output_token_logprobs"], "output_token_logprobs")
        if len(rows) != len(ids):
            raise ProtocolError(
                f"meta_info.output_token_logprobs has {len(rows)} entries for {len(ids)} "
                "output tokens"
            )
        for k, ((lp, tok), want) in enumerate(zip(rows, ids, strict=True)):
            if tok != want or lp is None:
                raise ProtocolError(
                    f"meta_info.output_token_logprobs[{k}] = ({lp}, {tok}) does not match "
                    f"output token {want}"
                )
        token_lps = np.asarray([lp for lp, _ in rows], dtype=np.float64)
    top = None
    tops = meta.get("output_top_logprobs")
    if tops:
        top = []
        for k, pos in enumerate(tops):
            if pos is None:
                top.append([])
                continue
            top.append([(float(lp), tok) for lp, tok in _triples(pos, f"output_top_logprobs[{k}]")])
        if len(top) != len(ids):
            raise ProtocolError(
                f"meta_info.output_top_logprobs has {len(top)} positions for {len(ids)} tokens"
            )
    inputs = None
    if meta.get("input_token_logprobs"):
        inputs = [lp for lp, _ in _triples(meta["input_token_logprobs"], "input_token_logprobs")]
    routed = None
    if routed_shape is not None:
        data = meta.get("routed_experts")
        if data is None:
            raise ProtocolError(
                "routed experts were requested but meta_info has no routed_experts; start "
                "the server with --enable-return-routed-experts (SGLang >= 0.5.7)"
            )
        routed = decode_routed_experts(
            data, tokens=prompt_len + len(ids), layers=routed_shape[0], top_k=routed_shape[1]
        )
    return GenerateOutput(
        output_ids=ids,
        finish_type=ftype,
        finish_message=fmsg,
        weight_version=version,
        weight_spans=spans,
        token_logprobs=token_lps,
        top_logprobs=top,
        input_logprobs=inputs,
        routed_experts=routed,
        raw_meta=dict(meta),
    )


# -- behaviour log-probs -----------------------------------------------------------------


def wire_top_k(top_k: int) -> int:
    """yeto's ``top_k`` (0: off) as SGLang expects it (-1: off)."""
    return -1 if top_k <= 0 else int(top_k)


def top_logprobs_needed(temperature: float, top_k: int, top_p: float, nucleus_cap: int) -> int:
    """How many top log-probs per position :func:`behaviour_logprobs` needs (0: none).

    :raises ValueError: the sampling cannot be corrected (top-p without top-k and no cap).
    """
    if temperature < SAMPLING_EPS:
        return 0  # greedy: the drawn token has probability 1 under the behaviour policy
    if 0 < top_k < TOP_K_ALL:
        return int(top_k)
    if top_p < 1.0:
        if nucleus_cap <= 0:
            raise ValueError(
                f"top_p={top_p} without top_k: SGLang returns log-probs before the top-p "
                "filter, and the filtered distribution needs the top log-probs of the "
                "whole nucleus. Set top_k too, or the engine option nucleus_top_logprobs "
                "(how many top log-probs to request per token, e.g. 64)"
            )
        return int(nucleus_cap)
    return 0


def behaviour_logprobs(
    out: GenerateOutput,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    vocab_size: Optional[int] = None,
) -> np.ndarray:
    """Log-probs of each output token under the distribution SGLang drew it from.

    ``out.token_logprobs`` are SGLang's ``log_softmax(logits / T)`` values (see the
    module docstring). With no filter (``top_k`` off, ``top_p`` 1) they are already
    the behaviour log-probs. With a filter, the kept set at each position is the
    ``min(top_k, nucleus)`` best tokens (nucleus: the shortest prefix of the sorted
    probabilities whose mass before each kept token is at most ``top_p``) and the
    behaviour log-prob is ``lp - logsumexp(kept lps)``. Greedy (``T`` 0) gives 0.

    :raises ProtocolError: the top log-probs do not cover the kept set, or the drawn
        token is outside it.
    """
    if out.token_logprobs is None:
        raise ProtocolError("the answer has no output_token_logprobs (return_logprob false?)")
    lps = np.asarray(out.token_logprobs, dtype=np.float64)
    if temperature < SAMPLING_EPS:
        return np.zeros_like(lps, dtype=np.float32)
    k_on = 0 < top_k < TOP_K_ALL
    if not k_on and top_p >= 1.0:
        return lps.astype(np.float32)
    if out.top_logprobs is None:
        raise ProtocolError(
            "top-k/top-p sampling needs output_top_logprobs to renormalise the log-probs; "
            "the request must set top_logprobs_num"
        )
    res = np.empty_like(lps)
    for t, (lp, tok, row) in enumerate(zip(lps, out.output_ids, out.top_logprobs, strict=True)):
        vals = np.asarray([v for v, _ in row], dtype=np.float64)
        ids = [i for _, i in row]
        limit = min(top_k, len(vals)) if k_on else len(vals)
        probs = np.exp(vals[:limit])
        before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
        keep = int(np.count_nonzero(before <= top_p)) if top_p < 1.0 else limit
        complete = (
            (k_on and len(vals) >= top_k)
            or keep < limit
            or (vocab_size is not None and len(vals) >= vocab_size)
        )
        if not complete or keep == 0:
            raise ProtocolError(
                f"output token {t}: the {len(vals)} top log-probs do not cover the kept set "
                f"(top_k={top_k}, top_p={top_p}); raise nucleus_top_logprobs"
            )
        kept = vals[:keep]
        if tok not in ids[:keep]:
            raise ProtocolError(
                f"output token {t} (id {tok}) is outside the {keep} tokens top_k={top_k}, "
                f"top_p={top_p} keep; the server did not sample with these parameters"
            )
        m = float(kept.max())
        res[t] = lp - (m + math.log(float(np.exp(kept - m).sum())))
    return res.astype(np.float32)


def version_number(version: str, known: Mapping[str, int], base: int = 0) -> int:
    """The yeto policy version of a weight-version label the server reports."""
    if version in known:
        return int(known[version])
    if version == DEFAULT_WEIGHT_VERSION:
        return base
    head = version.split("-", 1)[0]
    if head.isdigit():
        return int(head)
    raise ProtocolError(
        f"the server reports weight_version {version!r}, which no release loaded by this "
        "engine carries; another client changed the server's weights?"
    )


def sequence_lengths_ok(items: Sequence[Any], expected: int) -> None:
    if len(items) != expected:
        raise ProtocolError(f"/generate answered {len(items)} sequences for {expected} inputs")
