"""The durable sample buffer: rollout groups appended by samplers, taken in rounds by the trainer.

Store layout under ``prefix`` (default ``buffer``)::

    groups/<group_id>.safetensors   one payload per group (see yeto_core.group_codec)
    index.jsonl                     layout "jsonl": one line per group (and the merged
                                    index of layout "shards")
    index/<position:012d>.json      layout "objects": one object per group
    shards/<host>/index.jsonl       layout "shards": one index per appender host
    consumed.json                   the consumed watermark and stale/duplicate counters
    DATA_END                        written by mark_data_end()

**Append order.** The payload is created first (``put_if_absent``: a payload
that already exists is complete and is reused, nothing is rewritten), the
index record second; a group is visible only once its index record is, so a
crash between the two leaves an unreferenced payload and no index record.

**Index records** are one JSON object each whose last key ``crc`` is the CRC-32
of the record's canonical JSON without it. A record that fails its check is
never parsed into an entry.

- ``jsonl`` (directory stores): appenders take an ``flock`` on
  ``index.jsonl.lock``, catch up on lines written by others, repair a torn
  tail left by a crash (truncate it, log it, add an event), write one line with
  a single ``write`` on an ``O_APPEND`` descriptor and ``fdatasync`` it. The
  position is the line number: positions are dense. Readers never take the
  lock; an unterminated or failing last line is simply not visible yet. A bad
  line followed by good lines is corruption, not a crash, and raises.
- ``objects`` (object stores): position ``p`` is the key
  ``index/<p:012d>.json`` created with ``put_if_absent``, carrying the full
  record, so a taken position always holds a complete record. An appender
  tries ``p`` only after seeing ``p-1`` taken (listing, or losing the race for
  it), so positions are dense; the loser of a race lists after its key and
  retries at the next free position.
- ``shards`` (a shared POSIX mount written from several hosts): each host
  appends to its own ``shards/<host>/index.jsonl`` (as ``jsonl``; ``append``
  returns the shard sequence number). The head (opened with ``merger=True``)
  merges into ``index.jsonl``: in each merge pass it reads the complete new
  records of every shard, orders them round-robin by their rank within the
  pass and then by host name, assigns the next global positions and appends
  them in one write. Merged records carry ``host`` and ``seq``, so a restarted
  head resumes each shard after the last sequence number it merged.

**Dedup.** ``append`` of a group id this object has seen (appended or read)
returns the first position and writes nothing. Across processes: in
``jsonl`` the check runs under the index lock, so a second append of an id
always returns the first position; in ``objects``/``shards`` a payload that
already exists makes the appender scan the index for the id; only two
processes appending the same id at the same instant can both write a record,
and then readers mark every later position of that id as a **duplicate**:
consumed and counted at selection, never trained.

**Rounds.** ``select`` takes up to ``max_groups`` whole groups after the
watermark in position order; a group with ``current_version - min_version >
max_policy_age`` is consumed as **stale** (counted, never trained). ``commit``
persists the new watermark atomically in ``consumed.json``.

**Incremental reads.** A reader keeps a cursor into the index (a byte offset,
or the last key read) and full entries only for positions at or after the
watermark; older positions keep only their id (for dedup). A head tick
(``backlog()``) re-reads ``consumed.json`` and the index records after its
cursor: its cost is O(new records + backlog), not O(history).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import socket
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core import serde
from yeto_core.errors import NotFoundError, SampleBufferError
from yeto_core.group_codec import decode_group, encode_group
from yeto_core.ports import DurableSampleBuffer, ObjectStore
from yeto_core.records import Backlog, BufferRound, Event, GroupEntry, RoundSpec, SampleGroup

log = logging.getLogger("yeto.buffer")

LAYOUTS = ("auto", "jsonl", "objects", "shards")
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_STALE_TAIL = 1000
_CRC_MARK = b',"crc":"'


def check_group_id(group_id: str, what: str = "group id") -> str:
    """Return ``group_id`` if it is safe as a key segment, else raise :class:`SampleBufferError`."""
    if not isinstance(group_id, str) or not _ID_RE.fullmatch(group_id):
        raise SampleBufferError(
            f"{what} {group_id!r} is not allowed: use 1-200 characters of letters, digits, "
            "'.', '_' or '-', starting with a letter or digit"
        )
    return group_id


# -- records -----------------------------------------------------------------------------


@attrs.frozen
class ConsumedState:
    """``consumed.json``: everything below ``watermark`` was trained or skipped with a reason."""

    watermark: int = 0
    stale_total: int = 0
    duplicate_total: int = 0
    stale_tail: tuple[int, ...] = ()
    resets: int = 0
    updated_at: float = 0.0


# -- pure decisions ----------------------------------------------------------------------


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


# -- index record lines ------------------------------------------------------------------


def encode_record(record: dict[str, Any]) -> bytes:
    """One index record as a JSON line whose last key ``crc`` checks the rest."""
    body = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    crc = zlib.crc32(body)
    return body[:-1] + b'%s%08x"}\n' % (_CRC_MARK, crc)


def decode_record(line: bytes) -> Optional[dict[str, Any]]:
    """The record of a line written by :func:`encode_record`, or None if it fails its check."""
    line = line.rstrip(b"\n")
    i = line.rfind(_CRC_MARK)
    if i < 0 or len(line) != i + len(_CRC_MARK) + 10 or not line.endswith(b'"}'):
        return None
    body = line[:i] + b"}"
    try:
        if int(line[i + len(_CRC_MARK) : -2], 16) != zlib.crc32(body):
            return None
        rec = json.loads(body)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def _entry_from(rec: dict[str, Any], where: str) -> GroupEntry:
    try:
        return GroupEntry(**rec)
    except TypeError as exc:
        raise SampleBufferError(
            f"index record at {where} has unexpected fields ({exc}); "
            "it was written by another yeto version"
        ) from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- index layouts -----------------------------------------------------------------------


class JsonlIndex:
    """An append-only JSONL index file on a local or mounted file system.

    ``read_new`` returns the complete, checked records after the cursor.
    ``append`` takes the lock, catches up, repairs a torn tail and writes one line.
    """

    def __init__(self, path: Path, *, fsync: bool = True, events: Optional[list] = None) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self.fsync = fsync
        self.offset = 0  # bytes of complete, checked lines read
        self.count = 0  # records read (the next position)
        self.ids: dict[str, int] = {}
        self.events = events if events is not None else []
        self._rfd: Optional[int] = None
        self._wfd: Optional[int] = None
        self._lfd: Optional[int] = None

    def close(self) -> None:
        for name in ("_rfd", "_wfd", "_lfd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def reset_reader(self) -> None:
        self.offset, self.count, self.ids = 0, 0, {}

    # reading ------------------------------------------------------------------------

    def read_new(self) -> list[dict[str, Any]]:
        if self._rfd is None:
            try:
                self._rfd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return []
        size = os.fstat(self._rfd).st_size
        if size < self.offset:
            raise SampleBufferError(
                f"{self.path} shrank to {size} bytes below the {self.offset} bytes already read; "
                "someone truncated the buffer index. Restore it from a backup"
            )
        if size == self.offset:
            return []
        data = os.pread(self._rfd, size - self.offset, self.offset)
        out = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break  # an unterminated tail: being written now, or torn by a crash
            rec = decode_record(data[start:nl])
            if rec is None:
                if data.find(b"\n", nl + 1) >= 0:
                    raise SampleBufferError(
                        f"{self.path}: the line at byte {self.offset} fails its checksum and is "
                        "followed by good lines; this is corruption, not a crash. Restore the "
                        "index from a backup"
                    )
                break  # a torn last line: never parsed; the next appender repairs it
            if rec.get("position") != self.count:
                raise SampleBufferError(
                    f"{self.path}: line at byte {self.offset} holds position "
                    f"{rec.get('position')!r}, expected {self.count}; the index was edited"
                )
            out.append(rec)
            self.ids.setdefault(rec["group_id"], self.count)
            self.count += 1
            self.offset += nl + 1 - start
            start = nl + 1
        return out

    # writing ------------------------------------------------------------------------

    def _open_for_write(self) -> None:
        if self._wfd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existed = self.path.exists()
        self._lfd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._wfd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if not existed and self.fsync:
            _fsync_dir(self.path.parent)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Exclusive among every process (and every open index) on this host."""
        import fcntl

        self._open_for_write()
        assert self._lfd is not None
        fcntl.flock(self._lfd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lfd, fcntl.LOCK_UN)

    def _repair_tail(self) -> None:
        """Under the lock: bytes after the last good line are a torn write; cut them off."""
        assert self._wfd is not None
        size = os.fstat(self._wfd).st_size
        if size <= self.offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            torn = f.read(min(size - self.offset, 80))
        os.ftruncate(self._wfd, self.offset)
        if self.fsync:
            os.fsync(self._wfd)
        msg = (
            f"repaired a torn last record in {self.path}: cut {size - self.offset} bytes at "
            f"offset {self.offset} (a crash during an append that never returned)"
        )
        log.warning(msg)
        self.events.append(
            Event(
                kind="buffer.index_repaired",
                time=time.time(),
                source=str(self.path),
                data={"offset": self.offset, "bytes": size - self.offset, "head": torn.hex()},
            )
        )

    def open_and_repair(self) -> list[dict[str, Any]]:
        """Catch up and repair a torn tail (done when a writer opens the index)."""
        with self._lock():
            new = self.read_new()
            self._repair_tail()
        return new

    def write_locked(self, lines: bytes) -> None:
        assert self._wfd is not None
        view = memoryview(lines)
        while view:
            n = os.write(self._wfd, view)
            view = view[n:]
        if self.fsync:
            os.fdatasync(self._wfd)
        self.offset += len(lines)

    def append(
        self, group_id: str, make: Callable[[int], dict[str, Any]]
    ) -> tuple[int, list[dict[str, Any]], bool]:
        """Append ``make(position)`` unless ``group_id`` is there already.

        :returns: (position, every record read or written by this call, whether it wrote).
        """
        with self._lock():
            new = self.read_new()
            self._repair_tail()
            if group_id in self.ids:
                return self.ids[group_id], new, False
            rec = make(self.count)
            self.write_locked(encode_record(rec))
            self.ids[group_id] = self.count
            self.count += 1
            new.append(rec)
            return rec["position"], new, True


class ObjectsIndex:
    """One object per index record, positions taken with ``put_if_absent``."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store = store
        self.dir = f"{prefix}/index/"
        self.count = 0  # reader: the next position to read
        self.last_key: Optional[str] = None
        self._next: Optional[int] = None  # appender: the next position to try

    def key(self, position: int) -> str:
        return f"{self.dir}{position:012d}.json"

    def reset_reader(self) -> None:
        self.count, self.last_key = 0, None

    def _position_of(self, key: str) -> int:
        name = key[len(self.dir) :]
        if not name.endswith(".json") or not name[:-5].isdigit():
            raise SampleBufferError(
                f"unexpected object {key!r} in the buffer index; only <position>.json belongs there"
            )
        return int(name[:-5])

    def read_new(self) -> list[dict[str, Any]]:
        out = []
        for key in self.store.list(self.dir, after=self.last_key):
            pos = self._position_of(key)
            if pos != self.count:
                break  # not visible yet (listing raced a creation); read it next time
            rec = decode_record(self.store.get(key))
            if rec is None or rec.get("position") != pos:
                raise SampleBufferError(
                    f"index object {key!r} fails its checksum or names another position; "
                    "objects are created whole, so it was modified. Restore it"
                )
            out.append(rec)
            self.count += 1
            self.last_key = key
        return out

    def _last_taken(self, after: Optional[str]) -> Optional[int]:
        last = None
        for key in self.store.list(self.dir, after=after):
            last = key
        return None if last is None else self._position_of(last)

    def append(self, make: Callable[[int], dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        if self._next is None:
            last = self._last_taken(self.last_key)
            self._next = self.count if last is None else last + 1
        pos = self._next
        while True:
            rec = make(pos)
            if self.store.put_if_absent(self.key(pos), encode_record(rec)):
                self._next = pos + 1
                return pos, rec
            # Lost the race for ``pos``: every position up to the newest listed one is taken.
            last = self._last_taken(self.key(pos))
            pos = pos + 1 if last is None else last + 1


# -- the buffer --------------------------------------------------------------------------


class FileSampleBuffer(DurableSampleBuffer):
    """The ``file`` sample buffer on any :class:`~yeto_core.ports.ObjectStore`.

    :param store: the run's object store.
    :param prefix: key prefix of the buffer.
    :param layout: ``auto`` (``jsonl`` on a directory store, else ``objects``),
        ``jsonl``, ``objects`` or ``shards``.
    :param host: this appender's host name (shards; default: the machine's name).
    :param clock: returns seconds since the epoch (``appended_at``, ``consumed.json``).
    :param read_only: never write (no torn-tail repair, no merge); for ``yeto buffer stats``.
    :param merger: layout ``shards``: this process (the head) merges host shards.
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
    ) -> None:
        if layout not in LAYOUTS:
            raise SampleBufferError(f"unknown buffer layout {layout!r}; use one of {LAYOUTS}")
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.clock = clock
        self.read_only = read_only
        self.merger = merger and not read_only
        self.host = check_group_id(host or socket.gethostname().split(".")[0] or "host", "host")
        root = store.local_root()
        if layout == "auto":
            layout = "jsonl" if root is not None else "objects"
        self.layout = layout
        self.events: list[Event] = []
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
            self._objects = ObjectsIndex(store, self.prefix)
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
        self._arrivals: Optional[collections.deque[GroupEntry]] = None
        self._data_ended = False
        self._state = self._read_state()
        if self._jsonl is not None and not read_only and layout == "jsonl":
            self._ingest(self._jsonl.open_and_repair())
        elif self._shard is not None and not read_only:
            self._shard.open_and_repair()
        self._catch_up()

    # -- keys --------------------------------------------------------------------------

    def payload_key(self, group_id: str) -> str:
        return f"{self.prefix}/groups/{check_group_id(group_id)}.safetensors"

    @property
    def _consumed_key(self) -> str:
        return f"{self.prefix}/consumed.json"

    # -- reading the index -------------------------------------------------------------

    def _ingest(self, records: Iterable[dict[str, Any]]) -> None:
        wm = self._state.watermark
        for rec in records:
            entry = _entry_from(rec, f"position {rec.get('position')}")
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

    def _read_state(self) -> ConsumedState:
        try:
            raw = self.store.get(self._consumed_key)
        except NotFoundError:
            return ConsumedState()
        if raw == self._state_raw:
            return self._state
        state = serde.loads(raw, ConsumedState, what="buffer consumed state", root="consumed.json")
        self._state_raw = raw
        return state

    def _refresh_state(self) -> None:
        self._apply_state(self._read_state())

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
        self._ids, self._head, self._pending = {}, 0, collections.deque()
        if self._jsonl is not None:
            self._jsonl.reset_reader()
            if self.layout == "shards":
                self._merged_seq = {}
                self._shard_readers = {}
        if self._objects is not None:
            self._objects.reset_reader()
        self._catch_up()

    def _update(self) -> None:
        self._refresh_state()
        self._catch_up()

    # -- shards ------------------------------------------------------------------------

    def _merge(self) -> list[dict[str, Any]]:
        merged = self._jsonl
        assert merged is not None
        with merged._lock():
            new = merged.read_new()
            merged._repair_tail()
            for rec in new:
                h = rec["host"]
                self._merged_seq[h] = max(self._merged_seq.get(h, 0), rec["seq"] + 1)
            hosts = []
            if self._shards_dir.is_dir():
                hosts = sorted(p.name for p in self._shards_dir.iterdir() if p.is_dir())
            batches: dict[str, list[dict[str, Any]]] = {}
            for h in hosts:
                reader = self._shard_readers.get(h)
                if reader is None:
                    reader = JsonlIndex(self._shards_dir / h / "index.jsonl", fsync=merged.fsync)
                    self._shard_readers[h] = reader
                done = self._merged_seq.get(h, 0)
                batches[h] = [r for r in reader.read_new() if r["position"] >= done]
            order = sorted(((rank, h) for h, recs in batches.items() for rank in range(len(recs))))
            lines = []
            for rank, h in order:
                rec = dict(batches[h][rank])
                rec["seq"] = rec["position"]
                rec["position"] = merged.count + len(lines)
                lines.append(rec)
                self._merged_seq[h] = rec["seq"] + 1
            if lines:
                merged.write_locked(b"".join(encode_record(r) for r in lines))
                for rec in lines:
                    merged.ids.setdefault(rec["group_id"], rec["position"])
                merged.count += len(lines)
        return new + lines

    # -- port --------------------------------------------------------------------------

    def append(self, group: SampleGroup) -> int:
        """Durably append ``group``; return its position (shards: its shard sequence number).

        Durable before it returns: the payload (fsync, link, directory fsync on a
        directory store) and then the index record (fdatasync, or create-if-absent).
        """
        if self.read_only:
            raise SampleBufferError("this buffer was opened read-only; open it without read_only")
        gid = check_group_id(group.group_id)
        if self.layout == "shards":
            return self._append_shard(group)
        known = self._ids.get(gid, self._appended.get(gid))
        if known is not None:
            return known
        payload = self.payload_key(gid)
        if not self.store.put_if_absent(payload, encode_group(group)):
            # A payload exists: an earlier append of this id (maybe one that crashed
            # before its index record). Look for it in the index.
            self._catch_up()
            known = self._ids.get(gid)
            if known is not None:
                return known
        make = self._record_maker(group, payload)
        if self._jsonl is not None:
            pos, recs, _ = self._jsonl.append(gid, make)
            self._ingest(r for r in recs if r["position"] >= self._head)
            return pos
        assert self._objects is not None
        pos, _rec = self._objects.append(make)
        self._appended[gid] = pos
        return pos

    def _append_shard(self, group: SampleGroup) -> int:
        shard = self._shard
        assert shard is not None
        gid = group.group_id
        if gid in shard.ids:
            return shard.ids[gid]
        payload = self.payload_key(gid)
        if not self.store.put_if_absent(payload, encode_group(group)):
            shard.read_new()
            if gid in shard.ids:
                return shard.ids[gid]
        pos, _recs, _ = shard.append(gid, self._record_maker(group, payload))
        return pos

    def _record_maker(self, group: SampleGroup, payload: str) -> Callable[[int], dict[str, Any]]:
        versions = [int(s.weight_version) for s in group.samples]
        base = {
            "group_id": group.group_id,
            "prompt_id": group.prompt_id,
            "host": group.sampler_host,
            "incarnation": int(group.sampler_incarnation),
            "n_samples": len(group.samples),
            "min_version": min(versions),
            "max_version": max(versions),
            "appended_at": float(self.clock()),
            "payload": payload,
            "seq": -1,
        }
        if self.layout == "shards":
            base["host"] = self.host

        def make(position: int) -> dict[str, Any]:
            return {**base, "position": position}

        return make

    def load(self, entry: GroupEntry) -> SampleGroup:
        """The group of ``entry``, with numpy arrays."""
        try:
            data = self.store.get(entry.payload)
        except NotFoundError:
            raise SampleBufferError(
                f"payload {entry.payload!r} of position {entry.position} is missing from the "
                "store; the buffer was pruned or copied partially"
            ) from None
        group = decode_group(data, where=entry.payload)
        if group.group_id != entry.group_id:
            raise SampleBufferError(
                f"payload {entry.payload!r} holds group {group.group_id!r}, index says "
                f"{entry.group_id!r}"
            )
        return group

    @property
    def watermark(self) -> int:
        self._refresh_state()
        return self._state.watermark

    @property
    def head_position(self) -> int:
        """The number of positions in the (merged) index."""
        self._catch_up()
        return self._head

    def entries(self, start: int = 0) -> list[GroupEntry]:
        """Every entry from ``start`` on, read from the index (O(history); tests and tools)."""
        if self._jsonl is not None:
            reader = JsonlIndex(self._jsonl.path, fsync=False)
        else:
            reader = ObjectsIndex(self.store, self.prefix)  # type: ignore[assignment]
        out = [_entry_from(r, "index") for r in reader.read_new()]
        if isinstance(reader, JsonlIndex):
            reader.close()
        return [e for e in out if e.position >= start]

    def select(self, spec: RoundSpec) -> BufferRound:
        self._update()
        return plan_round(self._pending, self._state.watermark, spec)

    def commit(self, round: BufferRound) -> int:
        if self.read_only:
            raise SampleBufferError("this buffer was opened read-only; open it without read_only")
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
            stale_tail=(state.stale_tail + stale)[-_STALE_TAIL:],
            updated_at=float(self.clock()),
        )
        self._write_state(new)
        return new.watermark

    def _write_state(self, state: ConsumedState) -> None:
        raw = serde.dumps(state).encode()
        self.store.put(self._consumed_key, raw)
        self._state_raw = raw
        self._apply_state(state)

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

    def backlog(
        self, current_version: Optional[int] = None, max_policy_age: Optional[int] = None
    ) -> Backlog:
        """What waits after the watermark (with a version and age: only what is selectable).

        Cost: O(new index records + backlog), independent of the history.
        """
        self._update()
        groups = samples = 0
        oldest_v: Optional[int] = None
        oldest_t: Optional[float] = None
        gate = current_version is not None and max_policy_age is not None
        for entry, dup in self._pending:
            if dup:
                continue
            if gate and current_version - entry.min_version > max_policy_age:  # type: ignore[operator]
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
            data_ended=self.data_ended(),
        )

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
        for idx in (self._jsonl, self._shard, *self._shard_readers.values()):
            if idx is not None:
                idx.close()


def open_buffer(url_or_store: Any, **options: Any) -> FileSampleBuffer:
    """Open the ``file`` buffer of a run's store (a URL, a path, or an ObjectStore)."""
    if isinstance(url_or_store, ObjectStore):
        store = url_or_store
    else:
        from yeto_core.plugins import get_plugins

        store = get_plugins().open_store(str(url_or_store))
    return FileSampleBuffer(store, **options)


__all__ = [
    "BufferRound",
    "ConsumedState",
    "FileSampleBuffer",
    "GroupEntry",
    "JsonlIndex",
    "ObjectsIndex",
    "check_group_id",
    "decode_record",
    "encode_record",
    "open_buffer",
    "plan_round",
]
