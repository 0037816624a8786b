"""The head's round dealer with the store syncer, islands played in-process: every round
to one island, a departed island's and a rejected delta's rounds dealt again, the ledger
written in take order once the merging outer step commits (``BatchLedger.check``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.ledger import BatchLedger
from yeto_core.buffer.ledger_replay import rebuild_batch
from yeto_core.ports.sync import SyncSettings
from yeto_core.stores.dir_store import DirStore
from yeto_core.sync.dealer import RoundDealer
from yeto_core.sync.deals import DealFeed, read_horizon
from yeto_core.sync.store_syncer import StoreSyncer
from yeto_core.testing.fake_backend import FakeBackend, MemoryBuffer, make_group


class _Island:
    """An island's part, one call at a time: train the deals of a step, submit."""

    def __init__(self, name: str, store, buffer, syncer) -> None:
        self.name, self.store, self.buffer, self.syncer = name, store, buffer, syncer
        self.backend = FakeBackend(seed=1)
        self.feed = DealFeed(store)
        self.deals = []
        self.trained = []

    def train_step(self, step: int) -> None:
        self.deals += [d for d in self.feed.new() if d.island == self.name]
        start = self.syncer.merged(step - 1)
        self.backend.load_parameters(start)
        entries = {e.position: e for e in self.buffer.entries(0)}
        for d in self.deals:
            if d.outer_step == step:
                self.backend.train_round(rebuild_batch(self.buffer, d.round, entries))
                self.trained.append((d.deal, d.gen))

    def submit(self, step: int, *, poison: bool = False) -> None:
        start = self.syncer.merged(step - 1)
        delta = {"params": self.backend.parameters()["params"] - start["params"]}
        if poison:
            delta["params"][0] = np.nan
        assert self.syncer.submit(self.name, step, delta).stored


def _setup(tmp_path: Path, groups: int, *, end: bool = True):
    store = DirStore(tmp_path / "store")
    buffer = MemoryBuffer()
    for p in range(groups):
        buffer.append(make_group(p, 0))
    if end:
        buffer.mark_data_end()
    reader = BatchReader(buffer, group_size=4, groups_per_round=2, max_policy_age=100)
    ledger = BatchLedger(store)
    syncer = StoreSyncer.open(store, SyncSettings(preset="strict", diverged_ratio=0.0))
    syncer.start({"params": np.zeros(4)}, ("a", "b"))
    dealer = RoundDealer(store, lambda: reader, ledger, local_steps=2)
    islands = {n: _Island(n, store, buffer, syncer) for n in ("a", "b")}
    return store, buffer, ledger, syncer, dealer, islands


def _play_step(dealer, syncer, islands, n: int, names: list[str], train: tuple[str, ...]) -> None:
    """One outer step as the head plays it with elastic expiry: expire, deal to ``names``,
    close, the ``train`` islands train and submit, the syncer's decision applied."""
    dealer.expire(n, 1)
    dealer.deal(n, names, n - 1, False)
    assert dealer.close(n, names) is not None, f"step {n} cannot close"
    for name in train:
        islands[name].train_step(n)
        islands[name].submit(n)
    dealer.on_step(syncer.poll())


def _synced_island(name: str, buffer, store, syncer, events: list, sleep):
    """The real island loop of ``name``, played in-process (its events into ``events``)."""
    from yeto_core.sync.island_loop import SyncedIsland

    return SyncedIsland(
        name,
        FakeBackend(seed=1),
        buffer,
        store,
        syncer,
        emit=lambda kind, **data: events.append((kind, data)),
        timeout_s=5.0,
        poll_s=0.0,
        sleep=sleep,
    )


def test_a_departed_islands_rounds_are_dealt_again_and_recorded_once(tmp_path: Path) -> None:
    store, buffer, ledger, syncer, dealer, islands = _setup(tmp_path, 8)
    assert dealer.deal(1, ["a", "b"], 0, True) == 4
    horizon = dealer.close(1, ["a", "b"])
    assert horizon is not None and horizon.deals == {"a": [(0, 0), (2, 0)], "b": [(1, 0), (3, 0)]}
    islands["a"].train_step(1)
    islands["b"].train_step(1)  # b trains, then dies before it submits
    syncer.leave("b", "exited")
    assert dealer.island_gone("b") == 2
    islands["a"].submit(1)
    step = syncer.poll()
    assert step is not None and step.merged == (("a", 1, 1.0),)
    written = dealer.on_step(step)
    # only round 0 is recorded: round 1 (b's) is not merged, and the ledger keeps take order
    assert [r.seq for r, _ in written] == [1] and written[0][0].island == "a"
    assert buffer.watermark == 2
    # step 2: b's two rounds go to a (gen 1), nothing new is taken before them
    assert dealer.deal(2, ["a"], 1, True) == 2
    assert read_horizon(store, 2) is None
    horizon = dealer.close(2, ["a"])
    assert horizon is not None and horizon.deals == {"a": [(1, 1), (3, 1)]}
    islands["a"].train_step(2)
    # a round dealt again is listed after every record the island read before
    assert islands["a"].trained == [(0, 0), (2, 0), (1, 1), (3, 1)]
    islands["a"].submit(2)
    written = dealer.on_step(syncer.poll())
    assert [(r.seq, r.island, r.outer_step) for r, _ in written] == [
        (2, "a", 2),
        (3, "a", 1),
        (4, "a", 2),
    ]
    assert ledger.check(watermark=buffer.watermark) == {
        "rounds": 4,
        "trained": 8,
        "skipped": 0,
        "watermark": 8,
    }
    # the data is used up: the next horizon is final and empty, the dealer is done
    assert dealer.deal(3, ["a"], 2, True) == 0
    final = dealer.close(3, ["a"])
    assert final is not None and final.final and final.deals == {"a": []}
    assert dealer.done


def test_a_rejected_delta_gives_its_rounds_back(tmp_path: Path) -> None:
    store, buffer, ledger, syncer, dealer, islands = _setup(tmp_path, 8)
    dealer.deal(1, ["a", "b"], 0, True)
    dealer.close(1, ["a", "b"])
    for name in ("a", "b"):
        islands[name].train_step(1)
    islands["a"].submit(1)
    islands["b"].submit(1, poison=True)
    step = syncer.poll()
    assert step.rejected == (("b", 1, "non_finite"),)
    dealer.on_step(step)
    assert [r.seq for r in ledger.trained_rounds()] == [1]  # b's round 1 blocks the rest
    assert dealer.deal(2, ["a", "b"], 1, True) == 2  # b's two rounds, dealt again
    assert dealer.close(2, ["a", "b"]) is not None
    held = dealer.held(2)
    assert {r.deal for rs in held.values() for r in rs} == {1, 3}
    for name in ("a", "b"):
        islands[name].train_step(2)
        islands[name].submit(2)
    dealer.on_step(syncer.poll())
    assert ledger.check(watermark=buffer.watermark)["trained"] == 8
    trained = [p for r in ledger.trained_rounds() for p in r.positions]
    assert sorted(trained) == list(range(8))


def test_rounds_whose_delta_is_too_late_to_merge_are_dealt_again(tmp_path: Path) -> None:
    """elastic, quorum 1, max_carry_age 1: b never submits for step 1; once step 2 is
    committed its step-1 rounds can no longer merge and go to the next horizon, and b's
    delta, when it finally comes, is rejected too_old without a round given back twice."""
    store, buffer, ledger, _syncer, dealer, islands = _setup(tmp_path, 16)
    syncer = StoreSyncer.open(
        DirStore(tmp_path / "elastic"),
        SyncSettings(preset="elastic", quorum=1, max_carry_age=1, diverged_ratio=0.0),
    )
    syncer.start({"params": np.zeros(4)}, ("a", "b"))
    for isl in islands.values():
        isl.syncer = syncer
    for step in (1, 2):
        dealer.deal(step, ["a", "b"], step - 1, True)
        dealer.close(step, ["a", "b"])
        islands["a"].train_step(step)
        islands["a"].submit(step)
        dealer.on_step(syncer.poll())
        assert dealer.expire(step + 1, 1) == (2 if step == 2 else 0)
    assert [r.deal for r in dealer.redeal] == [1, 3]  # b's step-1 rounds
    assert ledger.trained_rounds()[-1].seq == 1  # b's round 1 holds the watermark
    islands["b"].train_step(1)
    islands["b"].submit(1)  # too late: age 2 at the next decision
    dealer.deal(3, ["a", "b"], 2, True)
    held = dealer.held(3)
    assert {r.deal for rs in held.values() for r in rs} >= {1, 3}
    dealer.close(3, ["a", "b"])
    for name in ("a", "b"):
        islands[name].train_step(3)
        islands[name].submit(3)
    step = syncer.poll()
    assert ("b", 1, "too_old") in step.rejected
    dealer.on_step(step)
    assert not dealer.redeal  # the rejection gave nothing back: dealt again already
    trained = [p for r in ledger.trained_rounds() for p in r.positions]
    assert len(trained) == len(set(trained))
    ledger.check(watermark=buffer.watermark)


def test_no_empty_final_horizon_while_a_late_delta_is_awaited(tmp_path: Path) -> None:
    """The data ended and every round is dealt, but b's step-1 delta has not merged: the
    horizon of step 2 is not closed empty (that would stop both islands and leave b's
    rounds untrained); once b's rounds are dealt again it closes with them."""
    store, buffer, ledger, _syncer, dealer, islands = _setup(tmp_path, 8)
    syncer = StoreSyncer.open(
        DirStore(tmp_path / "elastic"), SyncSettings(preset="elastic", quorum=1)
    )
    syncer.start({"params": np.zeros(4)}, ("a", "b"))
    islands["a"].syncer = syncer
    dealer.deal(1, ["a", "b"], 0, True)
    dealer.close(1, ["a", "b"])
    islands["a"].train_step(1)
    islands["a"].submit(1)
    dealer.on_step(syncer.poll())
    assert dealer.deal(2, ["a", "b"], 1, True) == 0 and dealer.exhausted
    assert dealer.close(2, ["a", "b"]) is None
    assert dealer.island_gone("b") == 2  # the head's late-at-data-end: b leaves
    assert dealer.deal(2, ["a"], 1, True) == 2
    horizon = dealer.close(2, ["a"])
    assert horizon is not None and horizon.final and horizon.deals == {"a": [(1, 1), (3, 1)]}


def test_a_stop_closes_the_open_step_short_and_takes_no_new_round(tmp_path: Path) -> None:
    """A stop of the pool with three rounds dealt for the open step (the buffer idle):
    the dealer takes nothing more from the buffer, closes the step with the rounds held
    (``stop``), and once it commits every round taken is in the ledger: the cut's state
    leaves nothing dealt and unmerged."""
    store, buffer, ledger, syncer, dealer, islands = _setup(tmp_path, 12, end=False)
    dealer.deal(1, ["a", "b"], 0, False)
    dealer.close(1, ["a", "b"])
    for name in ("a", "b"):
        islands[name].train_step(1)
        islands[name].submit(1)
    dealer.on_step(syncer.poll())
    dealer.hold = True  # the stop: rounds 4 and 5 wait in the buffer, none is taken
    assert dealer.deal(2, ["a", "b"], 1, False) == 0
    assert dealer.close(2, ["a", "b"], stop=True) is None  # nothing held: nothing to close
    dealer.hold = False
    assert dealer.deal(2, ["a", "b"], 1, False) == 2  # the two rounds there are
    dealer.hold = True
    assert dealer.close(2, ["a", "b"]) is None  # not full: a horizon waits for more
    horizon = dealer.close(2, ["a", "b"], stop=True)
    assert horizon is not None and horizon.stop and not horizon.final
    assert horizon.deals == {"a": [(4, 0)], "b": [(5, 0)]}
    assert read_horizon(store, 2).stop
    for name in ("a", "b"):
        islands[name].train_step(2)
        islands[name].submit(2)
    dealer.on_step(syncer.poll())
    assert not dealer.rounds and not dealer.redeal
    assert ledger.check(watermark=buffer.watermark)["trained"] == 12


def test_a_late_islands_expired_rounds_go_to_an_island_on_time(tmp_path: Path) -> None:
    """elastic, quorum 1, max_carry_age 1, a never submits (it started late) while b
    trains every step, and the samplers keep the buffer at the backlog cap (3 horizons
    of groups beyond the watermark). a's rounds expire and are dealt again: to b, not to a
    (the first island by name, that would hold round 0 forever), so every step closes
    and the buffer's watermark moves with b's commits; the ledger has every round once."""
    store, buffer, ledger, _syncer, dealer, islands = _setup(tmp_path, 0, end=False)
    syncer = StoreSyncer.open(
        DirStore(tmp_path / "elastic"),
        SyncSettings(preset="elastic", quorum=1, max_carry_age=1, diverged_ratio=0.0),
    )
    syncer.start({"params": np.zeros(4)}, ("a", "b"))
    islands["b"].syncer = syncer
    cap = 3 * 2 * 2 * 2  # 3 horizons of 2 islands x 2 local steps x 2 groups
    for step in range(1, 9):
        while buffer.head_position < buffer.watermark + cap:  # the samplers
            buffer.append(make_group(buffer.head_position, 0))
        _play_step(dealer, syncer, islands, step, ["a", "b"], ("b",))
    assert dealer.late == {"a"}
    # b merged its own 2 rounds of every step and, from step 3 on, a's 2 expired ones
    rounds = ledger.trained_rounds()
    assert len(rounds) >= 12 and {r.island for r in rounds} == {"b"}
    assert buffer.watermark == 2 * len(rounds)
    positions = [p for r in rounds for p in r.positions]
    assert positions == list(range(len(positions)))  # take order, each once
    ledger.check(watermark=buffer.watermark)
    # a catches up: once a delta of it merges it is on time again
    islands["a"].syncer = syncer
    dealer.expire(9, 1)
    dealer.deal(9, ["a", "b"], 8, False)
    assert dealer.close(9, ["a", "b"]) is not None
    for name in ("a", "b"):
        islands[name].train_step(9)
        islands[name].submit(9)
    step = syncer.poll()
    assert ("a", 9) in {(i, o) for i, o, _w in step.merged}
    dealer.on_step(step)
    assert dealer.late == set()
    ledger.check(watermark=buffer.watermark)


def test_a_late_island_skips_the_steps_whose_rounds_were_dealt_again(tmp_path: Path) -> None:
    """elastic, quorum 1, max_carry_age 1: a starts after step 5 committed without it. Its
    rounds of steps 1 to 3 were dealt again to b (expired): it skips those steps (their
    deltas could not merge) instead of training them from step 0, then trains its rounds
    of steps 4 and 5 (not dealt again yet) and submits them as late deltas."""
    from yeto_core.sync.deals import Horizon, write_horizon

    store, buffer, ledger, _syncer, dealer, islands = _setup(tmp_path, 40, end=False)
    syncer = StoreSyncer.open(
        store, SyncSettings(preset="elastic", quorum=1, max_carry_age=1, diverged_ratio=0.0)
    )
    syncer.start({"params": np.zeros(4)}, ("a", "b"))
    islands["b"].syncer = syncer
    for step in range(1, 6):
        _play_step(dealer, syncer, islands, step, ["a", "b"], ("b",))
    # the head ends the run at step 6 (a test's shortcut: a horizon with nothing for a)
    write_horizon(store, Horizon(outer_step=6, deals={"a": [], "b": []}, final=True))
    events: list[tuple[str, dict]] = []
    island = _synced_island("a", buffer, store, syncer, events, lambda s: None)
    assert island.run() == 2  # steps 4 and 5
    skipped = [d["outer_step"] for k, d in events if k == "island_skipped"]
    assert skipped == [1, 2, 3]
    trained = {d["outer_step"] for k, d in events if k == "island_round"}
    assert trained == {4, 5}
    submitted = [(d["outer_step"], d["stored"]) for k, d in events if k == "delta_submitted"]
    assert submitted == [(4, True), (5, True)]


def test_a_joiner_dealt_rounds_of_a_later_step_follows_until_then(tmp_path: Path) -> None:
    """elastic, quorum 1: c starts while step 2 is the last committed. By the time step 3's
    horizon (a and b only) closes, the head has dealt c rounds of step 4 already (it joined
    at 4). c follows step 3 without training and trains its rounds of step 4; it must not
    leave at step 3 for "no rounds in the horizon" (seen in `yeto bench sync --faults
    late-join`: the replacement left with 0 rounds and the pool launched another)."""
    from yeto_core.sync.deals import Horizon, write_horizon

    store, buffer, ledger, _syncer, dealer, islands = _setup(tmp_path, 40, end=False)
    syncer = StoreSyncer.open(
        store, SyncSettings(preset="elastic", quorum=1, max_carry_age=1, diverged_ratio=0.0)
    )
    syncer.start({"params": np.zeros(4)}, ("a", "b"))
    for isl in islands.values():
        isl.syncer = syncer

    def step(n: int, names: list[str]) -> None:
        _play_step(dealer, syncer, islands, n, names, ("a", "b"))

    for n in (1, 2):
        step(n, ["a", "b"])
    world = iter([lambda: (step(3, ["a", "b"]), step(4, ["a", "b", "c"]))])

    def sleep(_s: float) -> None:  # the head and the other islands move while c waits
        for move in world:
            move()
            return

    events: list[tuple[str, dict]] = []
    island = _synced_island("c", buffer, store, syncer, events, sleep)
    write_horizon(store, Horizon(outer_step=5, deals={"a": [], "b": [], "c": []}, final=True))
    assert island.run() == 1, events
    left = [d["outer_step"] for k, d in events if k == "island_left"]
    assert left == [5], events
    assert [d["outer_step"] for k, d in events if k == "island_followed"] == [3]
    assert {d["outer_step"] for k, d in events if k == "island_round"} == {4}
