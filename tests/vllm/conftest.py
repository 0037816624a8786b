"""One real vLLM server per test session (``make vllm-venv`` builds its environment).

The server serves the warm sort4 base in float32 on 127.0.0.1 with runtime LoRA
enabled; every test starts from the base weights (``restore_base``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("YETO_VLLM_VENV", ROOT / "build" / "vllm-venv"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
NOT_BUILT = (
    f"the vLLM server environment {VLLM_VENV} is not built: run `make vllm-venv` "
    "(`make test` builds it first)"
)


def vllm_built() -> bool:
    return (VLLM_VENV / ".installed").is_file() and VLLM_PYTHON.exists()


@pytest.fixture(scope="session")
def vllm_python() -> str:
    if not vllm_built():
        pytest.skip(NOT_BUILT)
    return str(VLLM_PYTHON)


@pytest.fixture(scope="session")
def sort_base(tmp_path_factory):
    import torch

    from yeto_torch.warmup import make_base

    torch.set_num_threads(1)  # leave the other core to the server
    return make_base(tmp_path_factory.mktemp("bases") / "sort4", "sort4", seed=0)


@pytest.fixture(scope="session")
def vllm_session(vllm_python, sort_base, tmp_path_factory):
    from yeto_vllm.engine import VLLMEngine

    events: list = []
    logs = tmp_path_factory.mktemp("vllm-logs")
    eng = VLLMEngine(
        str(sort_base),
        python=vllm_python,
        lora=True,
        seed=0,
        emit=events.append,
        log_dir=str(logs),
        start_timeout_s=600,
        backoff_s=0.5,
        watch_s=0.5,
    )
    eng.test_events = events  # type: ignore[attr-defined]
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture
def vllm_engine(vllm_session):
    """The session's engine, serving the base weights (version 0)."""
    vllm_session.restore_base()
    vllm_session.test_events.clear()
    return vllm_session
