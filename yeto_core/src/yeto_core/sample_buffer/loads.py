"""The read path of the ``file`` sample buffer: :class:`BufferLoads`, a mixin of
:class:`~yeto_core.sample_buffer.buffer.FileSampleBuffer`.

``load`` and ``load_many`` read a group's payload object (a pack: the group's slice),
check it against the digest its index record took at append and decode it.
"""

from __future__ import annotations

from typing import Any, Optional

from yeto_core.errors import NotFoundError, SampleBufferError
from yeto_core.group_codec import decode_group
from yeto_core.records import GroupEntry, SampleGroup
from yeto_core.sample_buffer.append import _digest
from yeto_core.stage_profile import stage
from yeto_core.stores.parallel import is_remote, overlapped


class BufferLoads:
    """Reading groups from the buffer (the mixin's host holds the store)."""

    def load_many(self, entries: Any) -> Any:
        """The groups of ``entries`` read at once: each payload object is read once (the
        groups of one pack come from one read) and on a remote store the ``get`` round
        trips overlap (:meth:`load` reads and decodes only, so it may run in several
        threads at once). None on a local store when no entry is packed (each group is
        then loaded when it is admitted)."""
        entries = list(entries)
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
        try:
            with stage("buffer.load_get"):
                return self.store.get(key)
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
