"""The `s3` store against real S3-compatible servers on loopback (moto, and SeaweedFS)."""

from __future__ import annotations

import multiprocessing
import os

import botocore.exceptions
import pytest

from yeto_core.errors import ConfigError, NotFoundError, StoreError
from yeto_core.plugins import Plugins
from yeto_core.testing.store_contract import ObjectStoreContract
from yeto_s3 import plugin as s3_plugin
from yeto_s3.store import ENV, S3Store, is_transient, make_client, parse_s3_url
from yeto_s3.testing import (
    TEST_ACCESS_KEY_ID,
    TEST_SECRET_ACCESS_KEY,
    s3_env,
    s3_options,
)


class TestS3StoreContract(ObjectStoreContract):
    @pytest.fixture
    def store(self, s3_store):
        return s3_store


class TestS3StoreContractSeaweedFS(ObjectStoreContract):
    """The same contract against a production S3-compatible server, not a mock."""

    @pytest.fixture
    def store(self, seaweedfs_store):
        return seaweedfs_store


# -- the server itself -------------------------------------------------------------------


@pytest.mark.parametrize("server", ["moto_endpoint", "seaweedfs_endpoint"])
def test_server_answers_412_to_a_second_conditional_put(server, request):
    client = make_client(**s3_options(request.getfixturevalue(server)))
    client.put_object(Bucket="yeto-tests", Key="raw/412", Body=b"1", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        client.put_object(Bucket="yeto-tests", Key="raw/412", Body=b"2", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert info.value.response["Error"]["Code"] == "PreconditionFailed"


def test_seaweedfs_lists_in_tree_order_and_the_default_store_refuses_it(seaweedfs_endpoint, s3_url):
    """Found by running the contract on SeaweedFS: its listing is not in S3's key order.

    The default ``list_order = "s3"`` checks the order while listing and stops with
    an error naming the option, rather than handing a prefix scan keys out of order.
    """
    store = S3Store.from_url(s3_url, **s3_options(seaweedfs_endpoint))
    for key in ("x/a/b", "x/a-b"):
        store.put(key, b"")
    with pytest.raises(StoreError, match="list_order = 'sorted'"):
        list(store.list("x/"))
    sorted_store = S3Store.from_url(s3_url, list_order="sorted", **s3_options(seaweedfs_endpoint))
    assert list(sorted_store.list("x/")) == ["x/a-b", "x/a/b"]
    assert list(sorted_store.list("x/", after="x/a-b")) == ["x/a/b"]


def test_list_order_option_is_checked(moto_endpoint, s3_url):
    with pytest.raises(ConfigError, match="list_order"):
        S3Store.from_url(s3_url, list_order="tree", **s3_options(moto_endpoint))


def test_list_skips_keys_no_store_key_could_name(moto_endpoint, s3_store):
    client = make_client(**s3_options(moto_endpoint))
    base = s3_store.prefix
    for raw in ("odd//double", "odd/./dot", "odd/back\\slash", "odd/ok"):
        client.put_object(Bucket="yeto-tests", Key=base + raw, Body=b"")
    assert list(s3_store.list("odd/")) == ["odd/ok"]


def test_raw_put_checks_its_key(s3_store):
    from yeto_core.errors import InvalidKeyError

    with pytest.raises(InvalidKeyError):
        s3_store.raw_put("../escape", b"x")
    with pytest.raises(InvalidKeyError):
        s3_store.raw_put("a//b", b"x")


# -- URLs, options, credentials -----------------------------------------------------------


def test_parse_s3_url():
    assert parse_s3_url("s3://b") == ("b", "")
    assert parse_s3_url("s3://b/") == ("b", "")
    assert parse_s3_url("s3://b/runs/demo/") == ("b", "runs/demo/")
    for bad in ("s3:///x", "http://b/x", "s3://b/a/../c", "s3://b/x?y=1"):
        with pytest.raises(ConfigError):
            parse_s3_url(bad)


def test_keys_live_under_the_url_prefix(moto_endpoint, s3_store):
    s3_store.put("a/b", b"x")
    client = make_client(**s3_options(moto_endpoint))
    full = s3_store.prefix + "a/b"
    assert client.get_object(Bucket="yeto-tests", Key=full)["Body"].read() == b"x"
    assert S3Store.from_url(s3_store.url(), **s3_options(moto_endpoint)).get("a/b") == b"x"


def test_plugin_registers_s3_and_opens_urls(moto_endpoint, s3_url):
    pm = Plugins(entry_points=False)
    pm.add(s3_plugin, "s3", distribution="yeto-s3")
    assert "s3" in pm.names("ObjectStore")
    store = pm.open_store(s3_url, **s3_options(moto_endpoint))
    assert isinstance(store, S3Store)
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_options_come_from_yeto_env_vars(moto_endpoint, s3_url, monkeypatch):
    for name, value in s3_env(moto_endpoint).items():
        monkeypatch.setenv(name, value)
    store = S3Store.from_url(s3_url)
    store.put("env", b"1")
    assert store.get("env") == b"1"
    assert store.endpoint_url == moto_endpoint


def _clear_yeto_env(monkeypatch):
    for name in ENV.values():
        monkeypatch.delenv(name, raising=False)


def test_missing_credentials_is_a_clear_error_even_with_ambient_aws_ones(
    moto_endpoint, s3_url, monkeypatch, tmp_path
):
    _clear_yeto_env(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAAMBIENTAMBIENT00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ambient-secret")
    creds = tmp_path / "credentials"
    creds.write_text(
        "[default]\naws_access_key_id = AKIAFILE\naws_secret_access_key = file-secret\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    with pytest.raises(ConfigError) as info:
        S3Store.from_url(s3_url, endpoint_url=moto_endpoint)
    msg = str(info.value)
    assert ENV["access_key_id"] in msg and ENV["secret_access_key"] in msg
    assert "default AWS credential chain" in msg
    with pytest.raises(ConfigError):
        S3Store.from_url(s3_url, endpoint_url=moto_endpoint, access_key_id="only-the-id")


def test_requests_are_signed_with_the_explicit_key_not_the_ambient_one(
    moto_endpoint, s3_url, monkeypatch
):
    _clear_yeto_env(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAAMBIENTAMBIENT00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ambient-secret")
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")  # would break a default session
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # would redirect one
    store = S3Store.from_url(s3_url, **s3_options(moto_endpoint))
    seen = []
    store._client.meta.events.register(
        "before-send.s3", lambda request, **kw: seen.append(request.headers["Authorization"])
    )
    store.put("signed", b"x")
    assert store.get("signed") == b"x"
    assert seen and all(
        f"Credential={TEST_ACCESS_KEY_ID}/" in a.decode()
        if isinstance(a, bytes)
        else f"Credential={TEST_ACCESS_KEY_ID}/" in a
        for a in seen
    )
    assert not any("AKIAAMBIENT" in str(a) for a in seen)


def test_repr_and_errors_never_show_secrets(moto_endpoint):
    opts = s3_options(moto_endpoint)
    store = S3Store.from_url("s3://no-such-bucket-here/p", **opts)
    assert TEST_SECRET_ACCESS_KEY not in repr(store)
    assert repr(store).startswith("S3Store('s3://no-such-bucket-here/p'")
    with pytest.raises(StoreError) as info:
        store.put("k", b"v")
    assert "NoSuchBucket" in str(info.value) and "create the bucket" in str(info.value)
    assert TEST_SECRET_ACCESS_KEY not in str(info.value)
    assert store.url() == "s3://no-such-bucket-here/p"


def test_unknown_option_is_refused(moto_endpoint, s3_url):
    with pytest.raises(ConfigError, match="unknown s3 store option"):
        S3Store.from_url(s3_url, **s3_options(moto_endpoint), acess_key="typo")


def test_raw_put_is_a_plain_put(s3_store):
    s3_store.raw_put("bench/x", b"raw")
    assert s3_store.get("bench/x") == b"raw"


# -- retries and conditional-write mapping with a scripted client --------------------------


class _Scripted:
    """Wraps a real client; raises the scripted errors before delegating."""

    def __init__(self, real, script):
        self.real, self.script, self.calls = real, list(script), []
        self.meta = real.meta

    def __getattr__(self, name):
        real_fn = getattr(self.real, name)

        def call(**kwargs):
            self.calls.append(name)
            if self.script:
                step = self.script.pop(0)
                if step == "after":  # do the real call, then fail as if the answer was lost
                    real_fn(**kwargs)
                    raise botocore.exceptions.ConnectionClosedError(endpoint_url="http://x")
                if step is not None:
                    raise step
            return real_fn(**kwargs)

        return call


def _client_error(code, status, op="PutObject"):
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        op,
    )


def _scripted_store(s3_store, script):
    fake = _Scripted(s3_store._client, script)
    sleeps = []
    store = S3Store(
        s3_store.bucket, s3_store.prefix, client=fake, sleep=sleeps.append, seed=1, max_attempts=4
    )
    return store, fake, sleeps


def test_transient_errors_are_retried_with_bounded_backoff(s3_store):
    store, fake, sleeps = _scripted_store(
        s3_store, [_client_error("SlowDown", 503), _client_error("InternalError", 500)]
    )
    store.put("r", b"1")
    assert fake.calls == ["put_object"] * 3
    assert len(sleeps) == 2 and all(0 < s <= 2.0 for s in sleeps)
    store, fake, sleeps = _scripted_store(s3_store, [_client_error("ServiceUnavailable", 503)] * 9)
    with pytest.raises(StoreError, match="ServiceUnavailable"):
        store.put("r", b"2")
    assert len(fake.calls) == 4 and s3_store.get("r") == b"1"


def test_permanent_errors_are_not_retried(s3_store):
    store, fake, _ = _scripted_store(s3_store, [_client_error("AccessDenied", 403)])
    with pytest.raises(StoreError, match="AccessDenied"):
        store.put("p", b"1")
    assert fake.calls == ["put_object"]


def test_412_maps_to_false(s3_store):
    assert s3_store.put_if_absent("c", b"1") is True
    store, fake, _ = _scripted_store(s3_store, [])
    assert store.put_if_absent("c", b"2") is False
    assert fake.calls == ["put_object"]
    assert s3_store.get("c") == b"1"


def test_409_conflict_is_retried_then_rechecked(s3_store):
    conflict = _client_error("ConditionalRequestConflict", 409)
    store, fake, sleeps = _scripted_store(s3_store, [conflict, conflict])
    assert store.put_if_absent("k409", b"mine") is True
    assert fake.calls == ["put_object"] * 3 and len(sleeps) == 2
    # Conflicts that never end: re-check; someone else's object means we lost.
    s3_store.put("k409b", b"theirs")
    store, fake, _ = _scripted_store(s3_store, [conflict] * 4)
    assert store.put_if_absent("k409b", b"mine") is False
    store, fake, _ = _scripted_store(s3_store, [conflict] * 4)
    with pytest.raises(StoreError, match="ConditionalRequestConflict"):
        store.put_if_absent("k409c", b"mine")


def test_lost_answer_then_412_is_recognised_as_our_own_write(s3_store):
    store, fake, _ = _scripted_store(s3_store, ["after"])
    assert store.put_if_absent("lost", b"mine") is True
    assert fake.calls[:2] == ["put_object", "put_object"]
    assert s3_store.get("lost") == b"mine"
    # ...but a lost answer followed by someone else's object is a loss.
    s3_store.put("lost2", b"theirs")
    store, fake, _ = _scripted_store(
        s3_store, [botocore.exceptions.EndpointConnectionError(endpoint_url="http://x")]
    )
    assert store.put_if_absent("lost2", b"mine") is False


def test_put_if_match_resolves_a_lost_answer_and_a_conflict_like_put_if_absent(s3_store):
    """put_if_match and put_if_absent share one conditional write: a lost answer then
    a 412 is our own write (its ETag) or another writer's (None); a create whose 409s
    never end is settled by reading the object back."""
    assert s3_store.put_if_absent("m", b"1")
    _, v1 = s3_store.get_versioned("m")
    store, fake, _ = _scripted_store(s3_store, ["after"])
    v2 = store.put_if_match("m", b"2", v1)
    assert v2 is not None and fake.calls == ["put_object", "put_object", "head_object"]
    assert s3_store.get_versioned("m") == (b"2", v2)
    store, _, _ = _scripted_store(
        s3_store, [botocore.exceptions.EndpointConnectionError(endpoint_url="http://x")]
    )
    s3_store.put("m", b"theirs")
    assert store.put_if_match("m", b"3", v2) is None  # their write came between
    assert store.put_if_match("gone", b"x", v2) is None  # IfMatch on no object
    conflict = _client_error("ConditionalRequestConflict", 409)
    s3_store.put("m409", b"theirs")
    store, _, _ = _scripted_store(s3_store, [conflict] * 4)
    assert store.put_if_match("m409", b"mine", None) is None
    store, _, _ = _scripted_store(s3_store, [conflict] * 4)
    with pytest.raises(StoreError, match="ConditionalRequestConflict"):
        store.put_if_match("m409b", b"mine", None)
    assert not s3_store.exists("m409b")


def test_get_missing_and_transient_classification(s3_store):
    with pytest.raises(NotFoundError):
        s3_store.get("absent")
    assert is_transient(_client_error("SlowDown", 503))
    assert is_transient(botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"))
    assert not is_transient(_client_error("AccessDenied", 403))
    assert not is_transient(_client_error("PreconditionFailed", 412))


def test_list_paginates(s3_store, monkeypatch):
    keys = [f"page/{i:04d}" for i in range(23)]
    for k in keys:
        s3_store.put(k, b"")
    real = s3_store._client.list_objects_v2
    pages = []

    def small_pages(**kwargs):
        pages.append(kwargs)
        return real(MaxKeys=5, **kwargs)

    monkeypatch.setattr(s3_store._client, "list_objects_v2", small_pages)
    assert list(s3_store.list("page/")) == keys
    assert len(pages) == 5
    pages.clear()
    assert list(s3_store.list("page/", after=keys[11])) == keys[12:]
    assert pages[0]["StartAfter"].endswith(keys[11]) and len(pages) == 3


# -- several processes race for one key --------------------------------------------------


def _contender(url, options, key, i, start, out):
    store = S3Store.from_url(url, **options)
    start.wait(30)
    out.put((i, store.put_if_absent(key, f"proc-{i}".encode())))


@pytest.mark.parametrize(
    "server,store_fixture",
    [("moto_endpoint", "s3_store"), ("seaweedfs_endpoint", "seaweedfs_store")],
    ids=["moto", "seaweedfs"],
)
def test_concurrent_put_if_absent_from_processes_has_one_winner(server, store_fixture, request):
    endpoint = request.getfixturevalue(server)
    s3_store = request.getfixturevalue(store_fixture)
    # Not plain fork: this process runs the moto server thread, whose locks a fork could
    # copy while held. A fork server starts clean and imports boto once for all children.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["yeto_s3.store"])
    n = 6
    for r in range(2):
        key = f"procrace/{r}"
        start, out = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(
                target=_contender,
                args=(s3_store.url(), s3_options(endpoint), key, i, start, out),
            )
            for i in range(n)
        ]
        for p in procs:
            p.start()
        start.set()
        results = [out.get(timeout=60) for _ in range(n)]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        winners = [i for i, won in results if won]
        assert len(winners) == 1, results
        assert s3_store.get(key) == f"proc-{winners[0]}".encode()


# -- preflight ----------------------------------------------------------------------------


class _Report:
    def __init__(self):
        self.results = []

    def ok(self, name, detail):
        self.results.append(("ok", name, detail))

    def warn(self, name, detail):
        self.results.append(("warn", name, detail))

    def fail(self, name, detail):
        self.results.append(("fail", name, detail))


def test_yeto_preflight_checks_an_s3_store(moto_endpoint, s3_url, monkeypatch):
    for name, value in s3_env(moto_endpoint).items():
        monkeypatch.setenv(name, value)
    report = _Report()
    pm = Plugins(entry_points=False)
    pm.add(s3_plugin, "s3", distribution="yeto-s3")
    pm.preflight({"store": s3_url}, report)
    assert [r[:2] for r in report.results] == [("ok", "s3-store")]
    assert "writable" in report.results[0][2]
    # Object with a `store` attribute holding url + options; bucket missing → fail.
    cfg = type("Cfg", (), {"store": {"url": "s3://missing-bucket/x", "options": {}}})()
    report = _Report()
    s3_plugin.yeto_preflight(config=cfg, report=report, offline=False)
    assert report.results[0][0] == "fail" and "NoSuchBucket" in report.results[0][2]
    assert TEST_SECRET_ACCESS_KEY not in report.results[0][2]
    # Not an s3 store, or no store at all: nothing to check.
    report = _Report()
    s3_plugin.yeto_preflight(config={"store": "./runs/x"}, report=report, offline=False)
    s3_plugin.yeto_preflight(config=object(), report=report, offline=False)
    s3_plugin.yeto_preflight(config={"store": 3}, report=report, offline=False)
    assert report.results == []


def test_preflight_without_credentials_fails_clearly(s3_url, monkeypatch):
    _clear_yeto_env(monkeypatch)
    report = _Report()
    s3_plugin.yeto_preflight(config={"store": s3_url}, report=report, offline=False)
    [(status, name, detail)] = report.results
    assert status == "fail" and ENV["access_key_id"] in detail


def test_offline_preflight_contacts_no_bucket(s3_url, monkeypatch):
    """Regression: `yeto run up --dry-run --offline` still made the s3-store check
    connect to the bucket (and fail): the hook now receives the offline flag."""
    _clear_yeto_env(monkeypatch)  # no credentials: a connection attempt would fail
    report = _Report()
    pm = Plugins(entry_points=False)
    pm.add(s3_plugin, "s3", distribution="yeto-s3")
    pm.preflight({"store": s3_url}, report, offline=True)
    [(status, name, detail)] = report.results
    assert (status, name) == ("warn", "s3-store") and "--offline" in detail
    report = _Report()
    pm.preflight({"store": s3_url}, report)  # not offline: the bucket is checked
    assert report.results[0][:2] == ("fail", "s3-store")


def test_env_vars_documented():
    readme = os.path.join(os.path.dirname(__file__), "../../plugins/yeto-s3/README.md")
    text = open(readme).read()
    for name in ENV.values():
        assert name in text, name
    assert TEST_SECRET_ACCESS_KEY not in text


@pytest.mark.parametrize("server", ["moto", "seaweedfs"])
def test_two_event_stream_writers_of_one_island_lose_no_event(server, request, s3_url):
    """A standby and its predecessor (docs/agentic.md) write one island's stream on S3."""
    from yeto_core.events.stream import EventStream, read_all, read_events

    endpoint = request.getfixturevalue(f"{server}_endpoint")
    options = {"list_order": "sorted"} if server == "seaweedfs" else {}
    store = S3Store.from_url(s3_url, **options, **s3_options(endpoint))
    old = EventStream(store, "sampler-0", flush_s=0.0)
    old.emit("x", who="old", n=0)
    standby = EventStream(store, "sampler-0", flush_s=0.0)
    for n in range(1, 4):
        standby.emit("x", who="new", n=n)
        old.emit("x", who="old", n=n)
    want = [("old", n) for n in range(4)] + [("new", n) for n in range(1, 4)]
    assert [(e.data["who"], e.data["n"]) for e in read_events(store, "sampler-0")] == want
    assert [(e.data["who"], e.data["n"]) for e in read_all(store)["sampler-0"]] == want
