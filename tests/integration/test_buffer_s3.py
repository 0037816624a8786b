"""The sample buffer on S3 (a real SeaweedFS server on 127.0.0.1): concurrent appenders.

8 processes x 20 groups by default (``YETO_BUFFER_S3_GROUPS=200`` runs the full 8 x 200 of
the issue, about 4 minutes on 2 cores) append through
the ``s3`` store, layout ``objects``: every group gets a distinct position, the
positions are dense, nothing is lost, and every payload loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

testing = pytest.importorskip("yeto_s3.testing", reason="yeto-s3 is not installed")

from yeto_core.buffer.sample_buffer import FileSampleBuffer  # noqa: E402
from yeto_core.plugins import get_plugins  # noqa: E402
from yeto_core.records import RoundSpec  # noqa: E402

CHILD = r"""
import os, sys, time
import numpy as np
from yeto_core.plugins import get_plugins
from yeto_core.records import Sample, SampleGroup
from yeto_core.buffer.sample_buffer import FileSampleBuffer

url, host, count, go, side = sys.argv[1:6]
store = get_plugins().open_store(url)  # credentials from YETO_STORE_S3_* only
buf = FileSampleBuffer(store, layout="objects", host=host)
open(go + ".ready-" + host, "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.002)
with open(side, "w") as out:
    for i in range(int(count)):
        t = np.arange(32, dtype=np.int32) + i
        s = Sample(tokens=t, prompt_len=4, logprobs=np.zeros(28, np.float32),
                   loss_mask=np.ones(28, np.uint8), reward=0.0, weight_version=0)
        pos = buf.append(SampleGroup(f"{host}-g{i}", "p", host, 0, (s, s)))
        out.write(f"{host}-g{i} {pos}\n")
"""


@pytest.fixture(scope="module")
def server():
    # the real server only: moto (in the test's process, one request at a time) is the
    # S3 store contract's second server (tests/s3), where its conditional writes are checked
    endpoint, stop = testing.start_seaweedfs_server()
    testing.create_bucket_when_ready(endpoint, "buffer-tests")
    try:
        yield endpoint
    finally:
        stop()


def test_eight_appender_processes_get_distinct_dense_positions(server, tmp_path):
    procs_n, per = 8, int(os.environ.get("YETO_BUFFER_S3_GROUPS", "20"))
    url = "s3://buffer-tests/concurrent"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, **testing.s3_env(server)}
    go = tmp_path / "go"
    sides = [tmp_path / f"side{k}.txt" for k in range(procs_n)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, f"h{k}", str(per), str(go), sides[k]], env=env
        )
        for k in range(procs_n)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.ready-*"))) < procs_n:
        assert time.monotonic() < deadline, "appenders did not start"
        assert all(p.poll() is None for p in procs), "an appender died before the barrier"
        time.sleep(0.01)
    go.touch()
    for p in procs:
        assert p.wait(timeout=600) == 0
    confirmed = [line.split() for s in sides for line in s.read_text().splitlines()]
    assert len(confirmed) == procs_n * per
    positions = sorted(int(pos) for _, pos in confirmed)
    assert positions == list(range(procs_n * per))  # distinct and dense

    store = get_plugins().open_store(url, **testing.s3_options(server))
    buf = FileSampleBuffer(store, layout="objects")
    entries = buf.entries()
    assert [e.position for e in entries] == list(range(procs_n * per))
    assert {e.group_id: e.position for e in entries} == {g: int(p) for g, p in confirmed}
    r = buf.select(RoundSpec(max_groups=procs_n * per, current_version=0, max_policy_age=0))
    assert len(r.entries) == procs_n * per and not r.duplicates
    assert buf.load(r.entries[-1]).group_id == r.entries[-1].group_id
