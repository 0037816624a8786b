"""Waiting on the thing itself (store watches, the follower's version) and O(1) publications."""

from __future__ import annotations

import threading

from yeto_core.ports.store import SleepWatch
from yeto_core.release import ReleaseStore
from yeto_core.stores.dir_store import DirStore


def test_dir_watch_wakes_on_a_put_under_its_prefix(tmp_path):
    store = DirStore(tmp_path)
    with store.watch("trainer/0/events") as w:
        assert w.wait(0.0) is False  # nothing yet
        t = threading.Timer(0.05, lambda: store.put("trainer/0/events/00000001.json", b"{}"))
        t.start()
        # a sleep would return False after the whole timeout; the watch returns on the put
        assert w.wait(30.0) is True
        t.join()


def test_dir_watch_keeps_a_change_made_before_the_wait(tmp_path):
    store = DirStore(tmp_path)
    w = store.watch("releases")
    store.put("releases/LATEST.json", b"{}")  # lands between the check and the wait
    assert w.wait(30.0) is True
    w.close()


def test_a_store_without_notifications_sleeps():
    slept = []
    assert SleepWatch(sleep=slept.append).wait(0.25) is False
    assert slept == [0.25]


def _export(d, weights: bytes):
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(weights)
    return d


class CountingStore(DirStore):
    def __init__(self, root):
        super().__init__(root, fsync=False)
        self.manifest_gets = 0
        self.lists = 0

    def get(self, key):
        if key.endswith("manifest.json"):
            self.manifest_gets += 1
        return super().get(key)

    def list(self, prefix="", after=None):
        self.lists += 1
        return super().list(prefix, after)


def test_a_publication_does_not_read_every_earlier_release(tmp_path):
    store = CountingStore(tmp_path / "s")
    rs = ReleaseStore(store)
    for v in range(1, 31):
        rs.publish(
            _export(tmp_path / f"e{v}", b"w%d" % v),
            {"version": v, "kind": "full", "weight_checksum": f"c{v}"},
        )
    store.manifest_gets = store.lists = 0
    r = rs.publish(
        _export(tmp_path / "e31", b"w31"), {"version": 31, "kind": "full", "weight_checksum": "x"}
    )
    assert r.seq == 31 and r.parent == "30"
    assert store.manifest_gets == 0 and store.lists == 0, (store.manifest_gets, store.lists)
    assert [x.seq for x in ReleaseStore(store).list()] == list(range(1, 32))


def test_a_foreign_publication_refreshes_the_publishers_view(tmp_path):
    store = DirStore(tmp_path / "s", fsync=False)
    a, b = ReleaseStore(store), ReleaseStore(store)
    a.publish(
        _export(tmp_path / "e1", b"1"), {"version": 1, "kind": "full", "weight_checksum": "1"}
    )
    b.publish(
        _export(tmp_path / "e2", b"2"), {"version": 2, "kind": "full", "weight_checksum": "2"}
    )
    r = a.publish(
        _export(tmp_path / "e2b", b"3"), {"version": 2, "kind": "full", "weight_checksum": "3"}
    )
    assert r.release_id == "2-r1" and r.seq == 3 and r.parent == "2"


def test_the_sync_sampler_is_woken_by_the_load_itself(tmp_path):
    from yeto_core.policy_follower import PolicyFollower

    class Engine:
        def served_checksum(self):
            return None

        def load_release(self, local):
            pass

    store = DirStore(tmp_path / "s", fsync=False)
    rs = ReleaseStore(store)
    f = PolicyFollower(rs, Engine(), work_dir=tmp_path / "w")
    assert f.wait_version(1, 0.0) is False
    rs.publish(
        _export(tmp_path / "e1", b"1"), {"version": 1, "kind": "full", "weight_checksum": "1"}
    )
    t = threading.Timer(0.05, f.poll)
    t.start()
    assert f.wait_version(1, 30.0) is True  # returns on the load, not after 30 s
    t.join()
    assert f.version == 1
