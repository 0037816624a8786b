"""`yeto bench chaos` with a small number of SIGKILLs (real processes, real runs).

The long campaign (`make chaos`, 50 kills) is the same code with more kills.
The pure lineage functions are tested first: they decide what "lost" and
"trained twice" mean.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from yeto_bench.chaos import final_lineage, ledger_tail_skips, lineage_counts
from yeto_core.records import Event

ROOT = Path(__file__).resolve().parents[2]


def _round(r: int, positions: list[int], skipped: dict | None = None) -> Event:
    data = {"trained_rounds": r, "positions": positions, "skipped": skipped or {}}
    return Event(kind="round_trained", time=float(r), source="trainer", data=data)


def test_restored_incarnation_supersedes_rounds_after_its_cut() -> None:
    # incarnation 0 trains rounds 1..3; incarnation 1 restores the cut at round 1
    events = [_round(1, [0, 1]), _round(2, [2, 3]), _round(3, [4, 5]), _round(2, [2, 3])]
    lineage = final_lineage(events)
    assert sorted(lineage) == [1, 2]
    counts = lineage_counts({0, 1, 2, 3, 4, 5}, lineage, upto=4)
    assert counts == {"lost": [], "twice": []}
    # positions 4, 5 are past the watermark the lineage reached: not due yet
    assert lineage_counts({0, 1, 2, 3, 4, 5}, lineage)["lost"] == [4, 5]


def test_twice_and_skipped_with_reason() -> None:
    events = [_round(1, [0, 1]), _round(2, [1, 3], {"stale": [2]})]
    counts = lineage_counts({0, 1, 2, 3}, final_lineage(events), upto=4)
    assert counts == {"lost": [], "twice": [1]}


def test_skip_only_event_at_the_data_end_adds_skips_to_the_last_round() -> None:
    """Regression (found by `make chaos`, seed 0, run-000): the data-end stale-tail event
    (``round_trained`` numbered like the last round, no positions) superseded that round,
    so its 4 trained positions were reported lost and the tail's skips hid them."""
    events = [
        _round(22, [90, 91, 92, 93]),
        _round(23, [94, 95, 96, 97]),
        _round(23, [], {"stale": [98, 99, 100, 101, 102]}),
    ]
    lineage = final_lineage(events)
    assert lineage[23]["positions"] == [94, 95, 96, 97]
    assert lineage[23]["skipped"] == {"stale": [98, 99, 100, 101, 102]}
    counts = lineage_counts(set(range(90, 103)), lineage, upto=103)
    assert counts == {"lost": [], "twice": []}
    # a restarted incarnation's skip-only event at round 1 still supersedes rounds 2..
    lineage = final_lineage([_round(1, [0]), _round(2, [1]), _round(1, [], {"stale": [1]})])
    assert sorted(lineage) == [1] and lineage[1]["skipped"] == {"stale": [1]}


def test_ledger_tail_skips_only_excuses_skipped_positions() -> None:
    lineage = final_lineage([_round(1, [0, 1]), _round(1, [], {"stale": [2, 3]})])
    assert ledger_tail_skips(2, 4, lineage) == [2, 3]
    assert ledger_tail_skips(1, 4, lineage) is None  # position 1 is trained: a real gap
    assert ledger_tail_skips(2, 5, lineage) is None  # position 4 unaccounted for


@pytest.mark.timeout(600)
def test_chaos_three_kills_nothing_lost_or_twice(tmp_path: Path) -> None:
    """3 SIGKILLs of random processes of a real run; the run completes, nothing lost."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from yeto_core.cli import main; sys.exit(main())",
            "bench",
            "chaos",
            "--kills",
            "3",
            "--runs",
            "1",
            "--seed",
            "3",
            "--total-rounds",
            "16",
            "--base-dir",
            str(ROOT / "runs" / "base" / "add1"),
            "--work-dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["kills"] == 3, report
    assert report["runs_completed"] == report["runs"] == 1, report
    assert report["groups_lost"] == 0, report
    assert report["groups_trained_twice"] == 0, report
    assert report["torn_records_visible"] == 0, report
    assert report["ledger_replay_mismatches"] == 0, report
    assert report["ledger_check_failures"] == 0, report
    assert proc.returncode == 0, proc.stderr


def _result(**over):
    base = {
        "run": "r0",
        "kills": [{"role": "head"}],
        "completed": True,
        "groups_lost": 0,
        "groups_trained_twice": 0,
        "ledger_replay_mismatch": 0,
        "torn_records_visible": 0,
        "ledger_check_failures": 0,
        "ledger_unrecorded_tail_skips": 0,
    }
    return {**base, **over}


def test_no_replay_reports_not_checked_instead_of_zero() -> None:
    """Regression: --no-replay reported ledger_replay_mismatches: 0, a check that never ran."""
    from yeto_bench.chaos import campaign_report

    unchecked = campaign_report(
        [_result(ledger_replay_mismatch=None)] * 2, seed=0, kills=2, replay=False
    )
    assert unchecked["ledger_replay_mismatches"] == "not checked"
    assert unchecked["ok"] is True
    checked = campaign_report(
        [_result(), _result(ledger_replay_mismatch=1)], seed=0, kills=2, replay=True
    )
    assert checked["ledger_replay_mismatches"] == 1 and checked["ok"] is False
    assert checked["kills_by_role"] == {"head": 2}


def _rel(kind: str, **data) -> dict:
    return {"kind": kind, "time": 1.0, "data": data}


def test_release_counts_tell_deltas_published_and_applied() -> None:
    from yeto_bench.chaos import release_counts

    counts = release_counts(
        [
            _rel("release_published", encoding="full"),
            _rel("release_published", encoding="delta"),
            _rel("release_republished", encoding="delta"),
            # the trainer stream's: a relaunched trainer retrained to the same weights
            _rel("release_published", encoding="delta", republished=True, stored_bytes=0),
            _rel("release_loaded", encoding="full", chain=["1"]),
            # on the sampler's copy of 1: one delta applied
            _rel("release_loaded", encoding="delta", chain=["2"], **{"from": "1"}),
            # a new sampler: the full release 4, then the deltas 5 and 6
            _rel("release_loaded", encoding="delta", chain=["4", "5", "6"], **{"from": "4"}),
            _rel("release_refused", reason="parent_mismatch"),
        ]
    )
    assert counts == {
        "deltas_applied": 3,
        "loaded_delta": 2,
        "loaded_delta_from_full": 1,
        "loaded_delta_on_local_copy": 1,
        "loaded_full": 1,
        "published_delta": 1,
        "published_full": 1,
        "refused_parent_mismatch": 1,
        "republished": 2,
    }


def test_a_campaign_with_deltas_on_is_not_ok_without_a_delta_applied() -> None:
    """--deltas on checks delta releases only if some were published and loaded."""
    from yeto_bench.chaos import campaign_report

    only_full = _result(releases={"published_full": 5, "loaded_full": 10})
    none = campaign_report([only_full], seed=0, kills=1, replay=True, deltas="on")
    assert none["releases"]["deltas_exercised"] is False and none["ok"] is False
    assert campaign_report([only_full], seed=0, kills=1, replay=True)["ok"] is True
    some = _result(releases={"published_delta": 2, "loaded_delta": 3, "deltas_applied": 3})
    both = campaign_report([only_full, some], seed=0, kills=2, replay=True, deltas="on")
    assert both["ok"] is True and both["releases"]["deltas_exercised"] is True
    assert both["releases"]["published_full"] == 5 and both["releases"]["deltas_applied"] == 3
