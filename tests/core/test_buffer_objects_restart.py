"""A restarted head reading an ``objects`` buffer while samplers keep appending.

Regression for the restarted head that stopped seeing new index objects
("buffer index skipped from position 0 to 92", then no new group): the
objects index's read cursor moved past records that never reached the
buffer's head, either because a store call failed in the middle of a read
(the head retries a tick that failed on the store) or because a second
thread read the same buffer object while the first was reading.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.errors import StoreError
from yeto_core.records import RoundSpec, Sample, SampleGroup
from yeto_core.stores.dir_store import DirStore


def group(gid: str) -> SampleGroup:
    t = np.arange(6, dtype=np.int32)
    s = Sample(
        tokens=t,
        prompt_len=2,
        logprobs=np.zeros(4, dtype=np.float32),
        loss_mask=np.ones(4, dtype=np.uint8),
        reward=1.0,
        weight_version=0,
    )
    return SampleGroup(gid, f"p-{gid}", "h", 0, (s, s), task="echo")


def index_key(position: int) -> str:
    return f"buffer/index/{position:012d}.json"


class HookedStore(DirStore):
    """A dir store that calls ``hooks[key]()`` (once) before getting ``key``."""

    def __init__(self, root) -> None:
        super().__init__(root, fsync=False)
        self.hooks: dict = {}

    def get(self, key: str) -> bytes:
        hook = self.hooks.pop(key, None)
        if hook is not None:
            hook()
        return super().get(key)


def objects(store, **kw) -> FileSampleBuffer:
    return FileSampleBuffer(store, layout="objects", **kw)


def append_from_two_samplers(a, b, start: int, n: int) -> None:
    for i in range(start, start + n):
        (a if i % 2 else b).append(group(f"g{i}"))


@pytest.mark.parametrize("restore", [False, True], ids=["following", "after-restore"])
def test_a_store_error_in_the_middle_of_a_read_loses_no_index_record(tmp_path, restore):
    store = HookedStore(tmp_path / "store")
    a, b, trainer = objects(store), objects(store), objects(store)
    append_from_two_samplers(a, b, 0, 8)
    trainer.commit(trainer.select(RoundSpec(6, 0, 5)))
    head = objects(store)  # the restarted head: reads the 8 records
    assert head.head_position == 8 and head.backlog().groups == 2
    append_from_two_samplers(a, b, 8, 6)
    if restore:  # a trainer restarted from an earlier cut: the head re-reads from 0
        trainer.reset_to(2)

    def fail() -> None:
        raise StoreError("injected: the store timed out")

    store.hooks[index_key(10)] = fail
    with pytest.raises(StoreError, match="injected"):
        head.backlog()  # a tick that failed on the store; the head takes it again
    assert head.head_position == 14
    assert head.backlog().groups == 14 - (2 if restore else 6)
    append_from_two_samplers(a, b, 14, 2)  # and it keeps following
    assert head.head_position == 16


class ProbeLock:
    """A re-entrant lock that tells when a thread had to wait for it."""

    def __init__(self, waited: threading.Event) -> None:
        self._inner = threading.RLock()
        self._waited = waited

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._inner.acquire(blocking=False):
            return True
        self._waited.set()
        return self._inner.acquire(blocking, timeout)

    def release(self) -> None:
        self._inner.release()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()


@pytest.mark.parametrize("restore", [False, True], ids=["following", "after-restore"])
def test_a_second_thread_reading_the_heads_buffer_mid_read_breaks_nothing(tmp_path, restore):
    store = HookedStore(tmp_path / "store")
    a, b, trainer = objects(store), objects(store), objects(store)
    append_from_two_samplers(a, b, 0, 8)
    trainer.commit(trainer.select(RoundSpec(6, 0, 5)))
    head = objects(store)
    assert head.head_position == 8
    append_from_two_samplers(a, b, 8, 6)
    if restore:
        trainer.reset_to(2)

    # While the head's thread reads index record 10, another thread (a status
    # page, a test's watcher) asks the same buffer object for its backlog.
    progress = threading.Event()  # the other thread finished, or waits for the head's read
    head._lock = ProbeLock(progress)
    other_errors: list[BaseException] = []

    def other() -> None:
        try:
            head.backlog()
        except BaseException as exc:  # reported below
            other_errors.append(exc)
        finally:
            progress.set()

    thread = threading.Thread(target=other, daemon=True)

    def run_other_mid_read() -> None:
        thread.start()
        assert progress.wait(60), "the other thread neither finished nor waited"

    store.hooks[index_key(10)] = run_other_mid_read
    head.backlog()
    thread.join(60)
    assert not thread.is_alive()
    assert other_errors == []
    assert head.head_position == 14
    assert head.backlog().groups == 14 - (2 if restore else 6)
    append_from_two_samplers(a, b, 14, 2)
    assert head.head_position == 16
