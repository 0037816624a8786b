"""The ports of yeto: abstract classes that plugins implement.

Each port has a ``PORT`` (the key used in ``yeto plugins --json``), and each
implementation sets ``PLUGIN_NAME`` (the name a run config selects it by). A
plugin registers implementations through the registration hook of the port
(see :mod:`yeto_core.hookspecs`).

Every method the core calls is on its port, typed with the records of
:mod:`yeto_core.records`. Abstract methods must be implemented; the other
methods are **optional capabilities** with a working default (the core never
probes an implementation with ``getattr``). Where the core must know whether
an implementation has a capability before using it, it asks
:meth:`Port.implements`.

Each docstring's example is a complete plugin (the class **and** its
``hookimpl``) that runs; ``yeto_core.testing`` has a contract suite per port
that every implementation, these examples included, passes.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Optional

from yeto_core.records import (
    Action,
    Backlog,
    Batch,
    BufferRound,
    Completion,
    ConsistentCut,
    Decision,
    Event,
    GroupEntry,
    IslandLaunch,
    IslandStatus,
    LifecycleState,
    LocalRelease,
    ReleaseInfo,
    RoundSpec,
    SampleGroup,
    SamplingParams,
    SchedulerInputs,
    StopReason,
    Trigger,
)


class Port(abc.ABC):  # noqa: B024 (a marker base; the ports below are abstract)
    """Common base: every implementation has a ``PLUGIN_NAME``."""

    PORT: ClassVar[str] = ""
    PLUGIN_NAME: ClassVar[str] = ""

    @classmethod
    def implements(cls, method: str) -> bool:
        """Whether this class overrides the optional capability ``method`` of its port."""
        port = next((b for b in cls.__mro__ if b in PORTS), None)
        if port is None or method not in dir(port):
            raise AttributeError(f"{method!r} is not a method of a yeto port ({cls.__name__})")
        mine = inspect.getattr_static(cls, method)
        base = inspect.getattr_static(port, method)
        return _func(mine) is not _func(base)


def _func(attr: Any) -> Any:
    return attr.__func__ if isinstance(attr, (classmethod, staticmethod)) else attr


def accepts(cls: type, name: str) -> bool:
    """Whether ``cls(...)`` takes a keyword argument ``name`` (or ``**kwargs``)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


# ---------------------------------------------------------------------------------------


class ObjectStore(Port):
    """Keys to bytes, with atomic writes and create-if-absent.

    Keys are relative POSIX paths (``buffer/index/000000000001.json``).
    ``list`` returns keys in lexicographic order, strictly after ``after``.
    ``URL_SCHEMES`` names the URL schemes that select this store
    (``s3://bucket/prefix``); :meth:`from_url` builds it. The run config's
    ``store = URL`` chooses it.

    Complete plugin::

        from yeto_core import hookimpl
        from yeto_core.errors import NotFoundError
        from yeto_core.ports import ObjectStore

        class MemoryStore(ObjectStore):
            PLUGIN_NAME = "memory-doc"
            URL_SCHEMES = ("memory-doc",)

            def __init__(self):
                self._d = {}

            @classmethod
            def from_url(cls, url, **options):
                return cls()

            def get(self, key):
                try:
                    return self._d[key]
                except KeyError:
                    raise NotFoundError(key) from None

            def put(self, key, data):
                self._d[key] = bytes(data)

            def put_if_absent(self, key, data):
                if key in self._d:
                    return False
                self._d[key] = bytes(data)
                return True

            def exists(self, key):
                return key in self._d

            def list(self, prefix="", after=None):
                return iter(sorted(k for k in self._d
                                   if k.startswith(prefix) and (after is None or k > after)))

            def delete(self, key):
                self._d.pop(key, None)

        @hookimpl
        def yeto_register_object_stores(register):
            register(MemoryStore)
    """

    PORT = "ObjectStore"
    URL_SCHEMES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, **options: Any) -> ObjectStore:
        """Build the store for ``url`` (``options`` come from config or the caller)."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Return the object's bytes; raise :class:`~yeto_core.errors.NotFoundError`."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write atomically: readers see the old object or the new one, never a part."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if it does not exist; return whether this call created it."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""

    @abc.abstractmethod
    def list(self, prefix: str = "", after: Optional[str] = None) -> Iterator[str]:
        """Keys starting with ``prefix``, in key order, strictly after ``after``."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""

    # -- optional capabilities ---------------------------------------------------------

    def url(self) -> str:
        """A URL that :meth:`from_url` turns back into this store (no secrets)."""
        raise NotImplementedError(f"{type(self).__name__} cannot say its URL")

    def credentials_env(self) -> dict[str, str]:
        """Environment variables an island on another machine needs to open :meth:`url`.

        The head passes exactly these (and nothing else of its own environment) to
        every island it launches. Default: none.
        """
        return {}

    def local_root(self) -> Optional[Path]:
        """The directory holding the objects when they are plain files (the ``dir`` store).

        A buffer may then keep an appendable index there. Default: None.
        """
        return None

    def fsyncs(self) -> bool:
        """Whether writes are made durable before they return (``dir`` may turn it off)."""
        return True

    def raw_put(self, key: str, data: bytes) -> None:
        """A plain write with no yeto logic (the baseline of ``yeto bench buffer``)."""
        self.put(key, data)


class DurableSampleBuffer(Port):
    """Rollout groups appended by samplers and taken in rounds by the trainer.

    Positions are dense integers starting at 0. The consumed **watermark** is
    the first position not yet consumed: every position below it was trained
    or skipped with a counted reason. ``[buffer] kind`` in the run config
    chooses the implementation (built-in: ``file``); :meth:`open` builds it.

    Complete plugin (in memory, no durability)::

        from yeto_core import hookimpl
        from yeto_core.errors import SampleBufferError
        from yeto_core.ports import DurableSampleBuffer
        from yeto_core.records import Backlog, BufferRound, GroupEntry

        class ListBuffer(DurableSampleBuffer):
            PLUGIN_NAME = "list"

            def __init__(self, store=None, **options):
                self.groups, self.entries_, self.wm, self.ended = [], [], 0, False
                self.ids, self.seen = {}, 0

            def append(self, group):
                if group.group_id in self.ids:
                    return self.ids[group.group_id]
                pos = len(self.groups)
                versions = [s.weight_version for s in group.samples]
                self.groups.append(group)
                self.entries_.append(GroupEntry(
                    position=pos, group_id=group.group_id, prompt_id=group.prompt_id,
                    host=group.sampler_host, incarnation=group.sampler_incarnation,
                    n_samples=len(group.samples), min_version=min(versions),
                    max_version=max(versions), appended_at=0.0, payload=str(pos)))
                self.ids[group.group_id] = pos
                return pos

            def load(self, entry):
                return self.groups[entry.position]

            def select(self, spec):
                take, stale, end = [], [], self.wm
                for e in self.entries_[self.wm:]:
                    if len(take) == spec.max_groups:
                        break
                    end += 1
                    old = spec.current_version - e.min_version > spec.max_policy_age
                    (stale if old else take).append(e)
                return BufferRound(start=self.wm, end=end, entries=tuple(take),
                                   stale=tuple(stale))

            def commit(self, round):
                if round.start != self.wm:
                    raise SampleBufferError("the watermark moved since select")
                self.wm = round.end
                return self.wm

            @property
            def watermark(self):
                return self.wm

            def backlog(self, current_version=None, max_policy_age=None):
                waiting = self.entries_[self.wm:]
                if current_version is not None and max_policy_age is not None:
                    waiting = [e for e in waiting
                               if current_version - e.min_version <= max_policy_age]
                return Backlog(groups=len(waiting),
                               samples=sum(e.n_samples for e in waiting),
                               watermark=self.wm, head_position=len(self.groups),
                               oldest_version=min((e.min_version for e in waiting), default=None),
                               data_ended=self.ended)

            def poll_arrivals(self, callback):
                new = self.entries_[max(self.seen, self.wm):]
                self.seen = len(self.entries_)
                for e in new:
                    callback(e)
                return len(new)

            def reset_to(self, watermark):
                self.wm = watermark

            def mark_data_end(self):
                self.ended = True

            def data_ended(self):
                return self.ended

            def entries(self, start=0):
                return list(self.entries_[start:])

        @hookimpl
        def yeto_register_sample_buffers(register):
            register(ListBuffer)
    """

    PORT = "DurableSampleBuffer"

    @classmethod
    def open(
        cls,
        store: ObjectStore,
        *,
        host: str,
        layout: str = "auto",
        merger: bool = False,
        read_only: bool = False,
        **options: Any,
    ) -> DurableSampleBuffer:
        """Open the run's buffer in ``store`` for appender ``host``.

        :param layout: ``[buffer] layout`` (the ``file`` buffer: ``auto``, ``jsonl``,
            ``objects``, ``shards``); an implementation without layouts ignores it.
        :param merger: this process is the head (it merges per-host shards).
        :param read_only: never write (``yeto buffer stats``).
        :param options: ``[buffer] options``.

        Default: ``cls(store, host=..., layout=..., merger=..., read_only=..., **options)``,
        passing only the keywords the constructor takes.
        """
        kw: dict[str, Any] = dict(options)
        for name, value in (
            ("host", host),
            ("layout", layout),
            ("merger", merger),
            ("read_only", read_only),
        ):
            if accepts(cls, name):
                kw[name] = value
        return cls(store, **kw)

    @abc.abstractmethod
    def append(self, group: SampleGroup) -> int:
        """Durably append ``group``; return its position (the same one for a repeated id)."""

    @abc.abstractmethod
    def load(self, entry: GroupEntry) -> SampleGroup:
        """The whole group ``entry`` indexes (arrays included)."""

    @abc.abstractmethod
    def select(self, spec: RoundSpec) -> BufferRound:
        """Take up to ``spec.max_groups`` whole groups from the watermark on, in position order.

        Groups older than ``spec.max_policy_age`` versions are consumed as ``stale``.
        The round starts at the watermark; nothing moves until :meth:`commit`.
        """

    @abc.abstractmethod
    def commit(self, round: BufferRound) -> int:
        """Mark a selected round consumed (watermark := ``round.end``); return it.

        Raise :class:`~yeto_core.errors.SampleBufferError` when the watermark is no
        longer ``round.start``.
        """

    @property
    @abc.abstractmethod
    def watermark(self) -> int:
        """The first position not consumed (re-read from the store)."""

    @abc.abstractmethod
    def backlog(
        self, current_version: Optional[int] = None, max_policy_age: Optional[int] = None
    ) -> Backlog:
        """What waits after the watermark (with a version and age: only what is selectable).

        Its cost does not grow with history.
        """

    @abc.abstractmethod
    def poll_arrivals(self, callback: Callable[[GroupEntry], None]) -> int:
        """Call ``callback`` once per group appended since the last poll; return the count."""

    @abc.abstractmethod
    def reset_to(self, watermark: int) -> None:
        """After a restore: groups at and after ``watermark`` become selectable again."""

    @abc.abstractmethod
    def mark_data_end(self) -> None:
        """Record that no more groups will be appended."""

    @abc.abstractmethod
    def data_ended(self) -> bool:
        """Whether :meth:`mark_data_end` was called (by any process)."""

    # -- optional capabilities ---------------------------------------------------------

    def append_many(self, groups: Sequence[SampleGroup]) -> list[int]:
        """Append several groups; default: :meth:`append` each in order."""
        return [self.append(g) for g in groups]

    def entries(self, start: int = 0) -> list[GroupEntry]:
        """Every entry from ``start`` on (O(history): summaries, ``yeto ledger replay``)."""
        from yeto_core.errors import SampleBufferError

        raise SampleBufferError(
            f"the {self.PLUGIN_NAME!r} sample buffer cannot list its entries; the run summary "
            "and `yeto ledger replay` need DurableSampleBuffer.entries()"
        )

    def stats(self) -> dict[str, Any]:
        """What ``yeto buffer stats`` shows; default: the backlog's fields."""
        b = self.backlog()
        return {
            "head_position": b.head_position,
            "watermark": b.watermark,
            "backlog_groups": b.groups,
            "backlog_samples": b.samples,
            "oldest_version": b.oldest_version,
            "data_ended": b.data_ended,
        }

    def close(self) -> None:
        """Release file descriptors and connections; default: nothing."""


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

            def train(self, rounds):
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
    def train(self, rounds: int) -> int:
        """Train up to ``rounds`` rounds, holding at a round boundary; return how many."""

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
    def prepare_base(cls, options: Mapping[str, Any], model_dir: Path) -> Path:
        """Build the base checkpoint in ``model_dir`` (``[model] base_options``).

        Optional: ``yeto run up`` calls it when ``model.path`` holds no model and
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


class SamplerEngine(Port):
    """Generates groups with per-token behaviour log-probs from the loaded policy.

    ``[[samplers]] engine`` chooses it; :meth:`from_config` builds it in the
    sampler island.

    Complete plugin (answers each prompt with its own last token)::

        import hashlib

        import numpy as np

        from yeto_core import hookimpl
        from yeto_core.ports import SamplerEngine
        from yeto_core.records import Completion

        class Echo(SamplerEngine):
            PLUGIN_NAME = "echo"

            def __init__(self, **options):
                self.version, self.checksum = 0, "base"

            def generate(self, prompts, n, sampling):
                return [[Completion(tokens=np.array([p[-1] if p else 0], dtype=np.int64),
                                    logprobs=np.zeros(1, dtype=np.float32),
                                    weight_version=self.version)
                         for _ in range(n)] for p in prompts]

            def load_release(self, release):
                self.version = release.version
                self.checksum = release.weight_checksum

            def served_checksum(self):
                return self.checksum

            def encode(self, text):
                return list(text.encode())

            def decode(self, ids):
                return bytes(int(i) % 256 for i in ids).decode(errors="replace")

        @hookimpl
        def yeto_register_sampler_engines(register):
            register(Echo)

    (An engine that really loads weights computes ``served_checksum`` from what
    it serves, e.g. ``hashlib.sha256`` over its tensors; the follower refuses a
    release whose read-back differs from the release's ``weight_checksum``.)
    """

    PORT = "SamplerEngine"

    @classmethod
    def from_config(
        cls, options: Mapping[str, Any], *, model_dir: Optional[str], seed: int
    ) -> SamplerEngine:
        """Build an engine from ``[[samplers]] engine_options``.

        Default: ``cls(**options)``, adding ``model_dir`` and ``seed`` when the
        constructor takes them and the options do not set them.
        """
        return cls(**_with_model_and_seed(cls, options, model_dir, seed))

    @abc.abstractmethod
    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        """``n`` completions per prompt (in prompt order), each with its behaviour log-probs."""

    @abc.abstractmethod
    def load_release(self, release: LocalRelease) -> None:
        """Load a fetched, verified policy release (hot reload)."""

    @abc.abstractmethod
    def served_checksum(self) -> str:
        """The checksum of the weights the engine serves now (read back, not remembered)."""

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with the served tokenizer."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with the served tokenizer."""

    # -- optional capabilities ---------------------------------------------------------

    def rollback(self) -> None:
        """Serve the weights from before the last :meth:`load_release` again.

        Optional: when ``type(engine).implements("rollback")`` is False the
        follower loads the previous release again instead.
        """
        raise NotImplementedError(f"the {self.PLUGIN_NAME!r} engine cannot roll back")

    def close(self) -> None:
        """Stop what the engine started (a server, threads); default: nothing."""


class IslandProvider(Port):
    """Runs islands (a process group, a cloud function, a cluster, a leased machine).

    ``provider`` in each ``[[samplers]]`` table and in ``[trainer]`` chooses it
    (built-in: ``local``); ``provider_options`` of that table reach
    :meth:`launch` as ``launch.options``. The head builds one provider per name
    with :meth:`create`, giving it ``state_dir``, a directory on the head's
    machine the provider may use for handles and logs (keep your files under
    ``state_dir / PLUGIN_NAME``).

    An island needs only the store: :meth:`launch` receives an
    :class:`~yeto_core.records.IslandLaunch` whose ``env`` is the island's whole
    environment (store URL, run id, role, island, incarnation, explicit store
    credentials). Start ``python -m <launch.entry_module>`` with it wherever the
    island runs, or call ``yeto_core.island_main.run_island(launch.env)`` in
    process. Return a handle (``launch.handle`` is a good one) that
    :meth:`status` and :meth:`release` understand, also in a restarted head
    (:meth:`orphans`).

    Complete plugin (each island a process group in a fresh empty directory)::

        import json
        import os
        import signal
        import subprocess
        import sys
        import tempfile
        import time
        from pathlib import Path

        from yeto_core import hookimpl
        from yeto_core.ports import IslandProvider
        from yeto_core.records import IslandStatus

        class TempDirIslands(IslandProvider):
            PLUGIN_NAME = "tempdir"

            def __init__(self, state_dir):
                self.dir = Path(state_dir) / self.PLUGIN_NAME
                self.dir.mkdir(parents=True, exist_ok=True)
                self.procs = {}

            def launch(self, launch):
                cwd = tempfile.mkdtemp(prefix=f"yeto-{launch.handle}-")
                env = {"PATH": os.environ.get("PATH", ""), **launch.env}
                with open(self.dir / f"{launch.handle}.log", "ab") as log:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", launch.entry_module], cwd=cwd, env=env,
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True)
                self.procs[launch.handle] = proc
                (self.dir / f"{launch.handle}.json").write_text(json.dumps({"pgid": proc.pid}))
                return launch.handle

            def _pgid(self, handle):
                try:
                    return json.loads((self.dir / f"{handle}.json").read_text())["pgid"]
                except OSError:
                    return None

            def _gone(self, handle, pgid):
                if handle in self.procs:
                    self.procs[handle].poll()  # reap the leader
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return True
                return False

            def status(self, handle):
                pgid = self._pgid(handle)
                if pgid is None:
                    return IslandStatus.GONE
                return IslandStatus.EXITED if self._gone(handle, pgid) else IslandStatus.RUNNING

            def events(self, handle):
                return iter(())

            def release(self, handle):
                pgid = self._pgid(handle)
                if pgid is None:
                    return True
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    if self._gone(handle, pgid):
                        break
                    try:
                        os.killpg(pgid, sig)
                    except ProcessLookupError:
                        break
                    deadline = time.monotonic() + 10.0
                    while not self._gone(handle, pgid) and time.monotonic() < deadline:
                        time.sleep(0.05)
                if not self._gone(handle, pgid):
                    return False
                self.procs.pop(handle, None)
                (self.dir / f"{handle}.json").unlink(missing_ok=True)
                return True

            def orphans(self):
                return [p.stem for p in self.dir.glob("*.json") if p.stem not in self.procs]

            def returncode(self, handle):
                proc = self.procs.get(handle)
                return None if proc is None else proc.poll()

            def log_hint(self, handle):
                return str(self.dir / f"{handle}.log")

        @hookimpl
        def yeto_register_island_providers(register):
            register(TempDirIslands)
    """

    PORT = "IslandProvider"

    @classmethod
    def create(cls, state_dir: Path) -> IslandProvider:
        """Build the provider of a head whose local files live in ``state_dir``.

        Default: ``cls(state_dir)``.
        """
        return cls(state_dir)  # type: ignore[call-arg]

    @abc.abstractmethod
    def launch(self, launch: IslandLaunch) -> str:
        """Start the island ``launch`` describes; return its handle (kept by the head)."""

    @abc.abstractmethod
    def status(self, handle: str) -> IslandStatus:
        """Where the island is (:class:`~yeto_core.records.IslandStatus`; never blocks long)."""

    @abc.abstractmethod
    def events(self, handle: str) -> Iterator[Event]:
        """Provider-side events since the last call (log lines, preemption notices)."""

    @abc.abstractmethod
    def release(self, handle: str) -> bool:
        """Stop the island and verify it is gone; return True once verified."""

    @abc.abstractmethod
    def orphans(self) -> list[str]:
        """Handles of islands still held that this provider object did not launch."""

    # -- optional capabilities ---------------------------------------------------------

    def returncode(self, handle: str) -> Optional[int]:
        """The island's exit code once it exited (None: unknown)."""
        return None

    def log_hint(self, handle: str) -> str:
        """Where a user finds the island's output (a path, a console URL); default: ``""``."""
        return ""


class Task(Port):
    """A verifiable task: prompts and a reward function.

    ``[task] name`` chooses it; ``[task] options`` are its keyword arguments.

    Complete plugin::

        from yeto_core import hookimpl
        from yeto_core.ports import Task

        class SayDigit(Task):
            PLUGIN_NAME = "say-digit"

            def __init__(self, **options):
                pass

            def prompt(self, index):
                return f"say {index % 10}", str(index % 10)

            def reward(self, answer, completion):
                return 1.0 if completion.strip() == answer else 0.0

        @hookimpl
        def yeto_register_tasks(register):
            register(SayDigit)
    """

    PORT = "Task"

    @abc.abstractmethod
    def prompt(self, index: int) -> tuple[str, str]:
        """The prompt text and the reference answer for dispense position ``index``."""

    @abc.abstractmethod
    def reward(self, answer: str, completion: str) -> float:
        """Score ``completion`` against ``answer`` (0..1)."""


# ---------------------------------------------------------------------------------------


def _with_model_and_seed(
    cls: type, options: Mapping[str, Any], model_dir: Optional[str], seed: int
) -> dict[str, Any]:
    out = dict(options)
    if model_dir is not None and "model_dir" not in out and accepts(cls, "model_dir"):
        out["model_dir"] = str(model_dir)
    if "seed" not in out and accepts(cls, "seed"):
        out["seed"] = seed
    return out


class LifecycleContext:
    """What :meth:`TrainerLifecycle.create` gets from the head.

    :ivar config: the run config (:class:`~yeto_core.config.RunConfig`).
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


#: Every port class, in the order ``yeto plugins`` shows them.
PORTS: tuple[type[Port], ...] = (
    ObjectStore,
    DurableSampleBuffer,
    TrainerLifecycle,
    TrainerScheduler,
    ConversionPort,
    TrainerBackend,
    SamplerEngine,
    IslandProvider,
    Task,
)

__all__ = [
    "PORTS",
    "Action",
    "ConversionPort",
    "DurableSampleBuffer",
    "IslandProvider",
    "LifecycleContext",
    "ObjectStore",
    "Port",
    "SamplerEngine",
    "Task",
    "TrainerBackend",
    "TrainerLifecycle",
    "TrainerScheduler",
    "accepts",
]
