"""Waiting in tests for something another process or thread does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float = 30.0,
    what: str = "condition",
    every_s: float = 0.02,
) -> Any:
    """``predicate()``'s first true value, tried every ``every_s`` until ``timeout_s``.

    :raises AssertionError: naming ``what`` when the time passed first.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
