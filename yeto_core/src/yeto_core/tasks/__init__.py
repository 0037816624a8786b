"""Tasks and rewards built in to the core: the ``dataset`` task (a local JSONL file) and
the ``exact``, ``regex`` and ``boxed`` rewards (docs/tasks.md). Standard library only."""

from __future__ import annotations

import os
from pathlib import Path

from yeto_core.providers.local import ENV_RUN_CWD


def user_path(path: str) -> Path:
    """``path`` as the user meant it: a relative path is relative to the directory
    ``yeto run up`` runs in (an island runs in its own work dir; ``YETO_RUN_CWD``)."""
    p = Path(path)
    if p.is_absolute():
        return p
    return Path(os.environ.get(ENV_RUN_CWD) or os.getcwd()) / p
