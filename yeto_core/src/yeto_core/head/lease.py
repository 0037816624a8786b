"""The head lease: one head per run, enforced by the store.

``run/lease.json`` names the head that may write the run's store: a random
``holder`` token, its pid and host, and ``expires_at`` (the holder's wall
clock). A head takes the lease with a conditional create
(:meth:`~yeto_core.ports.ObjectStore.put_if_match` with version None) and
renews it with a compare-and-swap from the version it last wrote, every
``ttl_s / 3`` seconds (a background thread, and before any write once the
local expiry has passed).

- A second head finds a live lease and is refused (:class:`HeadBusyError`,
  ``yeto run up`` exits 7) naming the holder.
- A lease that lapsed (its holder was paused, hung, or died without
  releasing) is taken over with a compare-and-swap; the lapsed record goes
  into the new head's ``head_lease_taken_over`` event. On the same host a
  holder whose pid is gone has lapsed at once.
- The old holder is **fenced**: its next renewal fails the swap, and from then
  on every write through :class:`LeasedStore` raises :class:`HeadFencedError`
  before it reaches the store. A head that wakes from SIGSTOP past its lease
  therefore writes nothing: the first write it tries renews first, finds the
  lease taken, and the head exits (code 9) without its shutdown writes.

Wall clocks of hosts that run heads for one run must agree to well within
``ttl_s`` (NTP); a lease is never taken over before its ``expires_at`` on the
taker's clock.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

from yeto_core.errors import NotFoundError, YetoError
from yeto_core.ports import ObjectStore

LEASE_KEY = "run/lease.json"


class HeadBusyError(YetoError):
    """Another head runs on this run (a live lease, or a live pid on the run dir)."""


class HeadFencedError(YetoError):
    """This head's lease was taken by another head: it must stop without writing."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_lease(store: ObjectStore) -> Optional[dict[str, Any]]:
    """The lease record in ``store`` (None: no head ever held one)."""
    try:
        return json.loads(store.get(LEASE_KEY))
    except NotFoundError:
        return None
    except ValueError:
        return {"holder": "", "expires_at": 0.0, "unreadable": True}


def lease_lapsed(rec: dict[str, Any], now: float, host: str) -> bool:
    """Whether ``rec`` no longer protects its holder (expired, released, or a dead pid here)."""
    if float(rec.get("expires_at", 0.0)) <= now:
        return True
    return rec.get("host") == host and not _pid_alive(int(rec.get("pid", -1)))


def describe(rec: dict[str, Any], now: float) -> str:
    left = float(rec.get("expires_at", 0.0)) - now
    return (
        f"pid {rec.get('pid')} on {rec.get('host')} (lease renewed "
        f"{now - float(rec.get('renewed_at', now)):.0f} s ago, "
        + (f"expires in {left:.0f} s)" if left > 0 else f"expired {-left:.0f} s ago)")
    )


class HeadLease:
    """This head's lease on one run's store (see the module doc)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        host: Optional[str] = None,
        pid: Optional[int] = None,
    ) -> None:
        self.store = store
        self.ttl_s = float(ttl_s)
        self.clock = clock
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.holder = os.urandom(12).hex()
        self.version: Optional[str] = None
        self.expires_at = 0.0  # on this head's clock
        self.renewed_at = 0.0
        self.fenced: Optional[str] = None  # why, once fenced (sticky)
        self._lock = threading.RLock()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self.started_at = clock()

    # -- records -----------------------------------------------------------------------

    def _body(self, now: float, expires_at: Optional[float] = None) -> bytes:
        rec = {
            "holder": self.holder,
            "pid": self.pid,
            "host": self.host,
            "started_at": self.started_at,
            "renewed_at": now,
            "expires_at": now + self.ttl_s if expires_at is None else expires_at,
            "ttl_s": self.ttl_s,
        }
        return json.dumps(rec, sort_keys=True).encode()

    def _current(self) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        try:
            raw, version = self.store.get_versioned(LEASE_KEY)
        except NotFoundError:
            return None, None
        try:
            return json.loads(raw), version
        except ValueError:
            return {"holder": "", "expires_at": 0.0, "unreadable": True}, version

    # -- taking, renewing, releasing ----------------------------------------------------

    def acquire(self) -> Optional[dict[str, Any]]:
        """Take the lease; the lapsed record taken over (None: it was free or ours).

        :raises HeadBusyError: another head holds a live lease.
        """
        with self._lock:
            for _ in range(20):
                now = self.clock()
                rec, version = self._current()
                if rec is not None and rec.get("holder") != self.holder:
                    if not lease_lapsed(rec, now, self.host):
                        raise HeadBusyError(
                            f"another head holds this run's lease ({LEASE_KEY} in "
                            f"{_url(self.store)}): {describe(rec, now)}. Stop it with "
                            "`yeto run down RUN_DIR`, or wait until its lease lapses"
                        )
                new = self.store.put_if_match(LEASE_KEY, self._body(now), version)
                if new is not None:
                    self._took(new, now)
                    released = rec is not None and float(rec.get("expires_at", 1.0)) == 0.0
                    return None if rec is None or released else rec
                # another head moved it between our read and our swap: read again
            raise HeadBusyError(
                f"could not take this run's lease ({LEASE_KEY}): it kept changing under us; "
                "another head is starting on this run"
            )

    def _took(self, version: str, now: float) -> None:
        self.version = version
        self.renewed_at = now
        self.expires_at = now + self.ttl_s

    def renew(self) -> None:
        """Extend the lease (compare-and-swap); fence this head when another took it.

        :raises HeadFencedError: the lease is another head's now (sticky).
        """
        with self._lock:
            if self.fenced is not None:
                raise HeadFencedError(self.fenced)
            now = self.clock()
            new = self.store.put_if_match(LEASE_KEY, self._body(now), self.version)
            if new is None:
                rec, version = self._current()
                if rec is not None and rec.get("holder") == self.holder and version is not None:
                    # our own earlier write landed though its answer was lost: swap from it
                    new = self.store.put_if_match(LEASE_KEY, self._body(now), version)
                if new is None:
                    rec, _ = self._current()
                    who = describe(rec, now) if rec else "nobody (the lease was removed)"
                    self.fenced = (
                        f"this head (pid {self.pid}) lost the run's lease: it is now held by "
                        f"{who}. Another head took over this run while this one was paused or "
                        "cut off; this head stops without writing anything more"
                    )
                    raise HeadFencedError(self.fenced)
            self._took(new, now)

    def check(self) -> None:
        """Before a write: fenced raises; a lease past its local expiry is renewed first."""
        if self.fenced is not None:
            raise HeadFencedError(self.fenced)
        if self.version is not None and self.clock() >= self.expires_at - self.ttl_s / 3:
            self.renew()

    def release(self) -> None:
        """Give the lease up (a swap to an expired record: the next head takes it at once)."""
        self.stop_renewing()
        with self._lock:
            if self.fenced is not None or self.version is None:
                return
            now = self.clock()
            if self.store.put_if_match(LEASE_KEY, self._body(now, 0.0), self.version):
                self.version = None

    # -- the renewal thread -----------------------------------------------------------

    def start_renewing(self, on_error: Callable[[BaseException], None] = lambda e: None) -> None:
        """Renew every ``ttl_s / 3`` seconds in a daemon thread (stops once fenced)."""

        def loop() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                try:
                    self.renew()
                except HeadFencedError:
                    return
                except Exception as exc:  # a store outage: the next try, or check(), renews
                    on_error(exc)

        self._thread = threading.Thread(target=loop, name="yeto-head-lease", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def _url(store: ObjectStore) -> str:
    try:
        return store.url()
    except NotImplementedError:
        return type(store).__name__


class LeasedStore(ObjectStore):
    """The head's view of the store: every write checks the lease first.

    Reads pass straight through. A fenced head's writes raise
    :class:`HeadFencedError` before they reach the store.
    """

    PLUGIN_NAME = "leased"

    def __init__(self, inner: ObjectStore, lease: Optional[HeadLease] = None) -> None:
        self.inner = inner
        self.lease = lease
        self.ATOMIC_CAS = inner.ATOMIC_CAS  # type: ignore[misc]

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ObjectStore:  # pragma: no cover
        raise NotImplementedError("a LeasedStore wraps an open store; it has no URL of its own")

    def _guard(self) -> None:
        if self.lease is not None:
            self.lease.check()

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        return self.inner.get_versioned(key)

    def put(self, key: str, data: bytes) -> None:
        self._guard()
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._guard()
        return self.inner.put_if_absent(key, data)

    def put_if_match(self, key: str, data: bytes, version: Optional[str]) -> Optional[str]:
        if key != LEASE_KEY:
            self._guard()
        return self.inner.put_if_match(key, data, version)

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        self._guard()
        self.inner.put_many(items)

    def put_files(self, items: list[tuple[str, Path]]) -> None:
        self._guard()
        self.inner.put_files(items)

    def put_many_if_absent(self, items: list[tuple[str, bytes]]) -> list[bool]:
        self._guard()
        return self.inner.put_many_if_absent(items)

    def watch(self, prefix: str) -> Any:
        return self.inner.watch(prefix)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str = "", after: Optional[str] = None) -> Iterator[str]:
        return self.inner.list(prefix, after)

    def delete(self, key: str) -> None:
        self._guard()
        self.inner.delete(key)

    def url(self) -> str:
        return self.inner.url()

    def credentials_env(self) -> dict[str, str]:
        return self.inner.credentials_env()

    def local_root(self) -> Optional[Path]:
        return self.inner.local_root()

    def fsyncs(self) -> bool:
        return self.inner.fsyncs()

    def raw_put(self, key: str, data: bytes) -> None:
        self._guard()
        self.inner.raw_put(key, data)
