"""``fsync_dir``: make a directory's entries (a new or renamed file) durable."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str] | Path) -> None:
    """fsync the directory ``path`` (after creating, linking or renaming a file in it)."""
    # os.O_DIRECTORY is POSIX-only (Windows lacks it): 0 adds no flag there. One of the two
    # literal getattr probes the core allows (tests/core/test_no_capability_probes.py).
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
