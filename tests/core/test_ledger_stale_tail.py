"""Regression (found by `yeto bench chaos --kills 50`, seed 0, run-000 and run-007).

When the data ends with only a stale tail left, ``DriverLifecycle`` commits the
tail's skips (the buffer's watermark moves past them, a
``trainer_skips_committed`` event names them) but writes no ledger record, so
the ledger ends before the buffer's watermark and before the final cut's:
``BatchLedger.check(watermark=...)`` fails and ``yeto ledger replay`` refuses
("the ledger holds N rounds up to cut ..., which records N rounds at watermark
...; the ledger was rebased elsewhere or is incomplete").

Fixed: ``BatchReader.flush_skips`` gives the tail as a skip-only batch and
``BatchLedger.record_skips`` records it before the commit (a ``skips_only``
record after the last trained round), so the ledger chains to the buffer's
watermark, ``check`` sees every position and ``replay`` accepts the final cut.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from yeto_core.buffer.ledger import BatchLedger, LedgerError
from yeto_core.buffer.ledger_replay import replay
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import LifecycleState, StopReason
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, make_group
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle

G = 4


def _lifecycle(store, buf, root: Path, events: list) -> DriverLifecycle:
    return DriverLifecycle(
        lambda inc: FakeBackend(seed=11),
        buf,
        CutStore(store, keep=10),
        ReleaseStore(store),
        groups_per_round=3,
        max_policy_age=2,
        emit=events.append,
        workdir=root.parent / "work",
        partial_last_round=True,
        group_size=G,
        vocab_size=100,
    )


def _run(root: Path):
    store = DirStore(root, fsync=False)
    buf = FileSampleBuffer(store, host="trainer", clock=lambda: 0.0)
    events: list = []
    lc = DriverLifecycle(
        lambda inc: FakeBackend(seed=11),
        buf,
        CutStore(store, keep=10),
        ReleaseStore(store),
        groups_per_round=3,
        max_policy_age=2,
        emit=events.append,
        workdir=root.parent / "work",
        partial_last_round=True,
        group_size=G,
        vocab_size=100,
    )
    for i in range(12):  # four rounds of fresh groups
        buf.append(make_group(i, max(0, i // 3 - 1), g=G, seed=3))
    for i in range(12, 14):  # a tail written on policy 0: stale once the trainer is at 4
        buf.append(make_group(i, 0, g=G, seed=3))
    buf.mark_data_end()
    lc.start(0)
    lc.train(100)
    cut = lc.drain(StopReason.FINISHED)
    return store, buf, cut, events


def test_the_stale_tail_is_skipped_with_a_reason(tmp_path: Path) -> None:
    _, buf, cut, events = _run(tmp_path / "store")
    assert buf.watermark == 14 and cut.buffer_watermark == 14
    committed = [e for e in events if e.kind == "trainer_skips_committed"]
    assert committed and committed[-1].data["skipped"] == {"stale": [12, 13]}


def test_the_ledger_covers_the_stale_tail(tmp_path: Path) -> None:
    store, buf, cut, _ = _run(tmp_path / "store")
    ledger = BatchLedger(store)
    assert ledger.rounds()[-1].watermark == cut.buffer_watermark
    ledger.check(watermark=buf.watermark)
    tail = ledger.rounds()[-1]
    assert tail.skips_only and tail.positions == () and tail.skipped == {"stale": (12, 13)}
    assert (tail.seq, tail.watermark_before, tail.watermark) == (cut.trained_rounds, 12, 14)
    assert len(ledger.trained_rounds()) == cut.trained_rounds == 4
    assert ledger.check(watermark=buf.watermark) == {
        "rounds": 4,
        "trained": 12,
        "skipped": 2,
        "watermark": 14,
    }


def test_replay_accepts_the_final_cut_after_a_stale_tail(tmp_path: Path) -> None:
    store, buf, cut, _ = _run(tmp_path / "store")
    result = replay(
        ledger=BatchLedger(store),
        buffer=buf,
        make_backend=lambda: FakeBackend(seed=11),
        cut_store=CutStore(store, keep=10),
        work_dir=tmp_path / "replay",
    )
    assert result.rounds == 4 and result.cut_id == cut.cut_id and result.equal


def test_a_tail_flushed_after_the_cut_is_set_aside_and_flushed_again(tmp_path: Path) -> None:
    """An incarnation that dies after flushing the tail, before its cut: the next one
    restores the earlier cut, the skip-only record moves aside, the tail is flushed again."""
    root = tmp_path / "store"
    store = DirStore(root, fsync=False)
    buf = FileSampleBuffer(store, host="trainer", clock=lambda: 0.0)
    events: list = []
    lc = _lifecycle(store, buf, root, events)
    for i in range(12):
        buf.append(make_group(i, max(0, i // 3 - 1), g=G, seed=3))
    for i in range(12, 14):
        buf.append(make_group(i, 0, g=G, seed=3))
    buf.mark_data_end()
    lc.start(0)
    lc.train(4)  # the four full rounds; the tail is not examined yet
    cut = lc.drain(StopReason.STOPPED)
    lc.release()
    assert cut.buffer_watermark == 12
    lc.start(1, cut)
    lc.train(1)  # EndOfData: the tail's skips are recorded and committed
    assert BatchLedger(store).rounds()[-1].skips_only and buf.watermark == 14
    lc.sm.go(LifecycleState.FAILED, "killed before its cut")
    lc.release()
    lc2 = _lifecycle(store, FileSampleBuffer(store, host="trainer", clock=lambda: 0.0), root, [])
    lc2.start(2, cut)
    assert len(lc2.ledger_set_aside) == 1 and ".skips001.json" in lc2.ledger_set_aside[0]
    lc2.train(1)
    final = lc2.drain(StopReason.FINISHED)
    ledger = BatchLedger(store)
    assert ledger.rounds()[-1].incarnation == 2 and final.buffer_watermark == 14
    assert ledger.check(watermark=14)["skipped"] == 2


def test_record_skips_refuses_a_batch_with_groups_or_a_gap(tmp_path: Path) -> None:
    store, buf, _, _ = _run(tmp_path / "store")
    ledger = BatchLedger(store)
    tail = ledger.rounds()[-1]
    trained = ledger.rounds()[-2]

    class B:
        policy_version, group_size, groups_per_round = 4, G, 3
        positions: tuple = ()
        skipped = {"stale": (20,)}
        watermark_before, watermark = 15, 21

    with pytest.raises(LedgerError, match="does not follow"):
        ledger.record_skips(B(), seq=tail.seq, incarnation=0, parent_cut=None)
    B.positions = trained.positions
    with pytest.raises(LedgerError, match="skip-only batch"):
        ledger.record_skips(B(), seq=tail.seq, incarnation=0, parent_cut=None)
