"""Per-island event streams in the store: ``events/<island>.jsonl``.

Each island (and the head, as ``head``) owns one stream and is its only
writer. Object stores have no append, so the writer keeps the stream's lines
and puts the whole object again at each flush (atomic: a reader sees the old
stream or the new one). A restarted island reads its stream back first and
continues it. Streams stay small (one line per group, round, release and
decision); ``yeto run status`` and the run summary read them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional

from yeto_core.errors import NotFoundError
from yeto_core.records import Event

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


def read_events(store: Any, island: str) -> list[Event]:
    """Every event of ``island``'s stream (missing: empty; a bad line is skipped)."""
    try:
        data = store.get(stream_key(island))
    except NotFoundError:
        return []
    return _parse(data.decode(errors="replace"), island)


def islands(store: Any) -> list[str]:
    """Islands that have a stream."""
    out = []
    for key in store.list(PREFIX):
        name = key[len(PREFIX) :]
        if name.endswith(".jsonl") and "/" not in name:
            out.append(name[: -len(".jsonl")])
    return out


def read_all(store: Any) -> dict[str, list[Event]]:
    """Every stream, by island."""
    return {name: read_events(store, name) for name in islands(store)}


class EventStream:
    """The writer of one island's stream.

    :param store: the run's object store.
    :param island: the island name (the stream's key).
    :param clock: seconds since the epoch.
    :param flush_s: at most this long between a new event and its flush
        (``emit`` flushes when the last flush is older); 0 flushes every event.
    :param observer: called with every event (the plugin manager's ``emit``).
    """

    def __init__(
        self,
        store: Any,
        island: str,
        *,
        clock: Callable[[], float] = time.time,
        flush_s: float = 1.0,
        observer: Optional[Callable[[Event], None]] = None,
    ) -> None:
        self.store = store
        self.island = island
        self.clock = clock
        self.flush_s = flush_s
        self.observer = observer
        self._lock = threading.Lock()
        try:
            existing = store.get(stream_key(island)).decode(errors="replace")
        except NotFoundError:
            existing = ""
        self._lines = [ln for ln in existing.splitlines() if ln.strip()]
        self._dirty = False
        self._last_flush = self.clock()

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
            self.flush()
        return event

    def flush(self) -> None:
        """Put the whole stream (no-op when nothing changed)."""
        with self._lock:
            if not self._dirty:
                return
            data = ("\n".join(self._lines) + "\n").encode()
            self._dirty = False
            self._last_flush = self.clock()
        self.store.put(stream_key(self.island), data)

    def events(self) -> Iterator[Event]:
        """What this stream holds (including unflushed events)."""
        with self._lock:
            text = "\n".join(self._lines)
        return iter(_parse(text, self.island))
