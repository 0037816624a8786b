"""The store wrappers (the head's LeasedStore, the RetryingStore) pass on every method a
store may override, so wrapping a store never loses what it does better than the port's
default (the dir store's inotify watch, its batched fsyncs)."""

from __future__ import annotations

import threading

import pytest

from yeto_core.head.lease import LeasedStore
from yeto_core.ports.store import ObjectStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.stores.retrying import RetryingStore
from yeto_core.stores.watch import DirWatch

OVERRIDDEN_BY_DIR = sorted(
    name
    for name in dir(ObjectStore)
    if not name.startswith("_")
    and callable(getattr(ObjectStore, name))
    and name != "from_url"
    and getattr(DirStore, name) is not getattr(ObjectStore, name)
)


@pytest.mark.parametrize("wrapper", [LeasedStore, RetryingStore])
def test_wrappers_pass_on_every_method_the_dir_store_overrides(wrapper):
    assert {"watch", "put_many", "put_many_if_absent"} <= set(OVERRIDDEN_BY_DIR)
    missing = [n for n in OVERRIDDEN_BY_DIR if getattr(wrapper, n) is getattr(ObjectStore, n)]
    assert missing == [], f"{wrapper.__name__} falls back to the port's default for {missing}"


def test_the_heads_leased_store_wakes_on_a_change(tmp_path):
    inner = DirStore(tmp_path / "s", fsync=False)
    inner.put("trainer/0/events/00000000.json", b"{}")
    store = RetryingStore(LeasedStore(inner))
    watch = store.watch("trainer/0/events/")
    assert isinstance(watch, DirWatch)
    later = threading.Timer(0.2, lambda: inner.put("trainer/0/events/00000001.json", b"{}"))
    later.start()
    try:
        assert watch.wait(30.0)  # woken by the put, not after the 30 s bound
    finally:
        later.cancel()
        watch.close()
