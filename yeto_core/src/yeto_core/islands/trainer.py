"""The trainer island: its backend wrapped for the island's events, its driver, and the
``torchrun`` launch of a sharded trainer (:func:`run_trainer`, :func:`run_follower`,
:func:`torchrun_argv`, :func:`trainer_driver`; the head's in-process driver is built by
the same :func:`trainer_driver`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from yeto_core.buffer.batch_reader import ReaderBatch
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
from yeto_core.ports import TrainerBackend
from yeto_core.ports.trainer import backend_options
from yeto_core.providers.env import IslandIdentity
from yeto_core.records import Batch, Event, ModelFacts, ReleaseInfo, Trigger
from yeto_core.stage_profile import emit_snapshot, stage
from yeto_core.stores.parallel import is_remote


def group_reward(group: Any) -> float:
    """A group's mean reward."""
    rewards = [float(s.reward) for s in group.samples]
    return sum(rewards) / len(rewards) if rewards else 0.0


class RecordingBackend(TrainerBackend):
    """Wraps a trainer backend and remembers the groups of the last trained batch."""

    PLUGIN_NAME = "recording"

    def __init__(self, backend: TrainerBackend) -> None:
        self.backend = backend
        self.last_rewards: dict[int, float] = {}
        self.last_skipped: dict[str, list[int]] = {}

    def restore(self, cut_dir: Optional[Path]) -> None:
        self.backend.restore(cut_dir)

    def train_round(self, batch: Batch) -> Mapping[str, float]:
        self.last_rewards = {
            int(p): group_reward(g) for p, g in zip(batch.positions, batch.groups, strict=True)
        }
        skipped = batch.skipped if isinstance(batch, ReaderBatch) else {}
        self.last_skipped = {str(k): [int(p) for p in v] for k, v in skipped.items()}
        return self.backend.train_round(batch)

    def save_cut(self, out_dir: Path, trigger: Trigger) -> None:
        self.backend.save_cut(out_dir, trigger)

    def release_writer(self) -> Any:
        return self.backend.release_writer()

    def publish_release(self, out_dir: Path) -> ReleaseInfo:
        return ReleaseInfo.coerce(self.backend.publish_release(out_dir))

    # the policy fingerprint (yeto_core.sampler.fingerprint) is recorded through the wrapper
    @property
    def vocab_size(self) -> Optional[int]:  # type: ignore[override]
        return self.backend.vocab_size

    @property
    def weights_dtype(self) -> str:  # type: ignore[override]
        return str(self.backend.weights_dtype)

    def prompt_logprobs(self, prompts: Any) -> Optional[list[list[float]]]:
        return self.backend.prompt_logprobs(prompts)

    def model_facts(self) -> ModelFacts:  # the reader's checks (a malformed group left out)
        return self.backend.model_facts()


def _skipped_positions(d: dict[str, Any]) -> dict[str, list[int]]:
    """A trainer event's ``skipped`` ({reason: positions}) as the stream writes it."""
    return {str(k): [int(p) for p in v] for k, v in d.get("skipped", {}).items()}


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
                skipped=_skipped_positions(d),
                policy_version=d.get("policy_version"),
                trained_rounds=d.get("trained_rounds"),
            )
        elif event.kind == "trainer_round_refused":
            stream.emit(
                "round_trained",
                positions=[],
                rewards=[],
                skipped=_skipped_positions(d),
                policy_version=d.get("policy_version"),
                trained_rounds=d.get("trained_rounds"),
                refused=d.get("reason"),
                detail=d.get("detail"),
                nonfinite_in_a_row=d.get("nonfinite_in_a_row"),
                metrics=d.get("metrics", {}),
            )
        elif event.kind == "trainer_published":
            stream.emit(
                "release_published",
                version=d.get("version"),
                **{
                    k: d[k]
                    for k in (
                        "release_id",
                        "encoding",
                        "stored_bytes",
                        "full_bytes",
                        "full_because",
                        "republished",
                    )
                    if k in d
                },
            )
        else:
            stream.emit(event.kind, **d)
        if event.kind == "trainer_round":
            emit_snapshot(stream.emit, every_s=PROFILE_EVERY_S)

    return on_event


def run_trainer(plugins: Any, store: Any, config: RunConfig, ident: IslandIdentity) -> int:
    from yeto_core.config.run_store import head_started_at
    from yeto_core.trainer.lifecycle import IslandTrainerAgent

    island, incarnation = ident.island, ident.incarnation
    with stage("trainer.setup.backend_import"):
        backend_cls = plugins.trainer_backend(config.trainer.backend)
    with stage("trainer.setup.buffer"):
        buffer = open_run_buffer(plugins, config, store, island)
    # every event is written at once, off the round's path (the final flush below waits)
    stream = EventStream(
        store, config.trainer.name, flush_s=0.0, observer=plugins.emit, background=True
    )
    stream.observer = store_outage_reporter(stream, store, plugins.emit)
    recorder: dict[str, RecordingBackend] = {}
    with stage("trainer.setup.base_model"):
        model_dir = base_model(store, config, ident)
    work = scratch_dir(ident)

    def factory(_incarnation: int) -> TrainerBackend:
        backend = backend_cls.from_config(
            backend_options(backend_cls, config), model_dir=model_dir, seed=config.seed
        )
        rec = RecordingBackend(backend)
        recorder["backend"] = rec
        return rec

    bridge = trainer_event_bridge(stream, recorder)
    driver = trainer_driver(
        plugins,
        store,
        config,
        buffer,
        factory,
        emit=bridge,
        workdir=work,
        ledger_set_aside_before=head_started_at(store),
        # T_s from the provider's submission of this launch (YETO_START_SUBMITTED_UNIX)
        start_submitted_unix=ident.start_submitted_unix,
    )
    agent = IslandTrainerAgent(store, driver, incarnation)
    try:
        agent.run(ident.cut)
        if "backend" in recorder:
            recorder["backend"].backend.close()  # the other ranks (if any) end too
    finally:
        emit_snapshot(stream.emit)
        stream.close()  # its last events, then its marker: the head reads it no more
    return 0


def run_follower(plugins: Any, store: Any, config: RunConfig, rank: int) -> int:
    """A trainer rank other than 0 under ``torchrun``: its own copy of the base, then
    rank 0's calls (:meth:`~yeto_core.ports.TrainerBackend.follow`); no store writes."""
    from yeto_core.config.run_store import fetch_model

    backend_cls = plugins.trainer_backend(config.trainer.backend)
    model_dir = str(fetch_model(store, Path.cwd() / f".yeto-model-rank{rank}"))
    backend = backend_cls.from_config(
        config.trainer.backend_options, model_dir=model_dir, seed=config.seed
    )
    backend.follow()
    return 0


def torchrun_argv(config: RunConfig, ident: IslandIdentity, env: Mapping[str, str]) -> Any:
    """The command that starts this trainer island's ranks through ``torchrun`` (the
    stock launcher, ``python -m torch.distributed.run``; each rank runs this module
    again), or None: one rank, or already a rank of it (``RANK`` set)."""
    t = config.trainer
    if t.nproc_per_node * t.nnodes <= 1 or "RANK" in env:
        return None
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={t.nproc_per_node}"]
    # a rank that dies ends the job (no restart in place): the head sees the island's
    # exit and starts the next incarnation from the last cut
    argv.append("--max_restarts=0")
    if t.nnodes > 1:
        run_id = f"{config.name}-{ident.island}-i{ident.incarnation}"
        argv += [f"--nnodes={t.nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint={t.rdzv}"]
        argv.append(f"--rdzv_id={run_id}")
    else:
        argv.append("--standalone")
    return [*argv, "-m", "yeto_core.islands.main"]


def trainer_driver(
    plugins: Any,
    store: Any,
    config: RunConfig,
    buffer: Any,
    factory: Any,
    *,
    emit: Any,
    workdir: Path,
    ledger_set_aside_before: Optional[float],
    start_submitted_unix: Optional[float] = None,
    overlap_uploads: bool = True,
) -> Any:
    """The trainer's :class:`~yeto_core.trainer.lifecycle.DriverLifecycle`, on a trainer
    island and in the head (``[trainer] lifecycle = "driver"``, ``overlap_uploads`` off):
    rounds read from ``buffer``, backends built by ``factory(incarnation)``, cuts, releases
    and the ledger in ``store``, events to ``emit``."""
    from yeto_core.trainer.cut import CutStore
    from yeto_core.trainer.lifecycle import DriverLifecycle

    return DriverLifecycle(
        factory,
        buffer,
        CutStore(store, emit=emit),  # cut_invalid / cut_fallback reach the trainer stream
        release_store(plugins, config, store),
        groups_per_round=config.trainer.groups_per_round,
        max_policy_age=config.trainer.max_policy_age,
        emit=emit,
        workdir=workdir,
        partial_last_round=True,
        group_size=run_group_size(config),
        ledger_set_aside_before=ledger_set_aside_before,
        # listed on a thread while the rounds come more often than every half second
        reader_options={"fenced_incarnations": StoreFences(store, ahead=is_remote(store))},
        overlap_uploads=overlap_uploads,  # a round's release upload overlaps the next
        overlap_commits=overlap_uploads,  # and so do its ledger record and buffer commit
        publish_every=config.trainer.publish_every,
        start_submitted_unix=start_submitted_unix,
    )


def run_group_size(config: RunConfig) -> Optional[int]:
    """G of the run's rounds: the samplers' ``group_size`` when every sampler group has the
    same (None: they differ, and the first group the buffer offers decides). Given, a
    too-small or oversized first group cannot decide G for the trainer."""
    sizes = {s.group_size for s in config.samplers}
    return sizes.pop() if len(sizes) == 1 else None
