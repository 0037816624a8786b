"""StoreLog: the one primitive behind the journal, the trainer channel, ledger rounds and the
buffer's objects index."""

from __future__ import annotations

import threading

import pytest

from yeto_core.errors import StoreError
from yeto_core.stores.dir_store import DirStore
from yeto_core.stores.log import StoreLog


def test_racing_writers_take_dense_distinct_numbers(tmp_path) -> None:
    store = DirStore(tmp_path / "s", fsync=False)
    got: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def writer(w: int) -> None:
        log = StoreLog(store, "head/journal", width=10)  # one object per writer
        barrier.wait(timeout=30)
        for i in range(10):
            seq = log.append(lambda s, w=w, i=i: f"{w}:{i}:{s}".encode())
            with lock:
                got.append(seq)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(got) == list(range(40))
    log = StoreLog(store, "head/journal", width=10)
    records = list(log.read())
    assert [k for k, _ in records] == [log.key(i) for i in range(40)]
    for key, data in records:  # each record carries the number it was written at
        assert int(data.decode().rsplit(":", 1)[1]) == log.seq_of(key)


def test_keys_seq_of_and_a_single_writer_log(tmp_path) -> None:
    store = DirStore(tmp_path / "s", fsync=False)
    log = StoreLog(store, "trainer/0/commands", width=8)
    assert log.key(7) == "trainer/0/commands/00000007.json"
    assert log.seq_of("trainer/0/commands/00000007.json") == 7
    assert log.seq_of("trainer/0/commands/7.json") is None
    assert log.seq_of("elsewhere/00000007.json") is None
    store.put("trainer/0/commands/README", b"not a record")
    assert log.append_exclusive(lambda s: b"a") == 0
    assert [k for k, _ in log.read()] == [log.key(0)]
    other = StoreLog(store, "trainer/0/commands", width=8)
    other._next = 0  # a second writer that did not list first
    with pytest.raises(StoreError, match="two writers"):
        other.append_exclusive(lambda s: b"b")
    assert log.last_seq() == 0 and log.next_seq() == 1
