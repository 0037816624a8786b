"""``stage()``: seconds, CPU seconds and counts per name, nesting, the open stage per thread,
errors."""

from __future__ import annotations

import threading

import pytest

from yeto_core.stage_profile import StageProfile, summarize


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_nested_stages_add_seconds_and_counts_and_name_the_innermost():
    clock = Clock()
    p = StageProfile(clock, cpu_clock=Clock())
    assert p.current() is None
    with p.stage("outer"):
        clock.t += 1.0
        assert p.current() == "outer"
        with p.stage("inner"):
            assert p.current() == "inner"
            clock.t += 2.0
        assert p.current() == "outer"
    with p.stage("inner"):
        clock.t += 0.5
    assert p.current() is None
    stages = p.snapshot()["stages"]
    assert stages == {
        "inner": {"s": 2.5, "n": 2, "cpu_s": 0.0},
        "outer": {"s": 3.0, "n": 1, "cpu_s": 0.0},
    }


def test_a_stage_without_cpu_never_reads_the_cpu_clock_and_is_still_the_open_stage():
    """``cpu=False`` (the short stages inside every buffer append): wall seconds and a
    count, no ``cpu_s``, no read of the thread's CPU clock; requests still count for it."""
    wall = Clock()
    reads = []

    def cpu_clock() -> float:
        reads.append(1)
        return 0.0

    p = StageProfile(wall, cpu_clock=cpu_clock)
    with p.stage("buffer.payload_put", cpu=False):
        assert p.current() == "buffer.payload_put"
        wall.t += 0.25
    assert reads == []
    assert p.current() is None
    assert p.snapshot()["stages"] == {"buffer.payload_put": {"s": 0.25, "n": 1}}


def test_each_stage_sums_its_threads_cpu_apart_from_its_wall_time():
    """A stage that waits shows wall seconds well above its CPU seconds; the summary
    gives both per round."""
    wall, cpu = Clock(), Clock()
    p = StageProfile(wall, cpu_clock=cpu)
    with p.stage("train"):
        wall.t += 3.0
        cpu.t += 2.0  # on a core two of the three seconds
    with p.stage("commit"):
        wall.t += 1.0  # an fsync: no CPU
    p.add("store.get", 0.5)  # timed by its caller: wall only
    stages = p.snapshot()["stages"]
    assert stages["train"] == {"s": 3.0, "n": 1, "cpu_s": 2.0}
    assert stages["commit"] == {"s": 1.0, "n": 1, "cpu_s": 0.0}
    assert stages["store.get"] == {"s": 0.5, "n": 1}
    rows = summarize(p.snapshot(), rounds=2)["stages"]
    assert rows["train"]["ms_per_round"] == 1500.0
    assert rows["train"]["cpu_ms_per_round"] == 1000.0
    assert "cpu_ms_per_round" not in rows["store.get"]


def test_the_cpu_clock_is_the_threads_own():
    """The default CPU clock counts only the thread that runs the stage: a stage that
    sleeps while another thread spins shows almost no CPU."""
    import time

    p = StageProfile()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin)
    t.start()
    try:
        with p.stage("sleep"):
            time.sleep(0.2)
    finally:
        stop.set()
        t.join()
    with p.stage("work"):
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
    stages = p.snapshot()["stages"]
    assert stages["sleep"]["s"] >= 0.2
    assert stages["sleep"]["cpu_s"] < 0.05
    assert stages["work"]["cpu_s"] >= 0.05


def test_a_stage_that_raises_is_timed_and_closed():
    clock = Clock()
    p = StageProfile(clock, cpu_clock=Clock())
    with pytest.raises(KeyError):
        with p.stage("boom"):
            clock.t += 4.0
            raise KeyError("x")
    assert p.current() is None
    assert p.snapshot()["stages"] == {"boom": {"s": 4.0, "n": 1, "cpu_s": 0.0}}


def test_the_open_stage_is_per_thread_and_within_does_not_time():
    p = StageProfile(Clock(), cpu_clock=Clock())
    seen = {}

    def worker() -> None:
        seen["before"] = p.current()
        with p.within("outer"):
            seen["inside"] = p.current()
        with p.within(None):
            seen["none"] = p.current()

    with p.stage("outer"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert seen == {"before": None, "inside": "outer", "none": None}
    assert p.snapshot()["stages"] == {"outer": {"s": 0.0, "n": 1, "cpu_s": 0.0}}
