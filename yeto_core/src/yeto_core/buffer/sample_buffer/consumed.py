"""The consumed state (``consumed.json``) and the pure choice of a round."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from yeto_core.errors import SampleBufferError
from yeto_core.records import BufferRound, GroupEntry, RoundSpec

#: ``consumed.json`` keeps this many of the latest stale positions.
STALE_TAIL = 1000


@attrs.frozen
class ConsumedState:
    """``consumed.json``: everything below ``watermark`` was trained or skipped with a reason."""

    watermark: int = 0
    stale_total: int = 0
    duplicate_total: int = 0
    stale_tail: tuple[int, ...] = ()
    resets: int = 0
    updated_at: float = 0.0


def plan_round(
    pending: Iterable[tuple[GroupEntry, bool]], watermark: int, spec: RoundSpec
) -> BufferRound:
    """Choose a round from ``pending`` (entries from ``watermark`` on, with a duplicate flag).

    Takes up to ``spec.max_groups`` groups with ``current_version - min_version <=
    max_policy_age`` in position order; older ones and duplicates in the span are
    consumed without training. The round ends right after its last consumed position.
    """
    if spec.max_groups < 0 or spec.max_policy_age < 0:
        raise SampleBufferError(
            f"invalid round spec {spec}: max_groups and max_policy_age must be >= 0"
        )
    take: list[GroupEntry] = []
    stale: list[GroupEntry] = []
    dups: list[int] = []
    end = watermark
    if spec.max_groups == 0:
        return BufferRound(start=watermark, end=watermark)
    for entry, dup in pending:
        if entry.position != end:
            raise SampleBufferError(
                f"buffer index has a gap: expected position {end}, found {entry.position}"
            )
        end += 1
        if dup:
            dups.append(entry.position)
        elif spec.current_version - entry.min_version > spec.max_policy_age:
            stale.append(entry)
        else:
            take.append(entry)
            if len(take) == spec.max_groups:
                break
    return BufferRound(
        start=watermark, end=end, entries=tuple(take), stale=tuple(stale), duplicates=tuple(dups)
    )
