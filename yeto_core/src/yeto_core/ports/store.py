"""The object store port (see :mod:`yeto_core.ports`)."""

from __future__ import annotations

import abc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Optional

from yeto_core.ports.base import Port


class Watch:
    """A wait for a change under a prefix of a store (:meth:`ObjectStore.watch`).

    ``wait(timeout)`` returns True as soon as something under the prefix may have
    changed, False after ``timeout`` seconds. Callers keep their loop shape
    (``while not done(): watch.wait(poll_s)``, where they slept ``poll_s``), so a
    missed or spurious wake-up costs at most one ``poll_s``: correctness never
    depends on the watch.
    """

    def wait(self, timeout: float) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        return None

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SleepWatch(Watch):
    """No notifications: ``wait`` sleeps ``timeout`` (the fixed poll of a plain store)."""

    def __init__(self, sleep: Any = time.sleep) -> None:
        self._sleep = sleep

    def wait(self, timeout: float) -> bool:
        if timeout > 0:
            self._sleep(timeout)
        return False


class ObjectStore(Port):
    """Keys to bytes, with atomic writes and create-if-absent.

    Keys are relative POSIX paths (``buffer/index/000000000001.json``).
    ``list`` returns keys in lexicographic order, strictly after ``after``.
    ``URL_SCHEMES`` names the URL schemes that select this store
    (``s3://bucket/prefix``); :meth:`from_url` builds it. The run config's
    ``store = URL`` chooses it.

    Complete plugin::

        import threading

        from yeto_core import hookimpl
        from yeto_core.errors import NotFoundError
        from yeto_core.ports import ObjectStore
        from yeto_core.stores.keys import check_key, check_prefix

        class MemoryStore(ObjectStore):
            PLUGIN_NAME = "memory-doc"
            URL_SCHEMES = ("memory-doc",)

            def __init__(self):
                self._d, self._lock = {}, threading.Lock()

            @classmethod
            def from_url(cls, url, **options):
                return cls()

            def get(self, key):
                try:
                    return self._d[check_key(key)]
                except KeyError:
                    raise NotFoundError(f"no object {key!r}") from None

            def put(self, key, data):
                self._d[check_key(key)] = bytes(data)

            def put_if_absent(self, key, data):
                with self._lock:
                    if check_key(key) in self._d:
                        return False
                    self._d[key] = bytes(data)
                    return True

            def exists(self, key):
                return check_key(key) in self._d

            def list(self, prefix="", after=None):
                check_prefix(prefix)
                return iter(sorted(k for k in list(self._d)
                                   if k.startswith(prefix) and (after is None or k > after)))

            def delete(self, key):
                self._d.pop(check_key(key), None)

        @hookimpl
        def yeto_register_object_stores(register):
            register(MemoryStore)
    """

    PORT = "ObjectStore"
    URL_SCHEMES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, **options: Any) -> ObjectStore:
        """Build the store for ``url`` (``options`` come from config or the caller)."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Return the object's bytes; raise :class:`~yeto_core.errors.NotFoundError`."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write atomically: readers see the old object or the new one, never a part."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if it does not exist; return whether this call created it."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""

    @abc.abstractmethod
    def list(self, prefix: str = "", after: Optional[str] = None) -> Iterator[str]:
        """Keys starting with ``prefix``, in key order, strictly after ``after``."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""

    # -- optional capabilities ---------------------------------------------------------

    def url(self) -> str:
        """A URL that :meth:`from_url` turns back into this store (no secrets)."""
        raise NotImplementedError(f"{type(self).__name__} cannot say its URL")

    def credentials_env(self) -> dict[str, str]:
        """Environment variables an island on another machine needs to open :meth:`url`.

        The head passes exactly these (and nothing else of its own environment) to
        every island it launches. Default: none.
        """
        return {}

    def local_root(self) -> Optional[Path]:
        """The directory holding the objects when they are plain files (the ``dir`` store).

        A buffer may then keep an appendable index there. Default: None.
        """
        return None

    def fsyncs(self) -> bool:
        """Whether writes are made durable before they return (``dir`` may turn it off)."""
        return True

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        """:meth:`put` of each ``(key, data)``: each object atomic, all durable on return.

        No order among them is promised (a crash may leave any subset written), so a
        protocol that needs one (files, then their manifest) calls it per step. A
        store may make it cheaper (the ``dir`` store syncs the files together and
        each directory once). Default: one at a time.
        """
        for k, d in items:
            self.put(k, d)

    def put_many_if_absent(self, items: list[tuple[str, bytes]]) -> list[bool]:
        """:meth:`put_if_absent` of each ``(key, data)``; whether each call created its key.

        Every created object is durable when this returns, like after
        :meth:`put_if_absent`. A store may make the batch cheaper (the ``dir`` store
        syncs the files together and each directory once). Default: one at a time.
        """
        return [self.put_if_absent(k, d) for k, d in items]

    def watch(self, prefix: str) -> Watch:
        """A :class:`~yeto_core.stores.watch.Watch` on ``prefix``: ``wait(timeout)`` returns
        early when something under it may have changed. Default: it sleeps ``timeout``
        (a poll); the ``dir`` store wakes on inotify.
        """
        return SleepWatch()

    def raw_put(self, key: str, data: bytes) -> None:
        """A plain write with no yeto logic (the baseline of ``yeto bench buffer``)."""
        self.put(key, data)
