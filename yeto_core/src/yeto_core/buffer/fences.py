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
from typing import Any

from yeto_core.ports import ObjectStore

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
    """``(host, incarnation) -> bool`` for the batch reader, re-listing at most every ``refresh_s``."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.refresh_s, self.clock = store, refresh_s, clock
        self._known: set[tuple[str, int]] = set()
        self._at = float("-inf")

    def add(self, island: str, incarnation: int) -> None:
        """Note a fence this process wrote (known at once, before the next listing)."""
        self._known.add((island, int(incarnation)))

    def __call__(self, host: str, incarnation: int) -> bool:
        if (host, incarnation) in self._known:
            return True
        if self.clock() - self._at >= self.refresh_s:
            self._known = self._known | fenced(self.store)  # fences are never removed
            self._at = self.clock()
        return (host, incarnation) in self._known
