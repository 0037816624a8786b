"""The modal provider through its call seam: one spawn per incarnation, a journal, releases."""

from __future__ import annotations

import json
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from yeto_core.plugins import get_plugins
from yeto_modal import app as modal_app
from yeto_modal.entry import ENV_MOUNTS
from yeto_modal.provider import ModalError, ModalIslands

try:
    from yeto_core.records import IslandLaunch, IslandStatus
except ImportError:  # yeto-core before the typed IslandProvider port
    pytest.skip("needs yeto-core's IslandLaunch", allow_module_level=True)

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def sampler_config():
    s = NS(
        name="sampler",
        count=2,
        engine="hf",
        provider="modal",
        provider_options={"gpu": "L4", "volumes": {"/models": "weights"}},
        island_names=lambda: ["sampler-0", "sampler-1"],
    )
    t = NS(name="trainer", backend="torch", provider="modal", provider_options={"gpu": "A10"})
    return NS(
        name="demo",
        run_dir="runs/demo",
        samplers=[s],
        trainer=t,
        task=NS(name="sort4"),
        store_url=lambda: "s3://b/r",
    )


def launch(island="sampler-0", incarnation=0, role="sampler"):
    env = {
        "YETO_STORE": "s3://b/r",
        "YETO_RUN_ID": "demo",
        "YETO_ROLE": role,
        "YETO_ISLAND": island,
        "YETO_INCARNATION": str(incarnation),
        "YETO_STORE_S3_SECRET_ACCESS_KEY": "s3cr3t",
    }
    return IslandLaunch(
        run_id="demo",
        store_url="s3://b/r",
        role=role,
        island=island,
        incarnation=incarnation,
        env=env,
    )


@pytest.fixture
def provider_for(tmp_path):
    def make(service, **kw):
        p = ModalIslands(tmp_path / "run", seam=service, **kw)
        cfg = sampler_config()
        p.built = modal_app.build(
            cfg,
            modal_app.plan(cfg, get_plugins()),
            credentials={"YETO_STORE_S3_SECRET_ACCESS_KEY": "s3cr3t"},
            config_json={},
        )
        return p

    return make


def test_one_spawn_per_incarnation_with_identity_only_and_a_journal(call_service, provider_for):
    call_service.command = SLEEP
    p = provider_for(call_service)
    h0 = p.launch(launch("sampler-0", 0))
    h1 = p.launch(launch("trainer", 3, role="trainer"))
    assert (h0, h1) == ("sampler-0-i0", "trainer-i3")
    calls = call_service.calls()
    assert len(calls) == 2
    spec = json.loads((call_service.root / f"{p.record(h0)['call_id']}.spec").read_text())
    assert spec["function"] == "yeto-sampler"
    assert "YETO_STORE_S3_SECRET_ACCESS_KEY" not in spec["env"]  # credentials go by Secret
    assert spec["env"]["YETO_INCARNATION"] == "0"
    assert json.loads(spec["env"][ENV_MOUNTS]) == {"/models": "weights"}
    assert json.loads(spec["env"]["YETO_VERSIONS"]) == {  # the island's version lock
        d: "0.1.0" for d in ("yeto-core", "yeto-modal", "yeto-s3", "yeto-torch")
    }
    rec = p.record(h1)
    assert rec["function"] == "yeto-trainer" and rec["call_id"] in calls
    assert p.status(h0) == IslandStatus.RUNNING
    with pytest.raises(ModalError, match="already in the journal"):
        p.launch(launch("sampler-0", 0))
    events = [e.kind for e in p.events(h0)]
    assert events == ["modal_spawned"]


def test_each_spawn_carries_its_own_submission_time(call_service, provider_for):
    """Issue 52 item 2 (the seed's Modal T_s bug): the deployed function's environment is
    built once; each spawn stamps YETO_START_SUBMITTED_UNIX itself."""
    from yeto_core.providers.env import ENV_START_SUBMITTED

    call_service.command = SLEEP
    p = provider_for(call_service)
    stamps = []
    for inc in (0, 1):
        before = time.time()
        h = p.launch(launch("trainer", inc, role="trainer"))
        after = time.time()
        spec = json.loads((call_service.root / f"{p.record(h)['call_id']}.spec").read_text())
        stamps.append(float(spec["env"][ENV_START_SUBMITTED]))
        assert before <= stamps[-1] <= after
    assert stamps[1] >= stamps[0]


def test_release_cancels_terminating_containers_and_confirms(call_service, provider_for):
    call_service.command = SLEEP
    p = provider_for(call_service)
    h = p.launch(launch())
    call_id = p.record(h)["call_id"]
    assert p.release(h) is True
    assert call_service.cancelled == [(call_id, True)]
    assert call_service.poll(call_id)[0] == "terminated"
    assert p.status(h) == IslandStatus.GONE and p.record(h) is None
    kinds = [e.kind for e in p.events(h)]
    assert kinds[-1] == "modal_released" and "modal_call_ended" in kinds


def test_release_that_cannot_be_confirmed_returns_false(call_service, provider_for):
    call_service.command = SLEEP
    t = [0.0]
    p = provider_for(
        call_service,
        release_timeout_s=5,
        clock=lambda: t[0],
        sleep=lambda s: t.__setitem__(0, t[0] + s),
    )
    h = p.launch(launch())
    call_service.ignore_cancel = True
    assert p.release(h) is False
    assert p.record(h) is not None  # kept: the next head tries again
    assert "modal_release_unverified" in [e.kind for e in p.events(h)]


@pytest.mark.parametrize(
    "fault,state",
    [("preempt", "terminated"), ("time_out", "timeout"), ("lose", "missing")],
)
def test_lost_calls_are_exited_incarnations(call_service, provider_for, fault, state):
    call_service.command = SLEEP
    p = provider_for(call_service)
    h = p.launch(launch())
    getattr(call_service, fault)(p.record(h)["call_id"])
    assert p.status(h) == IslandStatus.EXITED
    assert p.returncode(h) == 1
    ended = [e for e in p.events(h) if e.kind == "modal_call_ended"]
    assert [e.data["state"] for e in ended] == [state]
    assert p.release(h) is True and p.status(h) == IslandStatus.GONE


def test_finished_and_failed_bodies(call_service, provider_for, wait_until):
    p = provider_for(call_service)
    call_service.command = [sys.executable, "-c", "pass"]
    ok = p.launch(launch("sampler-0", 0))
    call_service.command = [sys.executable, "-c", "raise SystemExit(3)"]
    bad = p.launch(launch("sampler-1", 0))
    for h, code in ((ok, 0), (bad, 1)):
        wait_until(lambda h=h: p.status(h) == IslandStatus.EXITED, what=f"{h} to end")
        assert p.returncode(h) == code


def run_config(tmp_path):
    from yeto_core.config.load import parse_config

    modal = {"provider": "modal", "provider_options": {"gpu": "L4"}, "price_per_hour": 0.8}
    return parse_config(
        {
            "name": "demo",
            "run_dir": str(tmp_path / "run"),
            "store": "s3://b/r",
            "model": {"path": str(tmp_path / "model")},
            "task": {"name": "sort4"},
            "samplers": [{"name": "sampler", "engine": "hf", "count": 2, **modal}],
            "trainer": {"backend": "torch", **modal},
        }
    )


@pytest.mark.slow
def test_the_first_launch_builds_the_runs_wheels_before_it_deploys(
    call_service, tmp_path, monkeypatch
):
    monkeypatch.setenv("YETO_WHEEL_CACHE", str(tmp_path / "cache"))
    call_service.command = SLEEP
    deployed = []
    real_deploy = call_service.deploy

    def deploy(built):
        # what the images copy exists when the app is deployed
        copied = [a[0] for p in built.plans.values() for m, a in p.image if m == "add_local_file"]
        deployed.append({path: Path(path).is_file() for path in copied})
        real_deploy(built)

    call_service.deploy = deploy
    cfg = run_config(tmp_path)
    p = ModalIslands(tmp_path / "run", seam=call_service, load_config=lambda url: cfg)
    p.launch(launch("sampler-0", 0))
    p.launch(launch("sampler-1", 0))
    assert len(deployed) == 1 and deployed[0] and all(deployed[0].values()), deployed
    wheels = sorted(x.name for x in (tmp_path / "run" / "wheels").iterdir())
    assert wheels == [
        f"{d}-0.1.0-py3-none-any.whl" for d in ("yeto_core", "yeto_modal", "yeto_s3", "yeto_torch")
    ]
    with zipfile.ZipFile(tmp_path / "run" / "wheels" / wheels[0]) as z:
        assert "yeto_core/providers/dists.py" in z.namelist()  # this checkout's code


def test_refused_spawn_journals_nothing(call_service, provider_for):
    call_service.command = SLEEP
    p = provider_for(call_service)
    call_service.refuse_next = 1
    with pytest.raises(ModalError, match="refused to start island sampler-0-i0"):
        p.launch(launch())
    assert p.record("sampler-0-i0") is None and call_service.calls() == []
    assert [e.kind for e in p.events("sampler-0-i0")] == ["modal_spawn_refused"]
    assert p.launch(launch()) == "sampler-0-i0"  # the next try starts it


def test_unknown_island(call_service, provider_for):
    p = provider_for(call_service)
    with pytest.raises(ModalError, match="in no Modal function"):
        p.launch(launch("other-0"))


def test_a_restarted_head_finds_cancels_and_verifies_the_previous_calls(
    call_service, provider_for, tmp_path
):
    call_service.command = SLEEP
    first = provider_for(call_service)
    handles = [first.launch(launch(f"sampler-{i}", 0)) for i in range(2)]
    ids = [first.record(h)["call_id"] for h in handles]
    del first  # the head died; its calls run on
    assert sorted(call_service.running()) == sorted(ids)
    service2 = type(call_service)(call_service.root)  # the same service, seen by a new head
    second = provider_for(service2)
    assert second.orphans() == sorted(handles)
    assert all(second.release(h) for h in second.orphans())
    assert sorted(service2.cancelled) == sorted((i, True) for i in ids)
    assert call_service.running() == [] and second.orphans() == []


def test_a_poll_that_cannot_reach_modal_is_not_a_lost_island(call_service, provider_for):
    call_service.command = SLEEP
    p = provider_for(call_service)
    h = p.launch(launch())
    real_poll = call_service.poll

    def unreachable(call_id):
        raise ModalError("cannot ask Modal about call: ConnectionError")

    call_service.poll = unreachable
    assert p.status(h) == IslandStatus.RUNNING
    assert "modal_poll_failed" in [e.kind for e in p.events(h)]
    call_service.poll = real_poll
    assert p.release(h) is True
