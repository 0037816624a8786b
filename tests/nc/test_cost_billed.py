"""``yeto cost`` shows what the marketplace billed per node (the nc provider's ``billed()``)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.nc.helpers import SLEEPER, wait_for
from tests.nc.test_provider import OFFERS
from yeto_core.cli import cli
from yeto_core.config.load import config_to_dict, load_config
from yeto_core.records import IslandLaunch, IslandStatus
from yeto_nc.provider import NcIslands
from yeto_nc.testing import Marketplace


def test_yeto_cost_shows_the_marketplace_billing_per_node(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text(
        'name = "billed"\n[model]\npath = "m"\n[task]\nname = "sort4"\n'
        '[[samplers]]\nname = "node"\nengine = "hf"\nprovider = "nc"\n'
        '[trainer]\nbackend = "torch"\n'
    )
    # the run has started (`yeto cost` on a run that never ran exits 2): its config.json
    config = load_config(run_dir / "run.toml", run_dir=str(run_dir))
    (run_dir / "config.json").write_text(json.dumps(config_to_dict(config)))
    with Marketplace({"offers": OFFERS, "start_delay_s": 0.0}, work_dir=tmp_path / "sim") as m:
        p = NcIslands(run_dir)
        handles = []
        for i in range(2):
            launch = IslandLaunch(
                run_id="billed",
                store_url="dir:///x",
                role="sampler",
                island=f"node-{i}",
                incarnation=0,
                env={},
                options={"url": m.url, "command": SLEEPER, "lease_s": 60, "renew_before_s": 1},
            )
            handles.append(p.launch(launch))
        for h in handles:
            wait_for(lambda h=h: p.status(h) == IslandStatus.RUNNING, what="running")
        wait_for(lambda: all(v > 0 for v in m.billing_usd().values()), what="a billed second")
        assert all(p.release(h) for h in handles)
        market = m.billing_usd()
    out = CliRunner().invoke(cli, ["cost", str(run_dir), "--json"])
    assert out.exit_code == 0, out.output
    billed = json.loads(out.output)["billed"]["nc"]
    assert set(billed) == set(handles)
    for h in handles:
        assert billed[h]["usd"] == market[billed[h]["lease_id"]] > 0, (billed, market)
        assert billed[h]["island"] in ("node-0", "node-1")
    text = CliRunner().invoke(cli, ["cost", str(run_dir)])
    assert "billed by the 'nc' provider" in text.output
    assert f"${sum(market.values()):.6f}" in text.output
