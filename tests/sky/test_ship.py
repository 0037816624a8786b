"""How yeto reaches a SkyPilot node: the run's own wheels, uploaded with the task and installed
after ``setup``, or its exact versions from an index, or the image's; the version lock in
``envs`` either way, checked by the island before it starts."""

from __future__ import annotations

import json
import os
import time
import zipfile

import pytest
from sky_double import LocalCloud

from yeto_core.config.load import config_to_dict, parse_config
from yeto_core.providers.dists import Shipped
from yeto_core.records import IslandLaunch
from yeto_sky.provider import SkyIslands
from yeto_sky.tasks import Ship, SkyTaskError, build_task, validate_task

RESOURCES = {"infra": "aws/us-east-1", "accelerators": "L4:1"}
SHIP = Ship(
    shipped=(
        Shipped("yeto-core", "0.1.0", "build", "/src/yeto_core"),
        Shipped("yeto-s3", "0.1.0", "file", "/wheels/yeto_s3-0.1.0-py3-none-any.whl"),
        Shipped("yeto-torch", "0.1.0", "index"),
    ),
    wheel_dir="/run/wheels",
)
ENV = {
    "YETO_STORE": "s3://bucket/demo",
    "YETO_RUN_ID": "demo",
    "YETO_ROLE": "sampler",
    "YETO_ISLAND": "sampler-0",
    "YETO_INCARNATION": "0",
}


def task(ship=SHIP, **options):
    return build_task(
        run_id="demo",
        island="sampler-0",
        incarnation=0,
        env=ENV,
        options={"resources": RESOURCES, **options},
        ship=ship,
    )


def test_the_runs_wheels_are_uploaded_and_installed_after_setup():
    t = task(setup="pip install vllm==0.11.0")
    c = t.config
    assert c["file_mounts"] == {"~/.yeto/wheels": "/run/wheels"}
    first, install = c["setup"].split("\n")
    assert first == "pip install vllm==0.11.0"  # your packages first (a CUDA torch, vLLM)
    assert install == (
        "python3 -m pip install --quiet ~/.yeto/wheels/yeto_core-0.1.0-py3-none-any.whl "
        "~/.yeto/wheels/yeto_s3-0.1.0-py3-none-any.whl yeto-torch==0.1.0"
    )  # a distribution the head installed from an index comes from it, pinned
    lock = json.loads(c["envs"]["YETO_VERSIONS"])
    assert lock == {"yeto-core": "0.1.0", "yeto-s3": "0.1.0", "yeto-torch": "0.1.0"}
    validate_task(c, "provider_options")  # SkyPilot takes file_mounts and setup as they are


def test_index_and_image_installs_keep_the_lock():
    index = task(install="index").config
    assert "file_mounts" not in index
    assert index["setup"] == (
        "python3 -m pip install --quiet yeto-core==0.1.0 yeto-s3==0.1.0 yeto-torch==0.1.0"
    )
    image = task(install="image").config
    assert "file_mounts" not in image and "setup" not in image
    assert "YETO_VERSIONS" in index["envs"] and "YETO_VERSIONS" in image["envs"]
    assert "setup" not in task(ship=None).config  # no ship: nothing installed, nothing locked
    assert "YETO_VERSIONS" not in task(ship=None).config["envs"]
    with pytest.raises(SkyTaskError, match=r"provider_options.install = 'pip'; use one of"):
        task(install="pip")


def sky_config(tmp_path, install="wheels"):
    options = {"resources": RESOURCES, "install": install}
    return parse_config(
        {
            "name": "demo",
            "run_dir": str(tmp_path / "run"),
            "store": "s3://bucket/demo",
            "model": {"path": str(tmp_path / "model")},
            "task": {"name": "sort4"},
            "samplers": [
                {"name": "sampler", "engine": "hf", "count": 2, "provider": "sky"}
                | {"provider_options": options, "price_per_hour": 0.3}
            ],
            "trainer": {"backend": "torch", "provider": "sky", "provider_options": options}
            | {"price_per_hour": 0.8},
        }
    )


def launch_of(island, role="sampler", install="wheels", **env):
    return IslandLaunch(
        run_id="demo",
        store_url="s3://bucket/demo",
        role=role,
        island=island,
        incarnation=0,
        env={**ENV, "YETO_ROLE": role, "YETO_ISLAND": island, **env},
        options={"resources": RESOURCES, "install": install},
        entry_module="yeto_core.islands.main",
    )


@pytest.mark.slow
def test_the_provider_builds_the_runs_wheels_and_uploads_them(tmp_path, monkeypatch):
    monkeypatch.setenv("YETO_WHEEL_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config_to_dict(sky_config(tmp_path))))
    provider = SkyIslands(run, seam=LocalCloud(tmp_path / "cloud"))
    ship = provider.ship(launch_of("sampler-1"))
    assert ship is provider.ship(launch_of("sampler-0"))  # built once per group
    assert ship.wheel_dir == str((run / "wheels").absolute())
    built = sorted(p.name for p in (run / "wheels").iterdir())
    assert built == [f"{d}-0.1.0-py3-none-any.whl" for d in ("yeto_core", "yeto_s3", "yeto_torch")]
    with zipfile.ZipFile(run / "wheels" / built[0]) as z:
        assert "yeto_core/providers/dists.py" in z.namelist()  # this checkout's code
    t = provider._task(launch_of("sampler-1"), ship)
    assert t.config["file_mounts"] == {"~/.yeto/wheels": ship.wheel_dir}
    assert "yeto_torch-0.1.0-py3-none-any.whl" in t.config["setup"]


def test_without_a_run_config_nothing_is_shipped(tmp_path):
    provider = SkyIslands(tmp_path / "run", seam=LocalCloud(tmp_path / "cloud"))
    assert provider.ship(launch_of("sampler-0")) is None
    kinds = [e.kind for e in provider.events("demo-sampler-0-i0")]
    assert kinds == ["sky_no_run_config"]


def test_a_node_with_other_yeto_versions_refuses_to_start(tmp_path):
    """The double runs the task's run command (the real island entry) with its envs."""
    cloud = LocalCloud(tmp_path / "cloud")
    ship = Ship(shipped=(Shipped("yeto-core", "9.9.9", "index"),), wheel_dir="")
    env = {**ENV, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    t = build_task(
        run_id="demo",
        island="sampler-0",
        incarnation=0,
        env=env,
        options={"resources": RESOURCES, "install": "image"},
        ship=ship,
    )
    try:
        job = cloud.wait_launch(cloud.launch(t.config, t.cluster, 30))
        deadline = time.monotonic() + 120
        while cloud.job_status(t.cluster, job) == "RUNNING":
            assert time.monotonic() < deadline, "the island did not end"
            time.sleep(0.05)
        assert cloud.job_status(t.cluster, job) == "FAILED"
        log = "\n".join(cloud.logs(t.cluster, job))
        assert "island sampler-0 refuses to start" in log
        assert "yeto-core 0.1.0 here, 9.9.9 in the run" in log
    finally:
        cloud.shutdown()
