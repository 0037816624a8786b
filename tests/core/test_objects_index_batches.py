"""Batched index objects in the ``objects`` buffer layout (S3 and other stores without a
file system).

``append_many`` writes a call's records as **one** index object ``index/<p>.json``
holding positions ``p .. p+n-1`` (one checked line each): one ``put_if_absent`` a call
instead of one a group. These tests hold the rules that keep positions dense and never
shared: an appender takes ``p`` only at the end of an object it has read, readers stop at
a gap, and a damaged object keeps its span (readers and appenders agree on it from the
same bytes).
"""

from __future__ import annotations

import random
import threading

import pytest

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.buffer.sample_buffer.codec import decode_record, encode_record
from yeto_core.errors import SampleBufferError
from yeto_core.records import CORRUPT_INDEX_HOST
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.groups import build_group


def _group(i: int):
    return build_group(f"g{i}", n=2, host="h1", incarnation=1, prompt_id=f"p{i}")


def _store(tmp_path) -> DirStore:
    return DirStore(tmp_path / "store", fsync=False)


def _index_keys(store) -> list[str]:
    return [k.rsplit("/", 1)[1] for k in store.list("buffer/index/")]


def test_a_call_is_one_index_object_and_every_position_is_read(tmp_path):
    store = _store(tmp_path)
    buf = FileSampleBuffer(store, layout="objects")
    assert buf.append(_group(0)) == 0
    assert buf.append_many([_group(i) for i in range(1, 9)]) == list(range(1, 9))
    assert buf.append(_group(9)) == 9
    assert _index_keys(store) == ["000000000000.json", "000000000001.json", "000000000009.json"]
    reader = FileSampleBuffer(store, layout="objects", read_only=True)
    entries = reader.entries()
    assert [(e.position, e.group_id) for e in entries] == [(i, f"g{i}") for i in range(10)]
    assert reader.head_position == 10
    for e in entries:
        assert reader.load(e).group_id == e.group_id
    # a fresh appender finds the end of the newest object (it holds one position here),
    # and after another call, the end of that call's object
    other = FileSampleBuffer(store, layout="objects")
    assert other.append_many([_group(10), _group(11), _group(12)]) == [10, 11, 12]
    assert FileSampleBuffer(store, layout="objects").append(_group(13)) == 13


def test_an_appender_whose_next_position_is_stale_takes_the_end_of_the_newest_object(tmp_path):
    """B's next position is taken by A's object of 3: B reads that object and goes
    after it, never into it."""
    store = _store(tmp_path)
    a = FileSampleBuffer(store, layout="objects")
    b = FileSampleBuffer(store, layout="objects")
    assert a.append(_group(0)) == 0
    assert b.append(_group(1)) == 1  # B's next: 2
    assert a.append_many([_group(2), _group(3), _group(4)]) == [2, 3, 4]  # lost 1, took 2..4
    assert b.append_many([_group(5), _group(6)]) == [5, 6]  # lost 2, read it: 5
    assert a.append(_group(7)) == 7
    entries = FileSampleBuffer(store, layout="objects", read_only=True).entries()
    assert [(e.position, e.group_id) for e in entries] == [(i, f"g{i}") for i in range(8)]


def test_racing_appenders_keep_positions_dense_and_never_shared(tmp_path):
    """Four threads, each with its own buffer on one store, append calls of 1-5 groups
    at once (put_if_absent races on the same keys): every group gets exactly one
    position, the positions are 0..N-1, and each record is where its append said."""
    store = _store(tmp_path)
    got: dict[str, int] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(4, timeout=30)

    def work(t: int) -> None:
        try:
            rng = random.Random(t)
            buf = FileSampleBuffer(store, layout="objects")
            start.wait()
            for c in range(15):
                ids = [t * 1000 + c * 10 + k for k in range(rng.randint(1, 5))]
                positions = buf.append_many([_group(i) for i in ids])
                with lock:
                    got.update({f"g{i}": p for i, p in zip(ids, positions, strict=True)})
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    entries = FileSampleBuffer(store, layout="objects", read_only=True).entries()
    assert [e.position for e in entries] == list(range(len(got)))
    assert {e.group_id: e.position for e in entries} == got
    assert len(_index_keys(store)) < len(got)  # calls of several groups: fewer objects


class _HidingStore(DirStore):
    """A dir store whose listings leave out ``hidden`` (a listing that raced a creation)."""

    hidden: set[str] = set()

    def list(self, prefix, after=None):
        return [k for k in super().list(prefix, after=after) if k not in self.hidden]


def test_a_reader_stops_at_a_gap_and_reads_on_once_the_object_is_listed(tmp_path):
    store = _HidingStore(tmp_path / "store", fsync=False)
    buf = FileSampleBuffer(store, layout="objects")
    buf.append_many([_group(i) for i in range(3)])  # 0..2
    buf.append_many([_group(i) for i in range(3, 7)])  # 3..6
    buf.append(_group(7))
    store.hidden = {"buffer/index/000000000003.json"}
    reader = FileSampleBuffer(store, layout="objects", read_only=True)
    assert reader.head_position == 3  # 7 is listed, but not the object before it
    store.hidden = set()
    assert reader.head_position == 8
    assert [e.group_id for e in reader.entries()] == [f"g{i}" for i in range(8)]


def _damage(store, key: str, how: str, line: int) -> None:
    raw = bytearray(store.get(key))
    starts = [0] + [i + 1 for i, b in enumerate(raw) if b == 0x0A][:-1]
    if how == "body":  # a byte of the record's group id
        i = raw.index(b'"group_id":"', starts[line]) + len(b'"group_id":"')
    else:  # "newline": the line break that ends ``line`` (XOR 0x01: 0x0a -> 0x0b)
        i = raw.index(b"\n", starts[line])
    raw[i] ^= 0x01
    store.put(key, bytes(raw))


@pytest.mark.parametrize(
    ("how", "line", "quarantined"),
    [
        ("body", 2, [2]),  # one record's line fails its checksum
        ("body", 4, [4]),  # the last line: the object's line count holds
        ("newline", 1, [1, 2]),  # two lines merged: the last record still says the end
        ("newline", 4, [4]),  # the newline that ends the object
    ],
)
def test_a_damaged_index_object_keeps_its_span(tmp_path, how, line, quarantined):
    """A changed byte in a 5-record object quarantines the positions it broke, keeps
    the object's 5 positions (nothing shifts), and an appender opened after the damage
    continues where a reader that read it before the damage expects: at 5."""
    store = _store(tmp_path)
    writer = FileSampleBuffer(store, layout="objects")
    assert writer.append_many([_group(i) for i in range(5)]) == list(range(5))
    before = FileSampleBuffer(store, layout="objects", read_only=True)
    assert before.head_position == 5
    _damage(store, "buffer/index/000000000000.json", how, line)
    after = FileSampleBuffer(store, layout="objects")
    assert after.head_position == 5
    entries = after.entries()
    bad = [e.position for e in entries if e.host == CORRUPT_INDEX_HOST]
    assert bad == quarantined
    assert [e.group_id for e in entries if e.host != CORRUPT_INDEX_HOST] == [
        f"g{i}" for i in range(5) if i not in quarantined
    ]
    assert [e.data["position"] for e in after.events] == quarantined
    assert FileSampleBuffer(store, layout="objects").append(_group(5)) == 5
    assert before.head_position == 6  # the reader from before agrees
    assert after.head_position == 6


def test_an_object_starting_inside_the_one_before_it_is_refused(tmp_path):
    """Two writers that do not share this format (one writing an object at a position
    inside another's batch) are an error naming the key, never a silent overlap."""
    store = _store(tmp_path)
    buf = FileSampleBuffer(store, layout="objects")
    buf.append_many([_group(i) for i in range(3)])  # 0..2
    second = store.get("buffer/index/000000000000.json").split(b"\n")[1]
    store.put("buffer/index/000000000001.json", encode_record(decode_record(second)))
    with pytest.raises(SampleBufferError, match="000000000001.json' starts at position 1"):
        FileSampleBuffer(store, layout="objects", read_only=True).head_position  # noqa: B018
