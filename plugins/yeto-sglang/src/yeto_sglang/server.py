"""Start and stop the SGLang server process of a sampler island (stdlib only).

The server usually lives in its own Python environment: ``python`` names its
interpreter and ``module`` the entry module (``sglang.launch_server``; the
tests use ``yeto_sglang.testing.server``, the protocol test server, with the
same flags). The process is a child of the island: it is stopped when the
engine closes or the island exits, and on Linux it gets SIGKILL if the island
dies without cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Optional


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ServerProcess:
    """One server process: ``start()`` waits for ``GET /health``; ``stop()`` ends it."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        url: str,
        python: Optional[str] = None,
        module: str = "sglang.launch_server",
        env: Optional[Mapping[str, str]] = None,
        log_path: Optional[str | Path] = None,
        startup_timeout_s: float = 600.0,
    ) -> None:
        self.command = [python or sys.executable, "-m", module, *args]
        self.url = url.rstrip("/")
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = float(startup_timeout_s)
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._log: Optional[IO[bytes]] = None
        self.starts = 0

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")
        out = self._log if self._log is not None else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self.starts += 1
        atexit.register(self.stop)
        self.wait_healthy()

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        delay = 0.05
        while True:
            assert self.proc is not None
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"the SGLang server exited with code {code} before it was healthy; "
                    f"command: {' '.join(self.command)}; its output: {self.log_path or '(none)'}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"the SGLang server at {self.url} was not healthy after "
                    f"{self.startup_timeout_s:.0f} s; command: {' '.join(self.command)}; "
                    f"its output: {self.log_path or '(none)'}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
