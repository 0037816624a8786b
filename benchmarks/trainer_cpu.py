"""CPU per trainer round and per follower load of the built-in torch trainer and hf engine,
in one process (prints JSON).

Rounds of 16 x 8 samples drawn from the sort4 base with a fixed seed (the same in every
process), timed with ``time.process_time`` after warm-up rounds; then releases published
through a ``dir`` store and loaded by a ``PolicyFollower`` serving an ``hf`` engine (fetch,
digest check, load, checksum, fingerprint). Run it from an older tree's checkout (its
packages first on ``PYTHONPATH``) to compare, interleaved, and pin it (``taskset -c 0``)::

    taskset -c 0 python benchmarks/trainer_cpu.py --rounds 80 --loads 60
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-dir", default="runs/base/sort4")
    ap.add_argument("--rounds", type=int, default=80)
    ap.add_argument("--loads", type=int, default=60)
    args = ap.parse_args()

    import torch

    from yeto_core.release.store import ReleaseStore
    from yeto_core.sampler import fingerprint
    from yeto_core.sampler.follower import PolicyFollower
    from yeto_core.stores.dir_store import DirStore
    from yeto_torch.backend import TorchBackend
    from yeto_torch.engine import HFEngine
    from yeto_torch.testing import fixed_batches

    torch.set_num_threads(1)
    base = str(Path(args.base_dir).resolve())
    batches = fixed_batches(base, 6, prompts=16, g=8)
    backend = TorchBackend(base, lr=5e-4, threads=1)
    backend.restore(None)
    for b in batches[:2]:
        backend.train_round(b)
    rounds = []
    for i in range(args.rounds):
        t = time.process_time()
        backend.train_round(batches[i % len(batches)])
        rounds.append((time.process_time() - t) * 1e3)

    tmp = Path(tempfile.mkdtemp(prefix="yeto-trainer-cpu-"))
    try:
        releases = ReleaseStore(DirStore(tmp / "store"))
        follower = PolicyFollower(releases, HFEngine(base, seed=1, threads=1), work_dir=tmp / "w")
        loads = []
        for v in range(1, args.loads + 6):
            backend.train_round(batches[v % len(batches)])
            out = tmp / f"export-{v}"
            info = dict(backend.publish_release(out))
            info["version"] = v
            info[fingerprint.INFO_KEY] = fingerprint.for_backend(backend).to_json()
            releases.publish(out, info)
            shutil.rmtree(out)
            t = time.process_time()
            if follower.poll() != "loaded":
                raise SystemExit(f"release {v} was not loaded")
            if v > 5:  # after warm-up
                loads.append((time.process_time() - t) * 1e3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def summary(xs: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(xs), 2), "min": round(min(xs), 2), "n": len(xs)}

    print(
        json.dumps(
            {
                "bench": "trainer_cpu",
                "train_round_cpu_ms": summary(rounds),
                "follower_load_cpu_ms": summary(loads),
                "samples_per_round": 16 * 8,
            }
        )
    )


if __name__ == "__main__":
    main()
