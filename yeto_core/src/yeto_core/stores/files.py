"""How the ``dir`` store creates files: one permission mode for all of them.

``FILE_MODE`` is what ``open()`` gives a new file (0666 less the process umask);
:func:`mkstemp` creates a temporary file like :func:`tempfile.mkstemp` but with
that mode (alone it makes 0600 files, so objects written through a temporary
file and those created in place differed).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any


def _process_umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


#: the mode of every file the dir store and the buffer's index create
FILE_MODE = 0o666 & ~_process_umask()


_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


def mkstemp(*, prefix: str = "tmp", dir: Any = None) -> tuple[int, str]:
    """:func:`tempfile.mkstemp` (``prefix``, ``dir``), the file created with mode 0666
    less the umask (:data:`FILE_MODE`) directly: no ``fchmod`` after it."""
    base = os.fspath(dir) if dir is not None else tempfile.gettempdir()
    for _ in range(100):
        path = os.path.join(base, prefix + os.urandom(4).hex())
        try:
            return os.open(path, _FLAGS, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {prefix!r} in {base}")  # pragma: no cover
