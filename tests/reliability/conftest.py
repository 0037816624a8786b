"""Stores for the single-writer tests: ``dir``, moto and SeaweedFS on 127.0.0.1."""

from __future__ import annotations

import itertools

import pytest

_counter = itertools.count()
BUCKET = "yeto-rel"


@pytest.fixture(scope="session")
def rel_moto():
    from yeto_s3.testing import create_bucket, start_moto_server

    endpoint_url, stop = start_moto_server()
    create_bucket(endpoint_url, BUCKET)
    yield endpoint_url
    stop()


@pytest.fixture(scope="session")
def rel_seaweedfs():
    from yeto_s3.testing import create_bucket_when_ready, start_seaweedfs_server

    endpoint_url, stop = start_seaweedfs_server()
    try:
        create_bucket_when_ready(endpoint_url, BUCKET)
        yield endpoint_url
    finally:
        stop()


@pytest.fixture(params=["dir", "moto", "seaweedfs"])
def any_store(request, tmp_path):
    """A fresh empty store of each kind."""
    if request.param == "dir":
        from yeto_core.stores.dir_store import DirStore

        return DirStore(tmp_path / "store", fsync=False)
    from yeto_s3.store import S3Store
    from yeto_s3.testing import s3_options

    endpoint = request.getfixturevalue(f"rel_{request.param}")
    extra = {"list_order": "sorted"} if request.param == "seaweedfs" else {}
    url = f"s3://{BUCKET}/t{next(_counter):04d}"
    return S3Store.from_url(url, **extra, **s3_options(endpoint))
