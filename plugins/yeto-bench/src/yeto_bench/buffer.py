"""``yeto bench buffer``: sample buffer speed against baselines measured in the same run.

- ``append_groups_per_s``: durable ``append`` of groups (8 samples x 1024 tokens)
  to a ``dir`` store (layout ``jsonl``, fsync on), encoding included.
- ``fsync_limit_groups_per_s``: a plain loop writing the same bytes (payload and
  index line) with the same minimum fsyncs that durability needs: payload file
  fsync, link into place, directory fsync, index append + fdatasync.
- ``append_ratio`` = the first over the second (goal >= 0.8).
- ``batched_append_groups_per_s``: the same groups through ``append_many``, 8
  groups per call (one group commit: the call's payloads written as one pack
  object, so one payload fsync, one directory fsync and one index write and
  fdatasync per call); ``batched_vs_single`` = it over ``append_groups_per_s``
  (goal >= 3).
- ``batched_fsync_limit_groups_per_s``: a plain loop doing the same minimum per
  8 groups (the 8 payloads' bytes in one file: fsync, link, directory fsync;
  the 8 index lines in one write + fdatasync); ``batched_append_ratio`` =
  ``batched_append_groups_per_s`` over it. The four loops alternate in blocks
  of 16 groups; 800 groups by default (100 calls of each batched loop: with 200,
  a few slow syncs of the disk swung ``batched_vs_single`` from 2.5 to 3.8
  between runs).
- ``tick_ms_1k`` / ``tick_ms_100k``: median time of a head's ``backlog()`` while
  following a buffer with 1k / 100k groups of history (64 waiting; each tick 4
  groups arrive and 4 are consumed). The history is written with a fast path
  (index lines only); the measured call is the real ``backlog()``.
  ``tick_ratio`` = 100k over 1k (goal <= 1.5).
- ``select_commit_ms``: median of ``select`` + ``commit`` of 64-group rounds.
- ``s3_append_ratio`` (yeto-s3 and moto installed): appends through the s3
  store on a local moto server against a ``raw_put`` loop of the same bytes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import click
import numpy as np

from yeto_core import serde
from yeto_core.buffer.group_codec import encode_group
from yeto_core.buffer.sample_buffer import ConsumedState, FileSampleBuffer, encode_record
from yeto_core.cli import exit_codes
from yeto_core.records import RoundSpec, Sample, SampleGroup
from yeto_core.stores.dir_store import DirStore
from yeto_core.stores.fsync import fsync_dir


def make_group(i: int, samples: int = 8, tokens: int = 1024, prompt: int = 256) -> SampleGroup:
    rng = np.random.default_rng(i)
    out = []
    for k in range(samples):
        resp = tokens - prompt
        out.append(
            Sample(
                tokens=rng.integers(0, 150_000, tokens, dtype=np.int32),
                prompt_len=prompt,
                logprobs=rng.standard_normal(resp).astype(np.float32),
                loss_mask=np.ones(resp, dtype=np.uint8),
                reward=float(k % 2),
                weight_version=i // 64,
            )
        )
    return SampleGroup(f"bench-{i:08d}", f"p{i}", "bench", 0, tuple(out), task="bench")


def _record(i: int, position: int, version: int = 0) -> dict[str, Any]:
    return {
        "position": position,
        "group_id": f"bench-{i:08d}",
        "prompt_id": f"p{i}",
        "host": "bench",
        "incarnation": 0,
        "n_samples": 8,
        "min_version": version,
        "max_version": version,
        "appended_at": 1.0e9 + i,
        "payload": f"buffer/groups/bench-{i:08d}.safetensors",
        "seq": -1,
    }


def bench_append(
    base: Path, groups: list[SampleGroup], block: int = 16, batch: int = 8
) -> tuple[float, float, float, float]:
    """(append, fsync-limit, batched append, batched fsync-limit) groups/s on one disk.

    The four loops alternate in blocks of ``block`` groups (each block's order
    rotated) so that disk and load drift hit all alike; the batched loops take
    ``batch`` groups per call (the buffer's its own store, so no call finds its
    ids already there).
    """
    payloads = [encode_group(g) for g in groups]
    lines = [encode_record(_record(i, i)) for i in range(len(groups))]

    buf = FileSampleBuffer(DirStore(base / "buffer"), layout="jsonl")
    buf.append(make_group(10**7))  # create directories and files outside the timing
    bbuf = FileSampleBuffer(DirStore(base / "batched"), layout="jsonl")
    bbuf.append(make_group(10**7))
    gdir = base / "limit" / "groups"
    gdir.mkdir(parents=True)
    index = os.open(base / "limit" / "index.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    bdir = base / "blimit" / "groups"
    bdir.mkdir(parents=True)
    bindex = os.open(base / "blimit" / "index.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def run_buffer(part: range) -> float:
        t0 = time.perf_counter()
        for i in part:
            buf.append(groups[i])
        return time.perf_counter() - t0

    def run_limit(part: range) -> float:
        t0 = time.perf_counter()
        for i in part:
            tmp = gdir / f".g{i}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, payloads[i])
            os.fsync(fd)  # 1: the payload's bytes
            os.close(fd)
            os.link(tmp, gdir / f"g{i}.safetensors")
            os.unlink(tmp)
            fsync_dir(gdir)  # 2: the payload's name
            os.write(index, lines[i])
            os.fdatasync(index)  # 3: the index record
        return time.perf_counter() - t0

    def run_batched(part: range) -> float:
        t0 = time.perf_counter()
        for lo in range(part.start, part.stop, batch):
            bbuf.append_many(groups[lo : min(part.stop, lo + batch)])
        return time.perf_counter() - t0

    def run_batched_limit(part: range) -> float:
        t0 = time.perf_counter()
        for lo in range(part.start, part.stop, batch):
            hi = min(part.stop, lo + batch)
            tmp = bdir / f".p{lo}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"".join(payloads[lo:hi]))
            os.fsync(fd)  # 1: the batch's payload bytes
            os.close(fd)
            os.link(tmp, bdir / f"p{lo}.bin")
            os.unlink(tmp)
            fsync_dir(bdir)  # 2: the pack's name
            os.write(bindex, b"".join(lines[lo:hi]))
            os.fdatasync(bindex)  # 3: the batch's index records
        return time.perf_counter() - t0

    n = len(groups)
    loops = [run_buffer, run_limit, run_batched, run_batched_limit]
    totals = [0.0] * len(loops)
    for k, lo in enumerate(range(0, n, block)):
        part = range(lo, min(n, lo + block))
        for j in range(len(loops)):
            which = (j + k) % len(loops)
            totals[which] += loops[which](part)
    os.close(index)
    os.close(bindex)
    buf.close()
    bbuf.close()
    return n / totals[0], n / totals[1], n / totals[2], n / totals[3]


def _write_history(root: Path, n: int, watermark: int) -> DirStore:
    store = DirStore(root, fsync=False)
    (root / "buffer").mkdir(parents=True, exist_ok=True)
    with open(root / "buffer" / "index.jsonl", "wb") as f:
        chunk = []
        for i in range(n):
            chunk.append(encode_record(_record(i, i, version=i // 64)))
            if len(chunk) == 4096:
                f.write(b"".join(chunk))
                chunk = []
        f.write(b"".join(chunk))
    store.put("buffer/consumed.json", serde.dumps(ConsumedState(watermark=watermark)).encode())
    return store


def bench_tick(root: Path, history: int, ticks: int, waiting: int = 64, step: int = 4) -> float:
    """Median ms of a following head's ``backlog()``; ``step`` groups arrive and leave per tick."""
    store = _write_history(root, history, history - waiting)
    head = FileSampleBuffer(store, layout="jsonl", read_only=True)
    head.backlog()  # the head has been following: its cursor is at the end
    index = os.open(root / "buffer" / "index.jsonl", os.O_WRONLY | os.O_APPEND)
    pos = history
    times = []
    for t in range(ticks):
        os.write(index, b"".join(encode_record(_record(pos + k, pos + k)) for k in range(step)))
        pos += step
        state = ConsumedState(watermark=pos - waiting, updated_at=float(t))
        store.put("buffer/consumed.json", serde.dumps(state).encode())
        t0 = time.perf_counter()
        b = head.backlog()
        times.append(time.perf_counter() - t0)
        if b.groups != waiting or b.head_position != pos:
            raise AssertionError(f"bench tick saw {b}, expected {waiting} waiting at head {pos}")
    os.close(index)
    head.close()
    return statistics.median(times) * 1e3


def bench_select_commit(root: Path, rounds: int) -> float:
    store = _write_history(root, 64 * rounds, 0)
    store = DirStore(root)  # commits are durable (fsync on)
    buf = FileSampleBuffer(store, layout="jsonl")
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        r = buf.select(RoundSpec(max_groups=64, current_version=10**6, max_policy_age=10**6))
        buf.commit(r)
        times.append(time.perf_counter() - t0)
        if len(r.entries) != 64:
            raise AssertionError(f"bench round took {len(r.entries)} groups, expected 64")
    buf.close()
    return statistics.median(times) * 1e3


def bench_s3(groups: list[SampleGroup]) -> Optional[float]:
    """Buffer appends vs a ``raw_put`` loop on a local moto server; None without yeto-s3/moto."""
    try:
        import moto  # noqa: F401  (the loopback S3 server)

        from yeto_s3 import testing
    except ImportError:
        return None
    from yeto_core.plugins import get_plugins

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request log lines
    endpoint, stop = testing.start_moto_server()
    try:
        testing.create_bucket(endpoint, "bench")
        opts = testing.s3_options(endpoint)
        plugins = get_plugins()
        payloads = [encode_group(g) for g in groups]
        lines = [encode_record(_record(i, i)) for i in range(len(groups))]
        t_buf = t_raw = 0.0
        n = len(groups)
        for k, part in enumerate([range(n // 2), range(n // 2, n)]):
            raw = plugins.open_store(f"s3://bench/raw{k}", **opts)
            t0 = time.perf_counter()
            for i in part:
                raw.raw_put(f"buffer/groups/g{i}.safetensors", payloads[i])
                raw.raw_put(f"buffer/index/{i:012d}.json", lines[i])
            t_raw += time.perf_counter() - t0
            store = plugins.open_store(f"s3://bench/buf{k}", **opts)
            buf = FileSampleBuffer(store, layout="objects")
            buf.append(make_group(10**7))  # first append lists the index; outside the timing
            t0 = time.perf_counter()
            for i in part:
                buf.append(groups[i])
            t_buf += time.perf_counter() - t0
        return t_raw / t_buf
    finally:
        stop()


def run(
    groups: int = 800,
    ticks: int = 200,
    small_history: int = 1_000,
    large_history: int = 100_000,
    rounds: int = 20,
    s3_groups: int = 100,
    workdir: Optional[str] = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Every figure of ``yeto bench buffer`` as one dict."""
    base = Path(tempfile.mkdtemp(prefix="yeto-bench-buffer-", dir=workdir))
    try:
        progress("building groups")
        gs = [make_group(i) for i in range(groups)]
        progress("append vs fsync limit")
        append_rate, limit_rate, batched_rate, blimit_rate = bench_append(base / "append", gs)
        progress("head ticks")
        tick_small = bench_tick(base / "tick-small", small_history, ticks)
        tick_large = bench_tick(base / "tick-large", large_history, ticks)
        progress("select + commit")
        sel = bench_select_commit(base / "select", rounds)
        out: dict[str, Any] = {
            "append_groups_per_s": round(append_rate, 1),
            "fsync_limit_groups_per_s": round(limit_rate, 1),
            "append_ratio": round(append_rate / limit_rate, 3),
            "batched_append_groups_per_s": round(batched_rate, 1),
            "batched_vs_single": round(batched_rate / append_rate, 3),
            "batched_fsync_limit_groups_per_s": round(blimit_rate, 1),
            "batched_append_ratio": round(batched_rate / blimit_rate, 3),
            "batch_groups": 8,
            "tick_ms_1k": round(tick_small, 4),
            "tick_ms_100k": round(tick_large, 4),
            "tick_ratio": round(tick_large / tick_small, 3),
            "select_commit_ms": round(sel, 3),
            "groups": groups,
            "group_samples": 8,
            "sample_tokens": 1024,
            "history_small": small_history,
            "history_large": large_history,
        }
        if s3_groups > 0:
            progress("s3 (moto)")
            ratio = bench_s3(gs[: max(2, s3_groups)])
            if ratio is not None:
                out["s3_append_ratio"] = round(ratio, 3)
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


@click.command(epilog=exit_codes())
@click.option(
    "--groups",
    default=800,
    show_default=True,
    help="Groups appended per measure (the batched loops make a call per 8).",
)
@click.option("--ticks", default=200, show_default=True, help="Head ticks measured per history.")
@click.option("--small-history", default=1_000, show_default=True)
@click.option("--large-history", default=100_000, show_default=True)
@click.option("--rounds", default=20, show_default=True, help="64-group rounds measured.")
@click.option("--s3-groups", default=100, show_default=True, help="0 skips the s3 measure.")
@click.option("--dir", "workdir", default=None, help="Scratch directory (on the disk to measure).")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON object.")
def command(
    groups: int,
    ticks: int,
    small_history: int,
    large_history: int,
    rounds: int,
    s3_groups: int,
    workdir: Optional[str],
    as_json: bool,
) -> None:
    """Sample buffer: durable appends vs the fsync limit, head tick vs history, rounds."""

    def progress(msg: str) -> None:
        if not as_json:
            click.echo(f"... {msg}", err=True)

    out = run(groups, ticks, small_history, large_history, rounds, s3_groups, workdir, progress)
    click.echo(json.dumps(out, sort_keys=True))
