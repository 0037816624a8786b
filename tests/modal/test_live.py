"""The offline checks again, against the real Modal service (needs a token; costs a few cents).

    YETO_MODAL_LIVE=1 pytest tests/modal/test_live.py

Creates the Volume ``yeto-live-check`` and deploys the app ``yeto-live-check``.
Skipped unless YETO_MODAL_LIVE=1. Not yet run by anyone: see docs/modal.md.
"""

from __future__ import annotations

import os
import time
import uuid
from types import SimpleNamespace as NS

import pytest

from yeto_core.testing.store_contract import ObjectStoreContract
from yeto_modal.provider import CallSeam
from yeto_modal.volume import ModalVolumeStore

pytestmark = pytest.mark.skipif(
    os.environ.get("YETO_MODAL_LIVE") != "1", reason="needs Modal: set YETO_MODAL_LIVE=1"
)
NAME = "yeto-live-check"


class TestLiveVolumeStore(ObjectStoreContract):
    @pytest.fixture
    def store(self):
        return ModalVolumeStore(NAME, f"contract/{uuid.uuid4().hex}")


def _wait(seam, call_id, until, timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state, detail = seam.poll(call_id)
        if until(state):
            return state, detail
        time.sleep(1.0)
    raise AssertionError(f"{call_id} stayed {state}")


def test_spawn_poll_timeout_and_cancel_of_a_real_function():
    import modal

    def body(arg):
        time.sleep(float(arg["s"]))
        return 0

    app = modal.App(NAME)
    fn = app.function(name="sleep", serialized=True, timeout=20, retries=0)(body)
    built = NS(app=app, app_name=NAME, environment=None, functions={"sleep": fn})
    seam = CallSeam()
    seam.deploy(built)
    quick = seam.spawn(built, "sleep", {"s": 0})
    assert _wait(seam, quick, lambda s: s != "pending")[0] == "success"
    slow = seam.spawn(built, "sleep", {"s": 120})
    assert _wait(seam, slow, lambda s: s != "pending")[0] == "timeout"
    held = seam.spawn(built, "sleep", {"s": 600})
    time.sleep(5)
    assert seam.poll(held)[0] == "pending"
    seam.cancel(held, terminate_containers=True)
    state, detail = _wait(seam, held, lambda s: s != "pending", timeout_s=120)
    assert state in ("terminated", "failure"), (state, detail)
    assert seam.poll("fc-0000000000000000000000")[0] == "missing"
