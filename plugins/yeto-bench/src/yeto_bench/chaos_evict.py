"""``yeto bench chaos --faults evict``: sampler nodes on a (simulated) GPU marketplace are
evicted while real runs go on; the same invariants as every chaos run, plus the pool's.

Each run is the chaos run (:func:`yeto_bench.chaos.chaos_config`) with its sampler
islands on the ``nc`` provider and the store dispenser. The bench starts the
marketplace simulator (``python -m yeto_nc.testing``, a subprocess: the bench
imports no adapter) with a seeded storm whose evictions are driven by each
node's progress (the groups it appended, read from the run's buffer index), with
and without notice, plus refused requests and refused renewals (expiries). Runs
follow each other until ``evictions`` evictions happened. Checked per run, as
every chaos run (:func:`yeto_bench.chaos.check_run`): 0 groups lost, 0 trained
twice; and from the store: 0 ranges held twice by the dispenser
(``dispense_report``), 0 dispense positions trained twice, every lost
incarnation fenced, every lease released (the simulator's counts).
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The storm of an evict run (the simulator's scenario keys, see ``yeto_nc.testing``).
STORM: dict[str, Any] = {
    "offers": [
        {
            "id": "sim-a",
            "gpu": "A10",
            "gpus": 1,
            "region": "eu",
            "usd_per_hour": 0.9,
            "available": 4,
        },
        {
            "id": "sim-b",
            "gpu": "L4",
            "gpus": 1,
            "region": "us",
            "usd_per_hour": 0.7,
            "available": 2,
        },
    ],
    "start_delay_s": 0.2,
    "refuse_p": 0.15,
    "evict_p": 0.9,
    "evict_after_s": [0, 0],
    "evict_after_progress": [2, 8],
    "notice_p": 0.5,
    "grace_s": [0.5, 2.0],
    "renew_refuse_p": 0.2,
}

BACKLOG_CAP = 64

POOL = (
    'provider = "nc"\n'
    "provider_options = { max_usd_per_hour = 1.0, max_nodes = 4, lease_s = 30.0, "
    "renew_before_s = 20.0, launch_timeout_s = 60.0 }\n"
)


def evict_config(toml: str) -> str:
    """The chaos run's TOML with its samplers on the ``nc`` provider and the store dispenser."""
    # backlog_cap 64, not the chaos run's 16: fenced groups count in the backlog until the
    # trainer commits past them, and a round of 4 needs 4 trainable groups; with 16, a
    # few evictions filled the cap with fenced groups, the samplers waited on it and the
    # trainer on them (found by this bench; see docs/nc.md)
    out, n = re.subn(
        r"(?m)^backlog_cap = .*\n", lambda m: f"backlog_cap = {BACKLOG_CAP}\n" + POOL, toml, count=1
    )
    if n != 1:
        raise ValueError("the chaos run config has no [[samplers]] backlog_cap line")
    return out + '\n[dispenser]\nkind = "store"\n'


class Simulator:
    """The marketplace simulator as a subprocess; :meth:`stop` returns its final counts."""

    def __init__(self, run_dir: Path, storm: dict[str, Any]) -> None:
        scenario = run_dir / "storm.json"
        scenario.write_text(json.dumps(storm))
        self.log = open(run_dir / "marketplace.log", "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "yeto_nc.testing",
                str(scenario),
                "--store",
                str(run_dir / "store"),
                "--work-dir",
                str(run_dir / "nodes"),
            ],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("YETO_NC_URL="):
            self.proc.kill()
            raise RuntimeError(
                f"the marketplace simulator did not start (is yeto-nc installed?): {line!r}; "
                f"see {run_dir / 'marketplace.log'}"
            )
        self.url = line.split("=", 1)[1]

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        self.log.close()
        for line in reversed(out.strip().splitlines()):
            try:
                return dict(json.loads(line))
            except ValueError:
                continue
        return {}


def pool_checks(run_dir: Path) -> dict[str, Any]:
    """The pool's invariants from the store: fences, dispenser holds, dispense positions."""
    from yeto_core.buffer.dispenser import dispense_report
    from yeto_core.buffer.sample_buffer import open_buffer
    from yeto_core.events.stream import read_events
    from yeto_core.plugins import get_plugins

    store = get_plugins().open_store(str(run_dir / "store"))
    head = read_events(store, "head")
    rep = dispense_report(store)
    buf = open_buffer(store, read_only=True)
    try:
        gid = {int(e.position): e.group_id for e in buf.entries(0)}
    finally:
        buf.close()
    trained: list[int] = []
    fenced_skips = 0
    for e in read_events(store, "trainer"):
        if e.kind == "round_trained":
            trained.extend(int(p) for p in e.data.get("positions", ()))
            fenced_skips += len(e.data.get("skipped", {}).get("fenced_incarnation", ()))
    dispensed = [gid[p] for p in trained if p in gid]
    return {
        "fenced_incarnations": sum(1 for e in head if e.kind == "sampler_fenced"),
        "replaced_early": sum(1 for e in head if e.kind == "sampler_promoted"),
        "fenced_groups_skipped": fenced_skips,
        "dispense_double_holds": rep["double_holds"],
        "dispense_redispensed": rep["redispensed"],
        "dispense_positions_trained_twice": len(dispensed) - len(set(dispensed)),
    }


def run_evict_campaign(
    *,
    evictions: int,
    seed: int,
    work_dir: Path,
    base_dir: Path,
    total_rounds: int,
    replay: bool = True,
    max_runs: int = 20,
    run_deadline_s: float = 900.0,
) -> dict[str, Any]:
    """Runs under eviction storms until ``evictions`` evictions happened; the JSON report."""
    from yeto_bench.chaos import ChaosRun, campaign_report, chaos_config, check_run

    results: list[dict[str, Any]] = []
    evicted = 0
    i = 0
    while evicted < evictions and i < max_runs:
        run_dir = work_dir / f"evict-{i:03d}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.toml").write_text(
            evict_config(
                chaos_config(run_dir, base_dir=base_dir, seed=seed + i, total_rounds=total_rounds)
            )
        )
        market = Simulator(run_dir, {**STORM, "seed": seed + i})
        try:
            outcome = ChaosRun(
                run_dir,
                rng=random.Random(seed + i),
                kills=0,
                gap_s=(1.0, 1.0),
                max_heads=3,
                deadline_s=run_deadline_s,
                env={"YETO_NC_URL": market.url},
            ).run()
        finally:
            sim = market.stop()
        counts = sim.get("counts", {})
        checks = check_run(run_dir, replay=replay)
        pool = pool_checks(run_dir)
        evicted += int(counts.get("evicted", 0))
        results.append({"run": run_dir.name, **outcome, **checks, "marketplace": counts, **pool})
        i += 1
    report = campaign_report(results, seed=seed, kills=0, replay=replay)
    market_total: dict[str, int] = {}
    for r in results:
        for k, v in r["marketplace"].items():
            market_total[k] = market_total.get(k, 0) + int(v)
    report["faults"] = {
        **report.get("faults", {}),
        "evict": {
            "evictions_requested": evictions,
            "evictions": market_total.get("evicted", 0),
            "evicted_without_notice": market_total.get("evicted_without_notice", 0),
            "expired": market_total.get("expired", 0),
            "refused": market_total.get("refused", 0),
            "leases": market_total.get("leases", 0),
            "fenced_incarnations": sum(r["fenced_incarnations"] for r in results),
            "replaced_early": sum(r["replaced_early"] for r in results),
            "fenced_groups_skipped": sum(r["fenced_groups_skipped"] for r in results),
            "dispense_double_holds": sum(r["dispense_double_holds"] for r in results),
            "dispense_positions_trained_twice": sum(
                r["dispense_positions_trained_twice"] for r in results
            ),
        },
    }
    ev = report["faults"]["evict"]
    report["ok"] = bool(
        report["ok"]
        and ev["evictions"] >= evictions
        and ev["dispense_double_holds"] == 0
        and ev["dispense_positions_trained_twice"] == 0
    )
    return report
