"""The policy fingerprint: proof that an engine serves the policy a release holds.

A release's files can arrive intact (their digests match) and still be served
as another model: a ``config.json`` that lost ``rope_theta`` loads without an
error, a converter can flip a weight. The fingerprint checks what is served:

1. At publish time the trainer scores a small fixed **probe set**
   (:func:`probe_set`: ``n`` token sequences drawn from the vocabulary with a
   fixed seed) under the release's weights: for every probe, the log-prob of
   each token given the tokens before it, at temperature 1
   (:func:`record`). The result goes into the release's ``info`` under
   :data:`INFO_KEY` (``probes``, ``logprobs``, ``dtype``).
2. After every load the policy follower asks the engine for the same log-probs
   (:meth:`SamplerEngine.prompt_logprobs <yeto_core.ports.SamplerEngine.prompt_logprobs>`)
   and compares them (:func:`compare`): the largest absolute deviation must
   stay within the tolerance of the release's dtype (:data:`TOLERANCE`). A
   larger one refuses the release (``release_refused``, reason
   ``fingerprint_mismatch``, with the measured deviation) and the previous
   release is put back.

An engine that cannot score prompts returns None from ``prompt_logprobs``
(the port's default); the follower then loads the release unverified and says
so in its event (``fingerprint: "unsupported"``).

Both sides only need one function ``prompt_logprobs(probes) -> list[list[float]]``;
this module is pure Python (no numpy needed).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import attrs

#: The key of the fingerprint in a release's ``info``.
INFO_KEY = "fingerprint"
#: Largest absolute log-prob deviation accepted per dtype of the served weights.
#: float32 engines agree with transformers to ~1e-6 on the tiny models; a dropped
#: ``rope_theta`` or one flipped weight moves them by 1e-2 or more.
TOLERANCE: dict[str, float] = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 6e-2}
#: Probe set size: sequences and tokens per sequence.
PROBES = 4
PROBE_LEN = 16
PROBE_SEED = 20260101


@attrs.frozen
class Fingerprint:
    """Probes and their log-probs under one policy (``logprobs[i][t]`` scores ``probes[i][t+1]``)."""

    probes: tuple[tuple[int, ...], ...]
    logprobs: tuple[tuple[float, ...], ...]
    dtype: str = "float32"

    def to_json(self) -> dict[str, Any]:
        return {
            "probes": [list(p) for p in self.probes],
            "logprobs": [list(x) for x in self.logprobs],
            "dtype": self.dtype,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fingerprint:
        try:
            probes = tuple(tuple(int(t) for t in p) for p in data["probes"])
            lps = tuple(tuple(float(x) for x in row) for row in data["logprobs"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"release fingerprint is malformed ({exc!r}); it needs probes, logprobs, dtype"
            ) from None
        return cls(probes=probes, logprobs=lps, dtype=str(data.get("dtype", "float32")))


@attrs.frozen
class Check:
    """The outcome of comparing an engine's log-probs with a fingerprint."""

    ok: bool
    max_abs_dev: float
    tolerance: float
    probe: int = -1  # where the largest deviation is (probe index, token index)
    position: int = -1
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "max_abs_dev": self.max_abs_dev,
            "tolerance": self.tolerance,
            "probe": self.probe,
            "position": self.position,
            "detail": self.detail,
        }


def probe_set(
    vocab_size: int, *, n: int = PROBES, length: int = PROBE_LEN, seed: int = PROBE_SEED
) -> list[list[int]]:
    """``n`` fixed token sequences of ``length`` ids below ``vocab_size`` (pure)."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size={vocab_size}: a probe needs at least 2 token ids")
    if length < 2:
        raise ValueError(f"length={length}: a probe needs at least 2 tokens to score one")
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(n)]


def tolerance_for(dtype: str, overrides: Optional[Mapping[str, float]] = None) -> float:
    """The tolerance of ``dtype`` (``overrides`` first, then :data:`TOLERANCE`)."""
    table = {**TOLERANCE, **dict(overrides or {})}
    name = str(dtype).replace("torch.", "")
    if name not in table:
        raise ValueError(
            f"no fingerprint tolerance for dtype {dtype!r}; known: {sorted(table)} "
            "(set fingerprint_tolerance for it)"
        )
    return float(table[name])


def record(
    score: Callable[[list[list[int]]], Sequence[Sequence[float]]],
    probes: Sequence[Sequence[int]],
    dtype: str = "float32",
) -> Fingerprint:
    """Score ``probes`` with ``score`` (a ``prompt_logprobs`` function) into a fingerprint."""
    plist = [list(map(int, p)) for p in probes]
    out = score(plist)
    _check_shape(plist, out, "the trainer's prompt_logprobs")
    return Fingerprint(
        probes=tuple(tuple(p) for p in plist),
        logprobs=tuple(tuple(float(x) for x in row) for row in out),
        dtype=str(dtype).replace("torch.", ""),
    )


def _check_shape(probes: Sequence[Sequence[int]], out: Any, who: str) -> None:
    if out is None or len(out) != len(probes):
        n = None if out is None else len(out)
        raise ValueError(f"{who} returned {n} rows for {len(probes)} probes")
    for i, (p, row) in enumerate(zip(probes, out, strict=True)):
        if len(row) != len(p) - 1:
            raise ValueError(
                f"{who}: probe {i} has {len(p)} tokens, so {len(p) - 1} log-probs, got {len(row)}"
            )


def compare(
    expected: Fingerprint,
    measured: Sequence[Sequence[float]],
    *,
    overrides: Optional[Mapping[str, float]] = None,
) -> Check:
    """Compare an engine's log-probs of ``expected.probes`` with ``expected.logprobs``."""
    tol = tolerance_for(expected.dtype, overrides)
    try:
        _check_shape(expected.probes, measured, "the engine's prompt_logprobs")
    except ValueError as exc:
        return Check(ok=False, max_abs_dev=math.inf, tolerance=tol, detail=str(exc))
    worst, where = 0.0, (-1, -1)
    for i, (want, got) in enumerate(zip(expected.logprobs, measured, strict=True)):
        for t, (a, b) in enumerate(zip(want, got, strict=True)):
            d = abs(float(a) - float(b))
            if not math.isfinite(d):
                d = math.inf
            if d > worst:
                worst, where = d, (i, t)
    ok = worst <= tol
    detail = (
        f"max |engine - trainer| log-prob deviation {worst:.3g} at probe {where[0]} token "
        f"{where[1] + 1} ({'within' if ok else 'over'} the {expected.dtype} tolerance {tol:g})"
    )
    return Check(
        ok=ok, max_abs_dev=worst, tolerance=tol, probe=where[0], position=where[1], detail=detail
    )


def for_backend(backend: Any) -> Optional[Fingerprint]:
    """The fingerprint of what ``backend`` would publish now, or None when it cannot score.

    Needs ``backend.vocab_size`` and ``backend.prompt_logprobs`` (see
    :class:`~yeto_core.ports.TrainerBackend`); ``backend.weights_dtype`` picks the tolerance.
    """
    vocab = backend.vocab_size
    if not vocab:
        return None
    probes = probe_set(int(vocab))
    out = backend.prompt_logprobs(probes)
    if out is None:
        return None
    return record(lambda _p: out, probes, str(backend.weights_dtype))
