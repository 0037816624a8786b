"""Independent reads of a remote store at once, so that their round trips overlap.

On an S3-like store every request pays a round trip (10-50 ms on real S3): a
round of 16 groups read one ``get`` after another costs 16 round trips, read
8 at a time about 2. :func:`overlapped` runs a function over items on a
process-wide pool of :data:`WORKERS` threads and returns the results in the
items' order; on a store whose objects are local files (``local_root`` not
None) it runs them one after another in the caller's thread (no round trip to
hide, no threads to pay for).

Only reads go through it, and every caller still handles the results in order:
an error of item ``i`` is raised when the caller reaches item ``i``, exactly as
if the reads had been made one by one (the reads after it were made for
nothing, which a read can afford).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, TypeVar, Union

from yeto_core.stage_profile import PROFILE

T = TypeVar("T")
R = TypeVar("R")

#: the most store reads one process has in flight at once
WORKERS = 8

_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None
_pool_pid: Optional[int] = None


def _executor() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _lock:
        if _pool is None or _pool_pid != os.getpid():  # a forked child gets its own
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="store-read")
            _pool_pid = os.getpid()
        return _pool


def is_remote(store: Any) -> bool:
    """Whether ``store``'s requests are round trips worth overlapping (no local files)."""
    root = getattr(store, "local_root", None)
    return root is None or root() is None


def overlapped(
    store: Any, fn: Callable[[T], R], items: Sequence[T]
) -> list[Union[tuple[R, None], tuple[None, BaseException]]]:
    """``[(fn(item), None) or (None, error)]`` in ``items``' order (see the module doc)."""
    if len(items) < 2 or not is_remote(store):
        return [_attempt(fn, item) for item in items]
    where = PROFILE.current()

    def run(item: T) -> Union[tuple[R, None], tuple[None, BaseException]]:
        with PROFILE.within(where):  # the requests count for the caller's stage
            return _attempt(fn, item)

    return list(_executor().map(run, items))


def _attempt(fn: Callable[[T], R], item: T) -> Union[tuple[R, None], tuple[None, BaseException]]:
    try:
        return fn(item), None
    except Exception as exc:
        return None, exc


def get_all(store: Any, keys: Sequence[str]) -> list[bytes]:
    """``store.get`` of every key, overlapped; the first failing key's error is raised."""
    out = []
    for data, exc in overlapped(store, store.get, keys):
        if exc is not None:
            raise exc
        out.append(data)
    return out
