"""A background event stream writes off the caller's thread, in order, and retries a failed
write (waits on the thing itself, bounded; no timings asserted)."""

from __future__ import annotations

import threading

from yeto_core.errors import StoreError
from yeto_core.events.stream import EventStream, read_events
from yeto_core.testing.fakes import RemoteLookingDirStore


class RemoteDir(RemoteLookingDirStore):
    """A dir store seen as remote (whole-stream puts), recording the putting thread."""

    def __init__(self, root):
        super().__init__(root)
        self.put_threads = []
        self.fail = 0
        self.put_done = threading.Condition()

    def put(self, key, data):
        with self.put_done:
            self.put_threads.append(threading.current_thread().name)
            if self.fail:
                self.fail -= 1
                self.put_done.notify_all()
                raise StoreError("injected outage")
            super().put(key, data)
            self.put_done.notify_all()


def wait_for(store, island, n):
    with store.put_done:
        assert store.put_done.wait_for(lambda: len(read_events(store, island)) >= n, timeout=20), (
            "the flusher did not write the events"
        )


def test_emit_does_not_write_in_the_caller_s_thread_and_keeps_the_order(tmp_path):
    store = RemoteDir(tmp_path)
    s = EventStream(store, "trainer", flush_s=0.0, background=True)
    for n in range(5):
        s.emit("a", n=n)
    wait_for(store, "trainer", 5)
    me = threading.current_thread().name
    assert store.put_threads and me not in store.put_threads
    s.emit("a", n=5)
    s.flush()  # an explicit flush writes at once
    assert [e.data["n"] for e in read_events(store, "trainer")] == list(range(6))


def test_a_failed_background_write_is_retried_by_the_next(tmp_path):
    store = RemoteDir(tmp_path)
    s = EventStream(store, "trainer", flush_s=0.0, background=True)
    store.fail = 1
    s.emit("a", n=0)
    with store.put_done:
        assert store.put_done.wait_for(lambda: store.put_threads, timeout=20)
    s.emit("a", n=1)
    wait_for(store, "trainer", 2)
    s.flush()
    assert [e.data["n"] for e in read_events(store, "trainer")] == [0, 1]
