"""DriverLifecycle on the REAL FileSampleBuffer (dir store) through the BatchReader and ledger.

A stream with every kind of bad group (stale, too small, unconvertible, non-finite
reward) is trained by one never-stopped incarnation and, on another
store, by incarnations that stop (cut) three times and crash once. The final fake
state is bitwise equal, no position is trained twice, every appended position is
trained or skipped with a reason (by the ledger and by the ``trainer_round``
events), the ledger check passes and the ledger replays bitwise.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import attrs
import numpy as np

from yeto_core.buffer.ledger import BatchLedger
from yeto_core.buffer.ledger_replay import replay
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import LifecycleState, StopReason
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, make_group
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle

S = LifecycleState
G = 4
VOCAB = 100
#: position -> the reason the reader must skip it (the rest are trainable)
BAD = {
    5: "too_small",
    9: "unconvertible",
    14: "nonfinite_reward",
    26: "stale",
    31: "stale",
    38: "unconvertible",
}
N = 48


def _group(i: int):
    g = make_group(i, max(0, i // 3 - 1), g=G, seed=3)
    reason = BAD.get(i)
    if reason == "too_small":
        g = attrs.evolve(g, samples=g.samples[:2])
    elif reason == "unconvertible":  # a token id outside the vocabulary
        bad = attrs.evolve(g.samples[0], tokens=np.array([1, VOCAB + 7, 3], dtype=np.int32))
        g = attrs.evolve(g, samples=(bad, *g.samples[1:]))
    elif reason == "nonfinite_reward":
        g = attrs.evolve(
            g, samples=(attrs.evolve(g.samples[0], reward=float("nan")), *g.samples[1:])
        )
    elif reason == "stale":  # written by a sampler still on policy 0
        g = make_group(i, 0, g=G, seed=3)
    return g


def _fill(buf: FileSampleBuffer) -> None:
    for i in range(N):
        buf.append(_group(i))
    buf.mark_data_end()


def _lifecycle(root: Path, events: list) -> tuple[DirStore, FileSampleBuffer, DriverLifecycle]:
    store = DirStore(root, fsync=False)
    buf = FileSampleBuffer(store, host="trainer", clock=lambda: 0.0)
    lc = DriverLifecycle(
        lambda inc: FakeBackend(seed=11),
        buf,
        CutStore(store, keep=10),
        ReleaseStore(store),
        groups_per_round=3,
        max_policy_age=2,
        emit=events.append,
        workdir=root.parent / f"{root.name}-work",
        partial_last_round=True,
        group_size=G,
        vocab_size=VOCAB,
    )
    return store, buf, lc


def _reference(tmp_path: Path) -> FakeBackend:
    events: list = []
    _, buf, ref = _lifecycle(tmp_path / "ref", events)
    _fill(buf)
    ref.start(0)
    ref.train(1000)
    ref.drain(StopReason.FINISHED)
    return ref.backend


def test_three_stops_and_a_crash_on_the_file_buffer_equal_a_never_stopped_run(tmp_path):
    ref = _reference(tmp_path)
    events: list = []
    root = tmp_path / "cyc"
    store, buf, lc = _lifecycle(root, events)
    _fill(buf)
    cuts = []
    for inc, rounds in enumerate([2, 3, 2]):
        lc.start(inc)
        assert lc.train(rounds) == rounds
        cuts.append(lc.drain(StopReason.STOPPED))
        lc.release()
    # incarnation 3 trains three rounds past the last cut and dies (no drain)
    lc.start(3)
    assert lc.train(3) == 3
    dead_rounds = [e.data["trained_rounds"] for e in events if e.kind == "trainer_round"][-3:]
    # a second head builds a new lifecycle: restores the last cut, sets the dead rounds aside
    events_after_crash: list = []
    _, buf2, lc2 = _lifecycle(root, events_after_crash)
    lc2.start(4)
    assert lc2.restored_cut.cut_id == cuts[-1].cut_id
    assert len(lc2.ledger_set_aside) == 3 and all("/aside/" in k for k in lc2.ledger_set_aside)
    assert buf2.watermark == cuts[-1].buffer_watermark
    lc2.train(1000)
    final = lc2.drain(StopReason.FINISHED)
    assert lc2.state() == S.LEFT

    # bitwise equal to the run that never stopped, same groups in the same order
    assert lc2.backend.params.tobytes() == ref.params.tobytes()
    assert lc2.backend.trained_groups == ref.trained_groups
    assert len(set(lc2.backend.trained_groups)) == len(lc2.backend.trained_groups)

    # the ledger: nothing twice, nothing past the watermark without a reason
    ledger = BatchLedger(store)
    summary = ledger.check(watermark=buf2.watermark)
    assert summary["watermark"] == N == final.buffer_watermark
    rounds = ledger.rounds()
    trained = [p for r in rounds for p in r.positions]
    skipped = {p: reason for r in rounds for reason, ps in r.skipped.items() for p in ps}
    assert len(trained) == len(set(trained))
    assert sorted(trained + list(skipped)) == list(range(N))
    assert skipped == BAD
    assert [r.incarnation for r in rounds][-1] == 4
    assert {r.seq for r in rounds} == set(range(1, final.trained_rounds + 1))
    assert dead_rounds[0] == cuts[-1].trained_rounds + 1

    # the skip events (what the run summary sums) agree with the ledger, by reason
    live = [e for e in events if e.kind == "trainer_round"]
    live = [e for e in live if e.data["trained_rounds"] <= cuts[-1].trained_rounds]
    live += [e for e in events_after_crash if e.kind == "trainer_round"]
    by_reason: Counter = Counter()
    for e in live:
        by_reason.update(e.data["skipped_counts"])
        for reason, ps in e.data["skipped"].items():
            assert all(BAD[p] == reason for p in ps)
    assert by_reason == Counter(BAD.values())
    assert final.counters["skipped_groups"] == len(BAD)
    assert final.counters["skipped_stale"] == 2 and final.counters["skipped_too_small"] == 1

    # a replay of the ledger from the base is bitwise the final cut
    result = replay(
        ledger=ledger,
        buffer=buf2,
        make_backend=lambda: FakeBackend(seed=11),
        cut_store=CutStore(store),
        work_dir=tmp_path / "replay",
    )
    assert result.equal and result.rounds == final.trained_rounds


def test_a_start_from_the_base_sets_aside_an_old_ledger_and_its_own_uncut_rounds(tmp_path):
    events: list = []
    root = tmp_path / "old"
    store, buf, lc = _lifecycle(root, events)
    _fill(buf)
    lc.start(0)
    lc.train(2)
    lc.drain(StopReason.STOPPED)
    lc.release()
    for key in list(store.list("cuts/")):
        store.delete(key)
    # a new lifecycle told to set aside what was recorded before now: the base start works
    lc2 = DriverLifecycle(
        lambda inc: FakeBackend(seed=11),
        buf,
        CutStore(store),
        groups_per_round=3,
        max_policy_age=2,
        group_size=G,
        workdir=tmp_path / "w2",
        ledger_set_aside_before=time.time() + 3600,
    )
    lc2.start(1)
    assert lc2.restored_cut is None and buf.watermark == 0
    assert len(lc2.ledger_set_aside) == 2
    assert all(k.startswith("ledger.before-") for k in lc2.ledger_set_aside)
    assert BatchLedger(store).rounds() == []
    # and a set_aside_before older than the rounds refuses the start
    lc2.train(1)
    lc2.drain(StopReason.STOPPED)
    lc2.release()
    for key in list(store.list("cuts/")):
        store.delete(key)
    lc3 = DriverLifecycle(
        lambda inc: FakeBackend(seed=11),
        buf,
        CutStore(store),
        groups_per_round=3,
        max_policy_age=2,
        group_size=G,
        workdir=tmp_path / "w3",
        ledger_set_aside_before=1.0,
    )
    # rounds recorded after the head started (set_aside_before) with no cut were trained by
    # an incarnation of this run that died before its first cut: set aside to round 0, so
    # the start works (it used to refuse every later start until the head gave up)
    lc3.start(2)
    assert lc3.restored_cut is None and buf.watermark == 0
    assert len(lc3.ledger_set_aside) == 1
    assert all(k.startswith("ledger/aside/base-i2-") for k in lc3.ledger_set_aside)
    assert BatchLedger(store).rounds() == []
