"""The trainer's buffer keeps consumed.json as its own last commit wrote it: the next
round's ``watermark`` and ``commit`` read nothing, and a state someone else wrote
meanwhile is still refused by the commit's compare-and-swap (counts, no timings)."""

from __future__ import annotations

import pytest

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.errors import SampleBufferError
from yeto_core.testing.fakes import Clock, RemoteLookingDirStore
from yeto_core.testing.groups import build_group

G = 4


class RemoteDir(RemoteLookingDirStore):
    """A dir store seen as remote that counts reads of consumed.json."""

    def __init__(self, root):
        super().__init__(root)
        self.consumed_reads = 0

    def get(self, key):
        if key.endswith("consumed.json"):
            self.consumed_reads += 1
        return super().get(key)

    def get_versioned(self, key):
        if key.endswith("consumed.json"):
            self.consumed_reads += 1
        return super().get_versioned(key)


def group(i):
    return build_group(f"g{i}", n=G, host="h", prompt_id=f"p{i}", version=0)


def setup(tmp_path, n=8):
    store = RemoteDir(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects")
    for i in range(n):
        buf.append(group(i))
    reader = BatchReader(buf, group_size=G, groups_per_round=2, max_policy_age=9, clock=Clock())
    return store, buf, reader


def test_after_its_own_commit_a_round_already_read_reads_nothing(tmp_path):
    store, buf, reader = setup(tmp_path)
    reader.commit(reader.try_take(0))  # the first round reads it: nothing is known yet
    store.consumed_reads = 0
    batch = reader.try_take(1)  # its records were read with the first round's
    assert batch is not None and batch.watermark_before == 2
    assert store.consumed_reads == 0  # the select found a whole round it had read
    assert reader.commit(batch) == 4
    assert store.consumed_reads == 0  # the commit: the compare-and-swap only
    assert FileSampleBuffer(store, layout="objects").watermark == 4


def test_a_round_not_read_yet_reads_the_index_only_when_consumed_json_is_its_own_commit(
    tmp_path,
):
    """consumed.json is still this reader's own last commit: the select reads the index
    only (one request less on the trainer's path); another committer meanwhile is refused
    by the commit's compare-and-swap (the next test)."""
    store, buf, reader = setup(tmp_path, n=2)
    reader.commit(reader.try_take(0))
    late = FileSampleBuffer(store, layout="objects", host="late")
    for i in range(2, 4):
        late.append(group(i))
    store.consumed_reads = 0
    batch = reader.try_take(1)
    assert batch is not None and batch.watermark_before == 2
    assert store.consumed_reads == 0
    assert reader.commit(batch) == 4
    assert store.consumed_reads == 0


def test_a_state_written_by_another_after_the_select_is_refused_by_the_commit(tmp_path):
    store, buf, reader = setup(tmp_path)
    reader.commit(reader.try_take(0))
    batch = reader.try_take(1)
    other = FileSampleBuffer(store, layout="objects")  # e.g. a head that reset the buffer
    other.reset_to(0)
    with pytest.raises(SampleBufferError, match="changed in the store|the watermark is"):
        reader.commit(batch)
    assert FileSampleBuffer(store, layout="objects").watermark == 0  # nothing written
    # and the buffer reads the store again after the refusal
    assert buf.watermark == 0


def test_a_state_another_wrote_before_the_select_is_seen_by_the_select(tmp_path):
    store, buf, reader = setup(tmp_path)
    reader.commit(reader.try_take(0))
    other = FileSampleBuffer(store, layout="objects")
    other.reset_to(0)
    assert buf.backlog().watermark == 0  # the select's read saw another version
    assert buf.watermark == 0
