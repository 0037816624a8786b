"""The object store port (see :mod:`yeto_core.ports`)."""

from __future__ import annotations

import abc
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Optional

from yeto_core.errors import NotFoundError
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


def content_version(data: bytes) -> str:
    """The version token of an object holding ``data`` on stores that version by content."""
    return "sha256:" + hashlib.sha256(bytes(data)).hexdigest()


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

    # -- compare-and-swap ----------------------------------------------------------------

    #: Whether :meth:`put_if_match` is atomic against other writers of this store (the
    #: default implementation below is not; ``dir`` and ``s3`` override it).
    ATOMIC_CAS: ClassVar[bool] = False

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and its version token (raise :class:`NotFoundError`).

        A version token is opaque: pass it back to :meth:`put_if_match`. Default: a
        digest of the content.
        """
        data = self.get(key)
        return data, content_version(data)

    def put_if_match(self, key: str, data: bytes, version: Optional[str]) -> Optional[str]:
        """Write ``key`` only if its current version is ``version`` (None: only if absent).

        Returns the new version token when this call wrote, None when the object had
        changed (or existed, for ``version`` None): the caller lost the race and must
        read again. Default: :meth:`put_if_absent` for a create, else read, compare and
        write (not atomic: ``ATOMIC_CAS`` is False; a store that can do better
        overrides it).
        """
        if version is None:
            return content_version(data) if self.put_if_absent(key, data) else None
        try:
            _, current = self.get_versioned(key)
        except NotFoundError:
            return None
        if current != version:
            return None
        self.put(key, data)
        return content_version(data)

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

    def put_files(self, items: list[tuple[str, Path]]) -> None:
        """:meth:`put_many` of local files: ``(key, path)`` each, all durable on return.

        The caller hands the files over: it must not change them afterwards, because
        a store may keep a file itself instead of a copy of its bytes (the ``dir``
        store hard-links a file on its own file system into place). Default: their
        bytes through :meth:`put_many`.
        """
        self.put_many([(k, Path(p).read_bytes()) for k, p in items])

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
