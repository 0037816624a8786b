"""The durable sample buffer port (see :mod:`yeto_core.ports`)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, Optional

from yeto_core.ports.base import Port, accepts
from yeto_core.ports.store import ObjectStore, Watch
from yeto_core.records import (
    Backlog,
    BufferRound,
    GroupEntry,
    RoundSpec,
    SampleGroup,
)


class DurableSampleBuffer(Port):
    """Rollout groups appended by samplers and taken in rounds by the trainer.

    Positions are dense integers starting at 0. The consumed **watermark** is
    the first position not yet consumed: every position below it was trained
    or skipped with a counted reason. ``[buffer] kind`` in the run config
    chooses the implementation (built-in: ``file``); :meth:`open` builds it.

    Complete plugin (in memory, no durability)::

        from yeto_core import hookimpl
        from yeto_core.errors import SampleBufferError
        from yeto_core.ports import DurableSampleBuffer
        from yeto_core.records import Backlog, BufferRound, GroupEntry

        class ListBuffer(DurableSampleBuffer):
            PLUGIN_NAME = "list"

            def __init__(self, store=None, **options):
                self.groups, self.entries_, self.wm, self.ended = [], [], 0, False
                self.ids, self.seen = {}, 0

            def append(self, group):
                if group.group_id in self.ids:
                    return self.ids[group.group_id]
                pos = len(self.groups)
                versions = [s.weight_version for s in group.samples]
                self.groups.append(group)
                self.entries_.append(GroupEntry(
                    position=pos, group_id=group.group_id, prompt_id=group.prompt_id,
                    host=group.sampler_host, incarnation=group.sampler_incarnation,
                    n_samples=len(group.samples), min_version=min(versions),
                    max_version=max(versions), appended_at=0.0, payload=str(pos)))
                self.ids[group.group_id] = pos
                return pos

            def load(self, entry):
                return self.groups[entry.position]

            def select(self, spec):
                take, stale, end = [], [], self.wm
                for e in self.entries_[self.wm:]:
                    if len(take) == spec.max_groups:
                        break
                    end += 1
                    old = spec.current_version - e.min_version > spec.max_policy_age
                    (stale if old else take).append(e)
                return BufferRound(start=self.wm, end=end, entries=tuple(take),
                                   stale=tuple(stale))

            def commit(self, round):
                if round.start != self.wm:
                    raise SampleBufferError("the watermark moved since select")
                self.wm = round.end
                return self.wm

            @property
            def watermark(self):
                return self.wm

            def backlog(self, current_version=None, max_policy_age=None, fenced=None):
                waiting = self.entries_[self.wm:]
                if current_version is not None and max_policy_age is not None:
                    waiting = [e for e in waiting
                               if current_version - e.min_version <= max_policy_age]
                if fenced is not None:
                    waiting = [e for e in waiting if not fenced(e.host, e.incarnation)]
                return Backlog(groups=len(waiting),
                               samples=sum(e.n_samples for e in waiting),
                               watermark=self.wm, head_position=len(self.groups),
                               oldest_version=min((e.min_version for e in waiting), default=None),
                               data_ended=self.ended)

            def poll_arrivals(self, callback):
                new = self.entries_[max(self.seen, self.wm):]
                self.seen = len(self.entries_)
                for e in new:
                    callback(e)
                return len(new)

            def reset_to(self, watermark):
                self.wm = watermark

            def mark_data_end(self):
                self.ended = True

            def data_ended(self):
                return self.ended

            def entries(self, start=0):
                return list(self.entries_[start:])

        @hookimpl
        def yeto_register_sample_buffers(register):
            register(ListBuffer)
    """

    PORT = "DurableSampleBuffer"

    @classmethod
    def open(
        cls,
        store: ObjectStore,
        *,
        host: str,
        layout: str = "auto",
        merger: bool = False,
        read_only: bool = False,
        **options: Any,
    ) -> DurableSampleBuffer:
        """Open the run's buffer in ``store`` for appender ``host``.

        :param layout: ``[buffer] layout`` (the ``file`` buffer: ``auto``, ``jsonl``,
            ``objects``, ``shards``); an implementation without layouts ignores it.
        :param merger: this process is the head (it merges per-host shards).
        :param read_only: never write (``yeto buffer stats``).
        :param options: ``[buffer] options``.

        Default: ``cls(store, host=..., layout=..., merger=..., read_only=..., **options)``,
        passing only the keywords the constructor takes.
        """
        kw: dict[str, Any] = dict(options)
        for name, value in (
            ("host", host),
            ("layout", layout),
            ("merger", merger),
            ("read_only", read_only),
        ):
            if accepts(cls, name):
                kw[name] = value
        return cls(store, **kw)

    @abc.abstractmethod
    def append(self, group: SampleGroup) -> int:
        """Durably append ``group``; return its position (the same one for a repeated id)."""

    @abc.abstractmethod
    def load(self, entry: GroupEntry) -> SampleGroup:
        """The whole group ``entry`` indexes (arrays included)."""

    def load_many(
        self, entries: Sequence[GroupEntry]
    ) -> Optional[list[tuple[Optional[SampleGroup], Optional[BaseException]]]]:
        """The groups of ``entries`` read at once, in order, each ``(group, None)`` or
        ``(None, the error its load raised)``; None when this buffer reads nothing ahead
        (then each group is loaded when it is admitted). Default: None. The ``file`` buffer
        overlaps the reads on a remote store.
        """
        return None

    def reader_copy(self) -> Optional[DurableSampleBuffer]:
        """A read-only buffer on the same data with its own reader state, to read (the
        backlog) on another thread while this object appends; None when reads through
        this object are cheap enough (the default). The ``file`` buffer makes one on a
        remote store only.
        """
        return None

    def prefetch(self, start: int, n: int) -> None:
        """A hint, in the background: the next reads will load up to ``n`` groups from
        position ``start`` on (the trainer gives it the next round's positions while it
        trains). It returns at once and changes nothing a reader sees: a later ``load``
        or ``load_many`` may answer from what it read, checked as always. Default:
        nothing. The ``file`` buffer reads ahead on a remote store only.
        """

    @abc.abstractmethod
    def select(self, spec: RoundSpec) -> BufferRound:
        """Take up to ``spec.max_groups`` whole groups from the watermark on, in position order.

        Groups older than ``spec.max_policy_age`` versions are consumed as ``stale``.
        The round starts at the watermark; nothing moves until :meth:`commit`.
        """

    @abc.abstractmethod
    def commit(self, round: BufferRound) -> int:
        """Mark a selected round consumed (watermark := ``round.end``); return it.

        Raise :class:`~yeto_core.errors.SampleBufferError` when the watermark is no
        longer ``round.start``.
        """

    @property
    @abc.abstractmethod
    def watermark(self) -> int:
        """The first position not consumed (re-read from the store)."""

    @abc.abstractmethod
    def backlog(
        self,
        current_version: Optional[int] = None,
        max_policy_age: Optional[int] = None,
        fenced: Optional[Callable[[str, int], bool]] = None,
    ) -> Backlog:
        """What waits after the watermark (with a version and age: only what is selectable;
        with ``fenced``, a ``(host, incarnation) -> bool``, not the groups of fenced sampler
        incarnations, which the trainer skips).

        Its cost does not grow with history.
        """

    def backlog_without_end(
        self,
        current_version: Optional[int] = None,
        max_policy_age: Optional[int] = None,
        fenced: Optional[Callable[[str, int], bool]] = None,
    ) -> Backlog:
        """:meth:`backlog` for a reader that never acts on the data end (a sampler sizing
        its next call): its ``data_ended`` may stay False after :meth:`mark_data_end`,
        which spares a buffer that keeps the mark apart a request per read. Default:
        :meth:`backlog`."""
        return self.backlog(current_version, max_policy_age, fenced)

    @abc.abstractmethod
    def poll_arrivals(self, callback: Callable[[GroupEntry], None]) -> int:
        """Call ``callback`` once per group appended since the last poll; return the count."""

    @abc.abstractmethod
    def reset_to(self, watermark: int) -> None:
        """After a restore: groups at and after ``watermark`` become selectable again."""

    @abc.abstractmethod
    def mark_data_end(self) -> None:
        """Record that no more groups will be appended."""

    @abc.abstractmethod
    def data_ended(self) -> bool:
        """Whether :meth:`mark_data_end` was called (by any process)."""

    # -- optional capabilities ---------------------------------------------------------

    def append_many(self, groups: Sequence[SampleGroup]) -> list[int]:
        """Append several groups; default: :meth:`append` each in order."""
        return [self.append(g) for g in groups]

    def watch(self) -> Optional[Watch]:
        """A :class:`~yeto_core.stores.watch.Watch` that wakes when the buffer may have
        changed (a group appended, a round committed), or None (the default): the head
        and the samplers then poll at their usual intervals."""
        return None

    def entries(self, start: int = 0) -> list[GroupEntry]:
        """Every entry from ``start`` on (O(history): summaries, ``yeto ledger replay``)."""
        from yeto_core.errors import SampleBufferError

        raise SampleBufferError(
            f"the {self.PLUGIN_NAME!r} sample buffer cannot list its entries; the run summary "
            "and `yeto ledger replay` need DurableSampleBuffer.entries()"
        )

    def stats(self) -> dict[str, Any]:
        """What ``yeto buffer stats`` shows; default: the backlog's fields."""
        b = self.backlog()
        return {
            "head_position": b.head_position,
            "watermark": b.watermark,
            "backlog_groups": b.groups,
            "backlog_samples": b.samples,
            "oldest_version": b.oldest_version,
            "data_ended": b.data_ended,
        }

    def close(self) -> None:
        """Release file descriptors and connections; default: nothing."""
