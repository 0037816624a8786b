"""One writer per role, enforced by the store: compare-and-swap on consumed.json and on the
LATEST pointers of cuts and releases (a writer that lost the race writes nothing)."""

from __future__ import annotations

import numpy as np
import pytest

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.errors import CutError, ReleaseError, SampleBufferError
from yeto_core.records import RoundSpec, Sample, SampleGroup, Trigger
from yeto_core.release.store import ReleaseStore
from yeto_core.trainer.cut import ConsistentCut, CutStore


@pytest.fixture
def store(any_store):
    return any_store


def _group(i: int) -> SampleGroup:
    s = tuple(
        Sample(
            tokens=np.arange(5, dtype=np.int32),
            prompt_len=2,
            logprobs=np.zeros(3, dtype=np.float32),
            loss_mask=np.ones(3, dtype=np.uint8),
            reward=float(k),
            weight_version=0,
        )
        for k in range(2)
    )
    return SampleGroup(f"g{i}", f"p{i}", "h1", 0, s, task="echo")


class Interloper:
    """Lets another writer act once, just before the next conditional write of ``key``."""

    def __init__(self, store, key, act):
        self.store, self.key, self.act, self.done = store, key, act, False
        self._inner = store.put_if_match

    def __enter__(self):
        def put_if_match(key, data, version):
            if key == self.key and not self.done:
                self.done = True
                self.act()
            return self._inner(key, data, version)

        self.store.put_if_match = put_if_match
        return self

    def __exit__(self, *exc):
        self.store.put_if_match = self._inner


def test_a_second_trainer_committing_the_buffer_is_refused_and_writes_nothing(store):
    buf = FileSampleBuffer(store, layout="objects")
    for i in range(6):
        buf.append(_group(i))
    a = FileSampleBuffer(store, layout="objects")
    b = FileSampleBuffer(store, layout="objects")
    ra = a.select(RoundSpec(2, 0, 5))
    rb = b.select(RoundSpec(2, 0, 5))
    with Interloper(store, "buffer/consumed.json", lambda: a.commit(ra)):
        with pytest.raises(SampleBufferError, match="changed in the store"):
            b._refresh_state = lambda: None  # b read before a committed (a stale view)
            b.commit(rb)
    assert FileSampleBuffer(store, layout="objects", read_only=True).watermark == 2


def _record(inc):
    return ConsistentCut(
        trigger=Trigger.SCHEDULED,
        policy_version=1,
        trained_rounds=1,
        buffer_watermark=4,
        incarnation=inc,
    )


def test_a_cut_whose_pointer_moved_meanwhile_is_refused_and_removed(store, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "w.bin").write_bytes(b"one")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "w.bin").write_bytes(b"two")
    mine, other = CutStore(store), CutStore(store)
    with Interloper(store, "cuts/LATEST", lambda: other.commit(tmp_path / "b", _record(2))):
        with pytest.raises(CutError, match="changed while cut"):
            mine.commit(tmp_path / "a", _record(1))
    latest = CutStore(store).latest_id()
    assert latest is not None and latest.endswith("-i2-scheduled")
    assert [c.incarnation for c in CutStore(store).list()] == [2]


def test_a_release_whose_pointer_moved_meanwhile_is_refused(store, tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(name.encode())
    mine, other = ReleaseStore(store), ReleaseStore(store)
    info = {"kind": "full", "weight_checksum": "sha256:b", "version": 1}

    def rival():
        other.publish(tmp_path / "b", info)

    with Interloper(store, "releases/LATEST.json", rival):
        with pytest.raises(ReleaseError, match="changed while release"):
            mine.publish(tmp_path / "a", {**info, "weight_checksum": "sha256:a"})
    assert ReleaseStore(store).latest().weight_checksum == "sha256:b"


def test_a_dir_writer_paused_inside_a_swap_blocks_nobody_and_never_wins_back(tmp_path):
    """The dir store's swap holds no lock: a writer stopped (SIGSTOP) right after it created
    its version, before it copied it to the key's file, delays no other writer, and its late
    copy never hides the newer version."""
    import threading

    from yeto_core.stores.dir_store import DirStore

    store = DirStore(tmp_path / "s", fsync=False)
    v1 = store.put_if_match("run/lease.json", b"A1", None)
    paused, resume = threading.Event(), threading.Event()
    real = store._mirror

    def stalled(key, path, payload, *seq):
        if payload == b"A2":
            paused.set()
            resume.wait(30)
        real(key, path, payload, *seq)

    store._mirror = stalled
    t = threading.Thread(target=lambda: store.put_if_match("run/lease.json", b"A2", v1))
    t.start()
    assert paused.wait(30)
    data, v2 = store.get_versioned("run/lease.json")  # A2 is the newest version already
    assert data == b"A2"
    assert store.put_if_match("run/lease.json", b"B", v2) is not None  # not blocked
    resume.set()
    t.join(30)
    assert store.get("run/lease.json") == b"B"
    assert store.put_if_match("run/lease.json", b"stale", v1) is None
    assert list(store.list("run/")) == ["run/lease.json"]


def test_the_run_summary_survives_a_quarantined_index_line_and_a_damaged_payload(tmp_path):
    """Found by `yeto bench chaos --faults corrupt`: the head's summary loaded the first
    groups of the buffer and failed on a quarantined index line ('' is no key) or a payload
    that fails its digest, so a finished run wrote no summary and no FINISHED."""
    import math
    from pathlib import Path

    from yeto_core.head.run import Head
    from yeto_core.stores.dir_store import DirStore

    store = DirStore(tmp_path / "s", fsync=False)
    buf = FileSampleBuffer(store, layout="jsonl")
    for i in range(20):
        buf.append(_group(i))
    buf.close()
    index = Path(tmp_path / "s" / "buffer" / "index.jsonl")
    lines = index.read_bytes().split(b"\n")
    lines[0] = lines[0].replace(b'"group_id":"g0"', b'"group_id":"h0"')  # fails its checksum
    index.write_bytes(b"\n".join(lines))
    reader = FileSampleBuffer(store, layout="jsonl", read_only=True)
    entries = reader.entries(0)
    store.put(entries[1].payload, b"not a payload")

    class Fake:
        buffer = reader

    out = Head.appended_rewards(Fake())
    assert 0 not in out and math.isnan(out[1]) and len(out) == 19
