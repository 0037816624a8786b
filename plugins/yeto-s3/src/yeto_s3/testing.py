"""A real S3-compatible server on loopback for tests: moto's server in a thread.

Tests in any folder use it like this::

    from yeto_s3.testing import start_moto_server, create_bucket, s3_env

    endpoint_url, stop = start_moto_server()
    create_bucket(endpoint_url, "runs")
    os.environ.update(s3_env(endpoint_url))      # or pass the options explicitly
    store = S3Store.from_url("s3://runs/demo", **s3_options(endpoint_url))
    ...
    stop()

moto checks ``If-None-Match`` and then writes without a lock, so two requests
racing in its threaded server could both create a key, which S3 itself never
allows. The server here serializes writing requests (PUT, POST, DELETE) so it
keeps S3's promise; reads stay concurrent. This module imports moto, so only
tests import it (moto is not a dependency of yeto-s3).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: Dummy credentials the test server accepts (moto checks no signatures).
TEST_ACCESS_KEY_ID = "yeto-test-key-id"
TEST_SECRET_ACCESS_KEY = "yeto-test-secret-not-a-real-one"
TEST_REGION = "us-east-1"

_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})


class _SerializedWrites:
    """WSGI middleware: one writing request at a time, so conditional writes are atomic."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        if environ.get("REQUEST_METHOD", "GET") not in _WRITE_METHODS:
            return self.app(environ, start_response)
        with self.lock:
            # Consume the response inside the lock: moto may do its work lazily.
            return list(self.app(environ, start_response))


def start_moto_server(host: str = "127.0.0.1", port: int = 0) -> tuple[str, Callable[[], None]]:
    """Start moto's S3-compatible server on ``host`` (a free port by default).

    :returns: ``(endpoint_url, stop)``; call ``stop()`` to shut it down.
    """
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = _SerializedWrites(DomainDispatcherApplication(create_backend_app))
    server = make_server(host, port, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-server", daemon=True)
    thread.start()
    bound_host, bound_port = server.server_address[:2]
    endpoint_url = f"http://{bound_host}:{bound_port}"

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)

    return endpoint_url, stop


def s3_options(endpoint_url: str) -> dict[str, str]:
    """Explicit store options for the test server (``S3Store.from_url(url, **options)``)."""
    return {
        "access_key_id": TEST_ACCESS_KEY_ID,
        "secret_access_key": TEST_SECRET_ACCESS_KEY,
        "endpoint_url": endpoint_url,
        "region": TEST_REGION,
    }


def s3_env(endpoint_url: str) -> dict[str, str]:
    """The ``YETO_STORE_S3_*`` environment for the test server (for child processes)."""
    return {
        "YETO_STORE_S3_ACCESS_KEY_ID": TEST_ACCESS_KEY_ID,
        "YETO_STORE_S3_SECRET_ACCESS_KEY": TEST_SECRET_ACCESS_KEY,
        "YETO_STORE_S3_ENDPOINT_URL": endpoint_url,
        "YETO_STORE_S3_REGION": TEST_REGION,
    }


def create_bucket(endpoint_url: str, bucket: str) -> None:
    """Create ``bucket`` on the test server with the dummy credentials (idempotent)."""
    from yeto_s3.store import make_client

    client = make_client(**s3_options(endpoint_url))
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
