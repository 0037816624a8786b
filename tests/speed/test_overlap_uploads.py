"""A round's release upload overlapping the next round (and the head's turn after a
``train`` command): the same releases, in order; every trained round is published
before the next ``train`` or ``drain`` returns, and a failed upload fails it."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
from safetensors.numpy import save_file

from yeto_core.records import StopReason
from yeto_core.release.store import ReleaseStore
from yeto_core.sampler import fingerprint
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, MemoryBuffer, make_group
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle, TrainerFailedError


def _setup(tmp_path, name, *, overlap, releases_cls=ReleaseStore, backend_cls=FakeBackend):
    store = DirStore(tmp_path / name, fsync=False)
    buf = MemoryBuffer()
    for i in range(12):
        buf.append(make_group(i, 0))
    events = []
    lc = DriverLifecycle(
        lambda inc: backend_cls(seed=7),
        buf,
        CutStore(store, keep=2),
        releases_cls(store),
        groups_per_round=2,
        max_policy_age=100,
        emit=events.append,
        workdir=tmp_path / f"{name}-work",
        overlap_uploads=overlap,
    )
    return store, lc, events


def test_overlapped_uploads_publish_the_same_releases(tmp_path):
    got = {}
    for overlap in (False, True):
        store, lc, _ = _setup(tmp_path, f"o{overlap}", overlap=overlap)
        lc.start(0)
        assert lc.train(4) == 4
        lc.drain(StopReason.FINISHED)  # waits for the last upload
        rs = ReleaseStore(store)
        assert rs.latest().version == 4
        got[overlap] = [(r.version, r.seq, r.weight_checksum) for r in rs.list()]
        lc.release()
    assert got[True] == got[False]
    assert [v for v, _, _ in got[True]] == [0, 1, 2, 3, 4]


class _SlowReleases(ReleaseStore):
    """Uploads block until the test lets them go: shows the next round trains meanwhile."""

    gate = threading.Event()
    trained_while_uploading = False

    def publish(self, local_dir, info, **kw):
        if info["version"] == 1:
            type(self).gate.wait(30)
        return super().publish(local_dir, info, **kw)


def test_the_next_round_trains_while_the_upload_runs(tmp_path, monkeypatch):
    store, lc, events = _setup(tmp_path, "slow", overlap=True, releases_cls=_SlowReleases)
    lc.start(0)
    real = lc._train_one
    calls = {"n": 0}

    def one():
        calls["n"] += 1
        if calls["n"] == 2:  # round 2 starts while release 1 is still uploading
            _SlowReleases.trained_while_uploading = ReleaseStore(store).latest().version == 0
            _SlowReleases.gate.set()
        return real()

    monkeypatch.setattr(lc, "_train_one", one)
    assert lc.train(2) == 2
    assert _SlowReleases.trained_while_uploading
    lc.drain(StopReason.FINISHED)  # waits for the last upload
    assert ReleaseStore(store).latest().version == 2


class _BrokenReleases(ReleaseStore):
    def publish(self, local_dir, info, **kw):
        if info["version"] == 2:
            raise OSError(28, "No space left on device")
        return super().publish(local_dir, info, **kw)


def test_a_failed_background_upload_fails_the_round(tmp_path):
    _, lc, events = _setup(tmp_path, "broken", overlap=True, releases_cls=_BrokenReleases)
    lc.start(0)
    with pytest.raises(TrainerFailedError, match="No space left"):
        lc.train(4)
    assert any(e.kind == "trainer_failed" for e in events)


class _GatedLastRelease(ReleaseStore):
    """The upload of release 2 blocks until the test lets it go."""

    gate = threading.Event()

    def publish(self, local_dir, info, **kw):
        if info["version"] == 2:
            assert type(self).gate.wait(30)
        return super().publish(local_dir, info, **kw)


def test_train_answers_while_its_last_upload_runs_and_drain_waits_for_it(tmp_path):
    store, lc, _ = _setup(tmp_path, "gated", overlap=True, releases_cls=_GatedLastRelease)
    lc.start(0)
    assert lc.train(2) == 2  # returns with release 2 still uploading (the head's turn)
    assert ReleaseStore(store).latest().version == 1
    done = threading.Event()

    def drain():
        lc.drain(StopReason.FINISHED)
        done.set()

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    assert not done.wait(0.2)  # the cut waits for the upload
    _GatedLastRelease.gate.set()
    t.join(30)
    assert done.is_set() and ReleaseStore(store).latest().version == 2


class _BrokenLastRelease(ReleaseStore):
    def publish(self, local_dir, info, **kw):
        if info["version"] == 2:
            raise OSError(28, "No space left on device")
        return super().publish(local_dir, info, **kw)


def test_a_failed_last_upload_fails_the_next_command_before_it_trains(tmp_path):
    _, lc, events = _setup(tmp_path, "broken-last", overlap=True, releases_cls=_BrokenLastRelease)
    lc.start(0)
    assert lc.train(2) == 2
    lc._upload_pending.exception(30)  # (the upload has failed by now)
    trained = lc.counters.trained_rounds
    with pytest.raises(TrainerFailedError, match="No space left"):
        lc.train(2)
    assert lc.counters.trained_rounds == trained  # nothing trained after the failure
    assert any(e.kind == "trainer_failed" for e in events)


class _WriterBackend(FakeBackend):
    """Offers release_writer: a copy of the weights now, written on the upload thread.
    Its fingerprint scores depend on the weights, so one recorded late would differ."""

    vocab_size = 8
    writer_threads: list[str] = []

    def prompt_logprobs(self, prompts):
        return [[float(-abs(self.params[0]) - 0.01 * t) for t in p[1:]] for p in prompts]

    def release_writer(self):
        params, n = self.params.copy(), self.n_params

        def write(out_dir):
            type(self).writer_threads.append(threading.current_thread().name)
            d = Path(out_dir)
            save_file({"params": params}, str(d / "model.safetensors"))
            (d / "config.json").write_text(json.dumps({"n_params": n}))
            return {"kind": "full", "weight_checksum": hashlib.sha256(params.tobytes()).hexdigest()}

        return write


def test_a_release_writer_publishes_from_the_upload_thread_what_the_training_thread_would(
    tmp_path,
):
    got = {}
    for overlap in (False, True):
        _WriterBackend.writer_threads = []
        store, lc, _ = _setup(tmp_path, f"w{overlap}", overlap=overlap, backend_cls=_WriterBackend)
        lc.start(0)
        assert lc.train(4) == 4
        lc.drain(StopReason.FINISHED)
        rs = ReleaseStore(store)
        rels = rs.list()
        got[overlap] = [
            (
                r.version,
                r.weight_checksum,
                r.info,
                (
                    rs.fetch(r, tmp_path / f"f{overlap}-{r.version}") / "model.safetensors"
                ).read_bytes(),
            )
            for r in rels
        ]
        lc.release()
        if overlap:  # rounds 1-4 written on the upload thread; the start's release in place
            assert len(_WriterBackend.writer_threads) == 4
            assert all(t.startswith("upload") for t in _WriterBackend.writer_threads)
        else:
            assert _WriterBackend.writer_threads == []
    assert [v for v, *_ in got[True]] == [0, 1, 2, 3, 4]
    assert all(fingerprint.INFO_KEY in info for _, _, info, _ in got[True])
    assert (
        len({json.dumps(i[fingerprint.INFO_KEY], sort_keys=True) for _, _, i, _ in got[True]}) == 5
    )
    assert got[True] == got[False]


class _BrokenWriter(_WriterBackend):
    def release_writer(self):
        write = super().release_writer()

        def broken(out_dir):
            if self.rounds >= 2:
                raise OSError(28, "No space left on device")
            return write(out_dir)

        return broken


def test_a_release_writer_that_fails_fails_the_round_after(tmp_path):
    _, lc, _ = _setup(tmp_path, "wbroken", overlap=True, backend_cls=_BrokenWriter)
    lc.start(0)
    with pytest.raises(TrainerFailedError, match="No space left"):
        lc.train(4)


class _HandoffRecording(ReleaseStore):
    handoffs: list = []

    def publish(self, local_dir, info, **kw):
        type(self).handoffs.append((Path(local_dir).name, kw.get("handoff", False)))
        return super().publish(local_dir, info, **kw)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_driver_hands_its_scratch_export_to_the_release_store(tmp_path, overlap):
    """The export dir is the driver's scratch, removed after the upload: the store may keep
    its files themselves (no second copy written per round)."""
    _HandoffRecording.handoffs = []
    store, lc, _ = _setup(tmp_path, f"h{overlap}", overlap=overlap, releases_cls=_HandoffRecording)
    lc.start(0)
    assert lc.train(2) == 2
    lc.drain(StopReason.FINISHED)
    assert [h for _, h in _HandoffRecording.handoffs] == [True, True, True]  # v0, v1, v2
    assert not any(
        (tmp_path / f"h{overlap}-work" / n).exists() for n, _ in _HandoffRecording.handoffs
    )
    assert ReleaseStore(store).latest().version == 2
    lc.release()
