"""The smallest sampler engine, trainer backend and task that pass preflight, and a
registry holding them: for tests of preflight and the CLI that need a config to pass
without running anything (``minimal_plugins()``).
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from yeto_core import hookimpl
from yeto_core.plugins import Plugins
from yeto_core.ports import SamplerEngine, Task, TrainerBackend


class MinimalEngine(SamplerEngine):
    PLUGIN_NAME = "fake-engine"

    def generate(self, prompts, n, sampling):
        return []

    def load_release(self, release):
        pass

    def served_checksum(self):
        return "0"

    def encode(self, text):
        return []

    def decode(self, ids):
        return ""


class MinimalBackend(TrainerBackend):
    PLUGIN_NAME = "fake-backend"

    @classmethod
    def prepare_base(cls, options, model_dir):
        Path(model_dir).mkdir(parents=True)

    def restore(self, cut_dir):
        pass

    def train_round(self, batch):
        return {}

    def save_cut(self, out_dir, trigger):
        pass

    def publish_release(self, out_dir):
        return {}


class MinimalTask(Task):
    PLUGIN_NAME = "fake-task"

    def prompt(self, index):
        return "", ""

    def reward(self, answer, completion):
        return 0.0


def minimal_plugins(*extra: Any) -> Plugins:
    """A registry without entry points: the built-ins, the three classes above (as plugin
    ``fakes``) and each of ``extra`` (as ``extra0``, ``extra1``, ...)."""
    pm = Plugins(entry_points=False)
    pm.add(
        types.SimpleNamespace(
            yeto_register_sampler_engines=hookimpl(lambda register: register(MinimalEngine)),
            yeto_register_trainer_backends=hookimpl(lambda register: register(MinimalBackend)),
            yeto_register_tasks=hookimpl(lambda register: register(MinimalTask)),
        ),
        "fakes",
    )
    for i, p in enumerate(extra):
        pm.add(p, f"extra{i}")
    return pm
