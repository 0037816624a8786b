"""The fault-injecting store of ``yeto bench chaos --faults store``."""

from __future__ import annotations

import json

import pytest

from yeto_bench.faulty_store import ENV, ENV_LOG, FaultyStore, InjectedStoreError, injected_faults
from yeto_core.plugins import Plugins
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.store_contract import ObjectStoreContract


class TestFaultyStoreWithoutFaultsKeepsTheContract(ObjectStoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        return FaultyStore(DirStore(tmp_path / "s"), rate=0.0)


class _Memory(DirStore):
    """A dir store that reports no local root: faults are S3-like StoreErrors."""

    def local_root(self):
        return None


def test_before_faults_do_nothing_and_after_faults_do_it_but_lose_the_answer(tmp_path):
    inner = _Memory(tmp_path / "s")
    before = FaultyStore(inner, rate=1.0, modes=("before",), log_dir=str(tmp_path / "log"))
    with pytest.raises(InjectedStoreError, match="before"):
        before.put_if_absent("a/b", b"1")
    assert not inner.exists("a/b")
    after = FaultyStore(inner, rate=1.0, modes=("after",), log_dir=str(tmp_path / "log"))
    with pytest.raises(InjectedStoreError, match="after"):
        after.put_if_absent("a/b", b"1")
    assert inner.get("a/b") == b"1"  # done, though the caller saw an error
    faults = injected_faults(tmp_path / "log")
    assert [(f["op"], f["mode"]) for f in faults] == [
        ("put_if_absent", "before"),
        ("put_if_absent", "after"),
    ]


def test_a_directory_store_fails_with_enospc_and_keeps_its_local_root(tmp_path):
    inner = DirStore(tmp_path / "s")
    store = FaultyStore(inner, rate=1.0, ops=("put",), modes=("after",))
    with pytest.raises(OSError, match="No space left"):
        store.put("x", b"1")
    assert store.local_root() == inner.local_root()
    assert store.get("x") == b"1"  # written ("after"); only put is chosen to fail


def test_the_rate_is_honoured_and_seeded(tmp_path):
    def run(seed):
        s = FaultyStore(DirStore(tmp_path / f"s{seed}"), rate=0.2, seed=seed)
        out = []
        for i in range(500):
            try:
                s.put(f"k{i}", b"")
                out.append(0)
            except OSError:
                out.append(1)
        return out

    a, b = run(1), run(1)
    assert a == b  # same seed, same process: the same faults
    assert 60 <= sum(a) <= 140  # 20% of 500, within a wide band
    assert run(2) != a


def test_opened_by_url_through_the_plugins_with_settings_from_the_environment(
    tmp_path, monkeypatch
):
    from yeto_bench import plugin

    monkeypatch.setenv(ENV, json.dumps({"rate": 1.0, "modes": ["before"], "ops": ["get"]}))
    monkeypatch.setenv(ENV_LOG, str(tmp_path / "log"))
    pm = Plugins(entry_points=False)
    pm.add(plugin, "yeto-bench")
    monkeypatch.setattr("yeto_core.plugins.get_plugins", lambda: pm)
    store = pm.open_store(f"faulty://{tmp_path / 'run-store'}")
    assert isinstance(store, FaultyStore) and store.rate == 1.0
    assert store.url() == f"faulty://{store.inner.url()}"
    store.put("a", b"1")  # only get fails
    with pytest.raises(OSError):
        store.get("a")
    assert store.credentials_env()[ENV] == json.dumps(
        {"rate": 1.0, "modes": ["before"], "ops": ["get"]}
    )
    assert store.exists("probe-123") is False  # the preflight probe is never failed
