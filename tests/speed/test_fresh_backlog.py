"""The sampler loop's ``fresh_only``: no group is sampled that the policy-age gate will
age out before the trainer reaches it (a single-threaded simulation: counts, no timings)."""

from __future__ import annotations

from yeto_core.records import RoundSpec, SamplingParams
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.sampler.room import SeenReleases
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_core.testing.fakes import DigitsTask, WeightFileEngine, digits_sampler


def fresh_loop(buf, **options):
    """A sampler loop on ``buf`` with ``fresh_only`` behind a lagging follower (one island
    of two unless ``share_of`` says otherwise); ``options`` override the defaults."""
    return digits_sampler(
        buf, **{"backlog_cap": 64, "fresh_only": (3, 16), "share_of": 2, **options}
    )


def simulate(fresh_only, *, rounds=60, age=1, per_round=4, per_call=3, load_every=3):
    """Two sampler islands woken together twice per trained round (both decide before
    either appends, as after one commit); each trained round's release is seen one step
    after its commit; the followers load the trainer's version every ``load_every``
    rounds. :returns: (trained, stale, waits, appended, events)."""
    buf = MemoryBuffer()
    trainer = {"version": 0, "seen": None}
    events, loops = [], []
    for h in range(2):
        loops.append(
            digits_sampler(
                buf,
                host=f"h{h}",
                prompts_per_call=per_call,
                backlog_cap=10 * per_round,
                emit=events.append,
                fresh_only=(age, per_round) if fresh_only else None,
                latest_release=lambda: trainer["seen"],
                share_of=2,
            )
        )
    trained = stale = waits = 0
    for r in range(rounds):
        for _ in range(2):
            go = [loop.claim_room()[0] > 0 for loop in loops]
            waits += go.count(False)
            for loop, ok in zip(loops, go, strict=True):
                if ok:
                    assert loop.run_round() is not None
        trainer["seen"] = (trainer["version"], buf.watermark)  # the last round's release
        if buf.backlog().groups >= per_round:
            rnd = buf.select(
                RoundSpec(
                    max_groups=per_round, current_version=trainer["version"], max_policy_age=age
                )
            )
            buf.commit(rnd)  # its release is seen at the next step
            trained += len(rnd.entries)
            stale += len(rnd.stale)
            trainer["version"] += 1
        if r % load_every == 0:
            for loop in loops:
                loop.engine.version = trainer["seen"][0]  # the followers' loads, behind
    return trained, stale, waits, len(buf.groups), events


def test_without_fresh_only_the_scenario_wastes_groups():
    trained, stale, _waits, _n, _ev = simulate(False)
    assert stale > 0 and trained > 0


def test_fresh_only_samples_no_group_the_gate_ages_out():
    trained, stale, waits, appended, events = simulate(True)
    assert stale == 0
    assert trained >= 120  # the trainer still trains (at least half of its 60 rounds)
    assert waits > 0 and appended >= trained
    cut = [e for e in events if e.kind == "sampler_round" and e.data["groups"] < 3]
    assert cut, "some calls were cut to the groups that fit"
    waited = [e for e in events if e.kind == "sampler_backlog_wait"]
    assert not waited  # claim_room never waits; the loop's wait announces its inputs


def test_with_the_trainer_stopped_the_backlog_reaches_s1s_start_threshold():
    # R == v: the bound is (age + 1) x groups_per_round, S1's start threshold, exactly
    buf = MemoryBuffer()
    loop = fresh_loop(buf, prompts_per_call=5)
    for _ in range(40):
        if loop.claim_room()[0] <= 0:
            break
        loop.run_round()
    assert buf.backlog().groups == 64


def test_seen_releases_remembers_the_newest_release_and_forwards_the_rest():
    class Rel:
        version = 7
        info = {"buffer_watermark": 112}

    class Store:
        prefix = "releases"

        def latest(self):
            return Rel()

    seen = SeenReleases(Store())
    assert seen.seen() is None
    assert seen.latest().version == 7 and seen.seen() == (7, 112)
    assert seen.prefix == "releases"


def test_ample_room_spares_the_next_backlog_read_and_a_tight_one_does_not():
    buf = MemoryBuffer()
    reads = []
    real = buf.backlog
    buf.backlog = lambda *a, **k: (reads.append(1), real(*a, **k))[1]
    loop = fresh_loop(buf)
    calls = 0
    while loop.claim_room()[0] > 0:
        loop.run_round()
        calls += 1
    # 64 groups of room, 4 a call, 2 islands: a read leaves room for 2 more calls of
    # both islands after this one and the other's; the backlog still stops at the bound
    assert buf.backlog().groups == 64
    assert len(reads) < calls  # some calls went without a read
    assert loop.claim_room()[0] == 0  # at the bound it reads again (and finds no room)


def evicted_groups(calls: int) -> MemoryBuffer:
    """A buffer holding ``calls`` calls (4 groups each) of an evicted incarnation (h0, 2)."""
    buf = MemoryBuffer()
    evicted = SamplerLoop(
        buf,
        WeightFileEngine(),
        DigitsTask(),
        None,
        host="h0",
        incarnation=2,
        group_size=2,
        prompts_per_call=4,
        sampling=SamplingParams(),
    )
    for _ in range(calls):
        evicted.run_round()
    assert buf.backlog().groups == 4 * calls
    return buf


def _is_evicted(host: str, incarnation: int) -> bool:
    return (host, incarnation) == ("h0", 2)


def test_groups_of_a_fenced_incarnation_do_not_fill_the_fresh_room():
    """An evicted sampler's groups wait in the buffer until the trainer skips them (its
    incarnation is fenced); counted as fresh, they filled the room, the islands stopped
    sampling and the trainer never got a full round (a run stopped by the silence
    backstop, twice, in the eviction campaign)."""
    buf = evicted_groups(3)

    def loop(fenced):  # (age + 1) x 4 = 12 groups of room
        return fresh_loop(
            buf, host="h0", incarnation=4, fresh_only=(2, 4), share_of=1, fenced=fenced
        )

    assert loop(None).claim_room()[0] == 0  # the evicted incarnation's groups count
    assert loop(_is_evicted).claim_room()[0] == 12  # none of them counts: the whole room


def test_groups_of_a_fenced_incarnation_do_not_fill_the_backlog_cap():
    """The same without ``fresh_only``: a few lost nodes' groups filled a small
    ``backlog_cap`` (they wait until the trainer commits past them, and it commits only
    with a round of trainable groups), the islands waited on the cap and the trainer on
    trainable groups until the silence backstop stopped the run (docs/nc.md)."""
    buf = evicted_groups(4)

    def loop(fenced):
        return fresh_loop(
            buf, host="h0", incarnation=4, fresh_only=None, backlog_cap=16, fenced=fenced
        )

    assert loop(None).claim_room() == (0, {"backlog_groups": 16})  # at the cap
    room, why = loop(_is_evicted).claim_room()
    assert room == 4 and why["backlog_groups"] == 0


def test_a_commit_whose_release_never_comes_stops_holding_the_room_back():
    """Regression (found by make chaos): a trainer killed between its commit and its
    publish left the watermark a round past the newest release. The islands counted that
    release as coming and held the backlog at A_hard rounds; S1 waits for A_hard + 1
    with the trainer stopped; nothing moved until the silence backstop stopped the run."""
    from yeto_core.sampler.room import PENDING_RELEASE_S

    buf = MemoryBuffer()
    now = {"t": 0.0}
    loop = fresh_loop(
        buf,
        fresh_only=(2, 4),
        share_of=1,
        latest_release=lambda: (0, 0),  # release 0, written at watermark 0
        clock=lambda: now["t"],
    )
    while loop.claim_room()[0] > 0:
        loop.run_round()
    assert buf.backlog().groups == 12  # (A_hard + 1) rounds: S1's start threshold
    buf.commit(buf.select(RoundSpec(max_groups=4, current_version=0, max_policy_age=2)))
    # the trainer died before publishing release 1: the islands wait for it a while...
    room, why = loop.claim_room()
    assert room == 0 and why["trainer_version"] == 1
    now["t"] += PENDING_RELEASE_S - 1
    assert loop.claim_room()[0] == 0
    # ...then sample up to S1's threshold again, so S1 starts the next trainer
    now["t"] += 2
    while loop.claim_room()[0] > 0:
        loop.run_round()
    assert buf.backlog().groups == 12


def test_each_call_reports_the_decision_that_sized_it():
    _trained, _stale, _waits, _n, events = simulate(True)
    rounds = [e.data for e in events if e.kind == "sampler_round"]
    assert rounds and all("room" in r for r in rounds)
    read = [r["room"] for r in rounds if not r["room"].get("read_skipped")]
    skipped = [r["room"] for r in rounds if r["room"].get("read_skipped")]
    assert read and all(
        {"backlog_groups", "served_version", "trainer_version", "fresh_room"} <= set(r)
        for r in read
    )
    assert all(r["decided_s_ago"] >= 0 for r in read + skipped)
    # a call is never larger than the room its decision found
    for r in rounds:
        if not r["room"].get("read_skipped"):
            assert r["groups"] <= max(1, r["room"]["fresh_room"])
    # without a cap or fresh_only there is no decision to report
    events = []
    loop = fresh_loop(MemoryBuffer(), fresh_only=None, backlog_cap=None, emit=events.append)
    assert loop.wait_for_room()
    loop.run_round()
    assert "room" not in events[-1].data
