"""``python -m yeto_core.islands.main``: the entry point of an island process.

An island needs only the store. Its environment (set by the island provider
from the head's :class:`~yeto_core.records.IslandLaunch`) holds the store URL,
the run id, its role, island name and incarnation, and the store's explicit
credentials (:mod:`yeto_core.providers.env`). It reads the resolved config
(``run/config.json``) and the base model (``run/model/``) from the store, works
in a scratch directory under its own working directory, and writes its events
to the store. It never reads the head's run dir.

Everything is resolved through the plugin manager (engine, task, backend,
store, buffer); the core never imports an adapter. SIGTERM ends the island at
once after flushing its event stream: a sampler's appended groups are durable
and a trainer's rounds after its last cut are trained again by the next
incarnation, so nothing is lost.

Exit codes: 0 done or terminated, 2 config or plugin error, 1 anything else.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any, Optional

from yeto_core.buffer.fences import StoreFences
from yeto_core.config.load import RunConfig
from yeto_core.events.stream import EventStream
from yeto_core.islands.common import (
    PROFILE_EVERY_S,
    base_model,
    open_run_buffer,
    release_store,
    scratch_dir,
    store_outage_reporter,
)
from yeto_core.islands.trainer import run_follower, run_trainer, torchrun_argv
from yeto_core.ports import names
from yeto_core.providers.env import (  # noqa: F401 (ENV_* re-exported: the old import path)
    ENV_CUT,
    ENV_INCARNATION,
    ENV_ISLAND,
    ENV_ROLE,
    ENV_STORE,
    IslandIdentity,
    identity_from_env,
    pin_cpus,
)
from yeto_core.records import Event
from yeto_core.stage_profile import emit_snapshot
from yeto_core.stores.parallel import is_remote


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM."""


def run_sampler(plugins: Any, store: Any, config: RunConfig, ident: IslandIdentity) -> int:
    from yeto_core.islands.evaluation import start_evaluation
    from yeto_core.sampler.follower import PolicyFollower
    from yeto_core.sampler.reward_pool import RewardPool
    from yeto_core.sampler.room import SeenReleases

    island, incarnation = ident.island, ident.incarnation
    groups = {name: s for name, s in config.sampler_islands()}
    if island not in groups:
        raise SystemExit(f"island {island!r} is not a sampler island of this config")
    scfg = groups[island]
    engine_cls = plugins.sampler_engine(scfg.engine)
    stream = EventStream(store, island, flush_s=1.0, observer=plugins.emit)
    stream.observer = store_outage_reporter(stream, store, plugins.emit)
    on_event = sampler_event_bridge(stream)
    options = dict(scfg.engine_options)
    # Server-backed engines (vllm, sglang) report their server's events and keep its
    # log in the island's scratch directory (yeto_core.sampler.engine_server).
    if names(engine_cls, "emit"):
        options.setdefault("emit", on_event)
    if names(engine_cls, "log_dir"):
        options.setdefault("log_dir", str(scratch_dir(ident) / "server"))
    try:
        engine = engine_cls.from_config(
            options,
            model_dir=base_model(store, config, ident),
            seed=config.seed * 1000 + incarnation * 100 + _index(island),
        )
    except BaseException as exc:
        if isinstance(exc, Terminated):  # stopped before its loop began: nothing in flight
            from yeto_core.sampler.drain import drained_before_loop

            on_event(drained_before_loop(incarnation))
        stream.close()
        raise
    task = plugins.task(config.task.name).from_config(config.task.options, plugins=plugins)
    buffer = open_run_buffer(plugins, config, store, island)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    from yeto_core.sandbox.sweep import sweep_island_start

    def on_sweep(event: Any) -> None:  # written at once: a node evicted next loses none
        on_event(event)
        try:
            stream.flush()
        except Exception:  # the store is out: the stream's own flusher writes it later
            pass

    # [sandbox]: what earlier incarnations of this shard left is removed before any trial
    sweep_island_start(plugins, store, config, island, incarnation, on_sweep, stop=stop)
    releases = SeenReleases(release_store(plugins, config, store))
    follower = PolicyFollower(
        releases,
        engine,
        work_dir=scratch_dir(ident) / "releases",
        reload_max_defer_s=scfg.reload_max_defer_s,
        emit=on_event,
        source=island,
    )
    dispenser = None
    if config.dispenser.kind == "store":
        from yeto_core.buffer.dispenser import StoreDispenser

        dispenser = StoreDispenser(
            store,
            island=island,
            incarnation=incarnation,
            range_size=config.dispenser.range_size or scfg.prompts_per_call,
            rows=task.rows or config.dispenser.rows,  # a finite task's rows (preflight: agree)
            limit=task.rows * task.epochs if task.rows and task.epochs else None,
            lease_s=config.dispenser.lease_s,
            emit=on_event,
        )
    from yeto_core.islands.agentic import sampler_loop

    # [task] environment: rounds of multi-turn trials (yeto_core.sampler.agentic)
    loop_cls, agentic = sampler_loop(plugins, config, island, incarnation, on_event, store)
    loop = loop_cls(
        buffer,
        engine,
        task,
        follower,
        host=island,
        incarnation=incarnation,
        task_name=config.task.name,
        group_size=scfg.group_size,
        prompts_per_call=scfg.prompts_per_call,
        # what each group records: the settings (with [[samplers]] top_logprobs) and how the
        # engine filters with them
        sampling=engine.behaviour_sampling(scfg.engine_sampling()),
        seed=config.seed,
        backlog_cap=scfg.backlog_cap,
        backlog_poll_s=0.1,
        min_round_s=scfg.min_round_s,
        sync_rounds=scfg.sync_rounds,
        stop=stop,
        emit=on_event,
        dispenser=dispenser,
        fresh_only=(config.trainer.max_policy_age, groups_per_version(config))
        if scfg.fresh_only
        else None,
        latest_release=releases.seen,
        share_of=sum(s.count for s in config.samplers),
        fenced=StoreFences(store),  # listed with a backlog read, at most once a second
        # a remote store's commit (round trips) lands while the next call generates
        overlap_append=is_remote(store),
        whole_call_wait_s=scfg.whole_call_wait_s,
        # rewards on threads, each call bounded (a hung one skips its group; docs/tasks.md)
        rewards=RewardPool(config.task.reward_workers, config.task.reward_timeout_s),
        on_release=scfg.on_release,
        **agentic,
    )
    from yeto_core.sampler.drain import DEFAULT_DRAIN_BOUND_S, DrainGuard

    # P0-S: SIGTERM stops dispensing; the round in flight finishes within the bound or is
    # abandoned and counted (yeto_core.sampler.drain)
    guard = DrainGuard(
        loop,
        stop,
        float(config.conversion.options.get("drain_bound_s", DEFAULT_DRAIN_BOUND_S)),
        on_event,
        incarnation=incarnation,
        flush=stream.flush,
    )
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: guard.request_stop())
    # a restarted server got the current release back: check that it serves it
    engine.add_restart_listener(lambda: follower.verify_served("engine server restarted"))
    evaluator = None
    try:
        follower.poll()  # serve the newest release (if any) before the first round
        # async: no polls while the trainer's next release is not due (its pace)
        follower.start(poll_s=0.05 if scfg.sync_rounds else 0.2, paced=not scfg.sync_rounds)
        # [eval]: the evaluating island scores due releases between its calls
        evaluator = start_evaluation(
            plugins,
            store,
            config,
            scfg,
            island=island,
            incarnation=incarnation,
            engine=engine,
            follower=follower,
            stop=stop,
        )
        from yeto_core.islands.pauses import run_with_pauses, trainer_progress

        progress = trainer_progress(buffer, follower) if scfg.pause_until_quiet else None
        run_with_pauses(loop, stop, scfg.pause_every_s, scfg.pause_s, on_event, progress=progress)
        loop.flush()
        guard.finished()
    finally:
        if dispenser is not None:
            dispenser.close()  # claims not acked: re-dispensed by others
        if evaluator is not None:
            evaluator.close()
        follower.stop()
        loop.rewards.close()  # idle workers end (a hung reward's thread is a daemon)
        emit_snapshot(stream.emit)
        stream.flush()
        try:
            engine.close()
        finally:
            stream.close()  # the engine's last events too, then the object's marker
    return 0


def groups_per_version(config: RunConfig) -> int:
    """Groups the trainer consumes per policy version: a round's, or with several trainer
    islands an outer step's (every island's ``local_steps`` rounds; ``decoupled``: a
    fragment's step, ``local_steps / fragments`` rounds)."""
    t, s = config.trainer, config.sync
    if t.islands > 1:
        rounds = s.local_steps // s.fragments if s.preset == "decoupled" else s.local_steps
        return t.groups_per_round * t.islands * rounds
    return t.groups_per_round


def sampler_event_bridge(stream: EventStream):
    """Sampler loop and follower events into the island's stream (``release_loaded``, ...)."""

    def on_event(event: Event) -> None:
        stream.emit(event.kind, **dict(event.data))
        if event.kind == "sampler_round":
            emit_snapshot(stream.emit, every_s=PROFILE_EVERY_S)

    return on_event


def _index(island: str) -> int:
    tail = island.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


#: the island's exit code once its work is done (its cut committed, its events flushed):
#: a SIGTERM then (the head releasing it) exits with it at once instead of raising into
#: the interpreter's shutdown (a traceback in the island's log)
_exit_code: list[int] = []


def _install_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: Any) -> None:
        if _exit_code:
            os._exit(_exit_code[0])
        raise Terminated(0)

    signal.signal(signal.SIGTERM, handler)


def die_with_launcher() -> None:
    """On a rank of ``torchrun``: end when the launcher ends. ``torchrun`` starts every rank
    in a session of its own, so a SIGKILL of the island's process group (the provider's
    release) reaches the launcher only; without this its ranks would run on, orphaned.
    Linux only (``prctl(PR_SET_PDEATHSIG)``); elsewhere nothing is done."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() == 1:  # the launcher ended before prctl took effect
        os._exit(1)


def preload(env: Mapping[str, str], plugins: Any = None) -> None:
    """Import what an island of ``env`` will import before it works (a warm spare's
    preparation, :mod:`yeto_core.providers.spare`): the plugins, and for a trainer its
    backend and what the backend names (:meth:`~yeto_core.ports.TrainerBackend.preload`).
    Reads the run's config from the store (one request)."""
    from yeto_core.config.run_store import read_config

    ident = identity_from_env(env)
    if plugins is None:
        from yeto_core.plugins import Plugins

        plugins = Plugins()
    config = read_config(plugins.open_store(ident.store_url))
    if ident.role == "trainer":
        backend = plugins.trainer_backend(config.trainer.backend)
        backend.preload(dict(config.trainer.backend_options or {}))


def run_island(env: Mapping[str, str], plugins: Any = None, *, execve: Any = os.execve) -> int:
    """Run the island ``env`` describes (an :class:`~yeto_core.records.IslandLaunch`'s env).

    :param plugins: the plugin manager (default: a fresh one with every entry point).
    :param execve: replaces this process with ``torchrun`` for a trainer of several ranks
        (:func:`~yeto_core.islands.trainer.torchrun_argv`); injected by tests.
    :returns: the exit code.
    """
    from yeto_core.errors import YetoError
    from yeto_core.providers.dists import check_version_lock
    from yeto_core.sampler.engine_server import EXIT_INFRA_FAILED, InfraFailedError

    ident = identity_from_env(env)
    if "RANK" in env and ident.role == "trainer":
        die_with_launcher()
    check_version_lock(env, ident.island)  # a remote island runs the run's own yeto, or nothing
    if plugins is None:
        from yeto_core.plugins import Plugins

        plugins = Plugins()
    try:
        from yeto_core.config.run_store import read_config
        from yeto_core.stores.retrying import RetryingStore

        # an island rides out a store outage (retries with backoff) instead of exiting
        store = RetryingStore(plugins.open_store(ident.store_url))
        config = read_config(store)
        if ident.role == "trainer" and config.trainer.islands > 1:
            from yeto_core.islands.synced import run_synced_trainer

            return run_synced_trainer(plugins, store, config, ident)
        if ident.role == "trainer":
            argv = torchrun_argv(config, ident, env)
            if argv is not None:
                sys.stdout.flush()
                sys.stderr.flush()
                return int(execve(argv[0], argv, dict(env)) or 0)  # returns only in tests
            rank = int(env.get("RANK", "0"))  # torchrun's
            if rank > 0:
                return run_follower(plugins, store, config, rank)
            return run_trainer(plugins, store, config, ident)
        if ident.role == "sampler":
            return run_sampler(plugins, store, config, ident)
        print(f"yeto island: unknown role {ident.role!r}; use sampler or trainer", file=sys.stderr)
        return 2
    except Terminated:
        return 0
    except InfraFailedError as exc:
        print(f"yeto island {ident.island}: {exc}", file=sys.stderr)
        return EXIT_INFRA_FAILED
    except YetoError as exc:
        print(f"yeto island {ident.island}: error: {exc}", file=sys.stderr)
        return 2


def main(argv: Optional[list[str]] = None, *, plugins: Any = None) -> int:
    """The process entry point: SIGTERM ends the island; the environment says the rest."""
    from yeto_core.errors import YetoError

    _install_sigterm()
    try:
        pin_cpus(os.environ)  # first, so every thread and child inherits it
        code = run_island(os.environ, plugins)
    except YetoError as exc:  # the environment itself is wrong
        print(f"yeto island: error: {exc}", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    _exit_code.append(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
