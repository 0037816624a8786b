"""TrainerLoop on simulated time: start/stop cycles, journal, head restart, give-up."""

from __future__ import annotations

import attrs
import pytest

from yeto_core.ports import TrainerLifecycle
from yeto_core.records import LifecycleState, StopReason, Trigger
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, MemoryBuffer, make_group
from yeto_core.testing.fakes import Clock
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle
from yeto_core.trainer.loop import Journal, LoopConfig, TrainerLoop, TrainerLoopGaveUp
from yeto_core.trainer.s1 import S1Scheduler

N = 18
# one round per train command: these tests step the head tick by tick
CFG = LoopConfig(
    groups_per_round=2,
    a_hard=2,
    start_seconds_fixed=10.0,
    max_failures=3,
    drain_limit_s=500,
    rounds_per_tick=1,
    train_for_s=None,
)


def reference_params(tmp_path):
    store = DirStore(tmp_path / "ref", fsync=False)
    buf = MemoryBuffer()
    for i in range(N):
        buf.append(make_group(i, 0))
    lc = DriverLifecycle(
        lambda i: FakeBackend(seed=3),
        buf,
        CutStore(store),
        groups_per_round=2,
        max_policy_age=99,
        workdir=tmp_path / "refw",
    )
    lc.start(0)
    lc.train(N // 2)
    return lc.backend


class Run:
    """A store, a buffer fed in three waves, and a fresh head on demand."""

    def __init__(self, tmp_path, factory=None):
        self.tmp = tmp_path
        self.clock = Clock()
        self.store = DirStore(tmp_path / "store", fsync=False)
        self.buffer = MemoryBuffer(clock=self.clock)
        self.factory = factory or (lambda inc: FakeBackend(seed=3))
        self.fed = 0

    def feed(self):
        wave = {0: 6, 1000: 6, 2000: 6}
        for t, n in wave.items():
            if self.clock.t >= t and self.fed < sum(v for k, v in wave.items() if k <= t):
                for _ in range(n):
                    latest = ReleaseStore(self.store).latest()  # samplers stamp the newest release
                    self.buffer.append(make_group(self.fed, latest.version if latest else 0))
                    self.fed += 1
        if self.clock.t >= 2500:
            self.buffer.mark_data_end()

    def head(self):
        self.lifecycle = DriverLifecycle(
            self.factory,
            self.buffer,
            CutStore(self.store),
            ReleaseStore(self.store),
            groups_per_round=2,
            max_policy_age=CFG.a_hard,
            clock=self.clock,
            workdir=self.tmp / "work",
        )
        rs = ReleaseStore(self.store)
        self.loop = TrainerLoop(
            S1Scheduler(),
            self.lifecycle,
            self.buffer.backlog,
            lambda: rs.latest() is not None,
            Journal(self.store),
            CFG,
            clock=self.clock,
        )
        return self.loop

    def run(self, until=None):
        while self.loop.finished is None and (until is None or self.clock.t < until):
            self.feed()
            self.loop.tick()
            self.clock.t += 1.0
            assert self.clock.t < 10_000, "the loop never finished"


def test_three_start_stop_cycles_end_equal_to_a_run_that_never_stopped(tmp_path):
    ref = reference_params(tmp_path)
    run = Run(tmp_path)
    run.head()
    run.run()
    assert run.loop.finished == "data_end"
    journal = Journal(run.store).read()
    starts = [r for r in journal if r["kind"] == "start"]
    stops = [r for r in journal if r["kind"] == "stop"]
    assert [s["incarnation"] for s in starts] == [0, 1, 2]
    assert starts[0]["reason"] == "first_policy" and starts[1]["reason"] == "backlog"
    assert [s["reason"] for s in stops] == ["STOPPED", "STOPPED", "STOPPED"]
    cuts = CutStore(run.store, keep=10).list()
    assert cuts[-1].trigger == Trigger.SCHEDULED and cuts[-1].buffer_watermark == N
    got, path = CutStore(run.store).latest_valid(tmp_path / "dl")
    final = FakeBackend(seed=3)
    final.restore(path)
    assert final.params.tobytes() == ref.params.tobytes()
    assert final.trained_groups == [f"g{i:06d}" for i in range(N)]
    # Every decision is journaled with its inputs.
    decisions = [r for r in journal if r["kind"] == "decision"]
    assert {d["action"] for d in decisions} >= {"START", "STOP", "HOLD", "FINISH"}
    assert all("backlog_groups" in d["inputs"] for d in decisions)
    # Stopped only after idling T_s: the idle record precedes each stop by >= 10 s.
    idles = [r for r in journal if r["kind"] == "idle"]
    for stop in stops:
        last_idle = max(i["time"] for i in idles if i["time"] <= stop["time"])
        assert stop["time"] - last_idle >= 10.0


def test_head_restart_continues_numbering_idle_clock_and_releases_orphan(tmp_path):
    ref = reference_params(tmp_path)
    run = Run(tmp_path)
    run.head()
    run.run(until=1004)  # incarnation 1 started at t=1000 and trained a round or two
    assert run.lifecycle.state() == LifecycleState.READY
    # The head dies with its in-process trainer: a new head and a new lifecycle object.
    run.head()
    journal = Journal(run.store).read()
    assert journal[-1]["kind"] == "orphan_released" and journal[-1]["incarnation"] == 1
    run.run(until=2005)
    # Idle at the restart point: the restarted head keeps the idle clock.
    run.head()
    assert run.loop.idle_since is None or run.loop.idle_since <= run.clock.t
    run.run()
    journal = Journal(run.store).read()
    incs = [s["incarnation"] for s in journal if s["kind"] == "start"]
    assert incs == list(range(len(incs))) and len(incs) >= 4  # numbering continues
    got, path = CutStore(run.store).latest_valid(tmp_path / "dl")
    final = FakeBackend(seed=3)
    final.restore(path)
    assert final.params.tobytes() == ref.params.tobytes()
    assert final.trained_groups == [f"g{i:06d}" for i in range(N)]


def test_idle_clock_survives_a_restart(tmp_path):
    run = Run(tmp_path)
    run.head()
    run.run(until=12)  # 3 rounds trained by t~5, idle since then
    idle = run.loop.idle_since
    assert idle is not None
    run.lifecycle.drain(StopReason.PREEMPTED)  # keep the trainer's work; the head alone dies
    run.lifecycle.release()
    loop2 = run.head()
    assert loop2.idle_since is None  # the orphan was released: no trainer to be idle
    assert loop2.incarnation == 0


def test_gives_up_after_max_failures_without_a_trained_round(tmp_path):
    def broken(inc):
        raise RuntimeError(f"incarnation {inc}: CUDA unavailable")

    run = Run(tmp_path, factory=broken)
    run.head()
    with pytest.raises(TrainerLoopGaveUp, match="3 trainer incarnations"):
        run.run()
    journal = Journal(run.store).read()
    assert [r["kind"] for r in journal].count("start_failed") == 3
    assert journal[-1]["kind"] == "gave_up"


def test_a_head_after_one_that_gave_up_tries_again_and_can_finish(tmp_path):
    """Regression (found by `make chaos`): a head resumed from a journal that ended in
    ``gave_up`` took the count (and the finish) from it and gave up without a start."""
    broken = {"on": True}

    def factory(inc):
        if broken["on"]:
            raise RuntimeError(f"incarnation {inc}: CUDA unavailable")
        return FakeBackend(seed=3)

    run = Run(tmp_path, factory=factory)
    run.head()
    with pytest.raises(TrainerLoopGaveUp):
        run.run()
    loop = run.head()  # a new head: three new tries, not none
    assert loop.finished is None and loop.failures == 0
    assert Journal(run.store).read()[-1]["kind"] == "retry"
    while loop.failures < 1:  # one start fails
        run.run(until=run.clock.t + 1)
    assert loop.failures == 1 and loop.finished is None
    # this head dies before giving up: the next one keeps its count, not the old finish
    loop = run.head()
    assert loop.finished is None and loop.failures == 1
    broken["on"] = False
    run.run()
    assert loop.finished == "data_end"
    journal = Journal(run.store).read()
    assert [r["kind"] for r in journal].count("retry") == 1
    _, path = CutStore(run.store).latest_valid(tmp_path / "dl")
    final = FakeBackend(seed=3)
    final.restore(path)
    assert final.trained_groups == [f"g{i:06d}" for i in range(N)]


def test_drain_limit_finishes_after_data_end(tmp_path):
    class Stuck(TrainerLifecycle):
        PLUGIN_NAME = "stuck"

        def __init__(self):
            self.s = LifecycleState.STOPPED

        def state(self):
            return self.s

        def start(self, inc, cut):
            self.s = LifecycleState.STARTING

        def release(self):
            self.s = LifecycleState.STOPPED

        def train(self, rounds, for_s=None):
            raise AssertionError("never READY")

        def drain(self, reason):
            raise AssertionError("never READY")

    clock = Clock()
    buf = MemoryBuffer()
    for i in range(4):
        buf.append(make_group(i, 0))
    buf.mark_data_end()
    lc = Stuck()
    loop = TrainerLoop(
        S1Scheduler(), lc, buf.backlog, lambda: True, Journal(None), CFG, clock=clock
    )
    while loop.finished is None:
        loop.tick()
        clock.t += 10
        assert clock.t < 5000
    assert loop.finished == "drain_limit" and clock.t > CFG.drain_limit_s
    assert lc.s == LifecycleState.STOPPED


def test_a_full_parameter_run_does_not_start_for_a_first_policy(tmp_path):
    """``first_policy_start=False``: the base model is policy 0; S1 waits for a backlog."""
    import attrs

    for first_policy_start in (True, False):
        store = DirStore(tmp_path / f"fp-{first_policy_start}", fsync=False)
        clock = Clock()
        buf = MemoryBuffer(clock=clock)
        lc = DriverLifecycle(
            lambda i: FakeBackend(seed=3),
            buf,
            CutStore(store),
            ReleaseStore(store),
            groups_per_round=2,
            max_policy_age=CFG.a_hard,
            clock=clock,
            workdir=tmp_path / f"w-{first_policy_start}",
        )
        loop = TrainerLoop(
            S1Scheduler(),
            lc,
            buf.backlog,
            lambda store=store: ReleaseStore(store).latest() is not None,  # none yet
            Journal(store),
            attrs.evolve(CFG, first_policy_start=first_policy_start),
            clock=clock,
        )
        for _ in range(5):
            loop.tick()
            clock.t += 1.0
        starts = [r for r in Journal(store).read() if r["kind"] == "start"]
        if first_policy_start:  # LoRA: start at once to publish the first adapter
            assert [s["reason"] for s in starts] == ["first_policy"]
        else:  # full-parameter: nothing waits, nothing starts
            assert starts == [] and lc.state() == LifecycleState.STOPPED
            for i in range(6):  # A_hard + 1 rounds of backlog start it
                buf.append(make_group(i, 0))
            loop.tick()
            starts = [r for r in Journal(store).read() if r["kind"] == "start"]
            assert [s["reason"] for s in starts] == ["backlog"]


def test_more_ready_only_when_a_train_command_trained_every_round_it_asked_for(tmp_path):
    """The head skips its tick wait after a tick whose train command trained all
    ``rounds_per_tick`` rounds (more full rounds may wait), and only then."""
    run = Run(tmp_path)
    run.head()
    run.loop.config = attrs.evolve(CFG, rounds_per_tick=2)
    seen = []
    for _ in range(30):
        run.feed()
        trained_before = run.loop.rounds_this_incarnation
        run.loop.tick()
        n = run.loop.rounds_this_incarnation - trained_before
        seen.append((n, run.loop.more_ready))
        run.clock.t += 1.0
    # 6 groups at t=0 are 3 rounds: one command of 2 (more may wait), one of 1 (no more)
    assert (2, True) in seen and (1, False) in seen
    assert all(ready == (n == 2) for n, ready in seen)
