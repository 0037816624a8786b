"""The sweep a sampler island runs at its start, with the run's store (fences and gone
records) and the [sandbox] host of its config (real bwrap)."""

from __future__ import annotations

import threading
import time

import pytest

from yeto_core.buffer.dispenser import mark_gone
from yeto_core.buffer.fences import write_fence
from yeto_core.config.load import parse_config
from yeto_core.plugins import Plugins
from yeto_core.ports.sandbox import labels_of
from yeto_core.sandbox.bwrap import BwrapSandboxes
from yeto_core.sandbox.sweep import REMOVED_EVENT, sweep_island_start
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.sandbox_contract import bwrap_unusable

pytestmark = pytest.mark.skipif(bool(bwrap_unusable()), reason=bwrap_unusable() or "-")


def test_island_start_sweeps_fenced_and_gone_predecessors_of_its_shard(tmp_path):
    state = tmp_path / "sandboxes"
    config = parse_config(
        {
            "name": "sbx",
            "run_dir": str(tmp_path / "run"),
            "model": {"path": "m"},
            "task": {"name": "sort4"},
            "samplers": [{"name": "sampler", "engine": "hf"}],
            "trainer": {"backend": "torch"},
            "sandbox": {"host": "bwrap", "state_dir": str(state), "wall_s": 2},
        }
    )
    store = DirStore(str(tmp_path / "store"))
    host = BwrapSandboxes(state)
    fenced = host.start(labels_of("sbx", "s-0", 0, "s-0", "a"))
    standby = host.start(labels_of("sbx", "s-0", 1, "s-0", "b"))  # its owner (us) runs
    other = host.start(labels_of("sbx", "s-1", 0, "s-1", "c"))
    write_fence(store, "s-0", 0, at=0.0, handle="s-0-i0")
    events = []
    plugins = Plugins(entry_points=False)
    try:
        result = sweep_island_start(plugins, store, config, "s-0", 2, events.append)
        assert result.removed == (fenced,) and result.kept == (standby,)
        [event] = events
        assert event.kind == REMOVED_EVENT and event.data["shard"] == "s-0"
        assert event.data["incarnations"] == [0] and event.data["kept"] == 1
        mark_gone(store, "s-0", 1, handle="s-0-i1")  # the head verified it gone
        result = sweep_island_start(plugins, store, config, "s-0", 2, events.append)
        assert result.removed == (standby,)
        assert [i.id for i in host.list({})] == [other]
        # without a host, or with the sweep off, nothing is touched
        off = parse_config(
            {
                **config_dict(config),
                "sandbox": {"host": "bwrap", "state_dir": str(state), "sweep_at_start": False},
            }
        )
        assert sweep_island_start(plugins, store, off, "s-1", 1, events.append).removed == ()
        assert [i.id for i in host.list({})] == [other]
    finally:
        for info in host.list({}):
            host.remove(info.id)


def test_a_kept_predecessor_is_swept_once_it_is_fenced(tmp_path):
    state = tmp_path / "sandboxes"
    config = parse_config(
        {**config_dict_of(tmp_path), "sandbox": {"host": "bwrap", "state_dir": str(state)}}
    )
    store = DirStore(str(tmp_path / "store"))
    host = BwrapSandboxes(state)
    standby = host.start(labels_of("sbx", "s-0", 0, "s-0", "a"))  # inc 0 runs (us)
    events, stop = [], threading.Event()
    try:
        first = sweep_island_start(
            Plugins(entry_points=False),
            store,
            config,
            "s-0",
            1,
            events.append,
            stop=stop,
            again_s=0.05,
        )
        assert first.kept == (standby,) and host.list({})
        write_fence(store, "s-0", 0, at=0.0, handle="s-0-i0")  # the head fenced it: lost
        deadline = time.monotonic() + 30
        while host.list({}) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.list({}) == []
        removed = [e for e in events if e.data.get("removed")]
        assert len(removed) == 1 and removed[0].data["incarnations"] == [0]
    finally:
        stop.set()
        for info in host.list({}):
            host.remove(info.id)


def test_a_host_that_cannot_see_the_starter_leaves_the_decision_to_fences(tmp_path):
    """``track_owner = false`` (a host serving islands on other machines): a sandbox of a
    running unfenced predecessor is kept, and removed by the re-sweep (``[sandbox]
    sweep_again_s``) once the head fenced it."""
    state = tmp_path / "sandboxes"
    config = parse_config(
        {
            **config_dict_of(tmp_path),
            "sandbox": {
                "host": "bwrap",
                "state_dir": str(state),
                "sweep_again_s": 0.05,
                "options": {"track_owner": False},
            },
        }
    )
    store = DirStore(str(tmp_path / "store"))
    host = BwrapSandboxes(state, track_owner=False)
    pred = host.start(labels_of("sbx", "s-0", 0, "s-0", "a"))
    assert [i.owner_alive for i in host.list({})] == [None]
    events, stop = [], threading.Event()
    try:
        first = sweep_island_start(
            Plugins(entry_points=False), store, config, "s-0", 1, events.append, stop=stop
        )
        assert first.kept == (pred,) and first.removed == ()
        write_fence(store, "s-0", 0, at=0.0, handle="s-0-i0")
        deadline = time.monotonic() + 30
        while host.list({}) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host.list({}) == []
        [removed] = [e for e in events if e.data.get("removed")]
        assert removed.data["shard"] == "s-0" and removed.data["incarnations"] == [0]
    finally:
        stop.set()
        for info in host.list({}):
            host.remove(info.id)


def test_a_standby_sweeps_what_its_noticed_predecessor_started_after_its_first_sweep(
    tmp_path,
):
    """A replacement launched early (its node's predecessor got an eviction notice and
    keeps sampling): its first sweep finds nothing; the predecessor then starts a trial's
    sandbox and is evicted and fenced. The standby removes that sandbox (its sweeps go on
    while an earlier incarnation is neither fenced nor gone), with the shard in the
    event; without that, it stayed until the run's end."""
    state = tmp_path / "sandboxes"
    config = parse_config(
        {
            **config_dict_of(tmp_path),
            "sandbox": {
                "host": "bwrap",
                "state_dir": str(state),
                "sweep_again_s": 0.05,
                "options": {"track_owner": False},
            },
        }
    )
    store = DirStore(str(tmp_path / "store"))
    mark_gone(store, "s-0", 0, handle="s-0-i0")  # an earlier incarnation, long gone
    host = BwrapSandboxes(state, track_owner=False)
    events, stop = [], threading.Event()
    plugins = Plugins(entry_points=False)
    try:
        first = sweep_island_start(plugins, store, config, "s-0", 2, events.append, stop=stop)
        assert first == type(first)() and events == []
        late = host.start(labels_of("sbx", "s-0", 1, "s-0", "t"))  # the noticed node's trial
        mine = host.start(labels_of("sbx", "s-0", 2, "s-0", "u"))  # the standby's own trial
        time.sleep(0.3)  # sweeps go on meanwhile: a running unfenced predecessor's is kept
        assert sorted(i.id for i in host.list({})) == sorted([late, mine])
        write_fence(store, "s-0", 1, at=0.0, handle="s-0-i1")  # evicted: the head fenced it
        deadline = time.monotonic() + 30
        while len(host.list({})) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # and after that: the standby's running trial is never swept
        assert [i.id for i in host.list({})] == [mine]
        [removed] = [e for e in events if e.data.get("removed")]
        assert removed.data["shard"] == "s-0" and removed.data["incarnations"] == [1]
    finally:
        stop.set()
        for info in host.list({}):
            host.remove(info.id)


def test_a_relaunch_after_its_predecessor_left_does_not_keep_sweeping(tmp_path):
    """Every earlier incarnation gone or fenced and nothing kept: one sweep, no thread."""
    config = parse_config(
        {**config_dict_of(tmp_path), "sandbox": {"host": "bwrap", "state_dir": str(tmp_path)}}
    )
    store = DirStore(str(tmp_path / "store"))
    mark_gone(store, "s-0", 0, handle="s-0-i0")
    write_fence(store, "s-0", 1, at=0.0, handle="s-0-i1")
    before = {t.name for t in threading.enumerate()}
    stop = threading.Event()
    sweep_island_start(Plugins(entry_points=False), store, config, "s-0", 2, [].append, stop=stop)
    stop.set()
    assert "yeto-sandbox-sweep-s-0" not in {t.name for t in threading.enumerate()} - before


def config_dict_of(tmp_path):
    return {
        "name": "sbx",
        "run_dir": str(tmp_path / "run"),
        "model": {"path": "m"},
        "task": {"name": "sort4"},
        "samplers": [{"name": "sampler", "engine": "hf"}],
        "trainer": {"backend": "torch"},
    }


def config_dict(config):
    return {
        "name": config.name,
        "run_dir": config.run_dir,
        "model": {"path": "m"},
        "task": {"name": "sort4"},
        "samplers": [{"name": "sampler", "engine": "hf"}],
        "trainer": {"backend": "torch"},
    }
