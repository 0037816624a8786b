"""The modal provider passes yeto-core's IslandProvider contract (through the call seam double).

Each "container" runs the island function's real body through ``Function.local()``;
the body runs the launch's entry module (the contract's idle island).
"""

from __future__ import annotations

import pytest
import tomllib

from yeto_core.config.load import parse_config
from yeto_core.testing.contracts import IslandProviderContract
from yeto_modal.provider import ModalIslands

CONFIG = """
name = "contract"
run_dir = "runs/contract"
store = "s3://bucket/contract"
[model]
path = "runs/base/none"
[task]
name = "sort4"
[[samplers]]
name = "sampler"
engine = "hf"
provider = "modal"
provider_options = { cpu = 1 }
[trainer]
backend = "torch"
provider = "modal"
"""


class TestModalIslandsContract(IslandProviderContract):
    @pytest.fixture
    def make_provider(self, call_service):
        config = parse_config(tomllib.loads(CONFIG))

        def make(state_dir):
            return ModalIslands(
                state_dir,
                seam=type(call_service)(call_service.root),
                load_config=lambda url: config,
            )

        return make
