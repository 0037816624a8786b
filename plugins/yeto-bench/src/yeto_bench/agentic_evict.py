"""NC nodes evicted mid-trial in ``yeto bench chaos --faults agentic --evictions N``.

With evictions, each agentic chaos run (:mod:`yeto_bench.chaos_agentic`) puts its two
sampler islands on the ``nc`` provider against the marketplace simulator
(``python -m yeto_nc.testing``, a subprocess: the bench imports no adapter) with a calm
storm: the bench evicts, nothing else does. The ``bwrap`` host does not tell the sweeps
whether a sandbox's starter runs (``options.track_owner = false``, as a sandbox host
serving nodes on other machines cannot): the sweeps decide by the head's fences and
gone records alone, the rule docs/agentic.md states for a replacement.

An eviction picks a node (an island with a lease) and waits for a trial of its current
incarnation to run: a sandbox of it running, found by its labels in the host's state
dir, as the kills wait. It then freezes the node's island (SIGSTOP to its own pid,
every thread stopped) with one of those sandboxes untouched (PID 1 running, no SIGKILL
pending: the island has not begun to remove it) and evicts its lease through the
simulator's on-demand route; the simulator kills the node's process group at its next
tick. A frozen island cannot end its trial, so the eviction lands mid-trial at any
machine speed (a trial that ended as the island froze thaws it, and the wait goes on).
The wait is bounded (``TRIAL_WAIT_S``): an eviction whose node ran no trial in that
time fails the campaign, naming the island. In turn (the first with notice: it takes
longest):

- **without notice**: the node is killed at the simulator's next tick; the head sees
  the lease evicted, fences the incarnation and launches its replacement (the next
  incarnation of the same shard), whose sweep at start removes what the fenced
  predecessor left;
- **with notice**: once a trial of the node runs, a long notice; the head launches
  the replacement early (a standby) while the node keeps sampling; once the standby
  runs trials of its own (it swept at its start and had to keep the predecessor's
  running sandboxes: unfenced, not gone), the bench evicts the node, frozen mid-trial
  as above; the head fences it and the standby's next sweep (``[sandbox]
  sweep_again_s``) removes its sandboxes.

Each eviction's record names the incarnation and its orphans: its sandboxes still
running once its process is dead.
"""

from __future__ import annotations

import json
import os
import signal
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
#: how long an eviction waits for a trial of its node to run (a replacement's start on a
#: busy machine included); past it the eviction fails the campaign
TRIAL_WAIT_S = 120.0
#: how long an evicted node may take to die (the simulator kills it at its next tick)
DEAD_WAIT_S = 30.0
#: how long a frozen island's threads may take to stop
FREEZE_WAIT_S = 10.0
#: the flag of an exiting process in ``/proc/<pid>/stat``
PF_EXITING = 0x4
#: seconds from an eviction to the run's next fault (uniform; the kills' gap is longer)
EVICT_GAP_S = (0.5, 2.0)
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


def current_incarnation(run_dir: Path, island: str) -> Optional[int]:
    """The newest incarnation of ``island`` that holds a lease (records of released
    leases are gone); None when it holds none."""
    incs = [inc for (name, inc) in _held(run_dir) if name == island]
    return max(incs) if incs else None


def _held(run_dir: Path) -> list[tuple[str, int]]:
    out = []
    for path in sorted((run_dir / "nc" / "leases").glob("*.json")):
        try:
            rec = json.loads(path.read_text())
            out.append((str(rec["island"]), int(rec["incarnation"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _trial_of(watch: Any, island: str, inc: int) -> list[dict[str, Any]]:
    """The running sandboxes (by label) of ``island``'s incarnation ``inc``, its
    process alive: a trial of it runs."""
    from yeto_bench.chaos_agentic import _owner_alive, _running

    watch.poll()
    return [
        e
        for e in watch.seen.values()
        if e["labels"].get("island") == island
        and int(e["labels"].get("incarnation", -1)) == inc
        and _running(e)
        and _owner_alive(e)
    ]


def _untouched(entry: dict[str, Any]) -> bool:
    """Whether a sandbox's PID 1 runs with no SIGKILL pending and is not exiting: its
    island has not begun to remove it (``remove`` kills PID 1 first)."""
    from yeto_core.sandbox import procs

    pid = int(entry["init_pid"])
    if not procs.alive(pid, entry["init_start"]):
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    kill_bit = 1 << (signal.SIGKILL - 1)
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & kill_bit:
            return False
    flags = int(stat.rsplit(b")", 1)[1].split()[6])  # field 9 of /proc/<pid>/stat
    return not flags & PF_EXITING and procs.alive(pid, entry["init_start"])


def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (a group stop ends each thread's
    current step first)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        states = [(t / "stat").read_bytes().rsplit(b")", 1)[1].split()[0] for t in tasks]
    except OSError:
        return False
    return bool(states) and all(s in (b"T", b"t") for s in states)


def _freeze(pid: int, start: Optional[int]) -> bool:
    """SIGSTOP the island process ``pid`` (its own pid, checked by its start time) and
    wait until all its threads are stopped; False if it is gone."""
    from yeto_core.sandbox import procs

    if not procs.alive(pid, start):
        return False
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + FREEZE_WAIT_S
    while time.monotonic() < deadline:
        if _stopped(pid):
            return True
        if not procs.alive(pid, start):
            return False
        time.sleep(0.002)
    _thaw(pid, start)
    return False


def _thaw(pid: int, start: Optional[int]) -> None:
    from yeto_core.sandbox import procs

    if procs.alive(pid, start):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def wait_trial(
    watch: Any,
    victim: Callable[[], Optional[tuple[str, int]]],
    timeout_s: float,
    alive: Callable[[], bool],
    *,
    freeze: bool,
) -> Optional[tuple[tuple[str, int], int, Optional[int], list[dict[str, Any]]]]:
    """Wait (at most ``timeout_s``, while the run's head lives) until a trial of the
    victim incarnation (``victim()``: re-read each poll, a replacement's start
    included) runs: ((island, incarnation), pid, its start time, its running
    sandboxes), or None. With ``freeze`` the island is left stopped (SIGSTOP) with at
    least one of those sandboxes untouched: nothing ends that trial before the
    eviction kills the node; a trial that ended as it froze thaws it, and the wait
    goes on."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        key = victim()
        running = _trial_of(watch, *key) if key is not None else []
        if key is not None and running:
            pid, start = int(running[0]["owner_pid"]), running[0].get("owner_start")
            if not freeze:
                return key, pid, start, running
            if _freeze(pid, start):
                held = [e for e in running if _untouched(e)]
                if held:
                    return key, pid, start, held
                _thaw(pid, start)
        time.sleep(0.01)
    return None


def _wait(cond: Callable[[], bool], timeout_s: float, alive: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _failed(island: str, inc: Optional[int], what: str, alive: Callable[[], bool]) -> Any:
    """None when the run ended meanwhile (the next run takes the eviction), else the
    record of a failed eviction (the campaign fails on it)."""
    if not alive():
        return None
    return {"island": island, "incarnation": inc, "failed": what}


def evict_mid_trial(
    run_dir: Path,
    url: str,
    watch: Any,
    rng: Any,
    *,
    notice: bool,
    alive: Callable[[], bool],
    notices: Optional[list[dict[str, Any]]] = None,
) -> Optional[dict[str, Any]]:
    """Evict one node while a trial of it runs (see the module docstring): its record;
    a record with ``failed`` (why) when no trial of it ran within ``TRIAL_WAIT_S``; or
    None when no node holds a lease yet or the run ended meanwhile (another try).
    Each notice given is appended to ``notices`` (the island's handle and lease), a
    notice whose eviction did not follow included: the head replaces such a node early
    too, and the checks must know why."""
    from yeto_bench.chaos import _alive
    from yeto_bench.chaos_agentic import _running, _wait_dead

    islands = sorted({name for name, _ in _held(run_dir)})
    if not islands:
        return None
    island = rng.choice(islands)

    def current() -> Optional[tuple[str, int]]:
        inc = current_incarnation(run_dir, island)
        return None if inc is None else (island, inc)

    victim: Callable[[], Optional[tuple[str, int]]] = current
    rec: dict[str, Any] = {"island": island, "notice": notice}
    if notice:
        found = wait_trial(watch, current, TRIAL_WAIT_S, alive, freeze=False)
        if found is None:
            what = f"no trial of {island} ran within {TRIAL_WAIT_S:g} s (before its notice)"
            return _failed(island, None, what, alive)
        (_, inc), *_ = found
        lease = lease_of(run_dir, island, inc)
        status, body = post_evict(url, lease, NOTICE_S) if lease else (404, {})
        if status != 200:
            return None  # the lease ended meanwhile (the run's end released it)
        if notices is not None:
            notices.append({"handle": f"{island}-i{inc}", "lease": lease})
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
        victim = lambda: (island, inc)  # noqa: E731  the noticed node, not its standby

    found = wait_trial(watch, victim, TRIAL_WAIT_S, alive, freeze=True)
    if found is None:
        key = victim()
        what = (
            f"no trial of {island} incarnation {key[1] if key else '?'} ran within "
            f"{TRIAL_WAIT_S:g} s: the eviction could not land mid-trial"
        )
        return _failed(island, key[1] if key else None, what, alive)
    (_, inc), pid, start, held = found
    lease = lease_of(run_dir, island, inc)
    status, body = post_evict(url, lease, 0.0) if lease else (404, {})
    if status != 200:  # the lease ended meanwhile (the run's end released it): no eviction
        _thaw(pid, start)
        return None
    _wait_dead(pid, DEAD_WAIT_S)
    rec.update(incarnation=inc, lease=lease, pid=pid, dead=not _alive(pid))
    if not rec["dead"]:  # not killed: it runs on, and may still end the trials it held
        _thaw(pid, start)
        held = []
    rec["sandboxes_running_at_eviction"] = len(held)
    # what it left: its sandboxes running once it is dead. Those it held frozen were
    # running then (it was stopped until the node was killed, and no sweep takes an
    # incarnation before the head fences it, after its death); also any other still
    # running now
    watch.poll()
    rec["orphans"] = sorted(
        {e["id"] for e in held}
        | {
            e["id"]
            for e in watch.seen.values()
            if e["labels"].get("island") == island
            and int(e["labels"].get("incarnation", -1)) == inc
            and _running(e)
        }
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
    # an early replacement (a standby) has its cause in the head's own events: a notice
    # or a refused renewal of that handle; each noticed eviction's node had one
    caused = {
        e.data.get("handle") for e in head if e.kind in ("nc_eviction_notice", "nc_renew_refused")
    }
    early = [str(e.data.get("handle")) for e in head if e.kind == "sampler_replace_early"]
    noticed = [f"{ev['island']}-i{ev['incarnation']}" for ev in evictions if ev.get("notice")]
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
        "sampler_replace_early": len(early),
        "sampler_replace_early_handles": early,
        "sampler_replace_early_without_cause": sorted(h for h in early if h not in caused),
        "noticed_evictions_replaced_early": len(set(noticed) & set(early)),
        "sampler_standby_dropped": sum(1 for e in head if e.kind == "sampler_standby_dropped"),
        "sampler_promoted": sum(1 for e in head if e.kind == "sampler_promoted"),
        "trials_lost_by_reason": dict(sorted(lost.items())),
    }
