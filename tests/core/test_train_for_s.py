"""A train command's time limit (``train_for_s``): the trainer stops after the round that
passes it, the head then knows more rounds may wait, and the run config checks it."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.ports import TrainerLifecycle
from yeto_core.records import Action, Backlog, Decision, LifecycleState
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, make_group
from yeto_core.testing.fakes import Clock
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle
from yeto_core.trainer.loop import Journal, LoopConfig, TrainerLoop

S = LifecycleState


def _driver(tmp_path, groups: int) -> DriverLifecycle:
    store = DirStore(tmp_path / "store", fsync=False)
    buf = FileSampleBuffer(store, host="sampler")
    for i in range(groups):
        buf.append(make_group(i, 0, g=4))
    driver = DriverLifecycle(
        lambda i: FakeBackend(seed=5),
        FileSampleBuffer(store, host="trainer"),
        CutStore(store),
        groups_per_round=2,
        max_policy_age=99,
        group_size=4,
        workdir=tmp_path / "work",
    )
    driver.start(0)
    return driver


def test_the_driver_stops_after_the_round_that_passes_for_s(tmp_path):
    driver = _driver(tmp_path, 12)  # 6 full rounds wait
    assert driver.train(100, 1e-9) == 1  # any round takes longer than a nanosecond
    assert driver.train(2, 1e-9) == 1
    assert driver.train(4, 3600.0) == 4  # the limit not reached: all that were asked for
    assert driver.train(100, 1e-9) == 0  # none waits: nothing, whatever the limit


def test_a_command_waits_for_groups_while_its_for_s_lasts(tmp_path):
    import threading
    import time

    driver = _driver(tmp_path, 4)  # 2 full rounds wait
    sampler = FileSampleBuffer(DirStore(tmp_path / "store", fsync=False), host="late")
    appended = threading.Event()

    def late() -> None:  # a round's groups arrive while the command waits
        time.sleep(0.3)
        for i in range(2):
            sampler.append(make_group(100 + i, 0, g=4))
        appended.set()

    threading.Thread(target=late, daemon=True).start()
    began = time.monotonic()
    # the 2 rounds that wait, then the late one (appended 0.3 s in), in the same command,
    # which then waits for more until its 3 s are over
    assert driver.train(100, 3.0) == 3 and appended.is_set()
    assert time.monotonic() - began >= 3.0
    # at the data end it does not wait
    sampler.mark_data_end()
    began = time.monotonic()
    assert driver.train(100, 60.0) == 0 and time.monotonic() - began < 30


def test_a_command_without_for_s_never_waits(tmp_path):
    import time

    driver = _driver(tmp_path, 4)
    began = time.monotonic()
    assert driver.train(100) == 2 and driver.train(100, None) == 0
    assert time.monotonic() - began < 30


def test_without_for_s_the_driver_trains_every_round_asked_for(tmp_path):
    driver = _driver(tmp_path, 12)
    assert driver.train(3) == 3 and driver.train(3, None) == 3


class Timed(TrainerLifecycle):
    """Ready at once; each ``train`` call trains ``script``'s next count and advances the
    clock by its seconds (what the loop sees of a command)."""

    PLUGIN_NAME = "timed"

    def __init__(self, clock: Clock, script: list[tuple[int, float]]):
        self.clock, self.script = clock, list(script)
        self._state = S.STOPPED
        self.calls: list[tuple[int, Optional[float]]] = []

    def start(self, incarnation: int, cut: Any = None) -> None:
        self._state = S.READY

    def state(self) -> LifecycleState:
        return self._state

    def train(self, rounds: int, for_s: Optional[float] = None) -> int:
        self.calls.append((rounds, for_s))
        n, seconds = self.script.pop(0)
        self.clock.t += seconds
        return n

    def drain(self, reason: Any) -> Any:
        raise AssertionError("not drained here")

    def release(self) -> None:
        self._state = S.STOPPED


class AlwaysTrain:
    def decide(self, inputs: Any) -> Decision:
        return Decision(action=Action.HOLD, reason="train", q_on=1.0, inputs=inputs)


def _loop(clock: Clock, lc: Timed, **options: Any) -> TrainerLoop:
    loop = TrainerLoop(
        AlwaysTrain(),  # type: ignore[arg-type]
        lc,
        lambda: Backlog(groups=64, samples=512, watermark=0, head_position=64),
        lambda: True,
        Journal(None),
        LoopConfig(groups_per_round=2, a_hard=2, first_policy_start=False, **options),
        clock=clock,
    )
    lc.start(0)
    loop.incarnation = 0
    return loop


def test_a_command_that_ran_out_of_time_says_more_rounds_may_wait():
    clock = Clock()
    # 5 of 32 in 2.5 s (out of time); 3 of 32 in 0.5 s (no full round left); 32 of 32
    lc = Timed(clock, [(5, 2.5), (3, 0.5), (32, 1.0), (0, 3.0)])
    loop = _loop(clock, lc)
    seen = []
    for _ in range(4):
        loop.tick()
        seen.append(loop.more_ready)
    assert lc.calls == [(32, 2.0)] * 4  # the defaults: up to 32 rounds, 2 s
    assert seen == [True, False, True, False]  # a command of no round never says more


def test_the_limits_come_from_the_scheduler_options():
    clock = Clock()
    lc = Timed(clock, [(1, 0.1)])
    loop = _loop(clock, lc, rounds_per_tick=4, train_for_s=0.5)
    loop.tick()
    assert lc.calls == [(4, 0.5)] and loop.more_ready is False


@pytest.mark.parametrize(
    "options, says",
    [
        ({"rounds_per_tick": 0}, "rounds_per_tick = 0 must be >= 1"),
        ({"train_for_s": 0}, "train_for_s = 0 must be > 0"),
        ({"train_for_s": -1.5}, "train_for_s = -1.5 must be > 0"),
    ],
)
def test_bad_limits_are_refused(options, says):
    with pytest.raises(ValueError, match=says):
        LoopConfig(**options)
