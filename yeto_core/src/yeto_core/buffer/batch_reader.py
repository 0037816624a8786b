"""The batch reader: turns buffer rounds into trainable batches, whatever samplers wrote.

A trainer must never die because one sampler wrote something odd, and must
never train a sample twice or skip one without saying why. The reader sits
between :class:`~yeto_core.buffer.sample_buffer.FileSampleBuffer` and a
:class:`~yeto_core.ports.TrainerBackend`:

- it asks the buffer for whole groups (``select``) until the round has
  ``groups_per_round`` usable groups, waiting while samplers make progress;
- it leaves out groups that cannot be trained and counts each by reason with
  its position: ``stale``, ``fenced_incarnation``, ``quarantined``,
  ``nonfinite_reward``, ``unconvertible``, ``too_small``;
- groups the round cannot use (the batch size shrank, the take failed) are
  carried to the next round, never lost; a carried group that ages out is
  counted ``stale``;
- a short round (data ended, or ``pad_after_s`` without progress) is filled
  with loss-free padding copied from the shortest sample that has a response.

The committed watermark never passes a carried group, so a cut taken at any
round boundary holds exactly the positions trained or skipped with a reason.
See ``docs/reader.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Optional, Union

from yeto_core.buffer.reader_admit import (
    ReaderAdmission,
    _fence_predicate,
    _Held,
    _positive_int,
    _quarantine_predicate,
)
from yeto_core.buffer.reader_batches import (  # noqa: F401 (re-exported)
    SKIP_REASONS,
    EndOfData,
    ReaderBatch,
    ReaderError,
    SamplerWaitTimeout,
    UnconvertibleRoundError,
    _sample_problem,
    check_group,
    make_padding,
    padding_template,
)
from yeto_core.errors import ConfigError
from yeto_core.records import CORRUPT_INDEX_HOST, BufferRound, RoundSpec, Sample


class BatchReader(ReaderAdmission):
    """Builds :class:`ReaderBatch` rounds of whole groups from a sample buffer.

    :param buffer: a :class:`~yeto_core.buffer.sample_buffer.FileSampleBuffer` (or
        anything with ``select``, ``load``, ``commit``, ``watermark``,
        ``reset_to`` and ``data_ended``).
    :param group_size: G, samples per group the trainer computes advantages over.
    :param groups_per_round: whole groups per round (or give ``batch_size``).
    :param batch_size: samples per round; must be a multiple of ``group_size``.
    :param max_policy_age: groups older than this many versions are ``stale``.
    :param vocab_size: token ids must be below it (None: not checked).
    :param expected_layers, top_k, num_experts: routed-expert checks (MoE).
    :param routed_experts_required: with ``expected_layers``, a sample without routed
        experts is ``unconvertible`` (False: only samples that carry them are checked).
    :param distinct_experts: a token and layer that names one expert twice is
        ``unconvertible`` (a trainer whose replay needs ``top_k`` distinct experts).
    :param fenced_incarnations: ``(host, incarnation)`` pairs, or a callable
        ``(host, incarnation) -> bool``, of fenced sampler incarnations.
    :param quarantined: host names or group ids, or a callable ``entry -> bool``.
    :param wait_s: fail a take when no group arrived for this long.
    :param pad_after_s: return a short, padded round once this long passed
        without a new group and at least one group is usable (None: only when
        the buffer's data ended).
    :param poll_s: how long to wait between empty selects.
    :param max_unconvertible_takes: K; that many all-unconvertible takes in a
        row fail the round.
    :param clock, sleep: injected time (monotonic seconds) and wait.
    """

    def __init__(
        self,
        buffer: Any,
        *,
        group_size: int,
        groups_per_round: Optional[int] = None,
        batch_size: Optional[int] = None,
        max_policy_age: int,
        vocab_size: Optional[int] = None,
        expected_layers: Optional[int] = None,
        top_k: Optional[int] = None,
        num_experts: Optional[int] = None,
        routed_experts_required: bool = True,
        distinct_experts: bool = False,
        fenced_incarnations: Union[Callable[[str, int], bool], Collection[Any], None] = None,
        quarantined: Union[Callable[[Any], bool], Collection[str], None] = None,
        wait_s: float = 600.0,
        pad_after_s: Optional[float] = None,
        poll_s: float = 0.5,
        max_unconvertible_takes: int = 3,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.buffer = buffer
        self.group_size = _positive_int(group_size, "group_size")
        self.groups_per_round = self._groups_from(groups_per_round, batch_size)
        if not isinstance(max_policy_age, int) or max_policy_age < 0:
            raise ConfigError(
                f"reader.max_policy_age must be an integer >= 0, got {max_policy_age!r}"
            )
        self.max_policy_age = max_policy_age
        for name, v in (
            ("vocab_size", vocab_size),
            ("expected_layers", expected_layers),
            ("top_k", top_k),
            ("num_experts", num_experts),
        ):
            if v is not None:
                _positive_int(v, name)
        if (top_k is not None or num_experts is not None) and expected_layers is None:
            raise ConfigError(
                "reader.top_k/num_experts are set but reader.expected_layers is not; "
                "set all three for a model that routes experts, or none"
            )
        if top_k is not None and num_experts is not None and top_k > num_experts:
            raise ConfigError(
                f"reader.top_k ({top_k}) exceeds reader.num_experts ({num_experts}); "
                "a token cannot be routed to more experts than exist"
            )
        self.vocab_size = vocab_size
        self.expected_layers = expected_layers
        self.top_k = top_k
        self.num_experts = num_experts
        self.routed_experts_required = bool(routed_experts_required)
        self.distinct_experts = bool(distinct_experts)
        for name, v in (("wait_s", wait_s), ("poll_s", poll_s)):
            if not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
                raise ConfigError(f"reader.{name} must be a finite number > 0, got {v!r}")
        if pad_after_s is not None and not (0 <= pad_after_s < wait_s):
            raise ConfigError(
                f"reader.pad_after_s ({pad_after_s!r}) must be >= 0 and below reader.wait_s "
                f"({wait_s}); otherwise the wait always times out before padding"
            )
        self.wait_s = float(wait_s)
        self.pad_after_s = pad_after_s
        self.poll_s = float(poll_s)
        self.max_unconvertible_takes = _positive_int(
            max_unconvertible_takes, "max_unconvertible_takes"
        )
        self._fenced = _fence_predicate(fenced_incarnations)
        self._quarantined = _quarantine_predicate(quarantined)
        self.clock = clock
        self.sleep = sleep
        # carry-over: usable groups selected but not trained yet, in position order
        self._carry: list[_Held] = []
        # skips found but not yet in a batch: (position, reason, detail)
        self._pending_skips: list[tuple[int, str, str]] = []
        # what the reader examined after the committed watermark (select always
        # starts there): position -> entry (None for a duplicate), up to _seen_end
        self._seen: dict[int, Any] = {}
        self._seen_end: Optional[int] = None
        self._built_wm: Optional[int] = None  # watermark of the last batch built
        #: committed skips by reason: reason -> positions (in commit order)
        self.skipped: dict[str, list[int]] = {r: [] for r in SKIP_REASONS}
        self.trained_positions: list[int] = []
        self.last_skip_detail: dict[int, str] = {}

    # -- configuration ------------------------------------------------------------------

    def _groups_from(self, groups_per_round: Optional[int], batch_size: Optional[int]) -> int:
        if groups_per_round is None and batch_size is None:
            raise ConfigError("reader: set groups_per_round or batch_size (samples per round)")
        if batch_size is not None:
            batch_size = _positive_int(batch_size, "batch_size")
            if batch_size % self.group_size:
                raise ConfigError(
                    f"reader.batch_size ({batch_size}) is not divisible by reader.group_size "
                    f"({self.group_size}); rounds hold whole groups, so use a multiple of "
                    f"{self.group_size} (e.g. {batch_size - batch_size % self.group_size or self.group_size})"
                )
            n = batch_size // self.group_size
            if groups_per_round is not None and groups_per_round != n:
                raise ConfigError(
                    f"reader.groups_per_round ({groups_per_round}) disagrees with "
                    f"reader.batch_size / group_size ({n}); set only one"
                )
            return n
        return _positive_int(groups_per_round, "groups_per_round")

    def set_batch_size(
        self, *, groups_per_round: Optional[int] = None, batch_size: Optional[int] = None
    ) -> None:
        """Change the round size between rounds; extra held groups carry over."""
        self.groups_per_round = self._groups_from(groups_per_round, batch_size)

    @property
    def carried_positions(self) -> tuple[int, ...]:
        """Positions of the usable groups held for the next round."""
        return tuple(h.entry.position for h in self._carry)

    def counts(self) -> dict[str, int]:
        """Committed skip counts by reason."""
        return {r: len(p) for r, p in self.skipped.items()}

    # -- taking a round -----------------------------------------------------------------

    def take(self, current_version: int, *, short_ok: bool = False) -> ReaderBatch:
        """Build the next round for a trainer at policy ``current_version``.

        Waits while samplers make progress; the wait restarts at every group
        the buffer selects. Raises :class:`SamplerWaitTimeout` after ``wait_s``
        without a new group, :class:`UnconvertibleRoundError` after
        ``max_unconvertible_takes`` all-unconvertible takes in a row, and
        :class:`EndOfData` when the data ended and nothing usable is left.
        Groups gathered by a failed take are carried to the next one.
        ``short_ok`` pads and returns as soon as the buffer has nothing more.
        """
        batch = self._take(current_version, short_ok=short_ok, block=True)
        assert batch is not None
        return batch

    def try_take(self, current_version: int, *, short_ok: bool = False) -> Optional[ReaderBatch]:
        """Like :meth:`take` without waiting: None when no full round is there now.

        What it gathered is carried to the next call; skips stay counted.
        """
        return self._take(current_version, short_ok=short_ok, block=False)

    def _take(self, current_version: int, *, short_ok: bool, block: bool) -> Optional[ReaderBatch]:
        n = self.groups_per_round
        kept: list[_Held] = []
        for held in self._carry:
            if self._is_stale(held.entry, current_version):
                self._skip(
                    held.entry.position,
                    "stale",
                    f"carried group aged out: version {held.entry.min_version}, "
                    f"trainer at {current_version}",
                )
            else:
                kept.append(held)
        self._carry = kept
        last_progress = self.clock()
        bad_takes: list[str] = []
        wm_now: Optional[int] = None  # the watermark the last select started at
        while len(self._carry) < n:
            wm = self._watermark()
            if self._seen_end is None or self._seen_end < wm:
                self._seen_end = wm
            # select always starts at the committed watermark: ask for the groups
            # already examined there (that the buffer still offers) plus the ones missing
            offered = sum(
                1
                for p, e in self._seen.items()
                if wm <= p < self._seen_end
                and e is not None
                and not self._is_stale(e, current_version)
            )
            spec = RoundSpec(
                max_groups=offered + n - len(self._carry),
                current_version=int(current_version),
                max_policy_age=self.max_policy_age,
            )
            rnd = self.buffer.select(spec)
            if int(rnd.start) != wm:
                raise ReaderError(
                    f"the buffer selected from position {rnd.start} but its watermark is {wm}; "
                    "another trainer is committing to this buffer"
                )
            wm_now = wm
            seen_end = self._seen_end
            entries = [e for e in rnd.entries if e.position >= seen_end]
            stale = [e for e in rnd.stale if e.position >= seen_end]
            dups = [int(p) for p in rnd.duplicates if p >= seen_end]
            self._seen_end = max(seen_end, int(rnd.end))
            if entries or stale or dups:
                last_progress = self.clock()
            for e in stale:
                self._seen[int(e.position)] = e
                if e.host == CORRUPT_INDEX_HOST:  # its stand-in has no versions: not stale
                    self._skip(e.position, "quarantined", "its index record fails its checksum")
                    continue
                self._skip(
                    e.position, "stale", f"version {e.min_version}, trainer at {current_version}"
                )
            for p in dups:
                self._seen[p] = None
                self._skip(p, "duplicate", "a group id appended again (same group twice)")
            admitted = 0
            causes: list[str] = []
            preloaded = self._preload(entries)
            for e in entries:
                self._seen[int(e.position)] = e
                held, why = self._admit(e, preloaded.get(int(e.position)))
                if held is None:
                    assert why is not None
                    self._skip(e.position, why[0], why[1])
                    if why[0] == "unconvertible":
                        causes.append(f"position {e.position}: {why[1]}")
                    continue
                self._carry.append(held)
                admitted += 1
            if entries and len(causes) == len(entries) and not stale and not dups:
                bad_takes.append("; ".join(causes))
                if len(bad_takes) >= self.max_unconvertible_takes:
                    raise UnconvertibleRoundError(
                        f"{len(bad_takes)} takes in a row from the sample buffer held only "
                        f"unconvertible groups (max_unconvertible_takes="
                        f"{self.max_unconvertible_takes}); last cause: {bad_takes[-1]}. "
                        "Check the samplers' engine and model settings (vocab_size, "
                        "routed experts) against the trainer's."
                    )
                continue  # taken again at once
            if entries or stale or dups:
                # a take that found any group of another fate (trained, too small, stale,
                # ...) ends a row of all-unconvertible takes: the cause is not systematic
                bad_takes.clear()
                continue
            # nothing new selected: the round is short for now
            waited = self.clock() - last_progress
            if self._carry and (
                short_ok
                or self._data_ended()
                or (self.pad_after_s is not None and waited >= self.pad_after_s)
            ):
                break
            if not self._carry and self._data_ended():
                raise EndOfData(
                    "the sample buffer's data ended and no usable group is left "
                    f"(watermark {wm}); the run is finished"
                )
            if not block:
                return None
            if waited >= self.wait_s:
                raise SamplerWaitTimeout(
                    f"no group arrived in the sample buffer for {waited:.1f}s "
                    f"(wait_s={self.wait_s}) while a round of {n} groups had "
                    f"{len(self._carry)}; check that sampler islands are running and "
                    "appending (yeto run status), or raise reader.wait_s"
                )
            self.sleep(self.poll_s)
        return self._build(current_version, wm_now)

    def flush_skips(self, current_version: int) -> Optional[ReaderBatch]:
        """A skip-only batch of the skips found but not committed yet, or None.

        At the data end (``take`` raised :class:`EndOfData`) the skips found after
        the last trained round (a stale tail, duplicates, unconvertible groups) are
        in no batch; committing this one moves the watermark past them with their
        reasons, so every position is trained or skipped with a reason. None when
        there is nothing to flush, or while usable groups are carried (those go into
        the next round: a flush never drops a group).
        """
        if self._carry or not self._pending_skips:
            return None
        batch = self._build(current_version)
        assert not batch.groups and batch.skipped
        return batch

    def _data_ended(self) -> bool:
        return bool(self.buffer.data_ended())

    def _watermark(self) -> int:
        return int(self.buffer.watermark)

    def _build(self, current_version: int, wm_now: Optional[int] = None) -> ReaderBatch:
        """The batch of the first ``groups_per_round`` held groups; ``wm_now``: the committed
        watermark as this take's last select read it (None: read it now). A commit
        checks it again, so a watermark moved since is refused there, not trained over."""
        n = self.groups_per_round
        used, self._carry = self._carry[:n], self._carry[n:]
        wm_before = self._watermark() if wm_now is None else wm_now
        if self._built_wm is not None and self._built_wm > wm_before:
            wm_before = self._built_wm  # a round taken ahead of an uncommitted one
        seen_end = self._seen_end if self._seen_end is not None else wm_before
        watermark = self._carry[0].entry.position if self._carry else max(wm_before, seen_end)
        skips = [s for s in self._pending_skips if s[0] < watermark]
        self._pending_skips = [s for s in self._pending_skips if s[0] >= watermark]
        self._built_wm = watermark
        skipped: dict[str, list[int]] = {}
        details: dict[int, str] = {}
        for pos, reason, detail in sorted(skips):
            skipped.setdefault(reason, []).append(pos)
            details[pos] = detail
        groups = tuple(h.group for h in used)
        positions = tuple(int(h.entry.position) for h in used)
        short = n - len(used)
        tmpl = padding_template(zip(positions, groups, strict=True)) if short else None
        padding: tuple[Sample, ...] = ()
        if tmpl is not None:
            g = groups[positions.index(tmpl[0])]
            padding = make_padding(g.samples[tmpl[1]], short * self.group_size)
        real = sum(len(g.samples) for g in groups)
        metrics: dict[str, float] = {
            "groups": float(len(groups)),
            "real_samples": float(real),
            "padded_samples": float(len(padding)),
            "padded_fraction": float(len(padding)) / float(real + len(padding))
            if real + len(padding)
            else 0.0,
            "carried_groups": float(len(self._carry)),
        }
        for r in SKIP_REASONS:
            metrics[f"skipped_{r}"] = float(len(skipped.get(r, ())))
        stale_entries = tuple(
            self._seen[p] for p in skipped.get("stale", ()) if self._seen.get(p) is not None
        )
        return ReaderBatch(
            groups=groups,
            positions=positions,
            policy_version=int(current_version),
            padding=padding,
            metrics=metrics,
            skipped={r: tuple(p) for r, p in skipped.items()},
            watermark_before=wm_before,
            watermark=watermark,
            padding_from=tmpl,
            groups_per_round=n,
            group_size=self.group_size,
            rounds=(
                {
                    "entries": tuple(h.entry for h in used),
                    "stale": stale_entries,
                    "duplicates": tuple(skipped.get("duplicate", ())),
                    "details": details,
                },
            ),
        )

    # -- commit and reset -----------------------------------------------------------------

    def commit(self, batch: ReaderBatch) -> int:
        """Commit ``batch``: advance the buffer's watermark to ``batch.watermark``.

        The watermark stops at the first carried group, so positions below it
        are exactly those trained or skipped with a reason. Batches taken ahead
        commit in the order they were taken. Returns the new watermark.
        """
        if not isinstance(batch, ReaderBatch):
            raise ReaderError(
                "BatchReader.commit needs the ReaderBatch that take() returned, got "
                f"{type(batch).__name__}"
            )
        wm = commit_watermark(self.buffer, batch)
        self.note_committed(batch)
        return wm

    def note_committed(self, batch: ReaderBatch) -> None:
        """Count ``batch`` committed in the reader's own records without writing the buffer:
        its caller writes it (:func:`commit_watermark`) before the reader takes again (a
        trainer that commits on another thread, after it took the next round)."""
        wm = int(batch.watermark)
        info = batch.rounds[0] if batch.rounds else {}
        details = info.get("details", {}) if isinstance(info, Mapping) else {}
        for reason, ps in batch.skipped.items():
            self.skipped.setdefault(reason, []).extend(ps)
            for p in ps:
                self.last_skip_detail[p] = details.get(p, reason)
        self.trained_positions.extend(batch.positions)
        self._seen = {p: e for p, e in self._seen.items() if p >= wm}

    def reset(self) -> None:
        """Forget held groups and uncommitted skips; the buffer re-offers them.

        Call after a restore (``buffer.reset_to`` the cut's watermark) or to
        drop a round taken ahead: select starts at the committed watermark,
        so nothing held is lost.
        """
        self._carry.clear()
        self._pending_skips.clear()
        self._seen.clear()
        self._seen_end = None
        self._built_wm = None


def commit_watermark(buffer: Any, batch: ReaderBatch) -> int:
    """Advance ``buffer``'s committed watermark from ``batch.watermark_before`` to ``batch.watermark``."""
    wm = int(buffer.watermark)
    if wm != int(batch.watermark_before):
        raise ReaderError(
            f"this batch starts at watermark {batch.watermark_before} but the buffer's is {wm}: "
            "commit batches in the order they were taken, and take again after a restore"
        )
    info = batch.rounds[0] if batch.rounds else {}
    rnd = BufferRound(
        start=wm,
        end=int(batch.watermark),
        entries=tuple(info.get("entries", ())),
        stale=tuple(info.get("stale", ())),
        duplicates=tuple(info.get("duplicates", ())),
    )
    return int(buffer.commit(rnd))


__all__ = [
    "SKIP_REASONS",
    "BatchReader",
    "EndOfData",
    "ReaderBatch",
    "ReaderError",
    "SamplerWaitTimeout",
    "UnconvertibleRoundError",
    "check_group",
    "commit_watermark",
    "make_padding",
    "padding_template",
]
