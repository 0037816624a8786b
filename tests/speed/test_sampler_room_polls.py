"""A sampler waiting for room polls what can make room, not the whole backlog.

At the cap (or the ``fresh_only`` bound) only a commit, a load or a newer release can
make room: each poll reads consumed.json (the watermark), and the backlog (the index
listing and its new records) is read again only when one of them changed, or every
``ROOM_FULL_READ_EVERY`` polls. Counts, never timings.
"""

from __future__ import annotations

import threading

import pytest

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import RoundSpec
from yeto_core.sampler import room
from yeto_core.testing.fakes import digits_sampler

from .test_store_requests import RemoteDir


class Counting(RemoteDir):
    """:class:`RemoteDir` counting ``get_versioned`` (consumed.json) too."""

    def get_versioned(self, key: str):
        self._enter("get_versioned", key)
        return super().get_versioned(key)


def _at_the_cap(tmp_path, fresh=None):
    store = Counting(tmp_path / "s")
    buf = FileSampleBuffer(store, layout="objects", host="h")
    loop = digits_sampler(buf, backlog_cap=4, fresh_only=fresh, share_of=1, backlog_poll_s=0.001)
    assert loop.claim_room()[0] > 0
    loop.run_round()  # 4 groups: the cap
    room_now, _ = loop.claim_room()
    assert room_now == 0
    return store, buf, loop


@pytest.mark.parametrize("fresh", [None, (2, 8)])
def test_polls_at_the_cap_read_the_watermark_only(tmp_path, fresh):
    store, buf, loop = _at_the_cap(tmp_path, fresh)
    store.calls.clear()
    assert loop._wait_for_change(None) is True  # nothing changed: the full read is due
    # consumed.json once a poll; no listing, no index record read
    assert store.calls["get_versioned"] == room.ROOM_FULL_READ_EVERY
    assert store.calls["list"] == 0


def test_a_commit_ends_the_wait_at_the_next_poll(tmp_path):
    store, buf, loop = _at_the_cap(tmp_path)
    trainer = FileSampleBuffer(store, layout="objects", host="trainer")
    trainer.commit(trainer.select(RoundSpec(max_groups=4, current_version=0, max_policy_age=9)))
    store.calls.clear()
    assert loop._wait_for_change(None) is True
    assert store.calls["get_versioned"] == 1 and store.calls["list"] == 0
    assert loop.claim_room()[0] == 4


def test_a_sampler_at_the_cap_lists_the_index_about_once_in_ten_polls(tmp_path):
    store, buf, loop = _at_the_cap(tmp_path)
    store.calls.clear()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(loop.wait_for_room()))
    waiter.start()
    done = threading.Event()
    for _ in range(20_000):  # until it polled 30 times (a count, not a time)
        if store.calls["get_versioned"] >= 30 or done.wait(0.001):
            break
    polls, lists = store.calls["get_versioned"], store.calls["list"]
    trainer = FileSampleBuffer(store, layout="objects", host="trainer")
    trainer.commit(trainer.select(RoundSpec(max_groups=4, current_version=0, max_policy_age=9)))
    waiter.join(20)
    assert result == [True] and loop.call_size == 4
    assert polls >= 30 and lists <= polls // room.ROOM_FULL_READ_EVERY + 2, (polls, lists)
