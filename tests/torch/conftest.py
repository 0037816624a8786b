"""Shared fixtures: warm bases made once per session (seeded, a few seconds each)."""

from __future__ import annotations

import pytest
import torch

from yeto_torch.testing import rollout_batch  # noqa: F401  (re-exported for tests)

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def sort_base(tmp_path_factory):
    from yeto_torch.warmup import make_base

    return make_base(tmp_path_factory.mktemp("bases") / "sort4", "sort4", seed=0)
