"""SamplerLoop(sync_rounds=True): synchronous GRPO, round n+1 only after release n is served.

A fake engine, the real ReleaseStore and PolicyFollower (no torch).
"""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from yeto_core.records import SamplingParams
from yeto_core.release.store import ReleaseStore
from yeto_core.sampler.follower import PolicyFollower
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_core.testing.fakes import DigitsTask, WeightFileEngine


def publish(releases, tmp, version, payload, checksum=None):
    d = tmp / f"out{version}-{payload!r}"
    d.mkdir()
    (d / "w.bin").write_bytes(payload)
    info = {"version": version, "kind": "full"}
    info["weight_checksum"] = checksum or hashlib.sha256(payload).hexdigest()
    return releases.publish(d, info)


def _wait_until(cond, what, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def setup(tmp_path):
    releases = ReleaseStore(DirStore(tmp_path / "store"))
    engine = WeightFileEngine()
    events = []
    follower = PolicyFollower(
        releases, engine, work_dir=tmp_path / "work", reload_max_defer_s=5.0, emit=events.append
    )
    return releases, engine, follower, events, tmp_path


def _loop(buf, engine, follower, events, stop, **kw):
    return SamplerLoop(
        buf,
        engine,
        DigitsTask(),
        follower,
        host="h",
        incarnation=0,
        group_size=2,
        prompts_per_call=2,
        sampling=SamplingParams(),
        backlog_cap=None,
        stop=stop,
        emit=events.append,
        **kw,
    )


def test_sync_rounds_waits_for_the_release_of_each_round(setup):
    releases, engine, follower, events, tmp = setup
    buf, stop = MemoryBuffer(), threading.Event()
    loop = _loop(buf, engine, follower, events, stop, sync_rounds=True, sync_poll_s=0.005)
    t = threading.Thread(target=loop.run)
    t.start()
    try:
        for version in (1, 2, 3):
            # round `version` was generated with policy version-1; now it waits for `version`
            _wait_until(
                lambda v=version: sum(e.kind == "sampler_sync_wait" for e in events) == v,
                f"the wait after round {version}",
            )
            assert len(buf.groups) == 2 * version  # nothing generated while waiting
            assert {s.weight_version for g in buf.groups[-2:] for s in g.samples} == {version - 1}
            publish(releases, tmp, version, f"w{version}".encode())
            follower.poll()
        _wait_until(lambda: len(buf.groups) == 8, "round 4 after release 3")
        assert {s.weight_version for g in buf.groups[-2:] for s in g.samples} == {3}
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()  # the stop event ends a sync wait at once


def test_without_sync_rounds_the_loop_does_not_wait_for_versions(setup):
    releases, engine, follower, events, tmp = setup
    buf, stop = MemoryBuffer(), threading.Event()
    loop = _loop(buf, engine, follower, events, stop)
    assert loop.run(max_rounds=3) == 3
    assert len(buf.groups) == 6 and not any(e.kind == "sampler_sync_wait" for e in events)


def test_sync_rounds_needs_a_follower():
    with pytest.raises(ValueError, match="follower"):
        SamplerLoop(
            MemoryBuffer(), object(), DigitsTask(), None, host="h", incarnation=0, sync_rounds=True
        )
