"""Shared helpers of the nc tests."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"]


def wait_for(pred: Callable[[], Any], timeout_s: float = 20.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)
