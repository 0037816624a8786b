"""The head's reads of the trainer's answer channel while a train command runs.

A train command with ``for_s`` answers after the round that passes ``for_s`` (or early:
the data end, every round it asked for, a failure). The head reads the channel rarely
until ``for_s`` has passed, then every ``poll_s``; it looks at the provider's status
every ``poll_s`` throughout. Counts on a store that looks remote, and a fake clock
(never timings): the trainer's answer lands at a set time of that clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest

from yeto_core.records import LifecycleState
from yeto_core.testing.fakes import Clock, RemoteLookingDirStore, launch_for
from yeto_core.trainer.lifecycle import RemoteTrainerLifecycle
from yeto_core.trainer.lifecycle.remote import QUIET_POLL_S, Channel
from yeto_core.trainer.lifecycle.states import TrainerFailedError

POLL_S = 0.05


class CountingStore(RemoteLookingDirStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.channel_gets = 0

    def get(self, key: str) -> bytes:
        if "/events/" in key:
            self.channel_gets += 1
        return super().get(key)


class Provider:
    def __init__(self) -> None:
        self.exited_at: Optional[float] = None
        self.clock: Any = None

    def launch(self, launch: Any) -> str:
        return "h-0"

    def status(self, handle: str) -> str:
        gone = self.exited_at is not None and self.clock() >= self.exited_at
        return "exited" if gone else "running"

    def release(self, handle: str) -> bool:
        return True


def _remote(tmp_path: Path, answer_at: Optional[float], rounds: int = 3):
    """A READY remote lifecycle whose trainer answers the next command at ``answer_at``
    (``answers``: more ``(clock time, rounds)`` to answer later commands with)."""
    store = CountingStore(tmp_path / "store")
    clock, provider = Clock(), Provider()
    provider.clock = clock
    trainer = Channel(store, 0, "events")  # the trainer's side of the channel
    answers = [] if answer_at is None else [(answer_at, rounds)]
    answered: list[float] = []

    def sleep(dt: float) -> None:
        clock.advance(dt)
        if len(answers) > len(answered) and clock.t >= answers[len(answered)][0]:
            cmd = len(answered)
            trainer.send({"kind": "trained", "cmd": cmd, "rounds": answers[cmd][1], "counters": {}})
            answered.append(clock.t)

    remote = RemoteTrainerLifecycle(
        store, provider, launch_for(store), poll_s=POLL_S, clock=clock, sleep=sleep
    )
    remote.start(0)
    trainer.send({"kind": "ready", "summary": {}, "counters": {}})
    assert remote.state() == LifecycleState.READY
    store.channel_gets = 0
    return remote, store, clock, provider, answered, answers


def test_a_train_command_reads_the_channel_rarely_until_for_s_passed(tmp_path):
    # the answer lands 0.3 s after for_s (the round that passed it): 2.3 s of waiting,
    # 46 reads at one per poll_s before; now one per QUIET_POLL_S for 2 s, then per poll_s
    remote, store, clock, _, answered, _ = _remote(tmp_path, answer_at=2.3)
    assert remote.train(32, for_s=2.0) == 3
    assert store.channel_gets <= 2.0 / QUIET_POLL_S + 0.3 / POLL_S + 2
    assert clock.t - answered[0] <= POLL_S + 1e-9  # learned within one poll, as before


def test_without_for_s_the_channel_is_read_every_poll(tmp_path):
    remote, store, clock, _, answered, _ = _remote(tmp_path, answer_at=1.0)
    assert remote.train(32) == 3
    assert store.channel_gets >= 1.0 / POLL_S - 1
    assert clock.t - answered[0] <= POLL_S + 1e-9


def test_an_early_answer_is_learned_within_the_quiet_poll(tmp_path):
    remote, store, clock, _, answered, _ = _remote(tmp_path, answer_at=0.3)  # the data end
    assert remote.train(32, for_s=2.0) == 3
    assert clock.t - answered[0] <= QUIET_POLL_S + 1e-9
    assert store.channel_gets <= 2


def test_a_short_command_is_quiet_for_half_its_rounds_at_the_last_pace(tmp_path):
    remote, store, clock, _, answered, answers = _remote(tmp_path, answer_at=2.3, rounds=23)
    assert remote.train(32, for_s=2.0) == 23  # 0.1 s a round
    # the next command asks for 4 rounds: about 0.4 s, read rarely for 0.2 s only
    began = clock.t
    answers.append((began + 0.4, 4))
    assert remote.train(4, for_s=2.0) == 4
    assert clock.t - answered[1] <= POLL_S + 1e-9


def test_a_trainer_gone_is_seen_within_a_poll_while_quiet(tmp_path):
    remote, _, clock, provider, _, _ = _remote(tmp_path, answer_at=None)
    provider.exited_at = 0.7
    with pytest.raises(TrainerFailedError, match="died before answering"):
        remote.train(32, for_s=2.0)
    assert clock.t <= 0.7 + POLL_S + 1e-9


class _Driver:
    """The agent's driver: a train command takes ``round_s`` a round of the clock; the
    clock time of each command it is given is recorded."""

    start_seconds = 0.1
    restored_cut = None

    def __init__(self, clock: Clock, round_s: float) -> None:
        from yeto_core.trainer.lifecycle.states import TrainerCounters

        self.clock, self.round_s, self.counters = clock, round_s, TrainerCounters()
        self.given: list[float] = []

    def start(self, incarnation: int, cut: Any) -> None:
        pass

    def train(self, rounds: int, for_s: Optional[float]) -> int:
        self.given.append(self.clock.t)
        self.clock.advance(self.round_s * rounds)
        return rounds

    def drain(self, reason: Any) -> None:
        self.given.append(self.clock.t)


def _agent_run(tmp_path: Path, turns: list[float], poll_s: float = 0.02):
    """The trainer island's agent given ``len(turns) + 1`` commands: a train command, then
    each next one (the last a drain) written ``turns[i]`` after the agent's i-th answer.
    :returns: the agent's reads of its command channel, and how late it read each command
    after it was written."""
    from yeto_core.trainer.lifecycle import IslandTrainerAgent

    class Store(RemoteLookingDirStore):
        reads = 0

        def get(self, key: str) -> bytes:
            if "/commands/" in key:
                self.reads += 1
            return super().get(key)

    store, clock = Store(tmp_path / "store"), Clock()
    head, answers = Channel(store, 0, "commands"), Channel(store, 0, "events")
    due = [0.0]  # when each command is written (the first at once)

    def sleep(dt: float) -> None:  # the head's side, between the agent's reads
        for msg in answers.receive():  # an answer is written just before the agent waits
            if msg["kind"] == "trained":
                due.append(clock.t + turns[len(due) - 1])
        clock.advance(dt)
        for t in due[len(head_sent) :]:
            if t <= clock.t:
                last = len(head_sent) == len(turns)
                head.send(
                    {"op": "drain", "reason": "STOPPED"} if last else {"op": "train", "rounds": 2}
                )
                head_sent.append(t)

    head_sent: list[float] = []
    driver = _Driver(clock, 0.5)
    agent = IslandTrainerAgent(store, driver, 0, poll_s=poll_s, clock=clock, sleep=sleep)
    head.send({"op": "train", "rounds": 2})
    head_sent.append(0.0)
    agent.run()
    assert len(driver.given) == len(turns) + 1
    return store.reads, [g - t for g, t in zip(driver.given, head_sent, strict=True)]


def test_the_trainer_reads_its_commands_rarely_during_the_heads_turn(tmp_path, monkeypatch):
    # the head's turn (read the answer, tick, write the next command) takes 0.3 s: at one
    # read every poll_s (20 ms) that is 16 reads a turn; paced, after three turns, the
    # agent waits 3/4 of the shortest turn first, then reads every poll_s (about 6)
    from yeto_core.trainer.lifecycle import remote

    turns = [0.3] * 12
    reads, late = _agent_run(tmp_path / "paced", turns)
    monkeypatch.setattr(remote, "TURN_QUIET_SHARE", 0.0)  # the agent before this change
    unpaced, unpaced_late = _agent_run(tmp_path / "unpaced", turns)
    assert unpaced >= 12 * 16, unpaced
    assert reads <= unpaced - 9 * 9, (reads, unpaced)  # 9 paced turns, 9+ reads fewer each
    assert max(late) <= 0.02 + 1e-9  # no command is read later than one poll after it came
    assert max(unpaced_late) <= 0.02 + 1e-9


def test_a_head_that_turns_faster_is_followed_within_a_few_turns(tmp_path):
    # turns of 0.3 s, then of 0.1 s: the first short ones are read at the old quiet
    # (0.225 s after the answer, 0.125 s late), then the shortest turn sets the quiet again
    turns = [0.3] * 4 + [0.1] * 6
    _, late = _agent_run(tmp_path, turns)
    assert max(late) <= 0.75 * 0.3 - 0.1 + 0.02 + 1e-9
    assert max(late[-3:]) <= 0.02 + 1e-9
