"""`yeto bench e2e` smoke test: a tiny target and timeout, the JSON keys (no timing asserts).

The real measurement (sort4, target 0.8, minutes per mode) is `yeto bench e2e --json`
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


def test_sync_mode_makes_one_round_per_sampler_call_and_waits_for_versions(
    tmp_path: Path,
) -> None:
    from yeto_core.config import load_config

    for mode, sync, sched in (("async", False, "s1"), ("sync", True, "always-on")):
        path = tmp_path / f"{mode}.toml"
        path.write_text(
            e2e_config(
                tmp_path / mode,
                mode=mode,
                base_dir=tmp_path / "base",
                task="sort4",
                seed=0,
                timeout_s=10,
            )
        )
        config = load_config(path)
        sampler = config.samplers[0]
        assert sampler.sync_rounds is sync and sampler.pause_every_s == 0
        assert config.scheduler.name == sched
        assert config.trainer.backend_options == {"lr": 0.0005, "threads": 1}
        if sync:  # the islands' calls together make exactly one round
            assert sampler.count * sampler.prompts_per_call == config.trainer.groups_per_round
    with pytest.raises(ValueError, match="multiple"):
        e2e_config(
            tmp_path, mode="sync", base_dir=tmp_path, task="sort4", seed=0, timeout_s=1, samplers=3
        )


def test_policy_lag_is_zero_for_synchronous_rounds() -> None:
    from yeto_core.bench.e2e import policy_lag
    from yeto_core.records import Event

    def rnd(k: int, positions: list[int]) -> Event:
        data = {"trained_rounds": k, "positions": positions}
        return Event(kind="round_trained", time=float(k), source="trainer", data=data)

    sync = [rnd(1, [0, 1]), rnd(2, [2, 3])]
    assert policy_lag(sync, {0: 0, 1: 0, 2: 1, 3: 1}) == 0
    assert policy_lag(sync, {0: 0, 1: 0, 2: 0, 3: 1}) == 1  # round 2 trained a v0 group
    assert policy_lag([], {}) is None


@pytest.mark.timeout(300)
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
            "8",
            "--base-dir",
            str(ROOT / "runs" / "base" / "sort4"),
            "--no-plain-loop",
            "--work-dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert KEYS <= set(report), sorted(KEYS - set(report))
    for mode in ("async", "sync"):
        assert report["runs"][mode]["rounds_trained"] > 0, report["runs"]
        assert report["trainer_paid_s"][mode] > 0 and report["trainer_busy_s"][mode] > 0
    # synchronous GRPO: every round is trained from the version its groups were sampled with
    assert report["max_policy_lag"]["sync"] == 0, report["max_policy_lag"]
    assert report["runs"]["sync"]["rounds_trained"] >= 2, report["runs"]


@pytest.mark.timeout(200)
def test_plain_loop_reports_time_from_its_first_group() -> None:
    """benchmarks/plain_loop.py end to end with a tiny target (no timing asserts).

    Regression: t0 was taken from the group files seen at the parent's polls, after
    the trainer had consumed the first ones, so early rounds had negative times.
    """
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "plain_loop.py"),
            "--base-dir",
            str(ROOT / "runs" / "base" / "sort4"),
            "--target",
            "0.05",
            "--timeout-s",
            "10",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"time_to_target_s", "startup_s", "rounds_trained", "reward_curve"} <= set(report)
    assert report["rounds_trained"] > 0, report
    assert all(t >= 0 for t, _ in report["reward_curve"]), report["reward_curve"][:3]
