"""summary.json from event streams (pure), the cost ledger, and the sampler pause throttle."""

from __future__ import annotations

import threading

import pytest

from yeto_core.cost.ledger import CostLedger, CostLine, island_costs
from yeto_core.events.stream import EventStream, read_all, read_events
from yeto_core.events.summary import summarize
from yeto_core.islands.pauses import run_with_pauses, trainer_progress
from yeto_core.records import Event
from yeto_core.stores.dir_store import DirStore


def _e(kind: str, **data) -> Event:
    return Event(kind=kind, time=0.0, source="x", data=data)


def test_summary_counts_by_position_and_tenths() -> None:
    streams = {
        "sampler-0": [_e("group_appended", position=p, reward=p / 20) for p in range(20)]
        + [_e("release_loaded", version=v) for v in (0, 1, 2)],
        "sampler-1": [_e("release_loaded", version=v) for v in (0, 2, 3)],
        "trainer": [
            _e("round_trained", positions=[0, 1], rewards=[0.0, 0.1], skipped={}),
            _e("round_trained", positions=[2, 3], rewards=[0.2, 0.3], skipped={"stale": [4]}),
            # the incarnation died before its cut: the next one trains 2, 3 again
            _e("round_trained", positions=[2, 3], rewards=[0.2, 0.3], skipped={}),
            _e("round_trained", positions=[5, 6], rewards=[0.5, 0.9], skipped={"stale": [2]}),
            _e("release_published", version=1),
            _e("release_published", version=1),
            _e("release_published", version=2),
        ],
        "head": [
            _e("trainer_start"),
            _e("trainer_stop", reason="STOPPED"),
            _e("trainer_start"),
            _e("trainer_stop", reason="FINISHED"),
            _e("backstop", reason="silence"),
        ],
    }
    s = summarize(streams, cost_usd=1.23456789, wall_s=12.3456)
    assert s["groups_appended"] == 20
    assert s["reward_first"] == pytest.approx((0 + 1 / 20) / 2)  # first 10% = 2 groups
    assert s["groups_trained"] == 6  # 0, 1, 2, 3, 5, 6 once each
    assert s["reward_last"] == pytest.approx(0.9)  # last 10% of 6 trained = 1 group (pos 6)
    assert s["groups_skipped"] == {"stale": 1}  # 2 was trained after all
    assert s["groups_untrained"] == 20 - 6 - 1
    assert s["releases_published"] == 2
    assert s["sampler_versions_loaded"] == 4
    assert s["trainer_starts"] == 2 and s["trainer_stops"] == 2
    assert s["trainer_stop_reasons"] == {"FINISHED": 1, "STOPPED": 1}
    assert s["backstops"] == ["silence"]
    assert s["cost_usd"] == 1.234568 and s["wall_s"] == 12.346


def test_summary_takes_appended_rewards_from_the_buffer() -> None:
    s = summarize({}, appended={0: 1.0, 1: float("nan")})
    assert s["groups_appended"] == 2 and s["reward_first"] == 1.0
    assert s["reward_last"] is None and s["groups_trained"] == 0


def test_event_streams_roundtrip_and_continue(tmp_path) -> None:
    store = DirStore(tmp_path)
    t = [100.0]
    a = EventStream(store, "sampler-0", clock=lambda: t[0], flush_s=10.0)
    a.emit("x", n=1)
    assert read_events(store, "sampler-0") == []  # not flushed yet (flush_s)
    t[0] += 11
    a.emit("x", n=2)  # due: flushes both
    assert [e.data["n"] for e in read_events(store, "sampler-0")] == [1, 2]
    b = EventStream(store, "sampler-0", flush_s=0)  # a restarted island: its events follow
    b.emit("y")
    assert [e.kind for e in read_all(store)["sampler-0"]] == ["x", "x", "y"]
    store.put("events/bad.jsonl", b'{"kind": "ok", "time": 1}\nnot json\n')
    assert [e.kind for e in read_events(store, "bad")] == ["ok"]


def test_cost_ledger_counts_open_and_closed_intervals(tmp_path) -> None:
    lines = [
        CostLine("start", "sampler-0", "sampler-0-i0", 0.0),
        CostLine("stop", "sampler-0", "sampler-0-i0", 3600.0),
        CostLine("start", "trainer", "trainer-i0", 1800.0),  # still running
        CostLine("start", "trainer", "trainer-i0", 1900.0),  # a duplicate start is ignored
    ]
    costs = {c.island: c for c in island_costs(lines, {"sampler": 2.0, "trainer": 10.0}, 5400.0)}
    assert costs["sampler-0"].usd == pytest.approx(2.0) and not costs["sampler-0"].running
    assert costs["trainer"].usd == pytest.approx(10.0) and costs["trainer"].running
    t = [0.0]
    ledger = CostLedger(tmp_path, {"trainer": 3600.0}, clock=lambda: t[0])
    ledger.started("trainer", "trainer-i0")
    t[0] = 2.0
    assert ledger.total_usd() == pytest.approx(2.0)
    assert ledger.open_handles() == {"trainer-i0": "trainer"}
    ledger.stopped("trainer", "trainer-i0")
    t[0] = 10.0
    assert ledger.total_usd() == pytest.approx(2.0) and ledger.open_handles() == {}
    with open(ledger.path, "a") as f:
        f.write('{"event": "start", "isl')  # a torn line from a killed head
    assert len(ledger.lines()) == 2


def test_pause_throttle_pauses_after_each_window() -> None:
    t = [0.0]
    stop = threading.Event()
    rounds, events, waits = [], [], []

    class Loop:
        def flush(self):
            return []

        def run(self, max_rounds=None):
            rounds.append(t[0])
            t[0] += 1.0
            if len(rounds) >= 7:
                stop.set()

    real_wait = stop.wait

    def wait(timeout):
        waits.append(timeout)
        t[0] += timeout
        return real_wait(0)

    stop.wait = wait
    run_with_pauses(Loop(), stop, 3.0, 5.0, events.append, clock=lambda: t[0])
    assert rounds == [0.0, 1.0, 2.0, 8.0, 9.0, 10.0, 16.0]
    assert waits == [5.0, 5.0] and [e.kind for e in events] == ["sampler_pause"] * 2


def test_quiet_pause_lasts_until_the_trainer_stood_still_for_pause_s() -> None:
    """``pause_until_quiet``: a pause ends pause_s after the trainer's last progress, however
    long the trainer takes to drain (a slow machine), so S1 (T_s < pause_s) sees an idle
    trainer in every pause; a trainer that never stops is cut at the bound."""
    t = [0.0]
    stop = threading.Event()
    rounds, events = [], []

    class Loop:
        def flush(self):
            return []

        def run(self, max_rounds=None):
            rounds.append(t[0])
            t[0] += 1.0
            if len(rounds) >= 4:
                stop.set()

    def wait(timeout):
        t[0] += timeout
        return False

    stop.wait = wait

    # the trainer drains the backlog for 20 s after the pause begins (watermark moves),
    # then a release at 21 s, then nothing
    def progress():
        return (min(int(t[0] - 3.0), 20) if t[0] > 3.0 else 0, 1 if t[0] >= 24.0 else 0)

    run_with_pauses(Loop(), stop, 3.0, 5.0, events.append, clock=lambda: t[0], progress=progress)
    assert [e.kind for e in events] == ["sampler_pause", "sampler_resumed"]
    assert events[0].data == {"s": 5.0, "until_quiet": True}
    resumed = events[1].data
    # the last change was seen at 24.0 (the poll after the release): quiet 5 s later
    assert rounds == [0.0, 1.0, 2.0, 29.0]
    assert resumed["ended"] == "quiet" and resumed["paused_s"] == 26.0
    assert resumed["quiet_s"] == 5.0 and resumed["progress_changes"] == 21

    # a trainer that never stands still: the pause ends at every_s + 10 pause_s
    t[0], rounds[:], events[:] = 0.0, [], []
    stop.clear()
    run_with_pauses(
        Loop(), stop, 3.0, 5.0, events.append, clock=lambda: t[0], progress=lambda: t[0]
    )
    assert events[1].data["ended"] == "bound" and events[1].data["paused_s"] == 53.0
    assert rounds[3] == 56.0


def test_trainer_progress_reads_a_real_buffers_watermark_and_the_served_version(tmp_path) -> None:
    import numpy as np

    from yeto_core.buffer.sample_buffer import FileSampleBuffer
    from yeto_core.records import RoundSpec, Sample, SampleGroup
    from yeto_core.stores.dir_store import DirStore

    buffer = FileSampleBuffer(DirStore(tmp_path), host="sampler-0")
    t = np.arange(6, dtype=np.int32)
    s = Sample(
        tokens=t,
        prompt_len=2,
        logprobs=np.zeros(4, dtype=np.float32),
        loss_mask=np.ones(4, dtype=np.uint8),
        reward=1.0,
        weight_version=0,
    )

    class Follower:
        version = 3

    progress = trainer_progress(buffer, Follower())
    assert progress() == (0, 3)
    for i in range(2):
        buffer.append(SampleGroup(f"g{i}", f"p{i}", "sampler-0", 0, (s, s), task="echo"))
    assert progress() == (0, 3)  # appends are not the trainer's progress
    buffer.commit(buffer.select(RoundSpec(max_groups=2, current_version=0, max_policy_age=3)))
    Follower.version = 4
    assert progress() == (2, 4)


def test_pause_until_quiet_needs_a_pause_cycle() -> None:
    from yeto_core.config.checks import validate
    from yeto_core.config.load import config_from_dict

    def errors(**sampler) -> list[str]:
        data = {
            "name": "q",
            "model": {"path": "m"},
            "task": {"name": "sort4"},
            "samplers": [{"engine": "hf", **sampler}],
            "trainer": {"backend": "torch"},
        }
        return [e for e in validate(config_from_dict(data)) if "pause" in e]

    assert errors(pause_until_quiet=True) == [
        "samplers[0].pause_until_quiet = true without a pause cycle; "
        "set samplers[0].pause_every_s and samplers[0].pause_s"
    ]
    assert errors(pause_until_quiet=True, pause_every_s=45.0, pause_s=8.0) == []
