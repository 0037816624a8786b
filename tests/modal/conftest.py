"""Fixtures over the doubles of yeto-modal's SDK seams (``modal_doubles.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from modal_doubles import CallService, VolumeSeamDouble, VolumeService

from yeto_core.testing.waiting import wait_for


@pytest.fixture
def volume_service() -> VolumeService:
    return VolumeService()


@pytest.fixture
def volume_double():
    """(VolumeService, VolumeSeamDouble) classes for tests that build several."""
    return VolumeService, VolumeSeamDouble


@pytest.fixture
def call_service(tmp_path):
    service = CallService(tmp_path / "modal-service")
    yield service
    service.stop_all()


@pytest.fixture
def wait_until():
    def wait(predicate, timeout_s: float = 60.0, what: str = "condition"):
        return wait_for(predicate, timeout_s, what, every_s=0.05)

    return wait


@pytest.fixture(scope="session", autouse=True)
def wheel_cache(tmp_path_factory):
    """The run's wheels built at launch are cached per session, not in the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("YETO_WHEEL_CACHE", str(tmp_path_factory.mktemp("wheel-cache")))
        yield
