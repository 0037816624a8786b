"""Node classes in the run config: which sampler groups may convert (docs/conversion.md)."""

from __future__ import annotations

import pytest

from yeto_core.config.load import parse_config
from yeto_core.errors import ConfigError


def _config(samplers: list[dict], conversion: str = "local", **trainer) -> dict:
    return {
        "name": "conv",
        "run_dir": "runs/conv",
        "model": {"path": "m"},
        "task": {"name": "echo"},
        "samplers": samplers,
        "trainer": {"backend": "torch", **trainer},
        "conversion": {"name": conversion},
    }


def _errors(data: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    return str(exc.value)


FIXED = {"name": "fixed", "engine": "hf", "count": 2}


def test_a_convertible_group_next_to_fixed_samplers_is_accepted() -> None:
    c = parse_config(
        _config([FIXED, {"name": "flex", "engine": "hf", "node_class": "convertible"}])
    )
    assert [s.node_class for s in c.samplers] == ["fixed", "convertible"]


def test_a_spot_node_never_converts() -> None:
    msg = _errors(
        _config(
            [FIXED, {"name": "flex", "engine": "hf", "node_class": "convertible", "spot": True}]
        )
    )
    assert "samplers[1].node_class = 'convertible' with spot = true" in msg


def test_a_node_of_another_precision_than_the_trainer_never_converts() -> None:
    flex = {"name": "flex", "engine": "hf", "node_class": "convertible", "precision": "fp8"}
    msg = _errors(_config([FIXED, flex], precision="bf16"))
    assert "samplers[1].precision = 'fp8' differs from trainer.precision = 'bf16'" in msg
    flex["precision"] = "bf16"
    parse_config(_config([FIXED, flex], precision="bf16"))


def test_the_last_node_that_samples_never_converts() -> None:
    msg = _errors(_config([{"name": "flex", "engine": "hf", "node_class": "convertible"}]))
    assert "the last node that samples never converts" in msg


def test_convertible_nodes_need_a_conversion_and_a_remote_trainer() -> None:
    flex = {"name": "flex", "engine": "hf", "node_class": "convertible"}
    assert "conversion.name = 'none'" in _errors(_config([FIXED, flex], conversion="none"))
    assert "needs trainer.lifecycle = 'remote'" in _errors(
        _config([FIXED, flex], lifecycle="driver")
    )
    assert "allowed: fixed, convertible" in _errors(
        _config([FIXED, dict(flex, node_class="flexible")])
    )
