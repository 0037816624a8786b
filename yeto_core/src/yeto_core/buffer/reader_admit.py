"""Which groups a reader round may use: :class:`ReaderAdmission`, a mixin of
:class:`~yeto_core.buffer.batch_reader.BatchReader`.

Each group the buffer selects is admitted (loaded and checked, then held for a
round) or skipped with a reason: ``fenced_incarnation``, ``quarantined``,
``too_small``, ``unconvertible``, or what :func:`~yeto_core.buffer.reader_batches.check_group`
finds; and the checks on the reader's own settings those rules use.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Optional

import attrs
import numpy as np

from yeto_core.buffer.reader_batches import check_group
from yeto_core.errors import ConfigError, SampleBufferError
from yeto_core.records import CORRUPT_INDEX_HOST, SampleGroup


@attrs.define
class _Held:
    """A usable group the reader holds between takes (carry-over)."""

    entry: Any
    group: SampleGroup


class ReaderAdmission:
    """Admitting or skipping the groups a round selects (the host holds the buffer,
    the round's group size and checks, the fence and quarantine predicates and the
    pending skips)."""

    def _is_stale(self, entry: Any, current_version: int) -> bool:
        return current_version - int(entry.min_version) > self.max_policy_age

    def _skip(self, position: int, reason: str, detail: str) -> None:
        self._pending_skips.append((int(position), reason, detail))

    def _classify_entry(self, entry: Any) -> Optional[tuple[str, str]]:
        if self._fenced(entry.host, int(entry.incarnation)):
            return "fenced_incarnation", f"host {entry.host} incarnation {entry.incarnation}"
        if entry.host == CORRUPT_INDEX_HOST:
            return "quarantined", f"index line of position {entry.position} fails its checksum"
        if self._quarantined(entry):
            return "quarantined", f"host {entry.host} group {entry.group_id}"
        if int(entry.n_samples) < self.group_size:
            return "too_small", f"{entry.n_samples} samples, the round needs {self.group_size}"
        return None

    def _preload(self, entries: Sequence[Any]) -> dict[int, tuple[Any, Optional[BaseException]]]:
        """The payloads of the entries :meth:`_admit` will load, read at once (by position).

        On a remote store (:func:`~yeto_core.stores.parallel.overlapped`) the ``get``
        round trips of a round's groups overlap; elsewhere nothing is read ahead (empty).
        """
        todo = [e for e in entries if self._classify_entry(e) is None]
        results = self.buffer.load_many(todo) if len(todo) > 1 else None
        if results is None:
            return {}
        return {int(e.position): r for e, r in zip(todo, results, strict=True)}

    def _admit(
        self, entry: Any, preloaded: Optional[tuple[Any, Optional[BaseException]]] = None
    ) -> tuple[Optional[_Held], Optional[tuple[str, str]]]:
        why = self._classify_entry(entry)
        if why is not None:
            return None, why
        try:
            if preloaded is None:
                group = self.buffer.load(entry)
            else:
                group, error = preloaded
                if error is not None:
                    raise error
        except (SampleBufferError, ValueError, KeyError, IndexError, TypeError, OSError) as exc:
            return None, ("unconvertible", f"payload does not load: {exc}")
        if len(group.samples) != int(entry.n_samples):
            return None, (
                "unconvertible",
                f"payload has {len(group.samples)} samples, its index entry says {entry.n_samples}",
            )
        why = check_group(
            group,
            group_size=self.group_size,
            vocab_size=self.vocab_size,
            expected_layers=self.expected_layers,
            top_k=self.top_k,
            num_experts=self.num_experts,
            routed_experts_required=self.routed_experts_required,
            distinct_experts=self.distinct_experts,
        )
        if why is not None:
            return None, why
        if len(group.samples) > self.group_size:
            # oversized: GRPO advantages need exactly G; the first G samples are trained
            group = attrs.evolve(group, samples=tuple(group.samples[: self.group_size]))
        return _Held(entry, group), None


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"reader.{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _fence_predicate(value: Any) -> Callable[[str, int], bool]:
    if value is None:
        return lambda host, inc: False
    if callable(value):
        return value
    if isinstance(value, Collection) and not isinstance(value, (str, bytes)):
        pairs = value

        def fenced(host: str, inc: int) -> bool:
            return (host, inc) in pairs

        return fenced
    raise ConfigError(
        "reader.fenced_incarnations must be a set of (host, incarnation) pairs or a "
        f"callable, got {type(value).__name__}"
    )


def _quarantine_predicate(value: Any) -> Callable[[Any], bool]:
    if value is None:
        return lambda entry: False
    if callable(value):
        return value
    if isinstance(value, Collection) and not isinstance(value, (str, bytes)):
        names = value

        def quarantined(entry: Any) -> bool:
            return entry.host in names or entry.group_id in names

        return quarantined
    raise ConfigError(
        "reader.quarantined must be a set of host names / group ids or a callable, "
        f"got {type(value).__name__}"
    )
