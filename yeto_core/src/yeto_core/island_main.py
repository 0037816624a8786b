"""``python -m yeto_core.island_main``: the entry point of a local island process.

The head launches it through an island provider with this environment:

- ``YETO_RUN_DIR``: the run dir (it holds ``config.json``, the resolved config);
- ``YETO_ROLE``: ``sampler`` or ``trainer``;
- ``YETO_ISLAND`` / ``YETO_INCARNATION``: which island and incarnation this is;
- ``YETO_TRAINER_CUT`` (trainer, optional): the cut id to restore (default:
  the newest valid cut);
- ``YETO_LEDGER_SET_ASIDE_BEFORE`` (trainer, optional): the head's start time; batch
  ledger rounds recorded before it are set aside by a start from the base.

Everything is resolved through the plugin manager (engine, task, backend,
store); the core never imports an adapter. SIGTERM ends the island at once
after flushing its event stream: a sampler's appended groups are durable and
a trainer's rounds after its last cut are trained again by the next
incarnation, so nothing is lost.

Exit codes: 0 done or terminated, 2 config or plugin error, 1 anything else.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from yeto_core.config import RunConfig, config_from_dict
from yeto_core.event_stream import EventStream
from yeto_core.records import Event

ENV_RUN_DIR = "YETO_RUN_DIR"
ENV_ROLE = "YETO_ROLE"
ENV_CUT = "YETO_TRAINER_CUT"
#: Rounds the batch ledger recorded before this time belong to an earlier head's trainer:
#: a start from the base sets them aside instead of refusing to start.
ENV_LEDGER_SET_ASIDE = "YETO_LEDGER_SET_ASIDE_BEFORE"
CONFIG_FILE = "config.json"


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM."""


def load_run_config(run_dir: str | os.PathLike[str]) -> RunConfig:
    """The resolved config the head wrote into the run dir."""
    data = json.loads((Path(run_dir) / CONFIG_FILE).read_text())
    return config_from_dict(data)


def _accepts(cls: type, name: str) -> bool:
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def with_model_dir(cls: type, options: dict[str, Any], config: RunConfig) -> dict[str, Any]:
    """Engine and backend options, with ``model_dir`` (``[model].path``) and ``seed``.

    Each is added only when not set and when ``cls`` takes it.
    """
    out = dict(options)
    if "model_dir" not in out and _accepts(cls, "model_dir"):
        out["model_dir"] = str(Path(config.model.path).absolute())
    return out


def group_reward(group: Any) -> float:
    """A group's mean reward."""
    rewards = [float(s.reward) for s in group.samples]
    return sum(rewards) / len(rewards) if rewards else 0.0


class RecordingBackend:
    """Wraps a trainer backend and remembers the groups of the last trained batch."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.last_rewards: dict[int, float] = {}
        self.last_skipped: dict[str, list[int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def restore(self, cut_dir: Any) -> None:
        self.backend.restore(cut_dir)

    def train_round(self, batch: Any) -> Any:
        self.last_rewards = {
            int(p): group_reward(g) for p, g in zip(batch.positions, batch.groups, strict=True)
        }
        skipped = getattr(batch, "skipped", None) or {}
        self.last_skipped = {str(k): [int(p) for p in v] for k, v in skipped.items()}
        return self.backend.train_round(batch)

    def save_cut(self, out_dir: Any, trigger: Any) -> None:
        self.backend.save_cut(out_dir, trigger)

    def publish_release(self, out_dir: Any) -> Any:
        return self.backend.publish_release(out_dir)


def trainer_event_bridge(stream: EventStream, recorder: dict[str, RecordingBackend]):
    """Turn driver events into the trainer stream's ``round_trained`` / ``release_published``."""

    def on_event(event: Event) -> None:
        d = dict(event.data)
        if event.kind == "trainer_round":
            rec = recorder.get("backend")
            rewards = rec.last_rewards if rec else {}
            skipped = {str(k): [int(p) for p in v] for k, v in (d.get("skipped") or {}).items()}
            for k, v in (rec.last_skipped if rec else {}).items():
                skipped[k] = sorted(set(skipped.get(k, [])) | set(v))
            stale = [int(p) for p in d.get("stale_positions", ())]
            if stale:
                skipped["stale"] = sorted(set(skipped.get("stale", [])) | set(stale))
            positions = [int(p) for p in d.get("positions", ())]
            stream.emit(
                "round_trained",
                positions=positions,
                rewards=[rewards.get(p, 0.0) for p in positions],
                skipped=skipped,
                policy_version=d.get("policy_version"),
                trained_rounds=d.get("trained_rounds"),
                metrics=d.get("metrics", {}),
            )
        elif event.kind == "trainer_skips_committed":
            stream.emit(
                "round_trained",
                positions=[],
                rewards=[],
                skipped={str(k): [int(p) for p in v] for k, v in d.get("skipped", {}).items()},
                policy_version=d.get("policy_version"),
                trained_rounds=d.get("trained_rounds"),
            )
        elif event.kind == "trainer_published":
            stream.emit("release_published", version=d.get("version"))
        else:
            stream.emit(event.kind, **d)

    return on_event


def run_trainer(config: RunConfig, run_dir: Path, island: str, incarnation: int) -> int:
    from yeto_core.cut import CutStore
    from yeto_core.lifecycle import DriverLifecycle, IslandTrainerAgent
    from yeto_core.plugins import get_plugins
    from yeto_core.release import ReleaseStore

    plugins = get_plugins()
    store = plugins.open_store(config.store_url())
    backend_cls = plugins.trainer_backend(config.trainer.backend)
    buffer = plugins.sample_buffer("file")(store, host=island)
    stream = EventStream(store, config.trainer.name, flush_s=0.0)
    recorder: dict[str, RecordingBackend] = {}

    def factory(_incarnation: int) -> Any:
        options = with_model_dir(backend_cls, config.trainer.backend_options, config)
        if _accepts(backend_cls, "seed"):
            options.setdefault("seed", config.seed)
        rec = RecordingBackend(backend_cls(**options))
        recorder["backend"] = rec
        return rec

    driver = DriverLifecycle(
        factory,
        buffer,
        CutStore(store),
        ReleaseStore(store),
        groups_per_round=config.trainer.groups_per_round,
        max_policy_age=config.trainer.max_policy_age,
        emit=trainer_event_bridge(stream, recorder),
        workdir=run_dir / "work" / f"{island}-i{incarnation}",
        partial_last_round=True,
        ledger_set_aside_before=_float_env(ENV_LEDGER_SET_ASIDE),
    )
    agent = IslandTrainerAgent(store, driver, incarnation)
    try:
        agent.run(os.environ.get(ENV_CUT) or None)
    finally:
        stream.flush()
    return 0


def run_sampler(config: RunConfig, run_dir: Path, island: str, incarnation: int) -> int:
    from yeto_core.plugins import get_plugins
    from yeto_core.policy_follower import PolicyFollower
    from yeto_core.release import ReleaseStore
    from yeto_core.sampler_loop import SamplerLoop

    groups = {name: s for name, s in config.sampler_islands()}
    if island not in groups:
        raise SystemExit(f"island {island!r} is not a sampler island of this config")
    scfg = groups[island]
    plugins = get_plugins()
    store = plugins.open_store(config.store_url())
    engine_cls = plugins.sampler_engine(scfg.engine)
    options = with_model_dir(engine_cls, scfg.engine_options, config)
    if _accepts(engine_cls, "seed"):
        options.setdefault("seed", config.seed * 1000 + incarnation * 100 + _index(island))
    stream = EventStream(store, island, flush_s=1.0)
    on_event = sampler_event_bridge(stream)
    # Server-backed engines (vllm, sglang) report their server's events and keep its
    # log in the run dir (yeto_core.engine_server).
    if _accepts(engine_cls, "emit"):
        options.setdefault("emit", on_event)
    if _accepts(engine_cls, "log_dir"):
        options.setdefault("log_dir", str(run_dir / "logs" / f"{island}-i{incarnation}-server"))
    try:
        engine = engine_cls(**options)
    except BaseException:
        stream.flush()
        raise
    task = plugins.task(config.task.name)(**config.task.options)
    buffer = plugins.sample_buffer("file")(store, host=island)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    follower = PolicyFollower(
        ReleaseStore(store),
        engine,
        work_dir=run_dir / "work" / f"{island}-i{incarnation}",
        emit=on_event,
        source=island,
    )
    loop = SamplerLoop(
        buffer,
        engine,
        task,
        follower,
        host=island,
        incarnation=incarnation,
        task_name=config.task.name,
        group_size=scfg.group_size,
        prompts_per_round=scfg.prompts_per_call,
        sampling=scfg.sampling,
        seed=config.seed,
        backlog_cap=scfg.backlog_cap,
        backlog_poll_s=0.1,
        min_round_s=scfg.min_round_s,
        sync_rounds=scfg.sync_rounds,
        stop=stop,
        emit=on_event,
    )
    if hasattr(engine, "add_restart_listener"):
        # a restarted server got the current release back: check that it serves it
        engine.add_restart_listener(lambda: follower.verify_served("engine server restarted"))
    try:
        follower.poll()  # serve the newest release (if any) before the first round
        follower.start(poll_s=0.05 if scfg.sync_rounds else 0.2)
        run_with_pauses(loop, stop, scfg.pause_every_s, scfg.pause_s, on_event)
    finally:
        follower.stop()
        if hasattr(engine, "close"):
            engine.close()
        stream.flush()
    return 0


def run_with_pauses(
    loop: Any,
    stop: threading.Event,
    every_s: float,
    pause_s: float,
    on_event: Any,
    clock: Any = time.monotonic,
) -> None:
    """Run sampler rounds until ``stop``; after every ``every_s`` of sampling, pause ``pause_s``."""
    if every_s <= 0 or pause_s <= 0:
        loop.run()
        return
    window = clock()
    while not stop.is_set():
        if clock() - window >= every_s:
            on_event(Event(kind="sampler_pause", time=time.time(), source="", data={"s": pause_s}))
            if stop.wait(pause_s):
                return
            window = clock()
        loop.run(max_rounds=1)


def sampler_event_bridge(stream: EventStream):
    """Sampler loop and follower events into the island's stream (``release_loaded``, ...)."""

    def on_event(event: Event) -> None:
        stream.emit(event.kind, **dict(event.data))

    return on_event


def _float_env(name: str) -> Optional[float]:
    raw = os.environ.get(name)
    return float(raw) if raw else None


def _index(island: str) -> int:
    tail = island.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _install_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(0)

    signal.signal(signal.SIGTERM, handler)


def main(argv: Optional[list[str]] = None) -> int:
    from yeto_core.engine_server import EXIT_INFRA_FAILED, InfraFailedError
    from yeto_core.errors import YetoError

    run_dir = Path(os.environ[ENV_RUN_DIR])
    role = os.environ[ENV_ROLE]
    island = os.environ["YETO_ISLAND"]
    incarnation = int(os.environ["YETO_INCARNATION"])
    _install_sigterm()
    try:
        config = load_run_config(run_dir)
        if role == "trainer":
            return run_trainer(config, run_dir, island, incarnation)
        if role == "sampler":
            return run_sampler(config, run_dir, island, incarnation)
        print(f"yeto island: unknown role {role!r}; use sampler or trainer", file=sys.stderr)
        return 2
    except Terminated:
        return 0
    except InfraFailedError as exc:
        print(f"yeto island {island}: {exc}", file=sys.stderr)
        return EXIT_INFRA_FAILED
    except YetoError as exc:
        print(f"yeto island {island}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
