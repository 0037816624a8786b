"""NC nodes evicted mid-trial in ``yeto bench chaos --faults agentic --evictions N``.

With evictions, each agentic chaos run (:mod:`yeto_bench.chaos_agentic`) puts its two
sampler islands on the ``nc`` provider against the marketplace simulator
(``python -m yeto_nc.testing``, a subprocess: the bench imports no adapter) with a calm
storm: the bench evicts, nothing else does. The ``bwrap`` host does not tell the sweeps
whether a sandbox's starter runs (``options.track_owner = false``, as a sandbox host
serving nodes on other machines cannot): the sweeps decide by the head's fences and
gone records alone, the rule docs/agentic.md states for a replacement.

An eviction picks a node whose trials' sandboxes run (by label, from the host's state
dir) and evicts its lease through the simulator's on-demand route, in turn (the first
with notice: it takes longest):

- **without notice**: the node's process group is killed at the simulator's next tick;
  the head sees the lease evicted, fences the incarnation and launches its replacement
  (the next incarnation of the same shard), whose sweep at start removes what the
  fenced predecessor left;
- **with notice**: a long notice first; the head launches the replacement early (a
  standby) while the node keeps sampling; once the standby runs trials of its own (it
  swept at its start and had to keep the predecessor's running sandboxes: unfenced, not
  gone), the bench evicts the node while a trial of it runs; the head fences it and the
  standby's next sweep (``[sandbox] sweep_again_s``) removes its sandboxes.

Each eviction's record names the incarnation and its orphans: its sandboxes still
running once its process is dead.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

#: the simulator's scenario: no eviction, refusal or expiry but the bench's
CALM: dict[str, Any] = {
    "offers": [
        {
            "id": "sim-a",
            "gpu": "A10",
            "gpus": 1,
            "region": "eu",
            "usd_per_hour": 0.9,
            "available": 8,
        }
    ],
    "start_delay_s": 0.2,
}
#: the ``nc`` provider of the runs' [[samplers]] table
POOL = (
    'provider = "nc"\n'
    "provider_options = { max_usd_per_hour = 1.0, max_nodes = 4, lease_s = 3600.0, "
    "renew_before_s = 120.0, launch_timeout_s = 60.0 }\n"
)
#: the grace of an eviction with notice (the bench evicts before it ends)
NOTICE_S = 600.0
#: how long an eviction with notice waits for the standby's own trials
STANDBY_WAIT_S = 45.0
#: how long it waits for a trial of the node to begin
TRIAL_WAIT_S = 20.0
#: a sandbox started this recently is early in its trial: the eviction lands before it ends
FRESH_S = 0.15
#: how long, after an eviction with notice, the bench waits for the running standby to
#: remove what the node left before its next fault (one that killed the standby first
#: would leave that sweep to the next incarnation)
SWEPT_WAIT_S = 15.0


def pool_config(toml: str) -> str:
    """An agentic chaos run's TOML with its samplers on the ``nc`` provider and the
    sandbox host's starter check off (see the module docstring)."""
    head, sep, tail = toml.partition("[[samplers]]\n")
    if not sep or "count = " not in tail:
        raise ValueError("the agentic chaos config has no [[samplers]] table with a count")
    out = head + sep + POOL + tail
    before = "options = { die_with_parent = false }\n"
    if before not in out:
        raise ValueError("the agentic chaos config has no [sandbox] options line")
    return out.replace(
        before,
        "sweep_again_s = 1.0\noptions = { die_with_parent = false, track_owner = false }\n",
    )


def lease_of(run_dir: Path, island: str, incarnation: int) -> Optional[str]:
    """The lease id of an island incarnation (the head's ``nc/leases`` records)."""
    for path in sorted((run_dir / "nc" / "leases").glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("island") == island and int(rec.get("incarnation", -2)) == incarnation:
            return rec.get("lease_id")
    return None


def post_evict(url: str, lease_id: str, grace_s: float) -> tuple[int, dict[str, Any]]:
    """``POST /sim/leases/<id>/evict``: (HTTP status, body)."""
    req = urllib.request.Request(
        f"{url}/sim/leases/{lease_id}/evict",
        data=json.dumps({"grace_s": grace_s}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _incarnations(watch: Any) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Live island incarnations (starter alive) -> their running sandboxes."""
    from yeto_bench.chaos_agentic import _owner_alive, _running

    watch.poll()
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for e in watch.seen.values():
        if _running(e) and _owner_alive(e):
            key = (str(e["labels"].get("island")), int(e["labels"].get("incarnation", -1)))
            out.setdefault(key, []).append(e)
    return out


def _wait(cond: Callable[[], bool], timeout_s: float, alive: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def evict_mid_trial(
    run_dir: Path,
    url: str,
    watch: Any,
    rng: Any,
    *,
    notice: bool,
    alive: Callable[[], bool],
) -> Optional[dict[str, Any]]:
    """Evict one node while a trial of it runs (see the module docstring); its record,
    or None when no node has one now or its lease is not known yet."""
    from yeto_bench.chaos import _alive
    from yeto_bench.chaos_agentic import _running, _wait_dead

    live = _incarnations(watch)
    keys = [k for k in sorted(live) if lease_of(run_dir, *k)]
    if not keys:
        return None
    island, inc = rng.choice(keys)
    lease = lease_of(run_dir, island, inc)
    assert lease is not None
    pid = int(live[(island, inc)][0]["owner_pid"])
    rec: dict[str, Any] = {"island": island, "incarnation": inc, "lease": lease, "pid": pid}
    rec["notice"] = notice
    if notice:
        status, body = post_evict(url, lease, NOTICE_S)
        if status != 200:
            return None
        t0 = time.monotonic()

        def standby_trials() -> bool:
            watch.poll()
            return any(
                e["labels"].get("island") == island
                and int(e["labels"].get("incarnation", -1)) > inc
                for e in watch.seen.values()
            )

        rec["standby_ran_trials"] = _wait(standby_trials, STANDBY_WAIT_S, alive)
        rec["notice_s"] = round(time.monotonic() - t0, 2)

    def fresh() -> bool:
        now = time.time()
        running = _incarnations(watch).get((island, inc), [])
        return any(now - float(e.get("created", 0)) < FRESH_S for e in running)

    if not _wait(fresh, TRIAL_WAIT_S, alive) and not notice:
        return None  # no trial of it began meanwhile: another try later
    running = _incarnations(watch).get((island, inc), [])
    status, body = post_evict(url, lease, 0.0)
    if status != 200:  # the lease ended meanwhile (the run's end released it): no eviction
        return None
    _wait_dead(pid)
    rec["dead"] = not _alive(pid)
    rec["sandboxes_running_at_eviction"] = len(running)
    # what it left: its sandboxes running once it is dead (also those of trials it began
    # between the listing above and the eviction)
    watch.poll()
    rec["orphans"] = sorted(
        e["id"]
        for e in watch.seen.values()
        if e["labels"].get("island") == island
        and int(e["labels"].get("incarnation", -1)) == inc
        and _running(e)
    )
    if notice and rec["orphans"]:
        t0 = time.monotonic()
        left = [e for e in watch.seen.values() if e["id"] in set(rec["orphans"])]
        gone = _wait(lambda: not any(_running(e) for e in left), SWEPT_WAIT_S, alive)
        rec["orphans_gone_after_s"] = round(time.monotonic() - t0, 2) if gone else None
    return rec


def eviction_checks(
    store: Any, evictions: list[dict[str, Any]], islands: list[str]
) -> dict[str, Any]:
    """What the sweeps did about the evicted incarnations' orphans, and the trials lost
    by reason (the islands' ``sandbox_trials`` events)."""
    from yeto_core.events.stream import read_events

    by_island = {i: read_events(store, i) for i in islands}
    head = read_events(store, "head")
    swept_by_replacement = swept_at_end = unswept = 0
    standby_cases = standby_swept = 0
    for ev in evictions:
        if not ev.get("orphans"):
            continue
        # a standby that ran trials before its predecessor's eviction was alive at it:
        # the fence is its cue, the data end is far (faults land before two thirds)
        standby = bool(ev.get("notice") and ev.get("standby_ran_trials"))
        island, inc = ev["island"], int(ev["incarnation"])
        mine = [
            e
            for e in by_island.get(island, [])
            if e.kind == "sandbox_orphans_removed"
            and e.data.get("removed")
            and inc in e.data.get("incarnations", ())
        ]
        at_end = [
            e
            for e in head
            if e.kind == "sandbox_orphans_removed"
            and f"{island}-i{inc}" in e.data.get("incarnations", ())
        ]
        standby_cases += standby
        if mine:
            swept_by_replacement += 1
            standby_swept += standby
        elif at_end:
            swept_at_end += 1
        else:
            unswept += 1
    kept = 0
    lost: dict[str, int] = {}
    for events in by_island.values():
        for e in events:
            if e.kind == "sandbox_orphans_removed":
                kept += int(e.data.get("kept", 0))
            elif e.kind == "sandbox_trials":
                for reason, n in dict(e.data.get("failed") or {}).items():
                    lost[reason] = lost.get(reason, 0) + int(n)
    return {
        "evictions": len(evictions),
        "evictions_with_notice": sum(1 for e in evictions if e.get("notice")),
        "evictions_standby_ran_trials": sum(1 for e in evictions if e.get("standby_ran_trials")),
        "sandboxes_running_at_evictions": sum(
            int(e.get("sandboxes_running_at_eviction", 0)) for e in evictions
        ),
        "orphans_at_evictions": sum(len(e.get("orphans", ())) for e in evictions),
        "evicted_incarnations_with_orphans": sum(1 for e in evictions if e.get("orphans")),
        "evicted_swept_by_replacement": swept_by_replacement,
        "evicted_swept_at_run_end": swept_at_end,
        "evicted_not_swept": unswept,
        "evicted_with_a_running_standby": standby_cases,
        "evicted_swept_by_their_running_standby": standby_swept,
        "kept_by_replacements": kept,
        "sampler_fenced": sum(1 for e in head if e.kind == "sampler_fenced"),
        "sampler_replace_early": sum(1 for e in head if e.kind == "sampler_replace_early"),
        "sampler_promoted": sum(1 for e in head if e.kind == "sampler_promoted"),
        "trials_lost_by_reason": dict(sorted(lost.items())),
    }
