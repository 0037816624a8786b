"""Several trainer islands (``[trainer] islands > 1``): the head's :class:`TrainerPool`.

It stands where one trainer's :class:`~yeto_core.trainer.loop.TrainerLoop` stands in the
head (``tick``, ``stop``, ``finished``, ``state``, ``report``). At its start it builds
the policy's base on a backend of its own, starts the syncer's outer step 0 with the
roster ``<trainer name>-0 .. -<N-1>`` and launches those islands on the trainer's
provider. Each tick it polls the syncer (a committed outer step: the rounds its deltas
trained go into the ledger and the buffer's watermark, the merged parameters are
published as the release the samplers follow), takes an island that exited off the
roster (its uncommitted rounds are dealt again) and replaces it, lets islands that
started join, deals rounds for the open step and closes its horizon
(:class:`~yeto_core.sync.dealer.RoundDealer`). Replacements, joins and S1's scaling
are :class:`~yeto_core.head.pool_membership.PoolMembership`'s. Every outer step,
departure, join and the finish go to the journal ``head/pool/``.

The scheduler (S1) stops the islands when the pool stands idle longer than a start
costs, with a cut of the whole pool, and starts them again from it when enough waits; a
head that stops cuts the pool too, and the next head continues from that cut
(:mod:`yeto_core.head.pool_cut`; docs/sync.md, "Cuts of the trainer pool").
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.fences import StoreFences
from yeto_core.buffer.ledger import BatchLedger
from yeto_core.errors import YetoError
from yeto_core.events.stream import EventStream
from yeto_core.head.pool_cut import RUNNING, STOPPED, STOPPING, PoolCuts
from yeto_core.head.pool_membership import PoolMembership, ended_reason
from yeto_core.islands.common import open_run_buffer, release_store
from yeto_core.islands.trainer import group_reward, run_group_size
from yeto_core.ports.sync import OuterStep
from yeto_core.ports.trainer import backend_options
from yeto_core.records import IslandStatus, LifecycleState, ReleaseInfo, StopReason
from yeto_core.sampler import fingerprint
from yeto_core.sync.fragment_dealer import expiry_window, pool_dealer
from yeto_core.trainer.loop import Journal, TrainerLoopGaveUp

_ENDED = (IslandStatus.EXITED, IslandStatus.GONE, IslandStatus.LOST)


class TrainerPool:
    """The head's side of several trainer islands (the module docstring)."""

    def __init__(self, head: Any) -> None:
        self.head = head
        config = head.config
        t = config.trainer
        if t.lifecycle != "remote":
            raise YetoError(
                f"[trainer] islands = {t.islands} needs lifecycle = 'remote' (each island is "
                f"a process of the {t.provider!r} provider), not {t.lifecycle!r}"
            )
        self.names = config.trainer_islands()
        self.store = head.store
        self.journal = Journal(head.store, prefix="head/pool")
        self.provider = head.providers[t.provider]
        s = config.sync
        #: how many steps after their step a round's deltas may still merge (strict: none)
        self.carry_age = expiry_window(s.preset, s.max_carry_age, s.fragments)
        self.syncer = head.plugins.syncer(config.sync.syncer).open(
            head.store, config.sync.settings()
        )
        self.buffer = open_run_buffer(head.plugins, config, head.store, t.name)
        self.ledger = BatchLedger(head.store)
        self.measured_start_s: Optional[float] = None
        self.data_end_at: Optional[float] = None
        self.cuts = PoolCuts(self)
        resume = self.cuts.resume_point(self.journal.read())
        if resume is None:
            self.ledger.start_from_base(set_aside_before=head.state.started_at)
        self.releases = release_store(head.plugins, config, head.store)
        self.stream = EventStream(head.store, t.name, flush_s=0.0, observer=head.plugins.emit)
        self.workdir = Path(head.run_dir) / "work" / t.name
        self.dealer = pool_dealer(head.store, self._reader, self.ledger, s, emit=self.stream.emit)
        self._reader_obj: Optional[BatchReader] = None
        self.roster: list[str] = list(self.names)
        self.handles: dict[str, str] = {}
        self.finished: Optional[str] = None
        self.more_ready = False
        self.incarnation = 0
        self.policy_version = 0
        # what the cost guard reads of a trainer loop (the starts are the islands')
        self.config = self.cuts.config
        cls = head.plugins.trainer_backend(t.backend)
        self.backend = cls.from_config(
            backend_options(cls, config),
            model_dir=str(Path(config.model.path).absolute()),
            seed=config.seed,
        )
        self.backend.restore(None)
        self.members = PoolMembership(
            self, max_failures=self.config.max_failures, ready_timeout_s=t.ready_timeout_s
        )
        self.syncer.start(self.backend.parameters(), tuple(self.names))
        if resume is not None:  # an earlier head's pool, stopped with a cut
            self.cuts.resume(resume)
            self.backend.load_parameters(self.syncer.merged(resume.outer_step))
            return
        # the first launch waits for a backlog as one trainer's first start does
        self._log("start", roster=list(self.names), local_steps=config.sync.local_steps)
        self.cuts.phase = STOPPED

    # -- the loop's surface ------------------------------------------------------------

    def tick(self) -> None:
        if self.cuts.phase != RUNNING:  # stopping (with a cut) or stopped
            if self.cuts.phase == STOPPING:
                self.cuts.stopping_tick()
            else:
                self.cuts.stopped_tick()
            return
        step = self.syncer.poll()
        if step is not None:
            self._on_step(step)
        for island, handle in list(self.handles.items()):
            if island in self.roster:
                status = self.provider.status(handle)
                if status in _ENDED:  # the provider's eviction (lost) or the process's end
                    self._gone(island, ended_reason(status))
        open_step = self.syncer.committed_step() + 1
        ended = bool(self.buffer.data_ended())
        if ended and self.data_end_at is None:
            self.data_end_at = self.head.clock()
            self._log("data_end", data_end_at=self.data_end_at)
        expired = self.dealer.expire(open_step, self.carry_age)
        if expired:
            self._log("expired", outer_step=open_step, rounds=expired)
        self._late_at_data_end(open_step)
        self.members.tick(open_step)
        dealt = self.dealer.deal(open_step, self.roster, self.policy_version, ended)
        horizon = self.dealer.close(open_step, self.roster)
        if horizon is not None:
            for island, deals in horizon.deals.items():
                if not deals:  # it stops: the step is decided without it
                    self._leave(island, "finished")
        self._report_rounds()
        if self.dealer.done:
            self._finish("data_end")
        elif not self.roster and not self.members.pending:
            self._finish("gave_up")
            raise TrainerLoopGaveUp(
                "every trainer island left the roster before the data ended and none is "
                f"starting ({self.members.failures} failed starts in a row, max_failures = "
                f"{self.members.max_failures}; see the 'leave', 'join_failed' and "
                "'no_replacement' records in head/pool/ and the islands' logs); rounds not "
                "merged stay in the buffer"
            )
        else:
            self.cuts.running_tick(dealt)  # S1: stop an idle pool

    def stop(self, reason: StopReason = StopReason.FINISHED) -> None:
        """Stop the pool with a cut (the next head continues from it) and release every
        island. Without a cut (an island lost while stopping, ``answer_timeout_s``) the
        islands leave the roster and the pool cannot be continued. It does not finish the
        pool (a run stopped early is not finished)."""
        self.members.stopped()
        if self.finished is None and (self.handles or self.cuts.phase != RUNNING):
            if self.cuts.stop_now(reason):
                self.stream.flush()
                shutil.rmtree(self.workdir, ignore_errors=True)
                return
        why = f"head_stop_{reason.value.lower()}"  # e.g. head_stop_finished
        self.members.stopped()
        for island in list(self.roster):
            self._leave(island, why)
        for island, handle in list(self.handles.items()):
            ok = self.provider.release(handle)
            if ok and handle in self.head.costs.open_handles():
                self.head.costs.stopped(island, handle)
            self._log("release", island=island, handle=handle, verified=bool(ok))
            del self.handles[island]
        self.stream.flush()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def state(self) -> LifecycleState:
        return LifecycleState.TRAINING if self.handles else LifecycleState.STOPPED

    def report(self) -> dict[str, Any]:
        return {
            "policy_version": self.policy_version,
            "trained_rounds": self.dealer.trained_rounds,
            "trained_groups": self.dealer.trained_groups,
            "roster": list(self.roster),
        }

    # -- steps -------------------------------------------------------------------------

    def _reader(self) -> Optional[BatchReader]:
        if self._reader_obj is None:
            config = self.head.config
            g = run_group_size(config)
            if g is None:
                return None  # sampler groups of different sizes: not built for pools
            self._reader_obj = BatchReader(
                self.buffer,
                group_size=g,
                groups_per_round=config.trainer.groups_per_round,
                max_policy_age=config.trainer.max_policy_age,
                fenced_incarnations=StoreFences(self.store),
                **self.backend.model_facts().reader_options(),
            )
        return self._reader_obj

    def _on_step(self, step: OuterStep) -> None:
        written = self.dealer.on_step(step)
        for island in self.dealer.take_evicted():  # decoupled: docs/sync.md
            self._leave(island, "rejected")
        n = step.outer_step
        self.policy_version = n
        self._log(
            "outer_step",
            outer_step=n,
            merged=[list(m) for m in step.merged],
            rejected=[list(r) for r in step.rejected],
            rounds=[r.seq for r, _ in written],
        )
        merged = self.syncer.merged(n)
        if merged is None:
            raise YetoError(f"outer step {n} is committed but its merged state is gone")
        self.backend.load_parameters(merged)
        self._publish(n)
        self.members.on_step(step)

    def _report_rounds(self) -> None:
        """``round_trained`` on the trainer's stream for each round the ledger recorded."""
        n = self.policy_version
        for rec, batch in self.dealer.take_written():
            if rec.skips_only:
                skipped = {k: list(v) for k, v in rec.skipped.items()}
                self.stream.emit(
                    "round_trained", positions=[], rewards=[], skipped=skipped, policy_version=n
                )
                continue
            self.stream.emit(
                "round_trained",
                positions=list(rec.positions),
                rewards=[group_reward(g) for g in batch.groups],
                skipped={k: list(v) for k, v in rec.skipped.items()},
                policy_version=n,
                trained_rounds=rec.seq,
                island=rec.island,
                outer_step=rec.outer_step,
            )

    def _publish(self, version: int) -> None:
        """The merged parameters as release ``version``, with the fingerprint."""
        out = self.workdir / f"release-{version}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        info = ReleaseInfo.coerce(self.backend.publish_release(out)).as_dict()
        info["version"] = version
        info.setdefault("buffer_watermark", int(self.buffer.watermark))
        if fingerprint.INFO_KEY not in info:
            recorded = fingerprint.for_backend(self.backend)
            if recorded is not None:
                info[fingerprint.INFO_KEY] = recorded.to_json()
        rel = self.releases.publish(out, info, handoff=True)
        shutil.rmtree(out, ignore_errors=True)
        self.stream.emit(
            "release_published",
            version=rel.version,
            release_id=rel.release_id,
            **self.releases.last_publish,
        )

    def _late_at_data_end(self, open_step: int) -> None:
        """The data ended, every round is dealt and none is held for the open step, but an
        earlier step left rounds unmerged (``elastic``: a late delta waiting to be carried,
        which only a decision with a fresh delta carries). The late islands leave: their
        rounds are dealt again to the others (one late island stays when no other is
        left), whose fresh deltas decide the step."""
        d = self.dealer
        if not d.exhausted or d.redeal or open_step in d.closed or d.held(open_step):
            return
        late = sorted(
            {
                r.island
                for r in d.rounds
                if r.committed_at is None and not r.skips_only and r.island in self.roster
            }
        )
        if not late:
            return
        keep = [i for i in self.roster if i not in late] or late[:1]
        for island in late:
            if island not in keep:
                self._leave(island, "late_at_data_end")

    def _gone(self, island: str, reason: str) -> None:
        handle = self.handles.get(island)
        code = self.provider.returncode(handle) if handle is not None else None
        self._leave(island, reason, returncode=code)
        self.members.left(island, reason)

    def _leave(self, island: str, reason: str, **data: Any) -> None:
        if island not in self.roster:
            return
        self.roster.remove(island)
        self.syncer.leave(island, reason)
        back = self.dealer.island_gone(island)
        self._log("leave", island=island, reason=reason, rounds_given_back=back, **data)

    def _finish(self, reason: str) -> None:
        if self.finished is None:
            self.finished = reason
            self._log("finish", reason=reason)

    def _log(self, kind: str, **data: Any) -> None:
        self.journal.append({"kind": kind, "time": self.head.clock(), **data})
        self.stream.emit(f"pool_{kind}", **data)
