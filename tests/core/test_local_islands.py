"""The ``local`` island provider with real processes: env, release (SIGTERM, then SIGKILL), orphans."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from yeto_core.plugins import Plugins
from yeto_core.providers.env import island_launch
from yeto_core.providers.local import IslandError, LocalIslands, _group_alive, _proc_stat
from yeto_core.stores.dir_store import DirStore


def _wait_for(path: Path, deadline_s: float = 20.0) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written within {deadline_s}s")


# An island that writes its env, starts a grandchild in its group, then sleeps.
_ISLAND = r"""
import json, os, signal, subprocess, sys, time
out = sys.argv[1]
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
env = {k: v for k, v in os.environ.items() if k.startswith("YETO_")}
info = {"env": env, "pid": os.getpid(), "pgid": os.getpgid(0), "child": child.pid, "cwd": os.getcwd()}
with open(out + ".tmp", "w") as f:
    f.write(json.dumps(info) + "\n")
os.replace(out + ".tmp", out)
time.sleep(600)
"""


def _provider(tmp_path: Path, mode: str, **kw) -> LocalIslands:
    return LocalIslands(
        tmp_path / "run",
        command=[sys.executable, "-c", _ISLAND, str(tmp_path / f"out-{mode}.json"), mode],
        **kw,
    )


def _launch(island: str, incarnation: int, *, role: str = "sampler", cut=None):
    global _STORE_ROOT
    store = DirStore(_STORE_ROOT, fsync=False)
    return island_launch(
        store, run_id="test", role=role, island=island, incarnation=incarnation, cut=cut
    )


_STORE_ROOT = Path(".")


@pytest.fixture(autouse=True)
def _store_root(tmp_path: Path):
    global _STORE_ROOT
    _STORE_ROOT = tmp_path / "store"
    yield


def test_local_is_registered_as_a_builtin() -> None:
    assert Plugins(entry_points=False).island_provider("local") is LocalIslands


@pytest.mark.parametrize("mode", ["polite", "ignore-term"])
def test_launch_carries_env_and_release_kills_the_whole_group(tmp_path: Path, mode: str) -> None:
    islands = _provider(tmp_path, mode, term_timeout_s=0.5)
    handle = islands.launch(_launch("sampler-0", 3, cut="cut-7"))
    info = json.loads(_wait_for(tmp_path / f"out-{mode}.json"))
    assert info["env"]["YETO_ISLAND"] == "sampler-0"
    assert info["env"]["YETO_INCARNATION"] == "3"
    assert info["env"]["YETO_TRAINER_CUT"] == "cut-7"
    assert info["env"]["YETO_STORE"] == str(tmp_path / "store")
    assert info["env"]["YETO_RUN_ID"] == "test"
    assert info["env"]["YETO_ROLE"] == "sampler"
    # its working directory is its own, under the provider's state dir
    assert info["cwd"] == str(tmp_path / "run" / "work" / handle)
    assert info["pgid"] == info["pid"] != os.getpgid(0)  # its own process group
    assert islands.status(handle) == "running"
    assert islands.record(handle)["pid"] == info["pid"]

    assert islands.release(handle) is True
    assert not _group_alive(info["pgid"])
    child = _proc_stat(info["child"])  # the grandchild ignored SIGTERM; SIGKILL got it
    assert child is None or child[0] == "Z"
    assert islands.status(handle) == "gone"
    assert islands.handles() == []
    assert islands.release(handle) is True  # idempotent


def test_a_restarted_head_finds_and_releases_orphans(tmp_path: Path) -> None:
    first = _provider(tmp_path, "ignore-term", term_timeout_s=0.3)
    handle = first.launch(_launch("trainer", 1, role="trainer"))
    info = json.loads(_wait_for(tmp_path / "out-ignore-term.json"))
    assert first.orphans() == []  # its own island is no orphan

    second = _provider(tmp_path, "ignore-term", term_timeout_s=0.3)  # the head restarted
    assert second.orphans() == [handle]
    assert second.status(handle) == "running"
    with pytest.raises(IslandError, match="already recorded"):
        second.launch(_launch("trainer", 1, role="trainer"))
    assert second.release(handle) is True
    assert not _group_alive(info["pgid"])
    assert second.orphans() == []
    first._reap(handle)  # the original parent reaps its zombie


def test_an_exited_island_reports_exited_and_its_log(tmp_path: Path) -> None:
    islands = LocalIslands(
        tmp_path / "run", command=[sys.executable, "-c", "print('hello'); raise SystemExit(3)"]
    )
    handle = islands.launch(_launch("sampler-1", 0))
    end = time.monotonic() + 20
    while islands.status(handle) != "exited":
        assert time.monotonic() < end, "the island did not exit"
        time.sleep(0.02)
    assert islands.returncode(handle) == 3
    assert [e.data["line"] for e in islands.events(handle)] == ["hello"]
    assert list(islands.events(handle)) == []
    assert islands.release(handle) is True


def test_release_reports_false_when_the_group_survives(tmp_path: Path, monkeypatch) -> None:
    islands = _provider(tmp_path, "polite", term_timeout_s=0.1, kill_timeout_s=0.1)
    handle = islands.launch(_launch("sampler-0", 0))
    _wait_for(tmp_path / "out-polite.json")
    sent = []
    monkeypatch.setattr(islands, "_signal", lambda pgid, sig: sent.append(sig))
    assert islands.release(handle) is False  # signals swallowed: not verified
    assert sent == [signal.SIGTERM, signal.SIGKILL]
    assert islands.handles() == [handle]  # still recorded, so it can be released later
    monkeypatch.undo()
    assert islands.release(handle) is True


def _own_session_sleeper(env_handle: str | None = None):
    """An unrelated program of the same user: a process group of its own."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("YETO_")}
    if env_handle is not None:
        env["YETO_HANDLE"] = env_handle
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True, env=env
    )


def _forge_record(islands: LocalIslands, handle: str, pid: int, start_time: str) -> None:
    record = {
        "handle": handle,
        "island": handle.rsplit("-i", 1)[0],
        "incarnation": int(handle.rsplit("-i", 1)[1]),
        "pid": pid,
        "pgid": pid,
        "start_time": start_time,
        "command": ["python", "-m", "yeto_core.islands.main"],
        "launched_at": 0.0,
    }
    islands._record_path(handle).write_text(json.dumps(record))


def test_orphan_release_spares_a_process_group_that_is_no_longer_the_islands(tmp_path):
    """Regression: a recorded pgid reused by another program (PID reuse, a reboot) was killed.

    The record says sampler-0-i1 is pid P; P is now an unrelated program (another
    start time, no YETO_HANDLE). A restarted head's release must not signal it.
    """
    stranger = _own_session_sleeper()
    try:
        previous = LocalIslands(tmp_path / "run")
        _forge_record(previous, "sampler-0-i1", stranger.pid, start_time="1")
        seen = []
        head = LocalIslands(tmp_path / "run", on_event=seen.append, term_timeout_s=0.5)
        assert head.orphans() == ["sampler-0-i1"]
        assert head.release("sampler-0-i1") is True
        assert stranger.poll() is None, "an unrelated process was killed"
        assert head.record("sampler-0-i1") is None
        assert [e.kind for e in seen] == ["orphan_spared"]
        assert seen[0].data["spared"][0]["pid"] == stranger.pid
        assert "YETO_HANDLE" in seen[0].data["spared"][0]["why"]
    finally:
        stranger.kill()
        stranger.wait()


def test_orphan_release_still_kills_an_island_that_is_really_the_previous_heads(tmp_path):
    """The identity check keeps real orphans killable: the leader or the handle marker match."""
    from yeto_core.providers.local import _start_time

    # Leader matches by start time (YETO_HANDLE absent): ours.
    leader = _own_session_sleeper()
    # Members carrying the island's marker (the leader exited): ours.
    marked = _own_session_sleeper(env_handle="trainer-i4")
    try:
        previous = LocalIslands(tmp_path / "run")
        _forge_record(previous, "sampler-1-i2", leader.pid, _start_time(leader.pid))
        _forge_record(previous, "trainer-i4", marked.pid, start_time="1")
        head = LocalIslands(tmp_path / "run", term_timeout_s=2.0)
        assert head.release("sampler-1-i2") is True
        assert head.release("trainer-i4") is True
        assert leader.wait(timeout=10) is not None and marked.wait(timeout=10) is not None
        assert head.spared == []
    finally:
        for p in (leader, marked):
            if p.poll() is None:
                p.kill()
                p.wait()
