"""Builders of :class:`~yeto_core.records.Sample` and :class:`~yeto_core.records.SampleGroup`
for tests and plugin authors: one place instead of a factory in every test file.

Every argument has a small default, so ``build_group("g0")`` is a valid two-sample
group; tests name only what they check::

    from yeto_core.testing.groups import build_group, build_sample

    g = build_group("g1", n=4, rewards=[0, 1, 0, 1], version=3, host="node-a")
    s = build_sample(n_prompt=2, n_resp=5, reward=1.0, routed=experts)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import numpy as np

from yeto_core.records import Sample, SampleGroup


def build_sample(
    n_prompt: int = 2,
    n_resp: int = 3,
    *,
    tokens: Optional[np.ndarray] = None,
    token: int = 5,
    reward: float = 0.5,
    version: int = 0,
    logprobs: Optional[np.ndarray] = None,
    routed: Optional[np.ndarray] = None,
    **fields: Any,
) -> Sample:
    """A sample of ``n_prompt`` prompt tokens and ``n_resp`` response tokens.

    ``tokens`` overrides the token ids (its length then sets ``n_resp``); otherwise
    every id is ``token``. Log-probabilities default to -0.5 per response token and
    the loss mask to all ones. ``fields`` go to :class:`Sample` unchanged.
    """
    if tokens is None:
        tokens = np.full(n_prompt + n_resp, token, dtype=np.int32)
    else:
        tokens = np.asarray(tokens, dtype=np.int32)
        n_resp = len(tokens) - n_prompt
    if logprobs is None:
        logprobs = np.full(n_resp, -0.5, dtype=np.float32)
    return Sample(
        tokens=tokens,
        prompt_len=n_prompt,
        logprobs=np.asarray(logprobs, dtype=np.float32),
        loss_mask=np.ones(n_resp, dtype=np.uint8),
        reward=float(reward),
        weight_version=version,
        routed_experts=routed,
        **fields,
    )


SampleSpec = Union[Callable[[int], Sample], None]


def build_group(
    gid: str,
    *,
    n: int = 2,
    version: Union[int, Sequence[int]] = 0,
    rewards: Optional[Sequence[float]] = None,
    host: str = "h",
    incarnation: int = 0,
    prompt_id: Optional[str] = None,
    task: Optional[str] = None,
    sample: SampleSpec = None,
    **sample_kw: Any,
) -> SampleGroup:
    """A group ``gid`` of ``n`` samples from ``host``/``incarnation``.

    ``version`` is one policy version for all samples or one per sample;
    ``rewards`` one reward per sample (default ``0.1 * j``). ``sample(j)`` builds
    sample ``j`` itself when given; otherwise :func:`build_sample` is called with
    ``sample_kw``.
    """
    versions = [version] * n if isinstance(version, int) else list(version)
    if sample is not None:
        samples = tuple(sample(j) for j in range(n))
    else:
        samples = tuple(
            build_sample(
                reward=(rewards[j] if rewards is not None else 0.1 * j),
                version=versions[j],
                **sample_kw,
            )
            for j in range(n)
        )
    kw: dict[str, Any] = {} if task is None else {"task": task}
    return SampleGroup(gid, prompt_id or f"p-{gid}", host, incarnation, samples, **kw)
