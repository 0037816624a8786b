"""Where a single durable append's time goes: wall, user and system CPU per group.

The same two loops as ``yeto bench buffer``'s ``append_ratio``: ``FileSampleBuffer``
(``dir`` store, layout ``jsonl``, fsync on) ``append`` against a plain loop writing
the precomputed bytes with the minimum fsyncs (payload fsync, link, directory fsync,
index append + fdatasync), alternating in blocks of 16 groups. User CPU is what
yeto's own code costs (the disk's fsync times swing too much on a shared machine to
see a change of a few percent in the wall time); system CPU includes the file
system's work (creating an inode costs ~0.4-1.3 ms of system time on the
development VM's ext4, in both loops).

    python benchmarks/append_cpu.py [--groups 320] [--dir /tmp]

To compare with another tree: ``git archive <rev> yeto_core plugins/yeto-bench | tar
-x -C /tmp/old`` and run with
``PYTHONPATH=/tmp/old/yeto_core/src:/tmp/old/plugins/yeto-bench/src``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from yeto_bench.buffer import _record, make_group
from yeto_core.buffer.group_codec import encode_group
from yeto_core.buffer.sample_buffer import FileSampleBuffer, encode_record
from yeto_core.stores.dir_store import DirStore
from yeto_core.stores.fsync import fsync_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=320)
    ap.add_argument("--dir", default=None, help="scratch directory (on the disk to measure)")
    args = ap.parse_args()
    n = args.groups - args.groups % 16
    groups = [make_group(i) for i in range(n)]
    payloads = [encode_group(g) for g in groups]
    lines = [encode_record(_record(i, i)) for i in range(n)]
    base = Path(tempfile.mkdtemp(prefix="yeto-append-cpu-", dir=args.dir))
    try:
        buf = FileSampleBuffer(DirStore(base / "buffer"), layout="jsonl")
        buf.append(make_group(10**7))  # directories and files made outside the timing
        gdir = base / "limit" / "groups"
        gdir.mkdir(parents=True)
        index = os.open(base / "limit" / "index.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        totals = {"yeto": [0.0, 0.0, 0.0], "limit": [0.0, 0.0, 0.0]}

        def yeto(lo: int) -> None:
            for i in range(lo, lo + 16):
                buf.append(groups[i])

        def limit(lo: int) -> None:
            for i in range(lo, lo + 16):
                tmp = gdir / f".g{i}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.write(fd, payloads[i])
                os.fsync(fd)
                os.close(fd)
                os.link(tmp, gdir / f"g{i}.safetensors")
                os.unlink(tmp)
                fsync_dir(gdir)
                os.write(index, lines[i])
                os.fdatasync(index)

        for k, lo in enumerate(range(0, n, 16)):
            order = [("yeto", yeto), ("limit", limit)]
            for name, loop in order if k % 2 else order[::-1]:
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                loop(lo)
                t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                acc = totals[name]
                acc[0] += t1 - t0
                acc[1] += r1.ru_utime - r0.ru_utime
                acc[2] += r1.ru_stime - r0.ru_stime
        os.close(index)
        buf.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out: dict[str, float] = {"groups": n}
    for name, (wall, user, sys_) in totals.items():
        out[f"{name}_wall_ms"] = round(1e3 * wall / n, 3)
        out[f"{name}_user_ms"] = round(1e3 * user / n, 3)
        out[f"{name}_sys_ms"] = round(1e3 * sys_ / n, 3)
    out["extra_user_ms"] = round(out["yeto_user_ms"] - out["limit_user_ms"], 3)
    out["extra_sys_ms"] = round(out["yeto_sys_ms"] - out["limit_sys_ms"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
