"""Top-K log-probs kept (issue 52): ``[[samplers]] top_logprobs = K`` asks the engine for
them, the sampler loop puts them on every sample, the group codec stores them
(safetensors tensors; payloads without them still read), and the trainer's reader hands
them to the backend in the batch's samples."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import pytest

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.group_codec import decode_group, encode_group
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.config.load import parse_config
from yeto_core.errors import ConfigError, SampleBufferError
from yeto_core.records import Completion, Sample, SampleGroup, SamplingParams
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fakes import DigitsTask, WeightFileEngine

K = 3


def _sample(resp: int, *, top: bool, seed: int = 0) -> Sample:
    rng = np.random.default_rng(seed)
    lps = -np.sort(rng.random((resp, K)).astype(np.float32), axis=-1)
    return Sample(
        tokens=np.arange(2 + resp, dtype=np.int32),
        prompt_len=2,
        logprobs=lps[:, 0].copy(),
        loss_mask=np.ones(resp, dtype=np.uint8),
        reward=1.0,
        weight_version=0,
        top_logprobs=lps if top else None,
        top_token_ids=rng.integers(0, 100, (resp, K)).astype(np.int32) if top else None,
    )


def test_the_codec_keeps_top_logprobs_per_sample() -> None:
    group = SampleGroup(
        "g",
        "p",
        "h",
        0,
        (_sample(3, top=True, seed=1), _sample(0, top=True), _sample(2, top=False)),
    )
    back = decode_group(encode_group(group))
    for want, got in zip(group.samples, back.samples, strict=True):
        if want.top_logprobs is None:
            assert got.top_logprobs is None and got.top_token_ids is None
            continue
        assert got.top_logprobs.dtype == np.float32 and got.top_token_ids.dtype == np.int32
        np.testing.assert_array_equal(got.top_logprobs, want.top_logprobs)
        np.testing.assert_array_equal(got.top_token_ids, want.top_token_ids)
    # the same group twice: the same bytes (a re-append names the same payload)
    assert encode_group(group) == encode_group(group)


def test_a_payload_without_them_reads_as_before() -> None:
    plain = SampleGroup("g", "p", "h", 0, (_sample(3, top=False), _sample(1, top=False)))
    data = encode_group(plain)
    assert b"top_logprobs" not in data
    assert all(s.top_logprobs is None for s in decode_group(data).samples)


def test_top_logprobs_of_another_shape_are_refused_at_append() -> None:
    s = _sample(3, top=True)
    bad = attrs.evolve(s, top_logprobs=s.top_logprobs[:2])
    with pytest.raises(SampleBufferError, match=r"sample 0: top_logprobs \(2, 3\)"):
        encode_group(SampleGroup("g", "p", "h", 0, (bad,)))
    other_k = attrs.evolve(
        s, top_logprobs=s.top_logprobs[:, :2], top_token_ids=s.top_token_ids[:, :2]
    )
    with pytest.raises(SampleBufferError, match="one K per group"):
        encode_group(SampleGroup("g", "p", "h", 0, (s, other_k)))


def _config(**sampler):
    return parse_config(
        {
            "run_dir": "runs/x",
            "model": {"path": "base"},
            "task": {"name": "t"},
            "samplers": [{"engine": "hf", **sampler}],
            "trainer": {"backend": "torch"},
        }
    )


def test_the_samplers_key_asks_the_engine() -> None:
    assert _config(top_logprobs=K).samplers[0].engine_sampling().top_logprobs == K
    assert _config().samplers[0].engine_sampling().top_logprobs == 0
    with pytest.raises(ConfigError, match=r"samplers\[0\].top_logprobs"):
        _config(top_logprobs=-1)
    with pytest.raises(ConfigError, match=r"set it as samplers\[0\].top_logprobs"):
        _config(sampling={"top_logprobs": 2})


class TopEngine(WeightFileEngine):
    """One-token completions with their top-K log-probs when asked."""

    PLUGIN_NAME = "top"

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams
    ) -> list[list[Completion]]:
        out = super().generate(prompts, n, sampling)
        k = sampling.top_logprobs
        if not k:
            return out
        return [
            [
                attrs.evolve(
                    c,
                    top_logprobs=np.array([[-0.5, -1.5, -2.5][:k]], dtype=np.float32),
                    top_token_ids=np.array([[int(c.tokens[0]), 7, 9][:k]], dtype=np.int32),
                )
                for c in group
            ]
            for group in out
        ]


def _loop(tmp_path: Path, engine, sampling: SamplingParams) -> tuple[FileSampleBuffer, SamplerLoop]:
    store = DirStore(tmp_path / "store", fsync=False)
    buf = FileSampleBuffer(store, host="h", clock=lambda: 0.0)
    loop = SamplerLoop(
        buf,
        engine,
        DigitsTask(),
        None,
        host="h",
        incarnation=0,
        group_size=2,
        prompts_per_call=2,
        sampling=sampling,
        seed=1,
        stop=threading.Event(),
    )
    return buf, loop


def test_the_trainer_reads_the_top_logprobs_the_engine_returned(tmp_path: Path) -> None:
    buf, loop = _loop(tmp_path, TopEngine(), SamplingParams(top_logprobs=K))
    loop.run(max_rounds=1)
    loop.flush()
    reader = BatchReader(buf, group_size=2, groups_per_round=2, max_policy_age=4, vocab_size=128)
    batch = reader.take(0, short_ok=True)
    samples = [s for g in batch.groups for s in g.samples]
    assert len(samples) == 4
    for s in samples:
        np.testing.assert_array_equal(s.top_logprobs, [[-0.5, -1.5, -2.5]])
        assert s.top_token_ids.tolist() == [[int(s.tokens[-1]), 7, 9]]


def test_an_engine_that_returns_none_is_a_clear_error(tmp_path: Path) -> None:
    _, loop = _loop(tmp_path, WeightFileEngine(), SamplingParams(top_logprobs=K))
    with pytest.raises(ConfigError, match="top_logprobs = 3, but the WeightFileEngine engine"):
        loop.run(max_rounds=1)


def test_top_logprobs_next_to_routed_experts_keep_both() -> None:
    samples = []
    for i, resp in enumerate((3, 1)):
        s = _sample(resp, top=True, seed=i)
        rows = np.arange(len(s.tokens) - 1).repeat(2 * 4).reshape(-1, 2, 4).astype(np.int32)
        samples.append(attrs.evolve(s, routed_experts=rows))
    back = decode_group(encode_group(SampleGroup("g", "p", "h", 0, tuple(samples))))
    for want, got in zip(samples, back.samples, strict=True):
        np.testing.assert_array_equal(got.routed_experts, want.routed_experts)
        np.testing.assert_array_equal(got.top_logprobs, want.top_logprobs)
        np.testing.assert_array_equal(got.top_token_ids, want.top_token_ids)
