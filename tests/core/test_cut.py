"""Consistent cut protocol: shards, manifest, LATEST last; invalid cuts are never restored."""

from __future__ import annotations

import pytest

from yeto_core.errors import ConfigError, CutError
from yeto_core.records import Trigger
from yeto_core.stores.dir_store import DirStore
from yeto_core.trainer.cut import ConsistentCut, CutStore


@pytest.fixture
def store(tmp_path):
    return DirStore(tmp_path / "store", fsync=False)


def _shards(d, payload: bytes):
    d.mkdir(parents=True, exist_ok=True)
    (d / "weights.bin").write_bytes(payload)
    (d / "sub").mkdir(exist_ok=True)
    (d / "sub" / "state.json").write_text('{"k": 1}')
    return d


def _record(inc=1, rounds=3, trigger=Trigger.SCHEDULED):
    return ConsistentCut(
        trigger=trigger,
        policy_version=rounds,
        trained_rounds=rounds,
        buffer_watermark=rounds * 4,
        incarnation=inc,
    )


def test_commit_then_restore_roundtrip(store, tmp_path):
    events = []
    cuts = CutStore(store, emit=events.append, clock=lambda: 5.0)
    assert cuts.latest_valid(tmp_path / "dl") is None
    cut = cuts.commit(_shards(tmp_path / "a", b"w1"), _record())
    assert cut.cut_id == "c00000001-i1-scheduled"
    assert store.get("cuts/LATEST").decode() == cut.cut_id
    assert {f.name for f in cut.files} == {"weights.bin", "sub/state.json"}
    got, path = cuts.latest_valid(tmp_path / "dl")
    assert got == cut
    assert (path / "weights.bin").read_bytes() == b"w1"
    assert (path / "sub" / "state.json").read_text() == '{"k": 1}'
    assert [e.kind for e in events] == ["cut_committed"]


def test_corrupt_shard_falls_back_to_older_cut_with_event(store, tmp_path):
    events = []
    cuts = CutStore(store, emit=events.append)
    old = cuts.commit(_shards(tmp_path / "a", b"old"), _record(rounds=1))
    new = cuts.commit(_shards(tmp_path / "b", b"new"), _record(rounds=2))
    store.put(f"cuts/{new.cut_id}/weights.bin", b"NEW")  # same size, other bytes
    got, path = cuts.latest_valid(tmp_path / "dl")
    assert got.cut_id == old.cut_id and (path / "weights.bin").read_bytes() == b"old"
    bad = [e for e in events if e.kind == "cut_invalid"]
    assert bad and bad[0].data["cut_id"] == new.cut_id and "sha256" in bad[0].data["problem"]
    assert any(e.kind == "cut_fallback" for e in events)
    assert not (tmp_path / "dl" / new.cut_id).exists()


def test_missing_or_garbled_manifest_is_never_restored(store, tmp_path):
    events = []
    cuts = CutStore(store, emit=events.append)
    c1 = cuts.commit(_shards(tmp_path / "a", b"1"), _record(rounds=1))
    c2 = cuts.commit(_shards(tmp_path / "b", b"2"), _record(rounds=2))
    c3 = cuts.commit(_shards(tmp_path / "c", b"3"), _record(rounds=3))
    store.put(f"cuts/{c3.cut_id}/manifest.json", b"{not json")
    store.delete(f"cuts/{c2.cut_id}/manifest.json")
    got, _ = cuts.latest_valid(tmp_path / "dl")
    assert got.cut_id == c1.cut_id
    assert [e.data["cut_id"] for e in events if e.kind == "cut_invalid"] == [c3.cut_id, c2.cut_id]
    with pytest.raises(CutError, match="never committed"):
        cuts.read_manifest(c2.cut_id)


def test_uncommitted_cut_after_latest_is_ignored(store, tmp_path):
    cuts = CutStore(store)
    c1 = cuts.commit(_shards(tmp_path / "a", b"1"), _record(rounds=1))
    # A crash after the shards and the manifest but before the pointer of cut 2.
    store.put("cuts/c00000002-i1-scheduled/weights.bin", b"2")
    store.put(
        "cuts/c00000002-i1-scheduled/manifest.json", store.get(f"cuts/{c1.cut_id}/manifest.json")
    )
    got, _ = cuts.latest_valid(tmp_path / "dl")
    assert got.cut_id == c1.cut_id
    # The next commit never reuses the half-written directory's number.
    c3 = cuts.commit(_shards(tmp_path / "b", b"3"), _record(rounds=3))
    assert c3.cut_id.startswith("c00000003-")


def test_retention_keeps_last_k(store, tmp_path):
    cuts = CutStore(store, keep=2)
    made = [
        cuts.commit(_shards(tmp_path / f"s{i}", bytes([i])), _record(rounds=i)) for i in range(5)
    ]
    assert [c.cut_id for c in cuts.list()] == [c.cut_id for c in made[-2:]]
    assert not list(store.list(f"cuts/{made[0].cut_id}/"))
    with pytest.raises(ConfigError):
        CutStore(store, keep=0)


def test_empty_cut_dir_is_refused(store, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="wrote nothing"):
        CutStore(store).commit(tmp_path / "empty", _record())
