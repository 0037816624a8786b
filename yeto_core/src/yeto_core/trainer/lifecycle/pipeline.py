"""The driver's round pipeline: :class:`DriverPipeline`, a mixin of
:class:`~yeto_core.trainer.lifecycle.driver.DriverLifecycle`.

With ``overlap_commits`` a trained round's store writes leave the round's thread: its
ledger record and buffer commit go to a commit thread, its release upload to the
upload thread, while the next round is taken and trained. The order is kept:

- the next round is taken (from what the buffer read ahead while this round trained)
  *before* this round's commit is handed over, and a take first waits for the commit
  handed over before: a take and a commit never run at once (the reader takes a round
  ahead of an uncommitted one, :class:`~yeto_core.buffer.batch_reader.BatchReader`);
- round n's ledger record lands before its buffer commit, and round n's commit before
  round n + 1's (one thread, in order);
- round n's release files are uploaded at once, but its manifest and pointer, which
  make it visible, only after round n's commit landed (the upload thread waits for it
  there, :meth:`~yeto_core.release.store.ReleaseStore.publish`'s ``ready``): no release
  overtakes the commit of the round it was trained on;
- a cut (drain), a skip-only commit (a refused round, the data end) and a reset of the
  reader wait for every write handed over; a failed write fails the next round,
  command or drain, and the incarnation fails: the next one restores the newest cut,
  whose rounds are all committed (a cut waits for them), and trains the rounds after
  it again, as after any crash (the ledger sets their records aside).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

from yeto_core.buffer.batch_reader import commit_watermark
from yeto_core.errors import YetoError
from yeto_core.stage_profile import stage


class DriverPipeline:
    """A trained round's writes off the round's thread (the host holds the buffer, the
    ledger, the incarnation and the restored cut)."""

    #: a round's ledger record and buffer commit run on a commit thread (module doc)
    overlap_commits: bool = False
    _committer: Optional[ThreadPoolExecutor] = None
    #: the commit handed over last (None: none, or it was waited for)
    _commit_pending: Optional[Future[None]] = None
    #: the trained round whose writes wait for the next take: (reader, batch, its commit,
    #: the future its release's upload waits on)
    _held: Optional[tuple[Any, Any, Callable[[], None], Future[None]]] = None

    def _hold_round(self, reader: Any, batch: Any, seq: int) -> None:
        """Hold round ``seq``'s ledger record and buffer commit until :meth:`_hand_over`."""
        assert self.incarnation is not None
        incarnation = self.incarnation
        cut = self.restored_cut
        parent = cut.cut_id if cut else None
        landed: Future[None] = Future()

        def commit() -> None:
            try:
                ledger = self.ledger
                with stage("trainer.pipeline.ledger"):
                    ledger.record(batch, seq=seq, incarnation=incarnation, parent_cut=parent)
                ledger.look_ahead()  # the next record's listing, while the next round trains
                with stage("trainer.pipeline.commit"):
                    commit_watermark(self.buffer, batch)
            except BaseException as exc:
                landed.set_exception(exc)
                raise
            landed.set_result(None)

        self._held = (reader, batch, commit, landed)

    def _release_ready(self) -> Optional[Callable[[], None]]:
        """What the upload of this moment's release waits for before it becomes visible:
        the commit of the round held or handed over last (None: nothing pending)."""
        if self._held is not None:
            landed = self._held[3]
        elif self._commit_pending is not None:
            landed = self._commit_pending
        else:
            return None

        def ready() -> None:
            with stage("trainer.pipeline.wait_commit"):
                landed.result()  # its error stops the release (and fails the incarnation)

        return ready

    def _hand_over(self) -> None:
        """Start the held round's writes on the commit thread."""
        held, self._held = self._held, None
        if held is None:
            return
        reader, batch, commit, _landed = held
        reader.note_committed(batch)  # the reader takes again after this commit landed
        if self._committer is None:
            self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commit")
        self._commit_pending = self._committer.submit(commit)

    def _drop_held(self, why: str) -> None:
        """Forget the held round (it is trained again from the newest cut); its release's
        upload stops before it becomes visible."""
        held, self._held = self._held, None
        if held is not None:
            held[3].set_exception(YetoError(f"round not committed: {why}"))

    def _settle(self) -> None:
        """Wait for the commit handed over last (raises its error)."""
        pending, self._commit_pending = self._commit_pending, None
        if pending is not None:
            with stage("trainer.pipeline.wait"):
                pending.result()

    def _flush_writes(self) -> None:
        """Hand the held round over and wait until every write handed over landed."""
        self._hand_over()
        self._settle()
        self._wait_upload()

    def _failed_write(self) -> None:
        """Raise the error of a commit handed over that failed already (before training)."""
        pending = self._commit_pending
        if pending is not None and pending.done():
            self._settle()

    def _close_pipeline(self) -> None:
        """Drop what is held and stop the commit thread after what was handed over."""
        self._drop_held("the trainer was released")
        committer, self._committer = self._committer, None
        self._commit_pending = None
        if committer is not None:
            committer.shutdown(wait=True)
