"""The nc provider passes the IslandProvider contract suite (against the simulator)."""

from __future__ import annotations

import pytest

from yeto_core.testing.contracts import IslandProviderContract
from yeto_nc.provider import ENV_URL, NcIslands
from yeto_nc.testing import Marketplace


class TestNcIslandsContract(IslandProviderContract):
    @pytest.fixture
    def make_provider(self, tmp_path, monkeypatch):
        with Marketplace({"start_delay_s": 0.0}, work_dir=tmp_path / "sim") as market:
            monkeypatch.setenv(ENV_URL, market.url)
            yield NcIslands
