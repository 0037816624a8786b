"""Hypothesis stateful fuzz of the trainer island's read chain, with malformed groups.

Real parts: the island's :func:`~yeto_core.islands.trainer.trainer_driver` (the
``DriverLifecycle`` ``run_trainer`` runs: reader, ledger, cuts, releases, event bridge
input), :class:`RecordingBackend` around the backend as the island wraps it, a
:class:`FileSampleBuffer` on a dir store written by a sampler's own buffer object, the
:class:`BatchLedger` and :class:`CutStore`. The backend is ``FakeBackend`` with model
facts (vocabulary, two MoE layers, top-2 of four experts, routing rows required): like
the torch and Miles backends it raises in ``train_round`` on a sample its model cannot
take, so a malformed group that reached training would fail the incarnation.

Samplers append random streams: whole groups, out-of-vocabulary tokens, malformed
routing rows (another layer count, an expert id past the model's, pads mixed with ids,
no rows), too-small groups, non-finite rewards, and groups too old to train; the trainer
trains rounds, stops with a cut and restarts from it, or restarts from the base. After
every step: no incarnation failed, nothing malformed was trained, no position was
trained twice, every committed position was trained or skipped with a reason its kind
allows, and the ledger checks. A run of malformed groups stays below
``max_unconvertible_takes`` (the reader's default 3) so that no systematic cause is
simulated; that one fails the round by design (tests/core/test_malformed_groups.py).

``YETO_FUZZ_EXAMPLES`` sets the runs (default 40), ``YETO_FUZZ_STEPS`` the steps per run,
``YETO_FUZZ_RANDOM=1`` random seeds (``make fuzz``).
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

import attrs
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from yeto_core.buffer.ledger import BatchLedger
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.config.load import parse_config
from yeto_core.islands.trainer import RecordingBackend, trainer_driver
from yeto_core.records import ModelFacts, Sample, SampleGroup, StopReason
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend

G = 2
VOCAB = 40
LAYERS, TOP_K, EXPERTS = 2, 2, 4
MAX_AGE = 2
GROUPS_PER_ROUND = 2
#: the reader's default ``max_unconvertible_takes``: runs of malformed groups stay below it
MAX_BAD_RUN = 2
FACTS = ModelFacts(
    vocab_size=VOCAB,
    moe_layers=LAYERS,
    top_k=TOP_K,
    num_experts=EXPERTS,
    routed_experts_required=True,
)
EXAMPLES = int(os.environ.get("YETO_FUZZ_EXAMPLES", "40"))
STEPS = int(os.environ.get("YETO_FUZZ_STEPS", "25"))

MALFORMED = ("oov", "r3_layers", "r3_expert", "r3_pads", "r3_missing")
#: what each kind of group may become: trained (None) or skipped with one of these reasons
ALLOWED: dict[str, set[Optional[str]]] = {
    "whole": {None, "stale"},
    "too_small": {"too_small", "stale"},
    "nonfinite": {"nonfinite_reward", "stale"},
    "old": {"stale"},
    **{k: {"unconvertible", "stale"} for k in MALFORMED},
}
KINDS = tuple(ALLOWED)
#: (kind, fate) pairs the runs reached (the test asserts every malformed kind was left out)
COVER: collections.Counter[tuple[str, Optional[str]]] = collections.Counter()


class _Plugins:
    """What ``trainer_driver`` asks of the plugin manager: the release codec (none)."""

    def release_codec(self) -> Any:
        return None


def _rows(n_tokens: int, rng: np.random.Generator, layers: int = LAYERS) -> np.ndarray:
    """Distinct top-2 expert ids per token and layer (what a router writes)."""
    first = rng.integers(0, EXPERTS, (n_tokens - 1, layers, 1))
    second = (first + rng.integers(1, EXPERTS, (n_tokens - 1, layers, 1))) % EXPERTS
    return np.concatenate([first, second], axis=-1).astype(np.int32)


def make_group(kind: str, gid: str, version: int, seed: int) -> SampleGroup:
    rng = np.random.default_rng(seed)
    n = G - 1 if kind == "too_small" else G
    v = max(0, version - MAX_AGE - 1) if kind == "old" else version
    samples = []
    for _ in range(n):
        resp = int(rng.integers(1, 4))
        tokens = rng.integers(0, VOCAB, 2 + resp).astype(np.int32)
        layers = LAYERS + 1 if kind == "r3_layers" else LAYERS  # the whole group's rows
        samples.append(
            Sample(
                tokens=tokens,
                prompt_len=2,
                logprobs=np.full(resp, -0.5, dtype=np.float32),
                loss_mask=np.ones(resp, dtype=np.uint8),
                reward=float(rng.random()),
                weight_version=v,
                routed_experts=None if kind == "r3_missing" else _rows(len(tokens), rng, layers),
            )
        )
    j = int(rng.integers(0, n))  # the one malformed sample
    s = samples[j]
    if kind == "oov":
        tokens = np.array(s.tokens, copy=True)
        tokens[-1] = VOCAB + int(rng.integers(0, 5))
        samples[j] = attrs.evolve(s, tokens=tokens)
    elif kind in ("r3_expert", "r3_pads"):
        rows = np.array(s.routed_experts, copy=True)
        t, layer = int(rng.integers(0, rows.shape[0])), int(rng.integers(0, LAYERS))
        rows[t, layer, 1] = EXPERTS + 2 if kind == "r3_expert" else -1
        samples[j] = attrs.evolve(s, routed_experts=rows)
    elif kind == "nonfinite":
        samples[j] = attrs.evolve(s, reward=float("nan"))
    return SampleGroup(gid, f"p-{gid}", "sampler-0", 0, tuple(samples))


class IslandTrainerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="yeto-fuzz-island-"))
        self.store = DirStore(self.tmp / "store", fsync=False)
        self.config = parse_config(
            {
                "run_dir": str(self.tmp / "run"),
                "model": {"path": "base"},
                "task": {"name": "t"},
                "samplers": [{"engine": "hf", "group_size": G}],
                "trainer": {
                    "backend": "fake",
                    "groups_per_round": GROUPS_PER_ROUND,
                    "max_policy_age": MAX_AGE,
                },
                "releases": {"deltas": "off"},
            }
        )
        self.sampler = FileSampleBuffer(self.store, host="sampler-0", clock=lambda: 0.0)
        self.kinds: list[str] = []  # by position
        self.bad_run = 0
        self.events: list = []
        self.incarnation = 0
        self.driver: Any = None
        self.trained: list[int] = []  # every position trained, over incarnations kept

    def teardown(self) -> None:
        if self.driver is not None:
            self.driver._flush_writes()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _new_driver(self) -> Any:
        buffer = FileSampleBuffer(self.store, host="trainer", clock=lambda: 0.0)

        def factory(_incarnation: int) -> RecordingBackend:
            return RecordingBackend(FakeBackend(seed=5, facts=FACTS))

        return trainer_driver(
            _Plugins(),
            self.store,
            self.config,
            buffer,
            factory,
            emit=self.events.append,
            workdir=self.tmp / "work",
            ledger_set_aside_before=None,
        )

    @initialize()
    def start(self) -> None:
        self.driver = self._new_driver()
        self.driver.start(self.incarnation)

    @property
    def version(self) -> int:
        return int(self.driver.counters.policy_version)

    @rule(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
    def append(self, kinds: list[str]) -> None:
        for kind in kinds:
            if kind in MALFORMED and self.bad_run >= MAX_BAD_RUN:
                self._append("whole")  # keep malformed runs below a systematic cause
            self._append(kind)

    def _append(self, kind: str) -> None:
        if kind == "old" and self.version <= MAX_AGE:
            kind = "whole"  # no version is too old yet
        pos = len(self.kinds)
        self.sampler.append(make_group(kind, f"g{pos}", self.version, seed=pos))
        self.kinds.append(kind)
        self.bad_run = self.bad_run + 1 if kind in MALFORMED else 0

    @rule(rounds=st.integers(1, 4))
    def train(self, rounds: int) -> None:
        self.driver.train(rounds)
        # the command's last round is committed on the driver's commit thread after it
        # returns (over the head's turn): the checks below read the store once it landed
        self.driver._flush_writes()

    @rule(reason=st.sampled_from([StopReason.STOPPED, StopReason.PREEMPTED]))
    def stop_and_restart_from_the_cut(self, reason: StopReason) -> None:
        self.driver.drain(reason)
        self.driver.release()
        self.incarnation += 1
        self.driver.start(self.incarnation)

    @rule()
    def a_new_trainer_process_restores_the_newest_cut(self) -> None:
        """The island's process died after its last cut; the next one builds a new driver."""
        self.driver._flush_writes()  # (its last writes landed before it died)
        self.incarnation += 1
        self.driver = self._new_driver()
        self.driver.start(self.incarnation)

    @invariant()
    def no_incarnation_failed(self) -> None:
        failed = [e.data for e in self.events if e.kind == "trainer_failed"]
        assert not failed, failed

    @invariant()
    def every_committed_position_is_trained_once_or_skipped_with_its_kinds_reason(self) -> None:
        if self.driver is None:
            return
        wm = int(self.driver.counters.buffer_watermark)
        ledger = BatchLedger(self.store)
        ledger.check(watermark=wm)
        fate: dict[int, Optional[str]] = {}
        for r in ledger.rounds():
            for p in r.positions:
                assert p not in fate, f"position {p} trained twice"
                fate[p] = None
            for reason, ps in r.skipped.items():
                for p in ps:
                    assert p not in fate, f"position {p} trained or skipped twice"
                    fate[p] = reason
        assert sorted(p for p in fate if p < wm) == list(range(wm)), "a position left out"
        for p, reason in fate.items():
            assert reason in ALLOWED[self.kinds[p]], (p, self.kinds[p], reason)
            COVER[(self.kinds[p], reason)] += 1
        backend = self.driver.backend.backend
        trained = {int(g.split("g", 1)[1]) for g in backend.trained_groups}
        assert not {p for p in trained if self.kinds[p] in MALFORMED}


def test_the_island_trainer_takes_malformed_groups_without_failing() -> None:
    run_state_machine_as_test(
        IslandTrainerMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=os.environ.get("YETO_FUZZ_RANDOM") != "1",
            suppress_health_check=list(HealthCheck),
        ),
    )
    if EXAMPLES >= 10:  # every malformed kind was appended, taken and left out
        missing = [k for k in MALFORMED if not COVER[(k, "unconvertible")]]
        assert not missing, f"no run left out a group of kind {missing}: {dict(COVER)}"
