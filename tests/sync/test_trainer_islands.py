"""Two trainer islands (real processes, the fake backend) training one policy through
the store syncer: every group trained once (``yeto ledger check``), each round by one
island under one outer step, the merged policy published as the samplers' release."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from yeto_core.buffer.ledger import BatchLedger
from yeto_core.head.run import EXIT_OK
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.sync.deals import deal_summary
from yeto_core.testing.fake_run import fake_head, fake_run_config


def _pool_config(tmp_path: Path, **kw):
    return fake_run_config(
        tmp_path,
        total_rounds=8,
        name="pooltest",
        sync={"preset": "strict", "local_steps": 2},
        **kw,
    )


def _with_islands(config, n: int):
    import attrs

    # a horizon of every island (n * local_steps rounds) must fit under the backlog cap
    samplers = [attrs.evolve(s, backlog_cap=12) for s in config.samplers]
    return attrs.evolve(config, trainer=attrs.evolve(config.trainer, islands=n), samplers=samplers)


def test_two_trainer_islands_share_the_rounds_and_merge(tmp_path: Path) -> None:
    from yeto_core.cli import cli

    config = _with_islands(_pool_config(tmp_path), 2)
    assert fake_head(config).run(print) == EXIT_OK
    store = DirStore.from_url(str(Path(config.run_dir) / "store"))
    res = CliRunner().invoke(cli, ["ledger", "check", config.run_dir, "--json"])
    assert res.exit_code == 0, res.output
    rounds = BatchLedger(store).trained_rounds()
    assert len(rounds) >= config.trainer.total_rounds
    islands = {r.island for r in rounds}
    assert islands == {"trainer-0", "trainer-1"}, islands
    assert all(r.outer_step is not None and r.outer_step >= 1 for r in rounds)
    # each round trained by one island: a position is dealt again only with a new gen
    deals = deal_summary(store)
    firsts = [d for d in deals if d["gen"] == 0]
    seen = [p for d in firsts for p in d["positions"]]
    assert len(seen) == len(set(seen))
    summary = json.loads((Path(config.run_dir) / "summary.json").read_text())
    assert summary["groups_trained"] == sum(len(r.positions) for r in rounds)
    latest = ReleaseStore(store).latest()
    assert latest is not None and latest.version == max(r.outer_step for r in rounds)
