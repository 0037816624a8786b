"""A release's files equal to the previous release's are not stored again on a remote store:
its manifest's ``shared`` names the release holding each, readers fetch and check them
from there (``yeto_core.release.shared``). A ``dir`` store keeps whole directories."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from yeto_core.errors import ReleaseError
from yeto_core.release.store import ReleaseStore
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fakes import RemoteLookingDirStore


class Store(RemoteLookingDirStore):
    """Remote-looking; records the keys of plain puts (a release's files)."""

    def __init__(self, root: Path, **kw) -> None:
        super().__init__(root, **kw)
        self.puts: list[str] = []

    def put(self, key: str, data: bytes) -> None:
        self.puts.append(key)
        super().put(key, data)


def _export(d: Path, weights: bytes, tokenizer: bytes = b"tok" * 100) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.safetensors").write_bytes(weights)
    (d / "config.json").write_bytes(b'{"hidden": 8}')
    (d / "tokenizer.json").write_bytes(tokenizer)
    return {"kind": "full", "weight_checksum": hashlib.sha256(weights).hexdigest()}


def _publish(releases: ReleaseStore, work: Path, version: int, **kw):
    info = _export(work / f"r{version}", f"weights {version}".encode() * 40, **kw)
    return releases.publish(work / f"r{version}", {**info, "version": version})


def test_unchanged_files_are_stored_once_and_fetched_from_their_holder(tmp_path):
    store = Store(tmp_path / "s")
    releases = ReleaseStore(store)
    first = _publish(releases, tmp_path, 1)
    assert first.shared == {}
    assert sorted(store.puts) == [
        f"releases/1/{n}" for n in ("config.json", "model.safetensors", "tokenizer.json")
    ]
    store.puts.clear()
    second = _publish(releases, tmp_path, 2)
    third = _publish(releases, tmp_path, 3)
    # only the weights were stored; the holder is the first release, never a chain
    assert store.puts == ["releases/2/model.safetensors", "releases/3/model.safetensors"]
    assert second.shared == third.shared == {"config.json": "1", "tokenizer.json": "1"}
    assert releases.last_publish["shared_files"] == 2
    assert {f.name for f in third.files} == {"config.json", "model.safetensors", "tokenizer.json"}

    reader = ReleaseStore(Store(tmp_path / "s"))  # another process: nothing cached
    reader.fetch(reader.latest(), tmp_path / "got")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (tmp_path / "got" / name).read_bytes() == (tmp_path / "r3" / name).read_bytes()

    # a changed tokenizer is stored again, and later releases share it from there
    store.puts.clear()
    fourth = _publish(releases, tmp_path, 4, tokenizer=b"new" * 100)
    fifth = _publish(releases, tmp_path, 5, tokenizer=b"new" * 100)
    assert "releases/4/tokenizer.json" in store.puts
    assert fourth.shared == {"config.json": "1"}
    assert fifth.shared == {"config.json": "1", "tokenizer.json": "4"}
    ReleaseStore(Store(tmp_path / "s")).fetch("5", tmp_path / "got5")
    assert (tmp_path / "got5" / "tokenizer.json").read_bytes() == b"new" * 100


def test_a_damaged_shared_object_is_refused_by_every_release_naming_it(tmp_path):
    store = Store(tmp_path / "s")
    releases = ReleaseStore(store)
    _publish(releases, tmp_path, 1)
    third = [_publish(releases, tmp_path, v) for v in (2, 3)][-1]
    (tmp_path / "s" / "releases" / "1" / "tokenizer.json").write_bytes(b"evil" * 75)
    with pytest.raises(ReleaseError, match=r"releases/1/tokenizer.json: sha256"):
        ReleaseStore(Store(tmp_path / "s")).fetch(third, tmp_path / "got")
    (tmp_path / "s" / "releases" / "1" / "config.json").unlink()
    with pytest.raises(ReleaseError, match=r"releases/1/config.json: missing"):
        ReleaseStore(Store(tmp_path / "s")).fetch(third, tmp_path / "got2")


def test_a_dir_store_keeps_whole_release_directories_unless_told(tmp_path):
    releases = ReleaseStore(DirStore(tmp_path / "d", fsync=False))
    for v in (1, 2):
        rel = _publish(releases, tmp_path / "a", v)
        assert rel.shared == {}
        assert (tmp_path / "d" / "releases" / str(v) / "tokenizer.json").is_file()
    told = ReleaseStore(DirStore(tmp_path / "e", fsync=False), share_files=True)
    _publish(told, tmp_path / "b", 1)
    assert _publish(told, tmp_path / "b", 2).shared == {"config.json": "1", "tokenizer.json": "1"}
    assert not (tmp_path / "e" / "releases" / "2" / "tokenizer.json").exists()
    remote = ReleaseStore(Store(tmp_path / "f"), share_files=False)
    _publish(remote, tmp_path / "c", 1)
    assert _publish(remote, tmp_path / "c", 2).shared == {}


def test_delta_releases_share_too_and_a_follower_serves_them_bitwise(tmp_path, sort_base):
    from tests.releases.test_delta_releases import Trainer, _files, delta_follower
    from yeto_torch.engine import HFEngine

    store = Store(tmp_path / "store")
    trainer = Trainer(sort_base, store, tmp_path / "trainer", full_every=3, lr=2e-4)
    engine = HFEngine(str(sort_base), seed=0, dtype="bfloat16")
    follower, _ = delta_follower(store, engine, tmp_path / "follower")
    fresh = ReleaseStore(Store(tmp_path / "store"), codec=trainer.releases.codec)
    encodings = []
    for _ in range(4):
        rel = trainer.step()
        encodings.append(rel.encoding)
        assert follower.poll() == "loaded"
        assert _files(Path(follower._current.path)) == trainer.exports[rel.release_id]
        fresh.fetch(rel, tmp_path / f"fresh-{rel.release_id}")  # from the nearest full one
        assert _files(tmp_path / f"fresh-{rel.release_id}") == trainer.exports[rel.release_id]
    assert encodings == ["full", "delta", "delta", "full"]
    rels = trainer.releases.list()
    assert rels[0].shared == {}
    assert all(r.shared and "config.json" in r.shared for r in rels[1:])
    assert all(not n.endswith(".safetensors") for r in rels for n in r.shared)
