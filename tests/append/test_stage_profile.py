"""``stage()``: seconds and counts per name, nesting, the open stage per thread, errors."""

from __future__ import annotations

import threading

import pytest

from yeto_core.stage_profile import StageProfile


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_nested_stages_add_seconds_and_counts_and_name_the_innermost():
    clock = Clock()
    p = StageProfile(clock)
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
    assert stages == {"inner": {"s": 2.5, "n": 2}, "outer": {"s": 3.0, "n": 1}}


def test_a_stage_that_raises_is_timed_and_closed():
    clock = Clock()
    p = StageProfile(clock)
    with pytest.raises(KeyError):
        with p.stage("boom"):
            clock.t += 4.0
            raise KeyError("x")
    assert p.current() is None
    assert p.snapshot()["stages"] == {"boom": {"s": 4.0, "n": 1}}


def test_the_open_stage_is_per_thread_and_within_does_not_time():
    p = StageProfile(Clock())
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
    assert p.snapshot()["stages"] == {"outer": {"s": 0.0, "n": 1}}
