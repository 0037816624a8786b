"""TrainerLoop records every incarnation's measured start, whichever call saw it start.

Regression: with a remote lifecycle the STARTING → READY edge happens inside
``lifecycle.state()`` (the ``ready`` message is pumped there), at the top of a tick,
so the loop never journaled ``started`` and S1's ``T_s`` stayed the fallback. Also
``TrainerLoop.stop``, the public stop ``yeto run up`` uses.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import attrs
import pytest

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.ports import TrainerLifecycle
from yeto_core.records import Action, Backlog, LifecycleState, StopReason, Trigger
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import make_group
from yeto_core.testing.fakes import Clock, ScriptIslands, launch_for
from yeto_core.trainer.lifecycle import RemoteTrainerLifecycle
from yeto_core.trainer.loop import Journal, LoopConfig, TrainerLoop
from yeto_core.trainer.s1 import S1Scheduler

S = LifecycleState
CFG = LoopConfig(groups_per_round=2, a_hard=2, start_seconds_fallback=300.0)


@attrs.frozen
class FakeCut:
    cut_id: str


class ReadyInsideState(TrainerLifecycle):
    """A lifecycle double that, like the remote one, turns READY inside ``state()``.

    ``start`` only launches; the ``ready_after``-th ``state()`` poll after it sees the
    trainer's ``ready`` (and its measured start), or, with ``dies_after_ready``, the
    ``ready`` and the process exit in the same poll (FAILED).
    """

    PLUGIN_NAME = "ready-inside-state"

    def __init__(self, start_s: float, *, ready_after: int = 2, dies_after_ready=False):
        self.measured, self.ready_after, self.dies = start_s, ready_after, dies_after_ready
        self._state = S.STOPPED
        self._start_s: Optional[float] = None
        self.groups = 0
        self.polls = 0
        self.waited = False

    def start(self, incarnation: int, cut: Any = None) -> None:
        assert self._state == S.STOPPED
        self._state, self._start_s, self.polls = S.STARTING, None, 0

    @property
    def start_seconds(self) -> Optional[float]:
        return self._start_s

    def state(self) -> LifecycleState:
        if self._state == S.STARTING:
            self.polls += 1
            if self.polls >= self.ready_after:
                self._start_s = self.measured
                self._state = S.FAILED if self.dies else S.READY
        return self._state

    def wait_ready(self) -> LifecycleState:
        self.waited = True
        while self.state() == S.STARTING:
            pass
        return self._state

    def train(self, rounds: int, for_s=None) -> int:
        done = min(rounds, self.groups // 2)
        self.groups -= 2 * done
        return done

    def drain(self, reason: StopReason) -> FakeCut:
        assert self._state == S.READY
        self._state = S.LEFT
        return FakeCut(f"cut-{reason.value.lower()}")

    def release(self) -> None:
        self._state = S.STOPPED


def _loop(lc, clock, journal, config=CFG):
    def backlog() -> Backlog:
        return Backlog(groups=lc.groups, samples=4 * lc.groups, watermark=0, head_position=0)

    return TrainerLoop(S1Scheduler(), lc, backlog, lambda: True, journal, config, clock=clock)


def _kinds(journal: Journal, kind: str) -> list[dict[str, Any]]:
    return [r for r in journal.read() if r["kind"] == kind]


def test_a_start_seen_inside_state_is_journaled_and_sets_T_s(tmp_path: Path) -> None:
    clock, journal = Clock(), Journal(DirStore(tmp_path / "s", fsync=False))
    lc = ReadyInsideState(start_s=42.0)
    lc.groups = 6  # Q_on = a_hard + 1 = 3 rounds wait: S1 starts
    loop = _loop(lc, clock, journal)
    stop_at = None
    while clock.t < 1000 and stop_at is None:
        d = loop.tick()
        if d.action == Action.STOP:
            stop_at = clock.t
        clock.t += 1.0
    started = _kinds(journal, "started")
    assert [(r["incarnation"], r["start_s"]) for r in started] == [(0, 42.0)]
    assert loop.measured_start_s == 42.0
    # S1 rule 5 stops after T_s idle: the measured 42 s, not the 300 s fallback
    idle = _kinds(journal, "idle")[0]["idle_since"]
    assert stop_at is not None and stop_at - idle == pytest.approx(42.0, abs=1.0)
    # a restarted head reads T_s back from the journal
    assert _loop(ReadyInsideState(7.0), clock, journal).measured_start_s == 42.0


def test_a_trainer_that_reported_its_start_then_died_still_counts(tmp_path: Path) -> None:
    clock, journal = Clock(), Journal(None)
    lc = ReadyInsideState(start_s=9.0, dies_after_ready=True)
    lc.groups = 6
    loop = _loop(lc, clock, journal)
    for _ in range(3):  # START; ready + exit seen in one poll; release
        loop.tick()
        clock.t += 1.0
    assert [(r["incarnation"], r["start_s"]) for r in _kinds(journal, "started")][0] == (0, 9.0)
    assert _kinds(journal, "release")[0]["failed"] is True
    assert loop.measured_start_s == 9.0


def test_a_start_without_a_measurement_keeps_the_last_one(tmp_path: Path) -> None:
    clock, journal = Clock(), Journal(None)
    journal.append({"kind": "start", "incarnation": 0, "time": 0.0})
    journal.append({"kind": "started", "incarnation": 0, "start_s": 12.0, "time": 0.0})
    journal.append({"kind": "stop", "incarnation": 0, "time": 1.0})
    lc = ReadyInsideState(start_s=None)  # type: ignore[arg-type]
    lc.groups = 6
    loop = _loop(lc, clock, journal)
    for _ in range(3):
        loop.tick()
    assert _kinds(journal, "started")[-1] == {
        "kind": "started",
        "incarnation": 1,
        "start_s": None,
        "time": 0.0,
        "seq": 5,
    }
    assert loop.inputs(S.READY, Backlog(0, 0, 0, 0), 0.0).start_s == 12.0


def test_stop_waits_for_a_starting_trainer_drains_and_journals(tmp_path: Path) -> None:
    clock, journal = Clock(), Journal(None)
    lc = ReadyInsideState(start_s=5.0, ready_after=50)
    lc.groups = 6
    loop = _loop(lc, clock, journal)
    loop.tick()  # START; still STARTING
    assert lc.state() == S.STARTING
    cut = loop.stop(StopReason.FINISHED)
    assert lc.waited and cut == FakeCut("cut-finished") and lc.state() == S.STOPPED
    kinds = [r["kind"] for r in journal.read()]
    assert kinds[-2:] == ["started", "stop"] and "release" not in kinds
    assert journal.read()[-1]["reason"] == StopReason.FINISHED.value
    assert journal.read()[-1]["cut_id"] == "cut-finished"
    # nothing to stop: a no-op, journals nothing
    assert loop.stop() is None and [r["kind"] for r in journal.read()] == kinds


def test_stop_releases_a_failed_trainer(tmp_path: Path) -> None:
    clock, journal = Clock(), Journal(None)
    lc = ReadyInsideState(start_s=5.0, ready_after=50)
    lc.groups = 6
    loop = _loop(lc, clock, journal)
    loop.tick()
    lc._state = S.FAILED  # the island died while starting
    assert loop.stop(StopReason.FINISHED) is None
    rec = journal.read()[-1]
    assert (rec["kind"], rec["failed"], rec["failures"]) == ("release", True, 1)
    assert lc.state() == S.STOPPED


TRAINER = """
import os, sys
from pathlib import Path
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle, IslandTrainerAgent
from yeto_core.release.store import ReleaseStore
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend

root = Path(sys.argv[1])
inc = int(os.environ["YETO_INCARNATION"])
store = DirStore(root, fsync=False)
driver = DriverLifecycle(
    lambda i: FakeBackend(seed=5), FileSampleBuffer(store, host="trainer"), CutStore(store),
    ReleaseStore(store), groups_per_round=2, max_policy_age=99, group_size=4,
    workdir=root.parent / f"work-{inc}",
)
IslandTrainerAgent(store, driver, inc, idle_timeout_s=60).run(os.environ.get("YETO_TRAINER_CUT"))
"""


def test_the_real_remote_lifecycle_journals_its_measured_start(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = DirStore(root, fsync=False)
    sampler = FileSampleBuffer(store, host="sampler")
    for i in range(6):
        sampler.append(make_group(i, 0, g=4))
    script = tmp_path / "trainer_island.py"
    script.write_text(TRAINER)
    islands = ScriptIslands(script, str(root))
    remote = RemoteTrainerLifecycle(store, islands, launch_for(store), timeout_s=60, poll_s=0.02)
    journal = Journal(store)
    view = FileSampleBuffer(store, host="head")
    loop = TrainerLoop(
        S1Scheduler(), remote, view.backlog, lambda: True, journal, CFG, clock=time.time
    )
    deadline = time.monotonic() + 60
    while not _kinds(journal, "started"):
        assert time.monotonic() < deadline, f"no 'started' in the journal: {journal.read()}"
        loop.tick()
        time.sleep(0.02)
    started = _kinds(journal, "started")
    assert len(started) == 1 and started[0]["incarnation"] == 0
    assert started[0]["start_s"] is not None
    assert started[0]["start_s"] == remote.start_summary["start_s"] == loop.measured_start_s
    cut = loop.stop(StopReason.FINISHED)
    assert cut is not None and cut.trigger == Trigger.FINAL
    assert remote.state() == S.STOPPED
    assert all(p.poll() is not None for p in islands.procs.values())
    assert journal.read()[-1]["kind"] == "stop"
