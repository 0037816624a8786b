"""The modal-volume store: the ObjectStore contract on a double of the Volume API."""

from __future__ import annotations

import threading

import pytest

from yeto_core.errors import ConfigError, NotFoundError, StoreError
from yeto_core.testing.store_contract import ObjectStoreContract
from yeto_modal.volume import ModalVolumeStore, parse_volume_url, reload_mount


class TestModalVolumeStore(ObjectStoreContract):
    @pytest.fixture
    def store(self, volume_double):
        service_cls, seam_cls = volume_double
        return ModalVolumeStore("vol", "runs/t", seam=seam_cls(service_cls()))


class TestModalVolumeStoreAtRoot(ObjectStoreContract):
    @pytest.fixture
    def store(self, volume_double):
        service_cls, seam_cls = volume_double
        return ModalVolumeStore("vol", "", seam=seam_cls(service_cls()))


def test_url_round_trip_and_errors():
    assert parse_volume_url("modal-volume://v/runs/a?environment=dev") == ("v", "runs/a", "dev")
    assert parse_volume_url("modal-volume://v") == ("v", "", None)
    for bad in ("s3://b/p", "modal-volume:///p", "modal-volume://v/p?region=x"):
        with pytest.raises(ConfigError):
            parse_volume_url(bad)
    with pytest.raises(ConfigError, match="allowed: environment"):
        ModalVolumeStore.from_url("modal-volume://v/p", region="x")


def test_from_url_builds_the_real_sdk_volume_offline():
    import modal

    store = ModalVolumeStore.from_url("modal-volume://yeto-runs/demo?environment=dev")
    assert isinstance(store.seam.volume, modal.Volume)
    assert store.seam.volume.name == "yeto-runs"
    assert store.url() == "modal-volume://yeto-runs/demo?environment=dev"


def test_keys_live_under_the_prefix_only(volume_double):
    service_cls, seam_cls = volume_double
    service = service_cls()
    a = ModalVolumeStore("vol", "runs/a", seam=seam_cls(service))
    b = ModalVolumeStore("vol", "runs/ab", seam=seam_cls(service))
    a.put("k/1", b"a")
    b.put("k/2", b"b")
    assert sorted(service.files) == ["/runs/a/k/1", "/runs/ab/k/2"]
    assert list(a.list()) == ["k/1"]
    assert list(b.list("k/")) == ["k/2"]
    with pytest.raises(NotFoundError):
        a.get("k/2")


def test_sdk_writes_are_seen_by_mounts_only_after_reload(volume_double):
    service_cls, seam_cls = volume_double
    service = service_cls()
    mount = service.mount()
    container = seam_cls(service, mount)
    store = ModalVolumeStore("vol", "r", seam=seam_cls(service))
    store.put("model/config.json", b"{}")
    assert "/r/model/config.json" not in mount.view  # a snapshot
    reload_mount(container)
    assert mount.read("/r/model/config.json") == b"{}"
    mount.write("/r/notes.txt", b"from the container")
    assert not store.exists("notes.txt")  # not committed yet
    container.commit()
    assert store.get("notes.txt") == b"from the container"


def test_reload_fails_while_a_file_is_open_and_says_why(volume_double):
    service_cls, seam_cls = volume_double
    service = service_cls()
    mount = service.mount()
    container = seam_cls(service, mount)
    waits = []
    with mount.open("/r/model/weights.safetensors"):
        with pytest.raises(StoreError, match="none of its files is open"):
            reload_mount(container, attempts=3, sleep=waits.append)
    assert waits == [0.5, 0.5]
    # once the file is closed, a retry succeeds
    opened = mount.open("/r/x")
    handle = opened.__enter__()
    del handle

    def close_then_wait(s):
        opened.__exit__(None, None, None)

    assert reload_mount(container, attempts=3, sleep=close_then_wait) == 2


def test_create_if_absent_is_exclusive_in_a_process_but_not_across_containers(volume_double):
    """Two containers (separate processes) can both win: the reason preflight refuses."""
    service_cls, seam_cls = volume_double
    service = service_cls()
    a = ModalVolumeStore("vol", "r", seam=seam_cls(service))
    assert a.capabilities()["atomic_create_if_absent"] is False
    # a second process has its own lock: model it by bypassing ours with a raw seam
    service.race_window = threading.Barrier(2)
    results = []

    def other_container():
        try:
            service.upload("/r/buffer/index/000000000000.json", b"B", overwrite=False)
            results.append("B")
        except FileExistsError:
            pass

    t = threading.Thread(target=other_container)
    t.start()
    won = a.put_if_absent("buffer/index/000000000000.json", b"A")
    t.join(timeout=10)
    assert won and results == ["B"], "both writers believed they created the key"
    assert a.get("buffer/index/000000000000.json") in (b"A", b"B")  # last write wins


def test_without_a_modal_token_every_verb_says_what_to_do(monkeypatch):
    """The real SDK, offline: no token is a StoreError that names `modal token new`."""
    import modal.config

    if modal.config.config.get("token_id"):
        pytest.skip("a Modal token is configured here; this checks the no-token path")
    monkeypatch.delenv("MODAL_TOKEN_ID", raising=False)
    monkeypatch.delenv("MODAL_TOKEN_SECRET", raising=False)
    store = ModalVolumeStore.from_url("modal-volume://yeto-no-token/p")
    for verb in (
        lambda: store.put("k", b"1"),
        lambda: store.get("k"),
        lambda: list(store.list()),
        lambda: store.put_if_absent("k", b"1"),
    ):
        with pytest.raises(StoreError, match="modal token new"):
            verb()
