"""EngineServer against real processes: a stdlib HTTP server that can be killed or broken."""

from __future__ import annotations

import signal
import sys
import textwrap
import threading
import time

import pytest

from yeto_core.sampler.engine_server import (
    INFRA_FAILED,
    EngineServer,
    InfraFailedError,
    http_get_status,
)

SERVER = textwrap.dedent(
    """
    import http.server, os, sys
    port = int(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "ok"
    if mode == "exit":
        sys.exit(7)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health" and mode != "never":
                self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
            elif self.path == "/pid":
                self.send_response(200); self.end_headers(); self.wfile.write(str(os.getpid()).encode())
            else:
                self.send_response(503); self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "server.py"
    p.write_text(SERVER)
    return p


def _server(script, tmp_path, mode="ok", **kw):
    events = []
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("start_timeout_s", 20)
    srv = EngineServer(
        [str(script), "{port}", mode],
        python=sys.executable,
        log_path=tmp_path / "server.log",
        emit=events.append,
        source="s-0",
        **kw,
    )
    return srv, events


def test_start_health_kill_restart_stop(script, tmp_path):
    srv, events = _server(script, tmp_path, stable_s=0.0)
    srv.start()
    try:
        assert srv.healthy()
        first = srv.pid
        assert srv.ensure() is False  # alive: nothing to do
        srv.kill(signal.SIGKILL)
        assert not srv.alive()
        assert srv.ensure() is True
        assert srv.healthy() and srv.pid != first
        assert srv.restarts == 1 and srv.failures == 0
        kinds = [e.kind for e in events]
        assert kinds == [
            "engine_server_started",
            "engine_server_died",
            "engine_server_started",
            "engine_server_restarted",
        ]
        died = events[1].data
        assert died["code"] == -signal.SIGKILL
    finally:
        srv.stop()
    assert not srv.alive()
    assert http_get_status(srv.url + "/health", 0.5) is None
    assert events[-1].kind == "engine_server_stopped"


def test_exit_at_start_is_infra_failed_after_max_restarts(script, tmp_path):
    srv, events = _server(script, tmp_path, mode="exit", max_restarts=2)
    with pytest.raises(InfraFailedError) as err:
        srv.start()
    assert INFRA_FAILED in str(err.value) and "exited with code 7" in str(err.value)
    assert srv.starts == 3  # the first start and max_restarts=2 retries
    kinds = [e.kind for e in events]
    assert kinds == ["engine_server_start_failed"] * 2 + ["engine_server_infra_failed"]
    assert [e.data["backoff_s"] for e in events[:2]] == [0.01, 0.02]
    assert events[-1].data["code"] == INFRA_FAILED and events[-1].data["failures"] == 3


def test_health_timeout_counts_as_failure(script, tmp_path):
    srv, events = _server(script, tmp_path, mode="never", max_restarts=0, start_timeout_s=1.0)
    with pytest.raises(InfraFailedError, match="not healthy after start_timeout_s=1.0"):
        srv.start()
    assert not srv.alive()  # the unhealthy process was ended


def test_crash_loop_under_supervision_ends_in_infra_failed(script, tmp_path):
    # stable_s is long: every death right after becoming healthy is a failure
    srv, events = _server(script, tmp_path, max_restarts=2, stable_s=3600)
    srv.start()
    restarted, failed = [], threading.Event()
    got: list[InfraFailedError] = []

    def on_infra(exc):
        got.append(exc)
        failed.set()

    srv.supervise(lambda s: restarted.append(s.pid), poll_s=0.05, on_infra_failed=on_infra)
    try:
        for _ in range(3):
            deadline = time.monotonic() + 30
            n = len(restarted)
            srv.kill()
            while len(restarted) == n and not failed.is_set():
                assert time.monotonic() < deadline, "the supervisor did not restart the server"
                time.sleep(0.02)
        assert failed.wait(30)
    finally:
        srv.stop()
    assert len(restarted) == 2 and got and got[0].code == INFRA_FAILED
    assert events[-2].kind == "engine_server_infra_failed"
    assert events[-1].kind == "engine_server_stopped"


def test_attach_checks_health_and_never_stops_the_server(script, tmp_path):
    owner, _ = _server(script, tmp_path)
    owner.start()
    try:
        events = []
        ext = EngineServer.attach(owner.url, emit=events.append, start_timeout_s=5)
        ext.start()
        assert ext.external and ext.url == owner.url and ext.alive()
        ext.stop()
        assert owner.healthy()  # attach never stops a server it does not own
        assert events[0].data["external"] is True
    finally:
        owner.stop()
    ext2 = EngineServer.attach(owner.url, start_timeout_s=0.5)
    with pytest.raises(InfraFailedError, match="not healthy"):
        ext2.start()
