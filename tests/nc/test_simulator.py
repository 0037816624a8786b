"""The marketplace simulator through the lease client: the API of docs/nc-api.md."""

from __future__ import annotations

import os

import pytest

from tests.nc.helpers import SLEEPER, wait_for
from yeto_nc.client import LeaseClient, MarketplaceError, Refused
from yeto_nc.testing import Marketplace

OFFERS = [
    {"id": "cheap", "gpu": "A10", "gpus": 1, "region": "eu", "usd_per_hour": 0.9, "available": 4},
    {"id": "big", "gpu": "H100", "gpus": 1, "region": "us", "usd_per_hour": 3.6, "available": 1},
]


@pytest.fixture
def market(tmp_path, request):
    scenario = {"offers": OFFERS, "start_delay_s": 0.0, **getattr(request, "param", {})}
    with Marketplace(scenario, work_dir=tmp_path / "sim") as m:
        client = LeaseClient(m.url)
        yield m, client
        client.close()


def _lease(client, offer="cheap", duration_s=60.0, **kw):
    return client.request_lease(
        offer, duration_s=duration_s, command=SLEEPER, env={"A": "1"}, labels={"run": "r"}, **kw
    )


def _pid_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_offers_filter(market):
    _m, client = market
    assert [o["id"] for o in client.offers()] == ["cheap", "big"]
    assert [o["id"] for o in client.offers(gpu="H100")] == ["big"]
    assert [o["id"] for o in client.offers(region="eu")] == ["cheap"]
    assert [o["id"] for o in client.offers(max_usd_per_hour=1.0)] == ["cheap"]


def test_lease_runs_command_release_verified_and_billed(market):
    m, client = market
    lease = _lease(client)
    assert lease["state"] == "pending" and lease["labels"] == {"run": "r"}
    wait_for(lambda: client.lease(lease["id"])["state"] == "running", what="running")
    pid = m.leases[lease["id"]].proc.pid
    assert not _pid_gone(pid)
    out = client.release(lease["id"])
    assert out["state"] == "released"
    done = wait_for(lambda: (x := client.lease(lease["id"]))["processes_gone"] and x, what="gone")
    assert done["ended_at"] is not None and _pid_gone(pid)
    [bill] = client.billing(lease_id=lease["id"])
    assert bill["seconds"] >= 1 and bill["end"] == done["ended_at"]
    assert bill["usd"] == round(bill["seconds"] * 0.9 / 3600, 6)
    assert [x["id"] for x in client.leases(label="run=r")] == [lease["id"]]
    assert client.leases(label="run=other") == []


def test_unknown_lease_and_bad_request(market):
    _m, client = market
    with pytest.raises(MarketplaceError) as e:
        client.lease("nope")
    assert e.value.code == "not_found" and e.value.status == 404
    with pytest.raises(MarketplaceError) as e:
        client.request_lease("cheap", duration_s=-1, command=SLEEPER, env={}, labels={})
    assert e.value.code == "bad_request"


@pytest.mark.parametrize("market", [{"refuse_p": 1.0}], indirect=True)
def test_refused_request(market):
    m, client = market
    with pytest.raises(Refused) as e:
        _lease(client)
    assert e.value.code == "no_capacity" and m.counts["refused"] == 1


def test_capacity_and_price_refusals(market):
    _m, client = market
    _lease(client, "big")
    with pytest.raises(Refused) as e:
        _lease(client, "big")
    assert e.value.code == "no_capacity"
    with pytest.raises(Refused) as e:
        _lease(client, "cheap", max_usd_per_hour=0.5)
    assert e.value.code == "over_price"


@pytest.mark.parametrize(
    "market", [{"evictions": [{"lease": 0, "after_s": 0.6, "grace_s": 0.4}]}], indirect=True
)
def test_eviction_with_notice(market):
    m, client = market
    lease = _lease(client)
    notice = wait_for(lambda: client.lease(lease["id"])["eviction"], what="notice")
    assert notice["grace_s"] == 0.4
    assert notice["evict_at"] == pytest.approx(notice["notice_at"] + 0.4, abs=0.1)
    assert client.lease(lease["id"])["state"] in ("evicting", "evicted")
    wait_for(lambda: client.lease(lease["id"])["state"] == "evicted", what="evicted")
    wait_for(lambda: client.lease(lease["id"])["processes_gone"], what="gone")
    assert m.counts["evicted"] == 1 and m.counts["evicted_without_notice"] == 0


@pytest.mark.parametrize(
    "market", [{"evictions": [{"lease": 0, "after_s": 0.3, "grace_s": 0}]}], indirect=True
)
def test_eviction_without_notice(market):
    m, client = market
    lease = _lease(client)
    wait_for(lambda: client.lease(lease["id"])["state"] == "evicted", what="evicted")
    assert client.lease(lease["id"])["eviction"]["grace_s"] == 0
    assert m.counts["evicted_without_notice"] == 1


def test_eviction_on_demand_over_http(market):
    m, client = market
    import json
    import urllib.request

    def evict(lid, grace_s):
        req = urllib.request.Request(
            f"{m.url}/sim/leases/{lid}/evict",
            data=json.dumps({"grace_s": grace_s}).encode(),
            method="POST",
        )
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    now, later = _lease(client), _lease(client)
    wait_for(lambda: client.lease(now["id"])["state"] == "running", what="running")
    wait_for(lambda: client.lease(later["id"])["state"] == "running", what="running")
    assert evict(now["id"], 0)[0] == 200
    wait_for(lambda: client.lease(now["id"])["state"] == "evicted", what="evicted")
    wait_for(lambda: client.lease(now["id"])["processes_gone"], what="gone")
    assert m.counts["evicted_without_notice"] == 1
    # a notice first (the lease keeps running), then the eviction when the caller chooses
    assert evict(later["id"], 600)[0] == 200
    notice = wait_for(lambda: client.lease(later["id"])["eviction"], what="notice")
    assert notice["grace_s"] == 600 and client.lease(later["id"])["state"] == "evicting"
    assert evict(later["id"], 0)[0] == 200
    wait_for(lambda: client.lease(later["id"])["state"] == "evicted", what="evicted")
    assert m.counts["evicted"] == 2 and m.counts["evicted_without_notice"] == 1
    # only a running lease can be evicted
    status, body = evict(later["id"], 0)
    assert status == 409 and body["error"]["code"] == "not_running"
    assert evict("lease-nope", 0)[0] == 404


def test_expiry_and_renewal(market):
    m, client = market
    short = _lease(client, duration_s=0.5)
    renewed = _lease(client, duration_s=0.5)
    out = client.renew(renewed["id"], 30.0)
    assert out["expires_at"] > renewed["expires_at"] + 20
    wait_for(lambda: client.lease(short["id"])["state"] == "expired", what="expired")
    assert client.lease(renewed["id"])["state"] == "running"
    with pytest.raises(MarketplaceError) as e:
        client.renew(short["id"], 30.0)
    assert e.value.code == "not_renewable"
    assert m.counts["expired"] == 1 and m.counts["renewed"] == 1


@pytest.mark.parametrize("market", [{"renew_refuse_p": 1.0}], indirect=True)
def test_renewal_refused(market):
    _m, client = market
    lease = _lease(client)
    with pytest.raises(MarketplaceError) as e:
        client.renew(lease["id"], 30.0)
    assert e.value.code == "not_renewable"


def test_process_exit_is_reported(market):
    _m, client = market
    import sys

    lease = client.request_lease(
        "cheap",
        duration_s=60,
        command=[sys.executable, "-c", "raise SystemExit(3)"],
        env={},
        labels={},
    )
    done = wait_for(lambda: (x := client.lease(lease["id"]))["state"] == "exited" and x)
    assert done["exit_code"] == 3 and not done["processes_gone"]  # still held: release it
    client.release(lease["id"])
    wait_for(lambda: client.lease(lease["id"])["processes_gone"])


def test_same_seed_replays_the_same_storm(tmp_path):
    storm = {
        "seed": 7,
        "refuse_p": 0.3,
        "evict_p": 0.5,
        "notice_p": 0.5,
        "evict_after_s": [1, 9],
        "grace_s": [0, 3],
        "start_delay_s": 1e6,
        "offers": [{**OFFERS[0], "available": 100}],
    }

    def replay(seed):
        outcomes, plans = [], []
        with Marketplace({**storm, "seed": seed}, work_dir=tmp_path / str(seed)) as m:
            client = LeaseClient(m.url)
            for _ in range(30):
                try:
                    outcomes.append(_lease(client)["id"])
                except Refused:
                    outcomes.append("refused")
            plans = [m.leases[x].evict_plan for x in outcomes if x != "refused"]
            client.close()
        return outcomes, plans

    a, b, c = replay(7), replay(7), replay(8)
    assert a == b
    assert a != c
    assert 0 < a[0].count("refused") < 30
    assert any(p is None for p in a[1]) and any(p and p[1] == 0 for p in a[1])


def test_evictions_driven_by_the_nodes_progress(tmp_path):
    """``evict_after_progress``: the eviction comes at the node's N-th unit of progress, however
    long that takes; the notice and grace follow from then."""
    done = {"1": 0, "2": 0}
    asked: list[str] = []

    def progress(env):
        asked.append(env["A"])
        return done[env["A"]]

    scenario = {
        "offers": OFFERS,
        "start_delay_s": 0.0,
        "evict_p": 1.0,
        "evict_after_s": [0.0, 0.0],  # would evict at once if time drove it
        "evict_after_progress": [3, 3],
        "notice_p": 0.0,
    }
    with Marketplace(
        scenario, work_dir=tmp_path / "sim", progress=progress, progress_poll_s=0.0
    ) as m:
        client = LeaseClient(m.url)
        a = client.request_lease("cheap", duration_s=60, command=SLEEPER, env={"A": "1"}, labels={})
        b = client.request_lease("cheap", duration_s=60, command=SLEEPER, env={"A": "2"}, labels={})
        wait_for(lambda: asked.count("1") >= 5 and asked.count("2") >= 5, what="progress polls")
        assert client.lease(a["id"])["state"] == "running" and m.counts["evicted"] == 0
        done["1"] = 3
        wait_for(lambda: client.lease(a["id"])["state"] == "evicted", what="a evicted")
        n = asked.count("2")
        wait_for(lambda: asked.count("2") >= n + 5, what="more polls of b")
        assert client.lease(b["id"])["state"] == "running" and m.counts["evicted"] == 1
        client.close()


def test_progress_evictions_need_a_progress_callable(tmp_path):
    with pytest.raises(ValueError, match="progress"):
        Marketplace({"evict_after_progress": [1, 2]}, work_dir=tmp_path / "sim")
