"""The core's SamplerEngine contract suite, run on the sglang engine (protocol server)."""

from __future__ import annotations

import pytest
from sgl_helpers import make_full_release

from yeto_core.testing.contracts import SamplerEngineContract


class TestSGLangEngineContract(SamplerEngineContract):
    @pytest.fixture
    def make_engine(self, tiny_base):
        if __import__("os").environ.get("YETO_SGLANG_URL"):
            pytest.skip("the contract loads releases into fresh protocol servers")
        from yeto_sglang.engine import SGLangEngine
        from yeto_sglang.testing.server import ProtocolServer

        servers = []

        def make():
            srv = ProtocolServer(str(tiny_base), weight_version="0", random_seed=4).start()
            servers.append(srv)
            # top-p without top-k is in the contract's sampling: request the whole nucleus
            return SGLangEngine(str(tiny_base), base_url=srv.url, nucleus_top_logprobs=16)

        yield make
        for srv in servers:
            srv.stop()
            assert srv.violations == [], srv.violations

    @pytest.fixture
    def make_release(self, tiny_base):
        return lambda tmp_path, version: make_full_release(
            tiny_base, tmp_path / f"r{version}", seed=version
        )
