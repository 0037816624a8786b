"""Two trainer islands (real processes, the fake backend) training one policy through
the store syncer: every group trained once (``yeto ledger check``), each round by one
island under one outer step, the merged policy published as the samplers' release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from yeto_core.buffer.ledger import BatchLedger
from yeto_core.head.run import EXIT_OK
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.sync.deals import deal_summary
from yeto_core.testing.fake_run import fake_head, fake_run_config
from yeto_core.testing.streams import stream_events


def _pool_config(tmp_path: Path, preset: str = "strict", **kw):
    sync = {"preset": preset, "local_steps": 2}
    if preset == "elastic":
        sync["quorum"] = 1  # a step is decided by the first delta; the other is carried
    return fake_run_config(tmp_path, total_rounds=8, name="pooltest", sync=sync, **kw)


def _with_islands(config, n: int):
    import attrs

    # a strict run needs a horizon (n * local_steps rounds) under the backlog cap, an
    # elastic one (max_carry_age 1) three
    cap = 3 * n * config.sync.local_steps * config.trainer.groups_per_round
    samplers = [attrs.evolve(s, backlog_cap=cap) for s in config.samplers]
    return attrs.evolve(config, trainer=attrs.evolve(config.trainer, islands=n), samplers=samplers)


def _events(config, stream: str) -> list[dict]:
    return stream_events(Path(config.run_dir) / "store", stream)


@pytest.mark.parametrize("preset", ["strict", "elastic"])
def test_two_trainer_islands_share_the_rounds_and_merge(tmp_path: Path, preset: str) -> None:
    from yeto_core.cli import cli

    config = _with_islands(_pool_config(tmp_path, preset), 2)
    assert fake_head(config).run(print) == EXIT_OK
    store = DirStore.from_url(str(Path(config.run_dir) / "store"))
    for args in (["ledger", "check"], ["sync", "replay"]):
        res = CliRunner().invoke(cli, [*args, config.run_dir])
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
    skipped = sum(summary["groups_skipped"].values())
    assert summary["groups_trained"] + skipped == summary["groups_appended"], summary
    finish = [e["data"] for e in _events(config, "trainer") if e["kind"] == "pool_finish"]
    assert finish == [{"reason": "data_end"}]
    latest = ReleaseStore(store).latest()
    assert latest is not None and latest.version == max(r.outer_step for r in rounds)


def test_a_killed_trainer_island_loses_no_round(tmp_path: Path) -> None:
    """SIGKILL one island once it trained a round: it leaves the roster, the rounds it
    held and that no committed step merged are dealt again, and the other island
    finishes the run; the ledger still trains every group once."""
    import os
    import signal
    import threading
    import time

    from yeto_core.cli import cli

    config = _with_islands(_pool_config(tmp_path), 2)
    head = fake_head(config)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(head.run(lambda m: None)))
    thread.start()
    try:
        end = time.monotonic() + 60
        while not any(e["kind"] == "island_round" for e in _events(config, "trainer-1")):
            assert time.monotonic() < end, "trainer-1 trained no round"
            time.sleep(0.02)
        handle = json.loads((Path(config.run_dir) / "islands" / "trainer-1-i0.json").read_text())
        os.killpg(int(handle["pgid"]), signal.SIGKILL)
    finally:
        thread.join(timeout=120)
    assert codes == [EXIT_OK]
    res = CliRunner().invoke(cli, ["ledger", "check", config.run_dir])
    assert res.exit_code == 0, res.output
    pool = [e["data"] for e in _events(config, "trainer") if e["kind"] == "pool_leave"]
    assert pool[0]["island"] == "trainer-1" and pool[0]["reason"] == "exited", pool
    store = DirStore.from_url(str(Path(config.run_dir) / "store"))
    rounds = BatchLedger(store).trained_rounds()
    assert len(rounds) >= config.trainer.total_rounds
    positions = [p for r in rounds for p in r.positions]
    assert len(positions) == len(set(positions))
    # the rounds merged after trainer-1 left are trainer-0's
    last_1 = max((r.outer_step for r in rounds if r.island == "trainer-1"), default=0)
    assert all(r.island == "trainer-0" for r in rounds if r.outer_step > last_1)
