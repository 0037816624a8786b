"""Per-island event streams in the store: ``events/<island>.jsonl``.

Each island (and the head, as ``head``) owns one stream and is its only
writer. Object stores have no append, so the writer keeps the stream's lines
and puts the whole object again at each flush (atomic: a reader sees the old
stream or the new one). A restarted island reads its stream back first and
continues it. Streams stay small (one line per group, round, release and
decision); ``yeto run status`` and the run summary read them.

On a store whose objects are local files (the ``dir`` store) a flush after the
writer's first one appends only the new lines to the file (one ``write``,
synced like a put), so a flush costs O(new lines), not O(stream). A reader may
then see a last line still being written, which it skips like any bad line; a
writer's first flush (after a restart too) puts the whole stream, which ends a
line torn by a crash, so it stays one bad line that readers skip.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional

from yeto_core.errors import NotFoundError
from yeto_core.records import Event
from yeto_core.stage_profile import stage
from yeto_core.stores.parallel import map_all

PREFIX = "events/"


def stream_key(island: str) -> str:
    return f"{PREFIX}{island}.jsonl"


def _parse(text: str, island: str) -> list[Event]:
    out = []
    for raw in text.splitlines():
        try:
            d = json.loads(raw)
            out.append(
                Event(
                    kind=str(d["kind"]),
                    time=float(d["time"]),
                    source=str(d.get("source", island)),
                    data=dict(d.get("data", {})),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _stream_bytes(store: Any, island: str) -> bytes:
    """``island``'s stream as stored (missing: empty)."""
    try:
        return bytes(store.get(stream_key(island)))
    except NotFoundError:
        return b""


def read_events(store: Any, island: str) -> list[Event]:
    """Every event of ``island``'s stream (missing: empty; a bad line is skipped)."""
    return _parse(_stream_bytes(store, island).decode(errors="replace"), island)


def islands(store: Any) -> list[str]:
    """Islands that have a stream."""
    out = []
    for key in store.list(PREFIX):
        name = key[len(PREFIX) :]
        if name.endswith(".jsonl") and "/" not in name:
            out.append(name[: -len(".jsonl")])
    return out


def read_all(store: Any) -> dict[str, list[Event]]:
    """Every stream, by island (on a remote store the streams are read at once)."""
    return StreamsReader(store).read_all()


class StreamsReader:
    """:func:`read_all` again and again (the head, every poll): each stream's bytes are
    read whole, but only what was added since the last read is parsed.

    Streams only grow (a writer appends lines, or puts its whole stream again with new
    lines at the end): when a stream's bytes start with those parsed last time, up to
    their last complete line, the events of that part are kept and the rest parsed;
    anything else (a stream rewritten shorter or changed) is parsed whole. The result
    equals :func:`read_all`'s. Safe to call from one thread at a time or several."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._parsed: dict[str, tuple[bytes, list[Event]]] = {}  # island -> (lines, events)
        self._lock = threading.Lock()

    def read_all(self) -> dict[str, list[Event]]:
        names = islands(self.store)
        raws = map_all(self.store, lambda name: _stream_bytes(self.store, name), names)
        with self._lock:
            return {name: self._events(name, raw) for name, raw in zip(names, raws, strict=True)}

    def _events(self, island: str, raw: bytes) -> list[Event]:
        done, events = self._parsed.get(island, (b"", []))
        if not raw.startswith(done):
            done, events = b"", []
        cut = raw.rfind(b"\n") + 1  # the lines known whole (a last one may be torn)
        if cut > len(done):
            events = events + _parse(raw[len(done) : cut].decode(errors="replace"), island)
            done = raw[:cut]
        self._parsed[island] = (done, events)
        return events + _parse(raw[cut:].decode(errors="replace"), island)


class EventStream:
    """The writer of one island's stream.

    :param store: the run's object store.
    :param island: the island name (the stream's key).
    :param clock: seconds since the epoch.
    :param flush_s: at most this long between a new event and its flush
        (``emit`` flushes when the last flush is older); 0 flushes every event.
    :param observer: called with every event (the plugin manager's ``emit``).
    :param background: a due flush runs on a flusher thread, not in ``emit``'s caller
        (the trainer's round path); :meth:`flush` still writes at once, in order with it.
        A failed background flush is retried by the next one (or the final ``flush``).
    """

    def __init__(
        self,
        store: Any,
        island: str,
        *,
        clock: Callable[[], float] = time.time,
        flush_s: float = 1.0,
        observer: Optional[Callable[[Event], None]] = None,
        background: bool = False,
    ) -> None:
        self.store = store
        self.island = island
        self.clock = clock
        self.flush_s = flush_s
        self.observer = observer
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time, in order
        try:
            existing = store.get(stream_key(island)).decode(errors="replace")
        except NotFoundError:
            existing = ""
        self._lines = [ln for ln in existing.splitlines() if ln.strip()]
        self._dirty = False
        self._last_flush = self.clock()
        root = store.local_root()
        #: the stream's file when the store keeps objects as local files (appends)
        self._file = None if root is None else root / stream_key(island)
        #: lines in the store after the last flush (None: the next flush puts them all)
        self._flushed: Optional[int] = None
        self.background = background
        self._wake = threading.Event()
        self._flusher: Optional[threading.Thread] = None

    def emit(self, kind: str, **data: Any) -> Event:
        """Add an event; flush if the last flush is older than ``flush_s``."""
        event = Event(kind=kind, time=self.clock(), source=self.island, data=data)
        line = json.dumps(
            {"kind": kind, "time": event.time, "source": self.island, "data": data},
            sort_keys=True,
            separators=(",", ":"),
            default=str,
        )
        with self._lock:
            self._lines.append(line)
            self._dirty = True
            elapsed = self.clock() - self._last_flush
            # a clock that jumped back (a host's time reset) must not hold the stream back
            due = elapsed >= self.flush_s or elapsed < 0
        if self.observer is not None:
            self.observer(event)
        if due:
            if self.background:
                self._flush_later()
            else:
                self.flush()
        return event

    def _flush_later(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"events-{self.island}", daemon=True
            )
            self._flusher.start()
        self._wake.set()

    def _flush_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # the lines stay dirty: the next flush puts them all
                pass

    def flush(self) -> None:
        """Write the new events (no-op when nothing changed): the whole stream, or an append."""
        with self._flush_lock:
            with self._lock:
                if not self._dirty:
                    return
                start = self._flushed if self._file is not None else None
                data = ("\n".join(self._lines[start or 0 :]) + "\n").encode()
                count = len(self._lines)
                self._dirty = False
                self._last_flush = self.clock()
            try:
                with stage("events.flush"):
                    if start is None:
                        self.store.put(stream_key(self.island), data)
                    else:
                        self._append(data)
            except BaseException:
                with self._lock:  # a failed write may have left a part: put it all next time
                    self._flushed, self._dirty = None, True
                raise
            self._flushed = count

    def _append(self, data: bytes) -> None:
        """Add ``data`` (whole lines) to the end of the stream's local file."""
        import os

        assert self._file is not None
        fd = os.open(self._file, os.O_WRONLY | os.O_APPEND)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.store.fsyncs():
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def events(self) -> Iterator[Event]:
        """What this stream holds (including unflushed events)."""
        with self._lock:
            text = "\n".join(self._lines)
        return iter(_parse(text, self.island))
