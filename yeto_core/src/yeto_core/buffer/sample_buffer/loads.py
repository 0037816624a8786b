"""The read path of the ``file`` sample buffer: :class:`BufferLoads`, a mixin of
:class:`~yeto_core.buffer.sample_buffer.buffer.FileSampleBuffer`.

``load`` and ``load_many`` read a group's payload object (a pack: the group's slice),
check it against the digest its index record took at append and decode it.
``prefetch`` reads ahead, on a thread, on a remote store: the index records appended
since the last read, then the next round's payload objects. A later select finds a
full round in those records without a round trip, and a later load takes those bytes
instead of one (and checks them alike).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Optional

from yeto_core.buffer.group_codec import decode_group
from yeto_core.buffer.sample_buffer.append import _digest
from yeto_core.errors import NotFoundError, SampleBufferError
from yeto_core.records import CORRUPT_INDEX_HOST, GroupEntry, SampleGroup
from yeto_core.stage_profile import PROFILE, stage
from yeto_core.stores.parallel import is_remote, overlapped

#: a read-ahead short of a round reads the index again after this many seconds ...
READ_AGAIN_S = 0.05
#: ... at most this many times (2 s: a round's training), unless a select stops it first
READ_AGAIN_MAX = 40

#: how many packs' bytes a buffer object keeps after reading them (a sampler call's groups:
#: a few MiB each at most)
PACKS_KEPT = 4


def _is_pack(key: str) -> bool:
    return key.rsplit("/", 1)[-1].startswith("pack-")


class BufferLoads:
    """Reading groups from the buffer (the mixin's host holds the store, the lock and
    the reader state ``_pending``)."""

    _ahead: Optional[dict[str, bytes]] = None  # payload key -> bytes read ahead
    _ahead_thread: Optional[threading.Thread] = None
    #: the keys the running thread reads (None: not chosen yet)
    _ahead_keys: Optional[frozenset[str]] = frozenset()
    #: set when the take the running read-ahead reads for has come: no further index read
    _ahead_stop: Optional[threading.Event] = None
    #: guards ``_ahead`` (not the buffer's lock: loads run on worker threads, and the
    #: buffer's lock may be held by the thread waiting for them)
    _ahead_lock = threading.Lock()
    #: pack key -> bytes of the packs read last (see :meth:`_keep_pack`)
    _packs: Optional[collections.OrderedDict[str, bytes]] = None

    def _index_ahead(self) -> None:
        """Read the index records appended since the last read (the host's; called by the
        read-ahead thread with the buffer's lock held). Default: nothing."""

    def prefetch(self, start: int, n: int) -> None:
        """Read ahead on one thread (a remote store only) and return at once: the index
        records appended since the last read, then the payloads of the first ``n``
        waiting groups from ``start`` on. While fewer than ``n`` groups wait there, the
        thread reads the index again every :data:`READ_AGAIN_S` (at most
        :data:`READ_AGAIN_MAX` times) and reads the payloads of the groups it finds,
        until the next select (the take it read ahead for) stops it: the groups samplers
        append while a round trains are read off the trainer's path too. A read-ahead
        still running (not stopped) makes this a no-op; else what the last one read and
        no load took is dropped (so at most one round's payloads are kept)."""
        if n <= 0 or not is_remote(self.store):
            return
        running = self._ahead_thread
        if running is not None and running.is_alive():
            stop = self._ahead_stop
            if stop is None or not stop.is_set():
                return
            running.join()  # stopped by the select: it ends with the request it is in
        stop = threading.Event()
        with self._ahead_lock:
            self._ahead = {}
            self._ahead_keys = None
        thread = threading.Thread(
            target=self._read_ahead, args=(start, n, stop), name="yeto-buffer-prefetch", daemon=True
        )
        self._ahead_thread, self._ahead_stop = thread, stop
        thread.start()

    def _stop_ahead(self) -> None:
        """Stop a read-ahead's further index reads (the take it read ahead for has come)."""
        stop = self._ahead_stop
        if stop is not None:
            stop.set()

    def _read_ahead(self, start: int, n: int, stop: threading.Event) -> None:
        read: set[str] = set()
        for _ in range(READ_AGAIN_MAX + 1):
            keys, groups = self._ahead_pass(start, n, read)
            with self._ahead_lock:
                self._ahead_keys = frozenset(read | set(keys))
            if keys:
                got = overlapped(self.store, self.store.get, keys)
                read.update(keys)
                with self._ahead_lock:
                    ahead = self._ahead if self._ahead is not None else {}
                    for key, (data, exc) in zip(keys, got, strict=True):
                        if exc is None and isinstance(data, bytes):
                            ahead[key] = data  # a failed read is read again by the load
                    self._ahead = ahead
            if groups >= n or stop.wait(READ_AGAIN_S):
                return

    def _ahead_pass(self, start: int, n: int, read: set[str]) -> tuple[list[str], int]:
        """Read the index ahead; (the payload keys of the first ``n`` groups waiting from
        ``start`` on not read yet, how many groups wait there up to ``n``)."""
        keys: list[str] = []
        groups = 0
        # not blocking: a caller holding the lock may be waiting for this thread
        if not self._lock.acquire(timeout=1.0):
            return keys, groups
        try:
            try:
                self._index_ahead()
            except Exception:  # the next select reads the index itself, and says why
                pass
            with self._ahead_lock:
                kept = set(self._packs or ()) | read
            for entry, dup in self._pending:
                if groups >= n:
                    break
                if entry.position < start or dup or entry.host == CORRUPT_INDEX_HOST:
                    continue
                groups += 1
                # a pack holds several groups (read once); one kept is not read again
                if entry.payload and entry.payload not in keys and entry.payload not in kept:
                    keys.append(entry.payload)
        finally:
            self._lock.release()
        return keys, groups

    def _cached_pack(self, key: str) -> Optional[bytes]:
        """The bytes of pack ``key`` if a load or a read-ahead read it lately."""
        if not _is_pack(key):
            return None
        with self._ahead_lock:
            packs = self._packs
            data = packs.get(key) if packs is not None else None
            if data is not None:
                packs.move_to_end(key)  # type: ignore[union-attr]
        if data is not None:
            PROFILE.count("buffer.pack_cache_hit")
        return data

    def _keep_pack(self, key: str, data: bytes) -> None:
        """Keep the bytes of pack ``key`` (the last :data:`PACKS_KEPT` ones): a round that
        takes part of a pack, and the next that takes the rest, read it once. A pack is
        never rewritten (named by its content, created if absent), and every group taken
        from it is still checked against its record's digest. Remote stores only (a
        local read costs no round trip, and a damaged file is then seen at once)."""
        if not _is_pack(key) or not is_remote(self.store):
            return
        with self._ahead_lock:
            if self._packs is None:
                self._packs = collections.OrderedDict()
            self._packs[key] = data
            self._packs.move_to_end(key)
            while len(self._packs) > PACKS_KEPT:
                self._packs.popitem(last=False)

    def _wait_ahead(self, keys: Any) -> None:
        """Wait for a running read-ahead that reads any of ``keys`` (it started before:
        it answers sooner than a new round trip would)."""
        self._stop_ahead()
        thread = self._ahead_thread
        chosen = self._ahead_keys
        if (
            thread is not None
            and thread.is_alive()
            and (chosen is None or not chosen.isdisjoint(keys))
        ):
            with stage("buffer.prefetch_wait"):
                thread.join()

    def load_many(self, entries: Any) -> Any:
        """The groups of ``entries`` read at once: each payload object is read once (the
        groups of one pack come from one read) and on a remote store the ``get`` round
        trips overlap (:meth:`load` reads and decodes only, so it may run in several
        threads at once). None on a local store when no entry is packed (each group is
        then loaded when it is admitted)."""
        entries = list(entries)
        self._wait_ahead({e.payload for e in entries})
        packed = any(e.length >= 0 for e in entries)
        if not packed:
            if not is_remote(self.store):
                return None
            return overlapped(self.store, self.load, entries)
        keys = list(dict.fromkeys(e.payload for e in entries))
        fetched = dict(zip(keys, overlapped(self.store, self._fetch, keys), strict=True))
        out: list[tuple[Optional[SampleGroup], Optional[BaseException]]] = []
        for e in entries:
            data, exc = fetched[e.payload]
            if exc is None:
                try:
                    out.append((self._group_of(e, data), None))  # type: ignore[arg-type]
                    continue
                except Exception as err:  # the error its load would raise
                    exc = err
            out.append((None, exc))
        return out

    def load(self, entry: GroupEntry) -> SampleGroup:
        """The group of ``entry``, with numpy arrays."""
        return self._group_of(entry, self._fetch(entry.payload, entry))

    def _fetch(self, key: str, entry: Optional[GroupEntry] = None) -> bytes:
        ahead = self._ahead
        if ahead:
            with self._ahead_lock:
                data = ahead.pop(key, None)
            if data is not None:
                PROFILE.count("buffer.prefetch_hit")
                self._keep_pack(key, data)
                return data
        cached = self._cached_pack(key)
        if cached is not None:
            return cached
        try:
            with stage("buffer.load_get"):
                data = self.store.get(key)
            self._keep_pack(key, data)
            return data
        except NotFoundError:
            at = f" of position {entry.position}" if entry is not None else ""
            raise SampleBufferError(
                f"payload {key!r}{at} is missing from the store; the buffer was pruned or "
                "copied partially"
            ) from None

    def _group_of(self, entry: GroupEntry, data: bytes) -> SampleGroup:
        """The group of ``entry`` in ``data``, its payload object (a pack: its slice),
        checked against the record's digest and group id."""
        where = entry.payload
        if entry.length >= 0:
            where = f"{entry.payload}[{entry.offset}:{entry.offset + entry.length}]"
            if entry.offset < 0 or entry.offset + entry.length > len(data):
                raise SampleBufferError(
                    f"pack {entry.payload!r} holds {len(data)} bytes, but position "
                    f"{entry.position} names bytes {entry.offset}..{entry.offset + entry.length}"
                    ": the object was truncated or replaced in the store"
                )
            data = data[entry.offset : entry.offset + entry.length]
        if entry.digest and _digest(data) != entry.digest:
            raise SampleBufferError(
                f"payload {where!r} of position {entry.position} does not match the "
                f"digest its index record took at append (sha256 {_digest(data)[:16]}..., "
                f"recorded {entry.digest[:16]}...): the object was damaged in the store"
            )
        group = decode_group(data, where=where)
        if group.group_id != entry.group_id:
            raise SampleBufferError(
                f"payload {where!r} holds group {group.group_id!r}, index says {entry.group_id!r}"
            )
        return group
