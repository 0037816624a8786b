"""A single append under the index lock: catch up, cut a torn tail, write, in that order."""

from __future__ import annotations

import json

import numpy as np

from yeto_core.buffer.sample_buffer import FileSampleBuffer, decode_record, encode_record
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.groups import build_group, build_sample


def group(gid: str):
    return build_group(
        gid, n=2, sample=lambda i: build_sample(tokens=np.arange(6) + i, logprobs=np.zeros(4))
    )


def test_a_torn_tail_left_while_a_writer_is_open_is_cut_by_its_next_append(tmp_path):
    store = DirStore(tmp_path / "s", fsync=False)
    buf = FileSampleBuffer(store, layout="jsonl")
    for i in range(3):
        buf.append(group(f"g{i}"))
    index = tmp_path / "s" / "buffer" / "index.jsonl"
    good = index.read_bytes()
    # another writer of this index died in the middle of its line
    with open(index, "ab") as f:
        f.write(encode_record({"position": 3, "group_id": "zz"})[:-25])
    assert buf.append(group("g3")) == 3
    lines = index.read_bytes().split(b"\n")
    assert index.read_bytes().startswith(good)
    assert len(lines) == 5 and lines[-1] == b""
    rec = decode_record(lines[3])
    assert rec is not None and rec["group_id"] == "g3" and rec["position"] == 3
    assert [e.kind for e in buf.events] == ["buffer.index_repaired"]
    assert FileSampleBuffer(store, layout="jsonl", read_only=True).head_position == 4


def test_an_append_catches_up_on_lines_another_writer_added(tmp_path):
    store = DirStore(tmp_path / "s", fsync=False)
    a = FileSampleBuffer(store, layout="jsonl")
    b = FileSampleBuffer(store, layout="jsonl")
    assert a.append(group("g0")) == 0
    assert b.append(group("g1")) == 1
    assert a.append(group("g2")) == 2
    assert a.append(group("g1")) == 1  # b's id, seen by a's catch-up: deduplicated
    index = (tmp_path / "s" / "buffer" / "index.jsonl").read_bytes()
    ids = [json.loads(line)["group_id"] for line in index.splitlines()]
    assert ids == ["g0", "g1", "g2"]


def test_a_payload_already_at_the_key_is_what_the_record_names(tmp_path):
    """An earlier append that crashed before its index record left bytes at the key
    (here: other bytes than this group's): the record carries the digest of the bytes
    that are there, not of the group just encoded."""
    import hashlib

    from yeto_core.buffer.group_codec import encode_group

    store = DirStore(tmp_path / "s", fsync=False)
    buf = FileSampleBuffer(store, layout="jsonl")
    there = encode_group(group("other-content"))
    store.put(buf.payload_key("g0"), there)
    assert buf.append(group("g0")) == 0
    (entry,) = buf.entries()
    assert entry.digest == hashlib.sha256(there).hexdigest()
    assert entry.digest != hashlib.sha256(encode_group(group("g0"))).hexdigest()
    assert store.get(buf.payload_key("g0")) == there  # kept, not overwritten
