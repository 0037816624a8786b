"""``overlap_append`` (a sampler on a remote store): a call's group commit lands on a
thread while the next call generates; one commit in flight at a time, in call order;
its error is raised, the loop's end waits for it, and the drain guard counts it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import SamplingParams
from yeto_core.sampler.drain import DrainGuard
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_core.testing.fakes import (
    DigitsTask,
    EngineFollower,
    RemoteLookingDirStore,
    WeightFileEngine,
    digits_sampler,
)

WAIT = 10.0


class GatedCommits:
    """The ``gate``-th ``append_many`` (0-based) waits for ``go``; ``fail`` makes the
    first one raise instead."""

    def setup_gate(self, gate: int = -1, fail: bool = False) -> None:
        self.commits, self.gate, self.fail = 0, gate, fail
        self.entered, self.go = threading.Event(), threading.Event()
        self.in_commit = False

    def append_many(self, groups: Any) -> Any:
        n, self.commits = self.commits, self.commits + 1
        if self.fail and n == 0:
            raise OSError(28, "No space left on device")
        self.in_commit = True
        try:
            if n == self.gate:
                self.entered.set()
                assert self.go.wait(WAIT)
            return super().append_many(groups)  # type: ignore[misc]
        finally:
            self.in_commit = False


class GatedMemory(GatedCommits, MemoryBuffer):
    def __init__(self, gate: int = -1, fail: bool = False) -> None:
        MemoryBuffer.__init__(self)
        self.setup_gate(gate, fail)


class GatedFile(GatedCommits, FileSampleBuffer):
    def __init__(self, store: Any, gate: int = -1) -> None:
        FileSampleBuffer.__init__(self, store, layout="objects", host="h")
        self.setup_gate(gate)


class RecordingEngine(WeightFileEngine):
    """Records, per call, whether the buffer was committing while it generated; the
    ``gate``-th call (0-based) waits for ``go``."""

    def __init__(self, buffer: Any, gate: int = -1) -> None:
        super().__init__()
        self.buffer, self.calls, self.gate = buffer, 0, gate
        self.during_commit: list[bool] = []
        self.entered, self.go = threading.Event(), threading.Event()

    def generate(self, prompts, n, sampling):
        if self.calls == self.gate:
            self.entered.set()
            assert self.go.wait(WAIT)
        self.calls += 1
        self.during_commit.append(bool(self.buffer.in_commit))
        return super().generate(prompts, n, sampling)


def make_loop(buffer: Any, engine: Any, **kw: Any) -> SamplerLoop:
    return SamplerLoop(
        buffer,
        engine,
        DigitsTask(),
        host="h",
        incarnation=0,
        group_size=2,
        prompts_per_call=3,
        sampling=SamplingParams(),
        overlap_append=True,
        **kw,
    )


def in_thread(fn: Any) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def body() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def test_a_calls_commit_lands_while_the_next_call_generates() -> None:
    buffer = GatedMemory(gate=0)
    engine = RecordingEngine(buffer)
    loop = make_loop(buffer, engine)
    assert loop.run_round() == []  # returns before its groups land
    assert buffer.entered.wait(WAIT) and buffer.head_position == 0
    t, out = in_thread(loop.run_round)  # generates, then waits for the first commit
    deadline = threading.Event()
    while engine.calls < 2:
        assert not deadline.wait(0.01)
    assert engine.during_commit == [False, True]  # the second call generated meanwhile
    assert t.is_alive() and buffer.head_position == 0  # one commit in flight at a time
    buffer.go.set()
    t.join(WAIT)
    assert out == {"result": []} and loop.flush() == [3, 4, 5]
    ids = [g.group_id for g in buffer.groups]
    assert ids == [f"h-i0-p{loop.offset + k}" for k in range(6)]  # in call order
    assert loop.groups_appended == 6 and loop.rounds == 2


def test_a_commit_error_is_raised_by_the_next_call() -> None:
    buffer = GatedMemory(fail=True)
    loop = make_loop(buffer, RecordingEngine(buffer))
    assert loop.run_round() == []
    with pytest.raises(OSError, match="No space"):
        loop.run_round()


def test_a_commit_error_is_raised_by_flush_and_by_the_end_of_run() -> None:
    buffer = GatedMemory(fail=True)
    loop = make_loop(buffer, RecordingEngine(buffer))
    loop.run_round()
    with pytest.raises(OSError, match="No space"):
        loop.flush()
    assert loop.flush() == []  # reported once
    buffer = GatedMemory(fail=True)
    loop = make_loop(buffer, RecordingEngine(buffer))
    with pytest.raises(OSError, match="No space"):
        _run_until_stopped(loop, 1)


def _run_until_stopped(loop: SamplerLoop, rounds: int) -> int:
    real = loop.run_round

    def counted() -> Any:
        out = real()
        if loop.rounds >= rounds:
            loop.stop.set()
        return out

    loop.run_round = counted  # type: ignore[method-assign]
    return loop.run()


def test_the_loop_ends_with_every_call_landed() -> None:
    buffer = GatedMemory()
    loop = make_loop(buffer, RecordingEngine(buffer))
    assert _run_until_stopped(loop, 3) == 3
    assert buffer.head_position == 9 and loop.groups_appended == 9
    assert loop._landing is None


def test_between_windows_a_call_may_stay_in_flight_and_sync_rounds_never_overlaps() -> None:
    buffer = GatedMemory(gate=0)
    loop = make_loop(buffer, RecordingEngine(buffer))
    loop.run(max_rounds=1)  # the pause loop's one round: not waited for
    assert buffer.entered.wait(WAIT) and buffer.head_position == 0
    buffer.go.set()
    assert loop.flush() == [0, 1, 2]
    engine = WeightFileEngine()
    synced = SamplerLoop(
        MemoryBuffer(),
        engine,
        DigitsTask(),
        EngineFollower(engine),
        host="h",
        incarnation=0,
        sync_rounds=True,
        overlap_append=True,
    )
    assert synced.overlap_append is False


def _guarded(buffer: Any, engine: Any, clock: list[float]):
    loop = make_loop(buffer, engine)
    events: list[Any] = []
    exited = threading.Event()
    guard = DrainGuard(
        loop,
        loop.stop,
        5.0,
        events.append,
        incarnation=1,
        exit=lambda code: exited.set(),
        clock=lambda: clock[0],
    )
    return loop, guard, events, exited


def _drained(events: list[Any]) -> dict:
    [e] = [e for e in events if e.kind == "sampler_drained"]
    return dict(e.data)


def test_a_stop_within_the_bound_lands_the_commit_and_the_call_generating() -> None:
    buffer, clock = GatedMemory(gate=0), [0.0]
    engine = RecordingEngine(buffer, gate=1)
    loop, guard, events, exited = _guarded(buffer, engine, clock)

    def body() -> None:
        loop.run()
        guard.finished()

    t, out = in_thread(body)
    assert buffer.entered.wait(WAIT) and engine.entered.wait(WAIT)  # both in flight
    guard.request_stop()
    assert guard.in_flight() == 6
    clock[0] = 4.9
    buffer.go.set()
    engine.go.set()
    t.join(WAIT)
    assert out == {"result": None} and not exited.is_set()
    assert (_drained(events)["finished"], _drained(events)["abandoned"]) == (6, 0)
    assert buffer.head_position == 6


def test_past_the_bound_the_commit_in_progress_lands_and_the_next_call_is_abandoned() -> None:
    buffer, clock = GatedMemory(gate=0), [0.0]
    engine = RecordingEngine(buffer, gate=1)
    loop, guard, events, exited = _guarded(buffer, engine, clock)
    t, out = in_thread(loop.run)
    assert buffer.entered.wait(WAIT) and engine.entered.wait(WAIT)
    guard.request_stop()
    clock[0] = 5.1  # the bound passes while the first call commits, the second generates
    deadline = threading.Event()
    while not guard.buffer.closed:
        assert not deadline.wait(0.01)
    buffer.go.set()  # the commit in progress lands whole and is counted
    assert exited.wait(WAIT)
    assert (_drained(events)["finished"], _drained(events)["abandoned"]) == (3, 3)
    engine.go.set()  # (a real island is gone by now; here the next commit is refused)
    t.join(WAIT)
    assert buffer.head_position == 3


def test_the_backlog_read_ahead_counts_a_commit_still_landing(tmp_path) -> None:
    buffer = GatedFile(RemoteLookingDirStore(tmp_path / "s"), gate=0)
    engine = RecordingEngine(buffer)
    loop = digits_sampler(buffer, engine=engine, backlog_cap=64, overlap_append=True)
    loop.claim_room()
    loop.run_round()  # its commit waits at the gate
    assert buffer.entered.wait(WAIT)
    t, out = in_thread(loop.run_round)
    deadline = threading.Event()
    while engine.calls < 2:
        assert not deadline.wait(0.01)
    assert loop._backlog_ahead is not None
    assert loop._backlog_ahead[0].result(WAIT).groups == 0  # read before anything landed
    buffer.go.set()
    t.join(WAIT)
    loop.flush()
    room, why = loop.claim_room()
    # the read missed both calls: the one committing when it began and the one it ran with
    assert why["read_ahead"] is True and why["backlog_groups"] == 8 and room == 4
