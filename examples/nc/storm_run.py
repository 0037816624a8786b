"""Run examples/nc/run.toml under examples/nc/storm.json and print the acceptance figures.

    python examples/nc/storm_run.py [--run-dir runs/nc-storm] [--rounds N]

Starts the marketplace simulator (evictions driven by each node's progress, read
from the run's buffer index), runs ``yeto run up``, stops the simulator, then
prints one JSON object: the storm's counts, reward first tenth -> last tenth,
groups appended / trained / skipped, positions and dispense positions trained
twice, the dispenser's report, early replacements and their lead before the
loss, and ``yeto cost``'s billed USD per lease against the simulator's billing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
YETO = [sys.executable, "-c", "import sys; from yeto_core.cli import main; sys.exit(main())"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", default="runs/nc-storm")
    ap.add_argument("--rounds", type=int, default=0, help="total_rounds (default: the example's)")
    ap.add_argument("--storm", default=str(HERE / "storm.json"), help="the scenario file")
    args = ap.parse_args()
    from yeto_core.buffer.dispenser import dispense_report
    from yeto_core.events.stream import read_events
    from yeto_core.plugins import Plugins
    from yeto_nc.testing import BufferProgress, Marketplace

    run_dir = Path(args.run_dir).absolute()
    shutil.rmtree(run_dir, ignore_errors=True)
    config = (HERE / "run.toml").read_text()
    if args.rounds:
        config = "\n".join(
            f"total_rounds = {args.rounds}" if ln.startswith("total_rounds = ") else ln
            for ln in config.splitlines()
        )
    run_dir.mkdir(parents=True)
    (run_dir / "run.toml").write_text(config + "\n")
    storm = json.loads(Path(args.storm).read_text())
    progress = BufferProgress(run_dir / "store")
    with Marketplace(storm, work_dir=run_dir / "sim", progress=progress) as market:
        env = dict(os.environ, YETO_NC_URL=market.url, PYTHONUNBUFFERED="1")
        up = subprocess.run(
            [*YETO, "run", "up", str(run_dir / "run.toml"), "--run-dir", str(run_dir)],
            cwd=ROOT,
            env=env,
        )
        counts = dict(market.counts)
        billed = market.billing_usd(label="yeto_run=nc-storm")
    store = Plugins().open_store(str(run_dir / "store"))
    s = json.loads((run_dir / "summary.json").read_text())
    trained = []
    for e in read_events(store, "trainer"):
        if e.kind == "round_trained":
            trained.extend(int(p) for p in e.data.get("positions", ()))
    buf = Plugins().open_buffer(store, host="check", read_only=True)
    gid = {e.position: e.group_id for e in buf.entries(0)}
    dispensed = [gid[p] for p in trained]
    head = read_events(store, "head")
    launched = {e.data["handle"]: e.time for e in head if e.kind == "sampler_launch"}
    lost = {e.data["handle"]: e.time for e in head if e.kind == "sampler_fenced"}
    lead = [
        round(lost[e.data["replaced"]] - launched[e.data["handle"]], 2)
        for e in head
        if e.kind == "sampler_promoted"
    ]
    shown = subprocess.run(
        [*YETO, "cost", str(run_dir), "--json"], cwd=ROOT, capture_output=True, text=True
    )
    nc = json.loads(shown.stdout).get("billed", {}).get("nc", {})
    diff = [abs(round(b["usd"], 2) - round(billed.get(b["lease_id"], -1), 2)) for b in nc.values()]
    out = {
        "exit": up.returncode,
        "storm": counts,
        "reward_first_tenth": s["reward_first"],
        "reward_last_tenth": s["reward_last"],
        "groups_appended": s["groups_appended"],
        "groups_trained": s["groups_trained"],
        "groups_skipped": s["groups_skipped"],
        "groups_untrained": s["groups_untrained"],
        "positions_trained_twice": len(trained) - len(set(trained)),
        "dispense_positions_trained_twice": len(dispensed) - len(set(dispensed)),
        "dispenser": {k: v for k, v in dispense_report(store).items() if k != "unacked"},
        "fenced_incarnations": len(lost),
        "replaced_early": len(lead),
        "replacement_lead_s": sorted(lead),
        "leases_billed": len(nc),
        "billed_usd_total": round(sum(b["usd"] for b in nc.values()), 6),
        "billed_vs_marketplace_max_cent_diff": max(diff) if diff else None,
        "wall_s": s.get("wall_s"),
    }
    print(json.dumps(out, indent=1))
    return up.returncode


if __name__ == "__main__":
    raise SystemExit(main())
