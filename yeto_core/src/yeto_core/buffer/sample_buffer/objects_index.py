"""The ``objects`` index: objects of one or more records, positions taken with ``put_if_absent``.

Object ``index/<p:012d>.json`` holds the records of positions ``p .. p+n-1``, one checked
JSON line each (:func:`~yeto_core.buffer.sample_buffer.codec.encode_record`): ``append`` writes
objects of one record, ``append_many`` (a sampler call's group commit) one object for the
call, so a call costs one index request instead of one per group.

Index objects are immutable (created whole with ``put_if_absent``, never rewritten or
deleted): the cursors of one process (a sampler's appender, its reader, the copy that
reads the backlog ahead) share an :class:`IndexCache` of the objects read or written,
so each object is fetched once per process, and an appender's own objects never.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional

from yeto_core.buffer.sample_buffer.codec import decode_record, encode_record, quarantined_record
from yeto_core.errors import NotFoundError, SampleBufferError
from yeto_core.ports import ObjectStore
from yeto_core.records import Event
from yeto_core.stores.log import StoreLog
from yeto_core.stores.parallel import get_all

log = logging.getLogger("yeto.buffer")


class IndexCache:
    """The bytes of the newest index objects read or created (immutable: a copy is as good
    as a read), by key; the oldest ``size`` beyond are dropped. Thread-safe."""

    def __init__(self, size: int = 256) -> None:
        self.size = int(size)
        self._objects: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Optional[bytes]:
        with self._lock:
            return self._objects.get(key)

    def put(self, key: str, raw: bytes) -> None:
        with self._lock:
            self._objects[key] = raw
            self._objects.move_to_end(key)
            while len(self._objects) > self.size:
                self._objects.popitem(last=False)


class ObjectsIndex:
    """The index as a :class:`StoreLog` of ``<position:012d>.json`` objects (one or more
    records each, see the module docstring).

    :param cache: objects already read or created, shared with the other cursors of this
        process (None: every object is fetched)."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        *,
        events: Optional[list[Event]] = None,
        cache: Optional[IndexCache] = None,
    ) -> None:
        self.store = store
        self.cache = cache
        self.events = events if events is not None else []
        self.quarantined = 0  # complete records that failed their checksum
        self.log = StoreLog(store, f"{prefix}/index", width=12)
        self.dir = self.log.dir
        self.count = 0  # reader: the next position to read
        self.last_key: Optional[str] = None
        self._next: Optional[int] = None  # appender: the next position to try

    def key(self, position: int) -> str:
        return self.log.key(position)

    def reset_reader(self) -> None:
        self.count, self.last_key = 0, None

    def _position_of(self, key: str) -> int:
        pos = self.log.seq_of(key)
        if pos is None:
            raise SampleBufferError(
                f"unexpected object {key!r} in the buffer index; only <position>.json belongs there"
            )
        return pos

    def list_new(self) -> list[str]:
        """The keys of the index objects after the cursor, in key order (a read).

        An object holds one or more positions, so whether the keys follow the cursor
        without a gap is known only from their contents: :meth:`read_new` checks it
        (and refuses a key that is no ``<position>.json``).
        """
        return list(self.store.list(self.dir, after=self.last_key))

    def read_new(self, listed: Optional[list[str]] = None) -> list[dict[str, Any]]:
        """The records after the cursor, in order; the cursor moves past exactly those.

        ``listed``: what :meth:`list_new` returned at this cursor (default: list now).
        Reading stops at the first object that does not start where the one before it
        ended (a listing that raced a creation: it is read next time). The cursor moves
        only when the records are returned: a store call that fails midway (the caller
        retries) leaves it where it was, so no record is skipped.
        """
        out: list[dict[str, Any]] = []
        count, last_key = self.count, self.last_key
        keys = self.list_new() if listed is None else listed
        # the objects' gets overlap on a remote store (one round trip for many)
        for key, raw in zip(keys, self._get_objects(keys), strict=True):
            pos = self._position_of(key)
            if pos > count:
                break  # not visible yet: the listing raced a creation
            if pos < count:
                raise SampleBufferError(
                    f"index object {key!r} starts at position {pos}, but the object before "
                    f"it holds positions up to {count - 1}: two writers that do not share "
                    "this index format (yeto before batched index objects?) or an edited "
                    "index. Restore it"
                )
            recs = self._records(key, pos, raw)
            out.extend(recs)
            count += len(recs)
            last_key = key
        self.count, self.last_key = count, last_key
        return out

    def _get_objects(self, keys: list[str]) -> list[bytes]:
        """The bytes of the index objects ``keys``: from the cache, the others fetched at
        once (and cached)."""
        if self.cache is None:
            return get_all(self.store, keys)
        have = {key: self.cache.get(key) for key in keys}
        missing = [key for key, raw in have.items() if raw is None]
        for key, raw in zip(missing, get_all(self.store, missing), strict=True):
            self.cache.put(key, raw)
            have[key] = raw
        return [have[key] for key in keys]  # type: ignore[misc]

    def _create(self, pos: int, raw: bytes) -> bool:
        """Create the object at ``pos`` (``put_if_absent``); cached when this call made it."""
        if not self.log.create(pos, raw):
            return False
        if self.cache is not None:
            self.cache.put(self.key(pos), raw)
        return True

    def _records(self, key: str, pos: int, raw: bytes) -> list[dict[str, Any]]:
        """The records of the index object ``key`` at position ``pos``: positions
        ``pos .. pos + span - 1`` (:func:`object_span`), a quarantined stand-in for
        each one whose line fails its checksum."""
        lines, decoded = decoded_lines(raw)
        if all(r is not None for r in decoded):
            recs = [r for r in decoded if r is not None]
            for i, rec in enumerate(recs):
                if rec.get("position") != pos + i:
                    raise SampleBufferError(
                        f"index object {key!r} names position {rec.get('position')!r}, not "
                        f"{pos + i}; objects are created whole, so it was moved or edited. "
                        "Restore it"
                    )
            return recs
        # Objects are created whole: one with a line that fails its checksum was damaged
        # afterwards. Its positions stay taken, the failing ones by quarantined stand-ins.
        span = object_span(pos, lines, decoded)
        placed: dict[int, dict[str, Any]] = {}
        for rec in decoded:
            if rec is None:
                continue
            p = rec.get("position")
            if not isinstance(p, int) or not pos <= p < pos + span or p in placed:
                raise SampleBufferError(
                    f"index object {key!r} (positions {pos}..{pos + span - 1}) holds a record "
                    f"naming position {p!r}; it was moved or edited. Restore it"
                )
            placed[p] = rec
        return [
            placed[p] if p in placed else self._quarantine(key, p, raw)
            for p in range(pos, pos + span)
        ]

    def _quarantine(self, key: str, pos: int, raw: bytes) -> dict[str, Any]:
        """The stand-in record of an index object that fails its checksum (counted)."""
        self.quarantined += 1
        log.warning(
            "index object %r (position %d) fails its checksum; it is quarantined "
            "(its group is skipped as 'quarantined')",
            key,
            pos,
        )
        self.events.append(
            Event(
                kind="buffer.index_line_quarantined",
                time=time.time(),
                source=key,
                data={
                    "key": key,
                    "position": pos,
                    "bytes": len(raw),
                    "head": raw[:80].hex(),
                    "quarantined": self.quarantined,
                },
            )
        )
        return quarantined_record(pos)

    def append(self, make: Callable[[int], dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        """Take the next free position: ``p`` only after ``p-1`` is seen taken (dense)."""
        return self.append_many([make])[0]

    def append_many(
        self, makes: Sequence[Callable[[int], dict[str, Any]]]
    ) -> list[tuple[int, dict[str, Any]]]:
        """Take the next ``len(makes)`` free positions with **one** object (one
        ``put_if_absent``): its records, one line each, hold positions ``p .. p+n-1``.

        ``p`` is tried only after the object ending at ``p-1`` is seen (dense: nobody can
        take a position inside another's object, because taking ``q`` needs the object
        that ends at ``q-1``). The object is created whole, so a crash leaves all of the
        records or none. Losing the race for ``p`` means listing after it, reading the
        newest object (it may hold several positions) and trying where it ends.
        """
        if not makes:
            return []
        if self._next is None:
            self._next = self._free_after(self.last_key)
        pos = self._next
        while True:
            recs = [make(pos + i) for i, make in enumerate(makes)]
            if self._create(pos, b"".join(encode_record(r) for r in recs)):
                self._next = pos + len(recs)
                return [(pos + i, r) for i, r in enumerate(recs)]
            pos = self._free_after(self.key(pos))

    def create_at_end(
        self, makes: Sequence[Callable[[int], dict[str, Any]]]
    ) -> Optional[list[tuple[int, dict[str, Any]]]]:
        """Create one object holding positions ``count .. count+n-1`` (the end of what
        this reader has read); its records, or None when the position is taken (another
        appender wrote there since: :meth:`read_new` reads it, then try again).

        The appender of packs reads the index to its end before each try, so it knows
        every id appended before the position it takes (exact dedup across processes:
        two appenders of one id race for one position, and the loser reads the winner's
        record). The cursor moves past the object created."""
        if not makes:
            return []
        pos = self.count
        recs = [make(pos + i) for i, make in enumerate(makes)]
        if not self._create(pos, b"".join(encode_record(r) for r in recs)):
            return None
        self.count, self.last_key = pos + len(recs), self.key(pos)
        return [(pos + i, r) for i, r in enumerate(recs)]

    def _free_after(self, after: Optional[str]) -> int:
        """The first position no index object holds, from a listing after key ``after``
        (``after`` itself exists, or is the reader's cursor) and a read of the newest
        object listed (or of ``after`` when none is listed after it)."""
        last = None
        for key in self.log.keys(after):
            last = key
        if last is None:
            if after is None or after == self.last_key:
                return self.count  # the reader's cursor is at the end of what exists
            last = after
        pos = self._position_of(last)
        try:
            raw = self._get_objects([last])[0]
        except NotFoundError:
            raise SampleBufferError(
                f"index object {last!r} was listed and is gone: nothing deletes index "
                "objects, so someone removed it. Restore it"
            ) from None
        return pos + object_span(pos, *decoded_lines(raw))


def object_lines(raw: bytes) -> list[bytes]:
    """The lines of an index object (each one record, as :func:`encode_record` ends it)."""
    lines = raw.split(b"\n")
    if len(lines) > 1 and not lines[-1]:
        lines.pop()  # the newline that ends the last record
    return lines


def decoded_lines(raw: bytes) -> tuple[list[bytes], list[Optional[dict[str, Any]]]]:
    """An index object's lines and each one's record (None: it fails its checksum)."""
    lines = object_lines(raw)
    return lines, [decode_record(line) for line in lines]


def object_span(pos: int, lines: list[bytes], decoded: Sequence[Optional[dict[str, Any]]]) -> int:
    """How many positions the index object at ``pos`` holds.

    An intact object: one per line. A damaged one (a byte changed after it was created):
    when its last line passes its checksum, that record's position says where the object
    ends (a line break turned into another byte merges two lines, not two positions);
    else the number of lines (the damage is in the last line, so the line breaks before it
    are intact). Readers and appenders decide the same from the same bytes.
    """
    last = decoded[-1] if decoded else None
    if last is not None and isinstance(last.get("position"), int) and last["position"] >= pos:
        return int(last["position"]) - pos + 1
    return max(1, len(lines))
