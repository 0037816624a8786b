"""T_s measured from submission (issue 52 item 2, the seed's ``YETO_START_SUBMITTED_UNIX``).

The provider stamps the wall-clock time of each launch in the island's environment;
the trainer's ``trainer_start_summary.start_s`` (S1's ``T_s``) is measured from it,
so provisioning, image pull and imports count. Without a stamp it is measured from
the trainer's start call, as before, and the event says so.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from yeto_core.providers.env import (
    ENV_START_SUBMITTED,
    identity_from_env,
    island_launch,
    relaunch,
)
from yeto_core.providers.local import LocalIslands
from yeto_core.records import StopReason
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, MemoryBuffer
from yeto_core.testing.fakes import Clock
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle import DriverLifecycle

_DUMP_ENV = r"""
import json, os, sys
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump({k: v for k, v in os.environ.items() if k.startswith("YETO_")}, f)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


def _driver(tmp_path: Path, clock: Clock, events: list, **kw) -> DriverLifecycle:
    return DriverLifecycle(
        lambda inc: FakeBackend(seed=1),
        MemoryBuffer(),
        CutStore(DirStore(tmp_path / "store", fsync=False)),
        group_size=4,
        emit=events.append,
        clock=clock,
        workdir=tmp_path / "work",
        **kw,
    )


def _summary(events: list) -> dict:
    return next(e.data for e in events if e.kind == "trainer_start_summary")


def test_start_s_is_measured_from_the_submission_stamp(tmp_path):
    clock, events = Clock(10_000.0), []
    driver = _driver(tmp_path, clock, events, start_submitted_unix=9_100.0)
    driver.start(0)
    s = _summary(events)
    assert driver.start_seconds == s["start_s"] == 900.0  # provisioning and imports count
    assert s["start_measured_from"] == "submission"
    assert s["start_submitted_unix"] == 9_100.0 and s["start_in_process_s"] == 0.0


def test_without_a_stamp_start_s_is_the_in_process_start_and_the_event_says_so(tmp_path):
    clock, events = Clock(10_000.0), []
    driver = _driver(tmp_path, clock, events)
    driver.start(0)
    s = _summary(events)
    assert driver.start_seconds == s["start_s"] == s["start_in_process_s"] == 0.0
    assert s["start_measured_from"] == "trainer_start"
    assert ENV_START_SUBMITTED in s["start_note"]


def test_a_stamp_ahead_of_this_hosts_clock_falls_back_and_says_so(tmp_path):
    clock, events = Clock(10_000.0), []
    driver = _driver(tmp_path, clock, events, start_submitted_unix=10_050.0)
    driver.start(0)
    s = _summary(events)
    assert s["start_measured_from"] == "trainer_start" and s["start_s"] == 0.0
    assert "50.0 s ahead" in s["start_note"]


def test_the_stamp_measures_one_start_only(tmp_path):
    """A process that starts a second incarnation measures that one in process."""
    clock, events = Clock(10_000.0), []
    driver = _driver(tmp_path, clock, events, start_submitted_unix=9_000.0)
    driver.start(0)
    driver.drain(StopReason.STOPPED)
    driver.release()
    events.clear()
    driver.start(1)
    assert _summary(events)["start_measured_from"] == "trainer_start"


def test_the_island_reads_the_stamp_from_its_environment(tmp_path):
    store = DirStore(tmp_path / "store", fsync=False)
    env = dict(island_launch(store, run_id="r", role="trainer", island="t", incarnation=0).env)
    assert identity_from_env(env).start_submitted_unix is None
    env[ENV_START_SUBMITTED] = "1765000000.25"
    assert identity_from_env(env).start_submitted_unix == 1765000000.25
    env[ENV_START_SUBMITTED] = "soon"
    assert identity_from_env(env).start_submitted_unix is None  # measured in process


def test_the_local_provider_stamps_each_launch(tmp_path):
    out = tmp_path / "env.json"
    islands = LocalIslands(tmp_path / "run", command=[sys.executable, "-c", _DUMP_ENV, str(out)])
    store = DirStore(tmp_path / "store", fsync=False)
    launch = island_launch(store, run_id="r", role="trainer", island="trainer", incarnation=0)
    stamps = []
    for inc in (0, 1):
        before = time.time()
        handle = islands.launch(relaunch(launch, inc))
        after = time.time()
        deadline = time.monotonic() + 20
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        env = json.loads(out.read_text())
        out.unlink()
        assert before <= float(env[ENV_START_SUBMITTED]) <= after  # this launch's, not the run's
        stamps.append(float(env[ENV_START_SUBMITTED]))
        assert islands.release(handle) is True
    assert stamps[1] > stamps[0]
