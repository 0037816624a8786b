"""The sky preflight: store reachable from the cloud, each task validated, prices."""

from __future__ import annotations

from types import SimpleNamespace

from yeto_core.config.preflight import Report
from yeto_sky import plugin


def _config(store="s3://bucket/demo", sampler_options=None, trainer_provider="local", **kw):
    sampler = SimpleNamespace(
        name="sampler",
        engine="hf",
        provider="sky",
        provider_options=sampler_options
        or {"resources": {"infra": "aws/us-east-1", "accelerators": "L4:1", "use_spot": True}},
        price_per_hour=kw.get("sampler_price", 0.31),
        island_names=lambda: ["sampler-0", "sampler-1"],
    )
    trainer = SimpleNamespace(
        name="trainer",
        backend="torch",
        provider=trainer_provider,
        provider_options={"resources": {"infra": "gcp", "accelerators": "H100:1"}},
        price_per_hour=kw.get("trainer_price", 3.9),
    )
    return SimpleNamespace(
        name="demo",
        run_id="demo",
        run_dir="runs/demo",
        task=SimpleNamespace(name="sort4"),
        samplers=[sampler],
        trainer=trainer,
        store_url=lambda: store,
    )


def _checks(config):
    report = Report()
    plugin.yeto_preflight(config, report)
    return {c.name: c for c in report.checks}, report


def test_each_island_task_is_shown_with_its_resources_and_price():
    checks, report = _checks(_config(trainer_provider="sky"))
    assert report.passed, report.render()
    s0 = checks["sky.task[sampler-0]"]
    assert "cluster demo-sampler-0-i0 (spot, aws/us-east-1, {'L4': 1})" in s0.detail
    assert "~$0.31/h from SkyPilot catalog aws/vms.csv us-east-1 g6.xlarge (spot)" in s0.detail
    assert "run: exec python3 -m yeto_core.islands.main" in s0.detail
    # the run's own wheels, uploaded with the task and installed on the node; the lock
    assert "~/.yeto/wheels: runs/demo/wheels" in s0.detail
    assert "~/.yeto/wheels/yeto_core-0.1.0-py3-none-any.whl" in s0.detail
    assert (
        """YETO_VERSIONS: '{"yeto-core": "0.1.0", "yeto-s3": "0.1.0", "yeto-torch": "0.1.0"}'"""
        in (s0.detail)
    )
    install = checks["sky.install[samplers[0]]"]
    assert install.status == "ok" and "yeto-core 0.1.0 (wheel built at launch)" in install.detail
    assert "sky.task[sampler-1]" in checks
    t = checks["sky.task[trainer]"]
    assert "(on-demand, gcp, {'H100': 1})" in t.detail and "table 2025-06" in t.detail
    assert checks["sky.samplers[0].price_per_hour"].status == "ok"
    assert checks["sky.store"].status == "ok"


def test_a_dir_store_is_refused():
    checks, report = _checks(_config(store="runs/demo/store"))
    assert checks["sky.store"].status == "fail"
    assert "set store to an s3:// URL" in checks["sky.store"].detail


def test_an_invalid_resource_fails_with_skypilots_message_and_the_toml_path():
    checks, report = _checks(_config(sampler_options={"resources": {"acelerators": "L4:1"}}))
    fail = checks["sky.task[sampler-0]"]
    assert fail.status == "fail"
    assert fail.detail.startswith("samplers[0].provider_options.resources: SkyPilot refused")
    assert "did you mean 'accelerators'" in fail.detail
    assert "sky.task[sampler-1]" not in checks  # one failure per group


def test_an_unknown_accelerator_fails_against_the_local_catalog():
    checks, _ = _checks(_config(sampler_options={"resources": {"accelerators": "H999:1"}}))
    assert checks["sky.task[sampler-0]"].status == "fail"
    assert "'H999' is not in SkyPilot's catalog" in checks["sky.task[sampler-0]"].detail


def test_a_zero_price_fails_with_the_estimate_and_a_far_price_warns():
    checks, _ = _checks(_config(sampler_price=0.0))
    c = checks["sky.samplers[0].price_per_hour"]
    assert c.status == "fail" and "set samplers[0].price_per_hour to about 0.31" in c.detail
    checks, _ = _checks(_config(sampler_price=5.0))
    c = checks["sky.samplers[0].price_per_hour"]
    assert c.status == "warn" and "the cost ledger uses 5" in c.detail


def test_configs_without_sky_groups_get_no_sky_checks():
    config = _config()
    config.samplers[0].provider = "local"
    checks, _ = _checks(config)
    assert checks == {}
