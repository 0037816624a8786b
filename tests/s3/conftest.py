"""A real S3-compatible server (moto) on 127.0.0.1 for the whole session."""

from __future__ import annotations

import itertools
import re

import pytest

from yeto_s3.store import S3Store
from yeto_s3.testing import create_bucket, s3_options, start_moto_server

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
