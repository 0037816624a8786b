"""A plain hand-written asynchronous GRPO loop: the baseline of ``yeto bench e2e``.

No durability, no scheduler, no checks: ``--samplers`` sampler processes and
one trainer process pass safetensors files through a directory.

- a sampler (the ``hf`` engine of yeto_torch) generates ``--prompts-per-call``
  groups of ``--group-size`` answers per call, scores them with the task, and
  writes them as one safetensors file per group (``yeto_core.buffer.group_codec``,
  written to a temporary name, then renamed) into ``groups/``; it waits while
  ``--backlog-cap`` groups wait for the trainer, keeps at least
  ``--min-round-s`` per call, and loads the newest release from
  ``releases/`` before each call;
- the trainer (the ``torch`` backend of yeto_torch) takes the oldest group
  files only as the round it fills needs them (the others stay in ``groups/``,
  so the samplers' backlog cap binds), drops groups more than
  ``--max-policy-age`` versions older than the policy the round trains, trains
  one GRPO step, exports a release after every ``--publish-every``-th round
  (``releases/v<N>``, renamed into place) and appends one JSON line per round
  (time, per-group mean rewards) to ``rounds.jsonl``.

The parent watches ``rounds.jsonl`` and prints one JSON object: the time from
the first group file to the first moment the rolling mean reward over the last
``--window`` trained groups reaches ``--target`` (``time_to_target_s``), and
``startup_s`` (launch to the first group). Same task, base, hyperparameters
and threads as the quickstart / ``yeto bench e2e``.

    python benchmarks/plain_loop.py --base-dir runs/base/sort4 --task sort4 --target 0.8
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path


def _groups(d: Path) -> list[Path]:
    return sorted(d.glob("*.safetensors"), key=lambda p: p.name)


def _newest_release(d: Path) -> tuple[int, Path] | None:
    best = None
    for p in d.glob("v*"):
        if p.is_dir() and p.name[1:].isdigit():
            v = int(p.name[1:])
            if best is None or v > best[0]:
                best = (v, p)
    return best


def sampler(args: argparse.Namespace, index: int) -> None:
    import numpy as np

    from yeto_core.buffer.group_codec import encode_group
    from yeto_core.records import Sample, SampleGroup, SampleStatus, SamplingParams
    from yeto_torch.engine import HFEngine
    from yeto_torch.tasks import AddOneDigit, AddTwoDigits, SortDigits

    tasks = {c.PLUGIN_NAME: c for c in (SortDigits, AddOneDigit, AddTwoDigits)}
    work = Path(args.work)
    gdir, rdir = work / "groups", work / "releases"
    engine = HFEngine(str(args.base_dir), seed=args.seed * 1000 + index, threads=1)
    task = tasks[args.task]()
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
    n = 0
    while True:
        while len(_groups(gdir)) >= args.backlog_cap:
            time.sleep(0.02)
        rel = _newest_release(rdir)
        if rel is not None and rel[0] > engine.version:
            engine.load_release(types.SimpleNamespace(version=rel[0], path=rel[1]))
        started = time.monotonic()
        indices = [(index << 40) + n + k for k in range(args.prompts_per_call)]
        prompts = [task.prompt(i) for i in indices]
        ids = [engine.encode(text) for text, _ in prompts]
        outs = engine.generate(ids, args.group_size, sampling)
        for i, (_, answer), pids, comps in zip(indices, prompts, ids, outs, strict=True):
            samples = tuple(
                Sample(
                    tokens=np.concatenate(
                        [np.asarray(pids, dtype=np.int64), np.asarray(c.tokens, dtype=np.int64)]
                    ),
                    prompt_len=len(pids),
                    logprobs=np.asarray(c.logprobs, dtype=np.float32),
                    loss_mask=np.ones(len(c.tokens), dtype=np.float32),
                    reward=float(task.reward(answer, engine.decode(c.tokens))),
                    weight_version=int(c.weight_version),
                    status=SampleStatus.TRUNCATED
                    if c.finish_reason == "length"
                    else SampleStatus.COMPLETED,
                )
                for c in comps
            )
            group = SampleGroup(
                group_id=f"s{index}-p{i}",
                prompt_id=f"{args.task}:{i}",
                sampler_host=f"s{index}",
                sampler_incarnation=0,
                samples=samples,
                task=args.task,
                sampling=sampling,
            )
            name = f"{time.time():.6f}-s{index}-{i}.safetensors"
            tmp = gdir / f".{name}.tmp"
            tmp.write_bytes(encode_group(group))
            os.replace(tmp, gdir / name)
        n += args.prompts_per_call
        rest = args.min_round_s - (time.monotonic() - started)
        if rest > 0:
            time.sleep(rest)


def trainer(args: argparse.Namespace) -> None:
    from yeto_core.buffer.group_codec import decode_group
    from yeto_core.records import Batch
    from yeto_torch.backend import TorchBackend

    work = Path(args.work)
    gdir, rdir = work / "groups", work / "releases"
    backend = TorchBackend(str(args.base_dir), lr=args.lr, threads=1, seed=args.seed)
    backend.restore(None)
    version = 0
    position = 0
    held: list = []  # at most groups_per_round - 1 groups: the round being filled
    first = None  # when the first group was written (from its file name)
    with open(work / "rounds.jsonl", "a") as log:
        while True:
            # Take files only as the round needs them, oldest first: the rest stay in
            # groups/, so the samplers' backlog cap binds as yeto's does.
            for f in _groups(gdir)[: args.groups_per_round - len(held)]:
                created = float(f.name.split("-", 1)[0])
                first = created if first is None else min(first, created)
                g = decode_group(f.read_bytes(), where=str(f))
                f.unlink()
                # The policy-age gate at training time: ``version`` only changes when a
                # round is trained, and this round trains at ``version``.
                if version - min(s.weight_version for s in g.samples) > args.max_policy_age:
                    continue  # stale: dropped, as yeto's policy-age gate does
                held.append((position, g))
                position += 1
            if len(held) < args.groups_per_round:
                time.sleep(0.005)
                continue
            batch_items, held = held, []
            batch = Batch(
                groups=tuple(g for _, g in batch_items),
                positions=tuple(p for p, _ in batch_items),
                policy_version=version,
            )
            backend.train_round(batch)
            version += 1
            if version % args.publish_every == 0:
                out = rdir / f".v{version}.tmp"
                backend.publish_release(out)
                os.replace(out, rdir / f"v{version}")
            rewards = [sum(s.reward for s in g.samples) / len(g.samples) for g in batch.groups]
            ages = [
                batch.policy_version - min(s.weight_version for s in g.samples)
                for g in batch.groups
            ]
            entry = {"time": time.time(), "first": first, "rewards": rewards, "ages": ages}
            log.write(json.dumps(entry) + "\n")
            log.flush()


def time_to_target(rounds, *, target: float, t0: float, window: int):
    rewards: list[float] = []
    curve = []
    for r in rounds:
        rewards.extend(r["rewards"])
        last = rewards[-window:]
        mean = sum(last) / len(last)
        curve.append((round(r["time"] - t0, 3), round(mean, 4)))
        if len(rewards) >= window and mean >= target:
            return round(r["time"] - t0, 3), curve
    return None, curve


def _steps_per_s(rounds, t0, hit):
    if t0 is None or not rounds:
        return None
    until = t0 + hit if hit is not None else rounds[-1]["time"]
    steps = sum(1 for r in rounds if r["time"] <= until + 1e-9)
    return round(steps / (until - t0), 3) if until > t0 else None


def _mean(values: list[int]):
    return round(sum(values) / len(values), 3) if values else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-dir", required=True)
    ap.add_argument("--task", default="sort4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--samplers", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompts-per-call", type=int, default=8)
    ap.add_argument("--min-round-s", type=float, default=0.3)
    ap.add_argument("--backlog-cap", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--groups-per-round", type=int, default=16)
    ap.add_argument("--max-policy-age", type=int, default=3)
    ap.add_argument("--publish-every", type=int, default=1, help="a release every N-th round")
    ap.add_argument(
        "--trainer-cpus", default="", help="pin the trainer process to these CPUs ('0', '0-1')"
    )
    ap.add_argument(
        "--sampler-cpus", default="", help="pin the sampler processes to these CPUs ('1', '1-3')"
    )
    ap.add_argument("--work", default=None, help="(internal) the exchange directory")
    ap.add_argument("--role", default=None, help="(internal) sampler-<i> or trainer")
    args = ap.parse_args(argv)
    if args.publish_every < 1:
        ap.error(f"--publish-every {args.publish_every}: give 1 or more (1: a release per round)")
    args.base_dir = Path(args.base_dir).absolute()
    if args.role:  # pinned like yeto's islands (yeto_core.providers.env.pin_cpus)
        cpus = args.trainer_cpus if args.role == "trainer" else args.sampler_cpus
        if cpus:
            from yeto_core.providers.env import parse_cpus

            os.sched_setaffinity(0, parse_cpus(cpus))
    if args.role == "trainer":
        trainer(args)
        return 0
    if args.role and args.role.startswith("sampler-"):
        sampler(args, int(args.role.split("-", 1)[1]))
        return 0
    if not (args.base_dir / "config.json").is_file():
        print(
            json.dumps({"error": f"no base model at {args.base_dir}; run `yeto run up` once"}),
            flush=True,
        )
        return 2
    import tempfile

    with tempfile.TemporaryDirectory(prefix="plain-loop-") as tmp:
        work = Path(args.work or tmp)
        (work / "groups").mkdir(parents=True, exist_ok=True)
        (work / "releases").mkdir(parents=True, exist_ok=True)
        raw = [a for a in (argv if argv is not None else sys.argv[1:])]
        base = [sys.executable, str(Path(__file__).absolute()), *raw, "--work", str(work)]
        launched = time.time()
        roles = ["trainer", *(f"sampler-{i}" for i in range(args.samplers))]
        procs = [
            subprocess.Popen([*base, "--role", r], start_new_session=True, stdout=sys.stderr)
            for r in roles
        ]
        t0 = None
        hit, curve, rounds = None, [], []
        try:
            deadline = None
            while True:
                if any(p.poll() is not None for p in procs):
                    raise SystemExit(
                        f"a plain-loop process exited: {[p.returncode for p in procs]}"
                    )
                log = work / "rounds.jsonl"
                if log.exists():
                    lines = log.read_text().splitlines()
                    rounds = [json.loads(x) for x in lines if x.endswith("}")]
                # t0: the first group written (the trainer logs it; files are consumed at once)
                firsts = [float(f.name.split("-", 1)[0]) for f in _groups(work / "groups")]
                firsts += [r["first"] for r in rounds[:1] if r.get("first") is not None]
                if firsts and (t0 is None or min(firsts) < t0):
                    t0 = min(firsts)
                    deadline = t0 + args.timeout_s
                if t0 is None and time.time() - launched > args.timeout_s + 300:
                    break
                if t0 is not None and rounds:
                    hit, curve = time_to_target(
                        rounds, target=args.target, t0=t0, window=args.window
                    )
                if hit is not None or (deadline is not None and time.time() >= deadline):
                    break
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    print(
        json.dumps(
            {
                "bench": "plain_loop",
                "task": args.task,
                "target": args.target,
                "time_to_target_s": hit,
                "startup_s": round((t0 or launched) - launched, 2),
                "rounds_trained": len(rounds),
                # optimizer steps per second, from the first group to the target (or the end)
                "optimizer_steps_per_s": _steps_per_s(rounds, t0, hit),
                # the policy age of every trained group, at the version its round trained
                "max_trained_age": max(
                    (a for r in rounds for a in r.get("ages", [])), default=None
                ),
                "mean_trained_age": _mean([a for r in rounds for a in r.get("ages", [])]),
                "reward_curve": curve[:: max(1, len(curve) // 50)],
            },
            sort_keys=True,
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
