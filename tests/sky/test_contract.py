"""The core's IslandProvider contract suite, run on the sky provider through the seam's double."""

from __future__ import annotations

import pytest
from sky_double import LocalCloud

from yeto_core.testing.contracts import IslandProviderContract
from yeto_sky.provider import SkyIslands


class TestSkyIslandsContract(IslandProviderContract):
    @pytest.fixture
    def make_provider(self, tmp_path):
        cloud = LocalCloud(tmp_path / "cloud")
        made = []

        def make(state_dir):
            p = SkyIslands(state_dir, seam=cloud, poll_s=0.05)
            made.append(p)
            return p

        yield make
        for p in made:
            p.close()
        cloud.shutdown()
