"""Orphan sweeps: a sampler island removes the sandboxes its predecessors left.

A sandbox outlives the island that started it when the island is killed (SIGKILL, an
evicted node, a lost lease) before its trials end. Every sandbox carries its trial's
labels (run, island, incarnation, shard, trial; the shard is the buffer shard the
island appends to: its island name), so the next island of the shard finds them by
label (:meth:`~yeto_core.ports.SandboxHost.list`). :func:`sweep_at_start`, called by
the sampler island before its first round (``[sandbox] sweep_at_start``), removes:

- every sandbox of its own shard and incarnation (a restart of this incarnation:
  the process that started them is gone);
- every sandbox of an earlier incarnation of its shard, or of a shard it continues
  under a new shard id (``predecessors``), once that predecessor has left (the head
  recorded it gone, ``dispense/gone/``; or the host knows the process that started
  the sandbox is dead) or its lease is fenced (``fences/``). A predecessor still
  running unfenced (a replacement launched early, before the loss) is left alone:
  its sandboxes are its own trials, counted as ``kept``.

While an earlier incarnation of its shard may still run (neither fenced nor gone: the
island is a standby launched before its predecessor's loss) or a sweep kept something,
the island sweeps again every ``[sandbox] sweep_again_s`` until that predecessor is
fenced or gone, then once more: what a noticed node starts after its standby's first
sweep and leaves at its eviction is removed by the standby, not at the run's end.

Sandboxes of a later incarnation, of other shards and of other runs are never
touched. The sweep emits ``sandbox_orphans_removed`` with the shard (and what it
kept). Once every sampler island of the run is released, the head sweeps the run's
sandboxes of incarnations that left (:func:`sweep_run_end`, ``at = "run_end"``). A host that fails the sweep is reported (``sandbox_sweep_failed``), never
raised: an island starts without its sweep rather than not at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Optional

import attrs

from yeto_core.ports.sandbox import SandboxHost
from yeto_core.records import Event

REMOVED_EVENT = "sandbox_orphans_removed"
FAILED_EVENT = "sandbox_sweep_failed"


@attrs.frozen
class SweepResult:
    """What one sweep removed, kept (a predecessor still running) and could not remove."""

    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()


def sweep_at_start(
    host: SandboxHost,
    *,
    run: str,
    island: str,
    incarnation: int,
    shard: str,
    fenced: Callable[[str, int], bool],
    left: Callable[[str, int], bool],
    emit: Callable[[Event], None],
    predecessors: Iterable[str] = (),
    report_kept: bool = True,
    own: bool = True,
) -> SweepResult:
    """Remove the orphans of ``shard`` (and of the shards it continues); see the module.

    :param fenced: ``(island, incarnation) -> bool``: that incarnation's lease is fenced.
    :param left: ``(island, incarnation) -> bool``: that incarnation is verified gone.
    :param report_kept: emit the event also when the sweep only kept sandboxes.
    :param own: remove this incarnation's own sandboxes too (at its start: a restart of
        it left them); ``False`` once its trials run (the sweeps while it samples).
    """
    shards = {shard, *predecessors}
    removed, kept, failed = [], [], []
    incarnations: set[int] = set()
    try:
        found = host.list({"run": run})
    except Exception as exc:  # a host that is down: the island starts all the same
        _emit(emit, FAILED_EVENT, island, shard=shard, error=f"{type(exc).__name__}: {exc}")
        return SweepResult()
    for info in found:
        labels = info.labels
        if labels.get("shard") not in shards:
            continue
        owner = str(labels.get("island", ""))
        try:
            inc = int(labels.get("incarnation", ""))
        except ValueError:
            inc = -1
        mine = labels.get("shard") == shard and owner == island
        if mine and (inc > incarnation or (inc == incarnation and not own)):
            continue  # a later incarnation's, or this one's running trials
        if not (mine and inc == incarnation):
            gone = info.owner_alive is False or left(owner, inc) or fenced(owner, inc)
            if not gone:
                kept.append(info.id)
                continue
        try:
            ok = host.remove(info.id)
        except Exception:
            ok = False
        if ok:
            removed.append(info.id)
            incarnations.add(inc)
        else:
            failed.append(info.id)
    if removed or failed or (kept and report_kept):
        _emit(
            emit,
            REMOVED_EVENT,
            island,
            shard=shard,
            by_incarnation=incarnation,
            removed=len(removed),
            incarnations=sorted(incarnations),
            kept=len(kept),
            failed=len(failed),
            predecessors=sorted(shards - {shard}),
        )
    return SweepResult(tuple(removed), tuple(kept), tuple(failed))


def _emit(emit: Callable[[Event], None], kind: str, island: str, **data: Any) -> None:
    emit(Event(kind=kind, time=time.time(), source=island, data=data))


def sweep_island_start(
    plugins: Any,
    store: Any,
    config: Any,
    island: str,
    incarnation: int,
    emit: Any,
    *,
    stop: Optional[threading.Event] = None,
    again_s: Optional[float] = None,
) -> SweepResult:
    """The sampler island's sweep at its start, with the run's host, fences and gone
    records (:func:`sweep_at_start`); nothing when ``[sandbox]`` names no host.

    When ``stop`` is given and it kept a running predecessor's sandboxes, or an earlier
    incarnation of the shard is neither fenced nor gone (it may still run and start
    sandboxes), it sweeps again every ``again_s`` (default ``[sandbox] sweep_again_s``) on
    a daemon thread until every earlier incarnation is fenced or gone and a sweep after
    that kept nothing, or ``stop`` is set.
    """
    from yeto_core.buffer.dispenser import GONE, gone_key
    from yeto_core.buffer.fences import fenced

    s = config.sandbox
    if not s.host or not s.sweep_at_start:
        return SweepResult()
    try:
        host = open_host(plugins, s)
    except Exception as exc:
        _emit(emit, FAILED_EVENT, island, shard=island, error=f"{type(exc).__name__}: {exc}")
        return SweepResult()

    def once(report_kept: bool = True, own: bool = True) -> SweepResult:
        fences = fenced(store)
        return sweep_at_start(
            host,
            run=config.run_id,
            island=island,
            incarnation=incarnation,
            shard=island,
            fenced=lambda i, n: (i, n) in fences,
            left=lambda i, n: store.exists(gone_key(i, n)),
            emit=emit,
            report_kept=report_kept,
            own=own,
        )

    done: set[int] = set()  # earlier incarnations fenced or gone (never undone)

    def predecessor_may_run() -> bool:
        if len(done) >= incarnation:
            return False
        fences = fenced(store)
        gone = set()
        for key in store.list(f"{GONE}{island}/"):
            name = key.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                gone.add(int(name[:-5]))
        done.update(n for n in range(incarnation) if (island, n) in fences or n in gone)
        return len(done) < incarnation

    try:
        result = once()
    except Exception as exc:  # the store unreadable: the island starts all the same
        _emit(emit, FAILED_EVENT, island, shard=island, error=f"{type(exc).__name__}: {exc}")
        return SweepResult()
    if stop is None:
        return result
    try:
        again = bool(result.kept) or predecessor_may_run()
    except Exception:  # the store unreadable now: the sweeps again find out
        again = True
    if again:
        threading.Thread(
            target=sweep_while_kept,
            args=(
                # its own trials run meanwhile: theirs are not orphans
                lambda: once(report_kept=False, own=False),
                stop,
                again_s or s.sweep_again_s,
                predecessor_may_run,
            ),
            name=f"yeto-sandbox-sweep-{island}",
            daemon=True,
        ).start()
    return result


def sweep_run_end(
    plugins: Any, store: Any, config: Any, emit: Callable[[Event], None]
) -> SweepResult:
    """The head's sweep once every sampler island of the run is released: remove the
    run's sandboxes whose island incarnation has left (its starter seen dead by the
    host, its ``dispense/gone/`` record, or its fence). An island killed mid-trial and
    relaunched just before the run's end is released before its own sweep runs: its
    predecessor's sandboxes would otherwise outlive the run. A sandbox whose starter
    the host sees alive is kept. Nothing when ``[sandbox]`` names no host or its sweeps
    are off (``sweep_at_start = false``); a host that fails is reported, never raised.
    """
    from yeto_core.buffer.dispenser import gone_key
    from yeto_core.buffer.fences import fenced

    s = config.sandbox
    if not s.host or not s.sweep_at_start:
        return SweepResult()
    removed, kept, failed = [], [], []
    incarnations: set[str] = set()
    try:
        host = open_host(plugins, s)
        found = host.list({"run": config.run_id})
        fences = fenced(store)
    except Exception as exc:
        _emit(emit, FAILED_EVENT, "head", shard="*", error=f"{type(exc).__name__}: {exc}")
        return SweepResult()
    for info in found:
        owner = str(info.labels.get("island", ""))
        try:
            inc = int(info.labels.get("incarnation", ""))
        except ValueError:
            inc = -1
        try:
            gone = info.owner_alive is False or (
                info.owner_alive is None
                and (store.exists(gone_key(owner, inc)) or (owner, inc) in fences)
            )
        except Exception:
            gone = False
        if not gone:
            kept.append(info.id)
            continue
        try:
            ok = host.remove(info.id)
        except Exception:
            ok = False
        (removed if ok else failed).append(info.id)
        if ok:
            incarnations.add(f"{owner}-i{inc}")
    if removed or failed:
        _emit(
            emit,
            REMOVED_EVENT,
            "head",
            shard="*",
            at="run_end",
            removed=len(removed),
            incarnations=sorted(incarnations),
            kept=len(kept),
            failed=len(failed),
        )
    return SweepResult(tuple(removed), tuple(kept), tuple(failed))


def sweep_while_kept(
    once: Callable[[], SweepResult],
    stop: threading.Event,
    again_s: float,
    pending: Optional[Callable[[], bool]] = None,
) -> None:
    """Call ``once()`` every ``again_s`` until ``stop`` is set, or until a sweep keeps
    nothing and ``pending()`` (asked before that sweep: an earlier incarnation may still
    run) is false; a failed sweep is tried again at the next turn."""
    while not stop.wait(again_s):
        try:
            running = pending() if pending is not None else False
            if not once().kept and not running:
                return
        except Exception:
            continue


def open_host(plugins: Any, sandbox: Any) -> SandboxHost:
    """The ``[sandbox]`` host of a run (``sandbox`` is its config section)."""
    cls = plugins.sandbox_host(sandbox.host)
    return cls.create(sandbox.state_path(), dict(sandbox.options))
