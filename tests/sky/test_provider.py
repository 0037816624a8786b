"""The ``sky`` provider through a double of its SkyPilot seam (clusters are local processes)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from sky_double import LocalCloud

from yeto_core.records import IslandLaunch
from yeto_core.testing.waiting import wait_for
from yeto_sky.provider import EXITED, GONE, LOST, RUNNING, STARTING, SkyIslands

PROBE_DIR = Path(__file__).parent / "probe"


def make_launch(island="sampler-0", incarnation=0, role="sampler", spot=True, **env):
    base = {
        "YETO_STORE": "s3://bucket/demo",
        "YETO_RUN_ID": "demo",
        "YETO_ROLE": role,
        "YETO_ISLAND": island,
        "YETO_INCARNATION": str(incarnation),
        "PYTHONPATH": str(PROBE_DIR),
        **env,
    }
    return IslandLaunch(
        run_id="demo",
        store_url="s3://bucket/demo",
        role=role,
        island=island,
        incarnation=incarnation,
        env=base,
        options={"resources": {"infra": "aws/us-east-1", "use_spot": spot}},
        entry_module="yeto_sky_probe",
    )


@pytest.fixture
def cloud(tmp_path):
    c = LocalCloud(tmp_path / "cloud")
    yield c
    c.shutdown()


@pytest.fixture
def provider(tmp_path, cloud):
    p = SkyIslands(tmp_path / "run", seam=cloud, poll_s=0.05)
    yield p
    p.close()


def _kinds(provider, handle):
    return [e for e in provider.events(handle)]


def test_a_cluster_per_incarnation_runs_the_island_with_only_store_and_ids(provider, cloud):
    handle = provider.launch(make_launch())
    assert handle == "demo-sampler-0-i0"
    assert provider.status(handle) in (STARTING, RUNNING)
    wait_for(lambda: provider.status(handle) == RUNNING, what="running")
    rec = provider.record(handle)
    assert rec["request_id"].startswith("req-") and rec["job_id"] == 1 and rec["state"] == "up"
    assert cloud.requests[rec["request_id"]][2] == 30  # autodown after 30 idle minutes
    log = Path(provider.log_hint(handle))
    wait_for(lambda: log.is_file() and "env " in log.read_text(), what="the island's log")
    text = log.read_text()
    assert "probe sampler-0 i0" in text and "cwd-entries 0" in text
    assert (
        "env YETO_INCARNATION,YETO_ISLAND,YETO_ROLE,YETO_RUN_ID,YETO_START_SUBMITTED_UNIX,"
        "YETO_STORE" in text
    )
    events = list(provider.events(handle))
    kinds = [e.kind for e in events]
    # no run config in this bare run dir: yeto is not shipped (tests/sky/test_ship.py ships it)
    assert kinds[:4] == ["sky_no_run_config", "sky_task", "sky_launch_requested", "sky_cluster_up"]
    logs = [e for e in events if e.kind == "log"]
    assert logs and logs[0].data["lines"][0].startswith("probe")
    assert len(logs) < sum(len(e.data["lines"]) for e in logs)  # lines come batched
    assert provider.release(handle) is True
    assert handle not in cloud.clusters() and provider.status(handle) == GONE
    assert provider.record(handle)["state"] == "released"


def test_each_launch_carries_its_submission_time_as_a_plain_variable(provider, cloud):
    """Issue 52 item 2: the island's start (provisioning included) is timed from it."""
    before = time.time()
    handle = provider.launch(make_launch())
    after = time.time()
    wait_for(lambda: provider.record(handle)["request_id"], what="the launch request")
    config = cloud.requests[provider.record(handle)["request_id"]][1]
    assert before <= float(config["envs"]["YETO_START_SUBMITTED_UNIX"]) <= after
    assert "YETO_START_SUBMITTED_UNIX" not in config.get("secrets", {})
    assert provider.release(handle) is True


def test_spot_preemption_is_a_lost_incarnation_that_is_replaced(provider, cloud):
    handle = provider.launch(make_launch())
    wait_for(lambda: provider.status(handle) == RUNNING, what="running")
    cloud.preempt(handle)
    wait_for(lambda: provider.status(handle) == LOST, what="the preemption to be seen")
    assert provider.exit_reason(handle) == "preempted" and provider.returncode(handle) is None
    assert "sky_preempted" in [e.kind for e in provider.events(handle)]
    assert provider.record(handle)["state"] == "preempted"
    assert provider.release(handle) is True
    replacement = provider.launch(make_launch(incarnation=1))
    assert replacement == "demo-sampler-0-i1"
    wait_for(lambda: provider.status(replacement) == RUNNING, what="the replacement")


def test_a_failed_launch_is_reported_and_its_leftover_cluster_torn_down(provider, cloud):
    cloud.fail_next_launch("ResourcesUnavailableError: no L4 spot in us-east-1", leave_cluster=True)
    handle = provider.launch(make_launch())
    wait_for(lambda: provider.status(handle) == EXITED, what="the failed launch")
    assert provider.exit_reason(handle) == "launch_failed"
    failed = [e for e in provider.events(handle) if e.kind == "sky_launch_failed"]
    assert "no L4 spot in us-east-1" in failed[0].data["error"]
    assert provider.record(handle)["state"] == "launch_failed"
    assert handle in cloud.clusters()  # SkyPilot leaves a cluster whose setup failed
    assert provider.release(handle) is True
    assert handle not in cloud.clusters() and cloud.downs == [handle]


def test_a_finished_job_is_exited_with_its_code(provider):
    handle = provider.launch(make_launch(PROBE_EXIT="3"))
    wait_for(lambda: provider.status(handle) == EXITED, what="the job to end")
    assert provider.returncode(handle) == 1 and provider.exit_reason(handle) == "failed"
    assert provider.release(handle)


def test_release_is_verified_with_status(provider, cloud, monkeypatch):
    handle = provider.launch(make_launch())
    wait_for(lambda: provider.status(handle) == RUNNING, what="running")
    monkeypatch.setattr(cloud, "down", lambda name: None)  # a teardown that did nothing
    assert provider.release(handle) is False
    assert provider.status(handle) == RUNNING
    monkeypatch.undo()
    assert provider.release(handle) is True


def test_a_restarted_head_releases_the_clusters_of_this_run_it_does_not_hold(tmp_path, cloud):
    first = SkyIslands(tmp_path / "run", seam=cloud, poll_s=0.05)
    a = first.launch(make_launch("sampler-0"))
    b = first.launch(make_launch("trainer", role="trainer", spot=False))
    wait_for(lambda: first.status(a) == RUNNING and first.status(b) == RUNNING, what="both up")
    first.close()  # the head dies; its clusters keep running
    (tmp_path / "run" / "config.json").write_text(
        json.dumps({"name": "demo", "samplers": [{"name": "sampler", "count": 2}]})
    )
    cloud.leave_orphan("demo-sampler-1-i0")  # of this run, in no journal
    cloud.leave_orphan("other-sampler-0-i0")  # another run's
    cloud.leave_orphan("demo-x-sampler-0-i0")  # run "demo-x", not an island of "demo"
    second = SkyIslands(tmp_path / "run", seam=cloud, poll_s=0.05)
    try:
        orphans = second.orphans()
        assert orphans == ["demo-sampler-0-i0", "demo-sampler-1-i0", "demo-trainer-i0"]
        assert second.status("demo-sampler-0-i0") == RUNNING  # a previous head's, still up
        for h in orphans:
            assert second.release(h) is True
        assert sorted(cloud.clusters()) == ["demo-x-sampler-0-i0", "other-sampler-0-i0"]
        assert second.orphans() == []
        assert second.status("demo-sampler-0-i0") == GONE
    finally:
        second.close()


def test_the_real_seam_fails_clearly_without_an_api_server(tmp_path):
    from yeto_sky.seam import SkyPilotSeam

    provider = SkyIslands(tmp_path / "run", seam=SkyPilotSeam(), poll_s=0.05)
    handle = provider.launch(make_launch())
    wait_for(lambda: provider.status(handle) == EXITED, what="the refused launch")
    (failed,) = [e for e in provider.events(handle) if e.kind == "sky_launch_failed"]
    assert "SKYPILOT_DISABLE_LOCAL_API_SERVER=1" in failed.data["error"]
    provider.close()


def test_the_real_seam_maps_the_sdk_calls(monkeypatch):
    """SkyPilotSeam against the real ``sky`` module with its network calls stubbed."""
    import sky

    from yeto_sky.seam import SkyLaunchError, SkyPilotSeam

    calls = []

    def launch(task, **kw):
        calls.append(("launch", task, kw))
        return "rid-1"

    results = {"rid-1": (7, object()), "rid-s": None, "rid-j": None, "rid-d": None}

    def get(rid):
        if rid == "rid-bad":
            raise sky.exceptions.ResourcesUnavailableError("no L4 left in us-east-1")
        return results[rid]

    monkeypatch.setattr(sky, "launch", launch)
    monkeypatch.setattr(sky, "get", get)
    seam = SkyPilotSeam()
    config = {"name": "c", "resources": {"infra": "aws", "use_spot": True}, "run": "true"}
    assert seam.launch(config, "demo-sampler-0-i0", 30) == "rid-1"
    (_, task, kw) = calls[0]
    assert isinstance(task, sky.Task) and list(task.resources)[0].use_spot
    assert kw == {"cluster_name": "demo-sampler-0-i0", "idle_minutes_to_autostop": 30, "down": True}
    assert seam.wait_launch("rid-1") == 7
    with pytest.raises(SkyLaunchError, match="ResourcesUnavailableError: no L4 left"):
        seam.wait_launch("rid-bad")

    def status(names, refresh):
        calls.append(("status", names, refresh))
        return "rid-s"

    results["rid-s"] = [
        SimpleNamespace(name="a", status=sky.ClusterStatus.UP),
        {"name": "b", "status": sky.ClusterStatus.STOPPED},
    ]
    monkeypatch.setattr(sky, "status", status)
    assert seam.clusters(["a", "b"]) == {"a": "UP", "b": "STOPPED"}
    assert calls[-1] == ("status", ["a", "b"], sky.StatusRefreshMode.AUTO)

    results["rid-j"] = {7: sky.JobStatus.FAILED_SETUP}
    monkeypatch.setattr(sky, "job_status", lambda cluster, ids: "rid-j")
    assert seam.job_status("a", 7) == "FAILED_SETUP"

    def down(cluster):
        calls.append(("down", cluster))
        if cluster == "gone":
            raise sky.exceptions.ClusterDoesNotExist("gone")
        return "rid-d"

    monkeypatch.setattr(sky, "down", down)
    seam.down("a")
    seam.down("gone")  # a missing cluster is no error
    assert [c for c in calls if c[0] == "down"] == [("down", "a"), ("down", "gone")]

    chunks = iter(["line 1\nli", "ne 2\n", "tail", None, "never"])
    monkeypatch.setattr(sky, "tail_logs", lambda *a, **kw: chunks)
    assert list(seam.logs("a", 7)) == ["line 1", "line 2", "tail"]


def test_our_own_teardown_is_not_taken_for_a_preemption(provider, cloud, monkeypatch):
    handle = provider.launch(make_launch())
    wait_for(lambda: provider.status(handle) == RUNNING, what="running")
    real_down = cloud.down

    def down_with_a_status_round_in_between(name):
        real_down(name)
        provider.poll()  # the monitor looks while the teardown is under way

    monkeypatch.setattr(cloud, "down", down_with_a_status_round_in_between)
    assert provider.release(handle) is True
    kinds = [e.kind for e in provider.events(handle)]
    assert "sky_released" in kinds and "sky_preempted" not in kinds
    assert "lost_at" not in provider.record(handle)
