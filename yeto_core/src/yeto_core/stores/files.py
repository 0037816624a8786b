"""How the ``dir`` store creates files: one permission mode for all of them.

``FILE_MODE`` is what ``open()`` gives a new file (0666 less the process umask);
:func:`mkstemp` is :func:`tempfile.mkstemp` with that mode (alone it makes 0600
files, so objects written through a temporary file and those created in place
differed).
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


def mkstemp(**kw: Any) -> tuple[int, str]:
    """:func:`tempfile.mkstemp`, the file given :data:`FILE_MODE`."""
    fd, tmp = tempfile.mkstemp(**kw)
    os.fchmod(fd, FILE_MODE)
    return fd, tmp
