"""`yeto bench chaos --faults agentic`, the short profiles: the calculator environment
with its tool in real bwrap sandboxes that outlive their island, two SIGKILLs of sampler
islands while their trials' sandboxes run; the restarted islands must sweep every
orphan (`sandbox_orphans_removed`), no sandbox of a dead incarnation may be left
running (by label and in the process listing), and every group is trained once or
skipped with its reason (ledger check). And with `--evictions 2`: the sampler islands are
nodes of the nc pool on the marketplace simulator, one evicted mid-trial without notice,
one with notice (its standby launched first; each eviction waits for a trial of its
node and freezes the node mid-trial, so it lands mid-trial at any speed); the evicted incarnations' orphans are swept by
their replacements, nothing left running, every eviction fenced, no group lost or
trained twice, no trial of a live island lost its sandbox to a sweep.

The base (runs/base/agentic-calc-smoke, shared with tests/integration/test_agentic_run.py)
is built on first use (yeto_bench.agentic_base) and cached."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("yeto_torch")

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True
    )
    return probe.returncode == 0


needs_bwrap = pytest.mark.skipif(
    not _bwrap_works() or os.geteuid() != 0,
    reason="the bwrap host needs bwrap that can make namespaces, and root",
)


def _chaos(tmp_path, *args):
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from yeto_core.cli import main; sys.exit(main())",
            "bench", "chaos", "--faults", "agentic", *args, "--runs", "1",
            "--seed", "0", "--no-replay",
            "--base-dir", str(ROOT / "runs" / "base" / "agentic-calc-smoke"),
            "--work-dir", str(tmp_path), "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=880,
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-4000:]
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


@needs_bwrap
@pytest.mark.timeout(900)
def test_sampler_islands_killed_mid_trial_leave_no_sandbox_and_lose_no_group(tmp_path):
    proc, report = _chaos(tmp_path, "--kills", "2", "--rows", "96")
    ag = report["faults"]["agentic"]
    brief = {k: v for k, v in report.items() if k != "per_run"}
    assert report["kills"] == 2 and report["kills_by_role"] == {"sampler": 2}, brief
    assert ag["orphans_at_kills"] > 0, brief  # the kills landed while trials ran
    assert ag["sandboxes_left_running"] == 0, brief
    assert ag["bwrap_processes_of_dead_incarnations"] == 0, brief
    swept = ag["orphans_removed"] + ag["orphans_removed_at_run_end"]
    assert swept >= ag["orphans_at_kills"], brief
    assert ag["orphans_removed_events"] >= 1, brief
    assert ag["islands_relaunched_by_the_head"] >= 2, brief
    assert report["per_run"][0]["head_exit_codes"] == [0], brief  # no operator restart
    assert report["runs_completed"] == 1, brief
    assert report["groups_lost"] == 0 and report["groups_trained_twice"] == 0, brief
    assert report["ledger_check_failures"] == 0, brief
    assert report["ok"] is True and proc.returncode == 0, brief


@needs_bwrap
@pytest.mark.timeout(900)
def test_nc_nodes_evicted_mid_trial_are_swept_by_their_replacements(tmp_path):
    # each eviction waits for a trial of its node and freezes the node mid-trial before
    # the simulator kills it (yeto_bench.agentic_evict): it lands mid-trial at any speed
    proc, report = _chaos(tmp_path, "--kills", "0", "--evictions", "2", "--rows", "128")
    ag = report["faults"]["agentic"]
    brief = {k: v for k, v in report.items() if k != "per_run"}
    assert ag["evictions_failed"] == [], brief
    assert ag["evictions"] == 2 and ag["marketplace_evicted"] == 2, brief
    assert ag["evictions_with_notice"] == 1, brief
    # the noticed node was replaced early (a standby); every early replacement has its
    # cause in the head's events (a notice of that node: a notice whose eviction did not
    # follow, when the run ended first, gets a standby too; see notices_given)
    assert ag["noticed_evictions_replaced_early"] == 1, brief
    assert ag["sampler_replace_early_without_cause"] == [], brief
    assert ag["orphans_at_evictions"] > 0, brief  # the evictions landed while trials ran
    assert ag["sandboxes_left_running"] == 0, brief
    assert ag["bwrap_processes_of_dead_incarnations"] == 0, brief
    assert ag["evicted_not_swept"] == 0 and ag["evicted_swept_by_replacement"] >= 1, brief
    running_standby = ag["evicted_with_a_running_standby"]
    assert ag["evicted_swept_by_their_running_standby"] == running_standby, brief
    assert ag["sampler_fenced"] >= 2, brief
    assert ag["trials_lost_by_reason"].get("sandbox_gone", 0) == 0, brief
    assert ag["dispense_positions_trained_twice"] == 0, brief
    assert report["per_run"][0]["head_exit_codes"] == [0], brief
    assert report["groups_lost"] == 0 and report["groups_trained_twice"] == 0, brief
    assert report["ledger_check_failures"] == 0, brief
    assert report["ok"] is True and proc.returncode == 0, brief


def test_the_campaign_fails_on_what_a_sweep_missed():
    """``agentic_ok`` (pure): each eviction check can fail the campaign."""
    from yeto_bench.chaos_agentic import agentic_ok

    report = {"ok": True, "kills": 0}
    good = {
        "orphans_removed_events": 2, "orphans_removed": 2, "orphans_at_evictions": 2,
        "evictions": 2, "marketplace_evicted": 2, "sampler_fenced": 2,
        "evicted_swept_by_replacement": 2, "evicted_not_swept": 0,
        "evicted_with_a_running_standby": 1, "evicted_swept_by_their_running_standby": 1,
        "dispense_positions_trained_twice": 0, "dispense_double_holds": 0,
        "trials_lost_by_reason": {"sandbox_timeout": 1},
        "evictions_with_notice": 1, "noticed_evictions_replaced_early": 1,
        "sampler_replace_early_without_cause": [],
    }  # fmt: skip
    assert agentic_ok(report, good, kills=0, evictions=2)
    for bad in (
        # the noticed node's orphan taken by the head at the run's end, not its standby
        {"evicted_swept_by_their_running_standby": 0, "evicted_swept_by_replacement": 1},
        {"evicted_not_swept": 1},
        {"sandboxes_left_running": 1},
        {"bwrap_processes_of_dead_incarnations": 1},
        {"orphans_at_evictions": 0},  # no eviction landed mid-trial
        {"evictions": 1},
        {"evictions_failed": ["agentic-000: no trial of sampler-0 incarnation 1 ran"]},
        {"sampler_fenced": 1},
        {"trials_lost_by_reason": {"sandbox_gone": 1}},  # a live island's sandbox swept
        {"dispense_positions_trained_twice": 1},
        {"noticed_evictions_replaced_early": 0},  # the noticed node had no standby
        # a standby launched for a node that had no notice and no refused renewal
        {"sampler_replace_early_without_cause": ["agentic-000: sampler-0-i1"]},
    ):
        assert not agentic_ok(report, {**good, **bad}, kills=0, evictions=2), bad
    assert not agentic_ok({**report, "ok": False}, good, kills=0, evictions=2)
