"""Entry point of yeto-torch (group ``yeto``, name ``torch``).

Registers the ``torch`` trainer backend, the ``hf`` sampler engine and the
built-in tasks (``sort4``, ``add1``, ``add2``). Classes are imported lazily
so ``yeto plugins`` stays fast.
"""

from __future__ import annotations

from yeto_core import hookimpl


@hookimpl
def yeto_register_trainer_backends(register):
    from yeto_torch.backend import TorchBackend

    register(TorchBackend)


@hookimpl
def yeto_register_sampler_engines(register):
    from yeto_torch.engine import HFEngine

    register(HFEngine)


@hookimpl
def yeto_register_tasks(register):
    from yeto_torch.tasks import TASKS

    for cls in TASKS.values():
        register(cls)
