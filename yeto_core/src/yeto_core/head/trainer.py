"""The head's side of the trainer: :class:`HeadTrainer`, a mixin of
:class:`~yeto_core.head.run.Head`.

``build_trainer_loop`` builds the scheduler, the ``[trainer] lifecycle`` and the
:class:`~yeto_core.trainer.loop.TrainerLoop` that drives it; the backlog the
scheduler sees, the loop's events as head events, the trainer's final stop and the
check of its final cut.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import attrs

from yeto_core.errors import ConfigError
from yeto_core.head.islands import _CostedProvider, _NoProvider
from yeto_core.ports import LifecycleContext
from yeto_core.records import StopReason


def lora_run(config: Any) -> bool:
    """Whether the run trains a LoRA adapter (``[trainer] backend_options.tuning = "lora"``,
    the backends' tuning option): its releases are adapters, which its samplers wait for."""
    return (config.trainer.backend_options or {}).get("tuning") == "lora"


#: seconds a backlog read by the housekeeping tick stays good for the scheduler's next
#: decision (the trainer tick right after it; an older read is read again)
BACKLOG_REUSE_S = 1.0


class HeadTrainer:
    """Building and stopping the trainer loop (the host holds the config, plugins,
    store, providers, cost guard, events, fences, ``launch_record`` and ``build_driver``)."""

    #: (monotonic time, data end seen, backlog) of the last :meth:`read_backlog`
    _backlog_read: Optional[tuple[float, bool, Any]] = None

    def build_trainer_loop(self) -> None:
        """The scheduler, the ``[trainer] lifecycle`` and the TrainerLoop."""
        from yeto_core.release.store import ReleaseStore
        from yeto_core.trainer.loop import Journal, LoopConfig, TrainerLoop

        t = self.config.trainer
        if t.islands > 1:  # several trainer islands, one policy (docs/sync.md)
            from yeto_core.head.trainer_pool import TrainerPool

            self.trainer_loop = TrainerPool(self)
            self.lifecycle = self.trainer_loop
            return
        trainer_provider = self.providers[t.provider] if t.lifecycle == "remote" else _NoProvider()
        launch = self.launch_record("trainer", t.name, 0)
        if t.lifecycle == "remote":  # S1 starts it when a backlog waits: have it warm then
            trainer_provider.prepare(launch)
        context = LifecycleContext(
            config=self.config,
            plugins=self.plugins,
            store=self.store,
            provider=_CostedProvider(self, trainer_provider),
            launch=launch,
            work_dir=self.run_dir / "work" / "head",
            emit=lambda e: None,
            build_driver=self.build_driver,
        )
        self.lifecycle = self.plugins.trainer_lifecycle(t.lifecycle).create(context)
        options = dict(self.config.scheduler.options)
        # A first-policy start only for a LoRA run (the seed's rule): its samplers serve
        # no adapter before the first release. A full-parameter run's samplers serve the
        # base, policy version 0. ``scheduler.options.first_policy_start`` still decides
        # when given.
        options.setdefault("first_policy_start", lora_run(self.config))
        try:
            loop_config = LoopConfig(
                groups_per_round=self.config.trainer.groups_per_round,
                a_hard=self.config.trainer.max_policy_age,
                **options,
            )
        except ValueError as exc:
            raise ConfigError(f"scheduler.options: {exc}") from None
        except TypeError as exc:
            allowed = ", ".join(
                f.name
                for f in attrs.fields(LoopConfig)
                if f.name not in ("groups_per_round", "a_hard")
            )
            raise ConfigError(f"scheduler.options: {exc}; allowed keys: {allowed}") from None
        releases = ReleaseStore(self.store)
        from yeto_core.conversion.head import install_conversion  # [conversion] local

        self.lifecycle, scheduler = install_conversion(
            self, self.lifecycle, self.plugins.scheduler(self.config.scheduler.name)()
        )
        lifecycle = self.lifecycle
        self.trainer_loop = TrainerLoop(
            self.cost_guard.wrap(scheduler),
            lifecycle,
            self.backlog_for_scheduler,
            lambda: releases.latest() is not None,
            Journal(self.store),
            loop_config,
            clock=self.clock,
            emit=self._on_loop_event,
            ready_timeout_s=float(t.ready_timeout_s),
        )

    def read_backlog(self) -> Any:
        """The backlog read now as the scheduler counts it (without fenced incarnations'
        groups until the data end), kept for the trainer tick that follows within
        ``BACKLOG_REUSE_S`` (:meth:`backlog_for_scheduler`): the housekeeping tick's
        ``status.json`` and the scheduler's decision share one read, not two (each a
        few requests on a remote store)."""
        ended = self.trainer_loop is not None and self.trainer_loop.data_end_at is not None
        b = self.buffer.backlog(fenced=None if ended else self.fences)
        self._backlog_read = (time.monotonic(), ended, b)
        return b

    def backlog_for_scheduler(self) -> Any:
        """The backlog the scheduler decides on: without the groups of fenced sampler
        incarnations, which the trainer skips (a start for them would train nothing);
        after the data end every group, and a short last round counts as a whole round.

        The trainer takes a short last round once the data ended (the driver's
        ``partial_last_round``), so that every appended group is trained or skipped:
        fenced groups left then are skipped by that drain. A read of :meth:`read_backlog`
        made just before (the housekeeping tick) is used once instead of a new one.
        """
        ended = self.trainer_loop is not None and self.trainer_loop.data_end_at is not None
        kept, self._backlog_read = self._backlog_read, None
        if kept is not None and kept[1] == ended and time.monotonic() - kept[0] <= BACKLOG_REUSE_S:
            b = kept[2]
        else:
            b = self.buffer.backlog(fenced=None if ended else self.fences)
        if not b.data_ended:
            return b
        if not ended:  # the data end is new: read once more, every group counted
            b = self.buffer.backlog()
        gpr = self.config.trainer.groups_per_round
        if b.data_ended and 0 < b.groups % gpr:
            b = attrs.evolve(b, groups=b.groups + gpr - b.groups % gpr)
        return b

    def _on_loop_event(self, event: Any) -> None:
        names = {
            "head_start": "trainer_start",
            "head_stop": "trainer_stop",
            "head_release": "trainer_release",
            "head_orphan_released": "trainer_orphan_released",
            "head_finish": "trainer_finish",
            "head_gave_up": "trainer_gave_up",
            "head_start_failed": "trainer_start_failed",
            "head_ready_timeout": "trainer_ready_timeout",
            "head_train_failed": "trainer_train_failed",
            "head_drain_failed": "trainer_drain_failed",
        }
        self.plugins.emit(event)  # the journal's stream (head_decision, head_start, ...)
        self.cost_guard.observe(event)
        kind = names.get(event.kind)
        if kind is not None:
            self.events.emit(kind, **dict(event.data))

    def check_final_cut(self) -> Optional[str]:
        """Read the final cut back before the run is called finished (None: it is valid).

        Nothing reads the last cut again during a run, so a cut damaged after it was
        committed would otherwise stay ``cuts/LATEST`` unnoticed. A bad one is a
        ``cut_invalid`` event (``final``: true, with the newest valid cut) and the run is
        not marked finished (exit 1): its final weights in the store are damaged.
        """
        from yeto_core.trainer.cut import CutStore

        cuts = CutStore(self.store)
        cut_id = cuts.latest_id()
        if cut_id is None:
            return None
        problems = cuts.verify(cut_id)
        if not problems:
            return None
        older = [c.cut_id for c in reversed(cuts.list()) if c.cut_id != cut_id]
        valid = next((c for c in older if not cuts.verify(c)), None)
        self.events.emit(
            "cut_invalid",
            cut_id=cut_id,
            problem="; ".join(problems),
            final=True,
            newest_valid=valid,
        )
        self.final_cut_problem = (
            f"the final cut {cut_id} fails its check ({problems[0]}): the run's final weights "
            "in the store are damaged, so it is not marked finished; the newest valid cut is "
            f"{valid or 'none (only the base)'}. Restore the damaged file from a copy to "
            "finish the run"
        )
        return self.final_cut_problem

    def stop_trainer(self) -> None:
        """Take the final cut (FINISHED → FINAL trigger) and release the trainer island."""
        if self.lifecycle is None or self.trainer_loop is None:
            return
        # waits for a STARTING trainer, drains a READY one, releases anything else (the
        # provider verifies the island is gone); rounds after the newest cut are trained
        # again by the next incarnation.
        self.trainer_loop.stop(StopReason.FINISHED)
