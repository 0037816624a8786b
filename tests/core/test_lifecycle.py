"""DriverLifecycle: explicit states, JOIN/restore/rounds/drain/LEAVE, bitwise resume."""

from __future__ import annotations

import numpy as np
import pytest

from yeto_core.errors import IllegalTransitionError
from yeto_core.records import LifecycleState, StopReason, Trigger
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, MemoryBuffer, make_group
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import LEAVE_CODES, DriverLifecycle, TrainerFailedError

S = LifecycleState


def _setup(tmp_path, name, n_groups=24):
    store = DirStore(tmp_path / name, fsync=False)
    buf = MemoryBuffer()
    for i in range(n_groups):
        buf.append(make_group(i, 0))
    events = []
    lc = DriverLifecycle(
        lambda inc: FakeBackend(seed=7),
        buf,
        CutStore(store, keep=2),
        ReleaseStore(store),
        groups_per_round=2,
        max_policy_age=100,
        emit=events.append,
        workdir=tmp_path / f"{name}-work",
    )
    return store, buf, lc, events


def test_three_start_stop_cycles_equal_a_run_that_never_stopped(tmp_path):
    _, _, ref, _ = _setup(tmp_path, "ref")
    ref.start(0)
    assert ref.train(12) == 12
    ref_state = ref.backend

    store, buf, lc, events = _setup(tmp_path, "cyc")
    cuts = []
    for inc, rounds in enumerate([3, 5, 4]):
        lc.start(inc)
        assert lc.state() == S.READY
        assert lc.train(rounds) == rounds
        reason = StopReason.FINISHED if inc == 2 else StopReason.STOPPED
        cuts.append(lc.drain(reason))
        final_backend = lc.backend
        lc.release()
        assert lc.state() == S.STOPPED
    assert [c.trigger for c in cuts] == [Trigger.SCHEDULED, Trigger.SCHEDULED, Trigger.FINAL]
    assert cuts[-1].trained_rounds == 12 and cuts[-1].buffer_watermark == 24
    assert cuts[1].parent_cut == cuts[0].cut_id
    assert np.array_equal(final_backend.params, ref_state.params)  # bitwise
    assert final_backend.params.tobytes() == ref_state.params.tobytes()
    assert final_backend.trained_groups == [
        f"g{i:06d}" for i in range(24)
    ]  # none twice, none skipped
    kinds = [e.kind for e in events]
    # JOIN precedes the restore summary; LEAVE carries the code of the stop reason.
    assert kinds.index("trainer_join") < kinds.index("trainer_start_summary")
    leaves = [e for e in events if e.kind == "trainer_leave"]
    assert [e.data["code"] for e in leaves] == [
        LEAVE_CODES[StopReason.STOPPED],
        LEAVE_CODES[StopReason.STOPPED],
        LEAVE_CODES[StopReason.FINISHED],
    ]
    # One release per trained round plus the base: versions 0..12, the last one LATEST.
    rs = ReleaseStore(store)
    assert [r.version for r in rs.list()] == list(range(13))
    assert rs.latest().weight_checksum == final_backend.weight_checksum()


def test_restart_resets_buffer_to_cut_watermark(tmp_path):
    _, buf, lc, _ = _setup(tmp_path, "wm")
    lc.start(0)
    lc.train(2)
    lc.drain(StopReason.PREEMPTED)
    lc.release()
    buf._watermark = 20  # a crashed trainer consumed more after the cut
    lc.start(1)
    assert buf.watermark == 4 and lc.counters.policy_version == 2
    assert lc.restored_cut.trigger == Trigger.PREEMPT


def test_holds_when_no_full_round_waits(tmp_path):
    _, buf, lc, _ = _setup(tmp_path, "hold", n_groups=5)
    lc.start(0)
    assert lc.train(10) == 2  # the fifth group waits for a partner
    assert lc.state() == S.READY and buf.watermark == 4


@pytest.mark.parametrize(
    "steps, bad",
    [
        ([], "train"),
        ([], "drain"),
        ([], "release"),
        (["start"], "start"),
        (["start", "drain"], "train"),
        (["start", "drain"], "drain"),
        (["start", "drain", "release"], "drain"),
    ],
)
def test_illegal_transitions_raise(tmp_path, steps, bad):
    _, _, lc, _ = _setup(tmp_path, "ill")
    calls = {
        "start": lambda: lc.start(0),
        "train": lambda: lc.train(1),
        "drain": lambda: lc.drain(StopReason.STOPPED),
        "release": lc.release,
    }
    for s in steps:
        calls[s]()
    before = lc.state()
    with pytest.raises(IllegalTransitionError, match="cannot"):
        calls[bad]()
    assert lc.state() == before


def test_failure_is_a_state_and_release_recovers(tmp_path):
    store = DirStore(tmp_path / "f", fsync=False)

    def broken(inc):
        raise RuntimeError("no GPU")

    events = []
    lc = DriverLifecycle(
        broken, MemoryBuffer(), CutStore(store), emit=events.append, workdir=tmp_path / "w"
    )
    with pytest.raises(TrainerFailedError, match="no GPU"):
        lc.start(0)
    assert lc.state() == S.FAILED
    assert events[-1].kind == "trainer_failed" and events[-1].data["code"] == LEAVE_CODES[None]
    lc.release()
    assert lc.state() == S.STOPPED
