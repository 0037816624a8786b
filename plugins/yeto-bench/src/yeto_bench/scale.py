"""``yeto bench scale``: many simulated sampler islands on one store; the head's cost per tick.

Per island count (``--islands 1,10,100,1000``) one fresh store: the loopback S3
server (moto, through yeto-s3, index layout ``objects``) when installed, else a
``dir`` store with per-host shards (``--store dir``, layout ``shards``, the head
merging). Every island is a lightweight appender (no model): its own buffer
object (host ``i<k>``) and its own :class:`~yeto_core.buffer.dispenser.StoreDispenser`;
``--workers`` threads step the islands round-robin (a step: claim
``prompts_per_call`` dispense positions, append that many tiny groups, ack). The
head thread ticks every ``--tick-s`` (the buffer's backlog, catching up the index
or merging the shards, and the fences list, as the head's tick does); a trainer
thread takes and commits rounds of ``--groups-per-round`` through the real
batch reader. Every store call of every part is counted.

Reported per island count: ``head_tick_ms`` p50/p99, ``merge_ms`` p50/p99 (the
index catch-up or shard merge part of the tick), ``claim_ms`` p50/p99,
``appends_per_s`` held over ``--seconds``, ``store_requests_per_trained_group``
(all parts) and ``head_requests_per_tick``. The summary compares the largest
count with 10 islands: ``tick_ratio_vs_10`` (the goal: <= 10, sub-linear) and
``requests_per_group_ratio_vs_10`` (flat: no request storm).
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import click
import numpy as np

from yeto_core.cli import exit_codes
from yeto_core.ports import ObjectStore


class CountingStore(ObjectStore):
    """Delegates to a store and counts every call (thread-safe)."""

    PLUGIN_NAME = "counting"

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls = 0
        self._lock = threading.Lock()

    def _n(self) -> None:
        with self._lock:
            self.calls += 1

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ObjectStore:  # pragma: no cover
        raise NotImplementedError("wrap a store: CountingStore(store)")

    def get(self, key: str) -> bytes:
        self._n()
        return self.inner.get(key)

    def put(self, key: str, data: bytes) -> None:
        self._n()
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._n()
        return self.inner.put_if_absent(key, data)

    def exists(self, key: str) -> bool:
        self._n()
        return self.inner.exists(key)

    def list(self, prefix: str = "", after: Optional[str] = None) -> Iterator[str]:
        self._n()
        return iter(list(self.inner.list(prefix, after)))

    def delete(self, key: str) -> None:
        self._n()
        self.inner.delete(key)

    def local_root(self) -> Optional[Path]:
        return self.inner.local_root()

    def fsyncs(self) -> bool:
        return self.inner.fsyncs()


def _group(gid: str, host: str, version: int) -> Any:
    from yeto_core.records import Sample, SampleGroup

    s = Sample(
        tokens=np.array([1, 2, 3, 4], dtype=np.int32),
        prompt_len=2,
        logprobs=np.full(2, -0.5, dtype=np.float32),
        loss_mask=np.ones(2, dtype=np.uint8),
        reward=0.5,
        weight_version=version,
    )
    return SampleGroup(gid, gid, host, 0, (s, s))


def _pct(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


def measure(
    store: CountingStore,
    *,
    islands: int,
    layout: str,
    seconds: float,
    workers: int,
    prompts_per_call: int,
    groups_per_round: int,
    tick_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """One island count on one fresh store (see the module docstring)."""
    from yeto_core.buffer.batch_reader import BatchReader
    from yeto_core.buffer.dispenser import StoreDispenser
    from yeto_core.buffer.fences import fenced
    from yeto_core.buffer.sample_buffer import FileSampleBuffer

    head = FileSampleBuffer(store, host="head", layout=layout, merger=layout == "shards")
    appenders = [
        (
            FileSampleBuffer(store, host=f"i{k}", layout=layout),
            StoreDispenser(
                store, island=f"i{k}", incarnation=0, range_size=prompts_per_call, rescan_s=5.0
            ),
        )
        for k in range(islands)
    ]
    reader = BatchReader(
        FileSampleBuffer(store, host="trainer", layout=layout),
        group_size=2,
        groups_per_round=groups_per_round,
        max_policy_age=10**6,
        wait_s=1.0,
        poll_s=0.05,
    )
    stop = threading.Event()
    lock = threading.Lock()
    busy = [threading.Lock() for _ in range(islands)]
    claim_ms: list[float] = []
    tick_ms: list[float] = []
    merge_ms: list[float] = []
    head_calls: list[int] = []
    appended = [0]
    trained = [0]
    cursor = [0]
    errors: list[str] = []

    def worker() -> None:
        try:
            while not stop.is_set():
                with lock:
                    k = cursor[0] % islands
                    cursor[0] += 1
                if not busy[k].acquire(blocking=False):  # an island is one process: one step
                    stop.wait(0.001)
                    continue
                try:
                    buf, disp = appenders[k]
                    t0 = clock()
                    slots = disp.take(prompts_per_call)
                    dt = (clock() - t0) * 1e3
                    for s in slots:
                        buf.append(_group(s.group_id("scale"), buf.host, 0))
                    disp.done(slots)
                finally:
                    busy[k].release()
                with lock:
                    claim_ms.append(dt)
                    appended[0] += len(slots)
        except Exception as exc:  # reported, never hidden
            errors.append(f"worker: {type(exc).__name__}: {exc}")
            stop.set()

    def head_loop() -> None:
        try:
            while not stop.wait(tick_s):
                before = store.calls
                t0 = clock()
                head.backlog()
                t1 = clock()
                fenced(store)
                t2 = clock()
                head_calls.append(store.calls - before)
                merge_ms.append((t1 - t0) * 1e3)
                tick_ms.append((t2 - t0) * 1e3)
        except Exception as exc:
            errors.append(f"head: {type(exc).__name__}: {exc}")
            stop.set()

    def trainer() -> None:
        version = 0
        try:
            while not stop.is_set():
                batch = reader.try_take(version)
                if batch is None:
                    stop.wait(0.05)
                    continue
                reader.commit(batch)
                trained[0] += len(batch.groups)
                version += 1
        except Exception as exc:
            errors.append(f"trainer: {type(exc).__name__}: {exc}")
            stop.set()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    threads += [threading.Thread(target=head_loop, daemon=True)]
    threads += [threading.Thread(target=trainer, daemon=True)]
    calls0 = store.calls
    t0 = clock()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    wall = clock() - t0
    if errors:
        raise RuntimeError(f"bench scale at {islands} islands failed: {errors[:3]}")
    calls = store.calls - calls0
    return {
        "islands": islands,
        "seconds": round(wall, 2),
        "groups_appended": appended[0],
        "groups_trained": trained[0],
        "appends_per_s": round(appended[0] / wall, 1),
        "islands_stepped": min(islands, cursor[0]),
        "head_ticks": len(tick_ms),
        "head_tick_ms_p50": _pct(tick_ms, 0.5),
        "head_tick_ms_p99": _pct(tick_ms, 0.99),
        "merge_ms_p50": _pct(merge_ms, 0.5),
        "merge_ms_p99": _pct(merge_ms, 0.99),
        "claim_ms_p50": _pct(claim_ms, 0.5),
        "claim_ms_p99": _pct(claim_ms, 0.99),
        "head_requests_per_tick": round(statistics.mean(head_calls), 2) if head_calls else None,
        "store_requests": calls,
        "store_requests_per_trained_group": round(calls / trained[0], 2) if trained[0] else None,
    }


def _stores(kind: str) -> tuple[str, Callable[[str], ObjectStore], Callable[[], None]]:
    """``(layout, open(name), stop)`` for the ``s3`` (moto) or ``dir`` store."""
    from yeto_core.plugins import get_plugins

    plugins = get_plugins()
    if kind == "s3":
        from yeto_s3 import testing  # the loopback S3 server (moto)

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        endpoint, stop = testing.start_moto_server()
        testing.create_bucket(endpoint, "scale")
        opts = testing.s3_options(endpoint)
        return "objects", lambda name: plugins.open_store(f"s3://scale/{name}", **opts), stop
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="yeto-scale-"))
    return "shards", lambda name: plugins.open_store(str(root / name)), lambda: None


def run(
    islands: list[int],
    *,
    store: str = "auto",
    seconds: float = 8.0,
    workers: int = 8,
    prompts_per_call: int = 4,
    groups_per_round: int = 16,
    tick_s: float = 0.1,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    if store == "auto":
        try:
            import moto  # noqa: F401

            import yeto_s3  # noqa: F401

            store = "s3"
        except ImportError:
            store = "dir"
    layout, open_store, stop = _stores(store)
    rows = []
    try:
        for n in islands:
            progress(f"{n} islands")
            rows.append(
                measure(
                    CountingStore(open_store(f"n{n}")),
                    islands=n,
                    layout=layout,
                    seconds=seconds,
                    workers=workers,
                    prompts_per_call=prompts_per_call,
                    groups_per_round=groups_per_round,
                    tick_s=tick_s,
                )
            )
    finally:
        stop()
    out: dict[str, Any] = {
        "bench": "scale",
        "store": store,
        "layout": layout,
        "workers": workers,
        "prompts_per_call": prompts_per_call,
        "rows": rows,
    }
    by_n = {r["islands"]: r for r in rows}
    if 10 in by_n and max(by_n) > 10:
        big, ten = by_n[max(by_n)], by_n[10]
        if big["head_tick_ms_p50"] and ten["head_tick_ms_p50"]:
            out["tick_ratio_vs_10"] = round(big["head_tick_ms_p50"] / ten["head_tick_ms_p50"], 2)
        if big["store_requests_per_trained_group"] and ten["store_requests_per_trained_group"]:
            out["requests_per_group_ratio_vs_10"] = round(
                big["store_requests_per_trained_group"] / ten["store_requests_per_trained_group"],
                2,
            )
    return out


@click.command("scale", epilog=exit_codes())
@click.option("--islands", default="1,10,100,1000", show_default=True, help="Island counts.")
@click.option(
    "--store",
    type=click.Choice(["auto", "s3", "dir"]),
    default="auto",
    show_default=True,
    help="s3: the loopback moto server (layout objects); dir: per-host shards.",
)
@click.option("--seconds", type=float, default=8.0, show_default=True, help="Per island count.")
@click.option("--workers", type=int, default=8, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(islands: str, store: str, seconds: float, workers: int, as_json: bool) -> None:
    """Simulated sampler islands (appenders with dispenser claims) on one store: head tick,
    merge, claim latency, appends/s and store requests per trained group per island count."""
    counts = [int(x) for x in islands.split(",") if x.strip()]
    report = run(
        counts,
        store=store,
        seconds=seconds,
        workers=workers,
        progress=lambda m: click.echo(f"scale: {m}", err=True),
    )
    if as_json:
        click.echo(json.dumps(report, sort_keys=True))
        return
    for r in report["rows"]:
        click.echo(json.dumps(r, sort_keys=True))
    for k in ("tick_ratio_vs_10", "requests_per_group_ratio_vs_10"):
        if k in report:
            click.echo(f"{k}: {report[k]}")
