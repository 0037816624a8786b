"""Hypothesis strategies for the records the ports exchange (test code only: imports hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from yeto_core.records import (
    Backlog,
    IslandLaunch,
    LifecycleState,
    RoundSpec,
    Sample,
    SampleGroup,
    SampleStatus,
    SamplingParams,
    SchedulerInputs,
)

names = st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True)
versions = st.integers(min_value=0, max_value=50)


@st.composite
def samples(draw, *, version: int | None = None, vocab: int = 64) -> Sample:
    """One sample: a prompt of 1..6 tokens and a response of 1..6 tokens."""
    prompt_len = draw(st.integers(1, 6))
    response_len = draw(st.integers(1, 6))
    tokens = draw(
        st.lists(
            st.integers(0, vocab - 1),
            min_size=prompt_len + response_len,
            max_size=prompt_len + response_len,
        )
    )
    logprobs = draw(
        st.lists(st.floats(-20.0, 0.0, width=32), min_size=response_len, max_size=response_len)
    )
    return Sample(
        tokens=np.asarray(tokens, dtype=np.int64),
        prompt_len=prompt_len,
        logprobs=np.asarray(logprobs, dtype=np.float32),
        loss_mask=np.ones(response_len, dtype=np.float32),
        reward=draw(st.floats(0.0, 1.0)),
        weight_version=draw(versions) if version is None else version,
        status=draw(st.sampled_from([SampleStatus.COMPLETED, SampleStatus.TRUNCATED])),
    )


@st.composite
def sample_groups(
    draw, *, group_size: int | None = None, group_id: str | None = None
) -> SampleGroup:
    """A group of G samples (G from 2 to 4 unless given) of one prompt."""
    g = group_size if group_size is not None else draw(st.integers(2, 4))
    version = draw(versions)
    lag = draw(st.lists(st.integers(0, 2), min_size=g, max_size=g))
    members = tuple(draw(samples(version=max(0, version - d))) for d in lag)
    gid = group_id or draw(st.from_regex(r"g[a-z0-9]{1,10}", fullmatch=True))
    return SampleGroup(
        group_id=gid,
        prompt_id=f"p-{gid}",
        sampler_host=draw(names),
        sampler_incarnation=draw(st.integers(0, 3)),
        samples=members,
    )


def group_batches(min_size: int = 0, max_size: int = 12, group_size: int = 2):
    """Lists of groups with distinct ids (``g0``, ``g1``, ...)."""
    return st.integers(min_size, max_size).flatmap(
        lambda n: st.tuples(
            *[sample_groups(group_size=group_size, group_id=f"g{i}") for i in range(n)]
        ).map(list)
    )


round_specs = st.builds(
    RoundSpec,
    max_groups=st.integers(0, 8),
    current_version=st.integers(0, 60),
    max_policy_age=st.integers(0, 10),
)

sampling_params = st.builds(
    SamplingParams,
    max_new_tokens=st.integers(1, 8),
    temperature=st.floats(0.1, 2.0),
    top_p=st.floats(0.1, 1.0),
    top_k=st.integers(0, 10),
    seed=st.one_of(st.none(), st.integers(0, 2**31 - 1)),
)


@st.composite
def scheduler_inputs(draw) -> SchedulerInputs:
    now = draw(st.floats(0.0, 1e5))
    gpr = draw(st.integers(1, 16))
    groups = draw(st.integers(0, 200))
    return SchedulerInputs(
        now=now,
        state=draw(st.sampled_from(list(LifecycleState))),
        backlog_groups=groups,
        backlog_samples=groups * draw(st.integers(2, 8)),
        groups_per_round=gpr,
        a_hard=draw(st.integers(0, 6)),
        start_s=draw(st.floats(0.0, 600.0)),
        idle_since=draw(st.one_of(st.none(), st.floats(0.0, now))),
        data_ended=draw(st.booleans()),
        failures=draw(st.integers(0, 5)),
        max_failures=draw(st.integers(1, 5)),
        has_release=draw(st.booleans()),
        first_policy_incarnation=draw(st.booleans()),
        rounds_this_incarnation=draw(st.integers(0, 10)),
        alpha=draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
        round_s=draw(st.one_of(st.none(), st.floats(0.1, 100.0))),
    )


backlogs = st.builds(
    Backlog,
    groups=st.integers(0, 100),
    samples=st.integers(0, 800),
    watermark=st.integers(0, 1000),
    head_position=st.integers(0, 1100),
    data_ended=st.booleans(),
)

texts = st.text(max_size=40)

island_launches = st.builds(
    IslandLaunch,
    run_id=names,
    store_url=st.just("/tmp/store"),
    role=st.sampled_from(["sampler", "trainer"]),
    island=names,
    incarnation=st.integers(0, 99),
)
