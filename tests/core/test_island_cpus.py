"""Pinning islands to CPUs: ``provider_options.cpus`` of the ``local`` provider becomes
``YETO_CPUS``, and the island process pins itself to it before anything else, so its
threads and children inherit it. Real processes, their affinity read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from yeto_core.errors import ConfigError
from yeto_core.providers.env import ENV_CPUS, island_launch, parse_cpus
from yeto_core.providers.local import IslandError, LocalIslands
from yeto_core.stores.dir_store import DirStore

ALLOWED = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "value, cpus",
    [([1, 0], [0, 1]), ("0-2,5", [0, 1, 2, 5]), ("3", [3]), (2, [2]), (" 1 , 1 ", [1])],
)
def test_cpus_are_a_list_or_a_string_of_numbers_and_ranges(value, cpus):
    assert parse_cpus(value) == cpus


@pytest.mark.parametrize("value", ["", [], "a", "3-1", [-1], [True], "1-x", 1.5j])
def test_a_bad_cpus_value_says_what_to_write(value):
    with pytest.raises(ConfigError, match=r"give CPU numbers as a list"):
        parse_cpus(value)


class _Launcher:
    """Records what the provider would start (no process)."""

    def __init__(self):
        self.env = None

    def __call__(self, command, **kw):
        self.env = kw["env"]

        class P:
            pid = os.getpid()

            def poll(self):
                return None

        return P()


def _launch(tmp_path: Path, options):
    store = DirStore(tmp_path / "store", fsync=False)
    return island_launch(
        store, run_id="t", role="trainer", island="trainer", incarnation=1, options=options
    )


def test_the_local_provider_passes_the_cpus_to_the_island(tmp_path):
    launcher = _Launcher()
    islands = LocalIslands(tmp_path / "run", launcher=launcher)
    islands.launch(_launch(tmp_path, {"cpus": [ALLOWED[-1]]}))
    assert launcher.env[ENV_CPUS] == str(ALLOWED[-1])
    launcher = _Launcher()
    LocalIslands(tmp_path / "run2", launcher=launcher).launch(_launch(tmp_path, {}))
    assert ENV_CPUS not in launcher.env  # no option: the island keeps every CPU


def test_cpus_this_machine_does_not_offer_are_refused_before_a_launch(tmp_path):
    launcher = _Launcher()
    islands = LocalIslands(tmp_path / "run", launcher=launcher)
    with pytest.raises(IslandError, match=r"names CPUs \[4096\] this machine does not offer"):
        islands.launch(_launch(tmp_path, {"cpus": [ALLOWED[0], 4096]}))
    with pytest.raises(IslandError, match="provider_options.cpus = 'x'"):
        islands.launch(_launch(tmp_path, {"cpus": "x"}))
    assert launcher.env is None and islands.handles() == []


_PINNED = r"""
import json, os, subprocess, sys, threading
from yeto_core.providers.env import pin_cpus
pinned = pin_cpus(os.environ)
seen = {}
t = threading.Thread(target=lambda: seen.update(thread=sorted(os.sched_getaffinity(0))))
t.start(); t.join()
child = subprocess.run(
    [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
    capture_output=True, text=True, check=True,
)
print(json.dumps({"pinned": pinned, "main": sorted(os.sched_getaffinity(0)),
                  "thread": seen["thread"], "child": json.loads(child.stdout)}))
"""


def test_an_island_process_pins_itself_and_its_threads_and_children_inherit_it():
    cpu = ALLOWED[-1]
    out = subprocess.run(
        [sys.executable, "-c", _PINNED],
        env={**os.environ, ENV_CPUS: str(cpu)},
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout)
    assert got == {"pinned": [cpu], "main": [cpu], "thread": [cpu], "child": [cpu]}
    # without the variable nothing is pinned
    env = {k: v for k, v in os.environ.items() if k != ENV_CPUS}
    out = subprocess.run([sys.executable, "-c", _PINNED], env=env, capture_output=True, text=True)
    assert json.loads(out.stdout)["pinned"] is None


def test_the_island_entry_pins_before_anything_else():
    # no store, no role: an entry that read those first would fail on them instead
    env = {k: v for k, v in os.environ.items() if not k.startswith("YETO_")}
    out = subprocess.run(
        [sys.executable, "-m", "yeto_core.islands.main"],
        env={**env, ENV_CPUS: "4096"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "YETO_CPUS='4096': cannot pin to CPUs [4096]" in out.stderr
