"""Policy release protocol: manifest, LATEST.json last, republish no-op, rewound lineage."""

from __future__ import annotations

import pytest

from yeto_core.errors import ReleaseError
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore


@pytest.fixture
def store(tmp_path):
    return DirStore(tmp_path / "store", fsync=False)


def _export(d, weights: bytes):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(weights)
    return d


def test_publish_latest_fetch(store, tmp_path):
    rs = ReleaseStore(store)
    assert rs.latest() is None
    r1 = rs.publish(
        _export(tmp_path / "e1", b"w1"),
        {"version": 1, "kind": "full", "weight_checksum": "a", "watermark": 8},
    )
    assert r1.release_id == "1" and r1.seq == 1 and r1.info == {"watermark": 8}
    assert rs.latest() == r1
    r2 = rs.publish(
        _export(tmp_path / "e2", b"w2"), {"version": 2, "kind": "full", "weight_checksum": "b"}
    )
    assert rs.latest() == r2 and r2.parent == "1"
    out = rs.fetch(2, tmp_path / "dl")
    assert (out / "model.safetensors").read_bytes() == b"w2"
    assert [r.release_id for r in rs.list()] == ["1", "2"]


def test_republish_same_version_is_noop(store, tmp_path):
    rs = ReleaseStore(store)
    r1 = rs.publish(
        _export(tmp_path / "e1", b"w1"), {"version": 1, "kind": "full", "weight_checksum": "a"}
    )
    before = {k: store.get(k) for k in store.list("releases/")}
    again = rs.publish(
        _export(tmp_path / "e1b", b"w1"), {"version": 1, "kind": "full", "weight_checksum": "a"}
    )
    assert again == r1
    assert {k: store.get(k) for k in store.list("releases/")} == before


def test_rewound_lineage_is_a_new_release_never_an_overwrite(store, tmp_path):
    rs = ReleaseStore(store)
    rs.publish(
        _export(tmp_path / "e1", b"w1"), {"version": 1, "kind": "full", "weight_checksum": "a"}
    )
    r2 = rs.publish(
        _export(tmp_path / "e2", b"w2"), {"version": 2, "kind": "full", "weight_checksum": "b"}
    )
    # A trainer restored from the cut at version 1 trains version 2 again, differently.
    r2b = rs.publish(
        _export(tmp_path / "e2b", b"X2"), {"version": 2, "kind": "full", "weight_checksum": "c"}
    )
    assert r2b.release_id == "2-r1" and r2b.version == 2 and r2b.seq == 3
    assert rs.latest() == r2b
    assert (rs.fetch("2", tmp_path / "old") / "model.safetensors").read_bytes() == b"w2"
    assert rs.get("2") == r2
    assert (rs.fetch(2, tmp_path / "new") / "model.safetensors").read_bytes() == b"X2"


def test_corrupted_file_is_refused(store, tmp_path):
    rs = ReleaseStore(store)
    rs.publish(
        _export(tmp_path / "e1", b"w1"), {"version": 1, "kind": "full", "weight_checksum": "a"}
    )
    store.put("releases/1/model.safetensors", b"zz")
    with pytest.raises(ReleaseError, match="digest check"):
        rs.fetch(1, tmp_path / "dl")
    store.delete("releases/1/model.safetensors")
    with pytest.raises(ReleaseError, match="missing"):
        rs.fetch(1, tmp_path / "dl2")


def test_crash_before_pointer_then_republish_commits_pointer(store, tmp_path):
    rs = ReleaseStore(store)
    rs.publish(
        _export(tmp_path / "e1", b"w1"), {"version": 1, "kind": "full", "weight_checksum": "a"}
    )
    r2 = rs.publish(
        _export(tmp_path / "e2", b"w2"), {"version": 2, "kind": "full", "weight_checksum": "b"}
    )
    r1 = rs.get(1)
    store.put("releases/LATEST.json", store.get("releases/1/manifest.json"))  # pointer lagging
    assert rs.latest() == r1
    assert (
        rs.publish(
            _export(tmp_path / "e2", b"w2"), {"version": 2, "kind": "full", "weight_checksum": "b"}
        )
        == r2
    )
    assert rs.latest() == r2


def test_info_must_name_version_kind_checksum(store, tmp_path):
    with pytest.raises(ReleaseError, match="weight_checksum"):
        ReleaseStore(store).publish(_export(tmp_path / "e", b"w"), {"version": 1, "kind": "full"})


class _GetCounting(DirStore):
    """A dir store recording the key of every get."""

    def __init__(self, root):
        super().__init__(root, fsync=False)
        self.got = []

    def get(self, key):
        self.got.append(key)
        return super().get(key)


def test_a_fetch_links_the_files_the_served_copy_shares_and_downloads_the_rest(tmp_path):
    counting = _GetCounting(tmp_path / "store")
    rs = ReleaseStore(counting)
    for v, w in ((1, b"w1"), (2, b"w2")):
        rs.publish(
            _export(tmp_path / f"e{v}", w),
            {"version": v, "kind": "full", "weight_checksum": w.hex()},
        )
    one = rs.fetch(1, tmp_path / "dl1")
    assert rs.last_fetch["reused_files"] == 0
    counting.got.clear()
    two = rs.fetch(2, tmp_path / "dl2", have=("1", one))
    assert (two / "model.safetensors").read_bytes() == b"w2"
    assert (two / "config.json").read_text() == "{}"
    # config.json has the same digest in both manifests: linked, never requested
    assert (two / "config.json").stat().st_ino == (one / "config.json").stat().st_ino
    assert "releases/2/config.json" not in counting.got
    assert "releases/2/model.safetensors" in counting.got
    assert rs.last_fetch["reused_files"] == 1 and rs.last_fetch["bytes"] == 2
    # a local copy whose file no longer has its size is not trusted: downloaded again
    (two / "config.json").unlink()
    (two / "config.json").write_text("{ }")
    rs.publish(
        _export(tmp_path / "e3", b"w3"), {"version": 3, "kind": "full", "weight_checksum": "c"}
    )
    counting.got.clear()
    three = rs.fetch(3, tmp_path / "dl3", have=("2", two))
    assert "releases/3/config.json" in counting.got
    assert (three / "config.json").read_text() == "{}"
    assert rs.last_fetch["reused_files"] == 0


def test_a_local_copy_this_store_did_not_fetch_is_never_linked(store, tmp_path):
    rs = ReleaseStore(store)
    for v, w in ((1, b"w1"), (2, b"w2")):
        rs.publish(
            _export(tmp_path / f"e{v}", w),
            {"version": v, "kind": "full", "weight_checksum": w.hex()},
        )
    other = _export(tmp_path / "elsewhere", b"w1")  # same names, never verified here
    two = rs.fetch(2, tmp_path / "dl2", have=("1", other))
    assert rs.last_fetch["reused_files"] == 0
    assert (two / "config.json").stat().st_ino != (other / "config.json").stat().st_ino


def test_a_handed_over_export_is_stored_as_itself_and_any_other_is_copied(store, tmp_path):
    """``handoff=True`` (the driver's scratch export, removed right after): the store keeps
    the export's files themselves (the dir store links them: no second copy written);
    without it the caller keeps its files to change as it likes, so they are copied."""
    rs = ReleaseStore(store)
    kept = _export(tmp_path / "kept", b"w1")
    rs.publish(kept, {"version": 1, "kind": "full", "weight_checksum": "a"})
    handed = _export(tmp_path / "handed", b"w2")
    rs.publish(handed, {"version": 2, "kind": "full", "weight_checksum": "b"}, handoff=True)
    root = tmp_path / "store" / "releases"
    for name in ("config.json", "model.safetensors"):
        assert (root / "1" / name).stat().st_ino != (kept / name).stat().st_ino
        assert (root / "2" / name).stat().st_ino == (handed / name).stat().st_ino
    (kept / "model.safetensors").write_bytes(b"the caller's own file, changed")
    assert (rs.fetch(1, tmp_path / "dl1") / "model.safetensors").read_bytes() == b"w1"
    assert (rs.fetch(2, tmp_path / "dl2") / "model.safetensors").read_bytes() == b"w2"


def test_the_pointer_and_manifest_bytes_are_parsed_once_and_changes_are_seen(
    store, tmp_path, monkeypatch
):
    """LATEST.json holds its manifest's bytes: a follower's polls and its fetch's manifest
    read parse them once. New bytes (a new release, a damaged pointer) are parsed."""
    from yeto_core import serde

    rs = ReleaseStore(store)
    pub = ReleaseStore(store)
    r1 = pub.publish(
        _export(tmp_path / "e1", b"w1"), {"version": 1, "kind": "full", "weight_checksum": "a"}
    )
    parsed = []
    real = serde.loads

    def counting(raw, *a, **kw):
        parsed.append(bytes(raw))
        return real(raw, *a, **kw)

    monkeypatch.setattr("yeto_core.release.store.serde.loads", counting)
    assert rs.latest() == r1
    assert rs.latest() == r1
    rs.fetch(rs.latest(), tmp_path / "dl1")
    assert len(parsed) == 1
    r2 = pub.publish(
        _export(tmp_path / "e2", b"w2"), {"version": 2, "kind": "full", "weight_checksum": "b"}
    )
    assert rs.latest() == r2
    assert (rs.fetch(rs.latest(), tmp_path / "dl2") / "model.safetensors").read_bytes() == b"w2"
    assert len(parsed) == 3  # the publisher read the pointer (r1) once; r2 once here
    store.put(rs.pointer_key, b'{"release_id": 3')  # a damaged pointer
    with pytest.raises(ReleaseError, match="Republish a release"):
        rs.latest()
    with pytest.raises(ReleaseError, match="Republish a release"):
        rs.latest()  # never cached
