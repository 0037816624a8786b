"""``trainer.publish_every``: a release after every N-th trained round and after the last
round of every ``train`` call; the training itself, the cuts and a resume are unchanged."""

from __future__ import annotations

import pytest

from yeto_core.records import StopReason
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, MemoryBuffer, make_group
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle


def _setup(tmp_path, name, *, every, overlap=True, groups=24):
    store = DirStore(tmp_path / name, fsync=False)
    buf = MemoryBuffer()
    for i in range(groups):
        buf.append(make_group(i, 0))
    events: list = []
    lc = DriverLifecycle(
        lambda inc: FakeBackend(seed=7),
        buf,
        CutStore(store, keep=4),
        ReleaseStore(store),
        groups_per_round=2,
        max_policy_age=100,
        emit=events.append,
        workdir=tmp_path / f"{name}-work",
        overlap_uploads=overlap,
        publish_every=every,
    )
    return store, buf, lc, events


def _released(store) -> list[int]:
    return [r.version for r in ReleaseStore(store).list()]


@pytest.mark.parametrize("overlap", [False, True])
def test_every_nth_round_and_the_last_of_each_call_is_published(tmp_path, overlap):
    store, _, lc, events = _setup(tmp_path, f"n{overlap}", every=3, overlap=overlap)
    lc.start(0)
    assert lc.train(7) == 7
    lc._wait_upload()
    assert _released(store) == [0, 3, 6, 7]  # the start's, rounds 3 and 6, the call's last
    flags = [e.data["published"] for e in events if e.kind == "trainer_round"]
    assert flags == [False, False, True, False, False, True, False]  # 7: by the call's end
    assert lc.train(2) == 2  # round 9 is a multiple of 3: the call's end adds nothing
    lc.drain(StopReason.FINISHED)
    assert _released(store) == [0, 3, 6, 7, 9]


def test_publish_every_1_publishes_every_round(tmp_path):
    store, _, lc, events = _setup(tmp_path, "one", every=1)
    lc.start(0)
    assert lc.train(4) == 4
    lc.drain(StopReason.FINISHED)
    assert _released(store) == [0, 1, 2, 3, 4]
    assert all(e.data["published"] for e in events if e.kind == "trainer_round")


def test_a_call_that_ends_on_too_few_groups_still_publishes_its_newest_round(tmp_path):
    store, _, lc, _ = _setup(tmp_path, "short", every=4, groups=6)
    lc.start(0)
    assert lc.train(10) == 3  # 6 groups: three rounds, then none waits
    lc.drain(StopReason.FINISHED)
    assert _released(store) == [0, 3]


def test_the_weights_cuts_and_a_resume_do_not_depend_on_publish_every(tmp_path):
    """The same rounds trained with every=1 and, over a stop and a restart, with every=2:
    bitwise the same weights in the last release and the last cut."""
    ref_store, _, ref, _ = _setup(tmp_path, "ref", every=1)
    ref.start(0)
    assert ref.train(8) == 8
    ref_cut = ref.drain(StopReason.FINISHED)

    store, buf, lc, _ = _setup(tmp_path, "two", every=2)
    lc.start(0)
    assert lc.train(5) == 5
    cut = lc.drain(StopReason.STOPPED)
    lc.release()
    assert _released(store) == [0, 2, 4, 5]
    lc.start(1, cut)  # restores version 5, whose release is out already: no new one
    assert _released(store) == [0, 2, 4, 5]
    assert lc.train(3) == 3
    final = lc.drain(StopReason.FINISHED)
    assert _released(store) == [0, 2, 4, 5, 6, 8]

    ref_last = ReleaseStore(ref_store).latest()
    last = ReleaseStore(store).latest()
    assert last.version == ref_last.version == 8
    assert last.weight_checksum == ref_last.weight_checksum
    assert (final.policy_version, final.trained_rounds, final.buffer_watermark) == (
        ref_cut.policy_version,
        ref_cut.trained_rounds,
        ref_cut.buffer_watermark,
    )


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_publish_every_must_be_a_positive_integer(tmp_path, bad):
    with pytest.raises(ValueError, match="publish_every must be an integer >= 1"):
        _setup(tmp_path, "bad", every=bad)
