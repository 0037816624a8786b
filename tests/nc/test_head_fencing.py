"""The head's side of the pool: a LOST island is fenced and replaced, not counted a failure."""

from __future__ import annotations

from collections.abc import Iterator

from yeto_core.buffer.fences import StoreFences, fenced, write_fence
from yeto_core.config.load import parse_config
from yeto_core.events.stream import read_events
from yeto_core.head.run import MAX_SAMPLER_RESTARTS, Head
from yeto_core.plugins import Plugins
from yeto_core.ports import IslandProvider
from yeto_core.records import Event, IslandLaunch, IslandStatus
from yeto_core.stores.dir_store import DirStore


class Losing(IslandProvider):
    """Every island is lost at its first status check after ``lose`` is set."""

    PLUGIN_NAME = "losing"

    def __init__(self) -> None:
        self.launches: list[IslandLaunch] = []
        self.released: list[str] = []
        self.lose: set[str] = set()

    def launch(self, launch: IslandLaunch) -> str:
        self.launches.append(launch)
        return launch.handle

    def status(self, handle: str) -> IslandStatus:
        if handle in self.released:
            return IslandStatus.GONE
        return IslandStatus.LOST if handle in self.lose else IslandStatus.RUNNING

    def events(self, handle: str) -> Iterator[Event]:
        return iter([Event(kind="nc_test_event", time=0.0, source="t", data={"x": 1})])

    def release(self, handle: str) -> bool:
        self.released.append(handle)
        return True

    def orphans(self) -> list[str]:
        return []


def _head(tmp_path, provider):
    config = parse_config(
        {
            "name": "fence-test",
            "run_dir": str(tmp_path / "run"),
            "model": {"path": str(tmp_path / "model")},
            "task": {"name": "sort4"},
            "samplers": [{"name": "node", "engine": "hf", "count": 2}],
            "trainer": {"backend": "torch"},
        }
    )
    return Head(config, Plugins(), provider=provider)


def test_lost_islands_are_fenced_and_replaced_beyond_the_restart_limit(tmp_path):
    provider = Losing()
    head = _head(tmp_path, provider)
    for island in ("node-0", "node-1"):
        head.launch_sampler(island)
    for n in range(MAX_SAMPLER_RESTARTS + 2):
        provider.lose.add(head.sampler_handles["node-0"])
        head.check_samplers()
        assert head.sampler_handles["node-0"] == f"node-0-i{n + 1}"
    assert head.sampler_handles["node-1"] == "node-1-i0"  # the other island is unaffected
    assert head.state.sampler_restarts == {}
    assert fenced(head.store) == {("node-0", i) for i in range(MAX_SAMPLER_RESTARTS + 2)}
    assert [x.incarnation for x in provider.launches if x.island == "node-0"] == list(
        range(MAX_SAMPLER_RESTARTS + 3)
    )
    head.events.flush()
    kinds = [e.kind for e in read_events(head.store, "head")]
    assert kinds.count("sampler_fenced") == MAX_SAMPLER_RESTARTS + 2
    assert "nc_test_event" in kinds  # provider events reach the head's stream


def test_store_fences_predicate(tmp_path):
    store = DirStore(tmp_path / "store", fsync=False)
    now = [0.0]
    fences = StoreFences(store, refresh_s=1.0, clock=lambda: now[0])
    assert not fences("node-0", 0)
    assert write_fence(store, "node-0", 0, at=1.0) is True
    assert write_fence(store, "node-0", 0, at=2.0) is False  # once
    assert not fences("node-0", 0)  # listed at most once a second
    now[0] = 1.5
    assert fences("node-0", 0) and not fences("node-0", 1) and not fences("node-1", 0)


class Expiring(Losing):
    """``soon``: islands about to be lost (the head starts their replacement early)."""

    PLUGIN_NAME = "expiring"

    def __init__(self) -> None:
        super().__init__()
        self.soon: set[str] = set()

    def replace_soon(self, handle: str) -> bool:
        return handle in self.soon


def test_a_replacement_starts_before_the_lease_ends_and_takes_over_at_the_loss(tmp_path):
    provider = Expiring()
    head = _head(tmp_path, provider)
    head.launch_sampler("node-0")
    head.check_samplers()
    assert [x.incarnation for x in provider.launches] == [0]  # nothing ends: no standby
    provider.soon.add("node-0-i0")
    head.check_samplers()
    head.check_samplers()  # one standby, however many ticks until the loss
    assert [x.incarnation for x in provider.launches] == [0, 1]
    assert head.sampler_handles["node-0"] == "node-0-i0"  # the old node still samples
    assert head.sampler_standby == {"node-0": "node-0-i1"}
    provider.lose.add("node-0-i0")
    head.check_samplers()
    assert head.sampler_handles["node-0"] == "node-0-i1" and head.sampler_standby == {}
    assert fenced(head.store) == {("node-0", 0)}
    assert [x.incarnation for x in provider.launches] == [0, 1]  # no launch at the loss
    head.events.flush()
    kinds = [e.kind for e in read_events(head.store, "head")]
    assert kinds.count("sampler_replace_early") == 1 and kinds.count("sampler_promoted") == 1
    head.stop_samplers()
    assert set(provider.released) == {"node-0-i0", "node-0-i1"}


def test_a_standby_lost_before_it_took_over_is_fenced_and_dropped(tmp_path):
    provider = Expiring()
    head = _head(tmp_path, provider)
    head.launch_sampler("node-0")
    provider.soon.add("node-0-i0")
    head.check_samplers()
    provider.lose.add("node-0-i1")
    head.check_samplers()
    assert head.sampler_standby == {"node-0": "node-0-i2"}  # dropped, and started again
    assert fenced(head.store) == {("node-0", 1)}


def test_a_verified_release_marks_the_incarnation_gone_for_the_dispenser(tmp_path):
    from yeto_core.buffer.dispenser import StoreDispenser

    config = parse_config(
        {
            "name": "gone-test",
            "run_dir": str(tmp_path / "run"),
            "model": {"path": str(tmp_path / "model")},
            "task": {"name": "sort4"},
            "samplers": [{"name": "node", "engine": "hf", "count": 1}],
            "trainer": {"backend": "torch"},
            "dispenser": {"kind": "store"},
        }
    )
    provider = Losing()
    head = Head(config, Plugins(), provider=provider)
    head.launch_sampler("node-0")
    crashed = StoreDispenser(head.store, island="node-0", incarnation=0, range_size=2)
    crashed.take(1)
    successor = StoreDispenser(head.store, island="node-0", incarnation=1, range_size=2)
    assert [s.position for s in successor.take(2)] == [2, 3]  # not gone yet: not taken
    head.release_island("node-0", head.sampler_handles["node-0"])
    later = StoreDispenser(head.store, island="node-0", incarnation=1, range_size=2)
    assert [s.position for s in later.take(2)] == [0, 1]


class Pooled(Losing):
    """A pool provider: 1..3 islands of the group join and leave."""

    PLUGIN_NAME = "pooled"

    def pool_bounds(self, options):
        return (1, 3)


def _pool_head(tmp_path, provider, **backstops):
    now = [1000.0]
    config = parse_config(
        {
            "name": "pool-test",
            "run_dir": str(tmp_path / "run"),
            "model": {"path": str(tmp_path / "model")},
            "task": {"name": "sort4"},
            "samplers": [
                {
                    "name": "node",
                    "engine": "hf",
                    "count": 3,
                    "backlog_cap": 10,
                    "price_per_hour": 1.0,
                }
            ],
            "trainer": {"backend": "torch", "groups_per_round": 4},
            "backstops": backstops,
        }
    )
    head = Head(config, Plugins(), provider=provider, clock=lambda: now[0])
    for island in ("node-0", "node-1", "node-2"):
        head.launch_sampler(island)
    return head, now


def test_pool_islands_leave_on_a_full_backlog_and_join_when_it_drains(tmp_path):
    from yeto_core.head.islands import POOL_LEAVE_AFTER_S

    provider = Pooled()
    head, now = _pool_head(tmp_path, provider)
    full = {"backlog_groups": 10, "cost_usd": 0.0, "elapsed_s": 1.0}
    head.check_pool(full)
    assert sorted(head.sampler_handles) == ["node-0", "node-1", "node-2"]  # not full long enough
    now[0] += POOL_LEAVE_AFTER_S
    head.check_pool(full)
    assert sorted(head.sampler_handles) == ["node-0", "node-1"] and "node-2-i0" in provider.released
    for _ in range(3):
        now[0] += POOL_LEAVE_AFTER_S
        head.check_pool(full)
    assert sorted(head.sampler_handles) == ["node-0"]  # never below min
    head.check_pool({"backlog_groups": 5, "cost_usd": 0.0, "elapsed_s": 50.0})
    assert sorted(head.sampler_handles) == ["node-0"]  # neither full nor starved
    head.check_pool({"backlog_groups": 0, "cost_usd": 0.0, "elapsed_s": 51.0})
    assert len(head.sampler_handles) == 2
    rejoined = [x for x in provider.launches if x.incarnation == 1]
    assert len(rejoined) == 1  # the parked island's next incarnation
    head.events.flush()
    events = [e for e in read_events(head.store, "head") if e.kind.startswith("pool_")]
    assert [e.kind for e in events] == ["pool_leave", "pool_leave", "pool_join"]
    assert events[0].data["reason"] == "backlog_full" and events[0].data["backlog_groups"] == 10


def test_pool_islands_leave_when_the_budget_would_run_out(tmp_path):
    provider = Pooled()
    # 3 islands at $1/h, 1 h left, $2.5 budget: one leaves; 2 at $1/h fit
    head, _now = _pool_head(tmp_path, provider, budget_usd=2.5, wall_clock_s=3600.0)
    status = {"backlog_groups": 0, "cost_usd": 0.0, "elapsed_s": 0.0}
    head.check_pool(status)
    assert len(head.sampler_handles) == 2
    head.check_pool(status)
    assert len(head.sampler_handles) == 2  # stays: a third would pass the budget
    head.events.flush()
    kinds = [(e.kind, e.data.get("reason")) for e in read_events(head.store, "head")]
    assert ("pool_leave", "budget") in kinds and not any(k == "pool_join" for k, _ in kinds)


def test_orphans_of_an_earlier_head_are_marked_gone_for_the_dispenser(tmp_path):
    from yeto_core.buffer.dispenser import gone_key

    class Orphaned(Losing):
        PLUGIN_NAME = "orphaned"

        def orphans(self):
            return ["node-0-i3"]

    config = parse_config(
        {
            "name": "orphan-test",
            "run_dir": str(tmp_path / "run"),
            "model": {"path": str(tmp_path / "model")},
            "task": {"name": "sort4"},
            "samplers": [{"name": "node", "engine": "hf", "count": 1}],
            "trainer": {"backend": "torch"},
            "dispenser": {"kind": "store"},
        }
    )
    head = Head(config, Plugins(), provider=Orphaned())
    assert head.release_orphans() == ["node-0-i3"]
    assert head.store.exists(gone_key("node-0", 3))


def test_a_pool_with_min_zero_keeps_one_island(tmp_path):
    """With no island left, unconsumable groups (stale, fenced) could hold the backlog up
    and nothing would refill it: a chaos run stalled that way until the silence backstop."""
    from yeto_core.head.islands import POOL_LEAVE_AFTER_S

    class ZeroMin(Pooled):
        def pool_bounds(self, options):
            return (0, 3)

    head, now = _pool_head(tmp_path, ZeroMin())
    for _ in range(5):
        now[0] += POOL_LEAVE_AFTER_S
        head.check_pool({"backlog_groups": 10, "cost_usd": 0.0, "elapsed_s": 1.0})
    assert len(head.sampler_handles) == 1
