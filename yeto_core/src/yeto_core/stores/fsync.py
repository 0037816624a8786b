"""``fsync_dir``: make a directory's entries (a new or renamed file) durable."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: str | os.PathLike[str] | Path) -> None:
    """fsync the directory ``path`` (after creating, linking or renaming a file in it)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
