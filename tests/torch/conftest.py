"""Shared fixtures: warm bases made once per session (seeded, a few seconds each)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from yeto_core.records import Batch, Sample, SampleGroup, SamplingParams

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def sort_base(tmp_path_factory):
    from yeto_torch.warmup import make_base

    return make_base(tmp_path_factory.mktemp("bases") / "sort4", "sort4", seed=0)


def rollout_batch(engine, task, start: int, n_prompts: int, g: int, version: int) -> Batch:
    """Real groups from ``engine`` for prompts ``start .. start + n_prompts``."""
    prompts, answers = [], []
    for i in range(start, start + n_prompts):
        text, ans = task.prompt(i)
        prompts.append(engine.encode(text))
        answers.append(ans)
    outs = engine.generate(prompts, g, SamplingParams(max_new_tokens=8, temperature=1.0))
    groups = []
    for k, (p, ans, comps) in enumerate(zip(prompts, answers, outs, strict=True)):
        samples = tuple(
            Sample(
                tokens=np.concatenate([np.asarray(p, dtype=np.int64), c.tokens]),
                prompt_len=len(p),
                logprobs=c.logprobs,
                loss_mask=np.ones(len(c.tokens), np.float32),
                reward=task.reward(ans, engine.decode(c.tokens)),
                weight_version=c.weight_version,
            )
            for c in comps
        )
        groups.append(
            SampleGroup(
                group_id=f"h-i0-p{start + k}",
                prompt_id=str(start + k),
                sampler_host="h",
                sampler_incarnation=0,
                samples=samples,
            )
        )
    return Batch(
        groups=tuple(groups),
        positions=tuple(range(start, start + n_prompts)),
        policy_version=version,
    )
