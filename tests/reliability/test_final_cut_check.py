"""A final cut damaged after it was committed is detected before the run is called finished.

Regression (the ``corrupt`` fault of ``yeto bench chaos``): a flipped byte in the last cut's
shard, landing after the trainer committed it, was never read again, so the run wrote
FINISHED with ``cuts/LATEST`` naming an invalid cut. Now the head reads the final cut back:
a bad one is a ``cut_invalid`` event (``final``, naming the newest valid cut), a message,
exit 1 and no FINISHED. (Training the rest again from the newest valid cut is not built.)
"""

from __future__ import annotations

import json
from pathlib import Path

from yeto_core.events.stream import read_events
from yeto_core.head.run import EXIT_FAILED
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_run import fake_head, fake_run_config
from yeto_core.trainer.cut import CutStore


def _flip_largest_shard(store: DirStore) -> str:
    cuts = CutStore(store)
    cut_id = cuts.latest_id()
    assert cut_id is not None
    files = [k for k in store.list(f"cuts/{cut_id}/") if not k.endswith("manifest.json")]
    key = max(files, key=lambda k: len(store.get(k)))
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0x01
    store.put(key, bytes(data))
    return cut_id


def test_a_final_cut_damaged_after_its_commit_is_detected_and_the_run_not_marked_finished(
    tmp_path: Path,
) -> None:
    config = fake_run_config(tmp_path, total_rounds=4)
    store = DirStore(Path(config.run_dir) / "store", fsync=False)
    head = fake_head(config)
    flipped: list[str] = []
    real_stop = head.stop_trainer

    def stop_then_flip() -> None:
        real_stop()  # the trainer drained, took its final cut and left
        flipped.append(_flip_largest_shard(store))

    head.stop_trainer = stop_then_flip  # type: ignore[method-assign]
    said: list[str] = []
    assert head.run(said.append) == EXIT_FAILED  # before: EXIT_OK and FINISHED
    assert flipped
    run_dir = Path(config.run_dir)
    assert not (run_dir / "FINISHED").exists()
    bad = [e.data for e in read_events(store, "head") if e.kind == "cut_invalid"]
    assert bad and bad[0]["cut_id"] == flipped[0] and bad[0]["final"] is True
    assert any("final cut" in m and flipped[0] in m for m in said), said
    summary = json.loads((run_dir / "summary.json").read_text())
    assert any("final cut" in e for e in summary["errors"])

    # Nothing restores the damaged cut: a second head says the same and exits 1 again.
    again: list[str] = []
    assert fake_head(config).run(again.append) == EXIT_FAILED
    assert not (run_dir / "FINISHED").exists()
    assert any("final cut" in m and flipped[0] in m for m in again), again
    starts = [
        e.data.get("cut_id")
        for e in read_events(store, "trainer")
        if e.kind == "trainer_start_summary"
    ]
    assert flipped[0] not in starts
