"""The torch backend hands its parameters to the syncer and takes merged ones back
(several trainer islands, docs/sync.md), keeping its optimizer state."""

from __future__ import annotations

import numpy as np
import pytest

from yeto_core.errors import CutError
from yeto_torch.backend import TorchBackend
from yeto_torch.testing import fixed_batches


def test_parameters_round_trip_and_keep_the_optimizer(sort_base):
    be = TorchBackend(str(sort_base), lr=5e-3, seed=0)
    be.restore(None)
    start = be.parameters()
    assert start and all(isinstance(v, np.ndarray) for v in start.values())
    be.train_round(fixed_batches(sort_base, 1)[0])
    trained = be.parameters()
    assert any(not np.array_equal(start[k], trained[k]) for k in start)
    opt = {k: v.clone() for k, v in be.state_tensors().items() if k.startswith("opt.")}
    assert opt
    be.load_parameters(start)
    back = be.parameters()
    assert all(np.array_equal(start[k], back[k]) for k in start)
    after = be.state_tensors()
    assert all(bool((after[k] == v).all()) for k, v in opt.items())  # AdamW state kept
    with pytest.raises(CutError, match="another model"):
        be.load_parameters({**start, "nope": np.zeros(1, dtype=np.float32)})
    name = next(iter(start))
    with pytest.raises(CutError, match="shape"):
        be.load_parameters({**start, name: np.zeros(1, dtype=start[name].dtype)})
