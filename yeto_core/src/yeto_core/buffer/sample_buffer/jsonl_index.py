"""The ``jsonl`` index: an append-only JSONL file on a local or mounted file system.

Appenders take an ``flock`` on ``index.jsonl.lock``, catch up on lines written by
others, repair a torn tail left by a crash (truncate it, log it, add an event),
write one line with a single ``write`` on an ``O_APPEND`` descriptor and
``fdatasync`` it. Readers never take the lock.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from yeto_core.buffer.sample_buffer.codec import decode_record, encode_record, quarantined_record
from yeto_core.errors import SampleBufferError
from yeto_core.records import Event
from yeto_core.stores.fsync import fsync_dir

log = logging.getLogger("yeto.buffer")


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
        self.quarantined = 0  # complete lines that failed their checksum
        self.ids: dict[str, int] = {}
        self.events = events if events is not None else []
        self._rfd: Optional[int] = None
        self._wfd: Optional[int] = None
        self._lfd: Optional[int] = None
        self._size: Optional[int] = None  # the file's size at the last read_new (under the lock)

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
        size = self._size = os.fstat(self._rfd).st_size
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
                # A complete line (it ends in a newline) that fails its checksum is
                # damage, not a torn write: only an unterminated tail is torn. Its
                # position stays taken by a quarantined stand-in, nothing is cut.
                rec = self._quarantine(data[start:nl])
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

    def _quarantine(self, line: bytes) -> dict[str, Any]:
        """The stand-in record of a complete line that fails its checksum (counted)."""
        self.quarantined += 1
        msg = (
            f"{self.path}: the complete line at byte {self.offset} (position {self.count}) "
            "fails its checksum; it is quarantined (its group is skipped as 'quarantined'), "
            "not truncated"
        )
        log.warning(msg)
        self.events.append(
            Event(
                kind="buffer.index_line_quarantined",
                time=time.time(),
                source=str(self.path),
                data={
                    "offset": self.offset,
                    "position": self.count,
                    "bytes": len(line) + 1,
                    "head": line[:80].hex(),
                    "quarantined": self.quarantined,
                },
            )
        )
        return quarantined_record(self.count)

    def _open_for_write(self) -> None:
        if self._wfd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existed = self.path.exists()
        self._lfd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        self._wfd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        if not existed and self.fsync:
            fsync_dir(self.path.parent)

    def _lock(self) -> _Flock:
        """Exclusive among every process (and every open index) on this host."""
        self._open_for_write()
        assert self._lfd is not None
        return _Flock(self._lfd)

    def _repair_tail(self, size: Optional[int] = None) -> None:
        """Under the lock: bytes after the last good line are a torn write; cut them off.

        ``size``: the file's size read under this same lock hold (saves an ``fstat``)."""
        assert self._wfd is not None
        if size is None:
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
            self._size = None
            new = self.read_new()
            self._repair_tail(self._size)
            if group_id in self.ids:
                return self.ids[group_id], new, False
            rec = make(self.count)
            self.write_locked(encode_record(rec))
            self.ids[group_id] = self.count
            self.count += 1
            new.append(rec)
            return rec["position"], new, True

    def append_many(
        self, items: list[tuple[str, Callable[[int], dict[str, Any]]]]
    ) -> tuple[list[int], list[dict[str, Any]]]:
        """Group commit: append ``make(position)`` for each ``(group_id, make)`` not there yet.

        One lock, one catch-up, one ``write`` of all the new lines and one
        ``fdatasync``. A crash during the write leaves a prefix of complete lines
        (each checked by its own checksum) and at most one unterminated tail, which
        readers never see and the next writer cuts off: none or a prefix of the
        batch is visible, never a torn record.

        :returns: (the position of each item, every record read or written by this call).
        """
        with self._lock():
            new = self.read_new()
            self._repair_tail()
            positions: list[int] = []
            lines: list[bytes] = []
            written: list[dict[str, Any]] = []
            taken: dict[str, int] = {}  # ids of this batch (a batch may repeat one)
            for group_id, make in items:
                known = self.ids.get(group_id, taken.get(group_id))
                if known is not None:
                    positions.append(known)
                    continue
                position = self.count + len(written)
                rec = make(position)
                lines.append(encode_record(rec))
                written.append(rec)
                taken[group_id] = position
                positions.append(position)
            if lines:
                self.write_locked(b"".join(lines))  # the cursor moves only once written
                self.ids.update(taken)
                self.count += len(written)
                new.extend(written)
            return positions, new


class _Flock:
    """``with``: an exclusive ``flock`` on ``fd`` (a plain class: this wraps every append,
    and a generator-based context manager costs several times more)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
