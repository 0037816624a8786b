"""``whole_call_wait_s``: while the trainer trains, a sampler call that the fresh room
would cut short waits (bounded) for the follower's next load and goes whole; with the
trainer stopped, a backlog under a round, or no steady loads, it goes short at once.
A settable clock and a follower double whose wait either loads or times out: no sleeps."""

from __future__ import annotations

import collections
import contextlib
import threading

import pytest

from yeto_core.sampler.interfaces import Follower
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_core.testing.fakes import Clock, digits_sampler

PER_ROUND = 16


class PacedFollower(Follower):
    """Serves ``engine.version`` and remembers load times; ``wait_version`` plays what
    happens while a sampler waits: ``load`` (the next release loads at once), ``none``
    (nothing comes: the clock runs out the timeout) or ``stop`` (the island is stopped)."""

    def __init__(self, engine, clock, load_times=(), on_wait="load", stop=None):
        self.engine, self.clock, self.on_wait, self.stop = engine, clock, on_wait, stop
        self.load_times = collections.deque(load_times, maxlen=2)
        self.last_round_straddled = False
        self.waits = []

    @property
    def version(self):
        return self.engine.version

    @contextlib.contextmanager
    def round(self):
        yield self.engine.version

    def wait_version(self, version, timeout):
        self.waits.append((version, round(timeout, 6)))
        if self.on_wait == "load":
            self.clock.advance(timeout / 4)
            self.engine.version = version
            self.load_times.append(self.clock.t)
            return True
        if self.on_wait == "stop":
            self.stop.set()
            return False
        self.clock.advance(timeout)
        return False


def loop_with_backlog(
    groups, *, served=0, newest=1, load_times=(0.0, 0.05), now=0.06, on_wait="load", **kw
):
    """One island of two (``share_of`` 2, 8 prompts a call, ``fresh_only`` (3, 16)) over a
    buffer already holding ``groups`` fresh groups; it serves ``served`` and has seen
    release ``newest``."""
    buf = MemoryBuffer()
    filler = digits_sampler(buf, prompts_per_call=groups)
    filler.run_round()
    assert buf.backlog().groups == groups
    clock = Clock(now)
    stop = threading.Event()
    loop = digits_sampler(
        buf,
        prompts_per_call=8,
        backlog_cap=64,
        fresh_only=(3, PER_ROUND),
        share_of=2,
        latest_release=lambda: (newest, None),
        clock=clock,
        stop=stop,
        backlog_poll_s=0.5,
        whole_call_wait_s=kw.pop("whole_call_wait_s", 1.0),
        **kw,
    )
    loop.engine.version = served
    follower = PacedFollower(loop.engine, clock, load_times, on_wait, stop)
    loop.follower = follower
    return loop, follower, clock, buf


def test_a_short_call_waits_for_the_next_load_and_goes_whole():
    # served 0, newest 1, 36 waiting: fresh room (3 + 1 - 1) x 16 - 36 = 12, 6 each
    loop, follower, clock, _buf = loop_with_backlog(36)
    assert loop.claim_room()[0] == 6  # without waiting the call would be cut to 6
    assert loop.wait_for_room()
    assert follower.waits == [(1, 0.09)]  # at most until 2 intervals after the last load
    assert loop.engine.version == 1
    assert loop.call_size == 8  # after the load: (4 - 0) x 16 - 36 = 28, 14 each
    assert loop.call_room["fresh_room"] == 28
    assert loop.call_room["whole_call_wait_s"] == pytest.approx(0.0225)  # the load came
    assert loop.run_round() and loop.call_size == 8


def test_without_the_option_the_call_goes_short():
    loop, follower, _clock, _buf = loop_with_backlog(36, whole_call_wait_s=0.0)
    assert loop.wait_for_room()
    assert follower.waits == [] and loop.call_size == 6
    assert "whole_call_wait_s" not in loop.call_room


@pytest.mark.parametrize(
    "load_times, now, why",
    [
        ((), 0.06, "no load yet"),
        ((0.05,), 0.06, "one load: no pace"),
        ((0.0, 0.05), 10.0, "the trainer stopped: no load for 200 intervals"),
        ((0.0, 3.0), 3.1, "the next load is due in 2.9 s, past the 1 s bound"),
    ],
)
def test_without_steady_loads_the_call_goes_short_at_once(load_times, now, why):
    loop, follower, clock, _buf = loop_with_backlog(36, load_times=load_times, now=now)
    assert loop.wait_for_room(), why
    assert follower.waits == [], why
    assert loop.call_size == 6 and clock.t == now, why


def test_a_backlog_under_a_round_goes_short_at_once():
    # the trainer may be waiting for these groups: served 0, newest 3, 10 waiting
    loop, follower, _clock, _buf = loop_with_backlog(10, newest=3)
    assert loop.wait_for_room()
    assert follower.waits == [] and loop.call_size == 3  # (4 - 3) x 16 - 10 = 6, 3 each


def test_the_wait_is_bounded_then_the_call_goes_short():
    loop, follower, clock, _buf = loop_with_backlog(36, on_wait="none")
    assert loop.wait_for_room()
    assert follower.waits == [(1, 0.09)]
    assert clock.t == pytest.approx(0.15)  # two intervals after the last load, no more
    assert loop.call_size == 6 and loop.call_room["whole_call_wait_s"] == pytest.approx(0.09)
    # the bound is whole_call_wait_s when the pace is slower, and one wait is at most
    # backlog_poll_s long
    loop, follower, clock, _buf = loop_with_backlog(
        36, on_wait="none", load_times=(0.0, 0.8), now=1.0, whole_call_wait_s=0.7
    )
    assert loop.wait_for_room()
    assert follower.waits == [(1, 0.5), (1, 0.2)]
    assert clock.t == pytest.approx(1.7) and loop.call_size == 6


def test_a_stop_ends_the_wait():
    loop, follower, _clock, _buf = loop_with_backlog(36, on_wait="stop")
    assert loop.wait_for_room() is False
    assert len(follower.waits) == 1


def test_sync_rounds_never_waits_for_a_whole_call():
    loop, follower, _clock, _buf = loop_with_backlog(36)
    loop.sync_rounds = True
    loop.rounds = 0  # version 0 is served: no wait for the policy either
    assert loop.wait_for_room()
    assert follower.waits == [] and loop.call_size == 6


def test_a_negative_wait_is_refused():
    with pytest.raises(ValueError, match="whole_call_wait_s=-1"):
        digits_sampler(MemoryBuffer(), whole_call_wait_s=-1)


class UnwakingFollower(Follower):
    """Records load times but keeps :class:`Follower`'s ``wait_version`` (it cannot be
    woken by a load)."""

    def __init__(self, engine, load_times):
        self.engine = engine
        self.load_times = collections.deque(load_times, maxlen=2)
        self.asked = 0

    @property
    def version(self):
        return self.engine.version

    @contextlib.contextmanager
    def round(self):
        yield self.engine.version

    def wait_version(self, version, timeout):
        self.asked += 1
        assert self.asked < 10, "the loop spins on a follower that cannot wake it"
        return super().wait_version(version, timeout)


class ClockStop(threading.Event):
    """A stop event whose wait runs the settable clock out instead of sleeping."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.waits = clock, []

    def wait(self, timeout=None):
        self.waits.append(round(timeout, 6))
        self.clock.advance(timeout)
        return self.is_set()


def test_a_follower_that_cannot_wake_the_loop_makes_it_wait_on_its_stop():
    loop, _follower, clock, _buf = loop_with_backlog(36)
    loop.follower = follower = UnwakingFollower(loop.engine, (0.0, 0.05))
    loop.stop = ClockStop(clock)
    assert loop.wait_for_room()
    assert follower.asked == 1
    assert loop.stop.waits == [0.09]  # the same bounded slice, waited on the stop event
    assert clock.t == pytest.approx(0.15) and loop.call_size == 6
