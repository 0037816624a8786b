"""The ``file`` sample buffer: :class:`FileSampleBuffer` over any object store.

See :mod:`yeto_core.buffer.sample_buffer` for the layout, the append order, dedup,
rounds and incremental reads.
"""

from __future__ import annotations

import collections
import hashlib
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core import serde
from yeto_core.buffer.sample_buffer.append import BufferAppends, _serialized
from yeto_core.buffer.sample_buffer.codec import check_group_id, entry_from
from yeto_core.buffer.sample_buffer.consumed import STALE_TAIL, ConsumedState, plan_round
from yeto_core.buffer.sample_buffer.jsonl_index import JsonlIndex
from yeto_core.buffer.sample_buffer.loads import BufferLoads
from yeto_core.buffer.sample_buffer.objects_index import IndexCache, ObjectsIndex
from yeto_core.buffer.sample_buffer.shards import merge_shards
from yeto_core.errors import NotFoundError, SampleBufferError
from yeto_core.ports import DurableSampleBuffer, ObjectStore
from yeto_core.records import Backlog, BufferRound, Event, GroupEntry, RoundSpec
from yeto_core.stage_profile import PROFILE, stage
from yeto_core.stores.parallel import is_remote, map_all

LAYOUTS = ("auto", "jsonl", "objects", "shards")


class FileSampleBuffer(BufferAppends, BufferLoads, DurableSampleBuffer):
    """The ``file`` sample buffer on any :class:`~yeto_core.ports.ObjectStore`.

    :param store: the run's object store.
    :param prefix: key prefix of the buffer.
    :param layout: ``auto`` (``jsonl`` on a directory store, else ``objects``),
        ``jsonl``, ``objects`` or ``shards``.
    :param host: this appender's host name (shards; default: the machine's name).
    :param clock: returns seconds since the epoch (``appended_at``, ``consumed.json``).
    :param read_only: never write (no torn-tail repair, no merge); for ``yeto buffer stats``.
    :param merger: layout ``shards``: this process (the head) merges host shards.
    :param packs: ``append_many`` writes a batch's payloads as one pack object (layouts
        ``jsonl`` and ``objects``; ``[buffer] options.packs``, default true). False: one
        payload object per group, and layout ``objects`` appends as before packs (dedup
        across processes by the payload's key).
    :param index_cache: layout ``objects``: the index objects another buffer of this
        process read or created (:meth:`reader_copy` shares its own); default: a new one.

    One object may be shared by threads (the head's loop and a watcher): its
    methods take one lock, so a read of the index and the head it advances are
    never split between two threads.
    """

    PLUGIN_NAME = "file"

    def __init__(
        self,
        store: ObjectStore,
        *,
        prefix: str = "buffer",
        layout: str = "auto",
        host: Optional[str] = None,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
        merger: bool = False,
        packs: bool = True,
        index_cache: Optional[IndexCache] = None,
    ) -> None:
        if not isinstance(packs, bool):
            raise SampleBufferError(
                f"buffer option packs={packs!r} must be true or false ([buffer] options.packs)"
            )
        if layout not in LAYOUTS:
            raise SampleBufferError(f"unknown buffer layout {layout!r}; use one of {LAYOUTS}")
        self.store = store
        self.prefix = prefix.rstrip("/")
        self._lock = threading.RLock()
        self.clock = clock
        self.read_only = read_only
        self.merger = merger and not read_only
        self.host = check_group_id(host or socket.gethostname().split(".")[0] or "host", "host")
        root = store.local_root()
        if layout == "auto":
            layout = "jsonl" if root is not None else "objects"
        self.layout = layout
        self.events: list[Event] = []
        #: the index objects (immutable) this buffer's cursors and its copies read or made
        self._index_cache = IndexCache() if index_cache is None else index_cache
        fsync = store.fsyncs()
        if layout in ("jsonl", "shards"):
            if root is None:
                raise SampleBufferError(
                    f"buffer layout {layout!r} needs a store on a file system (the dir store); "
                    f"{type(store).__name__} has none. Use layout='objects'"
                )
            base = Path(root) / self.prefix
            self._jsonl: Optional[JsonlIndex] = JsonlIndex(
                base / "index.jsonl", fsync=fsync, events=self.events
            )
            self._objects: Optional[ObjectsIndex] = None
        else:
            self._jsonl = None
            self._objects = ObjectsIndex(
                store, self.prefix, events=self.events, cache=self._index_cache
            )
        self.packs = packs
        #: layout ``objects`` with packs: the appender's own cursor into the index (it
        #: reads to the end before each index object it writes; ``append._append_objects``)
        self._objects_packs = packs and layout == "objects" and not read_only
        self._writer: Optional[ObjectsIndex] = (
            ObjectsIndex(store, self.prefix, cache=self._index_cache)
            if self._objects_packs
            else None
        )
        self._shard: Optional[JsonlIndex] = None
        self._shard_readers: dict[str, JsonlIndex] = {}
        self._merged_seq: dict[str, int] = {}
        if layout == "shards":
            self._shards_dir = Path(root) / self.prefix / "shards"  # type: ignore[arg-type]
            self._shard = JsonlIndex(
                self._shards_dir / self.host / "index.jsonl", fsync=fsync, events=self.events
            )
        # reader state
        self._ids: dict[str, int] = {}  # group id -> first position (every reader agrees)
        self._appended: dict[str, int] = {}  # ids this object appended (objects layout)
        self._head = 0
        self._pending: collections.deque[tuple[GroupEntry, bool]] = collections.deque()
        self._state = ConsumedState()
        self._state_raw: Optional[bytes] = None
        #: the store's version of consumed.json as last read or written (None: absent);
        #: every write is a compare-and-swap from it (one committer per buffer)
        self._state_version: Optional[str] = None
        #: consumed.json is as this object's own last commit wrote it (no read since saw
        #: another version): ``watermark`` and ``commit`` use it without a read; the
        #: commit's compare-and-swap still refuses a state someone else wrote meanwhile
        self._own_state = False
        self._arrivals: Optional[collections.deque[GroupEntry]] = None
        self._data_ended = False
        self._reloads = 0  # how many times the index was re-read from the start
        self._state = self._read_state(self._fetch_state())
        if self._jsonl is not None and not read_only and layout == "jsonl":
            self._ingest(self._jsonl.open_and_repair())
        elif self._shard is not None and not read_only:
            self._shard.open_and_repair()
        self._catch_up()
        self._sync_writer()

    # -- keys --------------------------------------------------------------------------

    def payload_key(self, group_id: str) -> str:
        return f"{self.prefix}/groups/{check_group_id(group_id)}.safetensors"

    def pack_key(self, digests: list[str]) -> str:
        """The key of the pack of groups whose payloads have ``digests``, in order (named
        by its content: appending the same groups again names the same pack)."""
        h = hashlib.sha256("".join(digests).encode()).hexdigest()[:40]
        return f"{self.prefix}/groups/pack-{h}.bin"

    @property
    def _consumed_key(self) -> str:
        return f"{self.prefix}/consumed.json"

    # -- reading the index -------------------------------------------------------------

    def _ingest(self, records: Iterable[dict[str, Any]]) -> None:
        wm = self._state.watermark
        for rec in records:
            entry = entry_from(rec, f"position {rec.get('position')}")
            if entry.position != self._head:
                raise SampleBufferError(
                    f"buffer index skipped from position {self._head} to {entry.position}"
                )
            self._head += 1
            first = self._ids.setdefault(entry.group_id, entry.position)
            dup = first != entry.position
            if entry.position >= wm:
                self._pending.append((entry, dup))
                if self._arrivals is not None and not dup:
                    self._arrivals.append(entry)

    def _catch_up(self) -> None:
        if self.layout == "shards" and self.merger:
            self._ingest(self._merge())
        elif self._jsonl is not None:
            self._ingest(self._jsonl.read_new())
        else:
            assert self._objects is not None
            self._ingest(self._objects.read_new())

    def _fetch_state(self) -> Optional[tuple[bytes, str]]:
        """consumed.json's bytes and version, None when absent (a read; no state changes)."""
        try:
            return self.store.get_versioned(self._consumed_key)
        except NotFoundError:
            return None

    def _read_state(self, fetched: Optional[tuple[bytes, str]]) -> ConsumedState:
        """The state of what :meth:`_fetch_state` returned (None: no consumed.json yet)."""
        if fetched is None:
            self._state_version = None
            self._own_state = False
            return ConsumedState()
        raw, version = fetched
        if version != self._state_version:
            self._own_state = False
        self._state_version = version
        if raw == self._state_raw:
            return self._state
        state = serde.loads(raw, ConsumedState, what="buffer consumed state", root="consumed.json")
        self._state_raw = raw
        return state

    def _refresh_state(self) -> None:
        self._apply_state(self._read_state(self._fetch_state()))

    def _apply_state(self, state: ConsumedState) -> None:
        old = self._state
        self._state = state
        if state.watermark < self._pending_start(old):
            self._reload()
            return
        while self._pending and self._pending[0][0].position < state.watermark:
            self._pending.popleft()

    def _pending_start(self, state: ConsumedState) -> int:
        return self._pending[0][0].position if self._pending else max(state.watermark, self._head)

    def _reload(self) -> None:
        """Re-read the index from the start (after the watermark moved back: a restore)."""
        self._reloads += 1
        self._ids, self._head, self._pending = {}, 0, collections.deque()
        if self._jsonl is not None:
            self._jsonl.reset_reader()
            if self.layout == "shards":
                self._merged_seq = {}
                self._shard_readers = {}
        if self._objects is not None:
            self._objects.reset_reader()
        self._catch_up()
        self._sync_writer()

    def _sync_writer(self) -> None:
        """Start the appender's cursor where the reader's is (every id before it is known)."""
        if self._writer is not None and self._objects is not None:
            self._writer.count, self._writer.last_key = self._objects.count, self._objects.last_key

    def _update(self, *, check_end: bool = False) -> bool:
        """Read consumed.json, then the new index records (``check_end``: and DATA_END;
        returns :meth:`data_ended` then, else False).

        On a remote store with the ``objects`` index the reads that do not depend on
        each other (consumed.json, the index listing, DATA_END) go at once: one round
        trip instead of three; the records listed are then read together.
        """
        objects = self._objects
        if objects is None or self.layout != "objects" or not is_remote(self.store):
            self._refresh_state()
            self._catch_up()
            return self.data_ended() if check_end else False
        jobs: list[Callable[[], Any]] = [self._fetch_state, objects.list_new]
        if check_end and not self._data_ended:
            jobs.append(lambda: self.store.exists(f"{self.prefix}/DATA_END"))
        results = map_all(self.store, lambda job: job(), jobs)
        if len(results) > 2 and results[2]:
            self._data_ended = True
        reloads = self._reloads
        self._apply_state(self._read_state(results[0]))
        if self._reloads == reloads:  # a reload re-read the index itself: the listing is old
            self._ingest(objects.read_new(listed=results[1]))
        return check_end and self._data_ended

    # -- shards ------------------------------------------------------------------------

    def _merge(self) -> list[dict[str, Any]]:
        assert self._jsonl is not None
        return merge_shards(self._jsonl, self._shards_dir, self._shard_readers, self._merged_seq)

    # -- port --------------------------------------------------------------------------

    def watch(self) -> Any:
        """A watch on the buffer's prefix (new index records, commits): the store's."""
        return self.store.watch(self.prefix)

    @property
    @_serialized
    def watermark(self) -> int:
        if not self._own_state:
            self._refresh_state()
        return self._state.watermark

    @property
    @_serialized
    def head_position(self) -> int:
        """The number of positions in the (merged) index."""
        self._catch_up()
        return self._head

    def entries(self, start: int = 0) -> list[GroupEntry]:
        """Every entry from ``start`` on, read from the index (O(history); tests and tools;
        the ``objects`` index fetches only the objects this buffer has not kept)."""
        if self._jsonl is not None:
            reader = JsonlIndex(self._jsonl.path, fsync=False)
        else:
            reader = ObjectsIndex(  # type: ignore[assignment]
                self.store, self.prefix, cache=self._index_cache
            )
        out = [entry_from(r, "index") for r in reader.read_new()]
        if isinstance(reader, JsonlIndex):
            reader.close()
        return [e for e in out if e.position >= start]

    def unreferenced_payloads(self) -> list[str]:
        """The payload objects (``groups/...``) that no index record names, in key order: a
        pack or payload written by an append that stopped before its index record (a
        crash; readers never see it). Reads the whole index and lists the payloads
        (O(history); tools and tests). One may be deleted once no appender can still be
        writing its record (its process is gone); nothing in yeto deletes them."""
        named = {e.payload for e in self.entries()}
        return [k for k in self.store.list(f"{self.prefix}/groups/") if k not in named]

    def reader_copy(self) -> Optional[FileSampleBuffer]:
        """On a remote store, a read-only buffer on the same store and prefix with its own
        reader state and lock (a sampler reads the backlog through it while it appends
        through this one); None on a local store."""
        if not is_remote(self.store):
            return None
        return FileSampleBuffer(
            self.store,
            prefix=self.prefix,
            layout=self.layout,
            host=self.host,
            clock=self.clock,
            read_only=True,
            index_cache=self._index_cache,
        )

    def _reads_ahead(self) -> bool:
        """The index is read ahead (:meth:`prefetch`): the ``objects`` layout, remote."""
        return self._objects is not None and self.layout == "objects" and is_remote(self.store)

    def _index_ahead(self) -> None:
        if self._reads_ahead():
            self._catch_up()

    @_serialized
    def select(self, spec: RoundSpec) -> BufferRound:
        self._stop_ahead()  # the take a read-ahead read for has come
        with stage("buffer.select"):
            if self._own_state and self._reads_ahead():
                # the index records read ahead hold a whole round: the same round a read
                # now would give (it takes positions in order from the watermark, which
                # is this object's own last commit; the commit's swap checks it still is)
                rnd = plan_round(self._pending, self._state.watermark, spec)
                if len(rnd.entries) >= spec.max_groups:
                    PROFILE.count("buffer.select_read_ahead")
                    return rnd
                # consumed.json is still this object's own last commit: the index only
                self._catch_up()
                return plan_round(self._pending, self._state.watermark, spec)
            self._update()
            return plan_round(self._pending, self._state.watermark, spec)

    @_serialized
    def commit(self, round: BufferRound) -> int:
        if self.read_only:
            raise SampleBufferError("this buffer was opened read-only; open it without read_only")
        if not self._own_state:  # else: our own last commit; the swap below checks it still is
            self._refresh_state()
        state = self._state
        if round.start != state.watermark:
            raise SampleBufferError(
                f"round starts at {round.start} but the watermark is {state.watermark}: another "
                "trainer committed or reset_to ran since select. Select again"
            )
        if round.end < round.start or round.end > self._head:
            raise SampleBufferError(f"round end {round.end} is outside {round.start}..{self._head}")
        stale = tuple(e.position for e in round.stale)
        new = attrs.evolve(
            state,
            watermark=round.end,
            stale_total=state.stale_total + len(stale),
            duplicate_total=state.duplicate_total + len(round.duplicates),
            stale_tail=(state.stale_tail + stale)[-STALE_TAIL:],
            updated_at=float(self.clock()),
        )
        with stage("buffer.commit_write"):
            self._write_state(new)
        self._own_state = True
        return new.watermark

    def _write_state(self, state: ConsumedState) -> None:
        raw = serde.dumps(state).encode()
        self._own_state = False  # until this write is known to have landed
        version = self.store.put_if_match(self._consumed_key, raw, self._state_version)
        if version is None:
            raise SampleBufferError(
                f"{self._consumed_key} changed in the store since this trainer read it: another "
                "trainer or head committed to this buffer meanwhile (only one may; a head fenced "
                "by a newer one must stop). Nothing was written; read the buffer again"
            )
        self._state_version = version
        self._state_raw = raw
        self._apply_state(state)

    @_serialized
    def reset_to(self, watermark: int) -> None:
        if self.read_only:
            raise SampleBufferError("this buffer was opened read-only; open it without read_only")
        self._update()
        if not 0 <= watermark <= self._head:
            raise SampleBufferError(
                f"reset_to({watermark}): the buffer holds positions 0..{self._head - 1}; a cut's "
                "watermark can't be past the head. Is this the right run's store?"
            )
        state = self._state
        self._write_state(
            attrs.evolve(
                state,
                watermark=watermark,
                resets=state.resets + 1,
                stale_tail=tuple(p for p in state.stale_tail if p < watermark),
                updated_at=float(self.clock()),
            )
        )

    @_serialized
    def backlog(
        self,
        current_version: Optional[int] = None,
        max_policy_age: Optional[int] = None,
        fenced: Optional[Callable[[str, int], bool]] = None,
    ) -> Backlog:
        """What waits after the watermark (with a version and age: only what is selectable;
        with ``fenced``, not the groups of fenced sampler incarnations).

        Cost: O(new index records + backlog), independent of the history.
        """
        return self._backlog(current_version, max_policy_age, fenced, check_end=True)

    @_serialized
    def backlog_without_end(
        self,
        current_version: Optional[int] = None,
        max_policy_age: Optional[int] = None,
        fenced: Optional[Callable[[str, int], bool]] = None,
    ) -> Backlog:
        """:meth:`backlog` without reading ``DATA_END`` (one request less on a remote
        store): ``data_ended`` is what this object knows already."""
        return self._backlog(current_version, max_policy_age, fenced, check_end=False)

    def _backlog(
        self,
        current_version: Optional[int],
        max_policy_age: Optional[int],
        fenced: Optional[Callable[[str, int], bool]],
        *,
        check_end: bool,
    ) -> Backlog:
        self._update(check_end=check_end)
        ended = self._data_ended
        groups = samples = 0
        oldest_v: Optional[int] = None
        oldest_t: Optional[float] = None
        gate = current_version is not None and max_policy_age is not None
        for entry, dup in self._pending:
            if dup:
                continue
            if gate and current_version - entry.min_version > max_policy_age:  # type: ignore[operator]
                continue
            if fenced is not None and fenced(entry.host, entry.incarnation):
                continue
            groups += 1
            samples += entry.n_samples
            if oldest_v is None or entry.min_version < oldest_v:
                oldest_v = entry.min_version
            if oldest_t is None or entry.appended_at < oldest_t:
                oldest_t = entry.appended_at
        return Backlog(
            groups=groups,
            samples=samples,
            watermark=self._state.watermark,
            head_position=self._head,
            oldest_version=oldest_v,
            oldest_appended_at=oldest_t,
            data_ended=ended,
        )

    @_serialized
    def poll_arrivals(self, callback: Callable[[GroupEntry], None]) -> int:
        """Call ``callback`` for each group appended since the last poll.

        The first poll reports every group waiting after the watermark.
        """
        if self._arrivals is None:
            self._update()
            self._arrivals = collections.deque(e for e, dup in self._pending if not dup)
        else:
            self._catch_up()
        n = 0
        while self._arrivals:
            callback(self._arrivals.popleft())
            n += 1
        return n

    def mark_data_end(self) -> None:
        self.store.put(f"{self.prefix}/DATA_END", serde.dumps({"time": self.clock()}).encode())
        self._data_ended = True

    def data_ended(self) -> bool:
        if not self._data_ended:
            self._data_ended = self.store.exists(f"{self.prefix}/DATA_END")
        return self._data_ended

    @_serialized
    def stats(self) -> dict[str, Any]:
        """Everything ``yeto buffer stats`` shows."""
        b = self.backlog()
        hosts: dict[str, int] = {}
        dups = 0
        for entry, dup in self._pending:
            dups += dup
            hosts[entry.host] = hosts.get(entry.host, 0) + 1
        st = self._state
        return {
            "layout": self.layout,
            "head_position": b.head_position,
            "watermark": b.watermark,
            "backlog_groups": b.groups,
            "backlog_samples": b.samples,
            "oldest_version": b.oldest_version,
            "oldest_appended_at": b.oldest_appended_at,
            "stale_total": st.stale_total,
            "duplicate_total": st.duplicate_total,
            "duplicates_waiting": dups,
            "stale_recent": list(st.stale_tail[-10:]),
            "resets": st.resets,
            "data_ended": b.data_ended,
            "waiting_by_host": dict(sorted(hosts.items())),
        }

    def close(self) -> None:
        self._stop_ahead()
        for idx in (self._jsonl, self._shard, *self._shard_readers.values()):
            if idx is not None:
                idx.close()


def open_buffer(store: ObjectStore, **options: Any) -> FileSampleBuffer:
    """Open the ``file`` buffer of a run's store (``plugins.open_store(url)`` opens the store)."""
    if not isinstance(store, ObjectStore):
        raise SampleBufferError(
            f"open_buffer takes an ObjectStore, not {store!r}; open the store with "
            "plugins.open_store(url) first"
        )
    return FileSampleBuffer(store, **options)
