"""Hypothesis fuzz of the Miles reader round: buffer -> reader -> bridge -> Miles samples.

Random streams of groups (whole, oversized, too small, NaN reward, a token
outside the vocabulary, an out-of-range routed expert, stale) go through the
real FileSampleBuffer, BatchReader and bridge into yeto's rollout function.
Every round must be ``groups_per_round`` Miles groups of exactly G samples,
real groups equal to their payloads in position order, padding groups
loss-free and marked; over the stream every position is trained once or
skipped with its kind's reason. ``YETO_FUZZ_EXAMPLES`` sets the runs (default 60).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import attrs
import fake_miles
import numpy as np
from conftest import EXPERTS, LAYERS, TOP_K, VOCAB, group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yeto_core.buffer.batch_reader import BatchReader, EndOfData
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.stores.dir_store import DirStore
from yeto_miles import rollout
from yeto_miles.rollout import Bridge, is_padding

G = 2
KINDS = {
    "whole": None,
    "oversized": None,
    "small": "too_small",
    "nan": "nonfinite_reward",
    "token": "unconvertible",
    "expert": "unconvertible",
    "stale": "stale",
}
EXAMPLES = int(os.environ.get("YETO_FUZZ_EXAMPLES", "60"))


def _make(i: int, kind: str):
    g = group(i, g=G + 1 if kind == "oversized" else G, version=0 if kind == "stale" else 3,
              routed=True)  # fmt: skip
    s = g.samples
    if kind == "small":
        g = attrs.evolve(g, samples=s[:1])
    elif kind == "nan":
        g = attrs.evolve(g, samples=(attrs.evolve(s[0], reward=float("inf")), *s[1:]))
    elif kind == "token":
        tokens = np.array(s[1].tokens, copy=True)
        tokens[0] = VOCAB + 3
        g = attrs.evolve(g, samples=(s[0], attrs.evolve(s[1], tokens=tokens)))
    elif kind == "expert":
        re = np.array(s[0].routed_experts, copy=True)
        re[-1, -1, -1] = EXPERTS
        g = attrs.evolve(g, samples=(attrs.evolve(s[0], routed_experts=re), *s[1:]))
    return g


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=14),
    gpr=st.integers(1, 4),
)
def test_miles_reader_rounds(kinds, gpr):
    mods = fake_miles.install()
    Sample = mods["miles.utils.types"].Sample
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = DirStore(tmp, fsync=False)
            sampler = FileSampleBuffer(store, host="sampler-0")
            groups = {sampler.append(_make(i, k)): (k, _make(i, k)) for i, k in enumerate(kinds)}
            buf = FileSampleBuffer(store, host="trainer")
            buf.mark_data_end()
            reader = BatchReader(buf, group_size=G, groups_per_round=gpr, max_policy_age=1,
                                 vocab_size=VOCAB, expected_layers=LAYERS, top_k=TOP_K,
                                 num_experts=EXPERTS, poll_s=0.01, wait_s=5.0,
                                 max_unconvertible_takes=100)  # fmt: skip
            bridge = Bridge(store, "trainer/0/miles")
            args = argparse.Namespace(yeto_bridge_url=tmp, yeto_bridge_prefix="trainer/0/miles",
                                      yeto_wait_s=5.0, yeto_poll_s=0.01, yeto_parent="",
                                      rollout_batch_size=gpr, n_samples_per_prompt=G)  # fmt: skip
            rollout._bridge.cache_clear()
            fate: dict[int, str] = {}
            r = 0
            while True:
                try:
                    batch = reader.take(3, short_ok=True)
                except EndOfData:
                    tail = reader.flush_skips(3)
                    if tail is not None:
                        reader.commit(tail)
                        fate.update({p: why for why, ps in tail.skipped.items() for p in ps})
                    break
                bridge.put_batch(r, batch)
                out = rollout.generate_rollout(args, r, None)
                assert [len(g) for g in out] == [G] * gpr
                for mg, pos in zip(out, batch.positions, strict=False):
                    want = groups[pos][1].samples[:G]
                    for m, y in zip(mg, want, strict=True):
                        assert isinstance(m, Sample) and not is_padding(m)
                        assert m.tokens == [int(t) for t in y.tokens] and m.reward == y.reward
                        assert m.loss_mask == [int(x) for x in y.loss_mask]
                        assert m.metadata["yeto_position"] == pos
                        np.testing.assert_array_equal(m.rollout_routed_experts, y.routed_experts)
                pads = out[len(batch.positions) :]
                assert sum(len(g) for g in pads) == len(batch.padding)
                for m in (s for g in pads for s in g):
                    assert is_padding(m) and not any(m.loss_mask) and m.reward == 0.0
                reader.commit(batch)
                for p in batch.positions:
                    assert p not in fate
                    fate[p] = "trained"
                for why, ps in batch.skipped.items():
                    fate.update({p: why for p in ps})
                r += 1
            assert set(fate) == set(groups)
            for pos, (kind, _) in groups.items():
                assert fate[pos] == (KINDS[kind] or "trained"), (pos, kind, fate[pos])
    finally:
        fake_miles.uninstall()
