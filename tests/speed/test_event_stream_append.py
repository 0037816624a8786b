"""Event streams on a local-file store: flushes append; a torn tail is never read as an event."""

from __future__ import annotations

import pytest

from yeto_core.events.stream import EventStream, read_events, stream_key
from yeto_core.stores.dir_store import DirStore


def test_flushes_after_the_first_append_only_new_lines(tmp_path, monkeypatch):
    store = DirStore(tmp_path)
    s = EventStream(store, "trainer", flush_s=0.0)
    s.emit("a", n=1)
    puts = []
    real_put = store.put
    monkeypatch.setattr(store, "put", lambda k, d: (puts.append(k), real_put(k, d)))
    for n in range(2, 6):
        s.emit("a", n=n)
    assert puts == []  # appended, not put again
    assert [e.data["n"] for e in read_events(store, "trainer")] == [1, 2, 3, 4, 5]


def test_a_torn_last_line_is_skipped_and_the_next_writer_writes_its_own_object(tmp_path):
    store = DirStore(tmp_path)
    s = EventStream(store, "sampler-0", flush_s=0.0)
    s.emit("a", n=1)
    s.emit("a", n=2)
    path = tmp_path / stream_key("sampler-0")
    with open(path, "ab") as f:  # a crash in the middle of an append
        f.write(b'{"kind":"a","time":1.0,"source":"sampler-0","data":{"n"')
    assert [e.data["n"] for e in read_events(store, "sampler-0")] == [1, 2]
    again = EventStream(store, "sampler-0", flush_s=0.0)  # the restarted island
    assert again.key != stream_key("sampler-0")
    again.emit("a", n=3)
    again.emit("a", n=4)
    assert [e.data["n"] for e in read_events(store, "sampler-0")] == [1, 2, 3, 4]


def test_a_failed_append_puts_the_whole_stream_next_time(tmp_path, monkeypatch):
    store = DirStore(tmp_path)
    s = EventStream(store, "head", flush_s=0.0)
    s.emit("a", n=1)

    def broken(data):
        with open(tmp_path / stream_key("head"), "ab") as f:
            f.write(data[:7])  # part of it landed
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(s, "_append", broken)
    with pytest.raises(OSError):
        s.emit("a", n=2)
    monkeypatch.undo()
    s.emit("a", n=3)
    assert [e.data["n"] for e in read_events(store, "head")] == [1, 2, 3]
