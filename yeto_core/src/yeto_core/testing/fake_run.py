"""A whole run with fake parts, for head tests: fake samplers, the real trainer island
with the fake backend, the ``local`` provider, a ``dir`` store (no engine, no torch)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

from yeto_core.config.load import RunConfig, parse_config
from yeto_core.providers.local import LocalIslands
from yeto_core.testing.fake_island import plugins_with_fakes

#: The argv of a fake island (``LocalIslands(command=...)``).
FAKE_ISLAND_COMMAND = [sys.executable, "-m", "yeto_core.testing.fake_island"]


def fake_run_config(
    tmp_path: Path,
    *,
    total_rounds: int = 6,
    wall_clock_s: float = 120.0,
    name: str = "headtest",
    **top: Any,
) -> RunConfig:
    """Two fake sampler islands (G=4), the fake backend, S1 with a fixed ``T_s`` of 1 s."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    return parse_config(
        {
            "name": name,
            "run_dir": str(tmp_path / "run"),
            "model": {"path": str(tmp_path / "model")},
            "task": {"name": "none"},
            "samplers": [
                {
                    "engine": "none",
                    "count": 2,
                    "group_size": 4,
                    "min_round_s": 0.05,
                    "backlog_cap": 6,
                    "price_per_hour": 36.0,
                }
            ],
            "trainer": {
                "backend": "fake",
                "groups_per_round": 2,
                "max_policy_age": 100,
                "total_rounds": total_rounds,
                "price_per_hour": 72.0,
            },
            "scheduler": {
                "name": "s1",
                "tick_s": 0.05,
                "options": {"alpha": 1.0, "round_s": 1.0, "start_seconds_fixed": 1.0},
            },
            "backstops": {"budget_usd": 100.0, "wall_clock_s": wall_clock_s},
            **top,
        },
        source="test",
    )


def fake_head(config: RunConfig, plugins: Optional[Any] = None, **head_options: Any) -> Any:
    """A :class:`~yeto_core.head.run.Head` whose islands are fake island processes."""
    from yeto_core.head.run import Head

    provider = LocalIslands(config.run_dir, command=FAKE_ISLAND_COMMAND, term_timeout_s=5.0)
    if plugins is None:
        plugins = plugins_with_fakes(entry_points=False)
    return Head(config, plugins, provider=provider, **head_options)
