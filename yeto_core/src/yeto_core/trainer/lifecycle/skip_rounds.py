"""The driver's rounds that train nothing: :class:`DriverSkipRounds`, a mixin of
:class:`~yeto_core.trainer.lifecycle.driver.DriverLifecycle`.

A round the backend refused (non-finite loss or gradient norm) and the skips
left at the data end are committed as skip-only rounds: recorded in the ledger,
committed to the buffer and counted, with no release.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from yeto_core.buffer.batch_reader import BatchReader


class DriverSkipRounds:
    """Skip-only rounds (the host holds the ledger, the counters, the incarnation and
    the restored cut)."""

    def _refuse_round(self, reader: BatchReader, batch: Any, metrics: Mapping[str, Any]) -> None:
        """The backend refused ``batch`` (its loss or gradient norm was not finite) and kept
        its weights: commit the round's groups as skipped (``nonfinite_loss``), publish
        nothing, keep the policy version. The ledger gets a skip-only record, so a replay
        skips the round as the trainer did. The ``nonfinite_rounds`` breaker stops the run
        after ``[breakers] nonfinite_rounds`` such rounds in a row.
        """
        assert self.incarnation is not None
        c = self.counters
        skipped = {r: tuple(ps) for r, ps in batch.skipped.items() if ps}
        skipped["nonfinite_loss"] = tuple(
            sorted(set(skipped.get("nonfinite_loss", ())) | set(batch.positions))
        )
        refused = attrs.evolve(
            batch, groups=(), positions=(), padding=(), padding_from=None, skipped=skipped
        )
        self.ledger.record_skips(
            refused,
            seq=c.trained_rounds,
            incarnation=self.incarnation,
            parent_cut=self.restored_cut.cut_id if self.restored_cut else None,
        )
        watermark = reader.commit(refused)
        out = {r: list(ps) for r, ps in sorted(skipped.items())}
        counts = {r: len(ps) for r, ps in out.items()}
        for r, n in counts.items():
            self.skipped_by_reason[r] = self.skipped_by_reason.get(r, 0) + n
        self.nonfinite_in_a_row += 1
        self.counters = attrs.evolve(
            c,
            buffer_watermark=watermark,
            stale_groups=c.stale_groups + counts.get("stale", 0),
            skipped_groups=c.skipped_groups + sum(counts.values()),
        )
        what = [
            name
            for name, key in (("loss", "loss_finite"), ("gradient norm", "grad_norm_finite"))
            if float(metrics.get(key, 1.0)) == 0.0
        ]
        self._event(
            "trainer_round_refused",
            reason="nonfinite_loss",
            detail=f"the round's {' and '.join(what) or 'loss'} was not finite; "
            "the optimizer step was refused and the weights kept",
            positions=list(batch.positions),
            skipped=out,
            skipped_counts=counts,
            nonfinite_in_a_row=self.nonfinite_in_a_row,
            watermark_before=batch.watermark_before,
            metrics={k: float(v) for k, v in metrics.items() if math.isfinite(float(v))},
            **attrs.asdict(self.counters),
        )

    def _commit_skips_at_data_end(self, reader: BatchReader) -> None:
        """The data ended with only skipped groups (a stale tail) left: commit their skips.

        Without it the watermark would stop before them for ever and they would be
        neither trained nor counted (``yeto run up`` checks every group is one or the
        other). The skips go to the ledger as a skip-only record first, so the ledger
        ends at the buffer's watermark like after a trained round.
        """
        assert self.incarnation is not None
        c = self.counters
        batch = reader.flush_skips(c.policy_version)
        if batch is None:
            return
        self.ledger.record_skips(
            batch,
            seq=c.trained_rounds,
            incarnation=self.incarnation,
            parent_cut=self.restored_cut.cut_id if self.restored_cut else None,
        )
        watermark = reader.commit(batch)
        skipped = {r: list(ps) for r, ps in sorted(batch.skipped.items()) if ps}
        counts = {r: len(ps) for r, ps in skipped.items()}
        for r, n in counts.items():
            self.skipped_by_reason[r] = self.skipped_by_reason.get(r, 0) + n
        self.counters = attrs.evolve(
            c,
            buffer_watermark=watermark,
            stale_groups=c.stale_groups + counts.get("stale", 0),
            skipped_groups=c.skipped_groups + sum(counts.values()),
        )
        self._event(
            "trainer_skips_committed",
            skipped=skipped,
            skipped_counts=counts,
            watermark_before=batch.watermark_before,
            **attrs.asdict(self.counters),
        )
