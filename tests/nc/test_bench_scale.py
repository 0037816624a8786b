"""``yeto bench scale``: the measurement on a small island count (its figures are real
counts: every appended group once per dispense position, requests counted)."""

from __future__ import annotations

from pathlib import Path

from yeto_bench.scale import CountingStore, measure
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.stores.dir_store import DirStore


def test_scale_measure_counts_on_per_host_shards(tmp_path: Path) -> None:
    store = CountingStore(DirStore(tmp_path / "s", fsync=False))
    row = measure(
        store,
        islands=5,
        layout="shards",
        seconds=1.5,
        workers=3,
        prompts_per_call=2,
        groups_per_round=4,
        tick_s=0.05,
    )
    assert row["islands"] == 5 and row["groups_appended"] > 0 and row["head_ticks"] > 0
    assert row["islands_stepped"] == 5
    assert 0 < row["groups_trained"] <= row["groups_appended"]
    assert 0 < row["store_requests"] <= store.calls  # (the set-up's calls are not counted)
    head = FileSampleBuffer(store, host="check", layout="shards", merger=True)
    _ = head.head_position  # the merge
    gids = [e.group_id for e in head.entries(0)]
    assert len(gids) == len(set(gids)) == row["groups_appended"]
