"""End to end: the quickstart task with provider = "sky", islands as local processes.

The head runs in this process; the seam's double runs each cluster's run
command (``python3 -m yeto_core.islands.main`` with only the store URL, the ids
and the store's credentials) in an empty directory against a loopback S3
server. A first head is left mid-run as a killed head would leave it; a
second head on the same run dir tears down the first head's clusters, trains
to the target, and survives a spot preemption of a sampler mid-run (the trainer
is on demand).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

pytest.importorskip("yeto_torch")
pytest.importorskip("yeto_s3")
pytest.importorskip(
    "yeto_core.providers.env", reason="needs the ports API (islands need only the store)"
)

from sky_double import LocalCloud

from yeto_sky.provider import RUNNING, SkyIslands

# 13-20 minutes on 2 idle cores, 40 at a load of ~30: run by `make examples` (YETO_SOAK=1),
# not by make test. Its watcher thread reads the second head's buffer while the head's
# loop does, over the objects index on S3 (tests/core/test_buffer_objects_restart.py).
pytestmark = [
    pytest.mark.soak,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(
        os.environ.get("YETO_SOAK") != "1",
        reason="about 15 min on 2 cores: YETO_SOAK=1 (make examples) runs it",
    ),
]

BUCKET = "yeto-sky-e2e"
TOTAL_ROUNDS = 60


def _config_toml(store: str, run_dir, model_dir) -> str:
    sky_spot = '{ resources = { infra = "aws/us-east-1", accelerators = "L4:1", use_spot = true } }'
    sky_od = '{ resources = { infra = "aws/us-east-1", accelerators = "L4:1" } }'
    return f"""
name = "skye2e"
run_dir = "{run_dir}"
store = "{store}"
seed = 0

[model]
path = "{model_dir}"
base_options = {{ task = "sort4", target_reward = 0.3 }}

[task]
name = "sort4"

[[samplers]]
name = "sampler"
engine = "hf"
count = 2
group_size = 8
prompts_per_call = 8
min_round_s = 0.3
backlog_cap = 64
price_per_hour = 0.31
provider = "sky"
provider_options = {sky_spot}
engine_options = {{ threads = 1 }}
[samplers.sampling]
max_new_tokens = 6
temperature = 1.0

[trainer]
backend = "torch"
backend_options = {{ lr = 0.0002, threads = 1 }}
groups_per_round = 16
max_policy_age = 3
total_rounds = {TOTAL_ROUNDS}
price_per_hour = 0.8
provider = "sky"
provider_options = {sky_od}

[scheduler]
name = "always-on"
tick_s = 0.1
head_lease_s = 4.0  # the restarted head takes over a few seconds after the first "dies"

[backstops]
budget_usd = 10.0
wall_clock_s = 2400
silence_s = 600
"""


@pytest.fixture
def s3(monkeypatch):
    from yeto_s3.testing import create_bucket, s3_env, start_moto_server

    endpoint, stop = start_moto_server()
    create_bucket(endpoint, BUCKET)
    for k, v in s3_env(endpoint).items():
        monkeypatch.setenv(k, v)
    yield endpoint
    stop()


def trained_rounds(head) -> int:
    return (head.lifecycle.last_report or {}).get("trained_rounds") or 0 if head.lifecycle else 0


def journal_tail(store, n=40) -> str:
    keys = sorted(store.list("head/journal/"))[-n:]
    return "\n".join(store.get(k).decode() for k in keys)


def _wait(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_sky_run_learns_through_a_preemption_and_a_restarted_head(s3, tmp_path):
    from yeto_core.config.load import parse_config
    from yeto_core.config.preflight import run_preflight
    from yeto_core.events.stream import read_events
    from yeto_core.head.lease import lease_lapsed, read_lease
    from yeto_core.head.run import Head
    from yeto_core.plugins import get_plugins

    try:
        import tomllib
    except ImportError:  # pragma: no cover
        import tomli as tomllib

    run_dir, model_dir = tmp_path / "run", tmp_path / "base"
    text = _config_toml(f"s3://{BUCKET}/skye2e", run_dir, model_dir)
    config = parse_config(tomllib.loads(text), source="e2e.toml")
    plugins = get_plugins()
    cloud = LocalCloud(tmp_path / "cloud")
    try:
        report = run_preflight(config, plugins)
        assert report.passed, report.render()

        # -- a first head, left running as a killed head leaves it --------------------
        first_provider = SkyIslands(run_dir, seam=cloud, poll_s=0.2)
        first = Head(config, plugins, provider=first_provider)
        first.prepare_base(print)
        first.start(print)
        _wait(lambda: len(cloud.processes()) == 2, 600, "the first head's two samplers")
        deadline = time.monotonic() + 900
        while trained_rounds(first) < 3:  # the first head trains a few rounds, then "dies"
            assert time.monotonic() < deadline, "the first head trained no 3 rounds in time"
            first.tick()
            first.trainer_loop.tick()
            time.sleep(0.1)
        left_by_first = sorted(cloud.processes())
        assert any("trainer" in c for c in left_by_first), left_by_first
        first_provider.close()  # the head "dies": its clusters keep running
        # ... and its lease lapses (the same process, so only its expiry frees it)
        first.lease.stop_renewing()
        _wait(
            lambda: lease_lapsed(read_lease(first.store), time.time(), first.lease.host),
            60,
            "the first head's lease to lapse",
        )

        # -- a second head: orphans torn down, the run trained to its target ----------
        provider = SkyIslands(run_dir, seam=cloud, poll_s=0.2)
        second = Head(config, plugins, provider=provider)
        preempted: list[str] = []

        def current(island: str):
            for name in cloud.processes():
                if f"-{island}-i" in name and name not in left_by_first:
                    return name
            return None

        def preempt_mid_run() -> None:
            # the second head's sampler-0 (a spot cluster), once it appended 16 groups
            _wait(
                lambda: current("sampler-0") and provider.status(current("sampler-0")) == RUNNING,
                600,
                "sampler-0",
            )
            b0 = second.buffer.backlog().head_position
            _wait(lambda: second.buffer.backlog().head_position >= b0 + 16, 600, "new groups")
            name = current("sampler-0")
            cloud.preempt(name)
            preempted.append(name)

        chaos = threading.Thread(target=preempt_mid_run, daemon=True)
        chaos.start()
        code = second.run(print)
        chaos.join(timeout=10)
        summary = second.write_summary()
        journal = journal_tail(second.store)
        head_kinds = [e.kind for e in read_events(second.store, "head")]
    finally:
        cloud.shutdown()

    print(
        {
            k: summary.get(k)
            for k in (
                "reward_first",
                "reward_last",
                "groups_appended",
                "groups_trained",
                "groups_skipped",
                "trainer_starts",
                "cost_usd",
                "wall_s",
            )
        }
    )
    assert code == 0, f"{summary}\n{journal}"
    for name in left_by_first:  # the first head's clusters were torn down
        assert name in cloud.downs
    assert len(preempted) == 1, f"the preemption did not happen: {preempted}"
    launched = [c for k, c in cloud.calls if k == "launch"]
    for lost in preempted:  # each lost incarnation was replaced by the next one
        island, n = lost[len("skye2e-") :].rsplit("-i", 1)
        assert f"skye2e-{island}-i{int(n) + 1}" in launched, (lost, launched)
        assert provider.record(lost)["state"] in ("preempted", "released")
    assert second.state.sampler_restarts == {}  # a preemption is no sampler exit
    assert {"sky_preempted", "sampler_fenced", "sky_cluster_up"} <= set(head_kinds)
    assert (
        summary["groups_trained"] + sum(summary["groups_skipped"].values())
        == summary["groups_appended"]
    ), summary
    assert summary["reward_last"] - summary["reward_first"] >= 0.1, summary
    assert cloud.clusters() == {}  # every cluster released
    assert summary["cost_usd"] > 0
