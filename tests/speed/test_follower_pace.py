"""A paced follower's polls of ``LATEST.json``: none while the trainer's next release is
not due, and often while it is.

The trainer publishes at its round's pace; after a new release the follower waits four
fifths of the shortest recent gap between two releases before it polls again, then every
tenth of it until the release is seen. Simulated on a fake
clock with the real follower, release store and a counting store: the follower's loop
(poll, then :meth:`PolicyFollower.next_poll_s`) against releases published on a
schedule. Counts and fake-clock lags, never timings.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from yeto_core.release.store import ReleaseStore
from yeto_core.sampler.follower import (
    CATCH_GAPS,
    CATCH_MIN_S,
    CATCH_SHARE,
    QUIET_SHARE,
    PolicyFollower,
)
from yeto_core.testing.fakes import Clock, RemoteLookingDirStore, WeightFileEngine

POLL_S = 0.2


class CountingStore(RemoteLookingDirStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.pointer_gets = 0

    def get(self, key: str) -> bytes:
        if key.endswith("LATEST.json"):
            self.pointer_gets += 1
        return super().get(key)


def _follow(tmp_path: Path, publish_at: list[float], *, paced: bool) -> tuple[int, list[float]]:
    """Pointer reads and each release's lag (published -> seen) over the schedule."""
    store = CountingStore(tmp_path / "store")
    releases, clock = ReleaseStore(store), Clock()
    follower = PolicyFollower(
        ReleaseStore(store), WeightFileEngine(), work_dir=tmp_path / "work", clock=clock
    )
    lags: list[float] = []
    todo = list(enumerate(publish_at, start=1))
    while todo or follower.version < len(publish_at):
        while todo and todo[0][1] <= clock.t:
            _publish(releases, tmp_path, todo.pop(0)[0])
        before = follower.version
        follower.poll()
        if follower.version != before:
            lags.append(clock.t - publish_at[follower.version - 1])
        clock.advance(follower.next_poll_s(POLL_S) if paced else POLL_S)
    return store.pointer_gets, lags


def _publish(releases: ReleaseStore, tmp_path: Path, v: int) -> None:
    """Release ``v``: one weights file whose bytes name it."""
    d = tmp_path / f"out{v}"
    d.mkdir()
    (d / "w.bin").write_bytes(b"w%d" % v)
    checksum = hashlib.sha256(b"w%d" % v).hexdigest()
    releases.publish(d, {"version": v, "kind": "full", "weight_checksum": checksum})


def test_a_paced_follower_polls_less_at_the_trainers_pace(tmp_path):
    every = [1.0 + 1.0 * i + 0.03 for i in range(12)]  # a release a second
    polls, lags = _follow(tmp_path / "paced", every, paced=True)
    plain, plain_lags = _follow(tmp_path / "plain", every, paced=False)
    assert plain >= 4.5 * len(every)  # one per poll_s: five a release
    # from the fourth release on (three sightings make a pace): about four a release
    assert polls <= 0.8 * plain
    assert max(lags) <= POLL_S + 1e-9  # seen within a poll, as before
    assert max(plain_lags) <= POLL_S + 1e-9
    # ... and once paced, within a tenth of the gap (the polls past the quiet share)
    assert max(lags[3:]) <= CATCH_SHARE * 1.0 + 1e-9
    assert max(plain_lags[3:]) > CATCH_SHARE * 1.0


def test_a_trainer_that_stops_publishing_is_polled_at_poll_s_again(tmp_path):
    every = [1.0 + 1.0 * i for i in range(4)]
    store = CountingStore(tmp_path / "store")
    releases, clock = ReleaseStore(store), Clock()
    follower = PolicyFollower(
        ReleaseStore(store), WeightFileEngine(), work_dir=tmp_path / "work", clock=clock
    )
    for v, at in enumerate(every, start=1):
        clock.t = at
        _publish(releases, tmp_path, v)
        follower.poll()
    assert follower.next_poll_s(POLL_S) == QUIET_SHARE * 1.0  # the quiet share
    clock.t = every[-1] + 0.9
    assert follower.next_poll_s(POLL_S) == CATCH_SHARE * 1.0  # the next is due
    clock.t = every[-1] + CATCH_GAPS * 1.0 + 0.01
    assert follower.next_poll_s(POLL_S) == POLL_S  # it stopped or slowed: poll_s again
    clock.t = every[-1] + 0.8 - 1e-12  # a rounding error's quiet: no zero waits
    assert follower.next_poll_s(POLL_S) >= CATCH_MIN_S


def test_a_release_sooner_than_the_pace_is_seen_within_the_quiet_share(tmp_path):
    at = [1.0, 2.0, 3.0, 4.0, 4.3, 4.6]  # the trainer speeds up
    _, lags = _follow(tmp_path, at, paced=True)
    assert max(lags) <= QUIET_SHARE * 1.0 + POLL_S + 1e-9
    assert max(lags[-1:]) <= POLL_S + 1e-9  # the pace follows the shorter gaps


def test_an_unpaced_follower_keeps_its_poll(tmp_path):
    store = CountingStore(tmp_path / "store")
    follower = PolicyFollower(ReleaseStore(store), WeightFileEngine(), work_dir=tmp_path / "w")
    assert follower.next_poll_s(POLL_S) == POLL_S  # nothing seen yet: no pace
