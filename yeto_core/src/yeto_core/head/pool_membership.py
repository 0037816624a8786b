"""Elastic membership of the head's trainer pool: replacements, joins and S1's scaling.

A part of :class:`~yeto_core.head.trainer_pool.TrainerPool` (docs/sync.md, "Departures
and joins"):

- **Replacement.** An island whose process ended (``leave``, reason ``exited``) is
  replaced by a new island, ``<trainer name>-<k>`` with the next unused ``k``
  (``launched`` with reason ``replace`` and ``replaces``). A start fails when the
  island's process ends, or ``[trainer] ready_timeout_s`` passes, before it joined, or
  when it leaves before any delta of it merged; after ``max_failures`` failed starts in
  a row (the trainer's restart rule, 3) nothing is replaced any more
  (``no_replacement``), and once no island is left or starting the head gives up
  (exit 8). A merged delta of a joined island resets the count. Nothing is replaced
  once every round is dealt and other islands are left to train them.
- **Joining.** A launched island creates its ready record once its backend is restored
  (:mod:`yeto_core.sync.members`); at the next horizon boundary (the open outer step's
  horizon not closed and no round dealt for it to the roster yet) the head adds it to
  the syncer's roster (``join``, journaled with its reason and the outer step) and the
  dealer deals it rounds of that step. It trains from the newest committed merged
  parameters; the outer optimizer's state stays with the coordinator.
- **Scaling** (:mod:`yeto_core.trainer.s1_islands`). At each committed outer step,
  when ``[sync] min_islands < max_islands`` and the scheduler is not ``always-on``, S1's
  rule adds an island (``launched`` with reason ``backlog``) or lets one leave
  (``scaled_down``: a starting one first, else the newest one holding no round not
  merged yet). Every decision that changes the pool, or a hold for another reason than
  the last journaled one, is journaled as ``scale`` with the rule's inputs.
- An island off the roster whose process ended is released (its cost stops).
"""

from __future__ import annotations

from typing import Any, Optional

import attrs

from yeto_core.records import IslandStatus
from yeto_core.sync.members import is_ready
from yeto_core.trainer.s1_islands import ADD, REMOVE, PoolScaleInputs, s1_scale_islands

_ENDED = (IslandStatus.EXITED, IslandStatus.GONE, IslandStatus.LOST)
#: why an island left or failed to join: its provider lost it (an eviction), or its process
#: ended (any other end the provider reports)
LOST, EXITED = IslandStatus.LOST.value, IslandStatus.EXITED.value


def ended_reason(status: IslandStatus) -> str:
    """The reason an island that ended with ``status`` left for."""
    return LOST if status == IslandStatus.LOST else EXITED


@attrs.define
class _Starting:
    reason: str
    launched_at: float
    data: dict[str, Any] = attrs.field(factory=dict)


class PoolMembership:
    """Replacements, joins and scaling of one :class:`TrainerPool` (the module docstring)."""

    def __init__(self, pool: Any, *, max_failures: int, ready_timeout_s: float) -> None:
        self.pool = pool
        config = pool.head.config
        self.prefix = config.trainer.name
        self.next_index = len(pool.names)
        self.max_failures = int(max_failures)
        self.ready_timeout_s = float(ready_timeout_s)
        #: launched, not on the roster yet
        self.pending: dict[str, _Starting] = {}
        #: failed starts in a row
        self.failures = 0
        self.joined: set[str] = set()
        self.merged_once: set[str] = set()
        self.min_islands, self.max_islands = config.sync.bounds(config.trainer.islands)
        self.scaling = self.min_islands < self.max_islands and config.scheduler.name != "always-on"
        #: decoupled: no island joins a running pool (no replacement, no scaling)
        self.decoupled = config.sync.preset == "decoupled"
        self._last_scale: Optional[str] = None
        #: the head stopped the pool: nothing is launched any more
        self.closed = False

    # -- events of the pool --------------------------------------------------------------

    def on_step(self, step: Any) -> None:
        """A committed outer step: who merged (failed starts), then S1's scaling."""
        for island, _origin, _weight in step.merged:
            self.merged_once.add(island)
            if island in self.joined:
                self.failures = 0
        if self.scaling and not self.closed:
            self.scale()

    def left(self, island: str, reason: str) -> None:
        """``island`` left the roster because its process ended (``exited``) or its provider
        lost it (``lost``: evicted, its lease expired): replace it. An exit before its first
        merged delta counts as a failed start; a loss is the provider's, never counted."""
        if island not in self.merged_once and reason != LOST:
            self.failures += 1
        self.replace(island, reason)

    def stopped(self) -> None:
        """The head stops the pool (it releases every handle): no join, no launch."""
        self.closed = True
        self.pending.clear()

    def replace(self, island: str, reason: str) -> None:
        pool = self.pool
        d = pool.dealer
        if self.closed or pool.finished is not None or d.done or (d.exhausted and pool.roster):
            return
        if self.decoupled:  # joining a running decoupled run is not built (docs/sync.md)
            pool._log("no_replacement", island=island, reason="decoupled")
            return
        if self.failures >= self.max_failures:
            pool._log(
                "no_replacement",
                island=island,
                failures=self.failures,
                max_failures=self.max_failures,
            )
            return
        self.launch("replace", replaces=island, after=reason)

    def launch(self, reason: str, **data: Any) -> str:
        """Launch a new trainer island (``<trainer name>-<k>``); it joins once ready."""
        pool = self.pool
        name = f"{self.prefix}-{self.next_index}"
        self.next_index += 1
        # the pool's incarnation: its start and stop records are the island's (pool_cut)
        inc = pool.cuts.incarnation
        handle = pool.provider.launch(pool.head.launch_record("trainer", name, inc))
        pool.head.costs.started(name, handle)
        pool.handles[name] = handle
        self.pending[name] = _Starting(reason, pool.head.clock(), dict(data))
        pool._log("launched", island=name, handle=handle, reason=reason, **data)
        return name

    # -- each tick -----------------------------------------------------------------------

    def tick(self, open_step: int) -> None:
        """Starting islands: failed, timed out, or ready to join at a horizon boundary;
        departed islands whose process ended are released."""
        pool = self.pool
        for name, s in list(self.pending.items()):
            handle = pool.handles[name]
            status = pool.provider.status(handle)
            late = pool.head.clock() - s.launched_at > self.ready_timeout_s
            if status in _ENDED or late:
                del self.pending[name]
                why = ended_reason(status) if status in _ENDED else "ready_timeout"
                if why != LOST:  # evicted while it started: the provider's, not a failed start
                    self.failures += 1
                pool._log("join_failed", island=name, reason=why, failures=self.failures)
                self._release(name)
                self.replace(name, why)
            elif self._boundary(open_step) and is_ready(pool.store, name):
                del self.pending[name]
                pool.syncer.join(name)
                pool.roster.append(name)
                self.joined.add(name)
                pool._log("join", island=name, reason=s.reason, outer_step=open_step, **s.data)
        for island, handle in list(pool.handles.items()):
            if island in pool.roster or island in self.pending:
                continue
            if pool.provider.status(handle) in _ENDED:
                self._release(island)

    def _boundary(self, open_step: int) -> bool:
        """No round of ``open_step`` is dealt to the roster yet, and its horizon is open."""
        d = self.pool.dealer
        if open_step in d.closed:
            return False
        return not any(i in self.pool.roster for i in d.held(open_step))

    def _release(self, island: str) -> None:
        pool = self.pool
        handle = pool.handles.pop(island, None)
        if handle is None:
            return
        ok = pool.provider.release(handle)
        if ok and handle in pool.head.costs.open_handles():
            pool.head.costs.stopped(island, handle)
        pool._log("release", island=island, handle=handle, verified=bool(ok))

    # -- S1's scaling ----------------------------------------------------------------------

    def scale(self) -> None:
        pool = self.pool
        config = pool.head.config
        n = len(pool.roster) + len(self.pending)
        dealt = sum(1 for r in pool.dealer.rounds if not r.skips_only)
        gpr = config.trainer.groups_per_round
        waiting = max(0, int(pool.buffer.backlog().groups) // gpr - dealt)
        inputs = PoolScaleInputs(
            islands=n,
            waiting_rounds=waiting,
            local_steps=config.sync.local_steps,
            min_islands=self.min_islands,
            max_islands=self.max_islands,
            data_ended=bool(pool.buffer.data_ended()),
        )
        decision = s1_scale_islands(inputs)
        if decision.change == ADD and decision.reason == "backlog" and not self._budget_ok():
            decision = s1_scale_islands(attrs.evolve(inputs, budget_ok=False))
        if decision.change or decision.reason != self._last_scale:
            pool._log("scale", **decision.as_dict())
            self._last_scale = decision.reason
        if decision.change == ADD:
            self.launch(decision.reason)
        elif decision.change == REMOVE:
            self._scale_down()

    def _budget_ok(self) -> bool:
        head = self.pool.head
        guard = head.cost_guard
        if guard.budget <= 0:
            return True
        name = f"{self.prefix}-{self.next_index}"
        ok, _decision = guard.may_add_samplers([(name, float(head.config.trainer.price_per_hour))])
        return bool(ok)

    def _scale_down(self) -> None:
        pool = self.pool
        if self.pending:
            name = sorted(self.pending, key=_index)[-1]
            del self.pending[name]
            pool._log("join_cancelled", island=name, reason="scaled_down")
            self._release(name)
            return
        busy = {r.island for r in pool.dealer.rounds if r.committed_at is None}
        free = [i for i in pool.roster if i not in busy]
        if free:
            pool._leave(sorted(free, key=_index)[-1], "scaled_down")


def _index(island: str) -> int:
    tail = island.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1
