"""The head with the ``sky`` provider: preemptions are lost incarnations, provider events
reach the head's stream, and the provider prices a launch."""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import pytest
from sky_double import LocalCloud

from yeto_core.buffer.fences import fenced
from yeto_core.config.load import parse_config
from yeto_core.events.stream import read_events
from yeto_core.head.islands import _CostedProvider
from yeto_core.head.run import MAX_SAMPLER_RESTARTS, Head
from yeto_core.plugins import Plugins
from yeto_core.records import IslandLaunch
from yeto_sky.provider import LOST, RUNNING, SkyIslands

PROBE_DIR = Path(__file__).parent / "probe"
SPOT = {"resources": {"infra": "aws/us-east-1", "accelerators": "L4:1", "use_spot": True}}


class ProbeSky(SkyIslands):
    """The sky provider whose clusters run the probe island instead of yeto's."""

    def launch(self, launch: IslandLaunch) -> str:
        env = {**launch.env, "PYTHONPATH": str(PROBE_DIR)}
        return super().launch(attrs.evolve(launch, env=env, entry_module="yeto_sky_probe"))


def wait_for(predicate, timeout_s=60.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def cloud(tmp_path):
    c = LocalCloud(tmp_path / "cloud")
    yield c
    c.shutdown()


@pytest.fixture
def head(tmp_path, cloud):
    config = parse_config(
        {
            "name": "skyhead",
            "run_dir": str(tmp_path / "run"),
            "store": str(tmp_path / "store"),
            "model": {"path": str(tmp_path / "model")},
            "task": {"name": "sort4"},
            "samplers": [
                {
                    "name": "sampler",
                    "engine": "hf",
                    "count": 2,
                    "provider": "sky",
                    "provider_options": SPOT,
                    "price_per_hour": 0.31,
                }
            ],
            "trainer": {"backend": "torch", "provider": "sky", "provider_options": SPOT},
        }
    )
    provider = ProbeSky(tmp_path / "run", seam=cloud, poll_s=0.05)
    yield Head(config, Plugins(), provider=provider)
    provider.close()


def head_kinds(head) -> list[str]:
    head.events.flush()
    return [e.kind for e in read_events(head.store, "head")]


def test_preemptions_are_lost_incarnations_replaced_beyond_the_restart_limit(head, cloud):
    provider = head.provider_of("sampler-0")
    for island in ("sampler-0", "sampler-1"):
        head.launch_sampler(island)
    for n in range(MAX_SAMPLER_RESTARTS + 1):  # one more than an exiting island may have
        handle = head.sampler_handles["sampler-0"]
        assert handle == f"skyhead-sampler-0-i{n}"
        wait_for(lambda h=handle: provider.status(h) == RUNNING, what=f"{handle} running")
        cloud.preempt(handle)
        wait_for(lambda h=handle: provider.status(h) == LOST, what=f"{handle} seen preempted")
        head.check_samplers()
        assert head.sampler_handles["sampler-0"] == f"skyhead-sampler-0-i{n + 1}"
        assert provider.record(handle)["state"] == "released"
    assert head.state.sampler_restarts == {}  # no preemption counted as an exit
    assert head.sampler_handles["sampler-1"] == "skyhead-sampler-1-i0"
    assert fenced(head.store) == {("sampler-0", i) for i in range(MAX_SAMPLER_RESTARTS + 1)}
    kinds = head_kinds(head)
    assert kinds.count("sky_preempted") == MAX_SAMPLER_RESTARTS + 1
    assert kinds.count("sampler_fenced") == MAX_SAMPLER_RESTARTS + 1
    assert "sampler_exited" not in kinds
    assert {"sky_task", "sky_cluster_up", "sky_released", "log"} <= set(kinds)


def test_the_trainers_provider_events_reach_the_heads_stream(head, cloud):
    provider = _CostedProvider(head, head.providers["sky"])
    handle = provider.launch(head.launch_record("trainer", "trainer", 0))
    wait_for(lambda: provider.status(handle) == RUNNING, what="the trainer cluster")
    log = Path(head.provider_of("trainer").log_hint(handle))
    wait_for(lambda: log.is_file() and "env " in log.read_text(), what="the trainer's log")
    # the lifecycle checks status every tick; each check copies what the provider saw
    wait_for(lambda: provider.status(handle) and "log" in head_kinds(head), what="log events")
    cloud.preempt(handle)
    wait_for(lambda: provider.status(handle) == LOST, what="the trainer seen preempted")
    assert provider.release(handle) is True
    head.events.flush()
    events = [e for e in read_events(head.store, "head") if e.data.get("handle") == handle]
    kinds = [e.kind for e in events]
    # this head never started, so its run dir holds no config: yeto is not shipped here
    assert kinds[:4] == ["sky_no_run_config", "sky_task", "sky_launch_requested", "sky_cluster_up"]
    assert "sky_preempted" in kinds and kinds[-1] == "sky_released"
    assert all(e.data["island"] == "trainer" for e in events)
    lines = [ln for e in events if e.kind == "log" for ln in e.data["lines"]]
    assert "probe trainer i0" in lines


def test_the_provider_prices_a_launch_from_the_catalog(head):
    provider = head.provider_of("sampler-0")
    launch = head.launch_record("sampler", "sampler-0", 0)
    assert provider.price_per_hour(launch) == 0.31  # the seeded catalog's g6.xlarge spot
    on_demand = {"resources": {"infra": "aws/us-east-1", "accelerators": "L4:1"}}
    assert provider.price_per_hour(attrs.evolve(launch, options=on_demand)) == 0.8
    table = {"resources": {"infra": "gcp", "accelerators": "H100:2", "use_spot": True}}
    assert provider.price_per_hour(attrs.evolve(launch, options=table)) == 3.4  # 2 x 1.70
    bad = {"resources": {"acelerators": "L4:1"}}
    assert provider.price_per_hour(attrs.evolve(launch, options=bad)) is None


def test_the_provider_prices_a_cluster_it_launched_by_its_handle(head):
    # the cost ledger asks by handle (IslandProvider.price_per_hour(handle))
    provider = head.provider_of("sampler-0")
    handle = provider.launch(head.launch_record("sampler", "sampler-0", 0))
    try:
        assert provider.price_per_hour(handle) == 0.31
    finally:
        provider.release(handle)
    assert provider.price_per_hour("sky-no-such-cluster") is None
