"""`yeto bench e2e` smoke test: a tiny target and timeout, the JSON keys (no timing asserts).

The real measurement (target 0.8, minutes per mode) is `yeto bench e2e --json`
(see docs/performance.md#end-to-end); it is not part of `make test`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from yeto_core.bench.e2e import e2e_config, time_to_target

ROOT = Path(__file__).resolve().parents[2]

KEYS = {
    "async_time_to_target_s",
    "sync_time_to_target_s",
    "speedup",
    "startup_s",
    "trainer_paid_s",
    "trainer_busy_s",
    "reward_curves",
    "overhead_vs_plain_loop",
}


def test_time_to_target_needs_a_full_window_and_counts_from_t0() -> None:
    rounds = [(10.0 + i, [1.0] * 4) for i in range(20)]
    hit, curve = time_to_target(rounds, target=0.8, t0=10.0, window=64)
    assert hit == 15.0  # the 16th round completes 64 groups
    assert curve[0] == (0.0, 1.0)
    hit, _ = time_to_target([(1.0, [0.5] * 64)], target=0.8, t0=0.0)
    assert hit is None


def test_sync_mode_caps_the_backlog_at_one_round(tmp_path: Path) -> None:
    from yeto_core.config import load_config

    for mode, cap, sched in (("async", 16, "s1"), ("sync", 4, "always-on")):
        path = tmp_path / f"{mode}.toml"
        path.write_text(
            e2e_config(
                tmp_path / mode,
                mode=mode,
                base_dir=tmp_path / "base",
                task="add1",
                seed=0,
                timeout_s=10,
            )
        )
        config = load_config(path)
        assert config.samplers[0].backlog_cap == cap
        assert config.scheduler.name == sched


@pytest.mark.timeout(600)
def test_e2e_smoke_json_keys(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from yeto_core.cli import main; sys.exit(main())",
            "bench",
            "e2e",
            "--target",
            "0.05",
            "--timeout-s",
            "20",
            "--base-dir",
            str(ROOT / "runs" / "base" / "add1"),
            "--plain-loop",
            str(tmp_path / "no-such-loop.py"),
            "--work-dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert KEYS <= set(report), sorted(KEYS - set(report))
    for mode in ("async", "sync"):
        assert report["runs"][mode]["rounds_trained"] > 0, report["runs"]
        assert report["trainer_paid_s"][mode] > 0 and report["trainer_busy_s"][mode] > 0
