"""The ``objects`` index: one object per record, positions taken with ``put_if_absent``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Optional

from yeto_core.errors import SampleBufferError
from yeto_core.ports import ObjectStore
from yeto_core.records import Event
from yeto_core.sample_buffer.codec import decode_record, encode_record, quarantined_record
from yeto_core.stores.log import StoreLog
from yeto_core.stores.parallel import get_all

log = logging.getLogger("yeto.buffer")


class ObjectsIndex:
    """One object per index record (a :class:`StoreLog` of ``<position:012d>.json``)."""

    def __init__(
        self, store: ObjectStore, prefix: str, *, events: Optional[list[Event]] = None
    ) -> None:
        self.store = store
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
        """The keys of the records after the cursor that follow it without a gap (a read)."""
        keys: list[str] = []
        for key in self.store.list(self.dir, after=self.last_key):
            if self._position_of(key) != self.count + len(keys):
                break  # not visible yet (listing raced a creation); read it next time
            keys.append(key)
        return keys

    def read_new(self, listed: Optional[list[str]] = None) -> list[dict[str, Any]]:
        """The records after the cursor, in order; the cursor moves past exactly those.

        ``listed``: what :meth:`list_new` returned at this cursor (default: list now).
        The cursor moves only when the records are returned: a store call that fails
        midway (the caller retries) leaves it where it was, so no record is skipped.
        """
        out = []
        count, last_key = self.count, self.last_key
        keys = self.list_new() if listed is None else listed
        # the records' gets overlap on a remote store (one round trip for many)
        for key, raw in zip(keys, get_all(self.store, keys), strict=True):
            pos = count
            rec = decode_record(raw)
            if rec is None:
                # Objects are created whole: one that fails its checksum was damaged
                # afterwards. Its position stays taken by a quarantined stand-in.
                rec = self._quarantine(key, pos, raw)
            if rec.get("position") != pos:
                raise SampleBufferError(
                    f"index object {key!r} names position {rec.get('position')!r}, not {pos}; "
                    "objects are created whole, so it was moved or edited. Restore it"
                )
            out.append(rec)
            count += 1
            last_key = key
        self.count, self.last_key = count, last_key
        return out

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
        if self._next is None:
            last = self.log.last_seq(self.last_key)
            self._next = self.count if last is None else last + 1
        pos = self._next
        while True:
            rec = make(pos)
            if self.log.create(pos, encode_record(rec)):
                self._next = pos + 1
                return pos, rec
            # Lost the race for ``pos``: every position up to the newest listed one is taken.
            last = self.log.last_seq(self.key(pos))
            pos = pos + 1 if last is None else last + 1
