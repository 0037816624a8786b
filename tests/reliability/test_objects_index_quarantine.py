"""Gap 6 on the ``objects`` buffer layout (S3 and other stores without a file system).

Regression: a flipped byte in one index object (``buffer/index/<position>.json``) made
every reader raise "fails its checksum", so a head could not start and the run could not
continue. Like the ``jsonl`` index, a complete record that fails its checksum is now
quarantined: its position stays taken, the reader skips it as ``quarantined`` and an
event counts it.
"""

from __future__ import annotations

import pytest

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.buffer.sample_buffer.codec import decode_record, encode_record
from yeto_core.errors import SampleBufferError
from yeto_core.records import CORRUPT_INDEX_HOST
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.groups import build_group


def _group(gid: str):
    return build_group(gid, n=2, host="h1", incarnation=1, prompt_id=f"p-{gid}")


def _buffer(tmp_path, n: int):
    store = DirStore(tmp_path / "store", fsync=False)
    buf = FileSampleBuffer(store, layout="objects")
    for i in range(n):
        buf.append(_group(f"g{i}"))
    return store


def _flip(store, key: str, what: bytes, to: bytes) -> None:
    raw = store.get(key)
    assert what in raw
    store.put(key, raw.replace(what, to, 1))


def test_a_flipped_byte_in_an_index_object_is_quarantined_and_skipped(tmp_path):
    store = _buffer(tmp_path, 4)
    key = "buffer/index/000000000002.json"
    _flip(store, key, b'"g2"', b'"gX"')  # the crc no longer matches
    buf = FileSampleBuffer(store, layout="objects")
    assert buf.head_position == 4  # position 2 stays taken: nothing shifts
    kinds = [e.kind for e in buf.events]
    assert kinds == ["buffer.index_line_quarantined"], kinds
    assert buf.events[0].data["position"] == 2 and buf.events[0].data["key"] == key
    assert [e.host for e in buf.entries()][2] == CORRUPT_INDEX_HOST
    reader = BatchReader(buf, group_size=2, groups_per_round=3, max_policy_age=10)
    batch = reader.take(0, short_ok=True)
    assert [g.group_id for g in batch.groups] == ["g0", "g1", "g3"]
    assert tuple(batch.skipped["quarantined"]) == (2,)
    assert buf.append(_group("g4")) == 4  # positions stay dense after it


def test_an_intact_index_object_naming_another_position_is_still_refused(tmp_path):
    """A record that passes its checksum but sits at another position was moved or
    edited on purpose: that is not a flipped byte and stays an error naming the key."""
    store = _buffer(tmp_path, 3)
    rec = decode_record(store.get("buffer/index/000000000001.json"))
    rec["position"] = 7
    store.put("buffer/index/000000000001.json", encode_record(rec))
    with pytest.raises(SampleBufferError, match="000000000001.json' names position 7"):
        FileSampleBuffer(store, layout="objects").head_position  # noqa: B018 (reads the index)


def test_replay_names_a_trained_position_whose_index_record_was_damaged_later(tmp_path):
    """Regression (the campaign's replay mismatch): a group trained, then its index record
    flipped, made ``yeto ledger replay`` fail with "object store key must be a non-empty
    string" (the quarantined stand-in has no payload). It now names the position."""
    from yeto_core.buffer.ledger import LedgerError, LedgerRound
    from yeto_core.buffer.ledger_replay import rebuild_batch

    store = _buffer(tmp_path, 3)
    _flip(store, "buffer/index/000000000001.json", b'"g1"', b'"gX"')
    buf = FileSampleBuffer(store, layout="objects")
    entries = {e.position: e for e in buf.entries()}
    rec = LedgerRound(
        seq=1,
        incarnation=0,
        parent_cut=None,
        policy_version=0,
        positions=(0, 1, 2),
        skipped={},
        watermark_before=0,
        watermark=3,
        group_size=2,
        groups_per_round=3,
        n_real=3,
        n_padding=0,
    )
    with pytest.raises(LedgerError, match="position 1, whose buffer index record was damaged"):
        rebuild_batch(buf, rec, entries)


def test_a_quarantined_record_is_counted_quarantined_not_stale(tmp_path):
    """Found by the campaign: the stand-in of a damaged record carries no versions (0), so
    a trainer past ``max_policy_age`` counted it ``stale``; the damage went uncounted."""
    store = DirStore(tmp_path / "store", fsync=False)
    buf = FileSampleBuffer(store, layout="objects")
    for i in range(3):
        buf.append(build_group(f"g{i}", n=2, host="h1", incarnation=1, version=5))
    _flip(store, "buffer/index/000000000001.json", b'"g1"', b'"gX"')
    buf = FileSampleBuffer(store, layout="objects")
    reader = BatchReader(buf, group_size=2, groups_per_round=2, max_policy_age=2)
    batch = reader.take(5, short_ok=True)
    assert [g.group_id for g in batch.groups] == ["g0", "g2"]
    assert tuple(batch.skipped.get("quarantined", ())) == (1,), batch.skipped
    assert "stale" not in batch.skipped
