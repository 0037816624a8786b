"""The trainer reads the next round's payloads while it trains (``prefetch``, remote stores).

A store that looks remote records the keys it is asked for: after ``prefetch`` of the
next round's positions, taking that round reads no payload, and the bytes read ahead
are checked as a load checks them (a damaged payload is still refused). Counts, never
timings.
"""

from __future__ import annotations

import threading
from pathlib import Path

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.stage_profile import PROFILE
from yeto_core.testing.fakes import Clock, RemoteLookingDirStore
from yeto_core.testing.groups import build_group

G = 4


class Remote(RemoteLookingDirStore):
    """A dir store seen as remote (no local files), recording the keys it reads."""

    def __init__(self, root: Path, *, remote: bool = True) -> None:
        super().__init__(root, remote=remote)
        self.got: list[str] = []
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes:
        with self._lock:
            self.got.append(key)
        return super().get(key)

    def payload_gets(self) -> list[str]:
        with self._lock:
            return [k for k in self.got if k.startswith("buffer/groups/")]


def _setup(tmp_path, *, remote: bool = True, n: int = 24):
    store = Remote(tmp_path / "s", remote=remote)
    # one payload object per group (packs=False): each group's read is seen on its own
    writer = FileSampleBuffer(store, layout="objects", packs=False)
    writer.append_many([build_group(f"g{i}", n=G, host="h", prompt_id=f"p{i}") for i in range(n)])
    buf = FileSampleBuffer(store, layout="objects")
    clock = Clock()
    reader = BatchReader(
        buf,
        group_size=G,
        groups_per_round=8,
        max_policy_age=4,
        wait_s=10.0,
        poll_s=1.0,
        clock=clock,
        sleep=clock.sleep,
    )
    return store, buf, reader


def _join(buf: FileSampleBuffer, *, stop: bool = True) -> None:
    """Wait for the read-ahead (``stop``: after its current index read; else until it
    has a round or gives up)."""
    thread = buf._ahead_thread
    assert thread is not None, "prefetch started no read-ahead"
    if stop:
        buf._stop_ahead()
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_the_next_round_s_payloads_are_read_while_this_one_trains(tmp_path):
    store, buf, reader = _setup(tmp_path)
    first = reader.try_take(0)
    assert first is not None and first.watermark == 8
    buf.prefetch(first.watermark, 8)  # what the trainer does before it trains `first`
    _join(buf)
    assert sorted(store.payload_gets()[-8:]) == sorted(
        buf.payload_key(f"g{i}") for i in range(8, 16)
    )
    reader.commit(first)
    store.got.clear()
    second = reader.try_take(1)
    assert second is not None
    assert [g.group_id for g in second.groups] == [f"g{i}" for i in range(8, 16)]
    assert store.payload_gets() == []  # every payload came from the read-ahead
    reader.commit(second)
    third = reader.try_take(2)  # nothing read ahead: read as before
    assert third is not None and [g.group_id for g in third.groups] == [
        f"g{i}" for i in range(16, 24)
    ]
    assert len(store.payload_gets()) == 8


def test_a_payload_damaged_before_it_was_read_ahead_is_still_refused(tmp_path):
    store, buf, reader = _setup(tmp_path)
    key = buf.payload_key("g9")
    raw = bytearray(store.get(key))
    raw[-1] ^= 0x01
    store.put(key, bytes(raw))
    first = reader.try_take(0)
    assert first is not None
    buf.prefetch(first.watermark, 8)
    _join(buf)
    reader.commit(first)
    second = reader.try_take(1, short_ok=True)
    assert second is not None
    assert 9 not in second.positions
    assert list(second.skipped["unconvertible"]) == [9]  # checked against its digest


def test_on_a_local_store_nothing_is_read_ahead(tmp_path):
    store, buf, reader = _setup(tmp_path, remote=False)
    first = reader.try_take(0)
    assert first is not None
    before = len(store.payload_gets())
    buf.prefetch(first.watermark, 8)
    assert buf._ahead_thread is None
    assert len(store.payload_gets()) == before


def _driver_run(root: Path, *, remote: bool, packs: bool = False, call: int = 20):
    """A trainer (DriverLifecycle, fake backend) over 5 rounds of 4 groups on ``root``
    (appended in calls of ``call`` groups; ``packs``: each call's payloads are a pack)."""
    from yeto_core.release.store import ReleaseStore
    from yeto_core.testing.fake_backend import FakeBackend, make_group
    from yeto_core.trainer.cut import CutStore
    from yeto_core.trainer.lifecycle import DriverLifecycle

    store = Remote(root / "store", remote=remote)
    writer = FileSampleBuffer(store, layout="objects", packs=packs)
    for lo in range(0, 20, call):
        writer.append_many([make_group(i, 0, g=G, seed=5) for i in range(lo, lo + call)])
    buf = FileSampleBuffer(store, layout="objects", host="trainer")
    calls: list[tuple[int, int]] = []
    real = buf.prefetch

    def prefetch(start: int, n: int) -> None:
        calls.append((start, n))
        real(start, n)
        if buf._ahead_thread is not None:
            buf._stop_ahead()  # (after the index read it is in)
            buf._ahead_thread.join(timeout=30)  # the round "trains" until it is read

    buf.prefetch = prefetch  # type: ignore[method-assign]
    lc = DriverLifecycle(
        lambda inc: FakeBackend(seed=3),
        buf,
        CutStore(store, keep=10),
        ReleaseStore(store),
        groups_per_round=4,
        max_policy_age=100,
        workdir=root / "work",
        group_size=G,
        vocab_size=100,
    )
    lc.start(0)
    store.got.clear()
    hits = PROFILE.snapshot()["counters"].get("buffer.prefetch_hit", 0)
    assert lc.train(5) == 5
    hits = PROFILE.snapshot()["counters"].get("buffer.prefetch_hit", 0) - hits
    return lc.backend, calls, store.payload_gets(), hits


def test_the_trainer_reads_each_next_round_ahead_and_trains_the_same(tmp_path):
    """The driver asks for the next round before each round trains: on a remote store
    only the first round's payloads are read by a take, and the trained state is
    bitwise the one of the same run on a local store (nothing read ahead there)."""
    remote, calls, gets, hits = _driver_run(tmp_path / "remote", remote=True)
    local, local_calls, _, local_hits = _driver_run(tmp_path / "local", remote=False)
    assert calls == [(4, 4), (8, 4), (12, 4), (16, 4), (20, 4)] == local_calls
    # each payload read once: 4 by the first take, 16 ahead (the last read-ahead finds
    # nothing after position 20), and rounds 2-5 loaded all 16 from what was read ahead
    assert len(gets) == 20 and len(set(gets)) == 20
    assert hits == 16 and local_hits == 0
    assert remote.params.tobytes() == local.params.tobytes()
    assert remote.trained_groups == local.trained_groups


def _first_round_taken(tmp_path):
    """A remote-looking store holding one round (g0-g7) appended by a writer, and a
    trainer's reader that took and committed it (its own state from here on)."""
    store = Remote(tmp_path / "s")
    writer = FileSampleBuffer(store, layout="objects", host="w", packs=False)
    writer.append_many([build_group(f"g{i}", n=G, host="h", prompt_id=f"p{i}") for i in range(8)])
    buf = FileSampleBuffer(store, layout="objects", host="trainer")
    clock = Clock()
    reader = BatchReader(
        buf, group_size=G, groups_per_round=8, max_policy_age=4, clock=clock, sleep=clock.sleep
    )
    first = reader.try_take(0)
    assert first is not None
    reader.commit(first)
    return store, writer, buf, reader, first


def test_index_records_appended_while_a_round_trains_are_read_ahead(tmp_path):
    """The read-ahead first reads the index records appended since the last read; the
    next select finds its whole round there and reads nothing from the store."""
    store, writer, buf, reader, first = _first_round_taken(tmp_path)
    # a sampler appends the next round after the select read the index
    writer.append_many(
        [build_group(f"g{i}", n=G, host="h", prompt_id=f"p{i}") for i in range(8, 16)]
    )
    buf.prefetch(first.watermark, 8)
    _join(buf)
    assert sorted(store.payload_gets()[-8:]) == sorted(
        buf.payload_key(f"g{i}") for i in range(8, 16)
    )
    store.got.clear()
    before = PROFILE.snapshot()["counters"].get("buffer.select_read_ahead", 0)
    second = reader.try_take(1)
    assert second is not None and [g.group_id for g in second.groups] == [
        f"g{i}" for i in range(8, 16)
    ]
    assert store.got == []  # no listing, no consumed.json, no index object, no payload
    assert PROFILE.snapshot()["counters"].get("buffer.select_read_ahead", 0) == before + 1
    assert reader.commit(second) == 16


def test_a_round_the_read_ahead_did_not_fill_is_read_from_the_store(tmp_path):
    store, writer, buf, reader, first = _first_round_taken(tmp_path)
    buf.prefetch(first.watermark, 8)  # nothing appended yet: no round read ahead
    _join(buf)
    writer.append_many(
        [build_group(f"g{i}", n=G, host="h", prompt_id=f"p{i}") for i in range(8, 16)]
    )
    store.got.clear()
    second = reader.try_take(1)
    assert second is not None and len(second.groups) == 8
    assert "buffer/index/000000000008.json" in store.got  # the select read the index


def test_groups_appended_after_the_read_ahead_s_first_index_read_are_read_ahead_too(tmp_path):
    """A read-ahead that found less than a round reads the index again until it has one
    (or the take comes): the groups appended while the round trains are read off the
    trainer's path, and the take reads nothing."""
    store, writer, buf, reader, first = _first_round_taken(tmp_path)
    buf.prefetch(first.watermark, 8)  # nothing appended yet
    for _ in range(3000):  # its first index read found nothing
        if buf._ahead_keys is not None:
            break
        threading.Event().wait(0.01)
    assert buf._ahead_keys == frozenset()
    writer.append_many(
        [build_group(f"g{i}", n=G, host="h", prompt_id=f"p{i}") for i in range(8, 16)]
    )
    _join(buf, stop=False)  # it ends once it holds the round
    store.got.clear()
    second = reader.try_take(1)
    assert second is not None and [g.group_id for g in second.groups] == [
        f"g{i}" for i in range(8, 16)
    ]
    assert store.got == []  # no listing, no index object, no payload on the take's path


def test_with_packs_the_trainer_reads_each_pack_once(tmp_path):
    """Calls of 4 groups and rounds of 4: one pack read per round. Calls of 10: a pack
    spans three rounds and is still read once (the read-ahead and the loads keep the
    last packs read), and the trained state is bitwise the one of the same run on a
    local store."""
    remote, calls, gets, _hits = _driver_run(tmp_path / "remote", remote=True, packs=True, call=4)
    assert len(gets) == 5 and len(set(gets)) == 5  # calls of 4: one pack a round
    remote, calls, gets, _hits = _driver_run(tmp_path / "r8", remote=True, packs=True, call=10)
    local, _, _, _ = _driver_run(tmp_path / "local", remote=False, packs=True, call=10)
    assert len(gets) == 2 and len(set(gets)) == 2 and all("/pack-" in k for k in gets)
    assert remote.params.tobytes() == local.params.tobytes()
    assert remote.trained_groups == local.trained_groups
