"""A warm sort4 base, made once per session (seeded, a few seconds)."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def sort_base(tmp_path_factory):
    from yeto_torch.warmup import make_base

    return make_base(tmp_path_factory.mktemp("bases") / "sort4", "sort4", seed=0)
