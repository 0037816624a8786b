"""The head of a run: ``yeto run up``.

One process on the user's machine. It checks the config (preflight), builds
the base model when it is missing, puts the resolved config and the base
model into the store (``run/``, :mod:`yeto_core.config.run_store`), launches the
sampler islands through each group's island provider (``[[samplers]]
provider``), and drives the trainer through the
:class:`~yeto_core.trainer.loop.TrainerLoop` (the scheduler decides; the
``[trainer] lifecycle`` starts and stops incarnations: ``remote`` launches
each as an island of ``[trainer] provider`` and talks to it through the
store). Islands get only the store URL, the ids and the store's credentials
(:mod:`yeto_core.providers.env`). Every tick the head writes ``status.json`` in
the run dir, checks the backstops and the ``DOWN`` request file, and shows
the progress.

Run dir (``run_dir`` in the config, or ``--run-dir``): the head's local view;
no island reads it::

    config.json      the resolved config (a copy of the store's run/config.json)
    head.json        the live head's pid (one head per run dir)
    status.json      progress, rewritten every tick (``yeto run status``)
    DOWN             a stop request (``yeto run down``)
    cost.jsonl       a copy of the store's resource ledger cost/ledger/ (``yeto cost``)
    islands/         handles of live local islands (a restarted head releases them)
    logs/            one log per local island incarnation
    work/            the working directories of local islands
    summary.json     the run's figures, written when the head stops
    store/           the store, unless ``store`` names another one

Stopping is always clean: the samplers are released (verified gone), the
trainer takes its final cut and leaves, then ``summary.json`` is written. A
head that is killed leaves the islands running; ``yeto run up`` on the same
run dir releases them and continues from the newest cut and the buffer.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Optional

import attrs

from yeto_core.buffer.fences import StoreFences
from yeto_core.config.evaluation import EVAL_STREAM
from yeto_core.config.load import RunConfig
from yeto_core.cost.guard import HeadCostGuard
from yeto_core.cost.ledger import CostLedger
from yeto_core.errors import StoreError, YetoError
from yeto_core.events.stream import EventStream, StreamsReader
from yeto_core.head.breakers import Breakers, BreakerWatch
from yeto_core.head.clock_skew import ClockSkewWatch
from yeto_core.head.islands import (  # noqa: F401 (re-exported)
    MAX_SAMPLER_RESTARTS,
    HeadIslands,
    _CostedProvider,
    _host,
    _NoProvider,
)
from yeto_core.head.lease import HeadBusyError, HeadFencedError, HeadLease, LeasedStore
from yeto_core.head.report import HeadReport, HeadState, backstop_reason
from yeto_core.head.run_dir import (  # noqa: F401 (the run-dir protocol, re-exported)
    BACKSTOP_EXIT,
    CONFIG_FILE,
    DOWN_FILE,
    EXIT_BREAKER,
    EXIT_BUDGET,
    EXIT_BUSY,
    EXIT_CODES,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_FENCED,
    EXIT_GAVE_UP,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PREFLIGHT,
    EXIT_SILENCE,
    EXIT_WALL_CLOCK,
    FINISHED_FILE,
    HEAD_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    _pid_alive,
    live_head,
    load_run_config,
    read_json,
    request_down,
    write_json_atomic,
)
from yeto_core.head.scale import HeadScale
from yeto_core.head.setup import HeadSetup
from yeto_core.head.trainer import HeadTrainer
from yeto_core.ports import IslandProvider, TrainerLifecycle
from yeto_core.stage_profile import emit_snapshot, stage
from yeto_core.stores.parallel import in_background, is_remote
from yeto_core.stores.retrying import RetryingStore
from yeto_core.trainer.loop import TrainerLoopGaveUp

#: The head rides out a store that fails (a 503 storm past the store's own retries, a
#: full disk) for this long with failing ticks in a row, then stops the run cleanly.
STORE_OUTAGE_LIMIT_S = 120.0
#: While the trainer has more full rounds (each train command trained all it asked for)
#: the head sends the next command at once and does its housekeeping (status.json,
#: backstops, samplers) at most this often, not every ``tick_s``: on a remote store a
#: housekeeping tick is several round trips between two train commands.
BUSY_HOUSEKEEPING_S = 1.0
#: The head writes every fence itself (and knows it at once); the listing finds those of
#: a previous head, so it is repeated rarely: it would be a request on each trainer tick.
HEAD_FENCES_REFRESH_S = 30.0


class Head(HeadSetup, HeadTrainer, HeadReport, HeadIslands, HeadScale):
    """One run's head. ``run()`` returns an exit code (see ``EXIT_CODES``).

    :param config: the checked run config.
    :param plugins: the plugin manager (:class:`~yeto_core.plugins.Plugins`).
    :param provider: one island provider for every island (tests); default: each
        provider the config names, built with ``IslandProvider.create(run_dir)``.
    :param clock: seconds since the epoch.
    :param sleep: waits between ticks.
    :param display: called with the status dict every tick (progress display).
    """

    def __init__(
        self,
        config: RunConfig,
        plugins: Any,
        *,
        provider: Optional[IslandProvider] = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        display: Optional[Callable[[dict[str, Any]], None]] = None,
    ) -> None:
        self.config = config
        self.plugins = plugins
        self.run_dir = Path(config.run_dir)
        self.clock = clock
        self.sleep = sleep
        self.display = display or (lambda status: None)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.providers: dict[str, IslandProvider] = {
            name: provider
            if provider is not None
            else plugins.island_provider(name).create(self.run_dir)
            for name in config.providers()
        }
        # every write of the head checks its lease first (a fenced head writes nothing),
        # each attempt of a store call retried through a brief outage (the lease checked
        # again before every attempt; a fenced head is never retried)
        self.leased = LeasedStore(plugins.open_store(config.store_url()))
        self.store = RetryingStore(self.leased)
        self.lease: Optional[HeadLease] = None
        # Every path the config names, absolute: the run dir's config.json and the store's
        # run/config.json mean the same from any working directory.
        config = attrs.evolve(
            config,
            run_dir=str(self.run_dir.absolute()),
            store=self.store.url(),
            model=attrs.evolve(config.model, path=str(Path(config.model.path).absolute())),
        )
        self.config = config
        b = config.buffer
        self.buffer = plugins.open_buffer(
            self.store,
            host="head",
            kind=b.kind,
            layout=b.layout,
            options=b.options,
            merger=b.layout == "shards",
        )
        self.conversion = plugins.conversion(config.conversion.name)(**config.conversion.options)
        self.cost_guard = HeadCostGuard(self)
        self.costs = CostLedger(
            self.run_dir,
            config.island_prices(),
            clock=clock,
            store=self.store,
            describe=self.cost_guard.describe,
        )
        self.events = EventStream(
            self.store, "head", clock=clock, flush_s=0.0, observer=plugins.emit
        )
        self.state = HeadState(started_at=clock())
        self.breakers = BreakerWatch(Breakers(config.breakers))
        self.clock_skew = ClockSkewWatch()
        #: fenced sampler incarnations: the ones this head fences at once, a previous
        #: head's from a listing (re-listed at most every HEAD_FENCES_REFRESH_S)
        self.fences = StoreFences(self.store, refresh_s=HEAD_FENCES_REFRESH_S)
        self.sampler_handles: dict[str, str] = {}
        #: replacements launched before their island was lost (island -> handle)
        self.sampler_standby: dict[str, str] = {}
        self.sampler_incarnations: dict[str, int] = {}  # handle -> incarnation
        self.sampler_early_failed: set[str] = set()  # handles whose early launch failed
        self.sampler_parked: dict[str, float] = {}  # island -> when it left the pool
        self.pool_full_since: dict[str, float] = {}  # group -> backlog full since
        self._stop_requested: Optional[str] = None
        self.trainer_loop: Any = None
        self.lifecycle: Optional[TrainerLifecycle] = None
        self._tick_watch: Any = None
        self._streams: Optional[StreamsReader] = None  # the streams, parsed as they grow
        self.exit_code: Optional[int] = None  # set by shutdown
        self.final_cut_problem: Optional[str] = None

    # -- the loop --------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        if self._stop_requested is None:
            self._stop_requested = reason

    def tick(self) -> dict[str, Any]:
        """One step of the head: down request, backstops, samplers, the trainer loop."""
        if (self.run_dir / DOWN_FILE).exists():
            self.request_stop("down")
        status = self.status()
        b = self.config.backstops
        reason = backstop_reason(
            cost_usd=status["cost_usd"],
            budget_usd=b.budget_usd,
            elapsed_s=status["elapsed_s"],
            wall_clock_s=b.wall_clock_s,
            silent_s=self.clock() - self.state.last_arrival_at,
            silence_s=0.0 if self.state.finishing else b.silence_s,
        )
        if reason is not None and self._stop_requested is None:
            self.events.emit("backstop", reason=reason, status=status)
            self.request_stop(reason)
        if self._stop_requested is None:
            self.cost_guard.tick()  # docs/cost.md: scale down, or stop before the budget
        self.check_scale_request()  # `yeto run scale` (head/scale.py)
        self.check_samplers()
        self.check_pool(status)
        target = self.config.trainer.total_rounds
        if target and not self.state.finishing and (status["trained_rounds"] or 0) >= target:
            self.finish_data()
        # rewritten every tick: atomic, not fsynced (the final status at shutdown is)
        write_json_atomic(self.run_dir / STATUS_FILE, status, durable=False)
        self.display(status)
        return status

    def observe_streams(self, read: Optional[tuple[dict[str, list[Any]], float]] = None) -> None:
        """Read the islands' event streams once: the recent reward and the breakers.

        :param read: the streams and when they were read (:meth:`read_streams`, on a
            thread while the trainer's command runs); default: read them now."""
        streams, read_at = self.read_streams() if read is None else read
        self.update_rewards(streams.get(self.config.trainer.name, []))
        if self.config.eval.enabled:
            self.update_eval(streams.get(EVAL_STREAM, []))
        self.check_breakers(streams)
        for kind, data in self.clock_skew.poll(streams, read_at, skip=("head",)):
            self.events.emit(kind, **data)

    def read_streams(self) -> tuple[dict[str, list[Any]], float]:
        """Every island's event stream, and the clock when the read ended."""
        if self._streams is None:
            self._streams = StreamsReader(self.store)
        with stage("head.read_streams"):  # on a thread too: its requests named in the profile
            streams = self._streams.read_all()
        return streams, self.clock()

    def check_breakers(self, streams: dict[str, list[Any]]) -> None:
        """Stop the run cleanly when a run health breaker tripped (an event with its inputs)."""
        trip = self.breakers.poll(streams)
        if trip is not None and self._stop_requested is None:
            self.events.emit("breaker", **trip.event_data())
            self.request_stop("breaker")

    def finish_data(self) -> None:
        """The target is reached: stop the samplers and let the trainer drain the backlog."""
        self.state.finishing = True
        self.events.emit("target_reached", total_rounds=self.config.trainer.total_rounds)
        self.stop_samplers()
        self.buffer.mark_data_end()

    # -- the whole run ---------------------------------------------------------------

    def start(self, say: Callable[[str], None] = print) -> None:
        """Claim the run dir, release orphans, build the trainer loop, launch the samplers."""
        self.state.started_at = self.clock()  # after preflight and the base build
        self.claim()
        self.replay_scale()  # the counts `yeto run scale` journaled for an earlier head
        self.write_config()
        released = self.release_orphans()
        if released:
            say(
                f"released {len(released)} island(s) left by a previous head: {', '.join(released)}"
            )
        self.events.emit("run_up", pid=os.getpid(), config=self.config.source)
        self.build_trainer_loop()
        if self.trainer_loop.finished is not None:
            self.state.finishing = True
            return
        if self.buffer.data_ended():
            self.state.finishing = True
            return
        for island, _ in self.config.sampler_islands():
            if self.cost_guard.may_launch(island):
                self.launch_sampler(island)
        if not self.sampler_handles:
            self.request_stop("budget")  # the budget leaves no room for a sampler

    def _install_sigint(self) -> Optional[Any]:
        """First Ctrl-C: stop cleanly at the next tick; a second one interrupts."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum: int, frame: Any) -> None:
            if self._stop_requested == "interrupt":
                raise KeyboardInterrupt
            self.request_stop("interrupt")

        return signal.signal(signal.SIGINT, handler)

    def run(self, say: Callable[[str], None] = print) -> int:
        """Run until finished, stopped or a backstop; always stop cleanly. Returns the exit code."""
        previous = self._install_sigint()
        try:
            return self._run(say)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _run(self, say: Callable[[str], None]) -> int:
        code = EXIT_OK
        try:
            self.start(say)
            tick_s = self.config.scheduler.tick_s
            last_rewards = 0.0
            # housekeeping (status.json, backstops, samplers) keeps the tick_s cadence; a
            # wake-up by the buffer's watch between ticks runs only the trainer loop
            woken, last_house = False, -math.inf
            busy = False  # the last trainer tick left more full rounds
            outage: Optional[tuple[float, int, str]] = None  # (since, ticks, last error)
            # On a remote store the streams are read on a thread while the trainer's
            # command runs (several round trips off the path between two commands); they
            # are acted on after it, in this thread, as if read then.
            overlap_streams = is_remote(self.store)
            while self._stop_requested is None and self.trainer_loop.finished is None:
                if self.lease is not None:
                    self.lease.check()  # fenced (the renewal thread found out): stop here
                streams_ahead: Optional[Future[tuple[dict[str, list[Any]], float]]] = None
                try:
                    if self.clock() - last_rewards >= 2.0:
                        if overlap_streams:
                            streams_ahead = in_background(self.read_streams, "head-streams")
                        else:
                            with stage("head.observe_streams"):
                                self.observe_streams()
                            last_rewards = self.clock()
                        emit_snapshot(self.events.emit, every_s=10.0)
                    every = max(tick_s, BUSY_HOUSEKEEPING_S) if busy else tick_s
                    if not woken or time.monotonic() - last_house >= every:
                        last_house = time.monotonic()
                        with stage("head.tick"):
                            self.tick()
                    if self._stop_requested is not None:
                        break
                    with stage("head.trainer_tick"):
                        self.trainer_loop.tick()
                    if streams_ahead is not None:
                        with stage("head.observe_streams"):
                            self.observe_streams(streams_ahead.result())
                        last_rewards = self.clock()
                except (StoreError, OSError) as exc:
                    # Every tick observes before it acts, and its decisions are journaled:
                    # a tick that failed on the store is simply taken again.
                    since, ticks = (outage[0], outage[1]) if outage else (self.clock(), 0)
                    outage = (since, ticks + 1, f"{type(exc).__name__}: {exc}")
                    if self.clock() - since > STORE_OUTAGE_LIMIT_S:
                        raise YetoError(
                            f"the store kept failing for {self.clock() - since:.0f} s "
                            f"({ticks + 1} ticks in a row); last error: {outage[2]}"
                        ) from exc
                    if ticks == 0:
                        say(f"yeto: the store failed ({exc}); retrying")
                    self.sleep(min(5.0, tick_s * 2 ** min(ticks, 6)))
                    continue
                for report in self.store.take_reports():  # store calls retried through
                    self.events.emit("store_outage_survived", **report)
                if outage is not None:
                    self.events.emit(
                        "store_outage_survived",
                        seconds=round(self.clock() - outage[0], 3),
                        failed_ticks=outage[1],
                        last_error=outage[2],
                    )
                    outage = None
                busy = self.trainer_loop.more_ready
                if busy:
                    woken = True  # the trainer has more full rounds: send the next command now
                elif self.trainer_loop.finished is None:
                    with stage("head.wait_tick"):
                        woken = self._wait_tick(tick_s)
            reason = self._stop_requested or f"finished ({self.trainer_loop.finished})"
            if self._stop_requested in BACKSTOP_EXIT:
                code = BACKSTOP_EXIT[self._stop_requested]
            elif self._stop_requested == "interrupt":
                code = EXIT_INTERRUPTED
            elif self.trainer_loop.finished == "gave_up":
                code = EXIT_GAVE_UP
        except KeyboardInterrupt:
            reason, code = "interrupt", EXIT_INTERRUPTED
        except HeadBusyError as exc:
            say(f"yeto: {exc}")
            return EXIT_BUSY  # nothing of this run is ours: no shutdown
        except Exception as exc:
            if isinstance(exc, HeadFencedError) or (self.lease and self.lease.fenced):
                return self._fenced(say, exc)
            reason, code = f"error: {type(exc).__name__}: {exc}", EXIT_FAILED
            if isinstance(exc, TrainerLoopGaveUp):
                code = EXIT_GAVE_UP
                say(f"yeto: the trainer loop gave up: {exc}; stopping the run cleanly")
            else:
                say(f"yeto: the head failed: {exc}; stopping the run cleanly")
        if self.lease is not None and self.lease.fenced:
            return self._fenced(say, HeadFencedError(self.lease.fenced))
        say(f"stopping: {reason}")
        try:
            self.shutdown(reason, code)
        except KeyboardInterrupt:
            say("interrupted again while stopping; islands may be left (run `yeto run up` again)")
            return EXIT_INTERRUPTED
        except HeadFencedError as exc:  # found out while stopping: the rest is the new head's
            return self._fenced(say, exc)
        if self.final_cut_problem is not None:
            say(f"yeto: {self.final_cut_problem}")
        trip = self.breakers.breakers.tripped()
        if self.exit_code == EXIT_BREAKER and trip is not None:
            say(f"yeto: breaker {trip.breaker!r} tripped: {trip.message} (exit {EXIT_BREAKER})")
            if reason != "breaker":  # found in the whole streams after the run's end
                say(
                    f"yeto: the run had ended ({reason}) before the breaker read the islands' "
                    "last events: it is finished; fix the cause and start a new run"
                )
        return code if self.exit_code is None else self.exit_code

    def _wait_tick(self, tick_s: float) -> bool:
        """Between ticks: at most ``tick_s``, less when the buffer changes (a group
        appended, a round committed: what the scheduler decides on). With an injected
        ``sleep`` (tests) it is that sleep. :returns: whether a change woke it early."""
        if self.sleep is time.sleep and self._tick_watch is None:
            self._tick_watch = self.buffer.watch()  # None: this buffer does not notify
        if self._tick_watch is None:
            self.sleep(tick_s)
            return False
        return bool(self._tick_watch.wait(tick_s))

    def _fenced(self, say: Callable[[str], None], exc: BaseException) -> int:
        """Another head took the lease: stop now, writing nothing (not even a shutdown)."""
        if self.lease is not None:
            self.lease.stop_renewing()
        msg = self.lease.fenced if self.lease is not None and self.lease.fenced else str(exc)
        say(f"yeto: {msg}")
        return EXIT_FENCED

    def shutdown(self, reason: str, code: int) -> dict[str, Any]:
        """Stop samplers (verified), final cut of the trainer, the summary."""
        if self.lease is not None and self.lease.fenced:
            raise HeadFencedError(self.lease.fenced)  # the run is another head's now
        errors = []
        try:  # a request that came too late is answered (refused)
            self.check_scale_request(closing=True)
        except OSError:
            pass
        try:
            self.stop_samplers()
        except Exception as exc:  # keep going: the trainer's cut matters more
            errors.append(f"samplers: {exc}")
        if code == EXIT_OK and self._stop_requested is None:
            # The samplers flushed their streams as they stopped: a run that ended between
            # two reads (a small dataset whose every group failed its reward reaches its
            # data end within seconds) is still judged by the breakers on all its events.
            try:
                self.observe_streams()
            except Exception as exc:  # the summary below still reads what it can
                errors.append(f"breakers: {exc}")
            if self._stop_requested == "breaker":
                code = EXIT_BREAKER
        for provider in self.providers.values():
            provider.unprepare()  # no warm spare for a start that will not come
        try:
            self.stop_trainer()
        except Exception as exc:
            errors.append(f"trainer: {exc}")
        # a loop that gave up (max_failures incarnations in a row trained nothing) did not
        # finish the run: it stays resumable, and the next `yeto run up` tries again
        finished = self.trainer_loop is not None and self.trainer_loop.finished not in (
            None,
            "gave_up",
        )
        if finished:
            bad = self.check_final_cut()
            if bad is not None:  # not finished: the next `yeto run up` trains the rest again
                errors.append(bad)
                finished = False
                code = EXIT_FAILED if code == EXIT_OK else code
        self.exit_code = code
        summary = self.write_summary(reason=reason, exit_code=code, errors=errors)
        if finished:
            write_json_atomic(
                self.run_dir / FINISHED_FILE, {"time": self.clock(), "reason": reason}
            )
        status = self.status()
        status["state"] = "finished" if finished else "stopped"
        status["stop_reason"] = reason
        status["exit_code"] = code
        write_json_atomic(self.run_dir / STATUS_FILE, status)
        emit_snapshot(self.events.emit)
        self.events.emit("run_down", reason=reason, exit_code=code, errors=errors)
        try:
            self.events.close()  # marked finished: a later head's reader reads it once
        except Exception:  # the store is out: the object stays read, as a killed head's is
            pass
        if self.lease is not None:
            try:
                self.lease.release()  # the next `yeto run up` takes it at once
            except Exception:  # a lease left to lapse is still safe
                pass
        (self.run_dir / HEAD_FILE).unlink(missing_ok=True)
        (self.run_dir / DOWN_FILE).unlink(missing_ok=True)
        return summary
