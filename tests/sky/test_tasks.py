"""Each island's SkyPilot task, built and validated offline by the real ``sky.Task``."""

from __future__ import annotations

import pytest

from yeto_sky import prices, tasks
from yeto_sky.tasks import SkyTaskError, build_task, check_accelerators

ENV = {
    "YETO_STORE": "s3://bucket/runs/demo",
    "YETO_RUN_ID": "demo",
    "YETO_ROLE": "sampler",
    "YETO_ISLAND": "sampler-0",
    "YETO_INCARNATION": "2",
    "YETO_STORE_S3_SECRET_ACCESS_KEY": "s3cr3t",
}
WHERE = "samplers[0].provider_options"


def _task(resources, **options):
    return build_task(
        run_id="demo",
        island="sampler-0",
        incarnation=2,
        env=ENV,
        options={"resources": resources, **options},
        where=WHERE,
    )


def test_task_names_the_cluster_and_runs_the_island_with_only_store_and_ids():
    t = _task({"infra": "aws/us-east-1", "accelerators": "L4:1", "use_spot": True}, setup="true")
    assert t.cluster == "demo-sampler-0-i2"
    assert t.config["run"] == "exec python3 -m yeto_core.islands.main"
    assert set(t.config["envs"]) == {
        "YETO_STORE",
        "YETO_RUN_ID",
        "YETO_ROLE",
        "YETO_ISLAND",
        "YETO_INCARNATION",
    }
    assert t.config["secrets"] == {"YETO_STORE_S3_SECRET_ACCESS_KEY": "s3cr3t"}
    assert t.use_spot and t.accelerators == {"L4": 1} and t.infra == "aws/us-east-1"
    assert t.autostop_minutes == tasks.DEFAULT_AUTOSTOP_MINUTES
    shown = tasks.redacted_yaml(t.config)
    assert "s3cr3t" not in shown and "<redacted>" in shown and "demo-sampler-0-i2" in shown


def test_skypilot_itself_parses_the_generated_task():
    import sky

    t = _task({"infra": "aws/us-east-1", "accelerators": {"A100": 8}})
    task = sky.Task.from_yaml_config(t.config)
    (r,) = list(task.resources)
    assert str(r.cloud) == "AWS" and r.region == "us-east-1" and r.accelerators == {"A100": 8}
    assert task.envs["YETO_ISLAND"] == "sampler-0"


@pytest.mark.parametrize(
    "resources, message",
    [
        ({"acelerators": "L4:1"}, "did you mean 'accelerators'"),
        ({"use_spot": "maybe"}, "'maybe' is not of type 'boolean'"),
        ({"accelerators": "L4:0"}, "Accelerator count must be a positive number"),
        ({"infra": "nocloud"}, "'nocloud' does not match"),
    ],
)
def test_an_invalid_resource_is_refused_with_skypilots_message_and_the_toml_path(
    resources, message
):
    with pytest.raises(SkyTaskError) as info:
        _task(resources)
    assert message in str(info.value)
    assert str(info.value).startswith(f"{WHERE}.resources: SkyPilot refused the task")


def test_unknown_provider_option_and_bad_autostop_name_their_path():
    with pytest.raises(SkyTaskError, match=r"samplers\[0\].provider_options.region: unknown"):
        _task({}, region="x")
    with pytest.raises(SkyTaskError, match="autostop_minutes = 0"):
        _task({}, autostop_minutes=0)


def test_accelerator_names_are_checked_against_the_local_catalog():
    checked, detail = check_accelerators(_task({"accelerators": "l4"}), WHERE)
    assert checked and "l4" in detail.lower()
    with pytest.raises(SkyTaskError, match="'H999' is not in SkyPilot's catalog"):
        check_accelerators(_task({"accelerators": "H999:2"}), WHERE)


def test_without_a_local_catalog_names_are_not_checked_and_it_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(tasks, "catalog_path", lambda name: str(tmp_path / name))
    checked, detail = check_accelerators(_task({"accelerators": "H999:2"}), WHERE)
    assert not checked and "not checked" in detail


def test_prices_come_from_the_catalog_when_it_is_local():
    spot = prices.estimate(
        _task({"infra": "aws/us-east-1", "accelerators": "L4:1", "use_spot": True})
    )
    assert spot.per_hour == pytest.approx(0.31) and "aws/vms.csv us-east-1 g6.xlarge" in spot.source
    od = prices.estimate(_task({"infra": "aws/us-west-2", "accelerators": "L4:1"}))
    assert od.per_hour == pytest.approx(0.9) and "on-demand" in od.source
    cpu = prices.estimate(_task({"infra": "aws/us-east-1"}))
    assert cpu.per_hour == pytest.approx(0.192)


def test_prices_fall_back_to_the_dated_table():
    # GCP has no local catalog here: the table, per accelerator times the count
    p = prices.estimate(_task({"infra": "gcp", "accelerators": {"H100": 2}, "use_spot": True}))
    assert p.per_hour == pytest.approx(2 * prices.TABLE["H100"][1])
    assert prices.TABLE_DATE in p.source
    assert prices.estimate(_task({"infra": "gcp", "accelerators": "H999:1"})) is None
