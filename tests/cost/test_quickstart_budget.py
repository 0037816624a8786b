"""The quickstart with prices and a budget it would exceed: a real `yeto run up` (the head,
two `hf` sampler islands, the `torch` trainer island, the `local` provider, the default
`dir` store) stops with the budget exit code, a cut, and spend <= budget in `yeto cost`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from yeto_core.testing.streams import stream_text

pytest.importorskip("yeto_torch")

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "run.toml"
YETO = [sys.executable, "-c", "from yeto_core.cli import main; main()"]
EXIT_BUDGET = 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("YETO_SOAK") != "1",
        reason="a budgeted quickstart (about 2 min on 2 cores): YETO_SOAK=1 (make examples) runs it",
    ),
]

#: 2 samplers at 3.6 $/h and a trainer at 7.2 $/h: 0.4 cents a second while all run;
#: the quickstart runs 600 rounds (about 5 minutes, some $1.2): the budget is half that.
BUDGET = 0.6
PRICED = """
[cost]
sampler_release_s = 5.0    # floors; the guard uses the longest release/stop it measures
trainer_stop_s = 15.0
react_s = 1.0
"""


def budgeted_quickstart(tmp_path: Path) -> Path:
    text = QUICKSTART.read_text()
    for old, new in (
        (
            "engine_options = { threads = 1 }",
            "engine_options = { threads = 1 }\nprice_per_hour = 3.6",
        ),
        ("total_rounds = 600", "total_rounds = 600\nprice_per_hour = 7.2"),
        (
            "options = { start_seconds_fixed = 3.0 }",
            "options = { start_seconds_fixed = 3.0, start_seconds_fallback = 20.0 }",
        ),
        ("wall_clock_s = 300", f"wall_clock_s = 900\nbudget_usd = {BUDGET}"),
    ):
        assert old in text, old
        text = text.replace(old, new, 1)
    config = tmp_path / "budget.toml"
    config.write_text(text + PRICED)
    return config


@pytest.mark.timeout(900)
def test_the_quickstart_stops_at_its_budget_with_a_cut(tmp_path: Path) -> None:
    run_dir = tmp_path / "qs-budget"
    config = budgeted_quickstart(tmp_path)
    proc = subprocess.run(
        [*YETO, "run", "up", str(config), "--run-dir", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=880,
    )
    out = proc.stdout + proc.stderr
    print(out[-3000:])
    assert proc.returncode == EXIT_BUDGET, out[-3000:]
    res = subprocess.run(
        [*YETO, "cost", str(run_dir), "--json"], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    cost = json.loads(res.stdout)
    print(json.dumps({k: v for k, v in cost.items() if k != "incarnations"}, indent=1))
    assert cost["ledger"] == "store"
    assert cost["usd_total"] <= BUDGET and cost["within_budget"] is True, cost
    assert cost["usd_total"] >= 0.5 * BUDGET, cost  # the run used its budget
    assert cost["groups_trained"] > 0 and cost["usd_per_trained_group"] > 0, cost
    assert set(cost["by_role"]) == {"sampler", "trainer"}
    # the trainer was drained with a cut and nothing runs any more
    journal = sorted((run_dir / "store" / "head" / "journal").glob("*.json"))
    records = [json.loads(p.read_text()) for p in journal]
    stops = [r for r in records if r["kind"] in ("stop", "release")]
    assert stops and stops[-1]["kind"] == "stop" and stops[-1]["cut_id"], stops[-3:]
    starts = [r for r in records if r["kind"] == "start"]
    assert len(starts) == len(stops)
    assert not list((run_dir / "islands").glob("*.json"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_BUDGET and summary["reason"] == "budget"
    assert summary["cost"]["usd_total"] <= BUDGET
    head = stream_text(run_dir / "store", "head").splitlines()
    guard = [json.loads(ln)["data"] for ln in head if '"kind":"cost_guard"' in ln]
    assert guard and guard[-1]["action"] == "stop_run", guard[-1:]
    assert any(g["action"] == "release_sampler" for g in guard)
