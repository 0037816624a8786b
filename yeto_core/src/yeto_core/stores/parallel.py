"""Independent requests to a remote store at once, so that their round trips overlap.

On an S3-like store every request pays a round trip (10-50 ms on real S3): a
round of 16 groups read one ``get`` after another costs 16 round trips, read
16 at a time about 1. :func:`overlapped` runs a function over items on a
process-wide pool of :data:`WORKERS` threads and returns the results in the
items' order; on a store whose objects are local files (``local_root`` not
None) it runs them one after another in the caller's thread (no round trip to
hide, no threads to pay for).

Its callers overlap only requests that do not depend on each other (reads, and
the create-if-absent puts of a sampler call's distinct payloads, all done
before any index record names them), and each still handles the results in
order: an error of item ``i`` is raised when the caller reaches item ``i``, as
if the requests had been made one by one (the ones after it were made for
nothing: a read, or a payload the retry finds there and keeps).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional, TypeVar, Union

from yeto_core.ports.store import ObjectStore
from yeto_core.stage_profile import PROFILE

T = TypeVar("T")
R = TypeVar("R")

#: the most overlapped store requests one process has in flight at once
WORKERS = 16

_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None
_pool_pid: Optional[int] = None


def _executor() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid():  # a forked child gets its own
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="store-io")
            _pool_pid = os.getpid()
        return _pool


def _in_pool() -> bool:
    """Whether this thread is one of the pool's (a nested call runs inline: no deadlock)."""
    return threading.current_thread().name.startswith("store-io")


def in_background(fn: Callable[[], R], name: str) -> Future[R]:
    """``fn()`` on a daemon thread of its own (not the pool: ``fn`` may overlap requests
    itself), started now; its future holds the result or the error."""
    future: Future[R] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def is_remote(store: ObjectStore) -> bool:
    """Whether ``store``'s requests are round trips worth overlapping (no local files)."""
    return store.local_root() is None


def overlapped(
    store: Any, fn: Callable[[T], R], items: Sequence[T]
) -> list[Union[tuple[R, None], tuple[None, BaseException]]]:
    """``[(fn(item), None) or (None, error)]`` in ``items``' order (see the module doc)."""
    if len(items) < 2 or not is_remote(store) or _in_pool():
        return [_attempt(fn, item) for item in items]
    where, path = PROFILE.current(), PROFILE.on_path()

    def run(item: T) -> Union[tuple[R, None], tuple[None, BaseException]]:
        # the requests count for the caller's stage (and critical path: it waits for them)
        with PROFILE.within(where, path):
            return _attempt(fn, item)

    return list(_executor().map(run, items))


def on_pool(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(item) for item in items]`` run at once on the process's pool, whatever the
    store (for calls that release the GIL, such as ``os.fsync``); inline for fewer than
    two items or on a pool thread (waiting on the pool there could deadlock). The first
    failing item's error is raised."""
    if len(items) < 2 or _in_pool():
        return [fn(item) for item in items]
    return list(_executor().map(fn, items))


def _attempt(fn: Callable[[T], R], item: T) -> Union[tuple[R, None], tuple[None, BaseException]]:
    try:
        return fn(item), None
    except Exception as exc:
        return None, exc


def map_all(store: Any, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """:func:`overlapped`, then each result in order: the first failing item's error is
    raised (as if the requests had been made one by one)."""
    out = []
    for result, exc in overlapped(store, fn, items):
        if exc is not None:
            raise exc
        out.append(result)  # type: ignore[arg-type]
    return out


def get_all(store: Any, keys: Sequence[str]) -> list[bytes]:
    """``store.get`` of every key, overlapped; the first failing key's error is raised."""
    return map_all(store, store.get, keys)
