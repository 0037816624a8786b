"""A restore's ledger rebase reads the records whose side of the cut needs their content
(the last kept, the ones after the cut), not the whole history (counts, no timings)."""

from __future__ import annotations

import pytest

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.ledger import BatchLedger, LedgerError
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import make_group
from yeto_core.testing.fakes import Clock

G = 4


class CountingDir(DirStore):
    def __init__(self, root):
        super().__init__(root, fsync=False)
        self.ledger_gets: list[str] = []

    def get(self, key):
        if key.startswith("ledger/rounds/"):
            self.ledger_gets.append(key.rsplit("/", 1)[1])
        return super().get(key)


def ledger_of(tmp_path, rounds: int):
    clock = Clock(1_700_000_000.0, tick=1.0)
    store = CountingDir(tmp_path / "s")
    buf = FileSampleBuffer(store, clock=clock)
    for i in range(2 * rounds):
        buf.append(make_group(i, 0, g=G))
    reader = BatchReader(buf, group_size=G, groups_per_round=2, max_policy_age=10**6, clock=clock)
    ledger = BatchLedger(store, clock=clock)
    for k in range(rounds):
        batch = reader.take(k)
        ledger.record(batch, seq=k + 1, incarnation=0, parent_cut=None)
        reader.commit(batch)
    return store


def test_a_rebase_at_the_ledger_end_reads_one_record(tmp_path):
    store = ledger_of(tmp_path, 30)
    store.ledger_gets.clear()
    moved = BatchLedger(store).rebase(trained_rounds=30, cut_id="c", watermark=60, incarnation=1)
    assert moved == [] and store.ledger_gets == ["000000000030.json"]


def test_rounds_after_the_cut_are_read_and_set_aside(tmp_path):
    store = ledger_of(tmp_path, 30)
    store.ledger_gets.clear()
    moved = BatchLedger(store).rebase(trained_rounds=28, cut_id="c", watermark=56, incarnation=1)
    assert [m.rsplit("/", 1)[1] for m in moved] == ["000000000029.json", "000000000030.json"]
    # the two after the cut (their incarnation checked, then moved), the last one kept
    assert sorted(set(store.ledger_gets)) == [
        "000000000028.json",
        "000000000029.json",
        "000000000030.json",
    ]


def test_a_cut_that_disagrees_with_the_ledger_is_still_refused(tmp_path):
    store = ledger_of(tmp_path, 30)
    with pytest.raises(LedgerError, match="come from different runs"):
        BatchLedger(store).rebase(trained_rounds=30, cut_id="c", watermark=58, incarnation=1)
    with pytest.raises(LedgerError, match="come from different runs"):
        BatchLedger(store).rebase(trained_rounds=31, cut_id="c", watermark=60, incarnation=1)


class RemoteCounting(CountingDir):
    """Seen as remote; counts the listings of the ledger."""

    def __init__(self, root):
        super().__init__(root)
        self.ledger_lists = 0

    def local_root(self):
        return None

    def list(self, prefix, after=None):
        if prefix.startswith("ledger/"):
            self.ledger_lists += 1
        return super().list(prefix, after=after)


def _rounds(tmp_path, store, n):
    clock = Clock(1_700_000_000.0, tick=1.0)
    buf = FileSampleBuffer(store, clock=clock, layout="objects")
    for i in range(2 * n):
        buf.append(make_group(i, 0, g=G))
    return BatchReader(buf, group_size=G, groups_per_round=2, max_policy_age=10**6, clock=clock)


def test_a_record_after_look_ahead_lists_nothing_itself(tmp_path):
    store = RemoteCounting(tmp_path / "s")
    reader = _rounds(tmp_path, store, 3)
    ledger = BatchLedger(store)
    for k in range(3):
        batch = reader.take(k)
        ledger.look_ahead()  # the trainer calls it before the round trains
        lists = store.ledger_lists
        ledger.record(batch, seq=k + 1, incarnation=0, parent_cut=None)
        assert store.ledger_lists == lists  # the record used the look-ahead's listing
        reader.commit(batch)
    assert [r.seq for r in BatchLedger(store).rounds()] == [1, 2, 3]


def test_a_round_another_trainer_recorded_after_the_look_ahead_is_still_refused(tmp_path):
    store = RemoteCounting(tmp_path / "s")
    reader = _rounds(tmp_path, store, 2)
    ledger = BatchLedger(store)
    batch = reader.take(0)
    ledger.look_ahead()
    ledger._ahead[0].result()  # listed: nothing there yet
    BatchLedger(store).record(batch, seq=1, incarnation=7, parent_cut=None)  # the other one
    with pytest.raises(LedgerError, match="another trainer recorded round 1"):
        ledger.record(batch, seq=1, incarnation=0, parent_cut=None)
    assert BatchLedger(store).rounds()[0].incarnation == 7


def test_on_a_local_store_nothing_is_listed_ahead(tmp_path):
    store = CountingDir(tmp_path / "s")
    ledger = BatchLedger(store)
    ledger.look_ahead()
    assert ledger._ahead is None
