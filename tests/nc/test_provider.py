"""The nc island provider against the marketplace simulator."""

from __future__ import annotations

import os
import time

import pytest

from tests.nc.helpers import SLEEPER, wait_for
from yeto_core.errors import ConfigError, YetoError
from yeto_core.plugins import Plugins
from yeto_core.records import IslandLaunch, IslandStatus
from yeto_nc.client import LeaseClient
from yeto_nc.provider import NcIslands
from yeto_nc.testing import Marketplace

OFFERS = [
    {"id": "cheap", "gpu": "A10", "gpus": 1, "region": "eu", "usd_per_hour": 0.9, "available": 8},
    {"id": "dear", "gpu": "H100", "gpus": 1, "region": "us", "usd_per_hour": 3.6, "available": 8},
]


@pytest.fixture
def market(tmp_path, request):
    scenario = {"offers": OFFERS, "start_delay_s": 0.0, **getattr(request, "param", {})}
    with Marketplace(scenario, work_dir=tmp_path / "sim") as m:
        yield m


def _launch(market, island="hf-0", incarnation=0, **options):
    opts = {
        "url": market.url,
        "command": SLEEPER,
        "lease_s": 60,
        "renew_before_s": 1,
        "launch_timeout_s": 5,
        **options,
    }
    return IslandLaunch(
        run_id="r1",
        store_url="dir:///x",
        role="sampler",
        island=island,
        incarnation=incarnation,
        env={"YETO_ISLAND": island},
        options=opts,
    )


def _kinds(provider, handle):
    return [e.kind for e in provider.events(handle)]


def _gone(pid):
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_registered_through_the_hooks():
    assert Plugins().island_provider("nc") is NcIslands


def test_launch_status_release_and_cost(market, tmp_path):
    p = NcIslands(tmp_path / "run")
    before = time.time()
    h = p.launch(_launch(market, gpu="H100"))
    after = time.time()
    assert h == "hf-0-i0"
    rec = p.record(h)
    assert rec["offer"] == "dear" and rec["lease_id"]
    assert p.price_per_hour(h) == 3.6  # the granted offer's price
    wait_for(lambda: p.status(h) == IslandStatus.RUNNING, what="running")
    lease = market.leases[rec["lease_id"]]
    env = dict(lease.req["env"])
    submitted = float(env.pop("YETO_START_SUBMITTED_UNIX"))  # issue 52 item 2
    assert before <= submitted <= after
    assert env == {"YETO_ISLAND": "hf-0", "YETO_HANDLE": h}
    assert lease.req["labels"]["yeto_run"] == "r1"
    assert p.release(h) is True
    assert _gone(lease.proc.pid) and p.status(h) == IslandStatus.GONE
    billed = market.billing_usd()[rec["lease_id"]]
    assert p.costs() == {h: billed} and billed > 0
    assert p.price_per_hour(h) is None  # released: no lease
    assert "nc_lease_granted" in _kinds(p, h)


def test_cheapest_offer_within_price(market, tmp_path):
    p = NcIslands(tmp_path / "run")
    h = p.launch(_launch(market, max_usd_per_hour=1.0))
    assert p.record(h)["offer"] == "cheap"
    p.release(h)


@pytest.mark.parametrize("market", [{"seed": 3, "refuse_p": 0.6}], indirect=True)
def test_refused_requests_are_retried(market, tmp_path):
    p = NcIslands(tmp_path / "run")
    handles = [p.launch(_launch(market, island=f"hf-{i}")) for i in range(4)]
    kinds = [k for h in handles for k in _kinds(p, h)]
    assert kinds.count("nc_lease_granted") == 4
    assert kinds.count("nc_lease_refused") == market.counts["refused"] > 0
    assert all(p.release(h) for h in handles)


@pytest.mark.parametrize("market", [{"refuse_p": 1.0}], indirect=True)
def test_launch_gives_up_after_timeout(market, tmp_path):
    p = NcIslands(tmp_path / "run", sleep=lambda s: None)
    with pytest.raises(YetoError, match="no lease for hf-0-i0 within launch_timeout_s"):
        p.launch(_launch(market, launch_timeout_s=0.3))
    assert p.held() == []


@pytest.mark.parametrize(
    "market",
    [
        {
            "evictions": [
                {"lease": 0, "after_s": 0.5, "grace_s": 0.3},
                {"lease": 1, "after_s": 0.3, "grace_s": 0},
            ]
        }
    ],
    indirect=True,
)
def test_evictions_are_lost_incarnations(market, tmp_path):
    p = NcIslands(tmp_path / "run")
    a = p.launch(_launch(market, island="hf-0"))
    b = p.launch(_launch(market, island="hf-1"))
    wait_for(lambda: p.status(a) == IslandStatus.LOST, what="a lost")
    wait_for(lambda: p.status(b) == IslandStatus.LOST, what="b lost")
    assert "nc_eviction_notice" in _kinds(p, a)
    assert p.release(a) and p.release(b)
    assert market.counts["evicted"] == 2 and market.counts["evicted_without_notice"] == 1
    assert set(p.costs()) == {a, b}


def test_renewal_before_expiry(market, tmp_path):
    p = NcIslands(tmp_path / "run")
    h = p.launch(_launch(market, lease_s=1.2, renew_before_s=0.8))
    lid = p.record(h)["lease_id"]
    first = market.leases[lid].expires_at
    wait_for(
        lambda: p.status(h) == IslandStatus.RUNNING and market.leases[lid].expires_at > first,
        what="a renewal",
    )
    assert "nc_lease_renewed" in _kinds(p, h)
    assert p.release(h)


@pytest.mark.parametrize("market", [{"renew_refuse_p": 1.0}], indirect=True)
def test_refused_renewal_then_expiry_is_lost(market, tmp_path):
    p = NcIslands(tmp_path / "run")
    h = p.launch(_launch(market, lease_s=3.0, renew_before_s=2.5))
    assert not p.replace_soon(h)
    # the refused renewal comes before the end: the head may start the replacement then
    wait_for(lambda: p.status(h) == IslandStatus.RUNNING and p.replace_soon(h), what="refusal")
    assert market.leases[p.record(h)["lease_id"]].state == "running"
    wait_for(lambda: p.status(h) == IslandStatus.LOST, what="expired")
    kinds = _kinds(p, h)
    assert "nc_renew_refused" in kinds and market.counts["expired"] == 1
    assert p.release(h)


def test_orphans_by_record_and_by_label(market, tmp_path):
    a = NcIslands(tmp_path / "run")
    h0 = a.launch(_launch(market, island="hf-0"))
    h1 = a.launch(_launch(market, island="hf-1"))
    assert a.orphans() == []
    # a head that died right after the request: no lease id in its record
    rec = a.record(h1)
    rec["lease_id"] = None
    a._write(h1, rec)
    b = NcIslands(tmp_path / "run")
    assert b.orphans() == [h0, h1]
    assert b.release(h0) and b.release(h1)
    assert b.orphans() == []
    client = LeaseClient(market.url)
    assert {x["state"] for x in client.leases(label="yeto_run=r1")} == {"released"}


def test_max_nodes_and_config_errors(market, tmp_path):
    p = NcIslands(tmp_path / "run")
    h = p.launch(_launch(market, island="hf-0", max_nodes=1))
    with pytest.raises(YetoError, match="max_nodes=1"):
        p.launch(_launch(market, island="hf-1", max_nodes=1))
    p.release(h)
    with pytest.raises(ConfigError, match="unknown key"):
        p.launch(_launch(market, bogus=1))
    with pytest.raises(ConfigError, match="marketplace URL"):
        p.launch(_launch(market, url=""))
    with pytest.raises(ConfigError, match="renew_before_s"):
        p.launch(_launch(market, lease_s=1, renew_before_s=2))
