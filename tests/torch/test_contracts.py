"""yeto-torch's built-ins run their ports' contracts: the ``torch`` backend, the ``hf`` engine
(loading releases the backend published) and the built-in tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from yeto_core.plugins import Plugins
from yeto_core.records import LocalRelease, ReleaseInfo
from yeto_core.testing.contracts import SamplerEngineContract, TaskContract, TrainerBackendContract
from yeto_torch.backend import TorchBackend
from yeto_torch.engine import HFEngine


class TestTorchBackend(TrainerBackendContract):
    @pytest.fixture
    def make_backend(self, sort_base):
        return lambda: TorchBackend(str(sort_base), lr=5e-4, seed=0)


class TestHFEngine(SamplerEngineContract):
    @pytest.fixture
    def make_engine(self, sort_base):
        return lambda: HFEngine(str(sort_base), seed=1)

    @pytest.fixture
    def make_release(self, sort_base):
        def make(tmp_path: Path, version: int) -> LocalRelease:
            backend = TorchBackend(str(sort_base), lr=5e-4, seed=0)
            backend.restore(None)
            backend.train_round(TrainerBackendContract().batch(version))
            out = tmp_path / f"release-{version}"
            out.mkdir()
            info = ReleaseInfo.coerce(backend.publish_release(out))
            return LocalRelease(
                version=version,
                release_id=str(version),
                path=str(out),
                kind=info.kind,
                weight_checksum=info.weight_checksum,
            )

        return make


@pytest.fixture(params=["sort4", "add1", "add2"])
def task_name(request):
    return request.param


class TestBuiltinTasks(TaskContract):
    @pytest.fixture
    def make_task(self, task_name):
        from yeto_torch import plugin

        plugins = Plugins(entry_points=False)
        plugins.add(plugin, "torch")
        return plugins.task(task_name)
