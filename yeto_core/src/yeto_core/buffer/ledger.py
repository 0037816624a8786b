"""The batch ledger: which buffer positions every trained round consumed, by lineage.

One JSON object per round under ``ledger/rounds/<seq:012d>.json`` (``seq`` is
the trainer's trained-round counter after the round), written create-if-absent
so it works on every object store (directory, S3, Modal Volume) and a round is
never silently overwritten. Each record holds the trained positions, the
positions skipped by reason, the policy version, the incarnation and the cut it
descends from (``parent_cut``), plus what a replay needs to rebuild the batch
(group size, groups per round, padding template).

Skips committed without a trained round (at the data end, a tail of only stale
or otherwise unusable groups) get a skip-only record
(:meth:`BatchLedger.record_skips`, ``skips_only=True``) under
``ledger/rounds/<seq:012d>.skips<k:03d>.json``, ``seq`` being the trained-round
counter it follows (it sorts after that round). So the records chain without a
gap from watermark 0 to the buffer's watermark and every position is trained
or skipped with a reason in exactly one record.

- :meth:`BatchLedger.rebase` (at a restore from a cut): rounds after the cut,
  recorded by a dead incarnation, move to ``ledger/aside/<tag>/``.
- :meth:`BatchLedger.start_from_base` (a restart without a cut): refuses a
  ledger with earlier rounds unless ``set_aside_before`` moves those rounds to
  ``ledger.before-<ts>/``.
- :func:`replay`: trains the ledger's rounds again from the base on a backend
  and compares the final weights with the newest cut, bitwise.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Optional

import attrs

from yeto_core import serde
from yeto_core.errors import YetoError
from yeto_core.stores.log import StoreLog
from yeto_core.stores.parallel import in_background, is_remote, map_all

PREFIX = "ledger"


class LedgerError(YetoError):
    """The ledger disagrees with a cut, a restart or a replay."""


@attrs.frozen
class LedgerRound:
    """One trained round.

    ``seq`` is the trained-round counter after this round (1 for the first).
    ``positions`` were trained; ``skipped`` maps a reason to positions consumed
    without training; the round moved the buffer watermark from
    ``watermark_before`` to ``watermark``.
    """

    seq: int
    incarnation: int
    parent_cut: Optional[str]
    policy_version: int
    positions: tuple[int, ...]
    skipped: dict[str, tuple[int, ...]]
    watermark_before: int
    watermark: int
    group_size: int
    groups_per_round: int
    n_real: int
    n_padding: int
    padding_from: Optional[tuple[int, int]] = None
    time: float = 0.0
    #: a skip-only record: no position trained, ``seq`` is the trained-round counter
    #: it follows (not a round of its own)
    skips_only: bool = False
    #: with several trainer islands: the island that trained the round and the outer
    #: step its delta merged at (None: the run has one trainer island)
    island: Optional[str] = None
    outer_step: Optional[int] = None

    @classmethod
    def of_batch(cls, batch: Any, seq: int, incarnation: int, parent_cut: Optional[str],
                 **extra: Any) -> LedgerRound:  # fmt: skip
        """The record of a reader's batch (``extra``: ``time``, ``island``, ``outer_step``)."""
        return cls(
            seq=int(seq),
            incarnation=int(incarnation),
            parent_cut=parent_cut,
            policy_version=int(batch.policy_version),
            positions=tuple(int(p) for p in batch.positions),
            skipped={r: tuple(int(p) for p in ps) for r, ps in sorted(batch.skipped.items())},
            watermark_before=int(batch.watermark_before),
            watermark=int(batch.watermark),
            group_size=int(batch.group_size),
            groups_per_round=int(batch.groups_per_round),
            n_real=int(batch.n_real_samples),
            n_padding=len(batch.padding),
            padding_from=None if batch.padding_from is None else tuple(batch.padding_from),
            **extra,
        )


def _round_key(prefix: str, seq: int) -> str:
    return f"{prefix}/rounds/{seq:012d}.json"  # = StoreLog(store, f"{prefix}/rounds", width=12).key


def _skips_key(prefix: str, seq: int, k: int) -> str:
    # ".skips" sorts after ".json" ('s' > 'j') and before round seq + 1
    return f"{prefix}/rounds/{seq:012d}.skips{k:03d}.json"


_RECORD_NAME = re.compile(r"(\d{12})(\.skips\d{3})?\.json")


def _seq_of_key(key: str) -> Optional[tuple[int, bool]]:
    """(seq, skip-only) that a record's key names; None for a name no writer makes."""
    m = _RECORD_NAME.fullmatch(key.rsplit("/", 1)[-1])
    return (int(m.group(1)), m.group(2) is not None) if m else None


def _stamp(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


class BatchLedger:
    """The ledger of one run's store.

    :param store: the run's :class:`~yeto_core.ports.ObjectStore`.
    :param prefix: key prefix (``ledger``).
    :param clock: seconds since the epoch (injected).
    """

    def __init__(
        self, store: Any, *, prefix: str = PREFIX, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.clock = clock
        #: the newest record key this object has seen (listed or written) and its record:
        #: a writer lists only after it (O(new keys) per round, not O(history))
        self._tail: Optional[tuple[str, LedgerRound]] = None
        #: a listing started by :meth:`look_ahead`: (its keys, the tail it lists after)
        self._ahead: Optional[tuple[Future[list[str]], Optional[str]]] = None

    # -- reading --------------------------------------------------------------------------

    def _keys(self, prefix: Optional[str] = None, after: Optional[str] = None) -> list[str]:
        base = f"{prefix or self.prefix}/rounds/"
        return [k for k in self.store.list(base, after=after) if k.endswith(".json")]

    def _read(self, key: str) -> LedgerRound:
        return serde.loads(self.store.get(key), LedgerRound, what="ledger round", root=key)

    def rounds(self) -> list[LedgerRound]:
        """Every live record, in ``seq`` order (skip-only records after the round they follow)."""
        return [self._read(k) for k in self._keys()]

    def trained_rounds(self) -> list[LedgerRound]:
        """The live records of trained rounds (no skip-only record), in ``seq`` order."""
        return [r for r in self.rounds() if not r.skips_only]

    def __iter__(self) -> Iterator[LedgerRound]:
        return iter(self.rounds())

    def last(self) -> Optional[LedgerRound]:
        keys = self._keys()
        return self._read(keys[-1]) if keys else None

    def look_ahead(self) -> None:
        """On a remote store, start listing the records after the newest one this object
        saw, on a thread, and return at once (the trainer calls it before a round trains);
        the next :meth:`record` uses that listing instead of a round trip of its own.

        A record another trainer writes after the listing is still refused: it takes the
        same ``seq`` (records are dense), so this one's create-if-absent fails, and the
        buffer's compare-and-swap commit refuses the other's watermark.
        """
        if self._ahead is not None or not is_remote(self.store):
            return
        after = self._tail[0] if self._tail is not None else None
        listing = in_background(lambda: self._keys(after=after), "yeto-ledger-look-ahead")
        self._ahead = (listing, after)

    def _listed_ahead(self) -> Optional[list[str]]:
        """The keys :meth:`look_ahead` listed after the current tail (None: none usable)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        listing, after = ahead
        try:
            keys = listing.result()
        except Exception:  # listed again by the caller
            return None
        return keys if after == (self._tail[0] if self._tail is not None else None) else None

    def _last_seen(self) -> Optional[LedgerRound]:
        """:meth:`last`, listing after the newest key this object saw (records are only
        ever added after it; this object's own moves forget it)."""
        new = self._listed_ahead()
        if new is None:
            new = self._keys(after=self._tail[0] if self._tail is not None else None)
        if new:
            self._tail = (new[-1], self._read(new[-1]))
        return self._tail[1] if self._tail is not None else None

    # -- writing --------------------------------------------------------------------------

    def record(
        self,
        batch: Any,
        *,
        seq: int,
        incarnation: int,
        parent_cut: Optional[str],
        island: Optional[str] = None,
        outer_step: Optional[int] = None,
    ) -> LedgerRound:
        """Record a trained :class:`~yeto_core.buffer.batch_reader.ReaderBatch` as round ``seq``.

        Call after ``backend.train_round`` and before the buffer commit. Refuses
        to overwrite an existing round (another trainer wrote it: only one
        incarnation may train per store). ``island`` and ``outer_step``: with several
        trainer islands, who trained the round and the outer step that merged it.
        """
        rec = LedgerRound.of_batch(
            batch,
            seq,
            incarnation,
            parent_cut,
            time=float(self.clock()),
            island=island,
            outer_step=None if outer_step is None else int(outer_step),
        )
        last = self._last_seen()
        if last is not None and last.seq >= rec.seq:
            raise LedgerError(
                f"ledger round {rec.seq} by incarnation {rec.incarnation} comes after round "
                f"{last.seq} (incarnation {last.incarnation}) in {self.prefix}/rounds; "
                "restore through BatchLedger.rebase so rounds after the cut are set aside"
            )
        log = StoreLog(self.store, f"{self.prefix}/rounds", width=12)
        key = log.key(rec.seq)
        if not log.create(rec.seq, serde.dumps(rec).encode()):
            raise LedgerError(
                f"{key} already exists: another trainer recorded round {rec.seq}. Only one "
                "trainer incarnation may train per store; release the other."
            )
        self._tail = (key, rec)
        return rec

    def record_skips(
        self,
        batch: Any,
        *,
        seq: int,
        incarnation: int,
        parent_cut: Optional[str],
    ) -> LedgerRound:
        """Record a skip-only :class:`~yeto_core.buffer.batch_reader.ReaderBatch` (no groups).

        ``seq`` is the trained-round counter now (the round the skips follow). Call
        before the buffer commit, like :meth:`record`. Refuses a batch with groups
        and one that does not start where the ledger ends.
        """
        if batch.positions or not any(batch.skipped.values()):
            raise LedgerError(
                f"record_skips takes a skip-only batch; this one trains {len(batch.positions)} "
                f"positions and skips {sum(len(p) for p in batch.skipped.values())}; "
                "record a trained round with BatchLedger.record"
            )
        rec = LedgerRound(
            seq=int(seq),
            incarnation=int(incarnation),
            parent_cut=parent_cut,
            policy_version=int(batch.policy_version),
            positions=(),
            skipped={r: tuple(int(p) for p in ps) for r, ps in sorted(batch.skipped.items()) if ps},
            watermark_before=int(batch.watermark_before),
            watermark=int(batch.watermark),
            group_size=int(batch.group_size),
            groups_per_round=int(batch.groups_per_round),
            n_real=0,
            n_padding=0,
            padding_from=None,
            time=float(self.clock()),
            skips_only=True,
        )
        last = self._last_seen()
        if last is not None and (last.seq > rec.seq or last.watermark != rec.watermark_before):
            raise LedgerError(
                f"skip-only ledger record after round {rec.seq} (watermark "
                f"{rec.watermark_before}..{rec.watermark}, incarnation {rec.incarnation}) does "
                f"not follow the ledger's last record, round {last.seq} ending at watermark "
                f"{last.watermark}; restore through BatchLedger.rebase"
            )
        k = 1
        while not self.store.put_if_absent(
            _skips_key(self.prefix, rec.seq, k), serde.dumps(rec).encode()
        ):
            k += 1  # an earlier flush after the same round (taken again after a restore)
        key = _skips_key(self.prefix, rec.seq, k)
        if self._tail is None or key > self._tail[0]:
            self._tail = (key, rec)
        return rec

    def _move(self, keys: list[str], dest_prefix: str) -> list[str]:
        self._tail = None  # the newest record may be among those moved
        self._listed_ahead()  # a listing from before the move is of no use
        moved = []
        for key in keys:
            name = key.rsplit("/", 1)[1]
            dest = f"{dest_prefix}/{name}"
            data = self.store.get(key)
            if not self.store.put_if_absent(dest, data) and self.store.get(dest) != data:
                raise LedgerError(
                    f"cannot set {key} aside: {dest} exists with other content; nothing was deleted"
                )
            self.store.delete(key)
            moved.append(dest)
        return moved

    def rebase(
        self,
        *,
        trained_rounds: int,
        cut_id: Optional[str],
        watermark: int,
        incarnation: int,
    ) -> list[str]:
        """Rebase to a restored cut: rounds after it move to ``ledger/aside/...``.

        Rounds up to ``trained_rounds`` must agree with the cut (the last one
        ends at ``watermark``). Rounds after it were recorded by a dead
        incarnation; they are moved aside, never overwritten. Returns the keys
        they were moved to.
        """
        keys = self._keys()
        # The key names a record's seq and whether it is skip-only, so only the records
        # whose side of the cut needs their content are read (at once on a remote store),
        # not the whole history: a skip-only record at seq == trained_rounds (after the
        # cut when it ends past the cut's watermark: the dead incarnation committed those
        # skips after the cut), the records after the cut, a name no writer makes, and
        # the last record kept.
        named = {k: _seq_of_key(k) for k in keys}
        read: dict[str, LedgerRound] = {}

        def read_all(wanted: list[str]) -> None:
            todo = [k for k in wanted if k not in read]
            read.update(zip(todo, map_all(self.store, self._read, todo), strict=True))

        def seq_skips(k: str) -> tuple[int, bool]:
            n = named[k]
            return n if n is not None else (read[k].seq, read[k].skips_only)

        read_all(
            [
                k
                for k, n in named.items()
                if n is None or n[0] > trained_rounds or (n[1] and n[0] == trained_rounds)
            ]
        )
        after = [
            k
            for k in keys
            for seq, skips in [seq_skips(k)]
            if seq > trained_rounds or (skips and read[k].watermark > watermark)
        ]
        kept = [k for k in keys if k not in after]
        if kept:
            read_all([kept[-1]])
            last = read[kept[-1]]
            if (
                sum(1 for k in kept if not seq_skips(k)[1]) != trained_rounds
                or last.watermark != watermark
            ):
                raise LedgerError(
                    f"the ledger's round {last.seq} ends at watermark {last.watermark}, but "
                    f"cut {cut_id} holds {trained_rounds} rounds at watermark {watermark}; "
                    "the ledger and the cut come from different runs"
                )
        elif trained_rounds != 0:
            raise LedgerError(
                f"cut {cut_id} holds {trained_rounds} trained rounds but the ledger has none "
                f"up to it in {self.prefix}/rounds; the ledger was removed or belongs to another run"
            )
        for k in after:
            r = read[k]
            if r.incarnation == incarnation:
                raise LedgerError(
                    f"ledger round {r.seq} after cut {cut_id} was recorded by incarnation "
                    f"{incarnation}, the one restoring now; incarnation numbers must be new "
                    "for every start"
                )
        if not after:
            return []
        tag = f"{cut_id or 'base'}-i{incarnation}-{_stamp(self.clock())}"
        return self._move(after, f"{self.prefix}/aside/{tag}")

    def start_from_base(
        self, *, set_aside_before: Optional[float] = None, incarnation: Optional[int] = None
    ) -> list[str]:
        """A restart from the base (no cut): the ledger must be empty.

        ``set_aside_before`` (seconds since the epoch) moves rounds recorded
        before it (an earlier run's) to ``ledger.before-<ts>/rounds/``. Rounds
        recorded at or after it were trained by an incarnation of this run that
        died before its first cut: with ``incarnation`` (the one starting now)
        they are set aside to round 0 as :meth:`rebase` does; without it they
        refuse the start. Returns the keys rounds were moved to.
        """
        keys = self._keys()
        if not keys:
            return []
        if set_aside_before is None:
            first = self._read(keys[0])
            raise LedgerError(
                f"the ledger in {self.prefix}/rounds holds {len(keys)} rounds from an earlier "
                f"run (first at {_stamp(first.time)}); a start from the base would mix them "
                "with new ones. Restore a cut, or set them aside: "
                "start_from_base(set_aside_before=<seconds since the epoch>, e.g. "
                f"{self.clock():.0f}) moves the rounds recorded before then to "
                f"{self.prefix}.before-<time>/ (`yeto run up` passes the head's start time)"
            )
        old = [k for k in keys if self._read(k).time < set_aside_before]
        left = len(keys) - len(old)
        if left and incarnation is None:
            newest = self._read(keys[-1]).time
            raise LedgerError(
                f"{left} ledger rounds in {self.prefix}/rounds were recorded at or after "
                f"{_stamp(set_aside_before)} (set_aside_before); pass a set_aside_before "
                f"after the newest round ({newest:.0f}), or incarnation=<the incarnation "
                "starting now> to set this run's rounds aside and train again from round 0"
            )
        moved: list[str] = []
        if old:
            dest = f"{self.prefix}.before-{_stamp(set_aside_before)}"
            n = 1
            while any(True for _ in self.store.list(dest + "/")):
                n += 1
                dest = f"{self.prefix}.before-{_stamp(set_aside_before)}-{n}"
            moved = self._move(old, f"{dest}/rounds")
        if left:
            assert incarnation is not None
            # this run's rounds whose incarnation died before any cut: back to round 0
            moved += self.rebase(
                trained_rounds=0, cut_id=None, watermark=0, incarnation=incarnation
            )
        return moved

    # -- checks ---------------------------------------------------------------------------

    def check(self, *, watermark: Optional[int] = None) -> dict[str, Any]:
        """Check the live rounds: no position trained twice or left without a reason.

        Returns ``trained``/``skipped`` counts; raises :class:`LedgerError`
        naming the first problem.
        """
        seen: dict[int, str] = {}
        wm = 0
        prev_seq = 0
        trained = skipped = 0
        for r in self.rounds():
            if r.seq < prev_seq or (r.seq == prev_seq and not r.skips_only):
                raise LedgerError(f"ledger round {r.seq} follows round {prev_seq}")
            if r.watermark_before != wm:
                raise LedgerError(
                    f"ledger round {r.seq} starts at watermark {r.watermark_before}, the "
                    f"previous round ended at {wm}"
                )
            owned = [(p, "trained") for p in r.positions] + [
                (p, reason) for reason, ps in r.skipped.items() for p in ps
            ]
            for p, why in owned:
                if p in seen:
                    raise LedgerError(
                        f"position {p} is {why} in round {r.seq} but already {seen[p]}"
                    )
                if not r.watermark_before <= p < r.watermark:
                    raise LedgerError(
                        f"position {p} of round {r.seq} is outside its watermark range "
                        f"{r.watermark_before}..{r.watermark}"
                    )
                seen[p] = f"{why} in round {r.seq}"
            missing = sorted(set(range(r.watermark_before, r.watermark)) - set(seen))
            if missing:
                raise LedgerError(
                    f"round {r.seq} moved the watermark past positions {missing[:10]} without "
                    "training them or counting a reason"
                )
            trained += len(r.positions)
            skipped += sum(len(ps) for ps in r.skipped.values())
            wm, prev_seq = r.watermark, r.seq
        if watermark is not None and watermark != wm:
            raise LedgerError(
                f"the ledger ends at watermark {wm} but the buffer's watermark is {watermark}"
            )
        return {"rounds": prev_seq, "trained": trained, "skipped": skipped, "watermark": wm}


__all__ = [
    "BatchLedger",
    "LedgerError",
    "LedgerRound",
]
