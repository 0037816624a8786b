"""Real appender processes: SIGKILL at random points, and concurrent appenders.

The child appends groups ``g<i>`` from ``i = start`` on; after each ``append``
returns it writes ``<id> <position>`` to a side file and fsyncs it. A killed
child's successor restarts at the first id not in the side file, so the id
whose append was cut off (or returned just before the kill) is appended again
and must be deduplicated. ``YETO_BUFFER_CRASH_KILLS`` sets the number of kills
(default 30).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import RoundSpec
from yeto_core.stores.dir_store import DirStore

CHILD = r"""
import os, sys, time
import numpy as np
from yeto_core.records import Sample, SampleGroup
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.stores.dir_store import DirStore

root, layout, side, start, count, host = sys.argv[1:7]
buf = FileSampleBuffer(DirStore(root, fsync=False), layout=layout, host=host)
fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
if len(sys.argv) > 7:  # a start barrier: wait until the parent creates the file
    open(sys.argv[7] + ".ready-" + host, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[7]) and time.monotonic() < deadline:
        time.sleep(0.001)
for i in range(int(start), int(start) + int(count)):
    t = np.arange(64, dtype=np.int32) + i
    s = Sample(tokens=t, prompt_len=8, logprobs=np.zeros(56, np.float32),
               loss_mask=np.ones(56, np.uint8), reward=1.0, weight_version=i)
    gid = f"{host}-g{i}"
    pos = buf.append(SampleGroup(gid, "p", host, 0, (s, s)))
    os.write(fd, f"{gid} {pos}\n".encode())
    os.fsync(fd)
"""


def _launch(script: Path, *args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script), *map(str, args)])


def _confirmed(side: Path) -> list[tuple[str, int]]:
    if not side.exists():
        return []
    out = []
    for line in side.read_text().splitlines():
        gid, pos = line.split()
        out.append((gid, int(pos)))
    return out


def _wait_for_lines(side: Path, n: int, proc: subprocess.Popen, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while len(_confirmed(side)) < n:
        if proc.poll() is not None:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"child made no progress within {deadline_s}s")
        time.sleep(0.002)


def _check(root: Path, layout: str, confirmed: list[tuple[str, int]]) -> list:
    store = DirStore(root, fsync=False)
    buf = FileSampleBuffer(store, layout=layout)  # reopen as a writer: repairs a torn tail
    entries = buf.entries()
    assert [e.position for e in entries] == list(range(len(entries))), "positions not dense"
    ids = [e.group_id for e in entries]
    assert len(ids) == len(set(ids)), "a group appears twice"
    for gid, pos in confirmed:
        assert entries[pos].group_id == gid, (gid, pos)
    for e in entries:
        assert buf.load(e).group_id == e.group_id
    r = buf.select(RoundSpec(max_groups=len(entries), current_version=10**6, max_policy_age=10**6))
    assert r.positions == tuple(range(len(entries)))
    return entries


@pytest.mark.parametrize("layout", ["jsonl", "objects"])
def test_sigkilled_appender_loses_nothing_and_duplicates_nothing(tmp_path, layout):
    kills = int(os.environ.get("YETO_BUFFER_CRASH_KILLS", "30"))
    rng = random.Random(1234)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root, side = tmp_path / "store", tmp_path / "side.txt"
    killed_mid_run = 0
    for _ in range(kills):
        start = len(_confirmed(side))
        proc = _launch(script, root, layout, side, start, 10_000, "h")
        _wait_for_lines(side, start + 1, proc, deadline_s=60)
        time.sleep(rng.uniform(0, 0.02))  # the random kill point
        proc.send_signal(signal.SIGKILL)
        rc = proc.wait(timeout=30)
        killed_mid_run += rc == -signal.SIGKILL
    start = len(_confirmed(side))
    final = _launch(script, root, layout, side, start, 5, "h")
    assert final.wait(timeout=60) == 0
    confirmed = _confirmed(side)
    assert killed_mid_run == kills
    entries = _check(root, layout, confirmed)
    ids = {e.group_id for e in entries}
    # Every id the children attempted is there once: the confirmed ones, and possibly the
    # id that was in flight when a child died (its successor appended it again).
    assert ids == {f"h-g{i}" for i in range(len(confirmed))}


@pytest.mark.parametrize("layout", ["jsonl", "objects"])
def test_four_concurrent_appenders_get_distinct_dense_positions(tmp_path, layout):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = tmp_path / "store"
    per = 40
    sides = [tmp_path / f"side{k}.txt" for k in range(4)]
    go = tmp_path / "go"
    procs = [_launch(script, root, layout, sides[k], 0, per, f"host{k}", go) for k in range(4)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("go.ready-*"))) < 4:
        assert time.monotonic() < deadline, "appenders did not start"
        assert all(p.poll() is None for p in procs), "an appender died before the barrier"
        time.sleep(0.005)
    go.touch()
    for p in procs:
        assert p.wait(timeout=120) == 0
    confirmed = [c for s in sides for c in _confirmed(s)]
    assert len(confirmed) == 4 * per
    assert sorted(pos for _, pos in confirmed) == list(range(4 * per))
    entries = _check(root, layout, confirmed)
    assert len(entries) == 4 * per
