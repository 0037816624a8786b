"""Delta releases end to end: the torch trainer's real GRPO step publishes bf16 releases
(full every K, deltas between), a follower with the hf engine rebuilds and serves them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from yeto_core import serde
from yeto_core.release.store import Release, ReleaseStore
from yeto_core.sampler import fingerprint
from yeto_core.sampler.follower import PolicyFollower
from yeto_core.stores.dir_store import DirStore
from yeto_torch.backend import TorchBackend
from yeto_torch.delta import NumpyZstdCodec
from yeto_torch.engine import HFEngine
from yeto_torch.testing import fixed_batches


def _files(d: Path) -> dict[str, bytes]:
    return {
        p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()
    }


class Trainer:
    """The torch backend (float32 masters, bf16 exports unless told) publishing after
    every round (also used by tests/vllm/test_vllm_deltas.py)."""

    def __init__(
        self,
        base: Path,
        store: DirStore,
        work: Path,
        *,
        full_every: int,
        lr: float,
        export_dtype: str = "bfloat16",
    ):
        self.backend = TorchBackend(str(base), lr=lr, seed=0, export_dtype=export_dtype)
        self.backend.restore(None)
        self.releases = ReleaseStore(
            store, codec=NumpyZstdCodec(), deltas="on", full_every=full_every
        )
        self.batches = fixed_batches(base, 6, prompts=4, g=4)
        self.work = work
        self.version = 0
        self.exports: dict[str, dict[str, bytes]] = {}

    def step(self) -> Release:
        self.backend.train_round(self.batches[self.version % len(self.batches)])
        self.version += 1
        out = self.work / "release"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        info = dict(self.backend.publish_release(out))
        info[fingerprint.INFO_KEY] = fingerprint.for_backend(self.backend).to_json()
        info["version"] = self.version
        rel = self.releases.publish(out, info)
        self.exports[rel.release_id] = _files(out)
        return rel


def delta_follower(store: DirStore, engine, work_dir: Path, **options) -> tuple:
    """A :class:`PolicyFollower` of ``store``'s releases that can apply deltas (the torch
    plugin's codec) for ``engine``, and the list its events go to (also used by the vllm
    and sglang delta tests)."""
    events: list = []
    follower = PolicyFollower(
        ReleaseStore(store, codec=NumpyZstdCodec()),
        engine,
        work_dir=work_dir,
        emit=events.append,
        **options,
    )
    return follower, events


@pytest.fixture
def world(tmp_path, sort_base):
    store = DirStore(tmp_path / "store", fsync=False)

    def make(full_every: int = 3, lr: float = 2e-4):
        trainer = Trainer(sort_base, store, tmp_path / "trainer", full_every=full_every, lr=lr)
        engine = HFEngine(str(sort_base), seed=0, dtype="bfloat16")
        follower, events = delta_follower(store, engine, tmp_path / "follower")
        return trainer, follower, engine, events

    return make


def _loaded(events):
    return [e.data for e in events if e.kind == "release_loaded"][-1]


def _refused(events):
    return [e.data for e in events if e.kind == "release_refused"][-1]


def test_follower_applying_n_deltas_serves_the_full_export_bitwise(world):
    trainer, follower, engine, events = world(full_every=3)
    encodings = []
    for _ in range(5):
        rel = trainer.step()
        encodings.append(rel.encoding)
        assert follower.poll() == "loaded"
        served = Path(follower._current.path)
        assert _files(served) == trainer.exports[rel.release_id]  # bit-identical to the full export
        assert engine.served_checksum() == rel.weight_checksum
        assert _loaded(events)["verified"] is True
        assert _loaded(events)["encoding"] == rel.encoding
        assert _loaded(events)["chain"] == [rel.release_id]  # rebuilt on the served copy
        if rel.encoding == "delta":
            assert _loaded(events)["from"] == str(rel.delta["parent"])
    assert encodings == ["full", "delta", "delta", "full", "delta"]
    deltas = [r for r in trainer.releases.list() if r.encoding == "delta"]
    for r in deltas:  # what was shipped is a fraction of the export
        assert sum(f.size for f in r.files) < 0.5 * sum(f.size for f in r.result_files)
        spec = r.delta["files"]["model.safetensors"]["tensors"]
        assert all(e["checksum"].startswith("blake2b:") for e in spec.values())
        assert all("parent_checksum" in e for e in spec.values())


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def _rewrite(store_root: Path, rel: Release) -> None:
    """Overwrite ``rel``'s manifest and point LATEST at it (through the store: the pointer
    is a versioned object on the dir store)."""
    raw = serde.dumps(rel).encode()
    store = DirStore(store_root, fsync=False)
    store.put(f"releases/{rel.release_id}/manifest.json", raw)
    store.put("releases/LATEST.json", raw)


def _changed_chunk(rel: Release) -> tuple[str, dict]:
    spec = rel.delta["files"]["model.safetensors"]
    name, e = max(spec["tensors"].items(), key=lambda kv: kv[1]["length"])
    return spec["payload"], e


@pytest.mark.parametrize("digest_too", [False, True])
def test_a_flipped_byte_is_refused_and_the_previous_policy_keeps_serving(
    world, tmp_path, digest_too
):
    trainer, follower, engine, events = world()
    first = trainer.step()
    assert follower.poll() == "loaded"
    served_before = engine.served_checksum()
    rel = trainer.step()
    assert rel.encoding == "delta"
    payload, entry = _changed_chunk(rel)
    stored = tmp_path / "store" / "releases" / rel.release_id / payload
    _flip(stored, entry["offset"] + entry["length"] // 2)
    if digest_too:  # the file's sha256 made to match: the per-tensor checksum must catch it
        import hashlib

        files = tuple(
            f.__class__(
                name=f.name, sha256=hashlib.sha256(stored.read_bytes()).hexdigest(), size=f.size
            )
            if f.name == payload
            else f
            for f in rel.files
        )
        from attrs import evolve

        _rewrite(tmp_path / "store", evolve(rel, files=files))
    assert follower.poll() == "refused"
    reason = _refused(events)["reason"]
    assert reason == ("tensor_checksum_mismatch" if digest_too else "digest_mismatch")
    assert follower.version == first.version and follower.release_id == first.release_id
    assert engine.served_checksum() == served_before == first.weight_checksum


def test_a_delta_against_another_parent_is_refused(world, tmp_path):
    trainer, follower, engine, events = world(full_every=8)
    first = trainer.step()
    assert follower.poll() == "loaded"
    trainer.step()  # 2: delta against 1 (the follower does not poll)
    third = trainer.step()  # 3: delta against 2
    # a release that says it is a delta against 1 but was made against 2
    from attrs import evolve

    root = tmp_path / "store" / "releases"
    shutil.copytree(root / third.release_id, root / "4")
    forged = evolve(
        third, release_id="4", version=4, seq=third.seq + 1, delta={**third.delta, "parent": "1"}
    )
    _rewrite(tmp_path / "store", forged)
    assert follower.poll() == "refused"
    refused = _refused(events)
    assert refused["reason"] == "parent_mismatch" and "not the one the delta" in refused["detail"]
    assert follower.release_id == first.release_id
    assert engine.served_checksum() == first.weight_checksum


def test_a_follower_that_missed_releases_recovers_through_the_nearest_full(world, tmp_path):
    trainer, follower, engine, events = world(full_every=3)
    trainer.step()  # 1 full
    assert follower.poll() == "loaded"
    for _ in range(4):  # 2 d, 3 d, 4 full, 5 d: the follower polls none of them
        rel = trainer.step()
    assert [r.encoding for r in trainer.releases.list()] == [
        "full",
        "delta",
        "delta",
        "full",
        "delta",
    ]
    assert follower.poll() == "loaded"
    assert _loaded(events)["chain"] == ["4", "5"]
    assert _loaded(events)["from"] == "4"  # rebuilt from the nearest full release
    assert _files(Path(follower._current.path)) == trainer.exports[rel.release_id]
    # a new follower (a replaced node) with no local copy, LATEST a delta two after a full
    trainer.step()  # 6: delta against 5
    fresh_events: list = []
    fresh = PolicyFollower(
        ReleaseStore(DirStore(tmp_path / "store", fsync=False), codec=NumpyZstdCodec()),
        HFEngine(str(trainer.backend.model_dir), seed=1, dtype="bfloat16"),
        work_dir=tmp_path / "fresh",
        emit=fresh_events.append,
    )
    assert fresh.poll() == "loaded"
    assert _loaded(fresh_events)["chain"] == ["4", "5", "6"]
    assert _files(Path(fresh._current.path)) == trainer.exports["6"]


def test_a_damaged_local_copy_is_rebuilt_from_the_nearest_full(world):
    trainer, follower, engine, events = world(full_every=8)
    trainer.step()
    assert follower.poll() == "loaded"
    local = Path(follower._current.path) / "model.safetensors"
    _flip(local, local.stat().st_size - 3)  # the disk copy rots; the engine's weights do not
    rel = trainer.step()
    assert follower.poll() == "loaded"
    loaded = _loaded(events)
    assert loaded["chain"] == ["1", "2"] and loaded["verified"] is True
    assert _files(Path(follower._current.path)) == trainer.exports[rel.release_id]


def test_auto_publishes_full_under_the_threshold_and_says_why(tmp_path, sort_base):
    events: list = []
    rs = ReleaseStore(
        DirStore(tmp_path / "s", fsync=False),
        codec=NumpyZstdCodec(),
        deltas="auto",
        emit=events.append,
    )
    backend = TorchBackend(str(sort_base), seed=0)
    backend.restore(None)
    for v in (1, 2):
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        info = dict(backend.publish_release(out), version=v)
        info["weight_checksum"] += str(v)  # distinct releases, same tiny weights
        rs.publish(out, info)
    pub = [e.data for e in events if e.kind == "release_published"]
    assert [p["encoding"] for p in pub] == ["full", "full"]
    assert "under delta_min_bytes" in pub[1]["full_because"]
    rs.delta_min_bytes = 0  # under the old threshold no parent copy was kept
    encodings = []
    for v in (3, 4):
        out = tmp_path / "out"  # a fresh export each time, as the driver writes them
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        info = dict(backend.publish_release(out), version=v)
        info["weight_checksum"] += str(v)
        encodings.append(rs.publish(out, info).encoding)
    assert encodings == ["full", "delta"]  # identical weights: every tensor "same"
    pub = [e.data for e in events if e.kind == "release_published"]
    assert "no local copy of the previous release" in pub[2]["full_because"]
    assert json.loads(json.dumps(rs.latest().delta))["depth"] == 1


def test_the_torch_plugin_provides_the_codec_through_yeto_release_codecs():
    from yeto_core.plugins import Plugins

    codec = Plugins().release_codec()
    assert codec is not None and codec.NAME == "numpy-zstd"
    assert Plugins().release_codec("no-such-codec") is None
