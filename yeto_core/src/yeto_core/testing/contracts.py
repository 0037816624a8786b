"""The behaviour every implementation of a port must have, as pytest tests (one class per port).

Subclass the contract of your port and provide its fixture (a factory that
builds a fresh implementation); every built-in, every docstring example in
:mod:`yeto_core.ports` and every adapter runs its port's contract::

    from yeto_core.testing.contracts import TrainerSchedulerContract

    class TestMyScheduler(TrainerSchedulerContract):
        @pytest.fixture
        def make_scheduler(self):
            return MyScheduler

Records are drawn with the Hypothesis strategies of
:mod:`yeto_core.testing.strategies`. :data:`CONTRACTS` maps each port to its
contract class (the object store's is
:class:`yeto_core.testing.store_contract.ObjectStoreContract`). This module
imports pytest and hypothesis: only test code imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

from yeto_core import ports
from yeto_core.errors import YetoError
from yeto_core.records import (
    Action,
    Batch,
    BufferRound,
    ConsistentCut,
    Decision,
    GroupEntry,
    LifecycleState,
    ReleaseInfo,
    RoundSpec,
    StopReason,
    Trigger,
)
from yeto_core.testing import strategies as rs
from yeto_core.testing.contract_settings import _SETTINGS
from yeto_core.testing.environment_contract import EnvironmentContract
from yeto_core.testing.sampling_contracts import (
    IDLE_ISLAND,  # noqa: F401 - re-exported
    IslandProviderContract,
    RewardContract,
    SamplerEngineContract,
    TaskContract,
)
from yeto_core.testing.sandbox_contract import SandboxHostContract
from yeto_core.testing.store_contract import ObjectStoreContract
from yeto_core.testing.sync_contract import SyncerContract

S = LifecycleState


# ---------------------------------------------------------------------------------------


class SampleBufferContract:
    """:class:`~yeto_core.ports.DurableSampleBuffer`: positions, rounds, watermark, backlog.

    Fixture ``make_buffer(tmp_path)``: a callable returning a fresh, empty buffer
    for the given directory (each Hypothesis example gets its own directory).
    """

    @pytest.fixture
    def make_buffer(self) -> Callable[[Path], ports.DurableSampleBuffer]:  # pragma: no cover
        raise NotImplementedError("define a `make_buffer` fixture")

    @pytest.fixture
    def fresh(self, make_buffer, tmp_path_factory):
        return lambda: make_buffer(tmp_path_factory.mktemp("buffer"))

    @_SETTINGS
    @given(groups=rs.group_batches(max_size=10))
    def test_positions_are_dense_and_a_repeated_id_keeps_its_position(self, fresh, groups):
        buf = fresh()
        assert isinstance(buf, ports.DurableSampleBuffer)
        positions = [buf.append(g) for g in groups]
        assert positions == list(range(len(groups)))
        for g, p in zip(groups, positions, strict=True):
            assert buf.append(g) == p
        assert buf.watermark == 0
        b = buf.backlog()
        assert (b.groups, b.head_position, b.watermark) == (len(groups), len(groups), 0)
        assert b.samples == sum(len(g.samples) for g in groups)

    @_SETTINGS
    @given(groups=rs.group_batches(min_size=1, max_size=10), spec=rs.round_specs)
    def test_a_round_takes_whole_groups_in_order_and_counts_stale(self, fresh, groups, spec):
        buf = fresh()
        for g in groups:
            buf.append(g)
        rnd = buf.select(spec)
        assert isinstance(rnd, BufferRound) and rnd.start == 0
        assert len(rnd.entries) <= spec.max_groups
        consumed = sorted([e.position for e in rnd.entries + rnd.stale] + list(rnd.duplicates))
        assert consumed == list(range(rnd.start, rnd.end))
        for e in rnd.entries:
            assert isinstance(e, GroupEntry)
            assert spec.current_version - e.min_version <= spec.max_policy_age
            group = buf.load(e)
            assert group.group_id == groups[e.position].group_id
            assert len(group.samples) == e.n_samples
        for e in rnd.stale:
            assert spec.current_version - e.min_version > spec.max_policy_age
        assert buf.watermark == 0  # nothing moves before commit
        assert buf.commit(rnd) == rnd.end == buf.watermark
        assert buf.backlog().groups == len(groups) - rnd.end

    @_SETTINGS
    @given(groups=rs.group_batches(min_size=2, max_size=8))
    def test_a_stale_round_is_refused_and_reset_to_reoffers(self, fresh, groups):
        buf = fresh()
        for g in groups:
            buf.append(g)
        spec = RoundSpec(max_groups=1, current_version=10**6, max_policy_age=10**6)
        first, again = buf.select(spec), buf.select(spec)
        buf.commit(first)
        with pytest.raises(YetoError):
            buf.commit(again)  # selected at a watermark that moved
        buf.reset_to(0)
        assert buf.watermark == 0
        assert buf.select(spec).positions == first.positions

    @_SETTINGS
    @given(groups=rs.group_batches(max_size=6))
    def test_arrivals_data_end_and_entries(self, fresh, groups):
        buf = fresh()
        seen: list[GroupEntry] = []
        assert buf.poll_arrivals(seen.append) == 0
        for g in groups:
            buf.append(g)
        assert buf.poll_arrivals(seen.append) == len(groups)
        assert [e.group_id for e in seen] == [g.group_id for g in groups]
        assert buf.poll_arrivals(seen.append) == 0
        assert not buf.data_ended()
        buf.mark_data_end()
        assert buf.data_ended() and buf.backlog().data_ended
        if type(buf).implements("entries"):
            assert [e.position for e in buf.entries()] == list(range(len(groups)))
        buf.close()


# ---------------------------------------------------------------------------------------


class TrainerLifecycleContract:
    """:class:`~yeto_core.ports.TrainerLifecycle`: JOIN → rounds → drain → LEAVE → release.

    Fixture ``make_lifecycle(tmp_path)``: a fresh, STOPPED lifecycle whose trainer
    can start (its buffer may be empty).
    """

    @pytest.fixture
    def make_lifecycle(self) -> Callable[[Path], ports.TrainerLifecycle]:  # pragma: no cover
        raise NotImplementedError("define a `make_lifecycle` fixture")

    def _ready(self, lc: ports.TrainerLifecycle, incarnation: int) -> None:
        lc.start(incarnation)
        state = lc.state()
        if state == S.STARTING:
            state = lc.wait_ready()
        assert state == S.READY, state

    @pytest.mark.parametrize("reason", list(StopReason))
    def test_start_train_drain_release(self, make_lifecycle, tmp_path, reason):
        lc = make_lifecycle(tmp_path)
        assert isinstance(lc, ports.TrainerLifecycle)
        assert lc.state() == S.STOPPED
        self._ready(lc, 0)
        trained = lc.train(2)
        assert isinstance(trained, int) and 0 <= trained <= 2
        assert lc.state() == S.READY
        cut = lc.drain(reason)
        assert isinstance(cut, ConsistentCut)
        assert cut.trigger == reason.trigger and cut.incarnation == 0
        assert lc.state() == S.LEFT
        assert isinstance(dict(lc.report()), dict)
        lc.release()
        assert lc.state() == S.STOPPED

    def test_illegal_transitions_raise_and_a_second_incarnation_starts(
        self, make_lifecycle, tmp_path
    ):
        lc = make_lifecycle(tmp_path)
        with pytest.raises(YetoError):
            lc.drain(StopReason.STOPPED)  # nothing to drain
        with pytest.raises(YetoError):
            lc.train(1)
        self._ready(lc, 0)
        lc.drain(StopReason.STOPPED)
        lc.release()
        self._ready(lc, 1)
        assert lc.drain(StopReason.FINISHED).incarnation == 1
        lc.release()
        assert lc.release_orphan("no-such-handle") in (True, False)


# ---------------------------------------------------------------------------------------


class TrainerSchedulerContract:
    """:class:`~yeto_core.ports.TrainerScheduler`: a pure rule with the shared FINISH rules.

    Fixture ``make_scheduler()``: a fresh scheduler.
    """

    @pytest.fixture
    def make_scheduler(self) -> Callable[[], ports.TrainerScheduler]:  # pragma: no cover
        raise NotImplementedError("define a `make_scheduler` fixture")

    @_SETTINGS
    @given(inputs=rs.scheduler_inputs())
    def test_decisions_are_records_of_their_inputs_and_pure(self, make_scheduler, inputs):
        sched = make_scheduler()
        d = sched.decide(inputs)
        assert isinstance(d, Decision) and isinstance(d.action, Action)
        assert d.inputs == inputs and isinstance(d.reason, str) and d.reason
        again = make_scheduler().decide(inputs)
        assert (again.action, again.reason) == (d.action, d.reason)
        if d.action == Action.START:
            assert inputs.state == S.STOPPED
        if d.action == Action.STOP:
            assert inputs.state == S.READY

    @_SETTINGS
    @given(inputs=rs.scheduler_inputs())
    def test_it_gives_up_and_finishes_at_the_data_end(self, make_scheduler, inputs):
        import attrs

        sched = make_scheduler()
        gave_up = attrs.evolve(inputs, failures=inputs.max_failures)
        assert sched.decide(gave_up).action == Action.FINISH
        done = attrs.evolve(inputs, failures=0, data_ended=True, backlog_groups=0)
        assert sched.decide(done).action == Action.FINISH


# ---------------------------------------------------------------------------------------


class ConversionContract:
    """:class:`~yeto_core.ports.ConversionPort`: a capacity, and refusals for unknown nodes.

    Fixture ``make_conversion()``: a fresh conversion.
    """

    @pytest.fixture
    def make_conversion(self) -> Callable[[], ports.ConversionPort]:  # pragma: no cover
        raise NotImplementedError("define a `make_conversion` fixture")

    def test_capacity_and_unknown_nodes(self, make_conversion):
        conv = make_conversion()
        n = conv.capacity()
        assert isinstance(n, int) and n >= 0
        with pytest.raises(YetoError):
            conv.to_trainer("no-such-node-in-any-pool")
        with pytest.raises(YetoError):
            conv.to_sampler("no-such-node-in-any-pool")
        assert conv.capacity() == n


# ---------------------------------------------------------------------------------------


def contract_batch(version: int = 0, *, seed: int = 0, groups: int = 2, g: int = 2) -> Batch:
    """A small batch of whole groups (token ids below 10) for backend contracts."""
    rng = np.random.default_rng(seed)
    from yeto_core.records import Sample, SampleGroup

    out = []
    for gi in range(groups):
        samples = []
        for _ in range(g):
            tokens = rng.integers(3, 10, size=6)
            samples.append(
                Sample(
                    tokens=tokens.astype(np.int64),
                    prompt_len=3,
                    logprobs=np.full(3, -1.0, dtype=np.float32),
                    loss_mask=np.ones(3, dtype=np.float32),
                    reward=float(rng.random()),
                    weight_version=version,
                )
            )
        out.append(
            SampleGroup(
                group_id=f"c{seed}-{gi}",
                prompt_id=f"p{gi}",
                sampler_host="contract",
                sampler_incarnation=0,
                samples=tuple(samples),
            )
        )
    return Batch(groups=tuple(out), positions=tuple(range(groups)), policy_version=version)


class TrainerBackendContract:
    """:class:`~yeto_core.ports.TrainerBackend`: rounds, files in, files out, a bitwise resume.

    Fixture ``make_backend()``: a fresh backend (the same options each call).
    Override ``batch(i)`` when the backend needs other token ids.
    """

    @pytest.fixture
    def make_backend(self) -> Callable[[], ports.TrainerBackend]:  # pragma: no cover
        raise NotImplementedError("define a `make_backend` fixture")

    def batch(self, i: int) -> Batch:
        return contract_batch(i, seed=i)

    def test_a_round_returns_metrics_and_a_release_describes_its_files(
        self, make_backend, tmp_path
    ):
        b = make_backend()
        b.restore(None)
        metrics = b.train_round(self.batch(0))
        assert isinstance(metrics, Mapping)
        assert all(isinstance(k, str) and math.isfinite(float(v)) for k, v in metrics.items())
        out = tmp_path / "release"
        out.mkdir()
        info = ReleaseInfo.coerce(b.publish_release(out))
        assert info.kind in ("full", "lora") and info.weight_checksum
        assert any(p.is_file() for p in out.rglob("*"))
        cut = tmp_path / "cut"
        cut.mkdir()
        b.save_cut(cut, Trigger.MANUAL)
        assert any(p.is_file() for p in cut.rglob("*"))

    def test_its_model_facts_build_a_reader_that_takes_its_batches(self, make_backend):
        """After :meth:`restore`, :meth:`model_facts` are facts the batch reader accepts,
        and a group this backend trains passes the reader's checks under them."""
        from yeto_core.buffer.reader_batches import check_group
        from yeto_core.records import ModelFacts

        b = make_backend()
        b.restore(None)
        facts = b.model_facts()
        assert isinstance(facts, ModelFacts)
        options = facts.reader_options()
        for g in self.batch(0).groups:
            assert check_group(g, group_size=len(g.samples), **options) is None

    def test_a_restored_cut_continues_bitwise(self, make_backend, tmp_path):
        a = make_backend()
        a.restore(None)
        a.train_round(self.batch(0))
        cut = tmp_path / "cut"
        cut.mkdir()
        a.save_cut(cut, Trigger.SCHEDULED)
        a.train_round(self.batch(1))
        (tmp_path / "ra").mkdir()
        ref = ReleaseInfo.coerce(a.publish_release(tmp_path / "ra"))
        b = make_backend()
        b.restore(cut)
        b.train_round(self.batch(1))
        (tmp_path / "rb").mkdir()
        got = ReleaseInfo.coerce(b.publish_release(tmp_path / "rb"))
        assert got.weight_checksum == ref.weight_checksum

    def test_a_release_writer_writes_what_publish_release_wrote_then(self, make_backend, tmp_path):
        b = make_backend()
        b.restore(None)
        b.train_round(self.batch(0))
        writer = b.release_writer()
        if writer is None:
            pytest.skip("this backend writes its releases in publish_release only")
        now = tmp_path / "now"
        now.mkdir()
        ref = ReleaseInfo.coerce(b.publish_release(now)).as_dict()
        b.train_round(self.batch(1))  # the weights change after the copy was taken
        after = tmp_path / "after"
        after.mkdir()
        changed = ReleaseInfo.coerce(b.publish_release(after))
        assert changed.weight_checksum != ref["weight_checksum"], "the round changed nothing"
        later = tmp_path / "later"
        later.mkdir()
        got = ReleaseInfo.coerce(writer(later)).as_dict()
        assert got == ref
        names = sorted(p.relative_to(now).as_posix() for p in now.rglob("*") if p.is_file())
        assert names == sorted(
            p.relative_to(later).as_posix() for p in later.rglob("*") if p.is_file()
        )
        for name in names:
            assert (later / name).read_bytes() == (now / name).read_bytes(), name

    def test_parameters_hand_over_the_weights_a_release_holds(self, make_backend, tmp_path):
        """With ``parameters`` / ``load_parameters`` (``[trainer] islands > 1``): numpy
        arrays by name; loading earlier parameters brings back the release of then."""
        b = make_backend()
        if not b.implements("parameters"):
            pytest.skip("this backend cannot train as one of several trainer islands")
        import numpy as np

        b.restore(None)
        b.train_round(self.batch(0))
        then = b.parameters()
        assert then and all(isinstance(v, np.ndarray) for v in then.values())
        (tmp_path / "then").mkdir()
        ref = ReleaseInfo.coerce(b.publish_release(tmp_path / "then")).weight_checksum
        b.train_round(self.batch(1))
        (tmp_path / "moved").mkdir()
        moved = ReleaseInfo.coerce(b.publish_release(tmp_path / "moved")).weight_checksum
        assert moved != ref, "the round changed nothing"
        b.load_parameters(then)
        again = b.parameters()
        assert sorted(again) == sorted(then)
        assert all(again[k].tobytes() == then[k].tobytes() for k in then)
        (tmp_path / "again").mkdir()
        assert ReleaseInfo.coerce(b.publish_release(tmp_path / "again")).weight_checksum == ref


#: The contract class of every port.
CONTRACTS: dict[type[ports.Port], type] = {
    ports.ObjectStore: ObjectStoreContract,
    ports.DurableSampleBuffer: SampleBufferContract,
    ports.TrainerLifecycle: TrainerLifecycleContract,
    ports.TrainerScheduler: TrainerSchedulerContract,
    ports.ConversionPort: ConversionContract,
    ports.TrainerBackend: TrainerBackendContract,
    ports.SamplerEngine: SamplerEngineContract,
    ports.IslandProvider: IslandProviderContract,
    ports.Task: TaskContract,
    ports.Reward: RewardContract,
    ports.Syncer: SyncerContract,
    ports.Environment: EnvironmentContract,
    ports.SandboxHost: SandboxHostContract,
}

__all__ = [
    "CONTRACTS",
    "ConversionContract",
    "EnvironmentContract",
    "IslandProviderContract",
    "ObjectStoreContract",
    "RewardContract",
    "SampleBufferContract",
    "SamplerEngineContract",
    "SyncerContract",
    "TaskContract",
    "TrainerBackendContract",
    "TrainerLifecycleContract",
    "TrainerSchedulerContract",
    "contract_batch",
]
