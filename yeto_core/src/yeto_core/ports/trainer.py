"""The trainer ports: lifecycle, scheduler, conversion, backend (see :mod:`yeto_core.ports`)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from yeto_core.ports.base import Port, _with_model_and_seed, names
from yeto_core.ports.islands import IslandProvider
from yeto_core.ports.store import ObjectStore
from yeto_core.records import (
    Batch,
    ConsistentCut,
    Decision,
    Event,
    IslandLaunch,
    LifecycleState,
    ModelFacts,
    ReleaseInfo,
    SchedulerInputs,
    StopReason,
    Trigger,
)


def backend_options(cls: type, config: Any) -> dict[str, Any]:
    """``[trainer] backend_options`` for backend ``cls``, plus ``max_policy_age`` when the
    constructor names that argument and the options do not set it: the staleness the
    trainer will see (the trainer's ``max_policy_age``; 0 when every sampler runs
    ``sync_rounds``). A backend may pick its defaults by it."""
    trainer = config.trainer
    out = dict(trainer.backend_options or {})
    if "max_policy_age" not in out and names(cls, "max_policy_age"):
        samplers = list(config.samplers)
        sync = bool(samplers) and all(s.sync_rounds for s in samplers)
        out["max_policy_age"] = 0 if sync else int(trainer.max_policy_age)
    return out


class TrainerLifecycle(Port):
    """Start, drive and stop trainer incarnations (JOIN → rounds → drain → LEAVE).

    ``[trainer] lifecycle`` in the run config chooses it (built-ins: ``remote``,
    the trainer as its own island driven through the store, and ``driver``, the
    trainer inside the head's process); :meth:`create` builds it for the head.

    Complete plugin (trains nothing; its cut is an empty record)::

        from yeto_core import hookimpl
        from yeto_core.errors import IllegalTransitionError
        from yeto_core.ports import TrainerLifecycle
        from yeto_core.records import ConsistentCut, LifecycleState

        S = LifecycleState

        class Inline(TrainerLifecycle):
            PLUGIN_NAME = "inline"

            def __init__(self):
                self._state, self._inc = S.STOPPED, -1

            def _go(self, allowed, new):
                if self._state not in allowed:
                    raise IllegalTransitionError(f"{self._state.value} -> {new.value}")
                self._state = new

            def start(self, incarnation, cut=None):
                self._go({S.STOPPED}, S.READY)
                self._inc = incarnation

            def state(self):
                return self._state

            def train(self, rounds, for_s=None):
                self._go({S.READY}, S.READY)
                return 0

            def drain(self, reason):
                self._go({S.READY}, S.LEFT)
                return ConsistentCut(trigger=reason.trigger, policy_version=0,
                                     trained_rounds=0, buffer_watermark=0,
                                     incarnation=self._inc)

            def release(self):
                self._go({S.LEFT, S.FAILED}, S.STOPPED)

        @hookimpl
        def yeto_register_trainer_lifecycles(register):
            register(Inline)
    """

    PORT = "TrainerLifecycle"

    @classmethod
    def create(cls, context: LifecycleContext) -> TrainerLifecycle:
        """Build the lifecycle the head drives (default: ``cls()``)."""
        return cls()

    @abc.abstractmethod
    def start(self, incarnation: int, cut: Optional[ConsistentCut | str] = None) -> None:
        """Launch incarnation ``incarnation``, restoring ``cut`` (None: the newest valid cut)."""

    @abc.abstractmethod
    def state(self) -> LifecycleState:
        """The current state (never blocks for long)."""

    @abc.abstractmethod
    def train(self, rounds: int, for_s: Optional[float] = None) -> int:
        """Train up to ``rounds`` rounds, holding at a round boundary; return how many.

        Stop early when no full round waits and, with ``for_s``, after the round that
        ends ``for_s`` seconds or more after the call (None: no time limit).
        """

    @abc.abstractmethod
    def drain(self, reason: StopReason) -> ConsistentCut:
        """At a round boundary: take the cut of ``reason.trigger`` and LEAVE; return the cut."""

    @abc.abstractmethod
    def release(self) -> None:
        """Free the incarnation's resources; verified (the process or island is gone)."""

    # -- optional capabilities ---------------------------------------------------------

    @property
    def start_seconds(self) -> Optional[float]:
        """Seconds the current incarnation took to start (None until known)."""
        return None

    @property
    def handle(self) -> Optional[str]:
        """The island provider's handle of the current incarnation (None: in process)."""
        return None

    def report(self) -> Mapping[str, Any]:
        """The counters the incarnation last reported (``policy_version``, ``trained_rounds``)."""
        return {}

    def wait_ready(self) -> LifecycleState:
        """Block until a STARTING incarnation is READY or FAILED; default: the state now."""
        return self.state()

    def release_orphan(self, handle: str) -> bool:
        """Release an incarnation a previous head launched; True once verified gone."""
        return True


class TrainerScheduler(Port):
    """A pure rule that turns the head's inputs into START / STOP / HOLD / FINISH.

    ``[scheduler] name`` chooses it (built-ins: ``s1``, ``always-on``).

    Complete plugin::

        from yeto_core import hookimpl
        from yeto_core.ports import TrainerScheduler
        from yeto_core.records import Action, Decision, LifecycleState

        class StartStop(TrainerScheduler):
            PLUGIN_NAME = "start-stop"

            def decide(self, inputs):
                if inputs.failures >= inputs.max_failures:
                    return Decision(Action.FINISH, "gave_up", inputs)
                if inputs.data_ended and inputs.backlog_rounds < 1:
                    return Decision(Action.FINISH, "data_end", inputs)
                if inputs.state == LifecycleState.STOPPED and inputs.backlog_rounds >= 1:
                    return Decision(Action.START, "backlog", inputs)
                if inputs.state == LifecycleState.READY:
                    if inputs.backlog_rounds >= 1:
                        return Decision(Action.HOLD, "train", inputs)
                    return Decision(Action.STOP, "idle", inputs)
                return Decision(Action.HOLD, "wait", inputs)

        @hookimpl
        def yeto_register_trainer_schedulers(register):
            register(StartStop)

    The head trains while the decision is ``HOLD`` with reason ``"train"``.
    """

    PORT = "TrainerScheduler"

    @abc.abstractmethod
    def decide(self, inputs: SchedulerInputs) -> Decision:
        """The decision for ``inputs`` (a pure function of them)."""


class ConversionPort(Port):
    """Turn a node between the sampler and the trainer role, in a fixed call order.

    ``[conversion] name`` chooses it (built-in: ``none``, a pool without
    convertible nodes).

    Complete plugin::

        from yeto_core import hookimpl
        from yeto_core.errors import YetoError
        from yeto_core.ports import ConversionPort

        class FixedPool(ConversionPort):
            PLUGIN_NAME = "fixed-pool"

            def __init__(self, nodes=("node-0",), **options):
                self.samplers, self.trainers = set(nodes), set()

            def capacity(self):
                return len(self.samplers)

            def to_trainer(self, node):
                if node not in self.samplers:
                    raise YetoError(f"{node} is not a sampler node")
                self.samplers.remove(node)
                self.trainers.add(node)

            def to_sampler(self, node):
                if node not in self.trainers:
                    raise YetoError(f"{node} is not a trainer node")
                self.trainers.remove(node)
                self.samplers.add(node)

        @hookimpl
        def yeto_register_conversions(register):
            register(FixedPool)
    """

    PORT = "ConversionPort"

    @abc.abstractmethod
    def capacity(self) -> int:
        """How many nodes could convert to the trainer role now."""

    @abc.abstractmethod
    def to_trainer(self, node: str) -> None:
        """Stop sampling on ``node`` (P0-S cut of in-flight work) and hand it to the trainer."""

    @abc.abstractmethod
    def to_sampler(self, node: str) -> None:
        """Give ``node`` back to the samplers after its trainer incarnation left."""


class TrainerBackend(Port):
    """The framework that owns weights and the optimizer.

    ``[trainer] backend`` chooses it; :meth:`from_config` builds one per trainer
    incarnation. A backend only reads and writes files in the directories it is
    given; the core owns the cut and release protocol, counters, ledger and reader.

    Complete plugin (a single float parameter)::

        import json

        from yeto_core import hookimpl
        from yeto_core.ports import TrainerBackend
        from yeto_core.records import ReleaseInfo

        class Scalar(TrainerBackend):
            PLUGIN_NAME = "scalar"

            def __init__(self, **options):
                self.w = 0.0

            def restore(self, cut_dir):
                self.w = 0.0
                if cut_dir is not None:
                    self.w = json.loads((cut_dir / "w.json").read_text())

            def train_round(self, batch):
                rewards = [s.reward for g in batch.groups for s in g.samples]
                self.w += sum(rewards) / max(1, len(rewards))
                return {"loss": -self.w}

            def save_cut(self, out_dir, trigger):
                (out_dir / "w.json").write_text(json.dumps(self.w))

            def publish_release(self, out_dir):
                (out_dir / "w.json").write_text(json.dumps(self.w))
                return ReleaseInfo(kind="full", weight_checksum=repr(self.w))

        @hookimpl
        def yeto_register_trainer_backends(register):
            register(Scalar)
    """

    PORT = "TrainerBackend"

    @classmethod
    def from_config(
        cls, options: Mapping[str, Any], *, model_dir: Optional[str], seed: int
    ) -> TrainerBackend:
        """Build a backend from ``[trainer] backend_options``.

        Default: ``cls(**options)``, adding ``model_dir`` and ``seed`` when the
        constructor takes them and the options do not set them.
        """
        return cls(**_with_model_and_seed(cls, options, model_dir, seed))

    @classmethod
    def preload(cls, options: Mapping[str, Any]) -> None:
        """Import now what building this backend from ``options`` imports (a warm spare
        of the ``local`` provider, :mod:`yeto_core.providers.spare`, calls it before its
        launch, so a start does not pay for it). Default: nothing."""

    @classmethod
    def prepare_base(cls, options: Mapping[str, Any], model_dir: Path) -> Path:
        """Build the base checkpoint in ``model_dir`` (``[model] base_options``).

        Optional: ``yeto run up`` calls it when ``model.path`` holds no model,
        ``model.base_options`` asks for a build (never for a mistyped path) and
        ``cls.implements("prepare_base")``.
        """
        raise NotImplementedError(f"the {cls.PLUGIN_NAME!r} backend cannot build a base model")

    @abc.abstractmethod
    def restore(self, cut_dir: Optional[Path]) -> None:
        """Load weights, optimizer, schedule, RNG and counters from a cut (None: the base)."""

    @abc.abstractmethod
    def train_round(self, batch: Batch) -> Mapping[str, float]:
        """One optimizer step on ``batch``; return metrics."""

    @abc.abstractmethod
    def save_cut(self, out_dir: Path, trigger: Trigger) -> None:
        """Write the cut's files (safetensors + JSON) into ``out_dir``."""

    @abc.abstractmethod
    def publish_release(self, out_dir: Path) -> ReleaseInfo:
        """Write the policy release files into ``out_dir``; describe them.

        A mapping with ``kind`` and ``weight_checksum`` is accepted as well
        (:meth:`ReleaseInfo.coerce`).
        """

    def release_writer(self) -> Optional[Callable[[Path], ReleaseInfo]]:
        """Optional: this moment's release, to be written later, on another thread.

        Returns a function of ``out_dir`` that writes exactly the files
        :meth:`publish_release` would write now and returns what it would return, even
        after later rounds changed the weights (it holds its own copy of them, and shares
        nothing a round writes). A driver that uploads releases on a background thread
        (``overlap_uploads``) then writes them there, so the training thread only copies
        the weights. The default, None: :meth:`publish_release` writes the release on the
        training thread.
        """
        return None

    # -- optional: what the model accepts -----------------------------------------------

    def model_facts(self) -> ModelFacts:
        """Optional: what the loaded model accepts (vocabulary, routed-expert shape).

        Called after :meth:`restore`. The batch reader checks every group against these
        facts and leaves a group the model cannot take out of the round (``unconvertible``,
        counted, padded instead) rather than letting :meth:`train_round` raise on it. The
        default knows only :attr:`vocab_size`; a backend that replays MoE routing reports
        ``moe_layers``, ``top_k`` and ``num_experts`` as well.
        """
        return ModelFacts(vocab_size=self.vocab_size)

    # -- optional: the policy fingerprint ---------------------------------------------

    #: The vocabulary size of the trained model (None: unknown; then no fingerprint).
    vocab_size: Optional[int] = None
    #: The dtype of the released weights, for the fingerprint tolerance.
    weights_dtype: str = "float32"

    def prompt_logprobs(self, prompts: Sequence[Sequence[int]]) -> Optional[list[list[float]]]:
        """Optional: log-prob of every prompt token after the first, given those before it.

        At temperature 1, under the weights the next :meth:`publish_release` writes. The
        trainer records these for the policy fingerprint (:mod:`yeto_core.sampler.fingerprint`).
        The default, None, says this backend cannot (its releases carry no fingerprint).
        """
        return None

    # -- optional: one of several trainer islands ([trainer] islands > 1) ----------------

    def parameters(self) -> dict[str, Any]:
        """Optional: the trainable parameters now, as numpy arrays by name (copies; a
        bfloat16 tensor converted to float32 first). With ``[trainer] islands > 1`` each
        trainer island submits ``parameters()`` minus the merged parameters it started
        its horizon from to the syncer (docs/sync.md); ``cls.implements("parameters")``."""
        raise NotImplementedError(
            f"the {self.PLUGIN_NAME!r} backend cannot train as one of several trainer "
            "islands (no parameters()); set trainer.islands = 1"
        )

    def load_parameters(self, params: Mapping[str, Any]) -> None:
        """Optional: set the trainable parameters to ``params`` (names and shapes of
        :meth:`parameters`; dtypes converted to the model's), keeping the optimizer's
        state: a trainer island continues from each merged outer step this way."""
        raise NotImplementedError(
            f"the {self.PLUGIN_NAME!r} backend cannot train as one of several trainer "
            "islands (no load_parameters()); set trainer.islands = 1"
        )

    # -- optional: several ranks under torchrun -------------------------------------------

    def follow(self) -> None:
        """Optional: on a rank other than 0 of a ``torchrun`` job, run rank 0's calls.

        With ``[trainer] nproc_per_node > 1`` the trainer island starts its trainer through
        ``torchrun``; rank 0 runs the driver (the store, the command channel, the journal)
        and the other ranks call this, which returns once rank 0's :meth:`close` ran. The
        backend carries rank 0's calls to them itself.
        """
        raise NotImplementedError(
            f"the {self.PLUGIN_NAME!r} backend cannot train as several ranks; "
            "set trainer.nproc_per_node = 1"
        )

    def close(self) -> None:
        """Optional: the incarnation is done with this backend (rank 0 of several lets the
        others' :meth:`follow` return). Default: nothing to do."""


class LifecycleContext:
    """What :meth:`TrainerLifecycle.create` gets from the head.

    :ivar config: the run config (:class:`~yeto_core.config.load.RunConfig`).
    :ivar plugins: the plugin manager.
    :ivar store: the run's object store.
    :ivar provider: the trainer's island provider (``[trainer] provider``).
    :ivar launch: the trainer island's launch record (incarnation 0; evolve it per
        incarnation with :func:`attrs.evolve`).
    :ivar work_dir: a local scratch directory of the head.
    :ivar emit: receives the lifecycle's events.
    :ivar build_driver: builds the in-process trainer (a ``DriverLifecycle``) on this
        machine, for lifecycles that train in the head.
    """

    def __init__(
        self,
        *,
        config: Any,
        plugins: Any,
        store: ObjectStore,
        provider: IslandProvider,
        launch: IslandLaunch,
        work_dir: Path,
        emit: Callable[[Event], None],
        build_driver: Callable[[], TrainerLifecycle],
    ) -> None:
        self.config, self.plugins, self.store = config, plugins, store
        self.provider, self.launch, self.work_dir = provider, launch, work_dir
        self.emit, self.build_driver = emit, build_driver
