"""The run config the benches generate: one local run with `hf` samplers and the `torch` trainer.

``yeto bench e2e`` and ``yeto bench chaos`` differ only in the values; the
layout of the TOML lives here once.
"""

from __future__ import annotations

import json
from pathlib import Path


def bench_run_toml(
    *,
    comment: str,
    name: str,
    run_dir: Path,
    base_dir: Path,
    task: str,
    seed: int,
    samplers: int,
    prompts_per_call: int,
    min_round_s: float,
    backlog_cap: int,
    max_new_tokens: int,
    lr: float,
    groups_per_round: int,
    max_policy_age: int,
    total_rounds: int,
    scheduler: str,
    tick_s: float,
    wall_clock_s: float,
    silence_s: float,
    sync_rounds: bool | None = None,
    scheduler_options: str = "",
) -> str:
    """The TOML text; ``sync_rounds=None`` leaves the key out, ``scheduler_options`` is a
    TOML inline table body line (``options = {...}``) or empty."""
    sync_line = (
        "" if sync_rounds is None else f"sync_rounds = {'true' if sync_rounds else 'false'}\n"
    )
    options_line = f"{scheduler_options}\n" if scheduler_options else ""
    return f"""# {comment}
name = {json.dumps(name)}
run_dir = {json.dumps(str(run_dir.absolute()))}
seed = {int(seed)}

[model]
path = {json.dumps(str(base_dir.absolute()))}
base_options = {{ task = {json.dumps(task)} }}

[task]
name = {json.dumps(task)}

[[samplers]]
name = "sampler"
engine = "hf"
count = {int(samplers)}
group_size = 8
prompts_per_call = {int(prompts_per_call)}
min_round_s = {float(min_round_s)}
backlog_cap = {int(backlog_cap)}
{sync_line}engine_options = {{ threads = 1 }}
[samplers.sampling]
max_new_tokens = {int(max_new_tokens)}
temperature = 1.0

[trainer]
backend = "torch"
backend_options = {{ lr = {float(lr)}, threads = 1 }}
groups_per_round = {int(groups_per_round)}
max_policy_age = {int(max_policy_age)}
total_rounds = {int(total_rounds)}

[scheduler]
name = {json.dumps(scheduler)}
tick_s = {float(tick_s)}
{options_line}
[backstops]
wall_clock_s = {float(wall_clock_s)}
silence_s = {float(silence_s)}
"""
