"""`provider = "modal"` end to end: the head, and islands whose real function bodies run via .local().

The head is the real `yeto run up` (a process); the modal provider builds the
run's real Modal app and spawns one call per island incarnation through the
double of its call seam, whose containers are processes running the island
function's body through `Function.local()` with only the call's arguments and
the function's Secret in their environment, in an empty working directory.
The store is a loopback S3 server (SeaweedFS). The first head is killed mid-run; the
second cancels and verifies the first head's calls and finishes the run,
which learns the quickstart task.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("yeto_torch")

from yeto_core.records import IslandLaunch  # noqa: F401  (needs the typed provider port)
from yeto_modal.prices import hourly_usd

sys.path.insert(0, str(Path(__file__).parent))
from modal_doubles import CallService

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).parent / "head_with_doubles.py"
# 200 rounds, every island body through .local(): 17 min on 2 cores at load 11-22
# (docs/modal.md, "The end-to-end run"). Run by `make examples` (YETO_SOAK=1), not by make
# test; the provider, the app and the Volume store are tested in make test (tests/modal/).
pytestmark = [
    pytest.mark.soak,
    pytest.mark.timeout(3000),
    pytest.mark.skipif(
        os.environ.get("YETO_SOAK") != "1",
        reason="about 17 min on 2 busy cores: YETO_SOAK=1 (make examples) runs it",
    ),
]

PRICE = round(hourly_usd(None, 1, 2048), 4)


def run_toml(store: str, run_dir: Path, base: Path) -> str:
    """The quickstart with its samplers and trainer on Modal and its store on S3."""
    text = (ROOT / "examples" / "quickstart" / "run.toml").read_text()
    island = f'provider = "modal"\nprice_per_hour = {PRICE}\n' + (
        "provider_options = { cpu = 1, memory = 2048, timeout_s = 3600 }"
    )
    for old, new in (
        ('name = "quickstart"', 'name = "modal-e2e"'),
        ('run_dir = "runs/quickstart"', f'run_dir = "{run_dir}"\nstore = "{store}"'),
        ('path = "runs/base/sort4-t30"', f'path = "{base}"'),
        ('engine = "hf"', f'engine = "hf"\n{island}'),
        ('backend = "torch"', f'backend = "torch"\n{island}'),
        ("total_rounds = 600", "total_rounds = 200"),
        # on 2 cores shared with other work a round takes 2-4 s here: learn faster, keep
        # the trainer up (no sampler pauses), so the run fits in minutes
        ("lr = 0.0002", "lr = 0.0005"),
        ("pause_every_s = 45.0", "pause_every_s = 0.0"),
        ("pause_s = 6.0", "pause_s = 0.0"),
        ("wall_clock_s = 300", "wall_clock_s = 3600\nbudget_usd = 1.0"),
        ("silence_s = 60", "silence_s = 600"),  # a trainer start can take minutes on 2 busy cores
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


@pytest.fixture
def s3(tmp_path):
    """SeaweedFS, not moto: on moto (one Python process, writes serialized, every listing
    a scan of the whole bucket) each store request took 50-400 ms by round 15 and a round
    6-13 s; on SeaweedFS a round takes 2-4 s on the same loaded cores (docs/modal.md).

    SeaweedFS lists in directory-tree order, not S3's; every prefix this run lists is flat
    or sorts the same both ways, and the store checks the order of every listing (a
    StoreError otherwise), so the store keeps S3's order and its start-after listings
    (``list_order = "sorted"`` re-lists whole prefixes: the samplers' backlog read grew
    from 0.08 s to 0.4 s by round 40)."""
    from yeto_s3.testing import create_bucket_when_ready, s3_env, start_seaweedfs_server

    endpoint, stop = start_seaweedfs_server()
    try:
        create_bucket_when_ready(endpoint, "yeto-modal-e2e")
        yield s3_env(endpoint)
    finally:
        stop()


def _head(service: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(DRIVER), str(service), "yeto", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_modal_islands_learn_and_a_restarted_head_cancels_the_previous_calls(
    tmp_path, s3, monkeypatch, request
):
    for k, v in s3.items():
        monkeypatch.setenv(k, v)
    run_dir, service_dir = tmp_path / "run", tmp_path / "modal-service"
    config = tmp_path / "run.toml"
    config.write_text(
        run_toml("s3://yeto-modal-e2e/runs/e2e", run_dir, ROOT / "runs/base/sort4-t30")
    )

    dry = subprocess.run(
        [sys.executable, str(DRIVER), str(service_dir), "yeto", "run", "up", str(config), "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "yeto-sampler (sampler: sampler-0, sampler-1)" in dry.stdout
    assert f"${PRICE:.4f}/hour per island" in dry.stdout

    service = CallService(service_dir)
    request.addfinalizer(service.stop_all)  # no container outlives the test
    first = _head(service_dir, "run", "up", str(config))
    started = time.monotonic()
    deadline = started + 600
    try:
        while True:
            assert first.poll() is None, first.stdout.read()[-4000:]
            assert time.monotonic() < deadline, "the first head trained no 15 rounds in time"
            try:
                rounds = json.loads((run_dir / "status.json").read_text()).get("trained_rounds")
            except (OSError, ValueError):
                rounds = None
            if (rounds or 0) >= 15:
                break
            time.sleep(0.5)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    journal = {p.stem: json.loads(p.read_text()) for p in (run_dir / "modal").glob("*.json")}
    left = sorted(r["call_id"] for r in journal.values())
    assert {"sampler-0-i0", "sampler-1-i0"} <= set(journal), journal
    assert sorted(service.running()) == left, "the killed head's calls keep running"

    first_s, started = time.monotonic() - started, time.monotonic()
    second = _head(service_dir, "run", "up", str(config))
    try:
        out, _ = second.communicate(timeout=1800)
    finally:
        if second.poll() is None:
            second.kill()
    print(out[-4000:])
    print(f"first head killed after {first_s:.0f} s (15 rounds), its calls {left}; "
          f"second head {time.monotonic() - started:.0f} s")  # fmt: skip
    assert second.returncode == 0, out[-4000:]
    cancels = sorted(p.stem for p in service_dir.glob("*.cancelled"))
    print(f"cancelled: {cancels}; ended: {[service.poll(c) for c in left]}")
    assert set(left) <= set(cancels), (left, cancels)  # each cancelled with terminate_containers
    assert all(service.poll(c)[0] != "pending" for c in left)  # and confirmed ended
    assert service.running() == [] and not list((run_dir / "modal").glob("*.json"))
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["groups_trained"] + sum(s["groups_skipped"].values()) == s["groups_appended"], s
    assert s["reward_last"] - s["reward_first"] >= 0.3, s
    assert s["cost_usd"] > 0, s
    functions = {service.function_of(c) for c in service.calls()}
    assert functions == {"yeto-sampler", "yeto-trainer"}
