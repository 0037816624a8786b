"""The ports of yeto: abstract classes that plugins implement.

Each port has a ``PORT`` (the key used in ``yeto plugins --json``), and each
implementation sets ``PLUGIN_NAME`` (the name a config selects it by). A
plugin registers implementations through the registration hook of the port
(see :mod:`yeto_core.hookspecs`). Each docstring shows a complete minimal
implementation.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Optional

from yeto_core.records import (
    Action,
    Backlog,
    LifecycleState,
    RoundSpec,
    SampleGroup,
    StopReason,
    Trigger,
)


class Port(abc.ABC):  # noqa: B024 (a marker base; the ports below are abstract)
    """Common base: every implementation has a ``PLUGIN_NAME``."""

    PORT: ClassVar[str] = ""
    PLUGIN_NAME: ClassVar[str] = ""


class ObjectStore(Port):
    """Keys to bytes, with atomic writes and create-if-absent.

    Keys are relative POSIX paths (``buffer/index/000000000001.json``).
    ``list`` returns keys in lexicographic order, strictly after ``after``.
    ``URL_SCHEMES`` names the URL schemes that select this store
    (``s3://bucket/prefix``); :meth:`from_url` builds it.

    Minimal implementation::

        class MemoryStore(ObjectStore):
            PLUGIN_NAME = "memory"
            URL_SCHEMES = ("memory",)

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
    """

    PORT = "ObjectStore"
    URL_SCHEMES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, **options: Any) -> ObjectStore:
        """Build the store for ``url`` (``options`` come from config)."""

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

    def url(self) -> str:
        """A URL that :meth:`from_url` turns back into this store (no secrets)."""
        raise NotImplementedError


class DurableSampleBuffer(Port):
    """Rollout groups appended by samplers and taken in rounds by the trainer.

    Positions are dense integers starting at 0. The consumed **watermark** is
    the first position not yet consumed: every position below it was trained
    or skipped with a counted reason.

    Minimal implementation (in memory, no durability)::

        class ListBuffer(DurableSampleBuffer):
            PLUGIN_NAME = "list"

            def __init__(self, store=None, **options):
                self.groups, self.meta, self.wm, self.ended = [], [], 0, False

            def append(self, group):
                self.groups.append(group)
                self.meta.append(min(s.weight_version for s in group.samples))
                return len(self.groups) - 1

            def select(self, spec):
                take, stale, pos = [], [], self.wm
                while pos < len(self.groups) and len(take) < spec.max_groups:
                    old = spec.current_version - self.meta[pos] > spec.max_policy_age
                    (stale if old else take).append(pos)
                    pos += 1
                return {"positions": take, "stale": stale, "end": pos}

            def commit(self, round):
                self.wm = round["end"]
                return self.wm

            def backlog(self):
                n = len(self.groups) - self.wm
                return Backlog(groups=n, samples=n * 8, watermark=self.wm,
                               head_position=len(self.groups), data_ended=self.ended)

            def poll_arrivals(self, callback):
                return 0

            def reset_to(self, watermark):
                self.wm = watermark

            def mark_data_end(self):
                self.ended = True
    """

    PORT = "DurableSampleBuffer"

    @abc.abstractmethod
    def append(self, group: SampleGroup) -> int:
        """Durably append ``group``; return its position (the same one for a repeated id)."""

    @abc.abstractmethod
    def select(self, spec: RoundSpec) -> Any:
        """Take up to ``spec.max_groups`` whole groups after the watermark, in position order.

        Groups older than ``spec.max_policy_age`` versions are consumed as stale.
        """

    @abc.abstractmethod
    def commit(self, round: Any) -> int:
        """Mark a selected round consumed; return the new watermark."""

    @abc.abstractmethod
    def backlog(self) -> Backlog:
        """What waits after the watermark; its cost does not grow with history."""

    @abc.abstractmethod
    def poll_arrivals(self, callback: Callable[[Any], None]) -> int:
        """Call ``callback`` once per group appended since the last poll; return the count."""

    @abc.abstractmethod
    def reset_to(self, watermark: int) -> None:
        """After a restore: groups at and after ``watermark`` become selectable again."""

    @abc.abstractmethod
    def mark_data_end(self) -> None:
        """Record that no more groups will be appended."""


class TrainerLifecycle(Port):
    """Start, drive and stop trainer incarnations (JOIN → rounds → drain → LEAVE).

    Minimal implementation::

        class Inline(TrainerLifecycle):
            PLUGIN_NAME = "inline"

            def __init__(self):
                self._state = LifecycleState.STOPPED

            def start(self, incarnation, cut):
                self._state = LifecycleState.READY

            def state(self):
                return self._state

            def train(self, rounds):
                return rounds

            def drain(self, reason):
                self._state = LifecycleState.LEFT
                return None

            def release(self):
                self._state = LifecycleState.STOPPED
    """

    PORT = "TrainerLifecycle"

    @abc.abstractmethod
    def start(self, incarnation: int, cut: Optional[Any]) -> None:
        """Launch incarnation ``incarnation``, restoring ``cut`` (None: from the base)."""

    @abc.abstractmethod
    def state(self) -> LifecycleState:
        """The current state (never blocks for long)."""

    @abc.abstractmethod
    def train(self, rounds: int) -> int:
        """Train up to ``rounds`` rounds, holding at a round boundary; return how many."""

    @abc.abstractmethod
    def drain(self, reason: StopReason) -> Optional[Any]:
        """Take the cut of ``reason``'s trigger and LEAVE; return the cut."""

    @abc.abstractmethod
    def release(self) -> None:
        """Free the incarnation's resources; verified (the process or island is gone)."""


class TrainerScheduler(Port):
    """A pure rule that turns the head's inputs into START / STOP / HOLD / FINISH.

    Minimal implementation::

        class AlwaysOn(TrainerScheduler):
            PLUGIN_NAME = "always-on"

            def decide(self, inputs):
                if inputs.state == LifecycleState.STOPPED:
                    return Decision(action=Action.START, reason="always-on", inputs=inputs)
                return Decision(action=Action.HOLD, reason="running", inputs=inputs)
    """

    PORT = "TrainerScheduler"

    @abc.abstractmethod
    def decide(self, inputs: Any) -> Any:
        """Return a decision record carrying its :class:`~yeto_core.records.Action` and inputs."""


class ConversionPort(Port):
    """Turn a node between the sampler and the trainer role, in a fixed call order.

    Minimal implementation::

        class NoConversion(ConversionPort):
            PLUGIN_NAME = "none"

            def capacity(self):
                return 0

            def to_trainer(self, node):
                raise RuntimeError("this pool has no convertible nodes")

            def to_sampler(self, node):
                raise RuntimeError("this pool has no convertible nodes")
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
    """Builds trainer drivers: the framework that owns weights and the optimizer.

    Minimal implementation (a single float parameter)::

        class Scalar(TrainerBackend):
            PLUGIN_NAME = "scalar"

            def __init__(self, **options):
                self.w, self.version = 0.0, 0

            def restore(self, cut_dir):
                if cut_dir is not None:
                    self.w = float((cut_dir / "w.txt").read_text())

            def train_round(self, batch):
                self.w += sum(batch.rewards)
                return {"loss": 0.0}

            def save_cut(self, out_dir, trigger):
                (out_dir / "w.txt").write_text(repr(self.w))

            def publish_release(self, out_dir):
                self.version += 1
                (out_dir / "w.txt").write_text(repr(self.w))
                return self.version
    """

    PORT = "TrainerBackend"

    @abc.abstractmethod
    def restore(self, cut_dir: Optional[Any]) -> None:
        """Load weights, optimizer, schedule, RNG and counters from a cut (None: the base)."""

    @abc.abstractmethod
    def train_round(self, batch: Any) -> Mapping[str, float]:
        """One optimizer step on ``batch``; return metrics."""

    @abc.abstractmethod
    def save_cut(self, out_dir: Any, trigger: Trigger) -> None:
        """Write the cut's shards (safetensors + JSON) into ``out_dir``."""

    @abc.abstractmethod
    def publish_release(self, out_dir: Any) -> Any:
        """Write the policy release files into ``out_dir``; return the release info."""

    #: The vocabulary size of the trained model (None: unknown; then no fingerprint).
    vocab_size: Optional[int] = None
    #: The dtype of the released weights, for the fingerprint tolerance.
    weights_dtype: str = "float32"

    def prompt_logprobs(self, prompts: Sequence[Sequence[int]]) -> Optional[list[list[float]]]:
        """Optional: log-prob of every prompt token after the first, given those before it.

        At temperature 1, under the weights the next :meth:`publish_release` writes. The
        trainer records these for the policy fingerprint (:mod:`yeto_core.fingerprint`).
        The default, None, says this backend cannot (its releases carry no fingerprint).
        """
        return None


class SamplerEngine(Port):
    """Generates groups with per-token behavior log-probs from the loaded policy.

    Minimal implementation (a fixed answer)::

        class Echo(SamplerEngine):
            PLUGIN_NAME = "echo"

            def __init__(self, **options):
                self.version = 0

            def generate(self, prompts, n, sampling):
                return [[([*p, 0], [0.0]) for _ in range(n)] for p in prompts]

            def load_release(self, release):
                self.version = release.version

            def served_checksum(self):
                return "0"

            def encode(self, text):
                return list(text.encode())

            def decode(self, ids):
                return bytes(ids).decode(errors="replace")
    """

    PORT = "SamplerEngine"

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: Any) -> Any:
        """``n`` samples per prompt with per-token behavior log-probs."""

    @abc.abstractmethod
    def load_release(self, release: Any) -> None:
        """Load a policy release (hot reload)."""

    @abc.abstractmethod
    def served_checksum(self) -> Optional[str]:
        """The checksum of the weights the engine serves now (read back, not remembered).

        None: the engine cannot read its served weights back (a remote server); the
        follower then relies on the policy fingerprint (:meth:`prompt_logprobs`).
        """

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with the served tokenizer."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with the served tokenizer."""

    def prompt_logprobs(self, prompts: Sequence[Sequence[int]]) -> Optional[list[list[float]]]:
        """Optional: log-prob of every prompt token after the first, given those before it.

        At temperature 1, under the weights served now (asked of the engine, not
        remembered). The policy follower compares them with the release's fingerprint
        after every load (:mod:`yeto_core.fingerprint`). The default, None, says this
        engine cannot fingerprint: releases load unverified, and the events say so.
        """
        return None


class IslandProvider(Port):
    """Runs islands (groups of processes or machines) somewhere.

    Minimal implementation (runs nothing, for dry runs)::

        class DryRun(IslandProvider):
            PLUGIN_NAME = "dry-run"

            def launch(self, island, incarnation, env):
                return f"{island}-i{incarnation}"

            def status(self, handle):
                return "gone"

            def events(self, handle):
                return iter(())

            def release(self, handle):
                return True

            def orphans(self):
                return []
    """

    PORT = "IslandProvider"

    @abc.abstractmethod
    def launch(self, island: str, incarnation: int, env: Mapping[str, str]) -> str:
        """Start ``island``'s incarnation with ``env``; return a handle (kept in the run dir)."""

    @abc.abstractmethod
    def status(self, handle: str) -> str:
        """``"starting"``, ``"running"``, ``"exited"`` or ``"gone"``."""

    @abc.abstractmethod
    def events(self, handle: str) -> Iterator[Any]:
        """Events the island wrote since the last call."""

    @abc.abstractmethod
    def release(self, handle: str) -> bool:
        """Stop the island and verify it is gone; return True once verified."""

    @abc.abstractmethod
    def orphans(self) -> list[str]:
        """Handles of islands still running that no head owns (after a head restart)."""


class Task(Port):
    """A verifiable task: prompts and a reward function.

    Not one of the product's five ports, but the unit a sampler dispenses.

    Minimal implementation::

        class Echo(Task):
            PLUGIN_NAME = "echo"

            def prompt(self, index):
                return f"say {index % 10}", str(index % 10)

            def reward(self, answer, completion):
                return 1.0 if completion.strip() == answer else 0.0
    """

    PORT = "Task"

    @abc.abstractmethod
    def prompt(self, index: int) -> tuple[str, str]:
        """The prompt text and the reference answer for dispense position ``index``."""

    @abc.abstractmethod
    def reward(self, answer: str, completion: str) -> float:
        """Score ``completion`` against ``answer`` (0..1)."""


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
    "Action",
    "ConversionPort",
    "DurableSampleBuffer",
    "IslandProvider",
    "ObjectStore",
    "PORTS",
    "Port",
    "SamplerEngine",
    "Task",
    "TrainerBackend",
    "TrainerLifecycle",
    "TrainerScheduler",
]
