"""Supervision of an inference server process, for any server-backed sampler engine.

A server-backed engine (``vllm``, ``sglang``) talks HTTP to a server that usually
lives in its own Python environment. :class:`EngineServer` owns that process:

- :meth:`EngineServer.start` launches ``python argv...`` (``{host}`` and ``{port}``
  in the arguments are replaced), in its own process group, with its output in
  ``log_path``, and waits until ``GET <url><health_path>`` answers 200;
- :meth:`EngineServer.ensure` restarts a server that died, with exponential
  backoff (``backoff_s``, doubled per consecutive failure, at most
  ``backoff_max_s``). A start that does not reach health within
  ``start_timeout_s``, or a server that dies within ``stable_s`` of becoming
  healthy, is a **failure**; after ``max_restarts`` consecutive failures it
  raises :class:`InfraFailedError` (code ``INFRA_FAILED``) and emits
  ``engine_server_infra_failed``;
- :meth:`EngineServer.supervise` runs ``ensure`` in a daemon thread and calls
  ``on_restart(server)`` after every restart (an engine loads its current
  release into the fresh server there);
- :meth:`EngineServer.stop` ends the process group (SIGTERM, then SIGKILL).

:meth:`EngineServer.attach` wraps a server someone else runs (by URL): it is
health-checked but never started, restarted or stopped; a dead external
server is ``INFRA_FAILED`` once it stayed unhealthy for ``start_timeout_s``.

Every decision is an event (``emit``): ``engine_server_started`` (pid, url,
seconds to health, attempt), ``engine_server_died`` (exit code, uptime),
``engine_server_start_failed`` (why, attempt, backoff), ``engine_server_restarted``,
``engine_server_infra_failed``, ``engine_server_stopped``.

Standard library only: the core imports no HTTP client.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from yeto_core.errors import YetoError
from yeto_core.records import Event

#: The code an island reports when its inference server cannot be kept alive.
INFRA_FAILED = "INFRA_FAILED"
#: The exit code of a sampler island whose server failed ``max_restarts`` times.
EXIT_INFRA_FAILED = 75


class InfraFailedError(YetoError):
    """The inference server failed to start or stay up ``max_restarts`` times in a row."""

    code = INFRA_FAILED


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def http_get_status(url: str, timeout_s: float = 2.0) -> Optional[int]:
    """The HTTP status of ``GET url``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def _die_with_parent() -> None:  # pragma: no cover (runs in the child)
    """Ask Linux to SIGTERM the server when the island process dies (PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except Exception:
        pass


class EngineServer:
    """One supervised server process (or an attached external server). See the module doc.

    :param argv: the server's arguments after the interpreter
        (``["-m", "vllm.entrypoints.openai.api_server", "--port", "{port}", ...]``).
    :param python: the interpreter of the server's environment (default: this one).
        None together with ``raw=True``: ``argv`` is the whole command line.
    :param env: extra environment variables for the server (added to this process's).
    :param host: the address the server binds (loopback in tests).
    :param port: the port (0: a free one, kept across restarts).
    :param health_path: answers 200 once the server serves.
    :param start_timeout_s: the longest a start may take to reach health.
    :param max_restarts: consecutive failures after which the server is ``INFRA_FAILED``.
    :param backoff_s: the wait before the first restart; doubled per consecutive failure.
    :param backoff_max_s: the longest wait between restarts.
    :param stable_s: a server that dies sooner than this after becoming healthy counts as
        a failure (a crash loop); later deaths reset the failure count.
    :param log_path: where the server's stdout and stderr go (appended; None: discarded).
    :param emit: receives every event.
    :param source: the events' source (the island's name).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        python: Optional[str] = sys.executable,
        env: Optional[Mapping[str, str]] = None,
        host: str = "127.0.0.1",
        port: int = 0,
        health_path: str = "/health",
        start_timeout_s: float = 300.0,
        max_restarts: int = 3,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        stable_s: float = 30.0,
        log_path: Optional[str | os.PathLike[str]] = None,
        emit: Optional[Callable[[Event], None]] = None,
        source: str = "engine",
        clock: Callable[[], float] = time.monotonic,
        _external_url: Optional[str] = None,
    ) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts={max_restarts}: must be >= 0")
        if start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s={start_timeout_s}: must be > 0 seconds")
        self.argv = [str(a) for a in argv]
        self.python = python
        self.env = dict(env or {})
        self.host = host
        self.port = int(port) or (0 if _external_url else free_port(host))
        self.health_path = health_path if health_path.startswith("/") else "/" + health_path
        self.start_timeout_s = float(start_timeout_s)
        self.max_restarts = int(max_restarts)
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self.stable_s = float(stable_s)
        self.log_path = Path(log_path) if log_path else None
        self._emit = emit or (lambda e: None)
        self.source = source
        self.clock = clock
        self._external_url = _external_url.rstrip("/") if _external_url else None
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.starts = 0  # processes launched
        self.restarts = 0  # successful restarts after a death
        self.failures = 0  # consecutive failures (reset by a stable run)
        self.healthy_since: Optional[float] = None
        self.infra_failed = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def attach(
        cls,
        url: str,
        *,
        health_path: str = "/health",
        start_timeout_s: float = 60.0,
        emit: Optional[Callable[[Event], None]] = None,
        source: str = "engine",
    ) -> EngineServer:
        """A server someone else runs at ``url``: health-checked, never started or stopped."""
        return cls(
            (),
            python=None,
            health_path=health_path,
            start_timeout_s=start_timeout_s,
            max_restarts=0,
            emit=emit,
            source=source,
            _external_url=url,
        )

    # -- facts ----------------------------------------------------------------------

    @property
    def external(self) -> bool:
        return self._external_url is not None

    @property
    def url(self) -> str:
        """The server's base URL (``http://127.0.0.1:PORT``)."""
        return self._external_url or f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        """The command line a start runs (placeholders filled)."""
        args = [a.replace("{host}", self.host).replace("{port}", str(self.port)) for a in self.argv]
        return ([self.python] if self.python else []) + args

    def alive(self) -> bool:
        """Whether the process runs (an attached server: whether it answers)."""
        if self.external:
            return self.healthy()
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """One health request: did ``GET health_path`` answer 200?"""
        return http_get_status(self.url + self.health_path, timeout_s) == 200

    # -- start / stop ---------------------------------------------------------------

    def _event(self, kind: str, **data: Any) -> None:
        self._emit(Event(kind=kind, time=time.time(), source=self.source, data=data))

    def _launch(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, **self.env}
        out: Any = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")
        try:
            return subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except OSError as exc:
            raise InfraFailedError(
                f"cannot run the inference server {self.command()[:3]}...: {exc}; check the "
                "engine's server command and python (is the server environment built?)"
            ) from exc
        finally:
            if out is not subprocess.DEVNULL:
                out.close()

    def _wait_healthy(self, proc: Optional[subprocess.Popen[bytes]]) -> Optional[str]:
        """Wait for health; return None when healthy, else why not."""
        deadline = self.clock() + self.start_timeout_s
        delay = 0.05
        while True:
            if proc is not None and proc.poll() is not None:
                return f"the server exited with code {proc.returncode} before it was healthy"
            if self.healthy():
                return None
            if self.clock() >= deadline:
                return f"not healthy after start_timeout_s={self.start_timeout_s}"
            if self._stop.wait(delay):
                return "stopped while starting"
            delay = min(1.0, delay * 2)

    def _start_once(self, attempt: int) -> Optional[str]:
        t0 = self.clock()
        if self.external:
            why = self._wait_healthy(None)
        else:
            self.proc = self._launch()
            self.starts += 1
            try:
                why = self._wait_healthy(self.proc)
            except BaseException:  # SIGTERM of the island while the server starts
                self._kill(5.0)
                raise
            if why is not None:
                self._kill()
        if why is None:
            self.healthy_since = self.clock()
            self._event(
                "engine_server_started",
                url=self.url,
                pid=self.pid,
                attempt=attempt,
                seconds=round(self.clock() - t0, 3),
                external=self.external,
            )
        return why

    def start(self) -> None:
        """Start the server (or wait for an attached one) until healthy.

        Retries with backoff; :raises InfraFailedError: after ``max_restarts`` + 1 failed starts.
        """
        with self._lock:
            self._stop.clear()
            self._run_until_healthy()

    def _run_until_healthy(self) -> None:
        attempt = 0
        while True:
            attempt += 1
            why = self._start_once(attempt)
            if why is None:
                return
            self.failures += 1
            if self._stop.is_set():
                raise InfraFailedError(f"server at {self.url} stopped while starting")
            if self.failures > self.max_restarts:
                self._infra_failed(why)
            wait = min(self.backoff_max_s, self.backoff_s * (2 ** (self.failures - 1)))
            self._event(
                "engine_server_start_failed",
                url=self.url,
                reason=why,
                attempt=attempt,
                failures=self.failures,
                max_restarts=self.max_restarts,
                backoff_s=wait,
                log=str(self.log_path) if self.log_path else None,
            )
            if self._stop.wait(wait):
                raise InfraFailedError(f"server at {self.url} stopped while starting")

    def _infra_failed(self, why: str) -> None:
        self.infra_failed = True
        self._event(
            "engine_server_infra_failed",
            code=INFRA_FAILED,
            url=self.url,
            reason=why,
            failures=self.failures,
            max_restarts=self.max_restarts,
            log=str(self.log_path) if self.log_path else None,
        )
        where = f"; its log: {self.log_path}" if self.log_path else ""
        raise InfraFailedError(
            f"{INFRA_FAILED}: the inference server at {self.url} failed {self.failures} times in "
            f"a row (max_restarts={self.max_restarts}); last: {why}{where}. Fix the server "
            "command or environment, or raise max_restarts."
        )

    def ensure(self) -> bool:
        """Restart the server if it died. :returns: whether it was restarted.

        :raises InfraFailedError: after ``max_restarts`` consecutive failures.
        """
        with self._lock:
            if self.infra_failed:
                raise InfraFailedError(f"{INFRA_FAILED}: the server at {self.url} gave up before")
            if self._stop.is_set() or self.alive():
                return False
            uptime = self.clock() - self.healthy_since if self.healthy_since is not None else 0.0
            code = self.proc.returncode if self.proc is not None else None
            self._event("engine_server_died", url=self.url, code=code, uptime_s=round(uptime, 3))
            self.healthy_since = None
            if uptime < self.stable_s:
                self.failures += 1
            else:
                self.failures = 0
            if self.failures > self.max_restarts:
                self._infra_failed(f"died after {uptime:.1f} s (exit code {code})")
            if self.failures:
                wait = min(self.backoff_max_s, self.backoff_s * (2 ** (self.failures - 1)))
                if self._stop.wait(wait):
                    return False
            self._run_until_healthy()
            self.restarts += 1
            self._event(
                "engine_server_restarted", url=self.url, pid=self.pid, restarts=self.restarts
            )
            return True

    def supervise(
        self,
        on_restart: Optional[Callable[[EngineServer], None]] = None,
        *,
        poll_s: float = 1.0,
        on_infra_failed: Optional[Callable[[InfraFailedError], None]] = None,
    ) -> None:
        """Watch the server in a daemon thread; restart it and call ``on_restart`` after each."""
        if self._thread is not None:
            return

        def run() -> None:
            while not self._stop.wait(poll_s):
                try:
                    if self.ensure() and on_restart is not None:
                        on_restart(self)
                except InfraFailedError as exc:
                    if on_infra_failed is not None:
                        on_infra_failed(exc)
                    return
                except Exception as exc:  # keep supervising; the next poll retries
                    self._event("engine_server_error", error=f"{type(exc).__name__}: {exc}")

        self._thread = threading.Thread(target=run, name="engine-server", daemon=True)
        self._thread.start()

    def _kill(self, timeout_s: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the server's process group (failure injection; not a stop)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(30)

    def stop(self, timeout_s: float = 10.0) -> None:
        """End supervision and the server's process group (an attached server is left running)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            self._thread = None
        with self._lock:
            if self.external or self.proc is None:
                return
            code = self.proc.poll()
            self._kill(timeout_s)
            self._event("engine_server_stopped", url=self.url, pid=self.pid, already_exited=code)

    def __enter__(self) -> EngineServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
