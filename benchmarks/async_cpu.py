"""Steady-state rounds per second and CPU per trained round, per role, of the e2e async run.

Runs ``yeto run up`` on the ``yeto bench e2e`` async config (2 ``hf`` sampler
islands, the ``torch`` trainer under S1, a ``dir`` store) for ``--rounds`` rounds
and reads, between round ``--from`` and round ``--to``, the rounds per second and
the CPU (user + system, from ``/proc``) every process of each role used per trained
round. Skipping the first rounds leaves out the islands' start-up; counting CPU per
round rather than wall time shows what each role costs even when the cores are
saturated. Linux only (``/proc``).

    python benchmarks/async_cpu.py [--rounds 400] [--from 100] [--to 350]
        [--engine-option lean=false] [--backend-option lean=false]
        [--sampler-key whole_call_wait_s=0] [--no-pin]
        [--base-dir runs/base/sort4]

Interleave runs of the two settings to compare (the machine's speed drifts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from yeto_bench.e2e import e2e_config
from yeto_core.providers.local import _proc_stat


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, _, v = item.partition(b"=")
        if k.startswith(b"YETO_"):
            out[k.decode()] = v.decode(errors="replace")
    return out


def _cpu_s(pid: int) -> float:
    fields = _proc_stat(pid)
    if fields is None:
        raise OSError(f"process {pid} is gone")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _children(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (fields := _proc_stat(int(d))) is not None:
            kids.setdefault(int(fields[1]), []).append(int(d))  # by ppid
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--from", dest="start", type=int, default=100)
    ap.add_argument("--to", dest="end", type=int, default=350)
    ap.add_argument("--base-dir", default="runs/base/sort4")
    ap.add_argument("--task", default="sort4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--engine-option",
        action="append",
        default=[],
        help="KEY=VALUE added to samplers.engine_options (TOML value), e.g. lean=false",
    )
    ap.add_argument(
        "--backend-option",
        action="append",
        default=[],
        help="KEY=VALUE added to trainer.backend_options (TOML value), e.g. lean=false",
    )
    ap.add_argument("--samplers", type=int, default=2, help="sampler islands")
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="leave the islands on every CPU (default: the trainer on the first, the samplers "
        "on the others, as yeto bench e2e)",
    )
    ap.add_argument(
        "--sampler-key",
        action="append",
        default=[],
        help="KEY=VALUE added to the [[samplers]] table (TOML value), e.g. whole_call_wait_s=0",
    )
    args = ap.parse_args()
    if not 0 <= args.start < args.end <= args.rounds:
        ap.error("need 0 <= --from < --to <= --rounds")
    run_dir = Path(tempfile.mkdtemp(prefix="async-cpu-"))
    toml = e2e_config(
        run_dir,
        mode="async",
        base_dir=Path(args.base_dir).absolute(),
        task=args.task,
        seed=args.seed,
        timeout_s=600.0,
        pin=not args.no_pin,
        samplers=args.samplers,
    ).replace("total_rounds = 0", f"total_rounds = {args.rounds}")
    for options, key in (
        (args.engine_option, "engine_options"),
        (args.backend_option, "backend_options"),
    ):
        if not options:
            continue
        extra = ", ".join(o.replace("=", " = ", 1) for o in options)
        head, sep, rest = toml.partition(f"{key} = {{ ")
        if not sep:
            raise SystemExit(f"no {key} in the generated config")
        toml = f"{head}{sep}{extra}, {rest}"
    for item in args.sampler_key:
        key, _, value = item.partition("=")
        head, sep, rest = toml.partition("sync_rounds = false\n")
        if not sep:
            raise SystemExit("no [[samplers]] sync_rounds line in the generated config")
        toml = f"{head}{sep}{key} = {value}\n{rest}"
    cfg = run_dir.with_suffix(".toml")
    cfg.write_text(toml)
    events = run_dir / "store" / "events" / "trainer.jsonl"
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "yeto"), "run", "up", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    roles: dict[int, str] = {}
    cpu: dict[int, float] = {}

    def rounds() -> int:
        try:
            with open(events) as f:
                return sum(1 for line in f if '"round_trained"' in line)
        except FileNotFoundError:
            return 0

    def snapshot() -> dict[str, float]:
        for pid in _children(head.pid):
            if pid not in roles:
                env = _environ(pid)
                if pid != head.pid and "YETO_ROLE" not in env:
                    continue  # a helper process of the head's (not an island)
                roles[pid] = env.get("YETO_ROLE", "head")
            try:
                cpu[pid] = _cpu_s(pid)
            except OSError:
                pass  # exited: its last reading stands
        out: dict[str, float] = {}
        for pid, seconds in cpu.items():
            out[roles[pid]] = out.get(roles[pid], 0.0) + seconds
        return out

    marks: dict[str, tuple[int, dict[str, float], float]] = {}
    try:
        while head.poll() is None:
            n = rounds()
            snap = snapshot()
            if n >= args.start and "a" not in marks:
                marks["a"] = (n, snap, time.monotonic())
            if n >= args.end and "b" not in marks:
                marks["b"] = (n, snap, time.monotonic())
            time.sleep(0.1)
    finally:
        if head.poll() is None:
            head.terminate()
            head.wait()
    if "b" not in marks:
        print(
            json.dumps({"error": f"the run ended after {rounds()} rounds", "run_dir": str(run_dir)})
        )
        return 1
    (na, ca, ta), (nb, cb, tb) = marks["a"], marks["b"]
    calls = 0
    for stream in (run_dir / "store" / "events").glob("*.jsonl"):
        if stream.name != "trainer.jsonl" and stream.name != "head.jsonl":
            with open(stream) as f:
                calls += sum(1 for line in f if '"sampler_round"' in line)
    r = nb - na
    print(
        json.dumps(
            {
                "bench": "async_cpu",
                "engine_options": args.engine_option,
                "backend_options": args.backend_option,
                "sampler_keys": args.sampler_key,
                "pinned": not args.no_pin,
                "samplers": args.samplers,
                "rounds": [na, nb],
                "rounds_per_s": round(r / (tb - ta), 2),
                # sampler calls per trained round over the whole run
                "sampler_calls_per_round": round(calls / max(1, rounds()), 2),
                "cpu_ms_per_round": {
                    k: round(1000 * (cb[k] - ca.get(k, 0.0)) / r, 1) for k in sorted(cb)
                },
            }
        )
    )
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
