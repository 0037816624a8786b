"""``DriverLifecycle``: the trainer in this process (see :mod:`yeto_core.trainer.lifecycle`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional, Union

import attrs

from yeto_core.buffer.batch_reader import SKIP_REASONS, BatchReader, EndOfData
from yeto_core.buffer.ledger import BatchLedger
from yeto_core.errors import YetoError
from yeto_core.ports import (
    LifecycleContext,
    TrainerBackend,
    TrainerLifecycle,
)
from yeto_core.ports.store import SleepWatch
from yeto_core.records import (
    ConsistentCut,
    Event,
    LifecycleState,
    RoundSpec,
    StopReason,
)
from yeto_core.release.store import ReleaseStore
from yeto_core.stage_profile import PROFILE, stage
from yeto_core.trainer.cut import CutStore
from yeto_core.trainer.lifecycle.pipeline import DriverPipeline
from yeto_core.trainer.lifecycle.publish import DriverPublishing
from yeto_core.trainer.lifecycle.skip_rounds import DriverSkipRounds
from yeto_core.trainer.lifecycle.states import (
    LEAVE_CODES,
    TRANSITIONS,
    StateMachine,
    TrainerCounters,
    TrainerFailedError,
)

S = LifecycleState

#: how often a train command that waits for a round's groups looks again, at most (the
#: buffer's watch wakes it sooner where the store notifies)
ROUND_POLL_S = 0.05

#: the critical path a train command's thread is on outside the optimizer step
#: (:meth:`~yeto_core.stage_profile.StageProfile.path`): the store requests a measuring
#: store counts there are those the next optimizer step waits on
CRITICAL_PATH = "trainer"
#: the path of that thread while it waits for the samplers: the data-end checks and waits
#: after a take that found too few groups, and the takes that follow one (the step then
#: waits for groups to be appended, not for the store)
WAIT_PATH = "trainer_wait"


class DriverLifecycle(DriverPipeline, DriverPublishing, DriverSkipRounds, TrainerLifecycle):
    """The trainer in this process (see the module docstring).

    :param backend_factory: builds a fresh backend per incarnation (``factory(incarnation)``).
    :param buffer: the sample buffer (``select``/``load``/``commit``/``reset_to``).
    :param cuts: where cuts go and come from.
    :param releases: where a release is published after every trained round (None: none).
    :param groups_per_round: whole groups per round.
    :param max_policy_age: the hard policy-age limit ``A_hard`` (older groups are stale).
    :param emit: receives every lifecycle event.
    :param clock: seconds (start time measurement, event stamps).
    :param workdir: local scratch directory for cut and release files.
    :param partial_last_round: after the buffer's data ended, train a short last round
        (padded by the reader) instead of holding.
    :param group_size: G, samples per group (None: the first group the buffer offers
        decides, once; give it when known).
    :param vocab_size: the reader refuses token ids at or above it (None: the backend's
        :meth:`~yeto_core.ports.TrainerBackend.model_facts` say, with its routed-expert
        shape; every incarnation's reader checks its groups against its backend's facts).
    :param ledger: the batch ledger (None: ``BatchLedger(cuts.store)``, the run's store).
    :param ledger_set_aside_before: on a start from the base (no cut), move ledger rounds
        recorded before this time (seconds since the epoch) to ``ledger.before-<ts>/``
        (:meth:`BatchLedger.start_from_base`). None: rounds of dead incarnations that
        never reached a cut are set aside by :meth:`BatchLedger.rebase` to round 0.
    :param reader_options: extra :class:`~yeto_core.buffer.batch_reader.BatchReader` keyword
        arguments (``fenced_incarnations``, ``quarantined``, ``expected_layers``, ...).
    :param start_submitted_unix: when the provider submitted this incarnation's launch
        (``YETO_START_SUBMITTED_UNIX``, on ``clock``'s scale: seconds since the epoch).
        The next start's ``start_s`` (S1's ``T_s``) is measured from it, so provisioning,
        image pull and imports count; without it (or when it lies ahead of ``clock``) from
        the ``start`` call, and ``trainer_start_summary`` says why in ``start_note``.

    :param overlap_uploads: a round's release upload runs on an upload thread while the
        next round trains (:mod:`~yeto_core.trainer.lifecycle.publish`).
    :param overlap_commits: a round's ledger record and buffer commit run on a commit
        thread after the next round is taken, its upload after that commit
        (:mod:`~yeto_core.trainer.lifecycle.pipeline`; implies ``overlap_uploads``): the
        round's thread makes no store request between two optimizer steps when the
        buffer read the next round ahead. A trainer island's driver does both.

    Every round is taken by a :class:`~yeto_core.buffer.batch_reader.BatchReader` built per
    incarnation (``try_take``: a round is trained only when it is full, or short after the
    data ended with ``partial_last_round``), trained, recorded in the ledger, committed to
    the buffer and published. The ``trainer_round`` event carries the trained positions,
    the skipped positions by reason (``skipped``) and their counts (``skipped_counts``).
    """

    PLUGIN_NAME = "driver"

    @classmethod
    def create(cls, context: LifecycleContext) -> TrainerLifecycle:
        """The trainer inside the head's process (``[trainer] lifecycle = "driver"``)."""
        return context.build_driver()

    def __init__(
        self,
        backend_factory: Callable[[int], TrainerBackend],
        buffer: Any,
        cuts: CutStore,
        releases: Optional[ReleaseStore] = None,
        *,
        groups_per_round: int = 4,
        max_policy_age: int = 2,
        emit: Optional[Callable[[Event], None]] = None,
        clock: Callable[[], float] = time.time,
        workdir: Optional[Union[str, os.PathLike[str]]] = None,
        partial_last_round: bool = False,
        group_size: Optional[int] = None,
        vocab_size: Optional[int] = None,
        ledger: Optional[BatchLedger] = None,
        ledger_set_aside_before: Optional[float] = None,
        reader_options: Optional[Mapping[str, Any]] = None,
        overlap_uploads: bool = False,
        overlap_commits: bool = False,
        publish_every: int = 1,
        start_submitted_unix: Optional[float] = None,
    ) -> None:
        self.backend_factory = backend_factory
        self.buffer = buffer
        self.cuts = cuts
        self.releases = releases
        self.groups_per_round = groups_per_round
        self.max_policy_age = max_policy_age
        self._emit = emit or (lambda e: None)
        self._clock = clock
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="yeto-trainer-"))
        self.partial_last_round = partial_last_round
        self.group_size = group_size
        self.vocab_size = vocab_size
        self.ledger = ledger if ledger is not None else BatchLedger(cuts.store, clock=clock)
        self.ledger_set_aside_before = ledger_set_aside_before
        self.reader_options = dict(reader_options or {})
        self.reader: Optional[BatchReader] = None
        #: committed skip totals by reason (restored from the cut's counters)
        self.skipped_by_reason: dict[str, int] = {r: 0 for r in SKIP_REASONS}
        #: ledger keys moved aside by the last start
        self.ledger_set_aside: list[str] = []
        self.sm = StateMachine("trainer lifecycle 'driver'")
        self.backend: Optional[TrainerBackend] = None
        self.incarnation: Optional[int] = None
        self.counters = TrainerCounters()
        self.restored_cut: Optional[ConsistentCut] = None
        self.last_cut: Optional[ConsistentCut] = None
        self._start_seconds: Optional[float] = None
        #: the submission time of the next start (one start only: a later one in this
        #: process was not submitted then)
        self.start_submitted_unix = start_submitted_unix
        #: a round's ledger record and buffer commit on a commit thread, after the next
        #: round is taken (:mod:`~yeto_core.trainer.lifecycle.pipeline`); implies
        #: ``overlap_uploads``
        self.overlap_commits = bool(overlap_commits)
        #: overlap each round's release upload with the next round (see :meth:`_publish`)
        self.overlap_uploads = bool(overlap_uploads) or self.overlap_commits
        self._uploader: Any = None
        self._upload_pending: Any = None
        if (
            isinstance(publish_every, bool)
            or not isinstance(publish_every, int)
            or publish_every < 1
        ):
            raise ValueError(f"publish_every must be an integer >= 1, got {publish_every!r}")
        #: publish a release after every ``publish_every``-th trained round (counted over
        #: the run: ``trained_rounds``), and after the last round of every ``train`` call
        self.publish_every = publish_every
        #: the policy version of the last release this driver exported (None: none yet)
        self._released_version: Optional[int] = None
        #: rounds the backend refused for a non-finite loss or gradient norm, in a row
        self.nonfinite_in_a_row = 0
        #: the last ``_train_one`` found too few groups (a command with ``for_s`` waits)
        self._waiting_for_groups = False
        self._arrivals: Any = None  # the buffer's watch while a command waits for groups

    # -- helpers ------------------------------------------------------------------------

    def _event(self, kind: str, **data: Any) -> None:
        self._emit(
            Event(kind=kind, time=self._clock(), source=f"trainer-{self.incarnation}", data=data)
        )

    def _fail(self, exc: BaseException, during: str) -> None:
        if S.FAILED in TRANSITIONS[self.sm.state]:
            self.sm.go(S.FAILED, "fail")
        self._event(
            "trainer_failed",
            during=during,
            error=f"{type(exc).__name__}: {exc}",
            code=LEAVE_CODES[None],
        )

    def _scratch(self, name: str) -> Path:
        d = self.workdir / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    # -- port ---------------------------------------------------------------------------

    def state(self) -> LifecycleState:
        return self.sm.state

    @property
    def start_seconds(self) -> Optional[float]:
        return self._start_seconds

    def report(self) -> Mapping[str, Any]:
        return attrs.asdict(self.counters)

    def start(self, incarnation: int, cut: Optional[Union[ConsistentCut, str]] = None) -> None:
        """JOIN, build a fresh backend, restore the newest valid cut, reset the buffer.

        :param cut: None restores the newest valid cut in the store (the base when there
            is none); a cut or cut id restores exactly that one.
        """
        self.sm.go(S.STARTING, "start")
        t0 = self._clock()
        self._start_seconds = None  # this incarnation's, once it started
        self.incarnation = incarnation
        self._event("trainer_join", incarnation=incarnation)
        try:
            with stage("trainer.start.backend"):
                self.backend = self.backend_factory(incarnation)
            with stage("trainer.start.find_cut"):
                found = self._find_cut(cut)
            if found is None:
                self.backend.restore(None)
                self.counters = TrainerCounters()
                self.skipped_by_reason = {r: 0 for r in SKIP_REASONS}
                self.restored_cut = None
            else:
                rec, path = found
                with stage("trainer.start.restore"):
                    self.backend.restore(path)
                self.counters = TrainerCounters(
                    policy_version=rec.policy_version,
                    trained_rounds=rec.trained_rounds,
                    buffer_watermark=rec.buffer_watermark,
                    stale_groups=int(rec.counters.get("stale_groups", 0)),
                    trained_groups=int(rec.counters.get("trained_groups", 0)),
                    skipped_groups=int(rec.counters.get("skipped_groups", 0)),
                )
                self.skipped_by_reason = {
                    r: int(rec.counters.get(f"skipped_{r}", 0)) for r in SKIP_REASONS
                }
                self.restored_cut = rec
            with stage("trainer.start.buffer_reset"):
                self.buffer.reset_to(self.counters.buffer_watermark)
            with stage("trainer.start.ledger"):
                self._rebase_ledger(incarnation)
            self.reader = None
            self._make_reader()
            # The samplers need the policy the trainer now holds: after a fresh start that
            # is the base (the first release), after a restore a republish is a no-op, and
            # after a rewind it is a new release.
            with stage("trainer.start.publish"):
                self._publish()
        except Exception as exc:
            self._fail(exc, "start")
            raise TrainerFailedError(
                f"trainer incarnation {incarnation} failed to start: {exc}"
            ) from exc
        measured = self._measure_start(t0)
        self._start_seconds = measured["start_s"]
        self.sm.go(S.READY, "finish start")
        self._event(
            "trainer_start_summary",
            incarnation=incarnation,
            **measured,
            cut_id=self.restored_cut.cut_id if self.restored_cut else None,
            ledger_set_aside=len(self.ledger_set_aside),
            **attrs.asdict(self.counters),
        )

    def _measure_start(self, t0: float) -> dict[str, Any]:
        """``start_s`` from the submission stamp when there is a usable one, else from
        ``t0`` (the ``start`` call), with how it was measured."""
        now = self._clock()
        submitted, self.start_submitted_unix = self.start_submitted_unix, None
        out: dict[str, Any] = {
            "start_s": now - t0,
            "start_measured_from": "trainer_start",
            "start_submitted_unix": submitted,
            "start_in_process_s": now - t0,
        }
        if submitted is None:
            out["start_note"] = (
                "no YETO_START_SUBMITTED_UNIX for this start (a trainer in the head's "
                "process, or a provider that does not stamp its launches): measured from "
                "the trainer's start call, without provisioning, image pull and imports"
            )
        elif submitted > now:
            out["start_note"] = (
                f"YETO_START_SUBMITTED_UNIX is {submitted - now:.1f} s ahead of this host's "
                "clock (the head's and this host's clocks disagree): measured from the "
                "trainer's start call instead"
            )
        else:
            out["start_s"] = now - submitted
            out["start_measured_from"] = "submission"
        return out

    def _rebase_ledger(self, incarnation: int) -> None:
        rec = self.restored_cut
        if rec is None and self.ledger_set_aside_before is not None:
            self.ledger_set_aside = self.ledger.start_from_base(
                set_aside_before=self.ledger_set_aside_before, incarnation=incarnation
            )
            return
        self.ledger_set_aside = self.ledger.rebase(
            trained_rounds=self.counters.trained_rounds,
            cut_id=rec.cut_id if rec else None,
            watermark=self.counters.buffer_watermark,
            incarnation=incarnation,
        )

    def _make_reader(self) -> Optional[BatchReader]:
        """The reader of this incarnation (None while G is unknown and the buffer is empty)."""
        if self.reader is not None:
            return self.reader
        g = self.group_size
        if g is None:
            # G from the first group the buffer offers after the watermark
            rnd = self.buffer.select(RoundSpec(1, 0, 2**31))
            if not rnd.entries:
                return None
            g = int(rnd.entries[0].n_samples)
        # what the loaded model accepts (a malformed group is left out, never trained);
        # the driver's own vocab_size and reader_options win over the backend's facts
        options = self.backend.model_facts().reader_options() if self.backend else {}
        if self.vocab_size is not None:
            options["vocab_size"] = self.vocab_size
        options.update(self.reader_options)
        options.setdefault("clock", self._clock)
        self.reader = BatchReader(
            self.buffer,
            group_size=g,
            groups_per_round=self.groups_per_round,
            max_policy_age=self.max_policy_age,
            **options,
        )
        return self.reader

    def _find_cut(
        self, cut: Optional[Union[ConsistentCut, str]]
    ) -> Optional[tuple[ConsistentCut, Path]]:
        dest = self._scratch("restore")
        if cut is None:
            return self.cuts.latest_valid(dest)
        from yeto_core.stores.manifest import download_verified

        cut_id = cut if isinstance(cut, str) else cut.cut_id
        rec = self.cuts.read_manifest(cut_id)
        problems = download_verified(
            self.cuts.store, f"{self.cuts.prefix}/{cut_id}", rec.files, dest / cut_id
        )
        if problems:
            raise YetoError(f"cut {cut_id} fails its digest check: {'; '.join(problems)}")
        return rec, dest / cut_id

    def train(self, rounds: int, for_s: Optional[float] = None) -> int:
        """Train up to ``rounds`` whole rounds; stop early (holding) when no full round waits
        and, with ``for_s``, after the round that ends ``for_s`` seconds after the call.

        With ``for_s``, a command that finds no full round (the samplers have not appended
        it yet) waits for one while its ``for_s`` lasts, woken by the buffer's watch (or
        polling every :data:`ROUND_POLL_S`), instead of handing the turn back to the head:
        the head's turn costs its tick and the command's round trips; a wait costs one
        select per wake-up. It does not wait at the data end.

        With ``overlap_uploads`` the last round's upload goes on after this returns (over
        the head's turn), with ``overlap_commits`` its ledger record and commit too; the
        next publish, ``train`` or ``drain`` waits for them and fails if one failed
        (``train`` before it trains anything).
        """
        self.sm.go(S.TRAINING, "train")
        with PROFILE.path(CRITICAL_PATH):
            done = self._train_command(rounds, for_s)
        self.sm.go(S.READY, "hold")
        return done

    def _train_command(self, rounds: int, for_s: Optional[float]) -> int:
        done = 0
        try:
            pending = self._upload_pending
            if pending is not None and pending.done():
                self._wait_upload()  # the previous command's last upload failed: fail now
            self._failed_write()  # likewise its last commit
            try:
                began = time.monotonic()
                while done < rounds:
                    if not self._train_one():
                        left = None if for_s is None else for_s - (time.monotonic() - began)
                        if not self._waiting_for_groups or left is None or left <= 0:
                            break
                        with PROFILE.path(WAIT_PATH):
                            if self.buffer.data_ended():  # no round is coming
                                break
                            self._wait_for_groups(min(left, ROUND_POLL_S))
                        continue
                    done += 1
                    if for_s is not None and time.monotonic() - began >= for_s:
                        break
                if self._released_version != self.counters.policy_version:
                    # the newest version is released before the hold
                    with stage("trainer.publish"):
                        self._publish(overlap=self.overlap_uploads)
                self._hand_over()  # the last round's writes go on over the head's turn
            except BaseException:
                self._drop_held("the train command failed")  # trained again from the cut
                with contextlib.suppress(Exception):  # (this error is the one to raise)
                    self._wait_upload()
                raise
        except Exception as exc:
            self._fail(exc, "train")
            raise TrainerFailedError(
                f"trainer incarnation {self.incarnation} failed in a round: {exc}"
            ) from exc
        return done

    def _wait_for_groups(self, seconds: float) -> None:
        """At most ``seconds``, less when the buffer's watch sees a change."""
        if self._arrivals is None:
            self._arrivals = self.buffer.watch() or SleepWatch()
        with stage("trainer.wait_round"):
            self._arrivals.wait(seconds)

    def _close_arrivals(self) -> None:
        watch, self._arrivals = self._arrivals, None
        if watch is not None:
            watch.close()

    def _train_one(self) -> bool:
        """Train one round. False: none was trained (``_waiting_for_groups`` says whether
        because too few groups wait yet, as opposed to the data end or a held round)."""
        assert self.backend is not None and self.incarnation is not None
        waited, self._waiting_for_groups = self._waiting_for_groups, False
        reader = self._make_reader()
        if reader is None:
            self._waiting_for_groups = True  # nothing appended yet
            return False
        c = self.counters
        self._settle()  # the commit handed over last landed: a take never overlaps one
        try:
            # short at the data end only: the reader looks at the data end itself when
            # the round is short (no store request a round for it here)
            with stage("trainer.take"), PROFILE.path(WAIT_PATH if waited else CRITICAL_PATH):
                batch = reader.try_take(c.policy_version)
        except EndOfData:
            self._flush_writes()
            self._commit_skips_at_data_end(reader)
            return False
        self._hand_over()  # the previous round's writes, now that this one is taken
        if batch is None:
            self._waiting_for_groups = True
            return False
        if len(batch.groups) < self.groups_per_round and not self.partial_last_round:
            self._flush_writes()
            reader.reset()  # a short round at the data end: hold; the buffer re-offers it
            return False
        # while this round trains (remote stores): the index records appended since and
        # the next round's payloads are read, and the ledger's tail listed
        self.buffer.prefetch(batch.watermark, self.groups_per_round)
        if not self.overlap_commits:  # else the commit thread lists it after a record
            self.ledger.look_ahead()
        with stage("trainer.train"), PROFILE.path(None):  # the step itself is off the path
            metrics = self.backend.train_round(batch)
        if float(metrics.get("nonfinite", 0.0)) > 0:
            self._flush_writes()
            self._refuse_round(reader, batch, metrics)
            return True
        self.nonfinite_in_a_row = 0
        if self.overlap_commits:
            self._hold_round(reader, batch, c.trained_rounds + 1)
            watermark = int(batch.watermark)
        else:
            with stage("trainer.ledger"):
                self.ledger.record(
                    batch,
                    seq=c.trained_rounds + 1,
                    incarnation=self.incarnation,
                    parent_cut=self.restored_cut.cut_id if self.restored_cut else None,
                )
            with stage("trainer.commit"):
                watermark = reader.commit(batch)
        skipped = {r: list(ps) for r, ps in sorted(batch.skipped.items()) if ps}
        counts = {r: len(ps) for r, ps in skipped.items()}
        for r, n in counts.items():
            self.skipped_by_reason[r] = self.skipped_by_reason.get(r, 0) + n
        self.counters = TrainerCounters(
            policy_version=c.policy_version + 1,
            trained_rounds=c.trained_rounds + 1,
            buffer_watermark=watermark,
            stale_groups=c.stale_groups + counts.get("stale", 0),
            trained_groups=c.trained_groups + len(batch.groups),
            skipped_groups=c.skipped_groups + sum(counts.values()),
        )
        published = self.counters.trained_rounds % self.publish_every == 0
        if published:
            with stage("trainer.publish"):
                self._publish(overlap=self.overlap_uploads)
        PROFILE.count("trainer.rounds")
        with stage("trainer.round_event"):
            self._event(
                "trainer_round",
                positions=list(batch.positions),
                stale_positions=skipped.get("stale", []),
                skipped=skipped,
                skipped_counts=counts,
                padded_samples=len(batch.padding),
                watermark_before=batch.watermark_before,
                published=published,
                metrics={k: float(v) for k, v in metrics.items()},
                **attrs.asdict(self.counters),
            )
        return True

    def drain(self, reason: StopReason) -> ConsistentCut:
        """At a round boundary: cut with ``reason.trigger``, commit it, LEAVE."""
        self.sm.go(S.DRAINING, f"drain ({reason.value})")
        assert self.backend is not None and self.incarnation is not None
        try:
            self._flush_writes()  # the cut holds every committed round, and only those
            out = self._scratch("cut")
            with stage("trainer.cut.save"):
                self.backend.save_cut(out, reason.trigger)
            c = self.counters
            record = ConsistentCut(
                trigger=reason.trigger,
                policy_version=c.policy_version,
                trained_rounds=c.trained_rounds,
                buffer_watermark=c.buffer_watermark,
                incarnation=self.incarnation,
                parent_cut=self.restored_cut.cut_id if self.restored_cut else None,
                counters={
                    "stale_groups": c.stale_groups,
                    "trained_groups": c.trained_groups,
                    "skipped_groups": c.skipped_groups,
                    **{f"skipped_{r}": n for r, n in self.skipped_by_reason.items()},
                },
            )
            with stage("trainer.cut.commit"):
                self.last_cut = self.cuts.commit(out, record)
        except Exception as exc:
            self._fail(exc, "drain")
            raise TrainerFailedError(
                f"trainer incarnation {self.incarnation} failed to cut: {exc}"
            ) from exc
        self.sm.go(S.LEFT, "leave")
        self._event(
            "trainer_leave",
            code=LEAVE_CODES[reason],
            reason=reason.value,
            cut_id=self.last_cut.cut_id,
        )
        return self.last_cut

    def release(self) -> None:
        """Drop the backend (LEFT or FAILED → STOPPED)."""
        self.sm.go(S.STOPPED, "release")
        self._close_arrivals()
        self._close_pipeline()
        if self._uploader is not None:
            self._uploader.shutdown(wait=True)
            self._uploader, self._upload_pending = None, None
        self.backend = None
        self.reader = None
        shutil.rmtree(self.workdir / "restore", ignore_errors=True)
