"""The trainer's round pipeline (``overlap_commits``): a round's ledger record, buffer
commit and release upload leave the round's thread, in order.

A store that looks remote counts the requests made on the trainer's critical path
(``PROFILE.path("trainer")``: the round's thread outside the optimizer step, and the
workers it waits for): with the pipeline none a round when the round was read ahead,
where the round's thread wrote the ledger record and the buffer commit itself (and
checked the data end, before). The trained
state, the ledger and the releases are the same as without the pipeline; a release
never lands before the commit of its round; a cut holds every round trained; a failed
commit fails the incarnation. Counts and orders, never timings.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from yeto_core.buffer.fences import StoreFences, write_fence
from yeto_core.buffer.ledger import BatchLedger
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.errors import StoreError
from yeto_core.records import StopReason
from yeto_core.release.store import ReleaseStore
from yeto_core.stage_profile import PROFILE
from yeto_core.testing.fake_backend import FakeBackend, make_group
from yeto_core.testing.fakes import RemoteLookingDirStore
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle, TrainerFailedError
from yeto_core.trainer.lifecycle.driver import CRITICAL_PATH

G = 4
ROUND = 4  # groups per round


class Counting(RemoteLookingDirStore):
    """Counts the requests made on the trainer's critical path (as the bench's wrapper)
    and records, in order, each buffer commit (its watermark) and each release made
    visible (its version)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.on_path: list[str] = []
        self.writes: list[tuple[str, int]] = []
        self.fail_commit_at: int | None = None  # fail the consumed.json write to this watermark
        self._lock = threading.Lock()

    def _note(self, op: str, key: str) -> None:
        if PROFILE.on_path() == CRITICAL_PATH:
            with self._lock:
                self.on_path.append(f"{op} {key}")

    def get(self, key):
        self._note("get", key)
        return super().get(key)

    def get_versioned(self, key):
        self._note("get_versioned", key)
        return super().get_versioned(key)

    def exists(self, key):
        self._note("exists", key)
        return super().exists(key)

    def list(self, prefix="", after=None):
        self._note("list", prefix)
        return super().list(prefix, after)

    def put(self, key, data):
        self._note("put", key)
        return super().put(key, data)

    def put_if_absent(self, key, data):
        self._note("put_if_absent", key)
        done = super().put_if_absent(key, data)
        if done and key.startswith("releases/") and key.endswith("/manifest.json"):
            with self._lock:
                self.writes.append(("release", int(json.loads(data)["version"])))
        return done

    def put_if_match(self, key, data, version):
        self._note("put_if_match", key)
        if key.endswith("consumed.json"):
            watermark = int(json.loads(data)["watermark"])
            if watermark == self.fail_commit_at:
                raise StoreError(f"503 Service Unavailable: put_if_match {key}")
            out = super().put_if_match(key, data, version)
            with self._lock:
                self.writes.append(("commit", watermark))
            return out
        return super().put_if_match(key, data, version)

    def released_after_commits(self) -> list[int]:
        """The versions made visible, each checked to come after its rounds' commit."""
        committed, versions = 0, []
        for kind, value in self.writes:
            if kind == "commit":
                committed = max(committed, value)
            else:
                assert committed >= value * ROUND, (value, committed, self.writes)
                versions.append(value)
        return versions


def _driver(root: Path, *, overlap_commits: bool, groups: int = 6 * ROUND):
    store = Counting(root / "store")
    writer = FileSampleBuffer(store, layout="objects", host="sampler")
    writer.append_many([make_group(i, 0, g=G, seed=5) for i in range(groups)])
    buf = FileSampleBuffer(store, layout="objects", host="trainer")
    lc = DriverLifecycle(
        lambda inc: FakeBackend(seed=3),
        buf,
        CutStore(store, keep=10),
        ReleaseStore(store),
        groups_per_round=ROUND,
        max_policy_age=100,
        workdir=root / "work",
        group_size=G,
        vocab_size=100,
        partial_last_round=True,  # as on a trainer island (a data-end check before)
        overlap_uploads=True,
        overlap_commits=overlap_commits,
    )
    return store, buf, lc


def _run(root: Path, *, overlap_commits: bool):
    store, buf, lc = _driver(root, overlap_commits=overlap_commits)
    lc.start(0)
    # the first round: what the trainer's start read (cut, ledger) is not a round's
    assert lc.train(1) == 1
    store.on_path.clear()
    assert lc.train(5) == 5
    on_path = list(store.on_path)
    cut = lc.drain(StopReason.FINISHED)
    ledger = BatchLedger(store)
    ledger.check(watermark=buf.watermark)
    records = [(r.seq, r.positions, r.watermark_before, r.watermark) for r in ledger.rounds()]
    releases = [(r.version, r.weight_checksum) for r in ReleaseStore(store).list()]
    backend = lc.backend
    lc.release()
    assert store.released_after_commits() == list(range(7))
    return on_path, cut, records, releases, backend


def test_the_round_thread_makes_no_store_request_between_steps_on_a_round_read_ahead(tmp_path):
    on_path, cut, records, releases, backend = _run(tmp_path / "on", overlap_commits=True)
    off_path, off_cut, off_records, off_releases, off_backend = _run(
        tmp_path / "off", overlap_commits=False
    )
    # 5 rounds, each read ahead while the one before trained: without the pipeline each
    # round's thread wrote its ledger record and buffer commit (2 requests a round); with
    # it those are the commit thread's and the round's thread makes none
    assert sorted({r.split()[0] for r in off_path}) == ["put_if_absent", "put_if_match"]
    assert len(off_path) == 2 * 5, off_path
    assert on_path == []
    # the same rounds, ledger, releases and weights as without the pipeline
    assert records == off_records and [r[0] for r in records] == [1, 2, 3, 4, 5, 6]
    assert releases == off_releases and [v for v, _ in releases] == list(range(7))
    assert backend.params.tobytes() == off_backend.params.tobytes()
    assert cut.trained_rounds == off_cut.trained_rounds == 6
    assert cut.buffer_watermark == off_cut.buffer_watermark == 6 * ROUND


class _GatedBuffer(FileSampleBuffer):
    """Commits of watermark > ``gate_after`` wait until the test opens the gate."""

    gate = threading.Event()
    gate_after = 2 * ROUND

    def commit(self, round):
        if round.end > self.gate_after:
            assert type(self).gate.wait(30)
        return super().commit(round)


def test_the_next_round_trains_while_a_commit_is_in_flight_and_its_release_waits(tmp_path):
    store = Counting(tmp_path / "store")
    writer = FileSampleBuffer(store, layout="objects", host="sampler")
    writer.append_many([make_group(i, 0, g=G, seed=5) for i in range(5 * ROUND)])
    buf = _GatedBuffer(store, layout="objects", host="trainer")
    fourth = threading.Event()

    class Backend(FakeBackend):
        def train_round(self, batch):
            out = super().train_round(batch)
            if self.rounds == 4:
                fourth.set()
            return out

    lc = DriverLifecycle(
        lambda inc: Backend(seed=3),
        buf,
        CutStore(store, keep=10),
        ReleaseStore(store),
        groups_per_round=ROUND,
        max_policy_age=100,
        workdir=tmp_path / "work",
        group_size=G,
        vocab_size=100,
        overlap_commits=True,
    )
    lc.start(0)
    # round 3's commit waits at the gate: round 4 is taken and trained meanwhile (its
    # release waits for release 3, which waits for that commit), and release 3 is not
    # uploaded
    trained = threading.Thread(target=lambda: lc.train(4), daemon=True)
    trained.start()
    assert fourth.wait(30)  # round 4 trained
    assert FileSampleBuffer(store, layout="objects", read_only=True).watermark == 2 * ROUND
    assert ReleaseStore(store).latest().version == 2  # release 3 waits for its commit
    _GatedBuffer.gate.set()
    trained.join(30)
    cut = lc.drain(StopReason.FINISHED)
    assert cut.buffer_watermark == 4 * ROUND and buf.watermark == 4 * ROUND
    BatchLedger(store).check(watermark=4 * ROUND)
    assert ReleaseStore(store).latest().version == 4
    assert store.released_after_commits() == [0, 1, 2, 3, 4]


def test_a_failed_commit_fails_the_incarnation_and_the_cut_holds_only_committed_rounds(
    tmp_path,
):
    store, buf, lc = _driver(tmp_path, overlap_commits=True)
    store.fail_commit_at = 3 * ROUND  # round 3's commit fails on the commit thread
    lc.start(0)
    with pytest.raises(TrainerFailedError, match="503"):
        lc.train(6)
    assert lc.counters.trained_rounds <= 4  # round 3 and at most the one taken after it
    lc.release()
    # the next incarnation restores from the base (no cut): nothing is trained twice, and
    # the committed rounds' ledger records agree with the buffer
    store.fail_commit_at = None
    lc2 = DriverLifecycle(
        lambda inc: FakeBackend(seed=3),
        FileSampleBuffer(store, layout="objects", host="trainer"),
        CutStore(store, keep=10),
        ReleaseStore(store),
        groups_per_round=ROUND,
        max_policy_age=100,
        workdir=tmp_path / "work2",
        group_size=G,
        vocab_size=100,
        overlap_commits=True,
        ledger_set_aside_before=time.time() + 60,  # the base: earlier records set aside
    )
    lc2.start(1)
    assert lc2.train(6) == 6
    cut = lc2.drain(StopReason.FINISHED)
    assert cut.buffer_watermark == 6 * ROUND
    BatchLedger(store).check(watermark=6 * ROUND)
    lc2.release()


class _ListingThreads(RemoteLookingDirStore):
    """Records which thread lists the fences."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listed_by: list[str] = []

    def list(self, prefix="", after=None):
        if prefix == "fences/":
            self.listed_by.append(threading.current_thread().name)
        return super().list(prefix, after)


def test_the_trainer_s_fences_are_listed_on_a_thread_within_the_same_bound(tmp_path):
    """``StoreFences(ahead=True)`` (the trainer island's reader): past half of
    ``refresh_s`` the listing goes on a thread and the answer comes from the fences known;
    a fence is still seen within ``refresh_s`` of its write."""
    store = _ListingThreads(tmp_path / "s")
    now = [0.0]
    fences = StoreFences(store, refresh_s=1.0, clock=lambda: now[0], ahead=True)
    me = threading.current_thread().name
    assert not fences("sampler-0", 1)  # nothing known yet: waits for the first listing
    now[0] = 0.6  # half the bound passed: listed on a thread, answered at once
    assert not fences("sampler-0", 1)
    fences._listing[0].result(30)
    write_fence(store, "sampler-0", 1)  # written after that listing
    now[0] = 0.9
    assert not fences("sampler-0", 1)  # known listing began at 0.6: within the bound
    now[0] = 1.7  # 1.1 s after the last listing began: this call waits for a fresh one
    assert fences("sampler-0", 1)
    assert me not in store.listed_by[1:2] and store.listed_by[1:2]  # the one at 0.6
