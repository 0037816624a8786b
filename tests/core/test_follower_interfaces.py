"""The interfaces around the policy follower, declared instead of probed.

A sampler loop reads its follower through :class:`~yeto_core.sampler.interfaces.Follower`
(optional members with defaults: no recorded loads, no wake-up on a load); a follower
reads its release store through :class:`~yeto_core.sampler.interfaces.FollowedReleases`,
which the real :class:`~yeto_core.release.store.ReleaseStore` and the island's
:class:`~yeto_core.sampler.room.SeenReleases` both are.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading

import pytest

from yeto_core.errors import ReleaseError
from yeto_core.release.delta import DeltaError
from yeto_core.release.store import ReleaseStore
from yeto_core.sampler.follower import PolicyFollower
from yeto_core.sampler.interfaces import FollowedReleases, Follower
from yeto_core.sampler.room import SeenReleases
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_core.testing.fakes import EngineFollower, WeightFileEngine, digits_sampler


def _publish(releases: ReleaseStore, tmp, version: int, payload: bytes) -> None:
    d = tmp / f"out{version}"
    d.mkdir()
    (d / "w.bin").write_bytes(payload)
    info = {"version": version, "kind": "full"}
    info["weight_checksum"] = hashlib.sha256(payload).hexdigest()
    releases.publish(d, info)


def test_the_release_store_and_its_seen_stand_in_are_followed_releases(tmp_path):
    store = DirStore(tmp_path / "store")
    releases = ReleaseStore(store, prefix="rel/")
    seen = SeenReleases(releases)
    assert isinstance(releases, FollowedReleases) and isinstance(seen, FollowedReleases)
    assert seen.store is store and seen.prefix == "rel" and seen.last_fetch == {}
    _publish(releases, tmp_path, 1, b"one")
    rel = seen.latest()
    assert seen.seen() == (1, None)
    assert seen.fetch(rel, tmp_path / "got") == tmp_path / "got"
    assert (tmp_path / "got" / "w.bin").read_bytes() == b"one"
    assert seen.last_fetch is releases.last_fetch and seen.last_fetch["encoding"] == "full"
    assert not isinstance(object(), FollowedReleases)


def test_a_follower_follows_the_seen_stand_in_and_watches_its_prefix(tmp_path):
    releases = ReleaseStore(DirStore(tmp_path / "store"))
    engine = WeightFileEngine()
    follower = PolicyFollower(SeenReleases(releases), engine, work_dir=tmp_path / "w")
    _publish(releases, tmp_path, 1, b"one")
    follower.start(poll_s=0.01)
    try:
        assert follower.wait_version(1, 10.0) is True
    finally:
        follower.stop()
    assert len(follower.load_times) == 1


def test_a_release_error_names_its_check():
    assert ReleaseError("bad digest").reason == "digest_mismatch"
    assert DeltaError("chain_broken", "a delta is missing").reason == "chain_broken"


def test_the_followers_are_followers_and_the_defaults_hold(tmp_path):
    engine = WeightFileEngine()
    policy = PolicyFollower(ReleaseStore(DirStore(tmp_path / "s")), engine, work_dir=tmp_path)
    plain = EngineFollower(engine)
    assert isinstance(policy, Follower) and isinstance(plain, Follower)
    assert plain.load_times == () and plain.last_round_straddled is False
    assert plain.wait_version(1, 0.0) is None  # cannot be woken by a load
    assert policy.wait_version(1, 0.0) is False  # can, and the version is not served
    with pytest.raises(TypeError, match="round"):
        Follower()  # type: ignore[abstract]


class _CountingStop(threading.Event):
    """A stop event that records its waits and is set by the ``n``-th."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.waits = n, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) >= self.n:
            self.set()
        return self.is_set()


def test_a_loop_polls_its_stop_while_a_plain_follower_serves_an_old_version():
    stop = _CountingStop(3)
    loop = digits_sampler(MemoryBuffer(), sync_rounds=True, sync_poll_s=0.25, stop=stop)
    loop.rounds = 1  # the follower serves version 0: the loop waits for version 1
    assert loop.wait_for_version() is False
    assert stop.waits == [0.25, 0.25, 0.25]


class _WokenFollower(Follower):
    """Serves ``version``; its wait records the call and loads the version asked for."""

    def __init__(self) -> None:
        self.version, self.waits = 0, []

    @contextlib.contextmanager
    def round(self):
        yield self.version

    def wait_version(self, version, timeout):
        self.waits.append((version, timeout))
        self.version = version
        return True


def test_a_loop_is_woken_by_a_follower_that_can_wake_it():
    stop = _CountingStop(1)
    loop = digits_sampler(MemoryBuffer(), sync_rounds=True, sync_poll_s=0.25, stop=stop)
    loop.follower = follower = _WokenFollower()
    loop.rounds = 2
    assert loop.wait_for_version() is True
    assert follower.waits == [(2, 0.25)] and stop.waits == []
