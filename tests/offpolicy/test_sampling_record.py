"""The sampling settings travel with each group (payload metadata), and the torch plugin's
preflight refuses a trainer temperature other than the samplers'."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from yeto_core.buffer.group_codec import decode_group, encode_group
from yeto_core.config.load import parse_config
from yeto_core.config.preflight import Report
from yeto_core.records import Completion, Sample, SampleGroup, SamplingParams
from yeto_core.sampler.loop import SamplerLoop
from yeto_torch import plugin


def _group(sampling):
    s = Sample(
        tokens=np.array([1, 2, 3, 4]),
        prompt_len=2,
        logprobs=np.array([-0.5, -0.25], np.float32),
        loss_mask=np.ones(2, np.float32),
        reward=1.0,
        weight_version=3,
    )
    return SampleGroup("g", "p", "h", 0, (s, s), task="t", sampling=sampling)


def test_the_sampling_record_round_trips_and_old_payloads_have_none():
    sp = SamplingParams(max_new_tokens=9, temperature=0.7, top_k=4, top_p=0.8, seed=5)
    back = decode_group(encode_group(_group(sp)))
    assert back.sampling == SamplingParams(temperature=0.7, top_k=4, top_p=0.8)
    assert decode_group(encode_group(_group(None))).sampling is None


class _Engine:
    def encode(self, text):
        return [1, 2]

    def decode(self, ids):
        return ""

    def generate(self, prompts, n, sampling):
        c = Completion(tokens=np.array([3]), logprobs=np.array([-0.1], np.float32))
        return [[c] * n for _ in prompts]


class _Task:
    PLUGIN_NAME = "t"

    def prompt(self, i):
        return "x", "y"

    def reward(self, answer, completion):
        return 0.0


class _Buffer:
    def __init__(self):
        self.groups = []

    def append(self, g):
        self.groups.append(g)
        return len(self.groups) - 1

    def append_many(self, groups):
        return [self.append(g) for g in groups]


def test_the_sampler_loop_records_its_sampling_with_each_group():
    sp = SamplingParams(max_new_tokens=3, temperature=0.6, top_k=2)
    buf = _Buffer()
    loop = SamplerLoop(
        buf,
        _Engine(),
        _Task(),
        host="h",
        incarnation=0,
        group_size=2,
        prompts_per_call=2,
        sampling=sp,
    )
    loop.run_round()
    assert [g.sampling for g in buf.groups] == [sp, sp]


def _config(tmp_path: Path, trainer_opts: dict, samplers: list[dict]):
    return parse_config(
        {
            "run_dir": str(tmp_path / "run"),
            "model": {"path": str(tmp_path / "base")},
            "task": {"name": "sort4"},
            "samplers": samplers,
            "trainer": {"backend": "torch", "groups_per_round": 2, "backend_options": trainer_opts},
            "backstops": {"wall_clock_s": 60},
        }
    )


def _checks(cfg):
    report = Report()
    plugin.yeto_preflight(config=cfg, report=report)
    return {c.name: c for c in report.checks}


def test_preflight_refuses_a_trainer_temperature_other_than_a_samplers(tmp_path):
    hf = {"engine": "hf", "group_size": 4, "backlog_cap": 8, "sampling": {"temperature": 1.0}}
    cold = dict(hf, name="cold", sampling={"temperature": 0.7})
    name = "trainer.backend_options.temperature"
    bad = _checks(_config(tmp_path, {"temperature": 0.7}, [cold, hf]))[name]
    assert bad.status == "fail" and "samplers[1].sampling.temperature = 1.0" in bad.detail
    assert _checks(_config(tmp_path, {"temperature": 1.0}, [hf]))[name].status == "ok"
    follows = _checks(_config(tmp_path, {}, [cold, hf]))[name]
    assert follows.status == "ok" and "follows the sampling recorded" in follows.detail


def test_preflight_warns_about_processed_sampling_on_other_engines(tmp_path):
    hf = {"engine": "hf", "group_size": 4, "backlog_cap": 8, "sampling": {"top_k": 4}}
    other = dict(hf, name="other", engine="custom")
    checks = _checks(_config(tmp_path, {}, [hf, other]))
    assert "samplers[0].sampling" not in checks
    assert checks["samplers[1].sampling"].status == "warn"
    stated = [dict(hf, name=e, engine=e) for e in ("vllm", "sglang")]
    assert not {"samplers[0].sampling", "samplers[1].sampling"} & set(
        _checks(_config(tmp_path, {}, stated))
    )
