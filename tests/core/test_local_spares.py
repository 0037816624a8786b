"""Warm spares of the ``local`` provider (``yeto_core.providers.spare``) with real processes:
a prepared island's launch is handed to a process that imported its module before, which
then runs as a cold launch would (env, working directory, log, exit code, signals); a spare
never serves a launch whose environment differs but for the launch's own variables; spares
go away with their provider."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import attrs
import pytest

from yeto_core.providers.env import island_launch, relaunch
from yeto_core.providers.local import LocalIslands, _group_alive
from yeto_core.providers.spare import PER_LAUNCH, serves
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.waiting import wait_for

# the island module: at import it notes its pid and time; run, it writes what it saw and
# exits 3 (or waits to be signalled)
_PROBE = r"""
import json, os, sys, time
IMPORTED = {"pid": os.getpid(), "time": time.time()}
with open(os.environ["PROBE_OUT"] + ".imported", "a") as f:
    f.write(json.dumps(IMPORTED) + "\n")

if __name__ == "__main__":
    env = {k: v for k, v in os.environ.items() if k.startswith("YETO_")}
    info = {"env": env, "pid": os.getpid(), "cwd": os.getcwd(), "imported": IMPORTED,
            "argv": sys.argv, "ran": time.time()}
    print("probe ran", flush=True)
    out = os.environ["PROBE_OUT"] + f".{env['YETO_INCARNATION']}"
    with open(out + ".tmp", "w") as f:
        f.write(json.dumps(info) + "\n")
    os.replace(out + ".tmp", out)
    if os.environ.get("PROBE_WAIT"):
        time.sleep(600)
    sys.exit(3)
"""


def _read(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def world(tmp_path, monkeypatch):
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "spare_probe.py").write_text(_PROBE)
    monkeypatch.setenv(
        "PYTHONPATH", str(tmp_path / "mods") + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    monkeypatch.setenv("PROBE_OUT", str(tmp_path / "probe"))
    store = DirStore(tmp_path / "store", fsync=False)
    launch = island_launch(store, run_id="test", role="trainer", island="trainer", incarnation=0)
    launch = attrs.evolve(launch, entry_module="spare_probe")
    return LocalIslands(tmp_path / "run"), launch, tmp_path


def _spare_pid(provider: LocalIslands, island: str = "trainer") -> int:
    return provider._spares[island].proc.pid


def test_a_prepared_launch_runs_in_the_spare_that_imported_it_before(world):
    provider, launch, tmp = world
    provider.prepare(launch)
    spare = _spare_pid(provider)
    imported = wait_for(lambda: (tmp / "probe.imported").exists(), what="the spare's import")
    assert imported
    handed = time.time()
    handle = provider.launch(relaunch(launch, 1, "cut-7"))
    info = wait_for(lambda: _read(tmp / "probe.1"), what="the island's report")
    assert info["pid"] == spare == provider.record(handle)["pid"]  # the spare became the island
    first = json.loads((tmp / "probe.imported").read_text().splitlines()[0])
    assert first["pid"] == spare and first["time"] < handed  # imported before the launch
    assert info["env"]["YETO_INCARNATION"] == "1" and info["env"]["YETO_TRAINER_CUT"] == "cut-7"
    assert info["env"]["YETO_HANDLE"] == handle
    assert float(info["env"]["YETO_START_SUBMITTED_UNIX"]) >= handed  # stamped at the hand-over
    assert Path(info["cwd"]) == tmp / "run" / "work" / handle
    wait_for(lambda: provider.returncode(handle) is not None, what="the exit")
    assert provider.returncode(handle) == 3
    assert "probe ran" in provider.log_path(handle).read_text()
    # released: the next start's spare is there, another process
    assert provider.release(handle)
    assert _spare_pid(provider) != spare and provider._spares["trainer"].alive()
    provider.unprepare()
    assert provider._spares == {}


def test_an_island_from_a_spare_is_released_by_signals_like_a_cold_one(world, monkeypatch):
    provider, launch, tmp = world
    monkeypatch.setenv("PROBE_WAIT", "1")
    provider.prepare(launch)
    spare = _spare_pid(provider)
    handle = provider.launch(relaunch(launch, 1))
    wait_for(lambda: _read(tmp / "probe.1"), what="the island's report")
    assert provider.status(handle).value == "running"
    provider.unprepare()  # no spare started after the release below
    assert provider.release(handle)
    assert not _group_alive(spare)


def test_a_spare_never_serves_a_launch_whose_environment_differs(world, monkeypatch):
    provider, launch, tmp = world
    provider.prepare(launch)
    spare = provider._spares["trainer"]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # read by libraries at import: a cold start
    handle = provider.launch(relaunch(launch, 1))
    info = wait_for(lambda: _read(tmp / "probe.1"), what="the island's report")
    assert info["pid"] == provider.record(handle)["pid"] != spare.proc.pid
    assert spare.proc.poll() is not None  # killed
    wait_for(lambda: provider.returncode(handle) is not None, what="the exit")


def test_serves_ignores_only_the_launch_s_own_variables():
    base = {"PATH": "/bin", "YETO_STORE": "s3://b/r", "YETO_INCARNATION": "0"}
    launch = dict(base, YETO_INCARNATION="4", YETO_HANDLE="trainer-i4", YETO_TRAINER_CUT="c")
    assert serves(base, launch)
    assert {"YETO_INCARNATION", "YETO_TRAINER_CUT", "YETO_HANDLE"} <= PER_LAUNCH
    assert not serves(base, dict(launch, YETO_STORE="s3://b/other"))
    assert not serves(base, dict(launch, PYTHONHASHSEED="1"))


def test_spares_go_away_with_their_provider_or_its_head(world):
    _, launch, tmp = world
    own = LocalIslands(tmp / "run1")
    own.prepare(launch)
    spare = own._spares["trainer"].proc
    del own
    gc.collect()
    assert spare.wait(timeout=10) is not None  # killed when the provider was collected

    again = LocalIslands(tmp / "run2")
    again.prepare(launch)
    proc = again._spares["trainer"].proc
    proc.stdin.close()  # the head died: the spare reads the end of its input and exits
    assert proc.wait(timeout=30) == 0
    again.unprepare()


def test_a_provider_with_its_own_command_or_spare_false_keeps_no_spare(world):
    provider, launch, tmp = world
    provider.prepare(attrs.evolve(launch, options={"spare": False}))
    assert provider._spares == {}
    custom = LocalIslands(tmp / "run3", command=[sys.executable, "-c", "pass"])
    custom.prepare(launch)
    assert custom._spares == {}
