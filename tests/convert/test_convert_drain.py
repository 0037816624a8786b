"""P0-S on a sampler island: a stop finishes the in-flight groups within the bound, else
abandons them and counts them; a group is never half-appended (yeto_core.sampler.drain)."""

from __future__ import annotations

import threading
from typing import Any

from yeto_core.records import SamplingParams
from yeto_core.sampler.drain import DrainGuard
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_core.testing.fakes import DigitsTask, WeightFileEngine

WAIT = 10.0


class GatedEngine(WeightFileEngine):
    """``generate`` of round ``gate_round`` (0-based) waits until ``go`` is set."""

    def __init__(self, gate_round: int) -> None:
        super().__init__()
        self.calls, self.gate_round = 0, gate_round
        self.entered, self.go = threading.Event(), threading.Event()

    def generate(self, prompts, n, sampling):
        if self.calls == self.gate_round:
            self.entered.set()
            assert self.go.wait(WAIT)
        self.calls += 1
        return super().generate(prompts, n, sampling)


class GatedBuffer(MemoryBuffer):
    """The ``gate_at``-th append (0-based) waits until ``go`` is set."""

    def __init__(self, gate_at: int = -1) -> None:
        super().__init__()
        self.appends, self.gate_at = 0, gate_at
        self.entered, self.go = threading.Event(), threading.Event()

    def append(self, group):
        if self.appends == self.gate_at:
            self.entered.set()
            assert self.go.wait(WAIT)
        self.appends += 1
        return super().append(group)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _setup(engine, buffer, clock) -> tuple[SamplerLoop, DrainGuard, list, threading.Event]:
    events: list[Any] = []
    exited = threading.Event()
    loop = SamplerLoop(
        buffer,
        engine,
        DigitsTask(),
        host="flex-0",
        incarnation=1,
        group_size=2,
        prompts_per_call=3,
        sampling=SamplingParams(),
    )
    guard = DrainGuard(
        loop,
        loop.stop,
        5.0,
        events.append,
        incarnation=1,
        exit=lambda code: exited.set(),
        clock=clock,
    )
    return loop, guard, events, exited


def _run(loop, guard) -> threading.Thread:
    def body() -> None:
        try:
            loop.run()
            guard.finished()
        except Exception:
            pass  # the abandoned round's next append raises; the process is exiting

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def _drained(events) -> dict:
    [e] = [e for e in events if e.kind == "sampler_drained"]
    return dict(e.data)


def test_a_round_that_finishes_within_the_bound_is_appended_whole() -> None:
    engine, buffer, clock = GatedEngine(gate_round=1), GatedBuffer(), Clock()
    loop, guard, events, exited = _setup(engine, buffer, clock)
    t = _run(loop, guard)
    assert engine.entered.wait(WAIT)  # round 1 generating; round 0 appended
    guard.request_stop()
    clock.t = 4.9  # within the bound
    engine.go.set()
    t.join(WAIT)
    assert not t.is_alive() and not exited.is_set()
    d = _drained(events)
    assert (d["finished"], d["abandoned"], d["incarnation"]) == (3, 0, 1)
    assert buffer.head_position == 6  # two whole rounds


def test_a_round_past_the_bound_is_abandoned_counted_and_never_appended() -> None:
    engine, buffer, clock = GatedEngine(gate_round=1), GatedBuffer(), Clock()
    loop, guard, events, exited = _setup(engine, buffer, clock)
    t = _run(loop, guard)
    assert engine.entered.wait(WAIT)
    guard.request_stop()
    clock.t = 5.1  # past the bound: the watchdog abandons the round and exits
    assert exited.wait(WAIT)
    d = _drained(events)
    assert (d["finished"], d["abandoned"]) == (0, 3)
    engine.go.set()  # (a real island is gone by now; here the round may not append)
    t.join(WAIT)
    assert buffer.head_position == 3  # round 0 only; nothing of the abandoned round


def test_a_call_in_progress_at_the_bound_lands_whole_through_the_ports_default_commit() -> None:
    # MemoryBuffer's append_many is the port's default (append each in order): the call
    # in progress when the bound passes still lands whole and every group is counted
    engine, buffer, clock = GatedEngine(gate_round=-1), GatedBuffer(gate_at=4), Clock()
    loop, guard, events, exited = _setup(engine, buffer, clock)
    t = _run(loop, guard)
    assert buffer.entered.wait(WAIT)  # round 1: its first group appended, the second in flight
    guard.request_stop()
    clock.t = 6.0  # the bound passed while the append is in progress
    deadline = threading.Event()
    while not guard.buffer.closed:  # the watchdog saw the deadline: no new append starts
        assert not deadline.wait(0.01) and t.is_alive()
    buffer.go.set()
    t.join(WAIT)
    assert not t.is_alive()
    d = _drained(events)
    # the call (round 1) was committing at the stop: its 3 groups count as finished
    # after the stop (finished + abandoned = the round in flight)
    assert (d["finished"], d["abandoned"]) == (3, 0)
    assert buffer.head_position == 6  # both rounds whole; no round started after the stop
    assert [g.group_id for g in buffer.groups][-1].endswith(f"p{loop.offset + 5}")


def test_a_sampler_stopped_while_its_engine_starts_reports_nothing_in_flight(tmp_path) -> None:
    import types

    from yeto_core import hookimpl
    from yeto_core.config import run_store
    from yeto_core.events.stream import read_events
    from yeto_core.islands.main import Terminated, run_island
    from yeto_core.providers.env import island_launch
    from yeto_core.stores.dir_store import DirStore
    from yeto_core.testing.fake_island import plugins_with_fakes
    from yeto_core.testing.fake_run import fake_run_config

    class StoppedWhileStarting(WeightFileEngine):
        PLUGIN_NAME = "stopped-while-starting"

        @classmethod
        def from_config(cls, options, *, model_dir, seed):
            raise Terminated(0)  # what SIGTERM raises while the engine loads

    config = fake_run_config(
        tmp_path, samplers=[{"engine": "stopped-while-starting", "group_size": 2}]
    )
    store = DirStore(tmp_path / "store", fsync=False)
    run_store.write_config(store, config)
    run_store.publish_model(store, tmp_path / "model")
    plugins = plugins_with_fakes(entry_points=False)
    plugins.add(
        types.SimpleNamespace(
            yeto_register_sampler_engines=hookimpl(lambda register: register(StoppedWhileStarting))
        ),
        name="test-engine",
    )
    launch = island_launch(store, run_id="t", role="sampler", island="sampler-0", incarnation=3)
    assert run_island(launch.env, plugins) == 0
    drained = [e.data for e in read_events(store, "sampler-0") if e.kind == "sampler_drained"]
    assert drained == [{"incarnation": 3, "finished": 0, "abandoned": 0, "before_loop": True}]


class BatchRecordingBuffer(MemoryBuffer):
    """Records each ``append_many`` call; the ``gate_call``-th (0-based) waits for ``go``;
    ``fail_after`` (if set) makes a call land that many new groups, then raise."""

    def __init__(self, gate_call: int = -1, fail_after: int = -1) -> None:
        super().__init__()
        self.calls: list[list[str]] = []
        self.gate_call, self.fail_after = gate_call, fail_after
        self.entered, self.go = threading.Event(), threading.Event()
        self.failing = False

    def append(self, group):
        if self.failing and group.group_id not in self._ids:
            raise OSError(28, "No space left on device")
        return super().append(group)

    def append_many(self, groups):
        self.calls.append([g.group_id for g in groups])
        if len(self.calls) - 1 == self.gate_call:
            self.entered.set()
            assert self.go.wait(WAIT)
            if self.fail_after >= 0:
                for g in groups[: self.fail_after]:
                    super().append(g)
                self.failing = True
                raise OSError(28, "No space left on device")
        return [super(BatchRecordingBuffer, self).append(g) for g in groups]


def test_a_calls_groups_go_to_the_buffer_in_one_group_commit() -> None:
    engine, buffer, clock = GatedEngine(gate_round=2), BatchRecordingBuffer(), Clock()
    loop, guard, events, exited = _setup(engine, buffer, clock)
    t = _run(loop, guard)
    assert engine.entered.wait(WAIT)  # rounds 0 and 1 appended
    guard.request_stop()
    engine.go.set()
    t.join(WAIT)
    assert [len(c) for c in buffer.calls] == [3, 3, 3]  # one append_many per call
    assert _drained(events) == {
        "incarnation": 1, "finished": 3, "abandoned": 0, "bound_s": 5.0,
        "seconds": _drained(events)["seconds"],
    }  # fmt: skip
    assert buffer.head_position == 9


def test_a_group_commit_in_progress_at_the_bound_lands_whole_and_counts_every_group() -> None:
    engine, buffer, clock = GatedEngine(gate_round=-1), BatchRecordingBuffer(gate_call=1), Clock()
    loop, guard, events, exited = _setup(engine, buffer, clock)
    t = _run(loop, guard)
    assert buffer.entered.wait(WAIT)  # round 1's group commit in progress
    guard.request_stop()
    clock.t = 6.0  # the bound passed during the commit
    deadline = threading.Event()
    while not guard.buffer.closed:
        assert not deadline.wait(0.01) and t.is_alive()
    buffer.go.set()
    t.join(WAIT)
    assert not t.is_alive()
    # the round is complete: the watchdog or the loop's end reports it (whichever takes
    # the lock first; the same report either way)
    d = _drained(events)
    assert (d["finished"], d["abandoned"]) == (3, 0)
    assert buffer.head_position == 6
    assert len(buffer.calls) == 2  # nothing started after the bound


def test_a_group_commit_that_fails_part_way_counts_exactly_the_groups_that_landed() -> None:
    engine, buffer, clock = (
        GatedEngine(gate_round=-1),
        BatchRecordingBuffer(gate_call=1, fail_after=2),
        Clock(),
    )
    loop, guard, events, exited = _setup(engine, buffer, clock)
    t = _run(loop, guard)
    assert buffer.entered.wait(WAIT)
    guard.request_stop()
    clock.t = 6.0
    deadline = threading.Event()
    while not guard.buffer.closed:
        assert not deadline.wait(0.01) and t.is_alive()
    buffer.go.set()  # two of the call's three groups land, then the disk is full
    assert exited.wait(WAIT)
    t.join(WAIT)
    d = _drained(events)
    assert (d["finished"], d["abandoned"]) == (2, 1)
    assert buffer.head_position == 5
