"""The contracts of the sampling side's ports: :class:`SamplerEngineContract`,
:class:`IslandProviderContract` and :class:`TaskContract` (see
:mod:`yeto_core.testing.contracts`, which re-exports them and maps every port to
its contract). This module imports pytest and hypothesis: only test code imports it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from yeto_core import ports
from yeto_core.providers.env import island_launch
from yeto_core.records import Completion, IslandStatus, LocalRelease, Prompt, SamplingParams
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing import strategies as rs
from yeto_core.testing.contract_settings import _SETTINGS


class SamplerEngineContract:
    """:class:`~yeto_core.ports.SamplerEngine`: shapes, versions, a verified hot reload.

    Fixtures ``make_engine()`` (a fresh engine serving the base) and
    ``make_release(tmp_path, version)`` (a :class:`~yeto_core.records.LocalRelease`
    the engine can load: a directory of release files and its ``weight_checksum``).
    """

    @pytest.fixture
    def make_engine(self) -> Callable[[], ports.SamplerEngine]:  # pragma: no cover
        raise NotImplementedError("define a `make_engine` fixture")

    @pytest.fixture
    def make_release(self) -> Callable[[Path, int], LocalRelease]:  # pragma: no cover
        raise NotImplementedError("define a `make_release` fixture")

    @pytest.fixture
    def engine(self, make_engine):
        e = make_engine()
        yield e
        e.close()

    @_SETTINGS
    @given(
        texts=st.lists(st.sampled_from(["1", "12", "3 4", "x"]), min_size=1, max_size=3),
        n=st.integers(1, 3),
        sampling=rs.sampling_params,
    )
    def test_generate_answers_every_prompt_n_times(self, engine, texts, n, sampling):
        prompts = [engine.encode(t) for t in texts]
        assert all(isinstance(i, int) for p in prompts for i in p)
        out = engine.generate(prompts, n, sampling)
        assert len(out) == len(prompts)
        for group in out:
            assert len(group) == n
            for c in group:
                assert isinstance(c, Completion)
                assert len(c.tokens) == len(c.logprobs) >= 1
                assert np.all(np.asarray(c.logprobs) <= 1e-4)
                assert isinstance(engine.decode(c.tokens), str)

    def test_a_loaded_release_is_served_and_stamped(self, engine, make_release, tmp_path):
        # None: the engine cannot read its weights back; it must score prompts instead
        # (the policy fingerprint, yeto_core.sampler.fingerprint).
        before = engine.served_checksum()
        assert before is None or (isinstance(before, str) and before)
        probe = [engine.encode("12")[:2] + [0, 1, 2]]
        scored_before = engine.prompt_logprobs(probe)
        if before is None:
            assert scored_before is not None and len(scored_before[0]) == len(probe[0]) - 1
        release = make_release(tmp_path, 1)
        engine.load_release(release)
        if before is not None:
            assert engine.served_checksum() == release.weight_checksum
        else:
            assert engine.prompt_logprobs(probe) != scored_before  # the release is served
        prompt = engine.encode("1")
        (c,) = engine.generate([prompt], 1, SamplingParams(max_new_tokens=2, seed=0))[0]
        assert c.weight_version == 1
        if type(engine).implements("rollback"):
            engine.rollback()
            assert engine.served_checksum() == before
            if scored_before is not None:
                back = engine.prompt_logprobs(probe)
                assert (
                    max(abs(a - b) for a, b in zip(back[0], scored_before[0], strict=True)) < 1e-3
                )


# ---------------------------------------------------------------------------------------


#: The island the provider contract launches: it idles until SIGTERM.
IDLE_ISLAND = "yeto_core.testing.idle_island"


class IslandProviderContract:
    """:class:`~yeto_core.ports.IslandProvider`: launch, status, verified release, orphans.

    Fixture ``make_provider(state_dir)``: a provider keeping its files in
    ``state_dir`` (two providers on one state dir are a head and its successor).
    The launched island runs ``python -m yeto_core.testing.idle_island``.
    """

    @pytest.fixture
    def make_provider(self) -> Callable[[Path], ports.IslandProvider]:  # pragma: no cover
        raise NotImplementedError("define a `make_provider` fixture")

    def _launch(self, tmp_path: Path, island: str, incarnation: int = 0):
        store = DirStore(tmp_path / "store", fsync=False)
        launch = island_launch(
            store, run_id="contract", role="sampler", island=island, incarnation=incarnation
        )
        import attrs

        return attrs.evolve(launch, entry_module=IDLE_ISLAND)

    def _wait(self, pred: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def test_launch_status_release(self, make_provider, tmp_path):
        provider = make_provider(tmp_path / "state")
        launch = self._launch(tmp_path, "sampler-0")
        handle = provider.launch(launch)
        assert isinstance(handle, str) and handle
        self._wait(lambda: provider.status(handle) == IslandStatus.RUNNING, "the island to run")
        assert provider.orphans() == []
        list(provider.events(handle))
        assert provider.release(handle) is True
        assert provider.status(handle) == IslandStatus.GONE
        assert provider.release(handle) is True  # idempotent

    def test_a_successor_finds_and_releases_orphans(self, make_provider, tmp_path):
        first = make_provider(tmp_path / "state")
        handle = first.launch(self._launch(tmp_path, "trainer", 3))
        self._wait(lambda: first.status(handle) == IslandStatus.RUNNING, "the island to run")
        second = make_provider(tmp_path / "state")
        assert handle in second.orphans()
        assert second.release(handle) is True
        assert second.status(handle) == IslandStatus.GONE
        self._wait(  # to the first provider its island vanished: gone, exited or lost
            lambda: (
                first.status(handle) in (IslandStatus.GONE, IslandStatus.EXITED, IslandStatus.LOST)
            ),
            "the first provider to see it gone",
        )


# ---------------------------------------------------------------------------------------


class TaskContract:
    """:class:`~yeto_core.ports.Task`: deterministic prompts, rewards in [0, 1].

    Fixture ``make_task()``: a fresh task.
    """

    @pytest.fixture
    def make_task(self) -> Callable[[], ports.Task]:  # pragma: no cover
        raise NotImplementedError("define a `make_task` fixture")

    @_SETTINGS
    @given(index=st.integers(0, 2**40), completion=rs.texts)
    def test_prompts_are_deterministic_and_rewards_bounded(self, make_task, index, completion):
        task = make_task()
        prompt = Prompt.of(task.prompt(index))  # a (text, answer) pair or a Prompt
        assert isinstance(prompt.answer, str)
        assert Prompt.of(make_task().prompt(index)) == prompt
        r = task.reward(prompt.answer, completion)
        assert 0.0 <= float(r) <= 1.0
        assert 0.0 <= float(task.reward(prompt.answer, prompt.answer)) <= 1.0
        assert 0.0 <= float(task.score(prompt, completion)) <= 1.0
        if task.rows:  # a finite task: prompt_at(row, epoch) is prompt(epoch * rows + row)
            row, epoch = index % task.rows, index // task.rows
            assert task.prompt_at(row, epoch) == prompt


class RewardContract:
    """:class:`~yeto_core.ports.Reward`: a deterministic, finite score in [0, 1] for any text.

    Fixture ``make_reward()``: a fresh reward.
    """

    @pytest.fixture
    def make_reward(self) -> Callable[[], ports.Reward]:  # pragma: no cover
        raise NotImplementedError("define a `make_reward` fixture")

    @_SETTINGS
    @given(answer=rs.texts, completion=rs.texts)
    def test_scores_are_deterministic_finite_and_bounded(self, make_reward, answer, completion):
        reward = make_reward()
        assert isinstance(reward, ports.Reward) and reward.PLUGIN_NAME
        prompt = Prompt(text="q", answer=answer, row_id="1", metadata={"answer": answer})
        r = float(reward.score(prompt, completion, prompt.metadata))
        assert math.isfinite(r) and 0.0 <= r <= 1.0
        assert float(make_reward().score(prompt, completion, prompt.metadata)) == r
