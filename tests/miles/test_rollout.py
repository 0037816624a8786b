"""Buffer -> batch reader -> bridge -> yeto's rollout function -> Miles samples.

Real parts: FileSampleBuffer on a dir store, the BatchReader, the bridge, the
rollout function in both Miles forms and the log function. Miles' ``Sample``
and rollout records come from the recorded description (tests/miles/fake_miles.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import attrs
import numpy as np
import pytest
from conftest import EXPERTS, LAYERS, TOP_K, VOCAB, group

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import SampleStatus
from yeto_core.stores.dir_store import DirStore
from yeto_miles import rollout
from yeto_miles.rollout import PAD_KEY, Bridge, BridgeError, is_padding, padding_metrics

G, N = 2, 3
PREFIX = "trainer/0/miles"


def _args(root, **kw):
    return argparse.Namespace(
        yeto_bridge_url=str(root),
        yeto_bridge_prefix=PREFIX,
        yeto_wait_s=5.0,
        yeto_poll_s=0.01,
        yeto_parent="",
        rollout_batch_size=N,
        n_samples_per_prompt=G,
        custom_rollout_log_function_path="yeto_miles.rollout.log_rollout_data",
        **kw,
    )


@pytest.fixture
def setup(tmp_path):
    root = tmp_path / "store"
    store = DirStore(root, fsync=False)
    sampler = FileSampleBuffer(store, host="sampler-0")
    trainer_buf = FileSampleBuffer(store, host="trainer")
    reader = BatchReader(
        trainer_buf,
        group_size=G,
        groups_per_round=N,
        max_policy_age=1,
        vocab_size=VOCAB,
        expected_layers=LAYERS,
        top_k=TOP_K,
        num_experts=EXPERTS,
        poll_s=0.01,
        wait_s=5.0,
    )
    return root, store, sampler, trainer_buf, reader


def _bad_experts(g):
    s = g.samples[1]
    re = np.array(s.routed_experts, copy=True)
    re[0, 0, 0] = EXPERTS + 5  # an expert id outside the model's experts: a malformed row
    return attrs.evolve(g, samples=(g.samples[0], attrs.evolve(s, routed_experts=re)))


def test_rounds_become_miles_groups(setup, miles_modules):
    root, store, sampler, trainer_buf, reader = setup
    Sample = miles_modules[0]["miles.utils.types"].Sample
    args = _args(root)
    bridge = Bridge(store, PREFIX)
    made = {}
    # positions: 0 good, 1 NaN reward, 2 too small, 3 malformed expert row
    first = [
        group(0, version=1, routed=True, status=SampleStatus.TRUNCATED),
        attrs.evolve(
            group(1, version=1, routed=True),
            samples=(
                attrs.evolve(group(1, version=1, routed=True).samples[0], reward=float("nan")),
                group(1, version=1, routed=True).samples[1],
            ),
        ),
        attrs.evolve(
            group(2, version=1, routed=True), samples=group(2, version=1, routed=True).samples[:1]
        ),
        _bad_experts(group(3, version=1, routed=True)),
    ]
    for g in first:
        made[sampler.append(g)] = g
    assert reader.try_take(2) is None  # one usable group so far: carried, not lost
    for i in range(4, 8):  # 4, 5, 6 good; 7 stale (policy 0, trainer at 2, max age 1)
        g = group(i, version=0 if i == 7 else 2, routed=True)
        made[sampler.append(g)] = g
    b1 = reader.take(2)
    assert b1.positions == (0, 4, 5) and not b1.padding
    assert b1.skipped == {"nonfinite_reward": (1,), "too_small": (2,), "unconvertible": (3,)}
    bridge.put_batch(0, b1)
    groups = rollout.generate_rollout(args, 0, None)
    assert [len(g) for g in groups] == [G] * N
    for miles_group, pos in zip(groups, (0, 4, 5), strict=True):
        for j, (m, y) in enumerate(zip(miles_group, made[pos].samples, strict=True)):
            assert isinstance(m, Sample)
            assert m.tokens == [int(t) for t in y.tokens]
            assert m.response_length == y.response_len == len(m.loss_mask)
            assert m.loss_mask == [1] * y.response_len
            np.testing.assert_allclose(m.rollout_log_probs, y.logprobs, rtol=1e-6)
            assert m.reward == y.reward and m.weight_versions == [str(y.weight_version)]
            assert m.status == Sample.Status(y.status.value)
            assert m.rollout_routed_experts.dtype == np.int32
            assert m.rollout_routed_experts.shape == (len(y.tokens) - 1, LAYERS, TOP_K)
            np.testing.assert_array_equal(m.rollout_routed_experts, y.routed_experts)
            assert m.metadata == {"yeto_position": pos, "yeto_group_id": made[pos].group_id,
                                  "yeto_sample": j}  # fmt: skip
    assert groups[0][0].status == Sample.Status.TRUNCATED
    assert len({m.index for g in groups for m in g}) == N * G
    reader.commit(b1)  # after Miles trained it (the backend waits for the post-save hook)

    trainer_buf.mark_data_end()
    b2 = reader.take(2, short_ok=True)
    assert b2.positions == (6,) and len(b2.padding) == 2 * G and b2.skipped == {"stale": (7,)}
    bridge.put_batch(1, b2)
    groups = rollout.generate_rollout(args, 1, None)
    assert [len(g) for g in groups] == [G] * N
    real, pads = groups[0], [s for g in groups[1:] for s in g]
    assert not any(is_padding(s) for s in real)
    tmpl = made[6].samples[b2.padding_from[1]]
    for p in pads:
        assert p.metadata == {PAD_KEY: True} and p.remove_sample and p.reward == 0.0
        assert p.loss_mask == [0] * p.response_length and p.tokens == [int(t) for t in tmpl.tokens]
    assert padding_metrics(groups) == {
        "rollout/padded_samples": 4.0,
        "rollout/padded_fraction": 4 / 6,
    }


def test_class_form_and_guards(setup, miles_modules):
    root, store, sampler, trainer_buf, reader = setup
    base = miles_modules[0]["miles.rollout.base_types"]
    for i in range(N):
        sampler.append(group(i, routed=True))
    batch = reader.take(0)
    Bridge(store, PREFIX).put_batch(5, batch)
    fn = rollout.YetoRolloutFn(base.RolloutFnConstructorInput(args=_args(root), data_source=None))
    out = asyncio.run(fn(base.RolloutFnTrainInput(rollout_id=5, weight_version=None)))
    assert isinstance(out, base.RolloutFnTrainOutput)
    assert [len(g) for g in out.samples] == [G] * N
    assert out.metrics == {"rollout/padded_samples": 0.0, "rollout/padded_fraction": 0.0}
    with pytest.raises(BridgeError, match="training rounds only"):
        rollout.generate_rollout(_args(root), 5, None, evaluation=True)
    with pytest.raises(BridgeError, match="--rollout-batch-size 4"):
        wrong = _args(root)
        wrong.rollout_batch_size = 4
        rollout.generate_rollout(wrong, 5, None)
    with pytest.raises(BridgeError, match="did not come within"):
        quick = _args(root)
        quick.yeto_wait_s = 0.05
        rollout.generate_rollout(quick, 6, None)
    Bridge(store, PREFIX).close()
    with pytest.raises(BridgeError, match="closed the bridge"):
        rollout.generate_rollout(_args(root), 7, None)
    with pytest.raises(BridgeError, match="not started by yeto"):
        rollout.generate_rollout(argparse.Namespace(), 0, None)


def test_log_function_counts_real_samples_only(setup, miles_modules):
    root, store, sampler, trainer_buf, reader = setup
    _mods, log = miles_modules
    sampler.append(group(0, routed=True))
    trainer_buf.mark_data_end()
    batch = reader.take(0, short_ok=True)
    Bridge(store, PREFIX).put_batch(0, batch)
    args = _args(root)
    groups = rollout.generate_rollout(args, 0, None)
    flat = [s for g in groups for s in g]
    assert rollout.log_rollout_data(0, args, flat, {"rollout/extra": 1.0}, 0.25) is True
    line = json.loads(log.read_text())
    assert line["n"] == G and line["padding"] == 0  # Miles' logging saw the real samples only
    assert line["custom_path"] is None  # the default logging ran, not this function again
    assert line["extra"] == {
        "rollout/extra": 1.0,
        "rollout/padded_samples": float(2 * G),
        "rollout/padded_fraction": 2 / 3,
    }
    assert args.custom_rollout_log_function_path == "yeto_miles.rollout.log_rollout_data"
