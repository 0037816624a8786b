"""``yeto bench sync``: one trainer island against several, synchronised through the store.

Every case is a real ``yeto run up`` (a subprocess) of the quickstart's task (``sort4``,
its base, two ``hf`` sampler islands with one thread each, rounds of 16 groups of 8,
policy-age gate 3, the always-on scheduler) on the ``local`` provider, with the
store behind the counting wrapper of :mod:`yeto_bench.faulty_store` (no faults):
every request delayed by the case's latency, every object body by its size over
``--bandwidth`` (each process's own link), and every body under ``sync/`` and
``releases/`` logged, so the bytes an outer step moves are counted where they move.

The cases, per ``--latencies`` value:

- ``single``: ``[trainer] islands = 1`` (no syncer), the baseline of that latency;
- ``strict-N`` / ``elastic-N`` for every N > 1 of ``--islands``: N ``torch`` trainer
  islands (``[sync]``: ``local_steps``, the ``average`` outer optimizer; ``elastic``
  with ``quorum = N - 1``, ``carry_discount`` 0.5, ``max_carry_age`` 1), each island at
  the single island's lr, or at N times it with ``--scale-lr`` (the average of N deltas
  moves the policy about as far as one island's horizon; measured, it made ``elastic``
  dip and its fault case miss the target: docs/sync.md);

then the fault cases (``--faults``; ``--no-fault`` skips them): ``elastic`` with the
largest island count at the first latency, one island SIGKILLed mid-horizon once
``--kill-after`` outer steps committed (:class:`KillIsland`). It must still reach the target, with
``yeto ledger check`` and ``yeto sync replay`` exiting 0 and no position trained
twice: the report's ``faults.<case>.ok`` (:func:`yeto_bench.sync_figures.fault_ok`).

A fault is a class with ``poll(store, run_dir)`` (called every tick of the watch
loop), ``env(islands)`` (what the head's environment gets) and ``figures()`` (its part
of the report), registered in :data:`FAULTS`: ``kill`` (:class:`KillIsland`; the head
replaces the island, and the figures name the replacement, the step it joined at and
the rounds it trained) and ``late-join`` (:class:`KillThenLateJoin`: the replacement
starts 10 s late, and the case passes only once it joined and trained).

Each run stops (``yeto run down``) once the rolling mean reward over the last 64
trained groups reaches ``--target`` (the quickstart's, 0.8 by default: the reward
the merged policy's rounds carry, in the order they entered the ledger), or at
``--timeout-s``. The figures: :mod:`yeto_bench.sync_figures`. Every case's
``vs_single`` is its time to target over the single island's at the same latency.
With ``--seeds`` every case runs once per seed (each in ``seed-<n>/`` of the work dir)
and is reported as one (:func:`yeto_bench.sync_figures.merge_seeds`): the median time,
a seed that missed counting as longer than any, every seed's figures under
``per_seed``. Which groups land in which round is the processes' timing, not the seed's,
so one seed per case does not rank cases whose times are close (docs/sync.md, 200 ms).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import attrs
import click

from yeto_bench.e2e import store_may_hold_groups
from yeto_bench.head_proc import start_head, stop_head
from yeto_bench.run_toml import bench_run_toml
from yeto_bench.sync_figures import assemble, case_figures, case_name, merge_seeds
from yeto_core.cli import exit_codes

PRESETS = ("strict", "elastic", "decoupled")
#: ``decoupled``'s fragments: each island sends half the model every local step (a divisor
#: of ``--local-steps``, else one fragment)
FRAGMENTS = 2
#: the product's default lr for the quickstart bench runs (``yeto bench e2e``'s)
LR = 0.0005


@attrs.frozen
class Case:
    """One run: ``preset`` ``single`` (islands 1), ``strict``, ``elastic`` or ``decoupled``."""

    preset: str
    islands: int
    latency_ms: float
    fault: Optional[str] = None

    @property
    def name(self) -> str:
        base = case_name(self.preset, self.islands, self.latency_ms)
        return base if self.fault is None else f"{base}+{self.fault}"


def plan(
    islands: tuple[int, ...],
    presets: tuple[str, ...],
    latencies: tuple[float, ...],
    faults: tuple[str, ...],
) -> list[Case]:
    """The cases in run order: per latency the single island, then each preset at each
    island count above 1; then each fault at the first latency, ``elastic`` with the
    most islands (at least 2)."""
    cases: list[Case] = []
    for lat in latencies:
        if 1 in islands:
            cases.append(Case("single", 1, lat))
        cases += [Case(p, n, lat) for p in presets for n in sorted(islands) if n > 1]
    most = max(max(islands), 2)
    cases += [Case("elastic", most, latencies[0], fault=f) for f in faults]
    return cases


def case_toml(
    case: Case,
    run_dir: Path,
    *,
    base_dir: Path,
    seed: int,
    timeout_s: float,
    local_steps: int,
    lr: float,
    scale_lr: bool,
    store: str,
) -> str:
    """The run config of one case (see the module doc)."""
    n = case.islands
    trainer_lines = tail = ""
    backlog = 64
    if n > 1:
        horizon = n * local_steps * 16
        trainer_lines = f"islands = {n}\n"
        sync = [f'preset = "{case.preset}"', f"local_steps = {local_steps}"]
        sync.append('outer_optimizer = "average"')
        backlog = max(64, horizon)
        if case.preset == "elastic":
            sync += [f"quorum = {n - 1}", "carry_discount = 0.5", "max_carry_age = 1"]
            backlog = max(64, 3 * horizon)  # 2 + max_carry_age horizons (docs/sync.md)
        if case.preset == "decoupled":  # every island's fragment delta in each step
            fragments = FRAGMENTS if local_steps % FRAGMENTS == 0 else 1
            sync += [f"fragments = {fragments}", f"quorum = {n}", "max_carry_age = 1"]
            backlog = max(64, 3 * horizon)
        tail = "\n[sync]\n" + "\n".join(sync) + "\n"
    return bench_run_toml(
        comment=f"yeto bench sync run ({case.name}, generated)",
        name=f"sync-{case.preset}-{n}",
        run_dir=run_dir,
        base_dir=base_dir,
        task="sort4",
        seed=seed,
        samplers=2,
        prompts_per_call=8,
        min_round_s=0.3,
        backlog_cap=backlog,
        max_new_tokens=6,
        lr=lr * n if scale_lr else lr,
        groups_per_round=16,
        max_policy_age=3,
        total_rounds=0,
        scheduler="always-on",
        tick_s=0.1,
        wall_clock_s=float(timeout_s) + 300.0,
        silence_s=180,
        store=store,
        base_options={"target_reward": 0.3},
        trainer_lines=trainer_lines,
        tail=tail,
    )


def _dicts(events: list[Any]) -> list[dict[str, Any]]:
    return [{"kind": e.kind, "time": float(e.time), "data": dict(e.data)} for e in events]


class KillIsland:
    """SIGKILL trainer island ``<trainer>-1`` mid-horizon: once ``after`` outer steps
    committed and its newest event is a trained round (``island_round``, not yet its
    delta), its process (the pid the local provider recorded) is killed. ``figures``:
    which island, when, at which outer step, whether it had submitted that step's
    delta (then the kill was not mid-horizon after all), and whether the head saw it
    leave (``pool_leave``, reason ``exited``)."""

    def __init__(self, after: int, trainer: str = "trainer") -> None:
        self.after = after
        self.island = f"{trainer}-1"
        self.trainer = trainer
        self.killed: Optional[dict[str, Any]] = None
        self._store: Any = None

    def poll(self, store: Any, run_dir: Path) -> None:
        from yeto_core.events.stream import read_events

        self._store = store
        if self.killed is not None:
            return
        committed = [e for e in read_events(store, self.trainer) if e.kind == "pool_outer_step"]
        if len(committed) < self.after:
            return
        mine = [e for e in read_events(store, self.island) if e.kind != "stage_profile"]
        if not mine or mine[-1].kind != "island_round":
            return
        handle = run_dir / "islands" / f"{self.island}-i0.json"
        if not handle.is_file():
            return
        pid = int(json.loads(handle.read_text())["pid"])
        os.kill(pid, signal.SIGKILL)
        self.killed = {
            "island": self.island,
            "pid": pid,
            "time": time.time(),
            "committed_outer_steps": len(committed),
            "outer_step": int(mine[-1].data.get("outer_step", -1)),
        }

    def figures(self) -> dict[str, Any]:
        from yeto_core.events.stream import read_events

        left = False
        submitted = None
        if self.killed is not None and self._store is not None:
            step = self.killed["outer_step"]
            left = any(
                e.kind == "pool_leave"
                and e.data.get("island") == self.island
                and e.data.get("reason") == "exited"
                for e in read_events(self._store, self.trainer)
            )
            submitted = any(
                e.kind == "delta_submitted" and e.data.get("outer_step") == step
                for e in read_events(self._store, self.island)
            )
        return {
            "killed": self.killed,
            "killed_left_roster": left,
            "killed_after_submitting": submitted,
            "replacement": self._replacement(),
        }

    def env(self, islands: int) -> dict[str, str]:
        """What the head's environment gets for this fault (none)."""
        return {}

    def _replacement(self) -> Optional[dict[str, Any]]:
        """The island the head launched in the killed one's place (``pool_launched``,
        reason ``replace``): its name, the outer step it joined at (``pool_join``), and
        the rounds it trained; None if none was launched."""
        from yeto_core.events.stream import read_events

        if self.killed is None or self._store is None:
            return None
        pool = read_events(self._store, self.trainer)
        launched = [
            e.data.get("island")
            for e in pool
            if e.kind == "pool_launched" and e.data.get("replaces") == self.island
        ]
        if not launched:
            return None
        name = str(launched[0])
        joins = [e for e in pool if e.kind == "pool_join" and e.data.get("island") == name]
        rounds = [e for e in read_events(self._store, name) if e.kind == "island_round"]
        return {
            "island": name,
            "joined_at_outer_step": int(joins[0].data["outer_step"]) if joins else None,
            "rounds_trained": len(rounds),
        }


class KillThenLateJoin(KillIsland):
    """:class:`KillIsland`, and the island launched in its place starts ``delay_s`` late
    (``YETO_SYNC_START_DELAY_S`` for the first replacement's name, ``<trainer>-<N>``
    with N islands: docs/sync.md, "Departures and joins"), so it joins the roster steps
    after the kill, during the run. ``fault_ok`` then also needs it to have joined and
    trained rounds."""

    def __init__(self, after: int, delay_s: float = 10.0, trainer: str = "trainer") -> None:
        super().__init__(after, trainer)
        self.delay_s = delay_s
        self.late_join = True

    def env(self, islands: int) -> dict[str, str]:
        from yeto_core.sync.members import START_DELAY_ENV

        return {START_DELAY_ENV: f"{self.trainer}-{islands}={self.delay_s:g}"}

    def figures(self) -> dict[str, Any]:
        return {**super().figures(), "late_join_delay_s": self.delay_s}


#: fault name -> factory(kill_after) of its fault (see the module doc)
FAULTS: dict[str, Any] = {
    "kill": lambda after: KillIsland(after),
    "late-join": lambda after: KillThenLateJoin(after),
}


def run_case(
    case: Case,
    *,
    work: Path,
    base_dir: Path,
    seed: int,
    target: float,
    timeout_s: float,
    local_steps: int,
    lr: float,
    scale_lr: bool,
    bandwidth: float,
    kill_after: int,
    poll_s: float = 1.0,
) -> dict[str, Any]:
    """One case until the target (or the timeout); its figures and its checks."""
    from yeto_core.events.stream import read_events
    from yeto_core.stores.dir_store import DirStore

    run_dir = work / case.name.replace("@", "-at-").replace("+", "-")
    run_dir.mkdir(parents=True, exist_ok=True)
    inner = run_dir / "store"
    byte_log = run_dir / "bytes"
    settings = {
        "rate": 0.0,
        "latency_ms": float(case.latency_ms),
        "bandwidth_bytes_per_s": float(bandwidth),
        "bytes_log": str(byte_log),
    }
    from yeto_bench.faulty_store import ENV

    fault = FAULTS[case.fault](kill_after) if case.fault else None
    env = {**os.environ, ENV: json.dumps(settings)}
    if fault is not None:
        env.update(fault.env(case.islands))
    toml = run_dir / "run.toml"
    toml.write_text(
        case_toml(
            case,
            run_dir,
            base_dir=base_dir,
            seed=seed,
            timeout_s=timeout_s,
            local_steps=local_steps,
            lr=lr,
            scale_lr=scale_lr,
            store=f"faulty://{inner}",
        )
    )
    launched = time.time()
    head = start_head(toml, run_dir, env=env)
    store: Any = None
    t0: Optional[float] = None
    hit = None
    while head.poll() is None:
        time.sleep(poll_s)
        if store is None:
            if store_may_hold_groups(run_dir):
                store = DirStore(str(inner))  # the bench reads past the wrapper: uncounted
            elif time.time() - launched > timeout_s + 300:
                break
            continue
        if t0 is None:
            t0 = _first_appended(store)
        if fault is not None:
            fault.poll(store, run_dir)
        if t0 is None:
            continue
        events = _dicts(read_events(store, "trainer"))
        hit = case_figures(
            trainer_events=events, t0=t0, target=target, byte_lines=(), island_streams={}
        )["time_to_target_s"]
        if hit is not None or time.time() >= t0 + timeout_s:
            break
    stop_head(head, run_dir, reason=f"yeto bench sync: {'target' if hit else 'timeout'}")
    store = DirStore(str(inner))
    t0 = _first_appended(store) or t0
    islands = [f"trainer-{i}" for i in range(case.islands)] if case.islands > 1 else []
    figures = case_figures(
        trainer_events=_dicts(read_events(store, "trainer")),
        t0=t0,
        target=target,
        byte_lines=_byte_lines(byte_log),
        island_streams={i: _dicts(read_events(store, i)) for i in islands},
    )
    figures["head_exit_code"] = head.returncode
    figures["startup_s"] = None if t0 is None else round(t0 - launched, 2)
    figures["ledger_check_exit"] = _check(["ledger", "check", str(run_dir)], run_dir)
    if case.islands > 1:
        figures["sync_replay_exit"] = _check(["sync", "replay", str(run_dir)], run_dir)
    if fault is not None:
        figures.update(fault.figures())
    return figures


def _first_appended(store: Any) -> Optional[float]:
    from yeto_core.buffer.sample_buffer import open_buffer

    try:
        buf = open_buffer(store, read_only=True)
    except Exception:
        return None
    try:
        return min((float(e.appended_at) for e in buf.entries(0)), default=None)
    finally:
        buf.close()


def _byte_lines(log_dir: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(log_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a SIGKILL
    return out


def _check(args: list[str], run_dir: Path) -> int:
    """``yeto ARGS`` on the finished run (no latency), its output in ``run_dir``; its exit."""
    from yeto_bench.chaos import YETO
    from yeto_bench.faulty_store import ENV

    env = {**os.environ, ENV: json.dumps({"rate": 0.0})}
    with open(run_dir / f"{args[0]}-{args[1]}.log", "wb") as log:
        return subprocess.run(
            [*YETO, *args], stdout=log, stderr=subprocess.STDOUT, env=env, check=False
        ).returncode


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


@click.command("sync", epilog=exit_codes())
@click.option("--islands", default="1,2,3", show_default=True, help="Trainer island counts.")
@click.option("--presets", default="strict,elastic", show_default=True)
@click.option("--latencies", default="20,200", show_default=True, help="ms per store request.")
@click.option(
    "--bandwidth",
    type=float,
    default=10e6,
    show_default=True,
    help="Bytes/s of every object body, per process (0: unlimited).",
)
@click.option("--local-steps", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--target", type=float, default=0.8, show_default=True)
@click.option("--timeout-s", type=float, default=300.0, show_default=True, help="Per case.")
@click.option("--kill-after", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--faults",
    default="kill",
    show_default=True,
    help="The fault cases, comma-separated (kill: an island SIGKILLed mid-horizon, "
    "replaced by a new one; late-join: the same, its replacement starting 10 s late).",
)
@click.option("--no-fault", is_flag=True, help="Skip the fault cases.")
@click.option("--lr", type=float, default=LR, show_default=True, help="The single island's.")
@click.option("--scale-lr", is_flag=True, help="Each of N islands at --lr x N (not --lr).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--seeds",
    default=None,
    help="Run every case once per seed, comma-separated (instead of --seed): each case's "
    "time to target is the median, with every seed's figures under per_seed.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="The short profile: islands 1,3, the elastic preset, latency 20 ms, target 0.55, "
    "at most 200 s per case, with the fault case.",
)
@click.option("--base-dir", type=click.Path(file_okay=False), default=None)
@click.option("--work-dir", type=click.Path(file_okay=False), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(**options: Any) -> None:
    """Trainer islands through a slow store: time to target, bytes, sync waits (JSON)."""
    report = run_bench(**options)
    if options["as_json"]:
        click.echo(json.dumps(report, sort_keys=True))
        return
    for name, c in report["cases"].items():
        click.echo(
            f"{name:>22}: {c['time_to_target_s']} s to target, {c['outer_steps']} outer "
            f"steps, vs single {c['vs_single']}"
        )
    for name, f in report["faults"].items():
        click.echo(f"{name:>22}: {f['time_to_target_s']} s to target, checks ok {f['ok']}")
    if not report["ok"]:
        raise SystemExit(1)


def run_bench(
    *,
    islands: str,
    presets: str,
    latencies: str,
    bandwidth: float,
    local_steps: int,
    target: float,
    timeout_s: float,
    kill_after: int,
    no_fault: bool,
    lr: float,
    scale_lr: bool,
    seed: int,
    quick: bool,
    base_dir: Optional[str],
    work_dir: Optional[str],
    faults: str = "kill",
    as_json: bool = False,
    seeds: Optional[str] = None,
) -> dict[str, Any]:
    """Every case of the plan; the report (:func:`yeto_bench.sync_figures.assemble`)."""
    counts = tuple(int(x) for x in _floats(islands))
    names = tuple(p.strip() for p in presets.split(",") if p.strip())
    lats = _floats(latencies)
    if quick:
        counts, names, lats, target, timeout_s = (1, 3), ("elastic",), (20.0,), 0.55, 200.0
    chosen = () if no_fault else tuple(f.strip() for f in faults.split(",") if f.strip())
    bad = [p for p in names if p not in PRESETS] + [f for f in chosen if f not in FAULTS]
    if bad or not counts or not lats or min(counts) < 1:
        raise click.UsageError(
            f"unknown {bad or 'sizes'} in --presets {presets!r} / --faults {faults!r} / "
            f"--islands {islands!r} / "
            f"--latencies {latencies!r}: presets are {', '.join(PRESETS)}, faults "
            f"{', '.join(FAULTS)}, island counts >= 1, at least one latency"
        )
    try:
        chosen_seeds = [int(x) for x in seeds.split(",") if x.strip()] if seeds else [seed]
    except ValueError:
        chosen_seeds = []
    if not chosen_seeds or len(set(chosen_seeds)) != len(chosen_seeds):
        raise click.UsageError(f"--seeds {seeds!r}: distinct integers, comma-separated")
    cases = plan(counts, names, lats, chosen)
    base = Path(base_dir or "runs/base/sort4-t30").absolute()
    load = os.getloadavg()
    results: dict[str, dict[str, Any]] = {}
    fault_cases: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="yeto-sync-") as tmp:
        root = Path(work_dir).absolute() if work_dir else Path(tmp)
        for case in cases:
            per_seed = {
                s: run_case(
                    case,
                    work=root if len(chosen_seeds) == 1 else root / f"seed-{s}",
                    base_dir=base,
                    seed=s,
                    target=target,
                    timeout_s=timeout_s,
                    local_steps=local_steps,
                    lr=lr,
                    scale_lr=scale_lr,
                    bandwidth=bandwidth,
                    kill_after=kill_after,
                )
                for s in chosen_seeds
            }
            figures = per_seed[chosen_seeds[0]] if len(per_seed) == 1 else merge_seeds(per_seed)
            if case.fault is None:
                results[case.name] = figures
            else:
                fault_cases[case.name] = {"case": case.name, **figures}
    settings = {
        "islands": list(counts),
        "presets": list(names),
        "latencies_ms": list(lats),
        "bandwidth_bytes_per_s": bandwidth,
        "local_steps": local_steps,
        "target": target,
        "timeout_s": timeout_s,
        "kill_after_outer_steps": kill_after,
        "lr_single": lr,
        "lr_scaled_by_islands": scale_lr,
        "seed": chosen_seeds[0] if len(chosen_seeds) == 1 else None,
        "seeds": chosen_seeds,
        "base_dir": str(base),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in load],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "elastic": "quorum islands - 1, carry_discount 0.5, max_carry_age 1",
        "outer_optimizer": "average",
    }
    return assemble(results, faults=fault_cases, settings=settings)
