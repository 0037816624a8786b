"""The dir store's write paths after a directory it made was removed behind its back,
and the directory fsyncs that make each new name durable."""

from __future__ import annotations

import os
import shutil

import pytest

from yeto_core.errors import InvalidKeyError, StoreError
from yeto_core.stores import dir_store as dir_store_mod
from yeto_core.stores.dir_store import DirStore


@pytest.fixture
def synced(monkeypatch):
    """The directories fsync_dir was called on (and still fsyncs them)."""
    seen: list[str] = []
    real = dir_store_mod.fsync_dir

    def spy(path):
        seen.append(os.fspath(path))
        real(path)

    monkeypatch.setattr(dir_store_mod, "fsync_dir", spy)
    return seen


@pytest.mark.parametrize("how", ["put_if_absent", "put"])
def test_a_removed_directory_is_made_again_and_fsynced(tmp_path, synced, how):
    store = DirStore(tmp_path / "s")
    getattr(store, how)("a/b/k1", b"one")
    shutil.rmtree(tmp_path / "s" / "a")  # removed by hand while the store is open
    synced.clear()
    assert getattr(store, how)("a/b/k2", b"two") in (None, True)
    assert store.get("a/b/k2") == b"two"
    assert not store.exists("a/b/k1")
    # the re-made directories are durable in their parents, the new name in its directory
    assert synced[-1] == str(tmp_path / "s" / "a" / "b")
    assert str(tmp_path / "s") in synced and str(tmp_path / "s" / "a") in synced
    assert [n for n in os.listdir(tmp_path / "s" / "a" / "b") if ".tmp-" in n] == []


def test_put_if_absent_fsyncs_the_directory_of_a_new_name_only(tmp_path, synced):
    store = DirStore(tmp_path / "s")
    store.put_if_absent("g/x", b"1")
    synced.clear()
    assert store.put_if_absent("g/y", b"2") is True
    assert synced == [str(tmp_path / "s" / "g")]
    synced.clear()
    assert store.put_if_absent("g/y", b"3") is False
    assert synced == []
    assert store.get("g/y") == b"2"


def test_put_if_absent_keeps_refusing_prefixes_and_temp_names(tmp_path):
    store = DirStore(tmp_path / "s")
    store.put_if_absent("a/b", b"1")
    with pytest.raises(StoreError, match="prefix of other objects"):
        store.put_if_absent("a", b"x")
    with pytest.raises(StoreError, match="not a prefix"):
        store.put_if_absent("a/b/c", b"x")
    with pytest.raises(InvalidKeyError, match="temporary file"):
        store.put_if_absent("a/.c.tmp-1", b"x")
    with pytest.raises(InvalidKeyError):
        store.put_if_absent("a/../b", b"x")
