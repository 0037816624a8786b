"""Waiting on a prefix of the store instead of sleeping a fixed poll interval.

``store.watch(prefix)`` returns a :class:`Watch`: ``wait(timeout)`` returns as
soon as something under the prefix may have changed (True), or after
``timeout`` seconds (False). Callers keep their loop shape::

    watch = store.watch("trainer/3/events")
    while not answered():
        watch.wait(poll_s)      # was: time.sleep(poll_s)

so a missed or spurious wake-up costs at most one ``poll_s``, exactly as the
old sleep did; correctness never depends on the watch.

- :class:`~yeto_core.ports.store.SleepWatch` (the default of every store): sleeps
  ``timeout``.
- :class:`DirWatch` (the ``dir`` store on Linux): an inotify watch on the
  prefix's directory (files created, written, closed or renamed into it). Its
  events queue from the moment the watch exists, so a change that lands between
  the caller's check and its ``wait`` wakes that ``wait`` at once. Other systems,
  or an inotify limit reached, fall back to :class:`SleepWatch`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from yeto_core.ports.store import SleepWatch, Watch

_IN_MODIFY = 0x002
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_MASK = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE

_libc: Optional[ctypes.CDLL] = None
_libc_lock = threading.Lock()


def _inotify() -> Optional[ctypes.CDLL]:
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    with _libc_lock:
        if _libc is None:
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                lib.inotify_init1  # noqa: B018 (present?)
                _libc = lib
            except (OSError, AttributeError):
                return None
        return _libc


class DirWatch(Watch):
    """An inotify watch on one directory (created when missing)."""

    def __init__(self, path: Path, lib: ctypes.CDLL) -> None:
        self.path = Path(path)
        self._lib = lib
        self.path.mkdir(parents=True, exist_ok=True)
        fd = lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        if lib.inotify_add_watch(fd, os.fsencode(str(self.path)), _MASK) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {self.path}: {os.strerror(err)}")
        self._fd: Optional[int] = fd

    def wait(self, timeout: float) -> bool:
        fd = self._fd
        if fd is None:
            time.sleep(max(0.0, timeout))
            return False
        poller = select.poll()  # poll, not select: a busy process has fds past FD_SETSIZE
        poller.register(fd, select.POLLIN)
        if not poller.poll(max(0.0, timeout) * 1000.0):
            return False
        try:
            while os.read(fd, 65536):
                pass
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # a watch left open by a dropped object
        try:
            self.close()
        except Exception:
            pass


def dir_watch(path: Path) -> Watch:
    """A :class:`DirWatch` on ``path`` where inotify works, else a :class:`SleepWatch`."""
    lib = _inotify()
    if lib is None:
        return SleepWatch()
    try:
        return DirWatch(path, lib)
    except OSError:
        return SleepWatch()
