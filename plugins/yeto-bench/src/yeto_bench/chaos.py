"""``yeto bench chaos``: SIGKILL a random process of real runs, restart, check the run.

Each run is a quickstart-sized run (the ``hf`` engine, the ``torch`` backend
through the plugin manager, local islands, the ``dir`` store) started as an
operator would: ``yeto run up RUN_DIR/run.toml --run-dir RUN_DIR`` in a
subprocess. At random times (seeded) one live process of the run gets
SIGKILL: the head, a sampler island or the trainer incarnation. The head
relaunches islands itself; when the head dies (or gives up and exits), the
bench runs ``yeto run up`` again on the same run dir, as an operator would.

After each run the store is checked (see :func:`check_run`):

- ``groups_lost``: appended groups neither trained nor skipped with a reason in
  the final lineage;
- ``groups_trained_twice``: positions trained in two rounds of the final
  lineage (from the trainer's ``round_trained`` events, and from the batch
  ledger when it holds rounds);
- ``ledger_replay_mismatches``: ``yeto ledger replay`` (bitwise) disagrees with
  the newest cut, or cannot replay it;
- ``torn_records_visible``: records a reader sees half-written (a buffer entry
  whose payload does not load, an event line that does not parse, a ledger
  round that does not parse, ``cuts/LATEST`` naming no valid cut);
- ``runs_completed``: runs that reached ``total_rounds`` and finished (exit 0,
  ``FINISHED`` in the run dir).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import click

from yeto_bench.faulty_store import ENV as FAULTS_ENV
from yeto_bench.faulty_store import ENV_LOG as FAULTS_LOG_ENV
from yeto_bench.faulty_store import SCHEME as FAULTY_SCHEME
from yeto_bench.faulty_store import injected_faults
from yeto_bench.run_toml import bench_run_toml
from yeto_core.cli import exit_codes

#: The ``yeto`` command line, as a list (a subprocess; the bench never imports adapters).
YETO = [sys.executable, "-c", "import sys; from yeto_core.cli import main; sys.exit(main())"]


def chaos_config(
    run_dir: Path,
    *,
    base_dir: Path,
    seed: int,
    total_rounds: int,
    samplers: int = 2,
    task: str = "add1",
    store: str = "",
    deltas: str = "auto",
    min_round_s: float = 0.1,
    prompts_per_call: int = 1,
    silence_s: float = 120.0,
    wall_clock_s: float = 600.0,
) -> str:
    """The TOML of one chaos run: the quickstart, shorter, samplers barely throttled
    (``deltas``: ``[releases] deltas``, with a full release every 3; ``min_round_s``:
    the samplers' throttle; ``prompts_per_call`` > 1: each sampler call appends that
    many groups as one group commit, a pack)."""
    releases = f'\n[releases]\ndeltas = "{deltas}"\nfull_every = 3\n' if deltas != "auto" else ""
    return (
        bench_run_toml(
            store=store,
            comment="yeto bench chaos run (generated)",
            name="chaos",
            run_dir=run_dir,
            base_dir=base_dir,
            task=task,
            seed=seed,
            samplers=samplers,
            prompts_per_call=prompts_per_call,
            min_round_s=min_round_s,
            backlog_cap=16,
            max_new_tokens=3,
            lr=0.003,
            groups_per_round=4,
            max_policy_age=2,
            total_rounds=total_rounds,
            scheduler="s1",
            tick_s=0.2,
            wall_clock_s=wall_clock_s,
            silence_s=silence_s,
        )
        + releases
    )


# -- the final lineage and the checks (pure functions of what the store holds) ---------


def final_lineage(rounds: Sequence[Any]) -> dict[int, dict[str, Any]]:
    """Round number → ``{"positions", "skipped"}`` of the final lineage.

    ``rounds`` are the trainer's ``round_trained`` events in the order they were
    written. An incarnation restored from a cut at round ``k`` trains rounds
    ``k+1, ...`` again: a round numbered ``r`` supersedes every earlier round
    numbered ``r`` or more.

    A skip-only event (no positions: the skips of a stale tail committed at the
    data end, numbered with the last trained round ``r``) trains nothing: it
    supersedes rounds after ``r`` and adds its skips to round ``r``.
    """
    lineage: dict[int, dict[str, Any]] = {}
    for e in rounds:
        d = e.data
        r = d.get("trained_rounds")
        if r is None:
            continue
        r = int(r)
        positions = [int(p) for p in d.get("positions", ())]
        skipped = {str(k): [int(p) for p in v] for k, v in d.get("skipped", {}).items()}
        skip_only = not positions
        for stale in [k for k in lineage if k > r or (k == r and not skip_only)]:
            del lineage[stale]
        if skip_only and r in lineage:
            for reason, ps in skipped.items():
                lineage[r]["skipped"].setdefault(reason, []).extend(ps)
            continue
        lineage[r] = {"positions": positions, "skipped": skipped}
    return lineage


def ledger_tail_skips(
    ledger_end: int, watermark: int, lineage: dict[int, dict[str, Any]]
) -> Optional[list[int]]:
    """Positions in ``[ledger_end, watermark)`` when all are skipped (not trained) in ``lineage``.

    The trainer commits the skips of a stale tail at the data end without a
    ledger round, so the ledger can end before the buffer's watermark. None
    when a position there is trained or not accounted for (a real ledger gap).
    """
    tail = list(range(ledger_end, watermark))
    skipped = {p for r in lineage.values() for ps in r["skipped"].values() for p in ps}
    trained = {p for r in lineage.values() for p in r["positions"]}
    if all(p in skipped and p not in trained for p in tail):
        return tail
    return None


def lineage_counts(
    appended: set[int], lineage: dict[int, dict[str, Any]], upto: Optional[int] = None
) -> dict[str, Any]:
    """Lost and twice-trained positions of a lineage (``upto``: the watermark it reached)."""
    seen: dict[int, int] = {}
    accounted: set[int] = set()
    for r in sorted(lineage):
        for p in lineage[r]["positions"]:
            seen[p] = seen.get(p, 0) + 1
            accounted.add(p)
        for ps in lineage[r]["skipped"].values():
            accounted.update(ps)
    due = {p for p in appended if upto is None or p < upto}
    lost = sorted(due - accounted)
    twice = sorted(p for p, n in seen.items() if n > 1)
    return {"lost": lost, "twice": twice}


def check_run(
    run_dir: Path,
    *,
    replay: bool = True,
    store_url: str = "",
    corrupted: Any = frozenset(),
    damaged_trained: Any = frozenset(),
) -> dict[str, Any]:
    """The checks of one finished (or abandoned) run dir; see the module docstring.

    ``corrupted``: payload keys the bench damaged on purpose (``--faults corrupt``): a
    load failure there is the damage being detected, not a torn record.
    """
    from yeto_core.buffer.ledger import BatchLedger, LedgerError
    from yeto_core.buffer.sample_buffer import open_buffer
    from yeto_core.events.stream import read_events
    from yeto_core.plugins import get_plugins
    from yeto_core.trainer.cut import CutStore

    store = get_plugins().open_store(store_url or str(run_dir / "store"))
    problems: list[str] = []
    torn = 0
    buf = open_buffer(store, read_only=True)
    try:
        entries = buf.entries(0)
        for entry in entries:
            if not entry.payload:
                continue  # a quarantined index line's stand-in (a detected damage, counted)
            try:
                buf.load(entry)
            except Exception as exc:  # a listed entry that does not load is torn
                if entry.payload in corrupted:
                    continue
                torn += 1
                problems.append(f"buffer position {entry.position}: {exc}")
        watermark = int(buf.backlog().watermark)
    finally:
        buf.close()
    appended = {int(e.position) for e in entries}
    from yeto_core.errors import NotFoundError
    from yeto_core.events.stream import stream_keys

    release_events: list[dict[str, Any]] = []
    # every island's stream objects (not their .closed markers)
    for key in [k for keys in stream_keys(store.list("events/")).values() for k in keys]:
        try:
            text = store.get(key).decode(errors="replace")
        except NotFoundError:
            continue
        for i, line in enumerate(text.splitlines()):
            try:
                d = json.loads(line)
                d["kind"], float(d["time"])
            except (ValueError, KeyError, TypeError):
                torn += 1
                problems.append(f"{key} line {i + 1} does not parse: {line[:80]!r}")
                continue
            if str(d["kind"]).startswith("release_"):
                release_events.append(d)
    ledger = BatchLedger(store)
    ledger_rounds = 0
    try:
        ledger_rounds = len(ledger.rounds())
    except Exception as exc:
        torn += 1
        problems.append(f"ledger: {exc}")
    with tempfile.TemporaryDirectory(prefix="yeto-chaos-cut-") as tmp:
        cuts = CutStore(store)
        latest = cuts.latest_id()
        found = cuts.latest_valid(tmp)
        if latest is not None and (found is None or found[0].cut_id != latest):
            if f"cuts/{latest}/" in {k[: len(f"cuts/{latest}/")] for k in corrupted}:
                # a cut the bench damaged on purpose: the head's final check must have said so
                refused = any(
                    e.kind == "cut_invalid" and e.data.get("final") and e.data["cut_id"] == latest
                    for e in read_events(store, "head")
                )
                if not refused:
                    torn += 1
                    problems.append(f"the damaged final cut {latest} went unnoticed")
            else:
                torn += 1
                problems.append(f"cuts/LATEST names {latest}, which is not a valid cut")
    trained_events = [e for e in read_events(store, "trainer") if e.kind == "round_trained"]
    lineage = final_lineage(trained_events)
    counts = lineage_counts(appended, lineage, upto=watermark)
    twice = set(counts["twice"])
    ledger_failures = 0
    unrecorded: list[int] = []
    if ledger_rounds:
        check_to = watermark
        try:
            ledger_end = int(ledger.rounds()[-1].watermark)
            tail = ledger_tail_skips(ledger_end, watermark, lineage)
            if ledger_end < watermark and tail is not None:
                unrecorded, check_to = tail, ledger_end
            ledger.check(watermark=check_to)
        except LedgerError as exc:
            problems.append(f"ledger check: {exc}")
            ledger_failures = 1
            if "already" in str(exc):
                twice.add(-1)  # counted once: the ledger names the first position only
    out: dict[str, Any] = {
        "groups_appended": len(appended),
        "watermark": watermark,
        "lineage_rounds": len(lineage),
        "ledger_rounds": ledger_rounds,
        "groups_lost": len(counts["lost"]),
        "groups_trained_twice": len(twice),
        "ledger_check_failures": ledger_failures,
        "ledger_unrecorded_tail_skips": len(unrecorded),
        "torn_records_visible": torn,
        # None: not checked (--no-replay), never a 0 that was not measured
        "ledger_replay_mismatch": 0 if replay else None,
        "releases": release_counts(release_events),
        "problems": problems,
    }
    if counts["lost"]:
        problems.append(f"lost positions {counts['lost'][:20]}")
    if counts["twice"]:
        problems.append(f"positions trained twice {counts['twice'][:20]}")
    if replay:
        proc = subprocess.run(
            [*YETO, "ledger", "replay", str(run_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        info: dict[str, Any] = {}
        try:
            info = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
        out["replay"] = info or {"rc": proc.returncode, "stderr": proc.stderr.strip()[-400:]}
        if (
            proc.returncode != 0
            and "no valid cut to compare" in proc.stderr
            and _bench_damaged_only_cut(store, corrupted)
        ):
            # the run's one cut was damaged on purpose (and refused): nothing to compare with
            out["ledger_replay_mismatch"] = 0
            out["replay"] = {"not_comparable": "the only cut was damaged by the bench"}
        elif proc.returncode != 0 and _replay_refused_bench_damage(proc.stderr, damaged_trained):
            # the bench flipped the index record of a group the trainer had read intact: the
            # replay names it and refuses, which is right; there is nothing to compare with
            out["ledger_replay_mismatch"] = 0
            out["replay"] = {"not_comparable": "a trained record was damaged by the bench"}
        elif proc.returncode != 0 or not info.get("equal"):
            out["ledger_replay_mismatch"] = 1
            problems.append(
                f"yeto ledger replay exit {proc.returncode}: "
                f"{(proc.stderr.strip() or proc.stdout.strip())[-300:]}"
            )
    return out


def release_counts(events: Sequence[dict[str, Any]]) -> dict[str, int]:
    """What the run's releases were (pure): published and loaded, full or delta; refused.

    ``events``: the run's ``release_*`` events as written (``kind``, ``data``).
    ``published_*`` are the trainer's publications (``republished``: one that found the
    release already stored with the same weights), ``loaded_*`` the samplers' loads by
    what they fetched (``delta``: rebuilt from deltas), ``deltas_applied`` the delta
    releases those loads applied, ``refused_<reason>`` the refusals.
    """
    out: dict[str, int] = {}

    def add(key: str, n: int = 1) -> None:
        out[key] = out.get(key, 0) + n

    for e in events:
        d = e.get("data") or {}
        kind = e.get("kind")
        if kind == "release_republished" or (kind == "release_published" and d.get("republished")):
            add("republished")  # a trainer that retrained to the same weights: nothing stored
        elif kind == "release_published":
            add(f"published_{d.get('encoding', 'full')}")
        elif kind == "release_loaded":
            encoding = str(d.get("encoding", "full"))
            add(f"loaded_{encoding}")
            if encoding == "delta" and "from" in d:  # (events before ``from``: not split)
                # rebuilt from a full release: the chain names it first
                chain = [str(c) for c in d.get("chain") or ()]
                from_full = bool(chain) and str(d["from"]) == chain[0]
                add("loaded_delta_from_full" if from_full else "loaded_delta_on_local_copy")
                add("deltas_applied", len(chain) - from_full)
        elif kind == "release_refused":
            add(f"refused_{d.get('reason')}")
    return dict(sorted(out.items()))


# -- killing ------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def live_processes(run_dir: Path, head_pid: int) -> list[tuple[str, int]]:
    """(role, pid) of the run's live processes: the head and every live island."""
    out = [("head", head_pid)] if _alive(head_pid) else []
    for path in sorted((run_dir / "islands").glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = int(rec.get("pid", -1))
        if pid > 0 and _alive(pid):
            role = "trainer" if str(rec.get("island", "")).startswith("trainer") else "sampler"
            out.append((role, pid))
    return out


def _replay_refused_bench_damage(stderr: str, damaged_trained: Any) -> bool:
    """Whether ``yeto ledger replay`` refused only because of a record or a payload the
    bench damaged (a group trained intact before the flip landed: ``raced``)."""
    found = re.search(
        r"trained position (\d+), whose buffer index record was damaged"
        r"|payload '[^']*' of position (\d+) does not match the digest",
        stderr,
    )
    if found is None:
        return False
    return int(found.group(1) or found.group(2)) in damaged_trained


def _bench_damaged_only_cut(store: Any, corrupted: Any) -> bool:
    """Whether every committed cut of the run is one the bench damaged on purpose."""
    from yeto_core.trainer.cut import CutStore

    cuts = [c.cut_id for c in CutStore(store).list()]
    return bool(cuts) and all(any(k.startswith(f"cuts/{c}/") for k in corrupted) for c in cuts)


def _final_cut_refused(run_dir: Path) -> bool:
    """Whether the head stopped because the final cut failed its check (summary errors)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return any("the final cut" in str(e) for e in summary.get("errors") or ())


class ChaosRun:
    """One run under kills: start, kill, restart as an operator, until it finishes."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rng: random.Random,
        kills: int,
        gap_s: tuple[float, float],
        max_heads: int,
        deadline_s: float,
        launcher: Callable[..., subprocess.Popen] = subprocess.Popen,
        clock: Callable[[], float] = time.monotonic,
        env: Optional[dict[str, str]] = None,
        faults: Optional[dict[str, int]] = None,
        store: Any = None,
        corrupt_targets: Sequence[str] = (),
    ) -> None:
        self.run_dir = run_dir
        self.env = env
        #: faults beyond SIGKILL still to inject in this run (kind -> count)
        self.faults_left = dict(faults or {})
        self.store = store  # the run's store, without injected store faults
        self.corrupt_turn = 0
        #: what ``corrupt`` faults flip, in turn (empty: every target of chaos_faults)
        self.corrupt_targets = tuple(corrupt_targets)
        self.fault_records: list[dict[str, Any]] = []
        self.rng = rng
        self.kills_left = kills
        self.gap_s = gap_s
        self.max_heads = max_heads
        self.deadline_s = deadline_s
        self.launcher = launcher
        self.clock = clock
        self.kills: list[dict[str, Any]] = []
        self.heads: list[int] = []

    def start_head(self) -> subprocess.Popen:
        log = open(self.run_dir / f"head-{len(self.heads)}.log", "wb")
        cmd = [*YETO, "run", "up", str(self.run_dir / "run.toml"), "--run-dir", str(self.run_dir)]
        extra = {"env": {**os.environ, **self.env}} if self.env else {}
        proc = self.launcher(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **extra
        )
        log.close()
        self.heads.append(proc.pid)
        return proc

    def run(self) -> dict[str, Any]:
        t0 = self.clock()
        codes: list[int] = []
        completed = False
        stopped_reason: Optional[str] = None
        while len(self.heads) < self.max_heads and self.clock() - t0 < self.deadline_s:
            head = self.start_head()
            next_kill = self.clock() + self.rng.uniform(*self.gap_s)
            while head.poll() is None and self.clock() - t0 < self.deadline_s:
                actions = (["kill"] if self.kills_left > 0 else []) + [
                    k for k, n in sorted(self.faults_left.items()) if n > 0 and self._live()
                ]
                if actions and self.clock() >= next_kill:
                    action = self.rng.choice(actions)
                    if action != "kill":
                        head = self._inject(action, head, t0)
                        next_kill = self.clock() + self.rng.uniform(*self.gap_s)
                        continue
                    victims = live_processes(self.run_dir, head.pid)
                    if victims:
                        role, pid = self.rng.choice(victims)
                        try:
                            os.kill(pid, signal.SIGKILL)
                            self.kills.append(
                                {"role": role, "pid": pid, "at_s": round(self.clock() - t0, 2)}
                            )
                            self.kills_left -= 1
                        except ProcessLookupError:
                            pass
                    next_kill = self.clock() + self.rng.uniform(*self.gap_s)
                time.sleep(0.05)
            if head.poll() is None:  # past the deadline: stop it cleanly, then give up
                head.send_signal(signal.SIGINT)
                try:
                    head.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    head.kill()
                    head.wait()
                break
            codes.append(int(head.returncode))
            if head.returncode == 0 and (self.run_dir / "FINISHED").exists():
                completed = True
                break
            if head.returncode == 1 and _final_cut_refused(self.run_dir):
                # stopped with a clear reason: an operator's restart would say the same
                stopped_reason = "final cut invalid"
                break
        for kind, n in sorted(self.faults_left.items()):
            # said, not silently dropped: a fault the run ended before is not a detected one
            self.fault_records.extend(
                {"kind": kind, "skipped": "the run ended before it was injected"} for _ in range(n)
            )
        self.faults_left = {k: 0 for k in self.faults_left}
        return {
            "completed": completed,
            "stopped_reason": stopped_reason,
            "faults_injected": self.fault_records,
            "head_exit_codes": codes,
            "heads_started": len(self.heads),
            "kills": self.kills,
            "wall_s": round(self.clock() - t0, 1),
        }

    def _live(self) -> bool:
        """Whether the run trains (faults beyond SIGKILL wait for a live run, not a start)."""
        try:
            status = json.loads((self.run_dir / "status.json").read_text())
        except (OSError, ValueError):
            return False
        if (self.run_dir / "FINISHED").exists():
            return False  # a head that only reports the finished run: nothing to fault
        return int(status.get("trained_rounds") or 0) >= 1 and status.get("state") not in (
            "stopped",
            "finished",
        )

    def _inject(self, kind: str, head: subprocess.Popen, t0: float) -> subprocess.Popen:
        """Inject one fault of ``kind``; the head to watch from now on."""
        from yeto_bench.chaos_faults import INJECTORS

        self.faults_left[kind] -= 1
        rec, new_head = INJECTORS[kind](self, head)
        rec["at_s"] = round(self.clock() - t0, 2)
        self.fault_records.append(rec)
        if new_head is not None:
            if head.returncode is not None:
                pass  # the fenced head's exit is in the record, not in head_exit_codes
            return new_head
        return head


#: the samplers' throttle (``min_round_s``) of runs with faults beyond SIGKILL and store faults
FAULT_MIN_ROUND_S = 0.4
#: the silence backstop of those runs
FAULT_SILENCE_S = 360.0


def run_campaign(
    *,
    kills: int,
    runs: int,
    seed: int,
    work_dir: Path,
    base_dir: Path,
    total_rounds: int,
    gap_s: tuple[float, float] = (1.0, 6.0),
    run_deadline_s: float = 900.0,
    replay: bool = True,
    store_fault_rate: float = 0.0,
    deltas: str = "auto",
    fault_kinds: Sequence[str] = (),
    faults_per_run: int = 4,
    store_base: str = "",
    head_lease_s: float = 4.0,
    corrupt_targets: Sequence[str] = (),
    prompts_per_call: int = 1,
) -> dict[str, Any]:
    """``kills`` SIGKILLs spread over at least ``runs`` runs; the JSON report.

    ``store_fault_rate`` > 0 runs every run on a ``faulty://`` store (see
    :mod:`yeto_bench.faulty_store`): each store operation of every role fails
    with that probability, and the same invariants are checked.
    """
    rng = random.Random(seed)
    per_run = max(1, math.ceil(kills / max(1, runs)))
    left = kills
    results: list[dict[str, Any]] = []
    i = 0
    # A run that finishes before its kills are spent hands them to the next run.
    while (i < runs or left > 0) and i < runs + kills + 1:
        run_dir = work_dir / f"run-{i:03d}"
        run_dir.mkdir(parents=True, exist_ok=True)
        faulty = store_fault_rate > 0
        inner = f"{store_base.rstrip('/')}/run-{i:03d}" if store_base else ""
        inner_url = inner or str((run_dir / "store").absolute())
        store = f"{FAULTY_SCHEME}://{inner_url}" if faulty else inner
        env: Optional[dict[str, str]] = None
        if faulty:
            env = {
                FAULTS_ENV: json.dumps({"rate": store_fault_rate, "seed": seed + i}),
                FAULTS_LOG_ENV: str((run_dir / "faults").absolute()),
            }
        if "clock" in fault_kinds:
            from yeto_bench.chaos_faults import clock_env

            env = {**(env or {}), **clock_env(run_dir)}
        text = chaos_config(
            run_dir,
            base_dir=base_dir,
            seed=seed + i,
            total_rounds=total_rounds,
            store=store,
            deltas=deltas,
            prompts_per_call=prompts_per_call,
            # faults beyond SIGKILL are injected one after the other while the run trains
            # (a second head takes seconds to start): throttled samplers give them the time
            min_round_s=FAULT_MIN_ROUND_S if fault_kinds else 0.1,
            # a trainer relaunched after a takeover starts in minutes on a loaded machine
            # while the samplers wait at their backlog cap: no arrivals, a healthy run
            silence_s=FAULT_SILENCE_S if fault_kinds else 120.0,
            wall_clock_s=max(600.0, run_deadline_s + 60.0),  # the bench's deadline decides
        )
        if fault_kinds:  # a short lease: a paused head is taken over in seconds
            text = text.replace("[scheduler]\n", f"[scheduler]\nhead_lease_s = {head_lease_s}\n", 1)
        (run_dir / "run.toml").write_text(text)
        from yeto_core.plugins import get_plugins

        store_handle = get_plugins().open_store(inner_url) if fault_kinds else None
        quota = min(left, per_run)
        chaos = ChaosRun(
            run_dir,
            rng=rng,
            kills=quota,
            gap_s=gap_s,
            max_heads=quota + (25 if faulty else 5) + 2 * faults_per_run,
            deadline_s=run_deadline_s,
            env=env,
            faults={k: faults_per_run for k in fault_kinds},
            store=store_handle,
            corrupt_targets=corrupt_targets,
        )
        outcome = chaos.run()
        left -= len(outcome["kills"])
        corrupted = {
            str(x.get("key"))
            for x in outcome["faults_injected"]
            if x.get("kind") == "corrupt" and x.get("target") in ("payload", "cut")
        }
        # positions whose index record or payload the bench damaged: a replay that
        # refuses one of them (trained intact before the flip) refuses the bench's damage
        damaged_trained = {
            int(x["position"])
            for x in outcome["faults_injected"]
            if x.get("kind") == "corrupt"
            and x.get("target") in ("index", "payload")
            and x.get("position") is not None
        }
        checks = check_run(
            run_dir,
            replay=replay,
            store_url=inner_url,
            corrupted=corrupted,
            damaged_trained=damaged_trained,
        )
        if fault_kinds:
            from yeto_bench.chaos_faults import evaluate
            from yeto_core.events.stream import read_events

            rounds = [e for e in read_events(store_handle, "trainer") if e.kind == "round_trained"]
            evaluate(
                store_handle, outcome["faults_injected"], final_lineage(rounds), checks["watermark"]
            )
        checks.update(_run_money(run_dir))
        if faulty:
            faults = injected_faults(run_dir / "faults")
            checks["store_faults_injected"] = len(faults)
            checks["store_faults_by_mode"] = _count(faults, "mode")
            checks["store_faults_by_op"] = _count(faults, "op")
        results.append({"run": run_dir.name, **outcome, **checks})
        # each run's result as soon as it is known: a campaign cut short keeps what it did
        (run_dir / "result.json").write_text(json.dumps(results[-1], sort_keys=True, default=str))
        i += 1
        if not outcome["kills"] and quota and not outcome["completed"]:
            break  # nothing to kill and not finishing: do not loop
        if (faulty or fault_kinds) and i >= runs and left <= 0:
            break
    return campaign_report(results, seed=seed, kills=kills, replay=replay, deltas=deltas)


def _run_money(run_dir: Path) -> dict[str, Any]:
    """What one run cost at the bench prices (yeto_bench.money), read like check_run."""
    from yeto_bench.money import run_money

    m = run_money(run_dir)
    return {"usd_total": m["usd_total"], "usd_groups_trained": m["groups_trained"]}


def _campaign_money(results: list[dict[str, Any]]) -> dict[str, Any]:
    from yeto_bench.money import bench_prices

    usd = sum(float(r.get("usd_total") or 0.0) for r in results)
    groups = sum(int(r.get("usd_groups_trained") or 0) for r in results)
    return {
        "usd_total": round(usd, 6),
        "usd_per_trained_group": round(usd / groups, 8) if groups else None,
        "prices": bench_prices(),
    }


def _merge_counts(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + int(v)
    return dict(sorted(out.items()))


def _count(items: list[dict[str, Any]], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[str(item.get(key))] = out.get(str(item.get(key)), 0) + 1
    return dict(sorted(out.items()))


def campaign_report(
    results: list[dict[str, Any]], *, seed: int, kills: int, replay: bool, deltas: str = "auto"
) -> dict[str, Any]:
    """The campaign's JSON from its per-run results (pure).

    Without replay, ``ledger_replay_mismatches`` is ``"not checked"``: a 0 would
    claim a check that did not run. With ``deltas="on"`` the campaign is a check of
    delta releases only if some were published and loaded (rebuilt from deltas) by the
    samplers: ``releases.deltas_exercised`` says so, and without it the report is not ok.
    """
    by_role: dict[str, int] = {}
    for r in results:
        for k in r["kills"]:
            by_role[k["role"]] = by_role.get(k["role"], 0) + 1
    mismatches: Any = sum(r["ledger_replay_mismatch"] for r in results) if replay else "not checked"
    report = {
        "bench": "chaos",
        "seed": seed,
        "kills_requested": kills,
        "kills": sum(by_role.values()),
        "kills_by_role": dict(sorted(by_role.items())),
        "runs": len(results),
        "runs_completed": sum(1 for r in results if r["completed"]),
        # stopped by the head with a clear reason (a final cut damaged after its commit)
        "runs_stopped_with_reason": sum(1 for r in results if r.get("stopped_reason")),
        "groups_lost": sum(r["groups_lost"] for r in results),
        "groups_trained_twice": sum(r["groups_trained_twice"] for r in results),
        "ledger_replay_mismatches": mismatches,
        "torn_records_visible": sum(r["torn_records_visible"] for r in results),
        "ledger_check_failures": sum(r["ledger_check_failures"] for r in results),
        "ledger_unrecorded_tail_skips": sum(r["ledger_unrecorded_tail_skips"] for r in results),
        "releases": _merge_counts(r.get("releases", {}) for r in results),
        **_campaign_money(results),
        "per_run": results,
    }
    if deltas == "on":
        rel = report["releases"]
        rel["deltas_exercised"] = bool(rel.get("published_delta") and rel.get("loaded_delta"))
    if any("store_faults_injected" in r for r in results):
        store_runs = [r for r in results if "store_faults_injected" in r]
        report["faults"] = {
            "store": {
                "injected": sum(r.get("store_faults_injected", 0) for r in results),
                # every injected error is raised to its caller; what counts is the invariants
                "detected": "raised to the caller (each one)",
                "by_mode": _merge_counts(r.get("store_faults_by_mode", {}) for r in results),
                "by_op": _merge_counts(r.get("store_faults_by_op", {}) for r in results),
                "runs": len(store_runs),
                "groups_lost": sum(r["groups_lost"] for r in store_runs),
                "groups_trained_twice": sum(r["groups_trained_twice"] for r in store_runs),
                "replay_mismatches": sum(
                    int(r.get("ledger_replay_mismatch") or 0) for r in store_runs
                ),
            }
        }
    if any(r.get("faults_injected") for r in results):
        from yeto_bench.chaos_faults import per_kind

        report.setdefault("faults", {}).update(per_kind(results))
    if "faults" in report:
        report["faults_injected_total"] = sum(int(v["injected"]) for v in report["faults"].values())
        report["faults_undetected"] = sum(
            int(v["injected"]) - int(v["detected"]) - int(v.get("not_reached", 0))
            for k, v in report["faults"].items()
            if k != "store"
        )
        report["faults_used_after_corruption"] = sum(
            int(v.get("used_after_corruption", 0)) for v in report["faults"].values()
        )
    report["ok"] = (
        report["runs_completed"] + report["runs_stopped_with_reason"] == report["runs"]
        and report["groups_lost"] == 0
        and report["groups_trained_twice"] == 0
        and (not replay or report["ledger_replay_mismatches"] == 0)
        and report["torn_records_visible"] == 0
        and report["ledger_check_failures"] == 0
        and report.get("faults_undetected", 0) == 0
        and report.get("faults_used_after_corruption", 0) == 0
        and report["releases"].get("deltas_exercised", True) is True
    )
    return report


@click.command("chaos", epilog=exit_codes({1: "a check failed or a run did not complete"}))
@click.option("--kills", type=int, default=10, show_default=True, help="SIGKILLs in all.")
@click.option(
    "--runs", type=int, default=0, help="Runs to spread the kills over (default: one per 5 kills)."
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--total-rounds", type=int, default=20, show_default=True)
@click.option(
    "--base-dir",
    type=click.Path(file_okay=False),
    default="runs/base/add1",
    show_default=True,
    help="The base model (built on the first run when missing, then reused).",
)
@click.option("--work-dir", type=click.Path(file_okay=False), default=None)
@click.option("--no-replay", is_flag=True, help="Skip `yeto ledger replay` after each run.")
@click.option(
    "--faults",
    "faults",
    default="",
    show_default=True,
    help="Faults beyond SIGKILL, comma-separated: 'store' (every store operation of every "
    "role fails with probability --store-fault-rate), 'pause' (the head SIGSTOPped past its "
    "lease, a second head takes over), 'second-head' (a second `yeto run up`: refused), "
    "'clock' (a sampler's clock skewed by minutes), 'corrupt' (a flipped byte in a group "
    "payload, an index record, a cut shard, a release file), 'evict' (NC nodes evicted; "
    "its own campaign), 'agentic' (the calculator environment in bwrap sandboxes, its "
    "--kills SIGKILLs of sampler islands and --evictions evictions of NC nodes mid-trial, "
    "the sweeps checked; its own campaign, "
    "as root; base: runs/base/agentic-calc-smoke unless --base-dir).",
)
@click.option(
    "--corrupt-targets",
    default="payload,index,cut,release",
    show_default=True,
    help="What the 'corrupt' faults flip a byte in, in turn (comma-separated).",
)
@click.option("--store-fault-rate", type=float, default=0.002, show_default=True)
@click.option(
    "--deltas",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="[releases] deltas of every run ('on': delta releases, a full one every 3).",
)
@click.option(
    "--prompts-per-call",
    type=click.IntRange(1, 4),
    default=1,
    show_default=True,
    help="Groups each sampler call appends as one group commit (>1: a pack of payloads "
    "and, on an object store, one index object per call; rounds are 4 groups).",
)
@click.option(
    "--faults-per-run",
    type=int,
    default=4,
    show_default=True,
    help="Faults of each kind (other than store) per run.",
)
@click.option(
    "--store",
    "store_base",
    default="",
    help="Run on this store URL prefix (run-NNN under it), e.g. s3://bucket/chaos; "
    "credentials and endpoint from YETO_STORE_S3_*. Default: a dir store in each run dir.",
)
@click.option(
    "--run-deadline",
    "run_deadline_s",
    type=float,
    default=900.0,
    show_default=True,
    help="Seconds one run may take (kills, faults and operator restarts included).",
)
@click.option(
    "--evictions",
    type=click.IntRange(0, 10000),
    default=None,
    help="With --faults evict: evictions in all (runs follow each other until then; default "
    "20). With --faults agentic: NC nodes evicted mid-trial, the runs' samplers on the nc "
    "pool of the marketplace simulator (default 0: no pool).",
)
@click.option(
    "--rows",
    type=click.IntRange(4, 100000),
    default=48,
    show_default=True,
    help="With --faults agentic: calculator questions per run (each a group of 4 trials).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(
    kills: int,
    runs: int,
    seed: int,
    total_rounds: int,
    base_dir: str,
    work_dir: Optional[str],
    no_replay: bool,
    faults: str,
    corrupt_targets: str,
    store_fault_rate: float,
    deltas: str,
    prompts_per_call: int,
    faults_per_run: int,
    store_base: str,
    run_deadline_s: float,
    evictions: Optional[int],
    rows: int,
    as_json: bool,
) -> None:
    """SIGKILL random processes (head, samplers, trainer) of real runs; check nothing is lost."""
    kinds = {k.strip() for k in faults.split(",") if k.strip()}
    from yeto_bench.chaos_faults import KINDS

    unknown = sorted(kinds - {"store", "evict", "agentic", *KINDS})
    if unknown:
        raise click.BadParameter(
            f"unknown fault kinds {unknown}; known: store, evict, agentic, {', '.join(KINDS)} "
            "(SIGKILLs: --kills)",
            param_hint="--faults",
        )
    from yeto_bench.chaos_faults import CORRUPT_TARGETS

    targets = [t.strip() for t in corrupt_targets.split(",") if t.strip()]
    bad = sorted(set(targets) - set(CORRUPT_TARGETS))
    if bad or not targets:
        raise click.BadParameter(
            f"unknown corrupt targets {bad}; known: {', '.join(CORRUPT_TARGETS)}",
            param_hint="--corrupt-targets",
        )
    runs = runs or max(1, math.ceil(kills / 5))
    with tempfile.TemporaryDirectory(prefix="yeto-chaos-") as tmp:
        root = Path(work_dir) if work_dir else Path(tmp)
        if "agentic" in kinds:  # its own campaign: yeto_bench.chaos_agentic
            from yeto_bench.chaos_agentic import BASE, run_agentic_campaign

            default_base = base_dir == "runs/base/add1"
            report = run_agentic_campaign(
                kills=kills,
                runs=runs,
                seed=seed,
                work_dir=root,
                base_dir=(BASE if default_base else Path(base_dir)).absolute(),
                rows=rows,
                replay=not no_replay,
                run_deadline_s=run_deadline_s,
                evictions=evictions or 0,
            )
        elif "evict" in kinds:  # its own campaign: yeto_bench.chaos_evict
            from yeto_bench.chaos_evict import run_evict_campaign

            report = run_evict_campaign(
                evictions=20 if evictions is None else evictions,
                seed=seed,
                work_dir=root,
                base_dir=Path(base_dir).absolute(),
                total_rounds=total_rounds,
                replay=not no_replay,
            )
        else:
            report = run_campaign(
                kills=kills,
                runs=runs,
                seed=seed,
                work_dir=root,
                base_dir=Path(base_dir).absolute(),
                total_rounds=total_rounds,
                replay=not no_replay,
                store_fault_rate=store_fault_rate if "store" in kinds else 0.0,
                deltas=deltas,
                fault_kinds=[k for k in KINDS if k in kinds],
                faults_per_run=faults_per_run,
                store_base=store_base,
                run_deadline_s=run_deadline_s,
                corrupt_targets=targets,
                prompts_per_call=prompts_per_call,
            )
    if as_json:
        click.echo(json.dumps(report, sort_keys=True))
    else:
        for key in (
            "kills",
            "kills_by_role",
            "runs",
            "runs_completed",
            "groups_lost",
            "groups_trained_twice",
            "ledger_replay_mismatches",
            "torn_records_visible",
        ):
            click.echo(f"{key:>26}: {report[key]}")
        if "faults" in report:
            click.echo(f"{'faults':>26}: {report['faults']}")
    if not report["ok"]:
        raise SystemExit(1)
