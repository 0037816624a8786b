"""Store requests on a remote (S3-like) store: what a round costs in requests and round trips.

``RemoteDir`` is a directory store that looks remote (no local files, no watch),
as an ``s3://`` store does, and counts every request. A ``gate`` makes its
``get`` wait until that many gets are in flight at once: reads made one after
another never get there (the barrier breaks after its timeout and the test
fails), reads that overlap pass at once. Counts and overlap only, never timings.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Any, Optional

import pytest

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fakes import Clock, RemoteLookingDirStore
from yeto_core.testing.groups import build_group

G = 4


class RemoteDir(RemoteLookingDirStore):
    """A dir store seen as remote, counting requests; :meth:`gate` makes some wait for others."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.calls: collections.Counter[str] = collections.Counter()
        self._count_lock = threading.Lock()
        self._barrier: Optional[threading.Barrier] = None
        self._gated: tuple[tuple[str, str], ...] = ()

    def gate(self, parties: int, *under: str, ops: tuple[str, ...] = ("get",)) -> None:
        """Requests: ``ops[i]`` of keys under ``under[i]`` (one op: for all) wait until
        ``parties`` of them are in flight."""
        ops = ops * len(under) if len(ops) == 1 else ops
        self._barrier = threading.Barrier(parties, timeout=20)
        self._gated = tuple(zip(ops, under, strict=True))

    def _enter(self, op: str, key: str) -> None:
        with self._count_lock:
            self.calls[op] += 1
        gated = any(op == o and key.startswith(u) for o, u in self._gated)
        if self._barrier is not None and gated:
            self._barrier.wait()  # BrokenBarrierError when the requests do not overlap

    def get(self, key: str) -> bytes:
        self._enter("get", key)
        return super().get(key)

    def exists(self, key: str) -> bool:
        self._enter("exists", key)
        return super().exists(key)

    def list(self, prefix: str = "", after: Optional[str] = None) -> Any:
        self._enter("list", prefix)
        return super().list(prefix, after)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._enter("put_if_absent", key)
        return super().put_if_absent(key, data)


def group(i: int, version: int = 0):
    return build_group(f"g{i}", n=G, host="h", prompt_id=f"p{i}", version=version)


def test_new_index_records_are_read_with_overlapping_gets(tmp_path):
    store = RemoteDir(tmp_path / "s")
    writer = FileSampleBuffer(store, layout="objects")
    for i in range(8):
        writer.append(group(i))
    reader = FileSampleBuffer(store, layout="objects", read_only=True)  # read at open
    store.gate(4, "buffer/index/")
    for i in range(8, 16):
        writer.append(group(i))
    store.calls.clear()
    assert reader.head_position == 16  # 8 new records: gets overlap 4 at a time
    assert store.calls["get"] == 8 and store.calls["list"] == 1


def test_a_round_s_payloads_are_loaded_with_overlapping_gets(tmp_path):
    store = RemoteDir(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects")
    for i in range(8):
        buf.append(group(i))
    clock = Clock()
    r = BatchReader(
        buf,
        group_size=G,
        groups_per_round=8,
        max_policy_age=2,
        wait_s=10.0,
        poll_s=1.0,
        clock=clock,
        sleep=clock.sleep,
    )
    store.gate(8, "buffer/groups/")
    batch = r.try_take(0)
    assert batch is not None and [g.group_id for g in batch.groups] == [f"g{i}" for i in range(8)]


def test_a_failed_payload_read_is_that_group_s_skip_in_order(tmp_path):
    store = RemoteDir(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects")
    for i in range(4):
        buf.append(group(i))
    store.delete(buf.payload_key("g1"))  # its payload is gone: skipped, the others train
    clock = Clock()
    r = BatchReader(
        buf,
        group_size=G,
        groups_per_round=3,
        max_policy_age=2,
        wait_s=10.0,
        poll_s=1.0,
        clock=clock,
        sleep=clock.sleep,
    )
    batch = r.try_take(0)
    assert batch is not None
    assert [g.group_id for g in batch.groups] == ["g0", "g2", "g3"]
    assert list(batch.skipped["unconvertible"]) == [1]


@pytest.mark.parametrize("fail_at", [0, 5])
def test_a_failed_index_read_leaves_the_cursor_for_the_retry(tmp_path, fail_at):
    store = RemoteDir(tmp_path / "s")
    writer = FileSampleBuffer(store, layout="objects")
    reader = FileSampleBuffer(store, layout="objects", read_only=True)
    for i in range(8):
        writer.append(group(i))
    real_get = DirStore.get
    seen = []

    def flaky(self, key):
        seen.append(key)
        if key.endswith(f"{fail_at:012d}.json") and seen.count(key) == 1:
            raise OSError(5, "injected read error")
        return real_get(self, key)

    DirStore.get = flaky  # type: ignore[method-assign]
    try:
        with pytest.raises(OSError):
            _ = reader.head_position
        assert reader.head_position == 8  # nothing skipped, nothing read twice into the head
    finally:
        DirStore.get = real_get  # type: ignore[method-assign]
    assert [e.position for e in reader.entries()] == list(range(8))


def test_the_counting_wrapper_names_the_stage_of_each_request(tmp_path):
    from yeto_bench.faulty_store import FaultyStore
    from yeto_core.stage_profile import PROFILE, stage
    from yeto_core.stores.parallel import get_all

    store = FaultyStore(DirStore(tmp_path, fsync=False), rate=0.0, remote=True)
    for i in range(3):
        store.put(f"k/{i}", b"x")
    before = dict(PROFILE.snapshot()["counters"])
    with stage("outer"), stage("inner"):
        assert get_all(store, ["k/0", "k/1", "k/2"]) == [b"x"] * 3  # in worker threads
    store.exists("k/0")
    after = PROFILE.snapshot()["counters"]

    def added(name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    assert added("store@inner.get") == 3 and added("store@outer.get") == 0
    assert added("store@-.exists") == 1


def test_a_sampler_call_s_payloads_go_with_overlapping_puts_records_in_order(tmp_path):
    store = RemoteDir(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects", packs=False)  # one object per group
    gate = threading.Barrier(8, timeout=20)
    real = store.put_if_absent

    def put_if_absent(key: str, data: bytes) -> bool:
        if key.startswith("buffer/groups/"):
            gate.wait()  # BrokenBarrierError when the payload puts do not overlap
        return real(key, data)

    store.put_if_absent = put_if_absent  # type: ignore[method-assign]
    store.calls.clear()
    assert buf.append_many([group(i) for i in range(8)]) == list(range(8))
    assert store.calls["put_if_absent"] == 9  # 8 payloads + 1 index object, nothing more
    assert list(store.list("buffer/index/")) == ["buffer/index/000000000000.json"]
    store.put_if_absent = real  # type: ignore[method-assign]
    assert buf.append_many([group(i) for i in range(10)]) == list(range(10))  # dedup
    reader = FileSampleBuffer(store, layout="objects", read_only=True)
    assert [e.group_id for e in reader.entries()] == [f"g{i}" for i in range(10)]


def _crash_at_index_put(store: RemoteDir, after: int):
    """Make the store's index ``put_if_absent`` calls fail after ``after`` of them."""
    real = store.put_if_absent
    made: list[str] = []

    def put_if_absent(key: str, data: bytes) -> bool:
        if key.startswith("buffer/index/") and len(made) == after:
            raise OSError(5, "the sampler died here")
        if key.startswith("buffer/index/"):
            made.append(key)
        return real(key, data)

    store.put_if_absent = put_if_absent  # type: ignore[method-assign]
    return real


@pytest.mark.parametrize("chunk", [None, 3])
def test_a_crash_between_payloads_and_records_leaves_whole_objects_then_dedups(
    tmp_path, monkeypatch, chunk
):
    """A call's records are one index object (``chunk``: objects of 3 records): a crash
    before or between its index puts leaves whole objects, in order; the restarted
    sampler's same call appends the rest once."""
    if chunk is not None:
        monkeypatch.setattr("yeto_core.buffer.sample_buffer.append.OBJECTS_BATCH_RECORDS", chunk)
    store = RemoteDir(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects")
    real = _crash_at_index_put(store, after=0 if chunk is None else 1)
    with pytest.raises(OSError):
        buf.append_many([group(i) for i in range(8)])
    store.put_if_absent = real  # type: ignore[method-assign]
    reader = FileSampleBuffer(store, layout="objects", read_only=True)
    seen = [e.group_id for e in reader.entries()]
    assert seen == ([] if chunk is None else ["g0", "g1", "g2"])  # whole objects only
    again = FileSampleBuffer(store, layout="objects")  # the restarted sampler
    assert again.append_many([group(i) for i in range(8)]) == list(range(8))
    entries = FileSampleBuffer(store, layout="objects", read_only=True).entries()
    assert [e.group_id for e in entries] == [f"g{i}" for i in range(8)]
    for e in entries:
        assert again.load(e).group_id == e.group_id  # each record names its payload's bytes


def test_a_backlog_reads_consumed_index_and_data_end_in_one_round_trip(tmp_path):
    store = RemoteDir(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects")
    for i in range(4):
        buf.append(group(i))
    head = FileSampleBuffer(store, layout="objects", read_only=True)
    buf.append(group(4))
    store.gate(
        3,
        "buffer/consumed.json",
        "buffer/index/",
        "buffer/DATA_END",
        ops=("get", "list", "exists"),
    )
    store.calls.clear()
    b = head.backlog()
    assert (b.groups, b.head_position, b.data_ended) == (5, 5, False)
    # consumed.json (absent: one get), one listing, DATA_END, the one new record
    assert store.calls == {"get": 2, "list": 1, "exists": 1}
    store.gate(2, "buffer/consumed.json", "buffer/index/", ops=("get", "list"))
    buf.mark_data_end()
    store.calls.clear()
    assert head.backlog().data_ended and head.backlog().data_ended
    assert store.calls["exists"] == 1  # DATA_END stays seen


def test_the_ledger_lists_only_after_its_newest_key_and_still_sees_another_writer(tmp_path):
    import attrs

    from yeto_core.buffer.ledger import BatchLedger, LedgerError

    store = RemoteDir(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects")
    for i in range(8):
        buf.append(group(i))
    clock = Clock()
    r = BatchReader(buf, group_size=G, groups_per_round=2, max_policy_age=9, clock=clock)
    ledger = BatchLedger(store, clock=lambda: 0.0)
    listed: list[Optional[str]] = []
    real_list = store.list

    def spy(prefix: str = "", after: Optional[str] = None) -> Any:
        if prefix.startswith("ledger/"):
            listed.append(after)
        return real_list(prefix, after)

    store.list = spy  # type: ignore[method-assign]
    for seq in (1, 2, 3):
        batch = r.take(0)
        store.calls.clear()
        ledger.record(batch, seq=seq, incarnation=1, parent_cut=None)
        # one listing after the newest key, no get of the last record, one create
        assert store.calls == {"list": 1, "put_if_absent": 1}
        r.commit(batch)
    assert listed == [None, "ledger/rounds/000000000001.json", "ledger/rounds/000000000002.json"]
    other = BatchLedger(store, clock=lambda: 0.0)  # another trainer wrote round 4
    batch = r.take(0)
    other.record(batch, seq=4, incarnation=2, parent_cut=None)
    with pytest.raises(LedgerError, match="comes after round 4"):
        ledger.record(attrs.evolve(batch), seq=4, incarnation=1, parent_cut=None)


def test_a_take_reads_consumed_json_once_per_select(tmp_path):
    store = RemoteDir(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects")
    for i in range(4):
        buf.append(group(i))
    clock = Clock()
    r = BatchReader(buf, group_size=G, groups_per_round=2, max_policy_age=9, clock=clock)
    consumed = []
    real_get = store.get

    def spy(key: str) -> bytes:
        if key.endswith("consumed.json"):
            consumed.append(key)
        return real_get(key)

    store.get = spy  # type: ignore[method-assign]
    batch = r.try_take(0)
    assert batch is not None and batch.watermark_before == 0
    # the take's own read and its select's (the batch's watermark_before is that one)
    assert len(consumed) == 2


def test_a_channel_poll_is_one_get_of_the_next_message_not_a_listing(tmp_path):
    from yeto_core.trainer.lifecycle.remote import Channel

    store = RemoteDir(tmp_path / "s")
    head, trainer = Channel(store, 3, "commands"), Channel(store, 3, "commands")
    store.calls.clear()
    for _ in range(3):
        assert trainer.receive() == []
    assert store.calls == {"get": 3}  # a miss each, no listing
    head.send({"op": "train", "rounds": 1})
    head.send({"op": "train", "rounds": 2})
    store.calls.clear()
    assert [m["rounds"] for m in trainer.receive()] == [1, 2]
    assert store.calls == {"get": 3}  # the two messages and the miss after them
    assert trainer.receive() == []
    late = Channel(store, 3, "commands")  # a reader that starts late reads them all
    assert [m["seq"] for m in late.receive()] == [0, 1]


def test_a_poll_that_rides_out_failures_and_finds_nothing_is_reported_survived(tmp_path):
    """A channel poll is a ``get`` of a key not written yet: after failures, the store's
    'not found' is its answer, so the outage it rode out is reported like any other."""
    import errno

    from yeto_core.errors import NotFoundError
    from yeto_core.stores.retrying import RetryingStore

    d = DirStore(tmp_path / "s", fsync=False)
    fails = {"n": 2}
    real_get = d.get

    def get(key: str) -> bytes:
        if fails["n"]:
            fails["n"] -= 1
            raise OSError(errno.EIO, "Input/output error")
        return real_get(key)

    d.get = get  # type: ignore[method-assign]
    store = RetryingStore(d, sleep=lambda s: None)
    with pytest.raises(NotFoundError):
        store.get("trainer/0/commands/00000000.json")
    (rep,) = store.take_reports()
    assert rep["op"] == "get" and rep["attempts"] == 2 and "Input/output" in rep["last_error"]
    with pytest.raises(NotFoundError):
        store.get("trainer/0/commands/00000000.json")
    assert store.take_reports() == []  # a plain miss is no outage


def test_a_restore_seen_by_an_overlapped_update_re_reads_the_index_once(tmp_path):
    from yeto_core.records import RoundSpec

    store = RemoteDir(tmp_path / "s")
    trainer = FileSampleBuffer(store, layout="objects")
    for i in range(6):
        trainer.append(group(i))
    head = FileSampleBuffer(store, layout="objects", read_only=True)
    trainer.commit(trainer.select(RoundSpec(max_groups=4, current_version=0, max_policy_age=9)))
    assert (head.backlog().groups, head.watermark) == (2, 4)
    trainer.reset_to(1)  # a restore: the watermark moves back
    trainer.append(group(6))
    b = head.backlog()
    assert (b.groups, b.watermark, b.head_position) == (6, 1, 7)
    assert head.head_position == 7 and head.backlog().groups == 6


def test_a_release_s_files_are_fetched_with_overlapping_gets_and_still_checked(tmp_path):
    # the follower's fetch (and a cut's restore: the same download) on a remote store
    import hashlib

    from yeto_core.errors import ReleaseError
    from yeto_core.release.store import ReleaseStore

    store = RemoteDir(tmp_path / "s")
    releases = ReleaseStore(store)
    out = tmp_path / "export"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "extra.bin"):
        (out / name).write_bytes(name.encode() * 50)
    weights = (out / "model.safetensors").read_bytes()
    rel = releases.publish(
        out,
        {"version": 1, "kind": "full", "weight_checksum": hashlib.sha256(weights).hexdigest()},
    )
    names = ("config.json", "model.safetensors", "tokenizer.json", "extra.bin")
    store.gate(4, *(f"releases/{rel.release_id}/{n}" for n in names))
    releases.fetch(rel, tmp_path / "a")  # 4 files: all 4 gets in flight at once
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == weights
    store._barrier = None
    (tmp_path / "s" / "releases" / rel.release_id / "tokenizer.json").write_bytes(b"evil" * 50)
    (tmp_path / "s" / "releases" / rel.release_id / "extra.bin").unlink()
    with pytest.raises(ReleaseError) as exc:
        releases.fetch(rel, tmp_path / "b")
    assert "tokenizer.json: sha256" in str(exc.value) and "extra.bin: missing" in str(exc.value)


class RemoteDirPuts(RemoteDir):
    """:class:`RemoteDir` whose plain ``put`` is gated and recorded too."""

    def __init__(self, root: Path, fail: str = "") -> None:
        super().__init__(root)
        self.fail, self.put_keys = fail, []

    def put(self, key: str, data: bytes) -> None:
        self._enter("put", key)
        if self.fail and key.endswith(self.fail):
            raise OSError(f"injected: {key}")
        self.put_keys.append(key)
        super().put(key, data)


def test_a_release_s_files_are_uploaded_with_overlapping_puts_before_its_manifest(tmp_path):
    # the trainer's publication (and a cut's upload: the same protocol) on a remote store:
    # the files' puts overlap (one round trip, not one per file), the manifest and the
    # pointer come after every file, and a failed file stops the release before them
    import hashlib

    from yeto_core.release.store import ReleaseStore

    names = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json")
    out = tmp_path / "export"
    out.mkdir()
    for name in names:
        (out / name).write_bytes(name.encode() * 50)
    info = {
        "version": 1,
        "kind": "full",
        "weight_checksum": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest(),
    }
    store = RemoteDirPuts(tmp_path / "s")
    store.gate(4, *(f"releases/1/{n}" for n in names), ops=("put",))
    rel = ReleaseStore(store).publish(out, info)  # sequential puts: the barrier breaks
    assert sorted(store.put_keys) == sorted(f"releases/1/{n}" for n in names)
    assert ReleaseStore(store).latest() == rel
    ReleaseStore(store).fetch(rel, tmp_path / "a")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()

    failing = RemoteDirPuts(tmp_path / "f", fail="tokenizer.json")
    with pytest.raises(OSError, match="injected"):
        ReleaseStore(failing).publish(out, info)
    assert not failing.exists("releases/1/manifest.json")
    assert ReleaseStore(failing).latest() is None


def test_on_pool_keeps_the_order_raises_the_first_error_and_runs_inline_on_the_pool():
    import threading

    from yeto_core.stores.parallel import _executor, on_pool

    names = on_pool(lambda i: (i, threading.current_thread().name), list(range(5)))
    assert [i for i, _ in names] == list(range(5))
    assert all(n.startswith("store-io") for _, n in names)  # on the process's pool
    assert on_pool(lambda i: threading.current_thread().name, [0]) == [
        threading.current_thread().name
    ]  # one item: inline

    def boom(i):
        if i == 2:
            raise ValueError(i)
        return i

    with pytest.raises(ValueError):
        on_pool(boom, [0, 1, 2, 3])
    # a pool thread that calls it runs the items itself (no wait on its own pool)
    inner = _executor().submit(lambda: on_pool(lambda i: threading.current_thread().name, [0, 1]))
    me = inner.result(timeout=10)
    assert len(set(me)) == 1 and me[0].startswith("store-io")


@pytest.mark.parametrize("fresh", [None, (2, 8)])
def test_a_samplers_backlog_reads_never_ask_for_the_data_end(tmp_path, fresh):
    """A sampler sizes its calls by the backlog and never acts on the data end (the head
    stops it): its reads are consumed.json, the index listing and the new records, not a
    DATA_END request each (one read in three on SeaweedFS, every call of every island)."""
    from yeto_core.testing.fakes import digits_sampler

    store = RemoteDir(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects", host="h")
    loop = digits_sampler(buf, backlog_cap=64, fresh_only=fresh, share_of=1)
    store.calls.clear()
    assert loop.claim_room()[0] >= 4  # the decision reads the backlog itself
    assert len(loop.run_round()) == 4  # and the read ahead, on a copy, while it appends
    assert loop._backlog_ahead is not None
    loop._backlog_ahead[0].result()
    loop.claim_room()
    assert store.calls["list"] >= 2 and store.calls["exists"] == 0
    head = FileSampleBuffer(store, layout="objects", read_only=True)
    buf.mark_data_end()
    assert head.backlog().data_ended  # what acts on the data end still reads it


def test_a_follower_fetches_the_release_its_pointer_names_without_its_manifest(tmp_path):
    """LATEST.json holds the release's manifest bytes: a follower's load is the pointer's
    get and the files' gets (checked against it), not a second read of the manifest."""
    import hashlib

    from yeto_core.errors import ReleaseError
    from yeto_core.release.store import ReleaseStore

    store = RemoteDir(tmp_path / "s")
    publisher, follower = ReleaseStore(store), ReleaseStore(store)
    out = tmp_path / "export"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"w" * 64)
    checksum = hashlib.sha256(b"w" * 64).hexdigest()
    publisher.publish(out, {"version": 1, "kind": "full", "weight_checksum": checksum})
    store.calls.clear()
    rel = follower.latest()
    assert rel is not None
    follower.fetch(rel, tmp_path / "a")
    assert store.calls == {"get": 2}  # the pointer and the one file
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == b"w" * 64
    (tmp_path / "s" / "releases" / "1" / "model.safetensors").write_bytes(b"x" * 64)
    with pytest.raises(ReleaseError):  # still checked against the pointer's digests
        follower.fetch(rel, tmp_path / "b")


def test_a_samplers_cursors_fetch_each_index_object_once_and_never_their_own(tmp_path):
    """Index objects are immutable: a sampler's appender, its reader and the copy that
    reads the backlog ahead share what any of them read or created. Two samplers append a
    call each, twice; each reads the backlog through both its buffer and its copy."""
    store = RemoteDir(tmp_path / "s")
    gets: list[str] = []
    real_get = store.get

    def spy(key: str) -> bytes:
        if key.startswith("buffer/index/"):
            gets.append(key)
        return real_get(key)

    store.get = spy  # type: ignore[method-assign]
    a = FileSampleBuffer(store, layout="objects", host="a")
    b = FileSampleBuffer(store, layout="objects", host="b")
    copies = {a: a.reader_copy(), b: b.reader_copy()}
    made: dict[FileSampleBuffer, set[str]] = {a: set(), b: set()}
    for n in range(2):
        for buf in (a, b):
            first = buf.append_many([group(100 * n + 10 * (buf is b) + i) for i in range(4)])[0]
            made[buf].add(f"buffer/index/{first:012d}.json")
    for buf in (a, b):
        gets.clear()
        assert buf.backlog().groups == 16 and copies[buf].backlog().groups == 16
        assert not set(gets) & made[buf]  # its own objects: never fetched
        assert len(gets) == len(set(gets))  # the other's: once for both cursors


def test_the_whole_index_read_for_the_summary_fetches_only_what_was_not_read(tmp_path):
    """The head's summary reads every entry (O(history)); the objects its backlog reads
    already fetched are not fetched again."""
    store = RemoteDir(tmp_path / "s")
    writer = FileSampleBuffer(store, layout="objects", host="a")
    for n in range(3):
        writer.append_many([group(10 * n + i) for i in range(4)])
    head = FileSampleBuffer(store, layout="objects", read_only=True)
    assert head.backlog().groups == 12
    writer.append_many([group(99)])
    store.calls.clear()
    assert [e.group_id for e in head.entries()][-1] == "g99"
    assert store.calls == {"list": 1, "get": 1}  # the listing and the one new object


def test_an_appender_that_lost_the_race_reads_the_winners_object_without_a_listing(tmp_path):
    store = RemoteDir(tmp_path / "s")
    a = FileSampleBuffer(store, layout="objects")
    b = FileSampleBuffer(store, layout="objects")
    b.append_many([group(i) for i in range(4)])
    a.append_many([group(i) for i in range(4, 8)])  # b does not know it: b's next try loses
    store.calls.clear()
    assert b.append_many([group(i) for i in range(8, 12)]) == [8, 9, 10, 11]
    # the lost put, the winner's object (a get at the position tried), the put that wins
    assert store.calls["list"] == 0, store.calls
    assert store.calls["put_if_absent"] == 3 and store.calls["get"] == 1, store.calls  # + pack
    reader = FileSampleBuffer(store, layout="objects", read_only=True)
    assert [e.group_id for e in reader.entries()] == [f"g{i}" for i in range(12)]
    # the same group again from b after a's append of it: found in a's object, not twice
    a.append_many([group(i) for i in range(12, 14)])
    assert b.append_many([group(12), group(14)]) == [12, 14]
