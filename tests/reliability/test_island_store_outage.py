"""Islands ride out a store outage (gaps: "islands riding out store outages").

Regression: a sampler island whose store failed once (a 503, a timeout) exited with the
error; the head relaunched it at most 3 times, so a few seconds of a flaky store ended a
run, and an append whose answer was lost made the island take a second position for the
same group. Now an island's store retries transient failures with backoff
(``yeto_core.stores.retrying``), recognises its own lost-answer writes, and says what it
survived in its stream (``store_outage_survived``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import types

import pytest

from yeto_core import hookimpl
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.config import run_store
from yeto_core.errors import NotFoundError, StoreError
from yeto_core.events.stream import read_events
from yeto_core.islands.main import run_island
from yeto_core.ports import ObjectStore
from yeto_core.providers.env import island_launch
from yeto_core.stores.dir_store import DirStore
from yeto_core.stores.retrying import RetryingStore, transient
from yeto_core.testing.fake_island import plugins_with_fakes
from yeto_core.testing.fake_run import fake_run_config
from yeto_core.testing.fakes import DigitsTask, WeightFileEngine

WAIT_S = 60.0


class OutageStore(ObjectStore):
    """A dir store seen as remote (no local files: the ``objects`` buffer layout) that
    fails every call for ``outage_s`` once ``trigger`` index records exist; the first
    index create after the outage began is done and then its answer is lost."""

    PLUGIN_NAME = "outage"
    URL_SCHEMES = ("outage",)
    instances: list = []

    def __init__(self, inner: DirStore, trigger: int = 3, outage_s: float = 1.5) -> None:
        self.inner, self.trigger, self.outage_s = inner, trigger, outage_s
        self.until = None
        self.failed = 0
        self.lost_answer = False
        OutageStore.instances.append(self)

    @classmethod
    def from_url(cls, url, **options):
        return cls(DirStore(url[len("outage://") :], fsync=False))

    def _gate(self, key: str) -> None:
        if self.until is None:
            if (
                key.startswith("buffer/index/")
                and len(list(self.inner.list("buffer/index/"))) >= self.trigger
            ):
                self.until = time.monotonic() + self.outage_s
            else:
                return
        if time.monotonic() < self.until:
            self.failed += 1
            raise StoreError(f"503 Service Unavailable: outage on {key!r}")

    def get(self, key):
        self._gate(key)
        return self.inner.get(key)

    def put(self, key, data):
        self._gate(key)
        self.inner.put(key, data)

    def put_if_absent(self, key, data):
        if self.until is not None and not self.lost_answer and key.startswith("buffer/index/"):
            self.lost_answer = True
            created = self.inner.put_if_absent(key, data)  # done ...
            raise StoreError(f"timeout on {key!r} (created={created})")  # ... answer lost
        self._gate(key)
        return self.inner.put_if_absent(key, data)

    def exists(self, key):
        self._gate(key)
        return self.inner.exists(key)

    def list(self, prefix="", after=None):
        self._gate(prefix)
        return iter(list(self.inner.list(prefix, after)))

    def delete(self, key):
        self._gate(key)
        self.inner.delete(key)

    def url(self):
        return f"outage://{self.inner.root}"


def test_a_sampler_island_rides_out_a_store_outage_and_appends_each_group_once(tmp_path):
    config = fake_run_config(
        tmp_path,
        samplers=[{"engine": "weight-file", "group_size": 2, "min_round_s": 0.02}],
        task={"name": "digits"},
    )
    inner = DirStore(tmp_path / "store", fsync=False)
    run_store.write_config(inner, config)
    run_store.publish_model(inner, tmp_path / "model")
    plugins = plugins_with_fakes(entry_points=False)
    plugins.add(
        types.SimpleNamespace(
            yeto_register_sampler_engines=hookimpl(lambda register: register(WeightFileEngine)),
            yeto_register_tasks=hookimpl(lambda register: register(DigitsTask)),
            yeto_register_object_stores=hookimpl(lambda register: register(OutageStore)),
        ),
        name="test-outage",
    )
    store = OutageStore(inner)
    launch = island_launch(store, run_id="t", role="sampler", island="sampler-0", incarnation=1)
    OutageStore.instances.clear()
    view = FileSampleBuffer(inner, layout="objects")

    def stop_when_past_the_outage() -> None:
        end = time.monotonic() + WAIT_S
        while time.monotonic() < end:
            s = OutageStore.instances[0] if OutageStore.instances else None
            if s is not None and s.until is not None and time.monotonic() > s.until:
                if view.head_position >= s.trigger + 4:
                    break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    stopper = threading.Thread(target=stop_when_past_the_outage, daemon=True)
    stopper.start()
    try:
        code = run_island(launch.env, plugins)
    finally:
        signal.signal(signal.SIGTERM, previous)
        stopper.join(5)
    s = OutageStore.instances[0]
    assert s.failed > 0, "the outage did not happen"
    assert code == 0  # before: exit 2, "error: 503 Service Unavailable: outage on ..."
    assert s.lost_answer, "no create lost its answer during the outage"
    entries = FileSampleBuffer(inner, layout="objects").entries()
    assert len(entries) >= s.trigger + 4
    ids = [e.group_id for e in entries]
    assert len(ids) == len(set(ids)), "a group was appended twice"
    assert [e.position for e in entries] == list(range(len(entries)))
    survived = [
        e.data for e in read_events(inner, "sampler-0") if e.kind == "store_outage_survived"
    ]
    assert survived and all(d["attempts"] >= 1 for d in survived)


# -- the wrapper on its own ---------------------------------------------------------------


class _Flaky:
    """Fails the first ``n`` calls (after doing the write when ``after``)."""

    ATOMIC_CAS = True

    def __init__(self, inner, n, after=False):
        self.inner, self.n, self.after = inner, n, after

    def _maybe(self, fn):
        if self.n > 0:
            self.n -= 1
            if self.after:
                fn()
            raise OSError(5, "Input/output error")
        return fn()

    def put_if_absent(self, key, data):
        return self._maybe(lambda: self.inner.put_if_absent(key, data))

    def put_if_match(self, key, data, version):
        return self._maybe(lambda: self.inner.put_if_match(key, data, version))

    def get(self, key):
        return self._maybe(lambda: self.inner.get(key))

    def get_versioned(self, key):
        return self.inner.get_versioned(key)


def _retrying(inner, **kw):
    sleeps = []
    return RetryingStore(inner, sleep=sleeps.append, **kw), sleeps


def test_a_lost_answer_create_is_ours_and_a_real_race_is_still_lost(tmp_path):
    d = DirStore(tmp_path / "s", fsync=False)
    store, sleeps = _retrying(_Flaky(d, 1, after=True))
    assert store.put_if_absent("a", b"mine") is True  # done, answer lost, recognised
    assert sleeps == [0.05]
    d.put("b", b"theirs")
    store2, _ = _retrying(_Flaky(d, 1, after=False))
    assert store2.put_if_absent("b", b"mine") is False  # another writer's: a lost race
    rep = store.take_reports()
    assert rep and rep[0]["op"] == "put_if_absent" and rep[0]["attempts"] == 1
    assert store.take_reports() == []


def test_a_lost_answer_compare_and_swap_returns_the_new_version(tmp_path):
    d = DirStore(tmp_path / "s", fsync=False)
    d.put("p", b"v1")
    _, v1 = d.get_versioned("p")
    store, _ = _retrying(_Flaky(d, 1, after=True))
    new = store.put_if_match("p", b"v2", v1)
    assert new is not None and d.get_versioned("p") == (b"v2", new)


def test_backoff_doubles_to_its_cap_and_an_outage_past_the_limit_raises(tmp_path):
    d = DirStore(tmp_path / "s", fsync=False)
    d.put("k", b"x")
    now = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    store = RetryingStore(_Flaky(d, 10**6), sleep=sleep, clock=lambda: now[0], outage_s=30.0)
    with pytest.raises(OSError):
        store.get("k")
    assert sleeps[:4] == [0.05, 0.1, 0.2, 0.4] and max(sleeps) == 5.0
    assert 30.0 <= now[0] < 36.0


def test_a_missing_key_is_not_an_outage(tmp_path):
    store, sleeps = _retrying(DirStore(tmp_path / "s", fsync=False))
    with pytest.raises(NotFoundError):
        store.get("nope")
    assert sleeps == [] and not transient(NotFoundError("x")) and transient(StoreError("503"))


class _QueuedReports(RetryingStore):
    """A retrying store whose outage reports are given, and whose takes are counted."""

    def __init__(self, inner, reports):
        super().__init__(inner)
        self.queued, self.takes = list(reports), []

    def take_reports(self):
        self.takes.append(threading.current_thread().name)
        out, self.queued = self.queued, []
        return out


class _ReenteringStream:
    """Emits like an island's stream: each emit is observed at once, on the same thread."""

    def __init__(self):
        self.observe, self.emitted = None, []

    def emit(self, kind, **data):
        self.emitted.append(kind)
        self.observe(types.SimpleNamespace(kind=kind, data=data))


def test_the_outage_reports_are_emitted_once_and_each_thread_takes_its_own(tmp_path):
    from yeto_core.islands.main import store_outage_reporter

    store = _QueuedReports(DirStore(tmp_path / "s"), [{"op": "put"}, {"op": "get"}])
    stream = _ReenteringStream()
    seen = []
    stream.observe = store_outage_reporter(stream, store, observer=seen.append)
    stream.observe(types.SimpleNamespace(kind="round", data={}))
    # the two reports' own events are observed while the reports are emitted: no take
    assert stream.emitted == ["store_outage_survived", "store_outage_survived"]
    assert [e.kind for e in seen] == ["round", *stream.emitted]
    assert store.takes == ["MainThread"]
    other = threading.Thread(
        target=stream.observe, args=(types.SimpleNamespace(kind="x", data={}),), name="other"
    )
    other.start()
    other.join()
    assert store.takes == ["MainThread", "other"]  # another thread is not busy
