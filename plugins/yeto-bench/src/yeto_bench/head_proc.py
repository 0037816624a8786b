"""A bench's `yeto run up` in a subprocess: started with its output in ``head.log``,
stopped the way a user stops a run (``yeto run down``'s request), killed only when
it does not stop in time."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

from yeto_bench.chaos import YETO


def start_head(toml: Path, run_dir: Path, env: Optional[dict[str, str]] = None) -> subprocess.Popen:
    """``yeto run up TOML --run-dir RUN_DIR``, its stdout and stderr in ``RUN_DIR/head.log``."""
    with open(run_dir / "head.log", "wb") as log:
        return subprocess.Popen(
            [*YETO, "run", "up", str(toml), "--run-dir", str(run_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )


def stop_head(head: subprocess.Popen, run_dir: Path, reason: str, wait_s: float = 180.0) -> None:
    """Ask a running head to stop cleanly; SIGKILL it if it has not exited in ``wait_s``."""
    from yeto_core.head.run import request_down

    if head.poll() is not None:
        return
    request_down(run_dir, reason=reason)
    try:
        head.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        head.kill()
        head.wait()
