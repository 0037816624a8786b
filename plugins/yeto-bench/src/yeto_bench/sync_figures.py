"""The figures of ``yeto bench sync`` from what its runs left: no processes, no clock.

Everything here reads plain data (event dicts ``{"kind", "time", "data"}``, the store
wrapper's byte-log lines ``{"op", "key", "bytes"}``) so the accounting is tested on
its own (tests/bench/test_bench_sync.py):

- :func:`bytes_moved`: the bodies under ``sync/`` and ``releases/`` each process read
  or wrote, by what they are (deltas up and down, merged states up and down, the
  syncer's control objects, releases), in all and per committed outer step;
- :func:`sync_wait`: per trainer island, the seconds it waited for outer steps
  (``sync_timing``'s ``sync_wait_seconds``) and their share of its active time (its
  stream's first event to its last);
- :func:`case_figures` / :func:`assemble`: one case's figures, and the report with
  each case's time to target against the single island's of the same latency;
- :func:`fault_ok`: whether the fault case passed its checks;
- :func:`merge_seeds`: one case run with several seeds, as one case (the median time).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping
from typing import Any, Optional

#: ``sync/<8 digits>/<name>``: an outer step's object
_STEP_KEY = re.compile(r"^sync/(\d{8})/(.+)$")
#: what a ``bytes_moved`` report sums, in this order
KINDS = ("delta_up", "delta_down", "merged_up", "merged_down", "sync_control", "release")
_WRITES = ("put", "put_if_absent", "put_if_match")


def kind_of(op: str, key: str) -> str:
    """What a logged body is: ``delta_up``/``delta_down`` (an island's delta written /
    read), ``merged_up``/``merged_down`` (a merged state, with its momentum, written /
    read), ``sync_control`` (the tape, commits, deals, horizons, ``HEAD.json``, notes of
    duplicates), ``release`` (a release's files and records)."""
    if key.startswith("releases/"):
        return "release"
    m = _STEP_KEY.match(key)
    up = op in _WRITES
    if m is not None:
        name = m.group(2)
        if name.startswith("_merged."):
            return "merged_up" if up else "merged_down"
        if name.endswith(".safetensors") and not name.startswith("_"):
            return "delta_up" if up else "delta_down"
    return "sync_control"


def bytes_moved(lines: Iterable[Mapping[str, Any]], outer_steps: int) -> dict[str, Any]:
    """Bytes of every kind (:data:`KINDS`) in all (``total``), and per committed outer step
    (``per_outer_step``, None without one): the objects of steps 1 to ``outer_steps``
    only (not step 0, the base, nor a step the run stopped before committing), the
    syncer's other control objects and the releases over all of them;
    ``sync_per_outer_step`` adds the kinds that syncing moves (all but ``release``)."""
    total = dict.fromkeys(KINDS, 0)
    counted = dict.fromkeys(KINDS, 0)
    for line in lines:
        key = str(line.get("key", ""))
        kind = kind_of(str(line.get("op", "")), key)
        size = int(line["bytes"])
        total[kind] += size
        m = _STEP_KEY.match(key)
        if m is None or 1 <= int(m.group(1)) <= outer_steps:
            counted[kind] += size
    per: Optional[dict[str, float]] = None
    sync_per: Optional[float] = None
    if outer_steps > 0:
        per = {k: round(v / outer_steps, 1) for k, v in counted.items()}
        sync_per = round(sum(v for k, v in counted.items() if k != "release") / outer_steps, 1)
    return {"total": total, "per_outer_step": per, "sync_per_outer_step": sync_per}


def sync_wait(streams: Mapping[str, list[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per island with ``sync_timing`` events: ``outer_steps`` (its waits),
    ``sync_wait_s`` (their sum), ``active_s`` (its first event to its last) and
    ``share`` (the one over the other), ``median_wait_s``."""
    out: dict[str, dict[str, Any]] = {}
    for island, events in sorted(streams.items()):
        waits = [
            float(e["data"]["sync_wait_seconds"]) for e in events if e["kind"] == "sync_timing"
        ]
        if not waits:
            continue
        times = [float(e["time"]) for e in events]
        active = max(times) - min(times)
        ordered = sorted(waits)
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        out[island] = {
            "outer_steps": len(waits),
            "sync_wait_s": round(sum(waits), 2),
            "active_s": round(active, 2),
            "share": round(sum(waits) / active, 3) if active > 0 else None,
            "median_wait_s": round(median, 3),
        }
    return out


def case_figures(
    *,
    trainer_events: list[Mapping[str, Any]],
    t0: Optional[float],
    target: float,
    byte_lines: Iterable[Mapping[str, Any]],
    island_streams: Mapping[str, list[Mapping[str, Any]]],
) -> dict[str, Any]:
    """One run's figures from its trainer stream (``round_trained``, ``pool_outer_step``;
    for several islands the head's), ``t0`` (its first group's time), the target, the
    byte log and the trainer islands' streams. Time to target is
    :func:`yeto_bench.e2e.time_to_target`'s (the rolling mean of 64 groups)."""
    from yeto_bench.e2e import time_to_target

    trained = [e for e in trainer_events if e["kind"] == "round_trained"]
    rounds = [(float(e["time"]), [float(r) for r in e["data"].get("rewards", ())]) for e in trained]
    steps = [float(e["time"]) for e in trainer_events if e["kind"] == "pool_outer_step"]
    hit = None
    if t0 is not None:
        hit, _ = time_to_target(rounds, target=target, t0=t0)
    until = None if hit is None or t0 is None else t0 + hit + 1e-6
    real = [e for e in trained if e["data"].get("positions")]
    per_island: dict[str, int] = {}
    for e in real:
        island = e["data"].get("island")
        if island is not None:
            per_island[str(island)] = per_island.get(str(island), 0) + 1
    return {
        "time_to_target_s": hit,
        "rounds_to_target": None if until is None else sum(float(e["time"]) <= until for e in real),
        "outer_steps_to_target": None if until is None else sum(t <= until for t in steps),
        "rounds_trained": len(real),
        "rounds_per_island": per_island or None,
        "outer_steps": len(steps),
        "positions_trained_twice": trained_twice(e["data"] for e in real),
        "bytes": bytes_moved(byte_lines, len(steps)),
        "sync_wait": sync_wait(island_streams),
    }


def case_name(preset: str, islands: int, latency_ms: float) -> str:
    """``single@20ms``, ``strict-2@200ms``: a case's key in the report."""
    lat = f"{latency_ms:g}ms"
    return f"single@{lat}" if islands == 1 else f"{preset}-{islands}@{lat}"


def assemble(
    cases: Mapping[str, Mapping[str, Any]],
    *,
    faults: Mapping[str, Mapping[str, Any]],
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """The report: every case with ``vs_single`` (its time to target over the single
    island's at the same latency: < 1 is faster; None when either missed the target),
    every fault case with its ``ok`` (:func:`fault_ok`) and its ``vs_single``, the
    ``settings``, and ``ok`` (every case reached the target and every fault case
    passed)."""

    def with_ratio(name: str, figures: Mapping[str, Any]) -> dict[str, Any]:
        latency = name.split("@", 1)[1].split("+", 1)[0]
        single = cases.get(f"single@{latency}", {}).get("time_to_target_s")
        mine = figures.get("time_to_target_s")
        ratio = round(mine / single, 3) if mine is not None and single else None
        return {**figures, "vs_single": ratio}

    out = {name: with_ratio(name, figures) for name, figures in cases.items()}
    fault_out = {name: {**with_ratio(name, f), "ok": fault_ok(f)} for name, f in faults.items()}
    reached = all(c.get("time_to_target_s") is not None for c in cases.values())
    return {
        "cases": out,
        "faults": fault_out,
        "settings": dict(settings),
        "all_reached_target": reached,
        "ok": reached and all(f["ok"] for f in fault_out.values()),
    }


def fault_ok(fault: Mapping[str, Any]) -> bool:
    """The fault case passed: it reached the target, the island was killed (its process
    gone) and left the roster, ``yeto ledger check`` and ``yeto sync replay`` exited 0,
    and no position was trained twice; with ``late-join``, the replacement joined the
    roster and trained rounds."""
    return bool(
        fault.get("time_to_target_s") is not None
        and fault.get("killed") is not None
        and fault.get("killed_left_roster")
        and fault.get("ledger_check_exit") == 0
        and fault.get("sync_replay_exit") == 0
        and fault.get("positions_trained_twice") == 0
        and (not fault.get("late_join_delay_s") or _joined_and_trained(fault))
    )


def _joined_and_trained(fault: Mapping[str, Any]) -> bool:
    """The late-join case: the killed island's replacement joined and trained rounds."""
    r = fault.get("replacement") or {}
    return r.get("joined_at_outer_step") is not None and int(r.get("rounds_trained") or 0) > 0


def trained_twice(trained: Iterable[Mapping[str, Any]]) -> int:
    """Positions that two ``round_trained`` rounds both trained."""
    seen: set[int] = set()
    twice = 0
    for t in trained:
        for p in t.get("positions") or ():
            if int(p) in seen:
                twice += 1
            seen.add(int(p))
    return twice


def merge_seeds(per_seed: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """One case run once per seed, as one case: ``time_to_target_s`` is the median over
    the seeds, a seed that missed the target counting as longer than any (None when the
    median is such a miss); ``times_to_target_s`` each seed's (None: missed),
    ``reached`` the seeds that reached it, ``rounds_to_target`` the median of those that
    did; the checks are the worst seed's (the largest exit code, the sum of the positions
    trained twice; a fault case's facts are true only when true for every seed); every
    seed's own figures under ``per_seed``."""
    if not per_seed:
        raise ValueError("no seeds")
    seeds = sorted(per_seed)
    times = [per_seed[s].get("time_to_target_s") for s in seeds]
    finite = [math.inf if t is None else float(t) for t in times]
    median = statistics.median(finite)
    rounds = [int(r) for r in (per_seed[s].get("rounds_to_target") for s in seeds) if r is not None]
    out: dict[str, Any] = {
        "time_to_target_s": None if math.isinf(median) else round(median, 3),
        "times_to_target_s": {str(s): t for s, t in zip(seeds, times, strict=True)},
        "reached": f"{sum(t is not None for t in times)}/{len(seeds)}",
        "rounds_to_target": statistics.median(rounds) if rounds else None,
        "per_seed": {str(s): dict(per_seed[s]) for s in seeds},
    }
    for key in ("head_exit_code", "ledger_check_exit", "sync_replay_exit"):
        codes = [per_seed[s][key] for s in seeds if per_seed[s].get(key) is not None]
        if codes:
            out[key] = max(codes, key=lambda c: (c != 0, abs(c)))
    twice = [per_seed[s].get("positions_trained_twice") for s in seeds]
    if any(t is not None for t in twice):
        out["positions_trained_twice"] = sum(int(t or 0) for t in twice)
    for key in ("killed", "killed_left_roster", "replacement", "late_join_delay_s"):
        values = [per_seed[s].get(key) for s in seeds]
        if any(v is not None for v in values):
            out[key] = values[0] if all(values) else None
    return out
