"""The publisher's kept parent: hard links to the export, never a stale parent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_torch.delta import NumpyZstdCodec


def _write(d: Path, w: np.ndarray) -> None:
    d.mkdir(parents=True, exist_ok=True)
    save_file({"w": w}, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text("{}\n")


def _weights(seed: int, base: np.ndarray | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if base is None:
        return (rng.standard_normal(40_000) * 0.02).astype(np.float16)
    out = base.copy()
    out[rng.choice(out.size, 300, replace=False)] += np.float16(0.01)
    return out


def _info(v: int) -> dict:
    return {"version": v, "kind": "full", "weight_checksum": f"sha256:{v}"}


def _served(rs: ReleaseStore, rel, dest: Path) -> bytes:
    rs.fetch(rel, dest)
    return (dest / "model.safetensors").read_bytes()


def test_an_export_rewritten_in_place_is_never_a_stale_parent(tmp_path):
    """A caller that rewrites its export directory in place (same files) between two
    publications: the kept parent is not a snapshot of the first export any more, so the
    second release is full, says why, and serves exactly the second export."""
    store = DirStore(tmp_path / "store", fsync=False)
    rs = ReleaseStore(store, codec=NumpyZstdCodec(), deltas="on", full_every=8)
    out = tmp_path / "export"
    w1 = _weights(1)
    _write(out, w1)
    rs.publish(out, _info(1))
    w2 = _weights(2, w1)
    with open(out / "model.safetensors", "r+b") as f:  # in place: same inode, same size
        _write(tmp_path / "tmp2", w2)
        f.write((tmp_path / "tmp2" / "model.safetensors").read_bytes())
    rel2 = rs.publish(out, _info(2))
    assert rel2.encoding == "full", rs.last_publish
    assert "changed since it was published" in rs.last_publish["full_because"]
    assert _served(rs, rel2, tmp_path / "f2") == (out / "model.safetensors").read_bytes()
    # the next publication from a fresh export directory is a delta again, and exact
    out3 = tmp_path / "export3"
    _write(out3, _weights(3, w2))
    rel3 = rs.publish(out3, _info(3))
    assert rel3.encoding == "delta", rs.last_publish
    assert _served(rs, rel3, tmp_path / "f3") == (out3 / "model.safetensors").read_bytes()


def test_the_kept_parent_is_linked_not_copied_and_one_at_a_time(tmp_path):
    store = DirStore(tmp_path / "store", fsync=False)
    rs = ReleaseStore(store, codec=NumpyZstdCodec(), deltas="on", full_every=8)
    w = _weights(1)
    for v in (1, 2, 3):
        out = tmp_path / f"release-{v}"
        _write(out, w)
        rs.publish(out, _info(v))
        kept = tmp_path / f"release-{v}.parent" / "model.safetensors"
        assert kept.stat().st_ino == (out / "model.safetensors").stat().st_ino
        w = _weights(v + 1, w)
    parents = sorted(p.name for p in tmp_path.glob("*.parent"))
    assert parents == ["release-3.parent"]


def test_a_republication_reports_itself_not_the_previous_publication(tmp_path):
    store = DirStore(tmp_path / "store", fsync=False)
    rs = ReleaseStore(store, codec=NumpyZstdCodec(), deltas="on", full_every=8)
    w1 = _weights(1)
    _write(tmp_path / "e1", w1)
    rs.publish(tmp_path / "e1", _info(1))
    _write(tmp_path / "e2", _weights(2, w1))
    assert rs.publish(tmp_path / "e2", _info(2)).encoding == "delta"
    assert rs.last_publish["stored_bytes"] > 0
    again = ReleaseStore(store, codec=NumpyZstdCodec(), deltas="on")  # a new incarnation
    _write(tmp_path / "e2b", _weights(2, w1))
    again.publish(tmp_path / "e2b", _info(2))
    assert again.last_publish["republished"] is True
    assert again.last_publish["stored_bytes"] == 0 and again.last_publish["encoding"] == "delta"
    rs.publish(tmp_path / "e2", _info(2))  # the same publisher again: not its delta's figures
    assert rs.last_publish["republished"] is True and rs.last_publish["stored_bytes"] == 0


def test_a_handed_over_export_kept_as_parent_is_copied_into_the_store(tmp_path):
    """With the export kept as the next delta's parent, the store never keeps the export's
    own files (handoff or not): damage to the working copy stays out of the release. The
    delta's files, which nothing keeps, are linked."""
    store = DirStore(tmp_path / "store", fsync=False)
    rs = ReleaseStore(store, codec=NumpyZstdCodec(), deltas="on", full_every=8)
    w = _weights(1)
    for v in (1, 2):
        out = tmp_path / f"release-{v}"
        _write(out, w)
        rel = rs.publish(out, _info(v), handoff=True)
        stored = tmp_path / "store" / "releases" / rel.release_id
        kept = tmp_path / f"release-{v}.parent"
        for f in stored.iterdir():
            if (kept / f.name).exists():
                assert f.stat().st_ino != (kept / f.name).stat().st_ino, f.name
        w = _weights(v + 1, w)
    assert rel.encoding == "delta"
    want = (kept / "model.safetensors").read_bytes()
    with open(kept / "model.safetensors", "r+b") as f:  # the working copy damaged in place
        f.write(b"\0" * 64)
    assert _served(rs, rel, tmp_path / "f2") == want
