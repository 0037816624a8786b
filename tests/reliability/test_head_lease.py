"""The head lease: a second head is refused, a lapsed lease is taken over, the old head fenced
(it writes nothing more), on dir, moto and SeaweedFS."""

from __future__ import annotations

import pytest

from yeto_core.head.lease import (
    LEASE_KEY,
    HeadBusyError,
    HeadFencedError,
    HeadLease,
    LeasedStore,
    read_lease,
)


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _lease(store, clock, host="h1", pid=None):
    return HeadLease(store, ttl_s=30.0, clock=clock, host=host, pid=pid)


def test_a_second_head_is_refused_while_the_lease_lives(any_store):
    clock = Clock()
    first = _lease(any_store, clock, pid=1)
    assert first.acquire() is None
    second = _lease(any_store, clock, host="h2", pid=2)
    clock.t += 20
    with pytest.raises(HeadBusyError, match="another head holds this run's lease"):
        second.acquire()
    first.renew()  # the first keeps its lease
    clock.t += 25  # 45 s after taking, 25 s after the renewal: still live
    with pytest.raises(HeadBusyError, match="pid 1 on h1"):
        second.acquire()
    assert read_lease(any_store)["holder"] == first.holder


def test_a_lapsed_lease_is_taken_over_and_the_old_head_is_fenced_and_writes_nothing(any_store):
    clock = Clock()
    old = _lease(any_store, clock, pid=1)
    old.acquire()
    old_view = LeasedStore(any_store, old)
    old_view.put("x/before", b"1")
    clock.t += 31  # the old head was paused past its lease
    new = _lease(any_store, clock, host="h2", pid=2)
    lapsed = new.acquire()
    assert lapsed is not None and lapsed["holder"] == old.holder and lapsed["pid"] == 1
    # the old head wakes: its first write renews first, finds the lease taken, writes nothing
    with pytest.raises(HeadFencedError, match="lost the run's lease"):
        old_view.put("x/after", b"2")
    assert not any_store.exists("x/after")
    for write in (
        lambda: old_view.put_if_absent("x/a2", b"3"),
        lambda: old_view.put_if_match("x/a3", b"4", None),
        lambda: old_view.delete("x/before"),
    ):
        with pytest.raises(HeadFencedError):
            write()
    assert any_store.exists("x/before") and not any_store.exists("x/a2")
    assert not any_store.exists("x/a3")
    assert old_view.get("x/before") == b"1"  # reads still work
    new.renew()
    assert read_lease(any_store)["holder"] == new.holder


def test_a_renewal_whose_answer_was_lost_is_not_a_fence(any_store):
    clock = Clock()
    lease = _lease(any_store, clock)
    lease.acquire()
    inner = any_store.put_if_match

    def lost_answer(key, data, version):
        inner(key, data, version)  # done, but the head never hears it
        raise OSError("timeout")

    any_store.put_if_match = lost_answer
    with pytest.raises(OSError):
        lease.renew()
    any_store.put_if_match = inner
    clock.t += 5
    lease.renew()  # the stale version fails the swap; the record is ours: swap from it
    assert lease.fenced is None and read_lease(any_store)["renewed_at"] == clock.t


def test_a_released_lease_is_free_at_once_and_a_dead_pid_on_this_host_lapses(any_store):
    clock = Clock()
    a = _lease(any_store, clock)
    a.acquire()
    a.release()
    b = _lease(any_store, clock, host="h2")
    assert b.acquire() is None  # released: nothing taken over
    # b dies (a pid that does not exist) on h2; a new head on h2 need not wait for the lapse
    any_store.put(
        LEASE_KEY,
        b'{"holder": "dead", "pid": 999999999, "host": "h2", "expires_at": 1e12, "renewed_at": 0}',
    )
    c = _lease(any_store, clock, host="h2")
    assert c.acquire()["holder"] == "dead"
    d = _lease(any_store, clock, host="h3")
    with pytest.raises(HeadBusyError):
        d.acquire()
