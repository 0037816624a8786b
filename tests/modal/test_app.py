"""The run's Modal app: the real modal.App/Image/Volume/Secret/function objects, offline."""

from __future__ import annotations

from types import SimpleNamespace as NS

import modal
import pytest

from yeto_core.errors import ConfigError
from yeto_core.plugins import get_plugins
from yeto_modal import app as modal_app
from yeto_modal.entry import island
from yeto_modal.prices import hourly_usd


def config(
    sampler_options=None, trainer_options=None, store="s3://bucket/runs/demo", trainer="modal"
):
    s = NS(
        name="gen",
        count=3,
        engine="hf",
        provider="modal",
        provider_options=sampler_options if sampler_options is not None else {},
        island_names=lambda: ["gen-0", "gen-1", "gen-2"],
    )
    local = NS(
        name="cpu",
        count=1,
        engine="hf",
        provider="local",
        provider_options={},
        island_names=lambda: ["cpu-0"],
    )
    t = NS(
        name="trainer", backend="torch", provider=trainer, provider_options=trainer_options or {}
    )
    return NS(
        name="demo",
        run_dir="runs/demo",
        samplers=[s, local],
        trainer=t,
        task=NS(name="sort4"),
        store_url=lambda: store,
    )


SAMPLER = {
    "gpu": "H100:2",
    "cpu": 8,
    "memory": 65536,
    "timeout_s": 7200,
    "region": ["us-east", "us-west"],
    "volumes": {"/models": "yeto-weights"},
    "secrets": ["hf-token"],
    "image": {"python": "3.11", "apt": ["git"], "pip": ["vllm==0.11.0"], "env": {"VLLM_X": "1"}},
}


def test_one_function_per_modal_island_group():
    plans = modal_app.plan(config(SAMPLER, {"gpu": "A100-80GB"}), get_plugins())
    assert [(p.name, p.role, p.islands) for p in plans] == [
        ("yeto-gen", "sampler", ("gen-0", "gen-1", "gen-2")),
        ("yeto-trainer", "trainer", ("trainer",)),
    ]  # the local group "cpu" is not on Modal
    assert modal_app.plan(config(SAMPLER, trainer="local"), get_plugins())[-1].name == "yeto-gen"


WHEELS = {
    "yeto-core": "yeto_core-0.1.0-py3-none-any.whl",
    "yeto-modal": "yeto_modal-0.1.0-py3-none-any.whl",
    "yeto-s3": "yeto_s3-0.1.0-py3-none-any.whl",
    "yeto-torch": "yeto_torch-0.1.0-py3-none-any.whl",
}


def test_image_installs_the_runs_own_wheels_and_the_engine():
    gen = modal_app.plan(config(SAMPLER), get_plugins())[0]
    steps = dict(gen.image)
    assert steps["debian_slim"] == "3.11"
    assert steps["apt_install"] == ("git",)
    copied = [arg for method, arg in gen.image if method == "add_local_file"]
    assert copied == [(f"runs/demo/wheels/{w}", f"/yeto/wheels/{w}") for w in WHEELS.values()]
    pip = steps["pip_install"]
    assert pip == (*(f"/yeto/wheels/{w}" for w in WHEELS.values()), "vllm==0.11.0")
    assert not any(r.startswith("yeto-") for r in pip)  # nothing of yeto from an index
    methods = [m for m, _ in gen.image]
    assert methods.index("pip_install") > max(
        i for i, m in enumerate(methods) if m == "add_local_file"
    )
    assert steps["env"] == {"VLLM_X": "1"}
    assert {s.dist: s.version for s in gen.shipped} == dict.fromkeys(WHEELS, "0.1.0")
    assert {s.how for s in gen.shipped} == {"build"}  # this checkout's source trees
    assert {s.wheel for s in gen.shipped} == set(WHEELS.values())


def test_image_from_an_index_or_the_local_sources():
    index = dict(modal_app.plan(config({"image": {"source": "index"}}), get_plugins())[0].image)
    assert index["pip_install"] == tuple(f"{d}==0.1.0" for d in WHEELS)
    assert "add_local_file" not in index
    old_name = modal_app.plan(config({"image": {"source": "pypi"}}), get_plugins())[0]
    assert dict(old_name.image)["pip_install"] == index["pip_install"]
    local = modal_app.plan(config({"image": {"source": "local"}}), get_plugins())[0]
    lsteps = dict(local.image)
    assert local.image[-1][0] == "add_local_python_source"
    assert {"yeto_core", "yeto_modal", "yeto_torch", "yeto_s3"} <= set(
        lsteps["add_local_python_source"]
    )
    assert any(r.startswith("torch") for r in lsteps["pip_install"])
    assert not any(r.startswith("yeto") for r in lsteps["pip_install"])
    assert local.shipped == ()  # copied sources have no versions to lock


def test_the_wheels_are_copied_into_a_layer_pip_install_can_read(monkeypatch):
    """Modal runs no build step after an add_local_file unless the file is copied (copy=True)."""
    seen = []
    real = modal.Image.add_local_file

    def spy(self, local_path, remote_path, **kw):
        seen.append((remote_path, kw))
        return real(self, local_path, remote_path, **kw)

    monkeypatch.setattr(modal.Image, "add_local_file", spy)
    cfg = config(SAMPLER)
    built = modal_app.build(cfg, modal_app.plan(cfg, get_plugins()), config_json={})
    assert isinstance(built.kwargs["yeto-gen"]["image"], modal.Image)
    assert seen and all(kw == {"copy": True} for _, kw in seen)
    assert {r for r, _ in seen} == {f"/yeto/wheels/{w}" for w in WHEELS.values()}


def test_real_modal_objects_carry_the_config():
    cfg = config(SAMPLER, {"gpu": "A10", "nonpreemptible": True})
    built = modal_app.build(
        cfg,
        modal_app.plan(cfg, get_plugins()),
        credentials={"YETO_STORE_S3_ACCESS_KEY_ID": "k", "YETO_STORE_S3_SECRET_ACCESS_KEY": "s"},
        config_json={"name": "demo"},
    )
    assert isinstance(built.app, modal.App) and built.app.name == "yeto-demo"
    gen, trainer = built.functions["yeto-gen"], built.functions["yeto-trainer"]
    assert isinstance(gen, modal.Function)
    spec = gen._spec_  # the function's definition as Modal will send it
    assert spec.gpus == "H100:2" and spec.cpu == 8 and spec.memory == 65536
    assert list(spec.scheduler_placement.regions) == ["us-east", "us-west"]
    ((path, vol),) = spec.volumes.items()
    assert path == "/models" and repr(vol) == "modal.Volume.from_name('yeto-weights')"
    assert [repr(s) for s in spec.secrets] == [
        "modal.Secret.from_name('hf-token')",
        "Secret.from_dict([YETO_STORE_S3_ACCESS_KEY_ID, YETO_STORE_S3_SECRET_ACCESS_KEY])",
    ]  # the values are not in the repr
    kw = built.kwargs["yeto-gen"]
    assert isinstance(kw["image"], modal.Image)
    assert isinstance(kw["volumes"]["/models"], modal.Volume)
    assert all(isinstance(s, modal.Secret) for s in kw["secrets"])
    assert kw["timeout"] == 7200 and kw["retries"] == 0 and kw["serialized"] is True
    assert trainer._spec_.gpus == "A10" and built.kwargs["yeto-trainer"]["nonpreemptible"] is True
    assert built.secret_env == {
        "YETO_STORE_S3_ACCESS_KEY_ID": "k",
        "YETO_STORE_S3_SECRET_ACCESS_KEY": "s",
    }


def test_the_body_runs_through_local():
    """`.local()` runs the function's real body in process: here an entry module that exits 2."""
    cfg = config(SAMPLER)
    built = modal_app.build(cfg, modal_app.plan(cfg, get_plugins()), config_json={})
    env = {"YETO_MODAL_ENTRY": "yeto_core.testing.idle_island"}  # no store named: exit 2
    assert built.functions["yeto-gen"].local(env) == 2
    assert island.__module__ == "yeto_modal.entry"


def test_an_island_with_other_yeto_versions_refuses_to_start(capfd, monkeypatch):
    """The body runs the island entry, which checks the run's versions first."""
    cfg = config(SAMPLER)
    built = modal_app.build(cfg, modal_app.plan(cfg, get_plugins()), config_json={})
    env = {
        "YETO_MODAL_ENTRY": "yeto_core.islands.main",
        "YETO_STORE": "memory://nowhere",
        "YETO_ROLE": "sampler",
        "YETO_ISLAND": "gen-0",
        "YETO_INCARNATION": "0",
        "YETO_VERSIONS": '{"yeto-core": "9.9.9", "yeto-modal": "0.1.0"}',
    }
    for k, v in env.items():  # the body puts env into os.environ: restored after the test
        monkeypatch.setenv(k, v)
    assert built.functions["yeto-gen"].local(env) == 2
    err = capfd.readouterr().err
    assert "island gen-0 refuses to start" in err
    assert "yeto-core 0.1.0 here, 9.9.9 in the run" in err
    assert "yeto-modal 0.1.0 here" not in err  # only what differs


def test_plan_prices_and_render():
    plans = modal_app.plan(
        config(SAMPLER, {"gpu": "B200:8", "price_multiplier": 1.25}), get_plugins()
    )
    gen, tr = plans
    assert gen.usd_per_hour == pytest.approx(hourly_usd("H100:2", 8, 65536))
    assert tr.usd_per_hour == pytest.approx(hourly_usd("B200:8") * 1.25)
    text = "\n".join(modal_app.render(plans, "yeto-demo"))
    assert "yeto-gen (sampler: gen-0, gen-1, gen-2): gpu H100:2" in text
    assert "/models <- yeto-weights" in text and "hf-token" in text
    assert f"${gen.usd_per_hour * 3:.4f}/hour for 3" in text


def test_bad_options_name_their_path():
    with pytest.raises(ConfigError, match=r"samplers\[name='gen'\].provider_options: unknown key"):
        modal_app.plan(config({"gpus": "H100"}), get_plugins())
    with pytest.raises(ConfigError, match="image: unknown key"):
        modal_app.plan(config({"image": {"pips": []}}), get_plugins())
    with pytest.raises(ConfigError, match="use one of wheels, index, local"):
        modal_app.plan(config({"image": {"source": "git"}}), get_plugins())
    with pytest.raises(ConfigError, match="no price for 'V100'"):
        modal_app.plan(config({"gpu": "V100"}), get_plugins())
