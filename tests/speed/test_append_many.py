"""Group commit in the sample buffer: ``append_many`` keeps ``append``'s crash guarantees.

A batch's payloads are durable before any of its index records; the records go in
one write and one sync, so a crash leaves none or a prefix of the batch visible,
never a torn record, and appending the batch again deduplicates.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.errors import SampleBufferError
from yeto_core.records import RoundSpec, Sample, SampleGroup
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.stores.dir_store import DirStore


class Crash(BaseException):
    """Stands for the process dying at this point."""


def group(i: int, host: str = "h") -> SampleGroup:
    t = np.arange(64, dtype=np.int32) + i
    s = Sample(
        tokens=t,
        prompt_len=8,
        logprobs=np.zeros(56, np.float32),
        loss_mask=np.ones(56, np.uint8),
        reward=float(i % 2),
        weight_version=0,
    )
    return SampleGroup(f"{host}-g{i}", f"p{i}", host, 0, (s, s))


def check_visible(root: Path) -> list:
    """Reopen as a writer (repairs a torn tail); every visible record is whole and loads."""
    buf = FileSampleBuffer(DirStore(root), layout="jsonl")
    entries = buf.entries()
    assert [e.position for e in entries] == list(range(len(entries)))
    ids = [e.group_id for e in entries]
    assert len(ids) == len(set(ids)), "a group is visible twice"
    for e in entries:
        assert buf.load(e).group_id == e.group_id
    buf.close()
    return entries


def test_append_many_matches_single_appends(tmp_path):
    one = FileSampleBuffer(DirStore(tmp_path / "one"), layout="jsonl")
    many = FileSampleBuffer(DirStore(tmp_path / "many"), layout="jsonl")
    singles = [one.append(group(i)) for i in range(8)]
    assert many.append_many([group(i) for i in range(8)]) == singles == list(range(8))
    a, b = one.entries(), many.entries()
    assert [(e.group_id, e.n_samples) for e in a] == [(e.group_id, e.n_samples) for e in b]
    # singles: one object per group; the batch: one pack, each group a slice of it
    assert len({e.payload for e in a}) == 8 and all(e.length == -1 for e in a)
    assert len({e.payload for e in b}) == 1 and b[0].payload.startswith("buffer/groups/pack-")
    assert [e.offset for e in b] == [0] + [sum(x.length for x in b[:k]) for k in range(1, 8)]
    for x, y in zip(a, b, strict=True):  # each record names its payload's bytes (digest)
        assert many.load(y).group_id == y.group_id == one.load(x).group_id
        assert x.digest == y.digest  # the digest of the group's own bytes, packed or not
    r = many.select(RoundSpec(max_groups=8, current_version=0, max_policy_age=1))
    assert r.positions == tuple(range(8))
    assert many.backlog().groups == 8


def test_append_many_deduplicates_known_and_repeated_ids(tmp_path):
    buf = FileSampleBuffer(DirStore(tmp_path / "s"), layout="jsonl")
    assert buf.append(group(1)) == 0
    got = buf.append_many([group(0), group(1), group(2), group(0)])
    assert got == [1, 0, 2, 1]
    assert [e.group_id for e in buf.entries()] == ["h-g1", "h-g0", "h-g2"]
    assert buf.append_many([group(2), group(1)]) == [2, 0]  # all known: nothing written
    assert len(buf.entries()) == 3


def test_one_index_sync_per_batch(tmp_path, monkeypatch):
    buf = FileSampleBuffer(DirStore(tmp_path / "s"), layout="jsonl")
    buf.append(group(99))  # files exist
    syncs = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd)))
    buf.append_many([group(i) for i in range(8)])
    assert len(syncs) == 1, f"{len(syncs)} index syncs for one batch of 8"


@pytest.mark.parametrize("cut_lines", [0, 1, 3, 7])
def test_crash_mid_index_write_leaves_a_prefix_of_whole_records(tmp_path, cut_lines):
    root = tmp_path / "s"
    buf = FileSampleBuffer(DirStore(root), layout="jsonl")
    buf.append(group(100))
    index = buf._jsonl

    def torn_write(lines: bytes) -> None:
        # the process dies inside the write: whole lines, then part of the next one
        parts = lines.split(b"\n")
        keep = b"".join(p + b"\n" for p in parts[:cut_lines]) + parts[cut_lines][:17]
        os.write(index._wfd, keep)
        raise Crash()

    index.write_locked = torn_write
    batch = [group(i) for i in range(8)]
    with pytest.raises(Crash):
        buf.append_many(batch)
    entries = check_visible(root)
    assert [e.group_id for e in entries] == ["h-g100"] + [f"h-g{i}" for i in range(cut_lines)]
    # the successor appends the whole batch again: the visible prefix is deduplicated
    again = FileSampleBuffer(DirStore(root), layout="jsonl")
    assert again.append_many(batch) == list(range(1, 9))
    assert [e.group_id for e in check_visible(root)] == ["h-g100"] + [f"h-g{i}" for i in range(8)]


def test_crash_while_writing_payloads_leaves_no_record(tmp_path, monkeypatch):
    root = tmp_path / "s"
    buf = FileSampleBuffer(DirStore(root), layout="jsonl")
    calls = {"n": 0}
    real = os.link

    def dying_link(src, dst, *a, **k):
        calls["n"] += 1
        if calls["n"] == 1:  # the batch's pack, before its name is linked into place
            raise Crash()
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "link", dying_link)
    with pytest.raises(Crash):
        buf.append_many([group(i) for i in range(8)])
    monkeypatch.setattr(os, "link", real)
    assert check_visible(root) == []
    leftovers = [p.name for p in (root / "buffer" / "groups").iterdir() if p.name.startswith(".")]
    assert leftovers == [], f"temporary payload files left: {leftovers}"
    again = FileSampleBuffer(DirStore(root), layout="jsonl")
    assert again.append_many([group(i) for i in range(8)]) == list(range(8))


def test_a_batch_is_one_pack_with_one_payload_sync(tmp_path, monkeypatch):
    buf = FileSampleBuffer(DirStore(tmp_path / "s"), layout="jsonl")
    buf.append(group(99))  # files exist
    syncs = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append("data"), real_fdatasync(fd)))
    assert buf.append_many([group(i) for i in range(8)]) == list(range(1, 9))
    # the pack's bytes, the groups directory, the index record lines
    assert syncs == ["fsync", "fsync", "data"], syncs
    names = sorted(p.name for p in (tmp_path / "s" / "buffer" / "groups").iterdir())
    assert len(names) == 2 and names[0] == "h-g99.safetensors" and names[1].startswith("pack-")


def test_a_damaged_pack_slice_is_refused_by_its_digest_the_others_load(tmp_path):
    root = tmp_path / "s"
    buf = FileSampleBuffer(DirStore(root), layout="jsonl")
    buf.append_many([group(i) for i in range(4)])
    entries = buf.entries()
    path = root / entries[2].payload
    data = bytearray(path.read_bytes())
    data[entries[2].offset + entries[2].length - 5] ^= 0x01  # inside group 2's bytes
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(SampleBufferError, match="does not match the digest"):
        buf.load(entries[2])
    got = buf.load_many(entries)
    assert [g.group_id if g is not None else None for g, _ in got] == [
        "h-g0",
        "h-g1",
        None,
        "h-g3",
    ]
    assert isinstance(got[2][1], SampleBufferError)
    path.write_bytes(bytes(data[: entries[3].offset + 10]))  # truncated: group 3 is refused
    with pytest.raises(SampleBufferError, match="truncated or replaced"):
        buf.load(entries[3])


def test_load_many_reads_each_pack_once(tmp_path):
    store = DirStore(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="jsonl")
    buf.append_many([group(i) for i in range(4)])
    buf.append(group(4))
    buf.append_many([group(i) for i in range(5, 8)])
    gets = []
    real = store.get
    store.get = lambda key: (gets.append(key), real(key))[1]  # type: ignore[method-assign]
    got = buf.load_many(buf.entries())
    assert [g.group_id for g, _ in got] == [f"h-g{i}" for i in range(8)]
    assert len(gets) == 3 == len(set(gets))  # two packs and one single payload


def test_old_records_without_a_pack_still_load(tmp_path):
    """Records written before packs (one object per group, no offset/length keys) load,
    next to packed ones, and a reader takes them in one round."""
    from yeto_core.buffer.group_codec import encode_group
    from yeto_core.buffer.sample_buffer import encode_record
    from yeto_core.buffer.sample_buffer.append import _digest

    root = tmp_path / "s"
    store = DirStore(root)
    lines = []
    for i in range(3):
        data = encode_group(group(i))
        key = f"buffer/groups/h-g{i}.safetensors"
        store.put_if_absent(key, data)
        rec = {
            "appended_at": 1.0,
            "digest": _digest(data) if i else "",  # the oldest records carried no digest
            "group_id": f"h-g{i}",
            "host": "h",
            "incarnation": 0,
            "max_version": 0,
            "min_version": 0,
            "n_samples": 2,
            "payload": key,
            "position": i,
            "prompt_id": f"p{i}",
            "seq": -1,
        }
        lines.append(encode_record(rec))
    (root / "buffer" / "index.jsonl").write_bytes(b"".join(lines))
    buf = FileSampleBuffer(store, layout="jsonl")
    assert buf.append_many([group(i) for i in range(1, 6)]) == [1, 2, 3, 4, 5]  # dedup
    entries = buf.entries()
    assert [e.length for e in entries][:3] == [-1, -1, -1] and entries[3].length > 0
    for e in entries:
        assert buf.load(e).group_id == e.group_id
    r = buf.select(RoundSpec(max_groups=6, current_version=0, max_policy_age=1))
    assert [g.group_id for g, _ in buf.load_many(r.entries)] == [f"h-g{i}" for i in range(6)]


def test_a_crash_after_the_pack_before_the_records_then_the_same_batch_reuses_it(tmp_path):
    root = tmp_path / "s"
    buf = FileSampleBuffer(DirStore(root), layout="jsonl")

    def dies(lines: bytes) -> None:
        raise Crash()

    buf._jsonl.write_locked = dies  # type: ignore[union-attr, method-assign]
    batch = [group(i) for i in range(6)]
    with pytest.raises(Crash):
        buf.append_many(batch)
    assert check_visible(root) == []
    packs = sorted((root / "buffer" / "groups").iterdir())
    assert len(packs) == 1  # the pack is durable, unreferenced
    again = FileSampleBuffer(DirStore(root), layout="jsonl")
    assert again.append_many(batch) == list(range(6))
    assert sorted((root / "buffer" / "groups").iterdir()) == packs  # found, not rewritten
    entries = check_visible(root)
    assert {e.payload for e in entries} == {f"buffer/groups/{packs[0].name}"}


def test_a_pack_key_holding_other_bytes_falls_back_to_one_object_per_group(tmp_path):
    store = DirStore(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="jsonl")
    batch = [group(i) for i in range(3)]
    from yeto_core.buffer.group_codec import encode_group
    from yeto_core.buffer.sample_buffer.append import _digest

    key = buf.pack_key([_digest(encode_group(g)) for g in batch])
    store.put_if_absent(key, b"a damaged copy")
    assert buf.append_many(batch) == [0, 1, 2]
    entries = buf.entries()
    assert [e.payload for e in entries] == [buf.payload_key(g.group_id) for g in batch]
    assert all(buf.load(e).group_id == e.group_id for e in entries)


def test_a_group_encodes_to_the_same_bytes_every_time_and_safetensors_reads_them():
    """The pack's name is its content's: one group must encode to one byte string."""
    from safetensors.numpy import load, save

    from yeto_core.buffer.group_codec import encode_group

    g = group(5)
    data = encode_group(g)
    assert all(encode_group(g) == data for _ in range(20))
    ours = load(data)
    theirs = load(save(ours))  # the safetensors writer's file of the same arrays
    assert sorted(ours) == sorted(theirs)
    for name, arr in ours.items():
        assert arr.dtype == theirs[name].dtype and np.array_equal(arr, theirs[name])


def test_dir_store_put_many_if_absent(tmp_path):
    store = DirStore(tmp_path / "s")
    assert store.put_if_absent("a/x", b"old")
    got = store.put_many_if_absent([("a/x", b"new"), ("a/y", b"1"), ("b/z", b"2"), ("a/y", b"3")])
    assert got == [False, True, True, False]
    assert store.get("a/x") == b"old" and store.get("a/y") == b"1" and store.get("b/z") == b"2"
    assert sorted(store.list("")) == ["a/x", "a/y", "b/z"]


CHILD = r"""
import os, sys
import numpy as np
from yeto_core.records import Sample, SampleGroup
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.stores.dir_store import DirStore

root, side, start = sys.argv[1:4]
buf = FileSampleBuffer(DirStore(root), layout="jsonl", host="h")
fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
i = int(start)
while True:
    batch = []
    for k in range(i, i + 4):
        t = np.arange(64, dtype=np.int32) + k
        s = Sample(tokens=t, prompt_len=8, logprobs=np.zeros(56, np.float32),
                   loss_mask=np.ones(56, np.uint8), reward=1.0, weight_version=k)
        batch.append(SampleGroup(f"h-g{k}", "p", "h", 0, (s, s)))
    pos = buf.append_many(batch)
    os.write(fd, "".join(f"h-g{k} {p}\n" for k, p in zip(range(i, i + 4), pos)).encode())
    os.fsync(fd)
    i += 4
"""


def _confirmed(side: Path) -> list[tuple[str, int]]:
    if not side.exists():
        return []
    out = []
    for line in side.read_text().splitlines():
        gid, pos = line.split()
        out.append((gid, int(pos)))
    return out


def test_sigkilled_batch_appender_loses_nothing_and_tears_nothing(tmp_path):
    kills = int(os.environ.get("YETO_BUFFER_CRASH_KILLS", "12"))
    rng = random.Random(7)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root, side = tmp_path / "store", tmp_path / "side.txt"
    for _ in range(kills):
        start = len(_confirmed(side))
        proc = subprocess.Popen([sys.executable, str(script), str(root), str(side), str(start)])
        deadline = time.monotonic() + 60
        while len(_confirmed(side)) < start + 4:
            assert proc.poll() is None, "the appender died by itself"
            assert time.monotonic() < deadline, "the appender made no progress"
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.02))  # the random kill point, often mid-batch
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    confirmed = _confirmed(side)
    entries = check_visible(root)
    for gid, pos in confirmed:
        assert entries[pos].group_id == gid
    # beyond the confirmed ones, at most the batch in flight (a prefix of it, or all of it when
    # the kill fell after append_many returned and before the side file recorded it) is visible
    extra = [e.group_id for e in entries[len(confirmed) :]]
    n = len(confirmed)
    assert extra == [f"h-g{k}" for k in range(n, n + len(extra))] and len(extra) <= 4


class _BatchBuffer:
    def __init__(self) -> None:
        self.calls: list[int] = []
        self.n = 0

    def append_many(self, groups):
        self.calls.append(len(groups))
        out = list(range(self.n, self.n + len(groups)))
        self.n += len(groups)
        return out

    def append(self, group):  # pragma: no cover - must not be used for a batch
        raise AssertionError("the sampler loop appended one group at a time")


class _Engine:
    def encode(self, text):
        return [1, 2]

    def decode(self, tokens):
        return "x"

    def generate(self, ids, n, sampling):
        from yeto_core.records import Completion

        return [
            [Completion(tokens=(3,), logprobs=(-0.1,), finish_reason="stop") for _ in range(n)]
            for _ in ids
        ]


class _Task:
    PLUGIN_NAME = "t"

    def prompt(self, i):
        return (f"q{i}", "a")

    def reward(self, answer, text):
        return 1.0


def test_sampler_loop_appends_a_call_as_one_group_commit():
    buf = _BatchBuffer()
    loop = SamplerLoop(buf, _Engine(), _Task(), host="s", incarnation=0, prompts_per_call=8)
    assert loop.run_round() == list(range(8))
    assert buf.calls == [8]


def test_dir_store_put_many_overwrites_and_syncs_each_directory_once(tmp_path, monkeypatch):
    import yeto_core.stores.dir_store as ds

    store = DirStore(tmp_path / "s")
    store.put("r/1/a", b"old")
    dirs = []
    real = ds.fsync_dir
    monkeypatch.setattr(ds, "fsync_dir", lambda d: (dirs.append(str(d)), real(d)))
    store.put_many([("r/1/a", b"new"), ("r/1/b", b"2"), ("r/1/c", b"3")])
    assert [store.get(k) for k in ("r/1/a", "r/1/b", "r/1/c")] == [b"new", b"2", b"3"]
    assert dirs == [str(tmp_path / "s" / "r" / "1")]
    assert not [p for p in (tmp_path / "s" / "r" / "1").iterdir() if p.name.startswith(".")]


def test_the_chaos_bench_damages_only_its_target_group_of_a_pack(tmp_path):
    import types

    from yeto_bench.chaos_faults import _corrupt_payload

    store = DirStore(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="jsonl")
    buf.append_many([group(i) for i in range(12)])
    rec = _corrupt_payload(types.SimpleNamespace(store=store, rng=random.Random(3)))
    bad = rec["position"]
    for e in buf.entries():
        if e.position == bad:
            with pytest.raises(SampleBufferError, match="does not match the digest"):
                buf.load(e)
        else:
            assert buf.load(e).group_id == e.group_id
