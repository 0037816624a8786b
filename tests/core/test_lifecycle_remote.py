"""RemoteTrainerLifecycle + IslandTrainerAgent with a REAL trainer subprocess over a dir store.

Two incarnations, each a real ``python`` process running ``IslandTrainerAgent`` around a
``DriverLifecycle`` (FakeBackend, FileSampleBuffer), go start → train → drain → release
through the store's command channel; the final cut equals an in-process run, bitwise.
"""

from __future__ import annotations

import time

import pytest

from yeto_core.buffer.ledger import BatchLedger
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import LifecycleState, StopReason, Trigger
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, make_group
from yeto_core.testing.fakes import ScriptIslands, launch_for
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle, RemoteTrainerLifecycle

S = LifecycleState
N, G = 12, 4

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


def _fill(store: DirStore) -> None:
    buf = FileSampleBuffer(store, host="sampler")
    for i in range(N):
        buf.append(make_group(i, 0, g=G))


def test_two_remote_incarnations_in_real_processes_equal_an_in_process_run(tmp_path):
    ref_store = DirStore(tmp_path / "ref", fsync=False)
    _fill(ref_store)
    ref = DriverLifecycle(
        lambda i: FakeBackend(seed=5),
        FileSampleBuffer(ref_store, host="trainer"),
        CutStore(ref_store),
        groups_per_round=2,
        max_policy_age=99,
        group_size=G,
        workdir=tmp_path / "refw",
    )
    ref.start(0)
    assert ref.train(100) == N // 2

    root = tmp_path / "store"
    store = DirStore(root, fsync=False)
    _fill(store)
    script = tmp_path / "trainer_island.py"
    script.write_text(TRAINER)
    islands = ScriptIslands(script, str(root))
    remote = RemoteTrainerLifecycle(store, islands, launch_for(store), timeout_s=60, poll_s=0.02)
    cuts = []
    for inc, (rounds, reason) in enumerate([(4, StopReason.STOPPED), (100, StopReason.FINISHED)]):
        remote.start(inc)
        assert remote.state() in (S.STARTING, S.READY)
        assert remote.wait_ready() == S.READY
        assert remote.start_seconds is not None
        assert remote.train(rounds) == [4, N // 2 - 4][inc]
        cuts.append(remote.drain(reason))
        assert remote.state() == S.LEFT
        remote.release()
        assert remote.state() == S.STOPPED
        assert all(p.poll() is not None for p in islands.procs.values())
    assert [c.trigger for c in cuts] == [Trigger.SCHEDULED, Trigger.FINAL]
    assert cuts[1].parent_cut == cuts[0].cut_id and cuts[1].incarnation == 1
    assert cuts[1].buffer_watermark == N and cuts[1].trained_rounds == N // 2
    assert BatchLedger(store).check(watermark=N)["trained"] == N

    _, path = CutStore(store).latest_valid(tmp_path / "dl")
    final = FakeBackend(seed=5)
    final.restore(path)
    assert final.params.tobytes() == ref.backend.params.tobytes()
    assert final.trained_groups == ref.backend.trained_groups


def test_a_trainer_process_killed_mid_run_is_a_failed_state(tmp_path):
    root = tmp_path / "store"
    store = DirStore(root, fsync=False)
    _fill(store)
    script = tmp_path / "trainer_island.py"
    script.write_text(TRAINER)
    islands = ScriptIslands(script, str(root))
    remote = RemoteTrainerLifecycle(store, islands, launch_for(store), timeout_s=60, poll_s=0.02)
    remote.start(0)
    assert remote.wait_ready() == S.READY
    assert remote.train(1) == 1
    (proc,) = islands.procs.values()
    proc.kill()  # SIGKILL
    deadline = time.monotonic() + 30
    while remote.state() != S.FAILED:
        assert time.monotonic() < deadline, "the dead trainer was never seen as FAILED"
        time.sleep(0.02)
    remote.release()
    assert remote.state() == S.STOPPED


def test_a_train_command_carries_its_time_limit_to_the_trainer_process(tmp_path):
    """``train(rounds, for_s)`` sends ``for_s`` in the command; the agent's driver stops
    after the round that passes it (here any round: a nanosecond)."""
    import json

    root = tmp_path / "store"
    store = DirStore(root, fsync=False)
    _fill(store)
    script = tmp_path / "trainer_island.py"
    script.write_text(TRAINER)
    islands = ScriptIslands(script, str(root))
    remote = RemoteTrainerLifecycle(store, islands, launch_for(store), timeout_s=60, poll_s=0.02)
    remote.start(0)
    assert remote.wait_ready() == S.READY
    assert remote.train(100, 1e-9) == 1
    assert remote.train(100) == N // 2 - 1  # no limit: every round that waits
    commands = [json.loads(store.get(k)) for k in store.list("trainer/0/commands/")]
    assert [c.get("for_s") for c in commands if c["op"] == "train"] == [1e-9, None]
    remote.drain(StopReason.FINISHED)
    remote.release()


class _ClosingWatch:
    """A watch that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def wait(self, timeout: float) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


class _WatchedStore(DirStore):
    def __init__(self, root) -> None:
        super().__init__(root)
        self.watches: list[_ClosingWatch] = []

    def watch(self, prefix: str) -> _ClosingWatch:
        w = _ClosingWatch()
        self.watches.append(w)
        return w


def test_the_agent_closes_its_command_watch_when_it_returns_or_fails(tmp_path):
    """Not left to the garbage collector: a SIGTERM after the trainer left would raise
    inside the watch's finalizer (a traceback in the island's log)."""
    from yeto_core.trainer.lifecycle import IslandTrainerAgent
    from yeto_core.trainer.lifecycle.states import TrainerCounters, TrainerFailedError

    class _Driver:
        start_seconds = 0.1
        restored_cut = None
        counters = TrainerCounters()

        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def start(self, incarnation, cut) -> None:
            if self.fail:
                raise TrainerFailedError("the backend would not start")

    store = _WatchedStore(tmp_path / "idle")
    agent = IslandTrainerAgent(store, _Driver(fail=False), 0, idle_timeout_s=0.0)
    assert agent.run() is None  # no command within idle_timeout_s
    assert [w.closed for w in store.watches] == [True]

    store = _WatchedStore(tmp_path / "failed")
    agent = IslandTrainerAgent(store, _Driver(fail=True), 0, idle_timeout_s=60.0)
    with pytest.raises(TrainerFailedError):
        agent.run()
    assert [w.closed for w in store.watches] == [True]
