"""The store-log primitive: sequence-numbered records, one object each, created with put_if_absent.

An object store cannot append to an object, and rewriting a growing object
races between writers. Every shared log of a run (the head's journal, the
trainer channel, the batch ledger's rounds, the buffer's objects index) is
therefore a :class:`StoreLog`: record ``seq`` is the object
``<prefix>/<seq:0{width}d><suffix>``, created with ``put_if_absent`` so two
writers can never take the same number; listing the prefix in key order reads
the log in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Optional

from yeto_core.errors import NotFoundError, StoreError
from yeto_core.ports import ObjectStore


class StoreLog:
    """One log under ``prefix`` (see the module docstring).

    :param width: digits of the sequence number in the key.
    :param suffix: the key's ending (``.json``).
    """

    def __init__(
        self, store: ObjectStore, prefix: str, *, width: int, suffix: str = ".json"
    ) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.width = int(width)
        self.suffix = suffix
        self._next: Optional[int] = None

    @property
    def dir(self) -> str:
        return f"{self.prefix}/"

    def key(self, seq: int) -> str:
        """The key of record ``seq``."""
        return f"{self.prefix}/{seq:0{self.width}d}{self.suffix}"

    def seq_of(self, key: str) -> Optional[int]:
        """The sequence number of ``key``, or None when ``key`` is no record of this log."""
        name = key[len(self.dir) :] if key.startswith(self.dir) else ""
        digits = name[: -len(self.suffix)] if name.endswith(self.suffix) else ""
        if len(digits) != self.width or not digits.isdigit():
            return None
        return int(digits)

    def keys(self, after: Optional[str] = None) -> Iterator[str]:
        """Keys of the records, in order, strictly after key ``after``."""
        for key in self.store.list(self.dir, after=after):
            if self.seq_of(key) is not None:
                yield key

    def last_seq(self, after: Optional[str] = None) -> Optional[int]:
        """The highest sequence number taken (listing after ``after``), or None."""
        last = None
        for key in self.keys(after):
            last = key
        return None if last is None else self.seq_of(last)

    def next_seq(self) -> int:
        """The sequence number this writer tries next (the first after the last one listed)."""
        if self._next is None:
            last = self.last_seq()
            self._next = 0 if last is None else last + 1
        return self._next

    def create(self, seq: int, data: bytes) -> bool:
        """Create record ``seq``; False when it exists (another writer took it)."""
        created = self.store.put_if_absent(self.key(seq), data)
        if created and (self._next is None or seq >= self._next):
            self._next = seq + 1
        return created

    def append(self, make: Callable[[int], bytes]) -> int:
        """Write ``make(seq)`` at the first free sequence number; return that number.

        A writer that loses the race for a number lists after it and tries the next
        free one, so numbers stay dense.
        """
        seq = self.next_seq()
        while not self.create(seq, make(seq)):
            last = self.last_seq(self.key(seq))
            seq = seq + 1 if last is None else last + 1
            self._next = seq
        return seq

    def append_exclusive(self, make: Callable[[int], bytes]) -> int:
        """Like :meth:`append` for a log with one writer: a taken number is an error."""
        seq = self.next_seq()
        if not self.create(seq, make(seq)):
            raise StoreError(f"{self.key(seq)} exists: two writers on a single-writer log")
        return seq

    def read(self, after: Optional[str] = None) -> Iterator[tuple[str, bytes]]:
        """``(key, data)`` of every record after key ``after``, in order (vanished ones skipped)."""
        for key in self.keys(after):
            try:
                yield key, self.store.get(key)
            except NotFoundError:
                continue
