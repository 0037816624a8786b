"""The live dashboard: a small Starlette app served by uvicorn on 127.0.0.1.

Routes: ``/`` the page, ``/api/data`` the views as JSON (what
:func:`yeto_dashboard.model.build` returns; an ``ETag`` lets the page skip
unchanged data), ``/static/...`` the page's script, styles and the vendored
chart library. The data is read again from the run at most once per
``refresh_s`` whatever the number of open pages.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Optional

from yeto_dashboard.model import RewardCache, build, snapshot
from yeto_dashboard.page import STATIC_DIR, render_page

HOST = "127.0.0.1"


class DataCache:
    """The views of one run, read again when older than ``max_age_s``."""

    def __init__(self, source: Any, max_age_s: float) -> None:
        self.source = source
        self.max_age_s = max_age_s
        self.rewards = RewardCache()
        self._lock = threading.Lock()
        self._at = -1e18
        self.body = b""
        self.etag = ""
        self.error: Optional[str] = None

    def get(self) -> tuple[bytes, str]:
        """The newest views and their ETag; a failed read keeps the last good views."""
        with self._lock:
            if time.monotonic() - self._at >= self.max_age_s:
                try:
                    data = build(snapshot(self.source, self.rewards))
                except Exception as exc:  # keep serving what was read; say what failed
                    self._at = time.monotonic()
                    self.error = f"{type(exc).__name__}: {exc}"
                    print(f"yeto dashboard: reading the run failed: {self.error}", file=sys.stderr)
                    if not self.body:
                        raise
                    return self.body, self.etag
                self.error = None
                stable = dict(
                    data, meta={k: v for k, v in data["meta"].items() if k != "generated_at"}
                )
                digest = hashlib.sha256(
                    json.dumps(stable, sort_keys=True, default=str).encode()
                ).hexdigest()[:20]
                self.body = json.dumps(data, default=str, allow_nan=False).encode()
                self.etag = f'"{digest}"'
                self._at = time.monotonic()
            return self.body, self.etag


def make_app(source: Any, *, refresh_s: float = 1.0) -> Any:
    """The Starlette app that shows ``source`` (a :class:`~yeto_dashboard.source.RunSource`)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    cache = DataCache(source, max_age_s=max(0.2, refresh_s * 0.8))
    page = render_page(mode="live", refresh_s=refresh_s, title=source.label)

    def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    def data(request: Request) -> Response:
        try:
            body, etag = cache.get()
        except Exception as exc:
            return JSONResponse(
                {"error": f"cannot read the run {source.label}: {type(exc).__name__}: {exc}"},
                status_code=503,
            )
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="application/json", headers=headers)

    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/data", data),
            Mount("/static", app=StaticFiles(directory=str(STATIC_DIR)), name="static"),
        ]
    )


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port`` (0: a free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as exc:
        sock.close()
        import click

        raise click.ClickException(
            f"cannot listen on {HOST}:{port} ({exc.strerror}); pick another --port (0: any free one)"
        ) from None
    sock.listen(64)
    return sock


def serve(
    source: Any, *, port: int = 8765, refresh_s: float = 1.0, say: Callable[[str], None] = print
) -> None:
    """Serve the dashboard of ``source`` until Ctrl-C."""
    import uvicorn

    sock = bind(port)
    url = f"http://{HOST}:{sock.getsockname()[1]}/"
    app = make_app(source, refresh_s=refresh_s)
    say(f"yeto dashboard of {source.label}: {url}  (Ctrl-C stops it; the run is only read)")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])
