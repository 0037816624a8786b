"""Elastic membership of the trainer pool, without processes: an island that exited is
replaced by a new one that joins at a horizon boundary; failed starts are bounded
(then exit 8); S1's rule for the number of islands (scale up on a backlog, down when
idle, within min/max and the budget)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from yeto_core.config.sync import SyncConfig
from yeto_core.records import IslandStatus
from yeto_core.sync.members import mark_ready, start_delay_s
from yeto_core.trainer.loop import TrainerLoopGaveUp
from yeto_core.trainer.s1_islands import ADD, HOLD, REMOVE, PoolScaleInputs, s1_scale_islands

from .test_trainer_pool import fake_pool


def _kinds(pool) -> list[str]:
    return [r["kind"] for r in pool.journal.read()]


def _records(pool, kind: str) -> list[dict]:
    return [r for r in pool.journal.read() if r["kind"] == kind]


def test_an_exited_island_is_replaced_and_the_replacement_joins(tmp_path: Path) -> None:
    pool = fake_pool(tmp_path, ["trainer-0", "trainer-1"])
    pool.provider.status_of["trainer-1-i0"] = IslandStatus.EXITED  # SIGKILLed
    pool.tick()
    assert pool.roster == ["trainer-0"] and pool.finished is None
    launched = _records(pool, "launched")
    assert [(r["island"], r["reason"], r["replaces"]) for r in launched] == [
        ("trainer-2", "replace", "trainer-1")
    ]
    assert "trainer-2" in pool.members.pending and pool.syncer.joined == []
    assert "trainer-1" not in pool.handles  # the dead island is released
    pool.tick()  # not ready yet: it does not join
    assert pool.syncer.joined == []
    mark_ready(pool.store, "trainer-2", 5.0)  # the island restored its backend
    pool.tick()
    assert pool.syncer.joined == ["trainer-2"] and pool.roster == ["trainer-0", "trainer-2"]
    (join,) = _records(pool, "join")
    assert join["island"] == "trainer-2" and join["reason"] == "replace"
    assert join["replaces"] == "trainer-1" and join["outer_step"] == 1


def test_a_joiner_waits_for_a_horizon_boundary(tmp_path: Path) -> None:
    pool = fake_pool(tmp_path, ["trainer-0"])
    pool.members.launch("backlog")
    mark_ready(pool.store, "trainer-1", 5.0)
    pool.dealer.closed.add(1)  # the open step's horizon is closed: it joins at the next
    pool.tick()
    assert pool.syncer.joined == [] and "trainer-1" in pool.members.pending
    pool.syncer.committed_step = lambda: 1  # step 1 committed: step 2 is open
    pool.tick()
    assert pool.syncer.joined == ["trainer-1"]
    assert _records(pool, "join")[0]["outer_step"] == 2


def test_failed_starts_are_bounded_then_the_pool_gives_up(tmp_path: Path) -> None:
    pool = fake_pool(tmp_path, ["trainer-0", "trainer-1"])
    pool.provider.status_of["trainer-0-i0"] = IslandStatus.EXITED
    pool.provider.status_of["trainer-1-i0"] = IslandStatus.EXITED
    pool.tick()  # both left before merging a delta: two failed starts, two replacements
    assert pool.members.failures == 2 and sorted(pool.members.pending) == [
        "trainer-2",
        "trainer-3",
    ]
    pool.provider.status_of["trainer-2-i0"] = IslandStatus.EXITED  # dies while starting
    pool.tick()  # the third failed start: no more replacements
    assert pool.members.failures == 3 and "no_replacement" in _kinds(pool)
    assert sorted(pool.members.pending) == ["trainer-3"]
    pool.provider.status_of["trainer-3-i0"] = IslandStatus.EXITED
    with pytest.raises(TrainerLoopGaveUp, match="failed starts"):
        pool.tick()
    assert pool.finished == "gave_up"
    assert pool.provider.launched == [f"trainer-{i}" for i in range(4)]


def test_a_starting_island_past_ready_timeout_is_a_failed_start(tmp_path: Path) -> None:
    now = [1.0]
    pool = fake_pool(tmp_path, ["trainer-0"], now=lambda: now[0])
    pool.members.launch("backlog")
    now[0] = 1000.0  # past ready_timeout_s = 60
    pool.tick()
    (failed,) = _records(pool, "join_failed")
    assert failed["island"] == "trainer-1" and failed["reason"] == "ready_timeout"
    assert "trainer-1-i0" in pool.provider.released


def test_a_replacement_whose_delta_merged_resets_the_failures(tmp_path: Path) -> None:
    pool = fake_pool(tmp_path, ["trainer-0", "trainer-1"])
    pool.provider.status_of["trainer-1-i0"] = IslandStatus.EXITED
    pool.tick()
    mark_ready(pool.store, "trainer-2", 5.0)
    pool.tick()
    assert pool.members.failures == 1
    pool.members.on_step(types.SimpleNamespace(merged=(("trainer-2", 1, 1.0),)))
    assert pool.members.failures == 0


def test_s1_scales_the_pool_at_a_committed_step(tmp_path: Path) -> None:
    sync = SyncConfig(local_steps=2, min_islands=1, max_islands=3)
    pool = fake_pool(tmp_path, ["trainer-0", "trainer-1"], sync=sync)
    groups = [0]
    pool.buffer = types.SimpleNamespace(
        data_ended=lambda: False, backlog=lambda: types.SimpleNamespace(groups=groups[0])
    )
    step = types.SimpleNamespace(merged=())
    groups[0] = 2 * 5  # 5 rounds of 2 groups wait; 2 islands take 4 a horizon
    pool.members.on_step(step)
    (scale,) = _records(pool, "scale")
    assert (scale["change"], scale["reason"], scale["waiting_rounds"]) == (1, "backlog", 5)
    assert list(pool.members.pending) == ["trainer-2"]
    groups[0] = 0  # nothing waits: the starting island is cancelled first
    pool.members.on_step(step)
    assert pool.members.pending == {} and "join_cancelled" in _kinds(pool)
    pool.members.on_step(step)  # then an island of the roster leaves
    assert pool.roster == ["trainer-0"] and pool.syncer.left == [("trainer-1", "scaled_down")]
    pool.members.on_step(step)  # at min_islands: it holds
    assert pool.roster == ["trainer-0"]
    assert [r["reason"] for r in _records(pool, "scale")] == [
        "backlog",
        "scaled_down",
        "scaled_down",
        "steady",
    ]


def _rule(islands: int, waiting: int, **kw) -> tuple[int, str]:
    d = s1_scale_islands(
        PoolScaleInputs(
            islands=islands,
            waiting_rounds=waiting,
            local_steps=kw.pop("local_steps", 4),
            min_islands=kw.pop("min_islands", 1),
            max_islands=kw.pop("max_islands", 4),
            **kw,
        )
    )
    return d.change, d.reason


@pytest.mark.parametrize(
    ("islands", "waiting", "kw", "expected"),
    [
        (2, 9, {}, (ADD, "backlog")),  # 9 rounds wait, 2 x 4 taken a horizon
        (2, 8, {}, (HOLD, "steady")),  # exactly a horizon: no change
        (2, 4, {}, (HOLD, "steady")),  # one island fewer would take 4: not fewer
        (2, 3, {}, (REMOVE, "scaled_down")),
        (1, 0, {}, (HOLD, "steady")),  # at min_islands
        (4, 100, {}, (HOLD, "at_max")),
        (2, 100, {"budget_ok": False}, (HOLD, "budget")),
        (2, 100, {"data_ended": True}, (HOLD, "data_end")),
        (2, 0, {"data_ended": True}, (HOLD, "data_end")),
        (1, 0, {"min_islands": 2}, (ADD, "below_min")),
        (4, 100, {"max_islands": 3}, (REMOVE, "above_max")),
    ],
)
def test_s1_island_rule(islands, waiting, kw, expected) -> None:
    assert _rule(islands, waiting, **kw) == expected


def test_start_delay_knob() -> None:
    env = {"YETO_SYNC_START_DELAY_S": "trainer-2=1.5, trainer-3=0"}
    assert start_delay_s(env, "trainer-2") == 1.5
    assert start_delay_s(env, "trainer-0") == 0.0
    with pytest.raises(ValueError, match="island=seconds"):
        start_delay_s({"YETO_SYNC_START_DELAY_S": "trainer-2=soon"}, "trainer-2")


def test_an_island_its_provider_lost_leaves_as_lost_and_is_no_failed_start(tmp_path: Path) -> None:
    # an eviction (a marketplace's lease lost, a spot preemption) is the provider's doing:
    # the island leaves with reason lost, its rounds go back, and its replacement does not
    # count against max_failures, where an exit before a merged delta does
    pool = fake_pool(tmp_path, ["trainer-0", "trainer-1"])
    pool.provider.status_of["trainer-1-i0"] = IslandStatus.LOST
    pool.tick()
    (leave,) = _records(pool, "leave")
    assert leave["island"] == "trainer-1" and leave["reason"] == "lost"
    assert pool.members.failures == 0
    (launched,) = _records(pool, "launched")
    assert launched["replaces"] == "trainer-1" and launched["after"] == "lost"
    # the replacement is evicted while it starts: not a failed start either
    pool.provider.status_of["trainer-2-i0"] = IslandStatus.LOST
    pool.tick()
    (failed,) = _records(pool, "join_failed")
    assert failed["island"] == "trainer-2" and failed["reason"] == "lost"
    assert pool.members.failures == 0 and "trainer-3" in pool.members.pending
    # an exit is still one
    pool.provider.status_of["trainer-0-i0"] = IslandStatus.EXITED
    pool.tick()
    assert [r["reason"] for r in _records(pool, "leave")] == ["lost", "exited"]
    assert pool.members.failures == 1
