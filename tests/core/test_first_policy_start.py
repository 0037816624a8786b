"""First-policy start for LoRA runs only (issue 52 item 4, the seed's rule).

A LoRA sampler serves no adapter before the first policy release, so the head
starts a trainer while the store has no release (S1 rule ``first_policy``). A
full-parameter sampler serves the base model (policy version 0): its run's first
start waits for a backlog like every other.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from yeto_core.records import Action, Backlog, LifecycleState
from yeto_core.testing.fake_run import fake_head, fake_run_config


def _loop(tmp_path: Path, *, backend_options=None, scheduler_options=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = fake_run_config(tmp_path)
    if backend_options is not None:
        config = attrs.evolve(
            config, trainer=attrs.evolve(config.trainer, backend_options=backend_options)
        )
    if scheduler_options is not None:
        options = dict(config.scheduler.options, **scheduler_options)
        config = attrs.evolve(config, scheduler=attrs.evolve(config.scheduler, options=options))
    head = fake_head(config)
    head.build_trainer_loop()
    return head.trainer_loop


def _first_decision(loop):
    """S1's decision for a stopped trainer, an empty buffer and no release in the store."""
    inputs = loop.inputs(LifecycleState.STOPPED, Backlog(0, 0, 0, 0), 0.0)
    return loop.scheduler.decide(inputs)


def test_a_full_parameter_run_does_not_start_the_trainer_for_a_first_policy(tmp_path):
    loop = _loop(tmp_path)
    assert loop.config.first_policy_start is False
    d = _first_decision(loop)
    assert d.reason != "first_policy" and d.action != Action.START


def test_a_lora_run_starts_the_trainer_for_its_first_policy(tmp_path):
    loop = _loop(tmp_path, backend_options={"tuning": "lora"})
    assert loop.config.first_policy_start is True
    d = _first_decision(loop)
    assert d.action == Action.START and d.reason == "first_policy"


def test_scheduler_options_still_decide_when_given(tmp_path):
    loop = _loop(tmp_path, scheduler_options={"first_policy_start": True})
    assert loop.config.first_policy_start is True
    loop = _loop(tmp_path / "b", backend_options={"tuning": "lora"},
                 scheduler_options={"first_policy_start": False})  # fmt: skip
    assert loop.config.first_policy_start is False
