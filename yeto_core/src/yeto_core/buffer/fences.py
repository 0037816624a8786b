"""Fenced sampler incarnations, kept in the run's store.

When a provider reports an island ``LOST`` (evicted, its lease expired), the
head writes ``fences/<island>/<incarnation>.json`` before it launches the
replacement. The trainer's batch reader asks :class:`StoreFences` about every
group: groups of a fenced incarnation that are not consumed yet are skipped
with the counted reason ``fenced_incarnation``, never trained (a node that
lost its lease may still append during its grace time, or after, through a
network partition).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Optional

from yeto_core.ports import ObjectStore
from yeto_core.stores.parallel import in_background

PREFIX = "fences/"


def fence_key(island: str, incarnation: int) -> str:
    return f"{PREFIX}{island}/{int(incarnation):06d}.json"


def write_fence(store: ObjectStore, island: str, incarnation: int, **data: Any) -> bool:
    """Fence ``island``'s ``incarnation``; return whether this call created the fence."""
    body = {"island": island, "incarnation": int(incarnation), **data}
    return store.put_if_absent(fence_key(island, incarnation), json.dumps(body).encode())


def fenced(store: ObjectStore) -> set[tuple[str, int]]:
    """Every fenced ``(island, incarnation)``."""
    out = set()
    for key in store.list(PREFIX):
        island, _, name = key[len(PREFIX) :].rpartition("/")
        if island and name.endswith(".json") and name[:-5].isdigit():
            out.add((island, int(name[:-5])))
    return out


class StoreFences:
    """``(host, incarnation) -> bool`` for the batch reader, re-listing at most every ``refresh_s``.

    ``ahead``: once half of ``refresh_s`` passed since the last listing began, the next
    one goes on a thread and the answer comes from the fences known so far; a caller
    waits for a listing only when the known ones are ``refresh_s`` old (the same bound
    as without, off the caller's path while it asks more often than every
    ``refresh_s / 2``: the trainer's reader, on a remote store).
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        ahead: bool = False,
    ) -> None:
        self.store, self.refresh_s, self.clock = store, refresh_s, clock
        self.ahead = ahead
        self._known: set[tuple[str, int]] = set()
        self._at = float("-inf")
        #: a listing on a thread and when it began
        self._listing: Optional[tuple[Future[set[tuple[str, int]]], float]] = None

    def add(self, island: str, incarnation: int) -> None:
        """Note a fence this process wrote (known at once, before the next listing)."""
        self._known.add((island, int(incarnation)))

    def __call__(self, host: str, incarnation: int) -> bool:
        if (host, incarnation) in self._known:
            return True
        if self.ahead:
            self._list_ahead()
        if self.clock() - self._at >= self.refresh_s:
            listing, self._listing = self._listing, None
            if listing is not None:
                try:
                    self._merge(listing[0].result(), listing[1])
                except Exception:  # listed again below, and raised there
                    pass
            if self.clock() - self._at >= self.refresh_s:  # none, or it began too long ago
                began = self.clock()
                self._merge(fenced(self.store), began)
        return (host, incarnation) in self._known

    def _merge(self, found: set[tuple[str, int]], began: float) -> None:
        self._known = self._known | found  # fences are never removed
        self._at = max(self._at, began)

    def _list_ahead(self) -> None:
        """Take a finished background listing; start one once half ``refresh_s`` passed."""
        listing = self._listing
        if listing is not None and listing[0].done():
            self._listing = None
            try:
                self._merge(listing[0].result(), listing[1])
            except Exception:  # listed again in this thread when due, and raised there
                pass
        if self._listing is None and self.clock() - self._at >= self.refresh_s / 2:
            began = self.clock()
            self._listing = (in_background(lambda: fenced(self.store), "yeto-fences"), began)
