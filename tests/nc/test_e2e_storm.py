"""examples/nc/run.toml end to end against the simulator, under a seeded storm (slow).

Real processes: the head (`yeto run up`), `hf` sampler islands started as lease
processes by the marketplace simulator, the `torch` trainer as a `local`
island. The run is shortened (``YETO_NC_E2E_ROUNDS`` rounds, default 80) so it
fits a test; the storm is the example's with evictions brought forward. The
evictions are driven by each node's progress (groups it appended, read from the
run's buffer index), not by the clock, so the storm is the same on a loaded
machine. Asserted: every appended group trained or skipped with a reason, lost
incarnations fenced and replaced (some before the loss), fenced groups counted,
no dispense position trained twice and no range held twice, every lease
released, and the provider's billed cost per lease (as ``yeto cost`` shows it)
equal to the simulator's billing to the cent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("yeto_torch")

from yeto_core.buffer.dispenser import dispense_report
from yeto_core.events.stream import read_events
from yeto_core.plugins import Plugins
from yeto_nc.client import TERMINAL, LeaseClient
from yeto_nc.testing import BufferProgress, Marketplace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "nc"
YETO = [sys.executable, "-c", "from yeto_core.cli import main; main()"]

# A learning run of about 6 minutes: run by `make examples` (YETO_SOAK=1).
pytestmark = [
    pytest.mark.soak,
    pytest.mark.skipif(
        os.environ.get("YETO_SOAK") != "1",
        reason="a learning run under a storm (about 6 min): YETO_SOAK=1 (make examples) runs it",
    ),
]


def _config(tmp_path: Path, rounds: int) -> Path:
    lines = []
    for ln in (EXAMPLE / "run.toml").read_text().splitlines():
        if ln.startswith("total_rounds = "):
            ln = f"total_rounds = {rounds}"
        lines.append(ln)
    path = tmp_path / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_pool_under_a_seeded_storm(tmp_path: Path) -> None:
    rounds = int(os.environ.get("YETO_NC_E2E_ROUNDS", "120"))
    storm = json.loads((EXAMPLE / "storm.json").read_text())
    # evictions after 40-120 groups of a node (the example's 150-450 suit 400 rounds)
    storm.update(evict_after_progress=[40, 120])
    run_dir = tmp_path / "nc"
    progress = BufferProgress(run_dir / "store")
    with Marketplace(storm, work_dir=tmp_path / "sim", progress=progress) as market:
        env = dict(os.environ, PYTHONUNBUFFERED="1", YETO_NC_URL=market.url)
        proc = subprocess.run(
            [*YETO, "run", "up", str(_config(tmp_path, rounds)), "--run-dir", str(run_dir)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        out = proc.stdout + proc.stderr
        print(out[-4000:])
        counts = dict(market.counts)
        billed = market.billing_usd(label="yeto_run=nc-storm")
        leases = LeaseClient(market.url).leases(label="yeto_run=nc-storm")
    print(json.dumps(counts))
    assert proc.returncode == 0, out[-4000:]
    s = json.loads((run_dir / "summary.json").read_text())
    print(json.dumps(s, indent=1))
    # every appended group trained or skipped with a counted reason
    assert s["groups_trained"] + sum(s["groups_skipped"].values()) == s["groups_appended"], s
    assert s["groups_untrained"] == 0, s
    # the storm happened and every lost incarnation was fenced and replaced
    lost = counts["evicted"] + counts["expired"]
    assert lost >= 2 and counts["evicted"] >= 1 and counts["refused"] >= 1, counts
    store = Plugins().open_store(str((run_dir / "store").absolute()))
    head = list(read_events(store, "head"))
    fenced = [e for e in head if e.kind == "sampler_fenced"]
    assert len(fenced) >= 2 and len(fenced) <= lost, (len(fenced), counts)
    launches = [e for e in head if e.kind == "sampler_launch"]
    islands = {e.data["island"] for e in launches}
    exited = sum(1 for e in head if e.kind == "sampler_exited")
    standby = {e.data["handle"] for e in launches if e.data.get("standby")}
    promoted = [e for e in head if e.kind == "sampler_promoted"]
    dropped = {e.data["handle"] for e in head if e.kind == "sampler_standby_dropped"}
    main_fences = [e for e in fenced if e.data["handle"] not in dropped]
    # every loss of a serving node: its early replacement took over, or one was launched
    assert len(launches) - len(standby) == len(islands) + len(main_fences) - len(promoted) + exited
    assert promoted, "no replacement started before its node's lease ended"
    launched_at = {e.data["handle"]: e.time for e in launches}
    lost_at = {e.data["handle"]: e.time for e in fenced}
    # a promoted replacement was launched before the loss it covers
    early = [lost_at[e.data["replaced"]] - launched_at[e.data["handle"]] for e in promoted]
    assert min(early) >= 0, early
    print("replacement lead before the loss (s):", sorted(round(x, 2) for x in early))
    # fenced groups are counted with their reason, and never trained
    trained, skipped_fenced = [], set()
    for e in read_events(store, "trainer"):
        if e.kind == "round_trained":
            trained.extend(int(p) for p in e.data.get("positions", ()))
            skipped_fenced.update(
                int(p) for p in e.data.get("skipped", {}).get("fenced_incarnation", ())
            )
    assert len(trained) == len(set(trained)), "a group was trained twice"
    fence_set = {(e.data["island"], int(e.data["incarnation"])) for e in fenced}
    buffer = Plugins().open_buffer(store, host="check", read_only=True)
    entries = {e.position: e for e in buffer.entries(0)}
    assert len(entries) == s["groups_appended"]
    assert skipped_fenced, "no group was fenced: the storm was too mild"
    assert s["groups_skipped"].get("fenced_incarnation", 0) == len(skipped_fenced - set(trained))
    for pos in skipped_fenced:
        assert (entries[pos].host, int(entries[pos].incarnation)) in fence_set
    assert not skipped_fenced & set(trained)
    # the dispenser: no dispense position trained twice, no range held twice at once
    dispensed = [int(entries[p].group_id.rsplit("-d", 1)[1]) for p in trained]
    assert len(dispensed) == len(set(dispensed)), "a dispense position was trained twice"
    rep = dispense_report(store)
    print(json.dumps({k: v for k, v in rep.items() if k != "unacked"}))
    assert rep["double_holds"] == 0 and s["groups_skipped"].get("duplicate", 0) == 0, rep
    assert rep["redispensed"], "no claim was re-dispensed: the storm hit no open claim"
    # every lease released, and the provider's cost equal to the billing to the cent
    assert {x["state"] for x in leases} <= set(TERMINAL), leases
    shown = subprocess.run(
        [*YETO, "cost", str(run_dir), "--json"], cwd=ROOT, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    costs = json.loads(shown.stdout)["billed"]["nc"]
    handles = {x["labels"]["yeto_handle"]: x["id"] for x in leases}
    assert set(costs) == set(handles)
    for handle, lid in handles.items():
        assert costs[handle]["lease_id"] == lid
        assert round(costs[handle]["usd"], 2) == round(billed[lid], 2), (handle, costs, billed)
