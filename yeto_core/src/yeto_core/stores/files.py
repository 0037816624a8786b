"""How the ``dir`` store creates files: one permission mode for all of them.

``FILE_MODE`` is what ``open()`` gives a new file (0666 less the process umask);
:func:`mkstemp` creates a temporary file like :func:`tempfile.mkstemp` but with
that mode (alone it makes 0600 files, so objects written through a temporary
file and those created in place differed).
"""

from __future__ import annotations

import os
import random
import tempfile
from typing import Any


def _process_umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


#: the mode of every file the dir store and the buffer's index create
FILE_MODE = 0o666 & ~_process_umask()


# os.O_NOFOLLOW is POSIX-only (Windows lacks it): 0 adds no flag there. One of the two
# literal getattr probes the core allows (tests/core/test_no_capability_probes.py).
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


#: random name endings (this module's own generator: the application's seeded ``random``
#: is neither used nor moved; reseeded in a forked child, so parent and child differ)
_NAMES = random.Random()
os.register_at_fork(after_in_child=_NAMES.seed)


def random_suffix() -> str:
    """8 random hex digits ending a temporary name (no system call: this runs for every
    object written)."""
    return f"{_NAMES.getrandbits(32):08x}"


def mkstemp(*, prefix: str = "tmp", dir: Any = None) -> tuple[int, str]:
    """:func:`tempfile.mkstemp` (``prefix``, ``dir``), the file created with mode 0666
    less the umask (:data:`FILE_MODE`) directly: no ``fchmod`` after it.

    The name ends in :func:`random_suffix`; ``O_EXCL`` makes a name already taken fail
    and another is drawn."""
    base = os.fspath(dir) if dir is not None else tempfile.gettempdir()
    for _ in range(100):
        path = os.path.join(base, prefix + random_suffix())
        try:
            return os.open(path, _FLAGS, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {prefix!r} in {base}")  # pragma: no cover
