"""examples/nc/run.toml end to end against the simulator, under a seeded storm (slow).

Real processes: the head (`yeto run up`), `hf` sampler islands started as lease
processes by the marketplace simulator, the `torch` trainer as a `local`
island. The run is shortened (``YETO_NC_E2E_ROUNDS`` rounds, default 80) so it
fits a test; the storm is the example's with evictions brought forward. The
evictions are driven by each node's progress (groups it appended, read from the
run's buffer index), not by the clock, so the storm is the same on a loaded
machine. The first eviction is made to catch groups no trainer has examined, on
any machine (:class:`EvictWhileTrainerStopped`): the samplers pause until the
trainer stood still (``pause_until_quiet``), so S1 stops it in each pause; a
node whose eviction is due waits until no trainer process lives and it appended
a group since, and is then evicted without notice; those groups must be skipped
as ``fenced_incarnation``. Asserted: every appended group trained or skipped
with a reason, lost incarnations fenced and replaced (some before the loss),
fenced groups counted,
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
from typing import Any, Optional

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
        if ln.startswith("backlog_cap = "):
            # quiet pauses: S1 (T_s 3 s) stops the trainer in each, on any machine; the
            # held eviction comes while it is stopped
            # (every 10 s of sampling: on an idle machine the whole run samples for ~30 s, so
            # a 30 s cycle never paused and the held eviction never came)
            lines += ["pause_every_s = 10.0", "pause_s = 6.0", "pause_until_quiet = true"]
    path = tmp_path / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class EvictWhileTrainerStopped:
    """``progress(env)`` for the simulator that makes the storm's first eviction catch
    appended groups no trainer has examined, whatever the machine's speed.

    Counts as :class:`BufferProgress`. A node whose eviction is due waits (its progress is
    held just below the point) until no trainer process lives (S1 stopped it in the
    samplers' quiet pause) and it appended a group since: such a group has not been
    examined by any trainer incarnation. It is then evicted without notice (lost at
    once): the head fences it at its next tick, while a new trainer incarnation takes
    seconds to start, so every group it appended after the trainer stopped must be
    skipped as ``fenced_incarnation``. Later evictions go as the storm drew them.
    """

    def __init__(self, run_dir: Path, trainer: str = "trainer") -> None:
        self.run_dir, self.trainer = run_dir, trainer
        self.inner = BufferProgress(run_dir / "store")
        self.market: Any = None
        self.victim: Optional[tuple[str, int]] = None
        self.appended_before = 0
        self.since: dict[tuple[str, int], int] = {}

    def _trainer_alive(self) -> bool:
        """A trainer incarnation's process lives (the local provider's records)."""
        for path in (self.run_dir / "islands").glob("*.json"):
            try:
                rec = json.loads(path.read_text())
                if rec.get("island") != self.trainer:
                    continue
                stat = Path(f"/proc/{int(rec['pid'])}/stat").read_text()
            except (OSError, ValueError, KeyError):
                continue
            if stat.rpartition(")")[2].split()[0] != "Z":
                return True
        return False

    def _lease(self, env: dict[str, str]) -> Any:
        for lease in self.market.leases.values():
            req_env = lease.req.get("env") or {}
            if req_env.get("YETO_HANDLE") == env.get("YETO_HANDLE") and lease.state == "running":
                return lease
        return None

    def __call__(self, env: dict[str, str]) -> int:
        n = self.inner(env)
        if self.victim is not None:
            return n
        key = (env.get("YETO_ISLAND", ""), int(env.get("YETO_INCARNATION", "-1")))
        lease = self._lease(env)
        if lease is None or lease.evict_progress is None or n < lease.evict_progress:
            return n
        held = lease.evict_progress - 1
        if self._trainer_alive():
            self.since.pop(key, None)
            return held
        if key not in self.since:
            self.since[key] = n  # no trainer now: what this node appends from here on
            return held
        if n > self.since[key]:
            lease.evict_plan = (lease.evict_plan[0], 0.0)  # no notice: lost at once
            self.victim, self.appended_before = key, self.since[key]
            return n
        return held

    def held_groups(self, entries: dict[int, Any]) -> list[int]:
        """Positions the victim appended while no trainer lived (in append order)."""
        assert self.victim is not None
        mine = sorted(p for p, e in entries.items() if (e.host, int(e.incarnation)) == self.victim)
        return mine[self.appended_before :]


def test_pool_under_a_seeded_storm(tmp_path: Path) -> None:
    rounds = int(os.environ.get("YETO_NC_E2E_ROUNDS", "120"))
    storm = json.loads((EXAMPLE / "storm.json").read_text())
    # evictions after 40-120 groups of a node (the example's 150-450 suit 400 rounds)
    storm.update(evict_after_progress=[40, 120])
    run_dir = tmp_path / "nc"
    hold = EvictWhileTrainerStopped(run_dir)
    with Marketplace(storm, work_dir=tmp_path / "sim", progress=hold) as market:
        hold.market = market
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
    # the held eviction: every group its node appended after the trainer froze was fenced
    print("evicted while no trainer lived:", hold.victim, "after", hold.appended_before)
    assert hold.victim is not None, "no eviction came while the trainer was stopped"
    held = hold.held_groups(entries)
    assert held and set(held) <= skipped_fenced, (hold.victim, held, sorted(skipped_fenced))
    assert s["groups_skipped"].get("fenced_incarnation", 0) == len(skipped_fenced - set(trained))
    for pos in skipped_fenced:
        assert (entries[pos].host, int(entries[pos].incarnation)) in fence_set
    assert not skipped_fenced & set(trained)
    # the dashboard's pool view of this run agrees with the head's stream and the trainer
    try:
        from yeto_dashboard.model import build, snapshot
        from yeto_dashboard.source import open_run
    except ImportError:  # the dashboard plugin is not installed
        pass
    else:
        view = build(snapshot(open_run(str(run_dir))))["pool"]
        assert {(f["island"], f["incarnation"]) for f in view["fenced"]} == fence_set
        assert view["counts"]["replaced_early"] == len(promoted), view["counts"]
        assert view["counts"]["evicted"] + view["counts"]["expired"] >= len(main_fences)
        assert view["counts"]["groups_fenced"] == s["groups_skipped"]["fenced_incarnation"]
        held_row = [f for f in view["fenced"] if (f["island"], f["incarnation"]) == hold.victim]
        assert held_row and held_row[0]["groups_skipped"] >= len(held), held_row
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
