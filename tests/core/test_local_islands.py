"""The ``local`` island provider with real processes: env, release (SIGTERM, then SIGKILL), orphans."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from yeto_core.island_env import island_launch
from yeto_core.local_islands import IslandError, LocalIslands, _group_alive, _proc_stat
from yeto_core.plugins import Plugins
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
