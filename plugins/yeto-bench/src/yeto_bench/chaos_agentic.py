"""``yeto bench chaos --faults agentic``: sampler islands SIGKILLed mid-trial, with their
trials' sandboxes alive; what they left must be swept and nothing lost or trained twice.

Each run is the calculator environment of the agentic example (``[task] environment =
"calculator"``, two ``hf`` sampler islands, the ``torch`` trainer under S1, the store
dispenser) with its tool in real ``bwrap`` sandboxes, over ``rows`` questions to the
data end. The sandboxes do not die with their island (``options.die_with_parent =
false``): as on a node whose sandboxes live in containers, a killed island's
sandboxes keep running until the island's next start sweeps them
(``[sandbox] sweep_at_start``).

The bench watches the host's state dir (``<state_dir>/bwrap/*.json``: every sandbox
with its labels and pids) and SIGKILLs a sampler island only while sandboxes it
started are running (its trials are mid-way). Only the island's own pid (read from the
run's ``islands/*.json``) is signalled, never a group. After the run it checks:

- ``sandboxes_left_running``: sandboxes the bench saw (by label) whose PID 1 or
  ``bwrap`` process still runs, with the process that started them dead (a dead
  incarnation's); ``bwrap_processes_of_dead_incarnations``: the same from a process
  listing (``bwrap`` processes of this run's sandboxes whose starter is dead);
- ``orphans_at_kills``: the killed islands' sandboxes still running right after each
  kill; ``orphans_removed``: what the ``sandbox_orphans_removed`` events of the
  restarted islands say they removed (at least one such event), and
  ``orphans_removed_at_run_end``: what the head's sweep at the run's end removed (an
  island relaunched just before the data end is released before its sweep); together
  at least the orphans, or a sweep missed some;
- ``islands_relaunched_by_the_head``: the head saw each killed island exit
  (``sampler_exited``) and relaunched it, within the run (an operator's restart of a
  stalled run does not count);
- the ledger and the lineage (:func:`yeto_bench.chaos.check_run`): every group trained
  once, or skipped with its reason (lost trials skip their group with theirs).

With ``evictions`` (``--evictions N``) the runs' sampler islands are nodes of the ``nc``
pool on the marketplace simulator, evicted mid-trial with and without notice
(:mod:`yeto_bench.agentic_evict`); the report's ``faults.agentic`` then also counts the
evictions, the evicted incarnations' orphans and who swept them (their replacement,
or the head at the run's end), what the replacements kept of a running predecessor,
the fences, and the trials lost by reason.

What the run left running is removed afterwards (by its label entry: its PID 1 only).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

#: the short profile's base (``yeto_bench.agentic_base``), as the agentic integration test
BASE = Path("runs/base/agentic-calc-smoke")


def agentic_chaos_config(
    run_dir: Path,
    *,
    base_dir: Path,
    data: Path,
    seed: int,
    state_dir: Path,
    sweep: bool = True,
    wall_clock_s: int = 600,
) -> str:
    """The TOML of one agentic chaos run (see the module docstring)."""
    from yeto_core.testing.dataset_run import dataset_run_toml

    sandbox = (
        f'[sandbox]\nhost = "bwrap"\nstate_dir = "{state_dir}"\nwall_s = 10\n'
        f"sweep_at_start = {'true' if sweep else 'false'}\n"
        "options = { die_with_parent = false }\n"
    )
    text = dataset_run_toml(
        name="chaos-agentic",
        run_dir=run_dir,
        base_dir=base_dir,
        task_options={"path": str(data / "train.jsonl"), "id_field": "id", "epochs": 1,
                      "reward": "exact", "shuffle": True, "seed": seed},
        task_extra={"environment": "calculator",
                    "environment_options": {"max_tool_calls": 1, "max_turns": 3}},
        sampler_count=2,
        group_size=4,
        groups_per_round=4,
        total_rounds=1000,
        wall_clock_s=wall_clock_s,
        extra=sandbox,
    )  # fmt: skip
    text = text.replace("max_new_tokens = 6", "max_new_tokens = 12")
    return text.replace("prompts_per_call = 8", "prompts_per_call = 2")


class SandboxWatch:
    """Every sandbox of a ``bwrap`` state dir seen while it is polled (labels, pids)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "bwrap"
        self.seen: dict[str, dict[str, Any]] = {}

    def poll(self) -> None:
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else ():
            if path.stem in self.seen:
                continue
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # removed while read
            self.seen[path.stem] = entry

    def running_of(self, owner_pid: int) -> list[dict[str, Any]]:
        """The running sandboxes started by the process ``owner_pid``."""
        self.poll()
        return [e for e in self.seen.values() if e["owner_pid"] == owner_pid and _running(e)]

    def left_running(self) -> list[dict[str, Any]]:
        """Running sandboxes whose starter is dead (a dead incarnation's)."""
        self.poll()
        return [e for e in self.seen.values() if _running(e) and not _owner_alive(e)]


def _running(entry: dict[str, Any]) -> bool:
    from yeto_core.sandbox import procs

    return procs.alive(entry["init_pid"], entry["init_start"]) or procs.alive(
        entry["bwrap_pid"], entry["bwrap_start"]
    )


def _owner_alive(entry: dict[str, Any]) -> bool:
    from yeto_core.sandbox import procs

    return procs.alive(entry["owner_pid"], entry.get("owner_start"))


def bwrap_processes() -> list[tuple[int, Optional[int]]]:
    """(pid, start time) of every ``bwrap`` process of this machine (a ``/proc`` listing)."""
    from yeto_core.sandbox import procs

    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            exe = os.path.basename(os.readlink(d / "exe"))
        except OSError:
            continue
        if exe == "bwrap":
            out.append((int(d.name), procs.start_time(int(d.name))))
    return out


def _wait_dead(pid: int, timeout_s: float = 10.0) -> None:
    from yeto_bench.chaos import _alive

    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def kill_mid_trial(
    run_dir: Path, head_pid: int, watch: SandboxWatch, rng: random.Random
) -> Optional[dict[str, Any]]:
    """SIGKILL one live sampler island that has sandboxes running; its record, or None
    when no island has one now. The islands are the run's island records (the local
    provider) or, where it has none (the ``nc`` pool's nodes), the live starters of the
    sandboxes seen."""
    from yeto_bench.chaos import live_processes

    pids = {pid for role, pid in live_processes(run_dir, head_pid) if role == "sampler"}
    watch.poll()
    pids |= {int(e["owner_pid"]) for e in watch.seen.values() if _owner_alive(e)}
    candidates = []
    for pid in sorted(pids):
        running = watch.running_of(pid)
        if running:
            candidates.append((pid, running))
    if not candidates:
        return None
    pid, running = rng.choice(candidates)
    try:
        os.kill(pid, signal.SIGKILL)  # the island's own pid, read from its record
    except ProcessLookupError:
        return None
    _wait_dead(pid)
    # what the dead island left running: its orphans (a trial that ended just before the
    # kill removed its own sandbox)
    orphans = [e for e in running if _running(e)]
    labels = running[0]["labels"]
    return {
        "role": "sampler",
        "pid": pid,
        "island": labels.get("island"),
        "incarnation": labels.get("incarnation"),
        "sandboxes_running_at_kill": len(running),
        "orphans": sorted(e["id"] for e in orphans),
    }


def _appended(run_dir: Path) -> int:
    """Groups the run appended so far (the head's ``status.json``; 0 before its first)."""
    try:
        return int(json.loads((run_dir / "status.json").read_text()).get("groups_appended") or 0)
    except (OSError, ValueError, TypeError):
        return 0


def run_one(
    run_dir: Path,
    *,
    kills: int,
    kill_before: int,
    rng: random.Random,
    state_dir: Path,
    gap_s: tuple[float, float],
    deadline_s: float,
    max_heads: int = 3,
    evictions: int = 0,
    market_url: str = "",
    notice_first: bool = True,
    evict_before: Optional[int] = None,
) -> dict[str, Any]:
    """One agentic run under ``kills`` mid-trial SIGKILLs and ``evictions`` mid-trial
    evictions of its ``nc`` nodes (``market_url``: the simulator), restarted as an
    operator would; faults only while fewer than ``kill_before`` groups are appended (a
    relaunched or replacement island then has time to start and sweep before the data
    end); evictions while fewer than ``evict_before`` (default ``kill_before``). Faults
    alternate when both are asked; evictions alternate with and without notice."""
    from yeto_bench.agentic_evict import EVICT_GAP_S, evict_mid_trial
    from yeto_bench.chaos import YETO

    watch = SandboxWatch(state_dir)
    kill_records: list[dict[str, Any]] = []
    evict_records: list[dict[str, Any]] = []
    evict_failed: list[dict[str, Any]] = []  # no trial of the node ran in the bounded wait
    notices: list[dict[str, Any]] = []  # every notice given (one not followed included)
    env = {**os.environ, "YETO_NC_URL": market_url} if market_url else None
    codes: list[int] = []
    completed = False
    t0 = time.monotonic()
    heads = 0
    while heads < max_heads and time.monotonic() - t0 < deadline_s:
        log = open(run_dir / f"head-{heads}.log", "wb")
        cmd = [*YETO, "run", "up", str(run_dir / "run.toml"), "--run-dir", str(run_dir)]
        head = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        log.close()
        heads += 1
        next_kill = time.monotonic() + rng.uniform(*gap_s)
        while head.poll() is None and time.monotonic() - t0 < deadline_s:
            watch.poll()
            kill_due = len(kill_records) < kills
            evict_due = len(evict_records) + len(evict_failed) < evictions
            if (kill_due or evict_due) and time.monotonic() >= next_kill:
                appended = _appended(run_dir)
                kill_due = kill_due and appended < kill_before
                evict_due = evict_due and appended < (evict_before or kill_before)
            else:
                kill_due = evict_due = False
            if kill_due or evict_due:
                # alternate: an eviction when the kills are ahead (or spent)
                evict = evict_due and (not kill_due or len(evict_records) < len(kill_records))
                if evict:
                    rec = evict_mid_trial(
                        run_dir,
                        market_url,
                        watch,
                        rng,
                        notice=(len(evict_records) % 2 == 0) == notice_first,
                        alive=lambda h=head: h.poll() is None,
                        notices=notices,
                    )
                else:
                    rec = kill_mid_trial(run_dir, head.pid, watch, rng)
                if rec is not None:
                    rec["at_s"] = round(time.monotonic() - t0, 2)
                    failed = evict and "failed" in rec
                    (evict_failed if failed else evict_records if evict else kill_records).append(
                        rec
                    )
                    # after an eviction the next fault comes sooner: its wait for a
                    # trial (and for the standby's sweep) spaced it from the last one
                    gap = EVICT_GAP_S if evict else gap_s
                    next_kill = time.monotonic() + rng.uniform(*gap)
            time.sleep(0.02)
        if head.poll() is None:  # past the deadline: stop it cleanly
            head.send_signal(signal.SIGINT)
            try:
                head.wait(timeout=60)
            except subprocess.TimeoutExpired:
                head.kill()
                head.wait()
            break
        codes.append(int(head.returncode))
        if head.returncode == 0 and (run_dir / "FINISHED").exists():
            completed = True
            break
    return {
        "completed": completed,
        "head_exit_codes": codes,
        "heads_started": heads,
        "kills": kill_records,
        "evictions": evict_records,
        "evictions_failed": evict_failed,
        "notices": notices,
        "wall_s": round(time.monotonic() - t0, 1),
        "watch": watch,
    }


def sandbox_checks(run_dir: Path, watch: SandboxWatch, kill_records: list[dict[str, Any]]):
    """The sandbox checks of a finished run (see the module docstring)."""
    from yeto_core.events.stream import read_events
    from yeto_core.plugins import get_plugins

    left = watch.left_running()
    ours = {(e["bwrap_pid"], e["bwrap_start"]): e for e in watch.seen.values()}
    listed = [ours[p] for p in bwrap_processes() if p in ours and not _owner_alive(ours[p])]
    orphan_ids = {i for k in kill_records for i in k["orphans"]}
    store = get_plugins().open_store(str(run_dir / "store"))
    events = []
    for island in ("sampler-0", "sampler-1"):
        events += [e for e in read_events(store, island) if e.kind == "sandbox_orphans_removed"]
    head = read_events(store, "head")
    at_end = [e for e in head if e.kind == "sandbox_orphans_removed"]
    failed = sum(int(e.data.get("failed", 0)) for e in events + at_end)
    return {
        # the head saw each killed island exit and relaunched it (not an operator's restart)
        "islands_relaunched_by_the_head": sum(1 for e in head if e.kind == "sampler_exited"),
        "sandboxes_seen": len(watch.seen),
        "sandboxes_running_at_kills": sum(k["sandboxes_running_at_kill"] for k in kill_records),
        "orphans_at_kills": len(orphan_ids),
        "sandboxes_left_running": len(left),
        "sandboxes_left_running_labels": [e["labels"] for e in left],
        "orphans_left_running": sum(1 for e in left if e["id"] in orphan_ids),
        "bwrap_processes_of_dead_incarnations": len(listed),
        "orphans_removed_events": len(events),
        "orphans_removed": sum(int(e.data.get("removed", 0)) for e in events),
        "orphans_removed_at_run_end": sum(int(e.data.get("removed", 0)) for e in at_end),
        "orphans_removed_failed": failed,
    }


def remove_left(state_dir: Path, watch: SandboxWatch) -> int:
    """Remove what a run left running (each by its label entry); how many."""
    from yeto_core.sandbox.bwrap import BwrapSandboxes

    host = BwrapSandboxes(state_dir)
    n = 0
    for entry in watch.left_running():
        if (host.dir / f"{entry['id']}.json").exists():
            host.remove(entry["id"])
        else:  # its label entry is gone, the sandbox is not: its PID 1 ends the namespace
            from yeto_core.sandbox import procs

            if procs.alive(entry["init_pid"], entry["init_start"]):
                try:
                    os.kill(entry["init_pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        n += 1
    return n


def run_agentic_campaign(
    *,
    kills: int,
    runs: int,
    seed: int,
    work_dir: Path,
    base_dir: Path,
    rows: int = 48,
    replay: bool = True,
    sweep: bool = True,
    gap_s: tuple[float, float] = (2.0, 6.0),
    run_deadline_s: float = 600.0,
    evictions: int = 0,
) -> dict[str, Any]:
    """``kills`` mid-trial SIGKILLs of sampler islands and ``evictions`` mid-trial
    evictions of ``nc`` nodes over ``runs`` agentic runs; the JSON report (``sweep=False``
    turns the islands' sweeps off: the check must then fail)."""
    import math

    from yeto_bench.agentic_base import agentic_base, agentic_data
    from yeto_bench.agentic_evict import CALM, eviction_checks, pool_config
    from yeto_bench.chaos import campaign_report, check_run
    from yeto_bench.chaos_evict import Simulator, pool_checks
    from yeto_core.plugins import get_plugins

    t0 = time.monotonic()
    agentic_base(base_dir, work_dir / "base-data")
    base_s = round(time.monotonic() - t0, 1)
    rng = random.Random(seed)
    per_run = max(1, math.ceil(kills / max(1, runs)))
    evict_per_run = max(1, math.ceil(evictions / max(1, runs)))
    results: list[dict[str, Any]] = []
    left, evict_left = kills, evictions
    i = -1
    # a run that reaches its data end before its faults are spent hands them to the next
    while i + 1 < max(1, runs) or (
        (left > 0 or evict_left > 0) and i + 1 < runs + kills + evictions
    ):
        i += 1
        run_dir = (work_dir / f"agentic-{i:03d}").absolute()
        run_dir.mkdir(parents=True, exist_ok=True)
        data = agentic_data(run_dir / "data", train=rows, seed=seed + i)
        state = run_dir / "sandboxes"
        toml = agentic_chaos_config(
            run_dir, base_dir=base_dir.absolute(), data=data, seed=seed + i,
            state_dir=state, sweep=sweep,
        )  # fmt: skip
        market = None
        if evictions:
            toml = pool_config(toml)
            market = Simulator(run_dir, {**CALM, "seed": seed + i})
        (run_dir / "run.toml").write_text(toml)
        try:
            outcome = run_one(
                run_dir,
                kills=min(left, per_run),
                kill_before=max(1, (2 * rows) // 3),
                # a noticed node's standby runs already: its sweep needs no start time
                # (an eviction without notice late in the run leaves its orphans to the
                # head's sweep at the run's end, which the checks accept)
                evict_before=max(1, (5 * rows) // 6),
                rng=rng,
                state_dir=state,
                gap_s=gap_s,
                deadline_s=run_deadline_s,
                evictions=min(evict_left, evict_per_run),
                market_url=market.url if market else "",
                # the campaign's evictions alternate with and without notice across runs
                notice_first=(evictions - evict_left) % 2 == 0,
            )
            left -= len(outcome["kills"])
            evict_left -= len(outcome["evictions"]) + len(outcome["evictions_failed"])
            watch = outcome.pop("watch")
            sandboxes = sandbox_checks(run_dir, watch, outcome["kills"])
            if market is not None:
                store = get_plugins().open_store(str(run_dir / "store"))
                islands = ["sampler-0", "sampler-1"]
                sandboxes.update(eviction_checks(store, outcome["evictions"], islands))
                sandboxes.update(pool_checks(run_dir))
        finally:
            counts = market.stop().get("counts", {}) if market is not None else {}
        if market is not None:
            sandboxes["marketplace_evicted"] = int(counts.get("evicted", 0))
            sandboxes["marketplace_leases"] = int(counts.get("leases", 0))
        sandboxes["removed_by_the_bench"] = remove_left(state, watch)
        checks = check_run(run_dir, replay=replay)
        result = {"run": run_dir.name, **outcome, **checks, "sandboxes": sandboxes}
        (run_dir / "result.json").write_text(json.dumps(result, sort_keys=True, default=str))
        results.append(result)
    report = campaign_report(results, seed=seed, kills=kills, replay=replay)
    total: dict[str, Any] = {}
    for r in results:
        for k, v in r["sandboxes"].items():
            if isinstance(v, int):
                total[k] = total.get(k, 0) + v
            elif isinstance(v, list):  # handles: named with their run
                total.setdefault(k, []).extend(f"{r['run']}: {x}" for x in v)
            elif isinstance(v, dict) and k == "trials_lost_by_reason":
                merged = total.setdefault(k, {})
                for reason, n in v.items():
                    merged[reason] = merged.get(reason, 0) + int(n)
    ag = {"base_build_s": base_s, "rows": rows, "sweep_at_start": sweep, **total}
    ag["evictions_requested"] = evictions
    ag["notices_given"] = [f"{r['run']}: {n['handle']}" for r in results for n in r["notices"]]
    # why an eviction did not land mid-trial, said plainly (the campaign fails on any)
    ag["evictions_failed"] = [
        f"{r['run']}: {f['failed']}" for r in results for f in r.get("evictions_failed", ())
    ]
    if evictions and ag.get("evictions", 0) + len(ag["evictions_failed"]) < evictions:
        ag["evictions_failed"].append(
            f"{ag.get('evictions', 0)} of {evictions} evictions landed: the runs reached "
            "their data end first (more --rows or --runs)"
        )
    report.setdefault("faults", {})
    report["faults"]["agentic"] = ag
    report["ok"] = agentic_ok(report, ag, kills=kills, evictions=evictions)
    return report


def agentic_ok(report: dict[str, Any], ag: dict[str, Any], *, kills: int, evictions: int) -> bool:
    """Whether an agentic campaign passed (pure): the chaos checks of every run, each
    fault landed mid-trial, no sandbox of a dead incarnation left running (by label and
    in the process listing), every orphan swept; with evictions also: every evicted
    incarnation's orphans swept (by its replacement or, at the data end, by the head; at
    least one by a replacement), every eviction fenced, no trial of a live island lost
    its sandbox to a sweep (``sandbox_gone``), no dispense position trained twice."""
    ok = (
        report["ok"]
        and report["kills"] == kills
        and (kills == 0 or ag.get("orphans_at_kills", 0) > 0)  # kills landed mid-trial
        and ag.get("sandboxes_left_running", 0) == 0
        and ag.get("bwrap_processes_of_dead_incarnations", 0) == 0
        # swept by the restarted islands (the head's sweep at the run's end takes what an
        # island relaunched just before the end had no time to sweep)
        and ag.get("orphans_removed_events", 0) >= 1
        and ag.get("orphans_removed", 0) + ag.get("orphans_removed_at_run_end", 0)
        >= ag.get("orphans_at_kills", 0) + ag.get("orphans_at_evictions", 0)
        and ag.get("orphans_removed_failed", 0) == 0
        and ag.get("islands_relaunched_by_the_head", 0) >= report["kills"]
    )
    if evictions:
        ok = ok and (
            ag.get("evictions", 0) == evictions
            and not ag.get("evictions_failed")
            and ag.get("orphans_at_evictions", 0) > 0  # evictions landed mid-trial
            and ag.get("evicted_not_swept", 1) == 0
            and ag.get("evicted_swept_by_replacement", 0) >= 1
            and ag.get("evicted_swept_by_their_running_standby", 0)
            == ag.get("evicted_with_a_running_standby", 0)
            and ag.get("sampler_fenced", 0) >= evictions
            # each noticed node replaced early; no early replacement without its cause
            and ag.get("noticed_evictions_replaced_early", 0) == ag.get("evictions_with_notice", 0)
            and not ag.get("sampler_replace_early_without_cause")
            and ag.get("marketplace_evicted", 0) == ag.get("evictions", 0)
            and ag.get("trials_lost_by_reason", {}).get("sandbox_gone", 0) == 0
            and ag.get("dispense_positions_trained_twice", 1) == 0
            and ag.get("dispense_double_holds", 1) == 0
        )
    return bool(ok)
