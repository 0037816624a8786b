"""Bitwise cuts: stop at a SCHEDULED cut, resume in a new process, end equal to never stopping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from yeto_core.errors import CutError
from yeto_core.records import Trigger
from yeto_torch.backend import TorchBackend
from yeto_torch.testing import fixed_batches

N, STOP = 6, 3
WORKER = Path(__file__).with_name("cut_worker.py")


@pytest.mark.slow
@pytest.mark.parametrize("tuning", ["full", "lora"])
def test_scheduled_cut_resumed_in_new_process_is_bitwise_equal(sort_base, tmp_path, tuning):
    batches = fixed_batches(sort_base, N)
    opts = dict(tuning=tuning, lr=5e-3, seed=3, kl_coef=0.05)
    straight = TorchBackend(str(sort_base), **opts)
    straight.restore(None)
    for b in batches:
        straight.train_round(b)
    want = straight.state_tensors()
    want_rng = torch.get_rng_state().tolist()[:64]

    first = TorchBackend(str(sort_base), **opts)
    first.restore(None)
    for b in batches[:STOP]:
        first.train_round(b)
    cut = tmp_path / "cut"
    first.save_cut(cut, Trigger.SCHEDULED)
    assert json.loads((cut / "trainer_state.json").read_text())["trigger"] == "SCHEDULED"
    del first

    out = tmp_path / "resumed"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(
        [sys.executable, str(WORKER), str(sort_base), str(cut), str(N), tuning, str(out)],
        check=True,
        env=env,
        timeout=300,
    )
    got = load_file(str(out / "state.safetensors"))
    assert sorted(got) == sorted(want)
    assert len(want) > 10
    unequal = [k for k in want if not torch.equal(got[k], want[k])]
    assert not unequal, f"not bitwise equal after resume: {unequal[:5]}"
    res = json.loads((out / "trained.json").read_text())
    # trained no batch twice and skipped none: the first process took 0..STOP-1
    assert res["trained"] == list(range(STOP, N))
    assert res["counters"]["rounds"] == N == straight.counters["rounds"]
    assert res["counters"]["last_position"] == straight.counters["last_position"]
    assert res["counters"] == straight.counters
    assert res["rng"] == want_rng


def test_cut_refuses_another_tuning_and_a_different_base(sort_base, tmp_path):
    be = TorchBackend(str(sort_base), tuning="lora")
    be.restore(None)
    be.save_cut(tmp_path / "c", Trigger.MANUAL)
    other = TorchBackend(str(sort_base), tuning="full")
    with pytest.raises(CutError, match="tuning"):
        other.restore(tmp_path / "c")
    state = json.loads((tmp_path / "c" / "trainer_state.json").read_text())
    state["base_checksum"] = "sha256:00"
    (tmp_path / "c" / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(CutError, match="base"):
        TorchBackend(str(sort_base), tuning="lora").restore(tmp_path / "c")


def test_all_equal_groups_skip_backward_and_padding_carries_no_gradient(sort_base):
    import attrs

    batch = fixed_batches(sort_base, 1)[0]
    flat = tuple(
        attrs.evolve(g, samples=tuple(attrs.evolve(s, reward=1.0) for s in g.samples))
        for g in batch.groups
    )
    be = TorchBackend(str(sort_base))
    be.restore(None)
    before = {k: v.clone() for k, v in be.state_tensors().items()}
    m = be.train_round(attrs.evolve(batch, groups=flat))
    assert m["groups_skipped_equal"] == len(flat) and m["stepped"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in be.state_tensors().items())
    pad = tuple(
        attrs.evolve(s, loss_mask=s.loss_mask * 0, reward=float(i % 2))
        for i, s in enumerate(batch.groups[0].samples)
    )
    m = be.train_round(attrs.evolve(batch, groups=flat, padding=pad))
    assert m["stepped"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in be.state_tensors().items())
