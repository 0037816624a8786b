"""The head with a convertible node slot (real island processes: fake samplers, the real
trainer island with the fake backend): the trainer runs only on the converted slot,
every conversion is journaled, and no group is lost or trained twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from yeto_core.buffer.ledger import BatchLedger
from yeto_core.conversion.local import TO_SAMPLER_STEPS, TO_TRAINER_STEPS
from yeto_core.head.run import EXIT_OK
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_run import fake_head, fake_run_config
from yeto_core.testing.streams import stream_text

pytestmark = pytest.mark.slow

SAMPLER = {"engine": "none", "group_size": 4, "min_round_s": 4.0, "backlog_cap": 6}


def _records(store: Path, prefix: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((store / prefix).glob("*.json"))]


@pytest.mark.timeout(600)
def test_the_trainer_runs_on_a_converted_node_and_gives_it_back(tmp_path: Path) -> None:
    config = fake_run_config(
        tmp_path,
        total_rounds=5,
        wall_clock_s=400.0,
        samplers=[
            dict(SAMPLER, name="sampler", count=2),
            dict(SAMPLER, name="flex", count=1, node_class="convertible"),
        ],
        conversion={"name": "local", "options": {"drain_bound_s": 2.0, "conversion_s": 2.0}},
    )
    head = fake_head(config)
    assert head.run(lambda m: None) == EXIT_OK
    run = Path(config.run_dir)
    store = run / "store"
    s = json.loads((run / "summary.json").read_text())
    assert s["groups_trained"] + sum(s["groups_skipped"].values()) == s["groups_appended"]
    assert s["groups_untrained"] == 0
    checked = BatchLedger(DirStore(store)).check()  # no position trained twice
    assert checked["trained"] == s["groups_trained"]
    steps = _records(store, "head/conversions")
    to_trainer = [r for r in steps if r["kind"] == "to_trainer"]
    to_sampler = [r for r in steps if r["kind"] == "to_sampler"]
    assert {r["node"] for r in steps} == {"flex-0"}
    done_t = [r for r in to_trainer if r["step"] == "done"]
    journal = _records(store, "head/journal")
    print(f"conversions to the trainer: {len(done_t)}, steps journaled: {len(steps)}")
    starts = [r for r in journal if r["kind"] == "start"]
    assert len(done_t) == len(starts) >= 1  # every trainer start was a conversion
    # each conversion took its steps in the one order
    for conv in {r["conversion"] for r in steps}:
        mine = [r["step"] for r in steps if r["conversion"] == conv]
        assert tuple(mine) in (TO_TRAINER_STEPS, TO_SAMPLER_STEPS), mine
    assert len(to_sampler) >= len(TO_SAMPLER_STEPS) * (len(done_t) - 1)
    decisions = [r for r in journal if r["kind"] == "conversion_decision"]
    assert any(r["action"] == "to_trainer" and r["node"] == "flex-0" for r in decisions)
    assert all("inputs" in r and "ranking" in r for r in decisions)
    events = stream_text(store, "head")
    assert events.count('"kind":"conversion_decision"') == len(decisions)
    assert not list((run / "islands").glob("*.json"))


_HEAD = """
import json, sys
from yeto_core.config.load import config_from_dict
from yeto_core.testing.fake_run import fake_head
config = config_from_dict(json.loads(open(sys.argv[1]).read()))
sys.exit(fake_head(config).run(lambda m: None))
"""


def _convertible_config(tmp_path: Path, total_rounds: int):
    return fake_run_config(
        tmp_path,
        total_rounds=total_rounds,
        wall_clock_s=400.0,
        samplers=[
            dict(SAMPLER, name="sampler", count=2),
            dict(SAMPLER, name="flex", count=1, node_class="convertible"),
        ],
        conversion={"name": "local", "options": {"drain_bound_s": 2.0, "conversion_s": 2.0}},
    )


@pytest.mark.timeout(600)
def test_a_head_killed_while_the_slot_trains_is_resolved_by_the_next_head(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    from yeto_core.config.load import config_to_dict

    config = _convertible_config(tmp_path, total_rounds=4)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(config_to_dict(config)))
    store = Path(config.run_dir) / "store"
    first = subprocess.Popen([sys.executable, "-c", _HEAD, str(cfg)])
    try:
        deadline = time.monotonic() + 300
        while not any(
            r["kind"] == "trained" for r in _records(store, "head/journal")
        ):  # the converted slot trains
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        first.kill()
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    last = _records(store, "head/conversions")[-1]
    assert (last["kind"], last["step"]) == ("to_trainer", "done")  # the slot is the trainer

    assert fake_head(config).run(lambda m: None) == EXIT_OK
    steps = _records(store, "head/conversions")
    resolved = [r for r in steps if r["kind"] == "resolved"]
    assert len(resolved) == 1 and resolved[0]["node"] == "flex-0"
    assert resolved[0]["left_at"] == {"kind": "to_trainer", "step": "done"}
    run = Path(config.run_dir)
    s = json.loads((run / "summary.json").read_text())
    assert s["groups_trained"] + sum(s["groups_skipped"].values()) == s["groups_appended"]
    BatchLedger(DirStore(store)).check()
    assert not list((run / "islands").glob("*.json"))
