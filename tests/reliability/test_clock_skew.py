"""The head reports an island whose clock is skewed (and when it is back)."""

from __future__ import annotations

from yeto_core.head.clock_skew import ClockSkewWatch
from yeto_core.records import Event


def _ev(t: float) -> Event:
    return Event(kind="sampler_round", time=t, source="s", data={})


def test_a_skewed_island_is_reported_once_and_its_recovery_too():
    w = ClockSkewWatch(bound_s=60.0)
    streams = {"good": [_ev(100.0)], "bad": [_ev(100.0)]}
    assert w.poll(streams, 100.0) == []  # the first read is history
    streams["good"].append(_ev(101.0))
    streams["bad"].append(_ev(101.0 + 300))  # its clock jumped 5 minutes ahead
    out = w.poll(streams, 102.0)
    assert [(k, d["island"]) for k, d in out] == [("island_clock_skew", "bad")]
    assert out[0][1]["skew_s"] == 299.0
    streams["bad"].append(_ev(103.0 + 300))
    assert w.poll(streams, 104.0) == []  # reported once per episode
    streams["bad"].append(_ev(105.0))
    assert [k for k, _ in w.poll(streams, 106.0)] == ["island_clock_ok"]
    streams["bad"].append(_ev(107.0 - 600))  # now 10 minutes behind
    assert w.poll(streams, 108.0)[0][1]["skew_s"] == -601.0


def test_a_quiet_island_and_flush_delays_are_not_skew():
    w = ClockSkewWatch(bound_s=60.0)
    streams = {"a": [_ev(0.0)]}
    w.poll(streams, 0.0)
    assert w.poll(streams, 500.0) == []  # nothing new: silence is not skew
    streams["a"].append(_ev(495.0))
    assert w.poll(streams, 500.0) == []


def test_an_island_whose_clock_jumps_back_keeps_flushing_its_stream(tmp_path):
    """Found by `yeto bench chaos --faults clock`: the flush window was measured on the
    wall clock, so a sampler whose clock jumped back minutes flushed nothing until it
    stopped (the head saw none of its events)."""
    from yeto_core.events.stream import EventStream, read_events
    from yeto_core.stores.dir_store import DirStore

    store = DirStore(tmp_path)
    t = [1000.0]
    s = EventStream(store, "sampler-0", clock=lambda: t[0], flush_s=1.0)
    s.emit("a")
    t[0] += 2.0
    s.emit("b")  # due: flushed
    t[0] -= 400.0  # the clock jumps back
    s.emit("c")
    assert [e.kind for e in read_events(store, "sampler-0")] == ["a", "b", "c"]
