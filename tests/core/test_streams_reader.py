"""The head's incremental stream reader: each poll parses only what a stream grew by,
and always returns what a whole read (``read_all``) returns."""

from __future__ import annotations

from pathlib import Path

from yeto_core.events import stream as event_stream
from yeto_core.events.stream import EventStream, StreamsReader, read_all, stream_key
from yeto_core.stores.dir_store import DirStore


def _same(a: dict, b: dict) -> bool:
    return {k: [(e.kind, e.time, e.data) for e in v] for k, v in a.items()} == {
        k: [(e.kind, e.time, e.data) for e in v] for k, v in b.items()
    }


def test_growing_torn_rewritten_and_new_streams_read_as_a_whole_read(
    tmp_path: Path, monkeypatch
) -> None:
    store = DirStore(tmp_path)
    parsed: list[int] = []
    parse = event_stream._parse

    def counting(text: str, island: str):
        parsed.append(len(text))
        return parse(text, island)

    monkeypatch.setattr(event_stream, "_parse", counting)
    reader = StreamsReader(store)
    a = EventStream(store, "a", flush_s=0)
    for i in range(50):
        a.emit("x", i=i)
    first = reader.read_all()
    assert _same(first, read_all(store)) and len(first["a"]) == 50
    whole = len(store.get(stream_key("a")))
    parsed.clear()
    a.emit("x", i=50)
    second = reader.read_all()
    assert _same(second, read_all(store)) and len(second["a"]) == 51
    assert parsed[0] < whole / 10  # the new line, not the stream
    # a torn last line (a dir writer mid-append) is skipped, then read once whole
    raw = store.get(stream_key("a"))
    store.put(stream_key("a"), raw + b'{"kind":"y","ti')
    assert _same(reader.read_all(), read_all(store)) and len(reader.read_all()["a"]) == 51
    store.put(stream_key("a"), raw + b'{"kind":"y","time":1.0,"data":{}}\n')
    assert [e.kind for e in reader.read_all()["a"]][-1] == "y"
    # rewritten shorter or changed (a fresh store): parsed whole again
    store.put(stream_key("a"), b'{"kind":"z","time":2.0,"data":{}}\n')
    assert [e.kind for e in reader.read_all()["a"]] == ["z"]
    # a new island's stream appears
    EventStream(store, "b", flush_s=0).emit("w")
    got = reader.read_all()
    assert _same(got, read_all(store)) and set(got) == {"a", "b"}


def test_a_caller_changing_the_returned_lists_does_not_change_the_next_read(
    tmp_path: Path,
) -> None:
    store = DirStore(tmp_path)
    EventStream(store, "a", flush_s=0).emit("x")
    reader = StreamsReader(store)
    reader.read_all()["a"].clear()
    assert len(reader.read_all()["a"]) == 1
