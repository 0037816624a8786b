"""The body of every yeto island function on Modal: the island's identity as its argument (the
store's credentials in its Secret); it reloads model-file mounts, then runs the entry module."""

from __future__ import annotations

import json
import os
import runpy
from collections.abc import Mapping

#: JSON ``{mount path: volume name}`` of the volumes the function mounts.
ENV_MOUNTS = "YETO_MODAL_MOUNTS"
#: The module the body runs as ``__main__`` (``IslandLaunch.entry_module``).
ENV_ENTRY = "YETO_MODAL_ENTRY"


def island(env: Mapping[str, str]) -> int:
    """Run the yeto island that ``env`` names; return its exit code."""
    import modal

    os.environ.update({str(k): str(v) for k, v in env.items()})
    if not modal.is_local():  # inside a Modal container (not through .local())
        from yeto_modal.volume import VolumeSeam, reload_mount

        for name in json.loads(os.environ.get(ENV_MOUNTS) or "{}").values():
            reload_mount(VolumeSeam(name, os.environ.get("MODAL_ENVIRONMENT")))
    try:
        runpy.run_module(os.environ.get(ENV_ENTRY) or "yeto_core.islands.main", run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
