"""yeto-modal's preflight: the store's layout against its capabilities, the plan, the prices."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from yeto_core.config.preflight import Report
from yeto_modal.plugin import check_plan, check_store_layout
from yeto_modal.prices import hourly_usd


def cfg(store, counts=(1,), layout="auto", price=None, gpu="L4"):
    samplers = [
        NS(
            name=f"s{i}",
            count=n,
            engine="hf",
            provider="modal",
            provider_options={"gpu": gpu},
            island_names=lambda i=i, n=n: [f"s{i}-{k}" for k in range(n)],
        )
        for i, n in enumerate(counts)
    ]
    trainer = NS(name="trainer", backend="torch", provider="local", provider_options={})
    want = round(hourly_usd(gpu), 4) if price is None else price
    prices = {
        f"s{i}-{k}": (want if price is None else price)
        for i, n in enumerate(counts)
        for k in range(n)
    }
    return NS(
        name="demo",
        run_dir="runs/demo",
        samplers=samplers,
        trainer=trainer,
        task=NS(name="sort4"),
        store_url=lambda: store,
        buffer=NS(layout=layout),
        island_prices=lambda: prices,
    )


def statuses(report, name):
    return [(c.status, c.detail) for c in report.checks if c.name == name]


@pytest.mark.parametrize(
    "counts,layout,status,words",
    [
        ((1,), "auto", "ok", "one appender"),
        ((2,), "auto", "fail", "no atomic create-if-absent across writers"),
        ((1, 1), "objects", "fail", "from 2 sampler islands"),
        ((1,), "shards", "fail", "local file system"),
        ((1,), "jsonl", "fail", "local file system"),
    ],
)
def test_layouts_that_need_atomic_create_with_several_writers_are_refused(
    counts, layout, status, words
):
    report = Report()
    check_store_layout(cfg("modal-volume://vol/runs/demo", counts, layout), report)
    [(got, detail)] = statuses(report, "modal-store")
    assert got == status and words in detail


def test_a_local_directory_store_is_refused_for_modal_islands():
    report = Report()
    check_store_layout(cfg("runs/demo/store"), report)
    [(status, detail)] = statuses(report, "modal-store")
    assert status == "fail" and "cannot reach" in detail


def test_other_stores_are_not_checked():
    report = Report()
    check_store_layout(cfg("s3://bucket/runs/demo", (4,)), report)
    assert report.checks == []


def test_plan_lines_and_prices():
    report = Report()
    check_plan(cfg("s3://b/r", (2,)), report)
    plan = statuses(report, "modal-plan")
    assert plan[0] == ("ok", "Modal app 'yeto-demo' (prices of 2026-06-27):")
    assert "yeto-s0 (sampler: s0-0, s0-1): gpu L4" in plan[1][1]
    assert f"${hourly_usd('L4') * 2:.4f}/hour for 2" in plan[1][1]
    assert statuses(report, "modal-prices")[0][0] == "ok"
    assert report.passed


def test_a_zero_price_fails_and_says_what_to_set():
    report = Report()
    check_plan(cfg("s3://b/r", (1,), price=0.0), report)
    [(status, detail)] = statuses(report, "modal-prices")
    assert status == "fail" and f"price_per_hour = {round(hourly_usd('L4'), 4)}" in detail
    report = Report()
    check_plan(cfg("s3://b/r", (1,), price=9.0), report)
    assert statuses(report, "modal-prices")[0][0] == "warn"


def test_a_bad_option_is_a_failed_check_not_a_crash():
    report = Report()
    check_plan(cfg("s3://b/r", (1,), gpu="V100", price=1.0), report)
    [(status, detail)] = statuses(report, "modal-plan")
    assert status == "fail" and "no price for 'V100'" in detail
