"""One trainer island of several: train the rounds dealt to it, submit its delta, continue
from the merged parameters (docs/sync.md, "Several trainer islands").

Per outer step ``n`` the island starts from the merged parameters of ``n - 1``, trains
the rounds the head's dealer deals it for ``n`` (rebuilt from the buffer by their deal
records, :mod:`yeto_core.sync.deals`), and once the horizon of ``n`` is closed and every
round it lists for this island is trained, submits ``parameters() - start`` to the
syncer, waits for the commit of ``n`` and loads its merged parameters. An island stops
at a horizon that lists no round for it (the head closes an empty one once every round
is merged, or takes the island off the roster first). An island that joins a running
pool (a replacement, or one more that S1 added) first creates its ready record
(:mod:`yeto_core.sync.members`); until a horizon lists it, it follows the committed
steps without training (it is not on the roster yet). A step whose rounds for this island
were all dealt again since (``elastic``: it was late beyond ``max_carry_age``) is skipped
once committed: its delta could not merge. It writes nothing else: the ledger,
the buffer's watermark and the releases are the head's (the rounds count only once the
outer step that merged this island's delta commits).

A stop of the pool (S1, or the head stopping): once every round is merged the head asks
the islands to cut at the outer step they all stand at (``stop_at``); the island saves
its own state there (``on_cut``) and exits. A horizon the head closed short for the
stop (``stop``) that lists no round for this island is skipped: the island waits for its
commit and goes on from the merged state (docs/sync.md, "Cuts of the trainer pool").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Optional

import numpy as np

from yeto_core.buffer.ledger_replay import rebuild_batch
from yeto_core.ports import ObjectStore, Syncer, TrainerBackend
from yeto_core.sync.deals import Deal, DealFeed, read_horizon
from yeto_core.sync.keys import SyncError
from yeto_core.sync.members import mark_ready
from yeto_core.sync.timing import wait_merged


def group_reward(group: Any) -> float:
    rewards = [float(s.reward) for s in group.samples]
    return sum(rewards) / len(rewards) if rewards else 0.0


class SyncedIsland:
    """The loop of one trainer island (the module docstring).

    :param island: its name on the roster.
    :param backend: a backend restored from the base (``parameters`` / ``load_parameters``).
    :param buffer: the run's sample buffer (rounds are rebuilt from it).
    :param syncer: the run's syncer (island side: ``submit``, ``merged``).
    :param emit: ``emit(kind, **data)``: the island's event stream.
    :param timeout_s: the longest wait for a deal, a horizon or a commit.
    """

    def __init__(
        self,
        island: str,
        backend: TrainerBackend,
        buffer: Any,
        store: ObjectStore,
        syncer: Syncer,
        *,
        emit: Callable[..., None],
        timeout_s: float = 600.0,
        poll_s: float = 0.05,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        deal_issue: int = 0,
        stop_at: Callable[[], Optional[int]] = lambda: None,
        on_cut: Optional[Callable[[int], Any]] = None,
    ) -> None:
        self.island, self.backend, self.buffer = island, backend, buffer
        self.store, self.syncer = store, syncer
        self._emit, self.timeout_s, self.poll_s = emit, timeout_s, poll_s
        self._clock, self._sleep = clock, sleep
        self.feed = DealFeed(store, after_issue=deal_issue)
        #: the outer step the head asks this incarnation to cut at (None: not asked)
        self._stop_at, self._on_cut = stop_at, on_cut
        self.mine: dict[tuple[int, int], Deal] = {}
        #: the newest ``gen`` of each deal read (any island's)
        self._gens: dict[int, int] = {}
        self.trained: set[tuple[int, int]] = set()
        self.rounds = 0
        self._entries: dict[int, Any] = {}
        #: a horizon listed this island, or a round of that step or an earlier one was
        #: dealt to it (it is a member)
        self.member = False

    def run(self) -> int:
        """Train outer steps until a horizon gives this island nothing; the steps trained."""
        step = self.syncer.committed_step()
        if step < 0:
            raise SyncError(
                f"trainer island {self.island!r}: the syncer has no outer step 0; the head "
                "starts it before it launches the trainer islands"
            )
        mark_ready(self.store, self.island, self._clock())
        self._read_deals()
        dealt = [d.outer_step for d in self.mine.values()]
        if dealt and min(dealt) - 1 < step:
            # rounds were dealt to this island for a step that committed before it
            # started (elastic: the quorum did not wait): train them from that step's
            # start, as dealt; the delta goes in late (carried, or rejected and the
            # rounds dealt again)
            step = min(dealt) - 1
        start = self.syncer.merged(step)
        if start is None:
            raise SyncError(f"outer step {step} is committed but its merged state is gone")
        self.backend.load_parameters(start)
        steps = 0
        while True:
            n = step + 1
            if self._superseded(n):  # its rounds of n went to others: n's delta cannot count
                start = self.syncer.merged(n)
                if start is None:
                    raise SyncError(f"outer step {n} is committed but its merged state is gone")
                self._emit("island_skipped", outer_step=n, reason="rounds dealt again")
                self.backend.load_parameters(start)
                step = n
                continue
            horizon = self._train_horizon(n)
            if horizon is None:  # the head asks for a cut
                return self._cut(step, steps)
            dealt_by_n = any(d.outer_step <= n for d in self.mine.values())
            if self.island not in horizon.deals and not self.member and not dealt_by_n:
                # not on the roster yet (a joiner: its first rounds, if any are dealt
                # yet, are of a later step): follow step n without training
                start = self._wait_committed(n)
                self.backend.load_parameters(start)
                step = n
                continue
            self.member = True
            listed = [tuple(d) for d in horizon.deals.get(self.island, [])]
            if not listed and horizon.stop:  # closed short for a stop, without this island
                start = self._wait_committed(n)
                self.backend.load_parameters(start)
                step = n
                continue
            if not listed:
                self._emit("island_left", outer_step=n, reason="no rounds in the horizon")
                return steps
            now = self.backend.parameters()
            delta = {k: np.asarray(now[k]) - np.asarray(start[k]) for k in start}
            submit_ts = self._clock()
            sub = self.syncer.submit(self.island, n, delta, submit_ts=submit_ts)
            self._emit(
                "delta_submitted",
                outer_step=n,
                rounds=len(listed),
                stored=sub.stored,
                reason=sub.reason,
                bytes=sub.nbytes,
            )
            start, _timing = wait_merged(
                self.syncer,
                self.island,
                n,
                submit_ts=submit_ts,
                timeout_s=self.timeout_s,
                poll_s=self.poll_s,
                clock=self._clock,
                sleep=self._sleep,
                events=_Emitter(self._emit),
            )
            self.backend.load_parameters(start)
            step, steps = n, steps + 1
            # after a final horizon too: a rejected delta's rounds may be dealt again; the
            # island stops at the horizon that gives it nothing

    def _cut(self, step: int, steps: int) -> int:
        """The head asked for a cut: save this island's state at ``step`` (when it stands
        at the step the head named) and stop."""
        asked = self._stop_at()
        if asked != step or self._on_cut is None:
            self._emit("island_left", outer_step=step + 1, reason=f"pool stop at {asked}")
            return steps
        cut_id = self._on_cut(step)
        self._emit("island_cut", outer_step=step, cut_id=cut_id, rounds=self.rounds)
        return steps

    def _train_horizon(self, n: int) -> Any:
        """Train this island's deals of step ``n`` until its horizon is closed and every
        round it lists for this island is trained; the horizon (None: the head asks for a
        cut at step ``n - 1``, with nothing dealt for ``n``)."""
        waited_since = self._clock()
        while True:
            self._read_deals()
            todo = sorted(
                k for k, d in self.mine.items() if d.outer_step == n and k not in self.trained
            )
            for key in todo:
                self._train(self.mine[key])
                waited_since = self._clock()
            horizon = read_horizon(self.store, n)
            if horizon is not None:
                listed = [tuple(d) for d in horizon.deals.get(self.island, [])]
                if all(k in self.trained for k in listed):
                    return horizon
            if not todo:
                asked = self._stop_at()
                if asked is not None and asked < n:
                    return None
                if self._clock() - waited_since > self.timeout_s:
                    raise SyncError(
                        f"trainer island {self.island!r} got no round and no closed horizon "
                        f"for outer step {n} in {self.timeout_s:g} s: is the head running?"
                    )
                self._sleep(self.poll_s)

    def _wait_committed(self, n: int) -> Any:
        """The merged parameters of step ``n`` once it commits (an island not on its roster)."""
        since = self._clock()
        while True:
            merged = self.syncer.merged(n)
            if merged is not None:
                self._emit("island_followed", outer_step=n)
                return merged
            if self._clock() - since > self.timeout_s:
                raise SyncError(
                    f"trainer island {self.island!r} waited {self.timeout_s:g} s for outer "
                    f"step {n} to commit before joining: is the head running?"
                )
            self._sleep(self.poll_s)

    def _superseded(self, n: int) -> bool:
        """Every round dealt to this island for step ``n`` was dealt again since, to it or
        another island (the head gave them back: ``elastic`` expired them, the island being
        late beyond ``max_carry_age``), and ``n`` is committed: the island skips ``n``
        instead of training a delta that cannot merge, and so catches up with the open step."""
        self._read_deals()
        keys = [k for k, d in self.mine.items() if d.outer_step == n]
        return (
            bool(keys)
            and all(self._gens.get(deal, gen) > gen for deal, gen in keys)
            and self.syncer.committed_step() >= n
        )

    def _read_deals(self) -> None:
        for d in self.feed.new():
            self._gens[d.deal] = max(self._gens.get(d.deal, d.gen), d.gen)
            if d.island == self.island:
                self.mine[(d.deal, d.gen)] = d

    def _train(self, deal: Deal) -> None:
        if any(p not in self._entries for p in deal.round.positions):
            self._entries = {int(e.position): e for e in self.buffer.entries(0)}
        batch = rebuild_batch(self.buffer, deal.round, self._entries)
        metrics = self.backend.train_round(batch)
        self.trained.add((deal.deal, deal.gen))
        self.rounds += 1
        self._emit(
            "island_round",
            deal=deal.deal,
            gen=deal.gen,
            outer_step=deal.outer_step,
            positions=list(deal.round.positions),
            rewards=[group_reward(g) for g in batch.groups],
            metrics={k: float(v) for k, v in metrics.items()},
        )


class _Emitter:
    """``emit(kind, **data)`` as the ``events`` of :func:`wait_merged`."""

    def __init__(self, emit: Callable[..., None]) -> None:
        self.emit = emit
