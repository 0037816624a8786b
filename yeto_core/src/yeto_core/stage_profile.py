"""Where a process's time goes: seconds and counts per named stage (``yeto bench e2e --profile``).

Every process of a run (the head, each sampler island, the trainer island) keeps
one :data:`PROFILE`. Code on a round's path wraps its stages in
``with stage("name"):`` (``generate``, ``append``, ``train``, ``publish``,
``wait.backlog``, ...); the process writes a cumulative snapshot to its event
stream as a ``stage_profile`` event (at most every 10 s, and once more when it
ends; each is ~1 KB, and the head re-reads the streams), so the last such event of a stream says where that
process's time went over the whole run. A stage may contain others (``publish``
contains ``publish.export``); a stage's seconds include its children's.

Each stage also sums the CPU time of the thread that ran it (``cpu_s``,
``time.thread_time``): a stage whose wall seconds are well above its CPU seconds
waited (for the disk, the store, the GIL or a core held by another process).

A thread may also be marked on a role's critical path (``with PROFILE.path("trainer")``:
the trainer's round thread between two optimizer steps): a measuring store (the
bench's counting wrapper) counts the requests made there as ``store!<path>.<op>``, the
requests that role's progress waits on, apart from those its background threads make.

Cost: two ``perf_counter`` and two ``thread_time`` calls and a dict update per
stage (about a microsecond against stages of milliseconds); always on.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional

#: the event kind a snapshot is written as
EVENT_KIND = "stage_profile"

#: the counter of a store request made on critical path ``path`` (:meth:`StageProfile.path`)
PATH_COUNTER = "store!{path}.{op}"


class StageProfile:
    """Seconds and counts per stage name (thread-safe)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}
        self._cpu: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._counters: dict[str, int] = {}
        self.started = clock()
        self._last_emit: Optional[float] = None
        self._open = threading.local()  # per thread: the names of the stages now open

    def add(self, name: str, seconds: float, n: int = 1, cpu: Optional[float] = None) -> None:
        """Add ``seconds`` of wall time (and ``cpu`` seconds of its thread's CPU) to ``name``."""
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + float(seconds)
            self._counts[name] = self._counts.get(name, 0) + n
            if cpu is not None:
                self._cpu[name] = self._cpu.get(name, 0.0) + float(cpu)

    def count(self, name: str, n: int = 1) -> None:
        """A counter without a duration (store requests, groups, rounds)."""
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def stage(self, name: str, *, cpu: bool = True) -> contextlib.AbstractContextManager[None]:
        return _Stage(self, name, cpu)

    @contextlib.contextmanager
    def within(self, name: Optional[str], path: Optional[str] = None) -> Iterator[None]:
        """Open ``name`` for :meth:`current` in this thread without timing it (a worker
        thread doing part of the caller's stage; ``path``: the caller's :meth:`on_path`,
        which the caller waits on); None: nothing."""
        with self.path(path) if path is not None else contextlib.nullcontext():
            if name is None:
                yield
                return
            opened = self._open.__dict__.setdefault("names", [])
            opened.append(name)
            try:
                yield
            finally:
                opened.pop()

    @contextlib.contextmanager
    def path(self, name: Optional[str]) -> Iterator[None]:
        """Mark this thread as on the critical path ``name`` while the block runs (None:
        off every path): a thread the role's progress waits on, such as the trainer's
        round thread between two optimizer steps (``trainer``). A measuring store counts
        the requests made there (``store!<name>.<op>``, :data:`PATH_COUNTER`); a worker
        the caller waits on carries it (:meth:`within`); a background thread has none."""
        local = self._open.__dict__
        before = local.get("path")
        local["path"] = name
        try:
            yield
        finally:
            local["path"] = before

    def on_path(self) -> Optional[str]:
        """The critical path this thread is on (:meth:`path`), None when on none."""
        return self._open.__dict__.get("path")

    def current(self) -> Optional[str]:
        """The innermost stage open in this thread (None outside every stage)."""
        opened = self._open.__dict__.get("names")
        return opened[-1] if opened else None

    def snapshot(self) -> dict[str, Any]:
        """``{"wall_s", "stages": {name: {"s", "n", "cpu_s"}}, "counters": {...}}`` (JSON-ready;
        ``cpu_s`` only for stages timed with :meth:`stage`)."""
        with self._lock:
            stages = {
                k: {
                    "s": round(v, 6),
                    "n": self._counts[k],
                    **({"cpu_s": round(self._cpu[k], 6)} if k in self._cpu else {}),
                }
                for k, v in sorted(self._seconds.items())
            }
            counters = dict(sorted(self._counters.items()))
        return {
            "wall_s": round(self._clock() - self.started, 6),
            "stages": stages,
            "counters": counters,
        }

    def due(self, every_s: float) -> bool:
        """Whether a snapshot is due (``every_s`` since the last one; the first is due)."""
        now = self._clock()
        with self._lock:
            if self._last_emit is not None and now - self._last_emit < every_s:
                return False
            self._last_emit = now
            return True

    def reset(self) -> None:
        with self._lock:
            self._seconds.clear()
            self._cpu.clear()
            self._counts.clear()
            self._counters.clear()
            self.started = self._clock()
            self._last_emit = None


class _Stage:
    """One ``with profile.stage(name)``: a plain context manager (a generator-based
    one costs several times more, and stages wrap every buffer append)."""

    __slots__ = ("_profile", "_name", "_t", "_cpu", "_opened", "_timed_cpu")

    def __init__(self, profile: StageProfile, name: str, cpu: bool = True) -> None:
        self._profile = profile
        self._name = name
        self._timed_cpu = cpu

    def __enter__(self) -> None:
        p = self._profile
        opened = p._open.__dict__.get("names")
        if opened is None:
            opened = p._open.__dict__.setdefault("names", [])
        opened.append(self._name)
        self._opened = opened
        if self._timed_cpu:
            self._cpu = p._cpu_clock()
        self._t = p._clock()

    def __exit__(self, *exc: object) -> None:
        p = self._profile
        seconds = p._clock() - self._t
        cpu = p._cpu_clock() - self._cpu if self._timed_cpu else None
        self._opened.pop()
        p.add(self._name, seconds, cpu=cpu)


#: this process's profile
PROFILE = StageProfile()


def stage(name: str, *, cpu: bool = True) -> contextlib.AbstractContextManager[None]:
    """``with stage("train"): ...``: time a stage of this process's :data:`PROFILE`.

    ``cpu=False``: wall seconds and count only, no ``cpu_s`` (reading a thread's CPU
    clock is a system call, ~1 µs each end: for the short stages inside every buffer
    append, whose caller's own stage has the CPU)."""
    return PROFILE.stage(name, cpu=cpu)


def count(name: str, n: int = 1) -> None:
    PROFILE.count(name, n)


def path_requests(counters: dict[str, Any], path: str) -> int:
    """The store requests counted on critical path ``path`` (``store!<path>.<op>``)."""
    head = PATH_COUNTER.format(path=path, op="")
    return sum(int(v) for k, v in counters.items() if k.startswith(head))


def emit_snapshot(emit: Callable[..., Any], *, every_s: float = 0.0, **extra: Any) -> bool:
    """``emit("stage_profile", **snapshot)`` when due (``every_s`` 0: now). :returns: emitted."""
    if every_s > 0 and not PROFILE.due(every_s):
        return False
    PROFILE.due(0.0)  # the snapshot time
    emit(EVENT_KIND, **PROFILE.snapshot(), **extra)
    return True


def summarize(snapshot: dict[str, Any], *, rounds: Optional[int] = None) -> dict[str, Any]:
    """Per-stage seconds, share of the process's wall time and ms per round (pure)."""
    wall = float(snapshot.get("wall_s") or 0.0)
    out: dict[str, Any] = {}
    for name, v in (snapshot.get("stages") or {}).items():
        s = float(v["s"])
        row: dict[str, Any] = {"s": round(s, 3), "n": int(v["n"]), "share": None}
        cpu = v.get("cpu_s")
        if cpu is not None:
            row["cpu_s"] = round(float(cpu), 3)
        if wall > 0:
            row["share"] = round(s / wall, 4)
        if rounds:
            row["ms_per_round"] = round(1000.0 * s / rounds, 2)
            if cpu is not None:
                row["cpu_ms_per_round"] = round(1000.0 * float(cpu) / rounds, 2)
        out[name] = row
    result: dict[str, Any] = {"wall_s": round(wall, 3), "stages": out}
    counters = dict(snapshot.get("counters") or {})
    if counters:
        result["counters"] = counters
        if rounds:
            result["counters_per_round"] = {k: round(v / rounds, 2) for k, v in counters.items()}
    return result
