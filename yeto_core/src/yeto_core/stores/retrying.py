"""An island's view of the store: transient failures are retried with backoff.

A sampler or trainer island whose store is briefly unreachable (a timeout, an
HTTP 500/503, a full disk) waits and tries again instead of exiting: the head
would relaunch it, but only a few times, and a relaunch costs a model load.
Each operation is retried with exponential backoff (``base_s`` doubling up to
``max_s``) until it succeeds or has failed for ``outage_s`` seconds in a row;
then the last error is raised, as before.

Retrying is safe because every write of the protocol is idempotent or
conditional. A conditional write whose answer was lost (the write happened,
the reply did not arrive) is recognised on the retry: a ``put_if_absent`` that
now finds the key holding exactly our bytes, or a ``put_if_match`` that finds
its version moved to exactly our bytes, was this call's own write, so it
reports success instead of a lost race (which would, for instance, make a
sampler take the next buffer position for a group it already appended).

What is not a store outage is raised at once: a missing object
(:class:`~yeto_core.errors.NotFoundError`), a bad key, a permission error.
Every operation that the store answered after failures (a missing object is an
answer too) is queued as a report
(:meth:`RetryingStore.take_reports`) for the island to put in its event
stream as ``store_outage_survived`` (op, key, attempts, seconds, last error):
the stream itself writes through this store, so nothing is emitted from
inside a store call.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional, TypeVar

from yeto_core.errors import InvalidKeyError, NotFoundError, StoreError
from yeto_core.ports import ObjectStore

log = logging.getLogger("yeto.store")

T = TypeVar("T")

#: seconds an island's store operation keeps failing before the island gives up
DEFAULT_OUTAGE_S = 120.0

_PERMANENT_OS = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a store outage worth retrying (not a missing key or a bad call)."""
    if isinstance(exc, (NotFoundError, InvalidKeyError)):
        return False
    if isinstance(exc, StoreError):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, _PERMANENT_OS)


class RetryingStore(ObjectStore):
    """``inner`` with every operation retried through transient failures."""

    PLUGIN_NAME = "retrying"

    def __init__(
        self,
        inner: ObjectStore,
        *,
        outage_s: float = DEFAULT_OUTAGE_S,
        base_s: float = 0.05,
        max_s: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.outage_s = float(outage_s)
        self.base_s = float(base_s)
        self.max_s = float(max_s)
        self.sleep = sleep
        self.clock = clock
        self.ATOMIC_CAS = inner.ATOMIC_CAS  # type: ignore[misc]
        self._reports: collections.deque[dict[str, Any]] = collections.deque(maxlen=1000)
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ObjectStore:  # pragma: no cover
        raise NotImplementedError("a RetryingStore wraps an open store; it has no URL of its own")

    def __getattr__(self, name: str) -> Any:
        # attributes of the inner store (a dir store's root, ...); only called for misses
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- the retry loop ----------------------------------------------------------------

    def _retry(
        self,
        op: str,
        key: str,
        fn: Callable[[], T],
        resolve: Optional[Callable[[T], T]] = None,
    ) -> T:
        """``fn()`` until it succeeds; ``resolve`` maps a retry's result (a lost answer)."""
        since: Optional[float] = None
        attempts = 0
        last: Optional[BaseException] = None
        while True:
            try:
                result = fn()
            except Exception as exc:
                if not transient(exc):
                    if attempts:  # the store answered again (a miss is an answer too)
                        self._report(op, key, attempts, since, last)
                    raise
                now = self.clock()
                since = now if since is None else since
                attempts += 1
                last = exc
                if now - since >= self.outage_s:
                    log.error(
                        "store %s %r kept failing for %.0f s (%d attempts); giving up: %s",
                        op,
                        key,
                        now - since,
                        attempts,
                        exc,
                    )
                    raise
                if attempts == 1:
                    log.warning("store %s %r failed (%s); retrying", op, key, exc)
                self.sleep(min(self.max_s, self.base_s * 2 ** min(attempts - 1, 16)))
                continue
            if attempts == 0:
                return result
            if resolve is not None:
                result = resolve(result)
            self._report(op, key, attempts, since, last)
            return result

    def _report(self, op: str, key: str, attempts: int, since: Optional[float], last: Any) -> None:
        with self._lock:
            self._reports.append(
                {
                    "op": op,
                    "key": key,
                    "attempts": attempts,
                    "seconds": round(self.clock() - (since or 0.0), 3),
                    "last_error": f"{type(last).__name__}: {last}",
                }
            )

    def take_reports(self) -> list[dict[str, Any]]:
        """The operations that succeeded after failures since the last call (then cleared)."""
        with self._lock:
            out = list(self._reports)
            self._reports.clear()
        return out

    def _ours(self, key: str, data: bytes) -> bool:
        """Whether ``key`` holds exactly ``data`` (a create whose answer was lost)."""
        try:
            return self._retry("get", key, lambda: self.inner.get(key)) == bytes(data)
        except NotFoundError:
            return False

    # -- the port ----------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self._retry("get", key, lambda: self.inner.get(key))

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        return self._retry("get_versioned", key, lambda: self.inner.get_versioned(key))

    def put(self, key: str, data: bytes) -> None:
        self._retry("put", key, lambda: self.inner.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._retry(
            "put_if_absent",
            key,
            lambda: self.inner.put_if_absent(key, data),
            resolve=lambda created: created or self._ours(key, data),
        )

    def put_if_match(self, key: str, data: bytes, version: Optional[str]) -> Optional[str]:
        def resolve(new: Optional[str]) -> Optional[str]:
            if new is not None:
                return new
            try:
                current, token = self._retry(
                    "get_versioned", key, lambda: self.inner.get_versioned(key)
                )
            except NotFoundError:
                return None
            return token if current == bytes(data) else None

        return self._retry(
            "put_if_match", key, lambda: self.inner.put_if_match(key, data, version), resolve
        )

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        self._retry("put_many", items[0][0] if items else "", lambda: self.inner.put_many(items))

    def put_files(self, items: list[tuple[str, Path]]) -> None:
        # retried whole, like put_many (the files are still there to put again)
        self._retry("put_files", items[0][0] if items else "", lambda: self.inner.put_files(items))

    def put_many_if_absent(self, items: list[tuple[str, bytes]]) -> list[bool]:
        def resolve(created: list[bool]) -> list[bool]:
            return [c or self._ours(k, d) for c, (k, d) in zip(created, items, strict=True)]

        return self._retry(
            "put_many_if_absent",
            items[0][0] if items else "",
            lambda: self.inner.put_many_if_absent(items),
            resolve,
        )

    def exists(self, key: str) -> bool:
        return self._retry("exists", key, lambda: self.inner.exists(key))

    def list(self, prefix: str = "", after: Optional[str] = None) -> Iterator[str]:
        # a listing is materialised so that a failure midway is retried whole
        return iter(self._retry("list", prefix, lambda: list(self.inner.list(prefix, after))))

    def delete(self, key: str) -> None:
        self._retry("delete", key, lambda: self.inner.delete(key))

    def url(self) -> str:
        return self.inner.url()

    def credentials_env(self) -> dict[str, str]:
        return self.inner.credentials_env()

    def local_root(self) -> Optional[Path]:
        return self.inner.local_root()

    def fsyncs(self) -> bool:
        return self.inner.fsyncs()

    def watch(self, prefix: str) -> Any:
        return self.inner.watch(prefix)

    def raw_put(self, key: str, data: bytes) -> None:
        self._retry("raw_put", key, lambda: self.inner.raw_put(key, data))
