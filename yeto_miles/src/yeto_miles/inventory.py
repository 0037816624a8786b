"""Every Miles flag yeto sets, reads or refuses, and the Miles command line yeto builds.

The inventory is the contract with Miles' argument parser
(``miles/utils/arguments.py`` plus the Megatron flags Miles re-registers).
``yeto miles doctor`` checks every flag here against the live parser; a test
fails when :func:`miles_command` sets a flag the inventory lacks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Optional

import attrs

from yeto_core.errors import ConfigError

#: The Miles commits the inventory was checked against (first, last), by reading the source.
MILES_COMMITS = (
    "31f1ca961a94cb860cec3b2dea34ec332bfa8f76",
    "31f1ca961a94cb860cec3b2dea34ec332bfa8f76",
)
MILES_COMMIT_DATE = "2026-08-21"

#: The functions Miles imports from yeto (``module:attribute`` as Miles' path flags take them).
ROLLOUT_FUNCTION = "yeto_miles.rollout.generate_rollout"
ROLLOUT_CLASS = "yeto_miles.rollout.YetoRolloutFn"
LOG_FUNCTION = "yeto_miles.rollout.log_rollout_data"
POST_SAVE_HOOK = "yeto_miles.rollout.post_save_hook"


@attrs.frozen
class Flag:
    """One Miles flag: ``sets`` (yeto passes it), ``reads`` (yeto reads it from ``args``)
    or ``refuses`` (a user's ``miles_args`` may not hold it), and why."""

    name: str
    role: str
    why: str


_F = Flag
FLAGS: dict[str, Flag] = {
    f.name: f
    for f in (
        _F(
            "--rollout-function-path",
            "sets",
            "Miles takes each round from yeto's rollout function (the durable buffer through "
            "yeto's batch reader) instead of generating it",
        ),
        _F(
            "--custom-rollout-log-function-path",
            "sets",
            "Miles' rollout logging runs over the real samples only, plus padded_samples "
            "and padded_fraction",
        ),
        _F(
            "--custom-megatron-post-save-hook-path",
            "sets",
            "after every save (rank 0) the hook tells yeto the round is trained and where "
            "its iter_* checkpoint and HF export are",
        ),
        _F(
            "--debug-train-only",
            "sets",
            "no SGLang engines and no weight push: samplers follow releases from the store",
        ),
        _F(
            "--debug-skip-weight-update",
            "sets",
            "a second guard: Miles never pushes weights to an engine",
        ),
        _F(
            "--disable-rollout-global-dataset",
            "sets",
            "prompts come from the samplers, not from a Miles dataset",
        ),
        _F(
            "--disable-rollout-trim-samples",
            "sets",
            "Miles never drops a real sample to fit its global batch (yeto pads instead)",
        ),
        _F("--hf-checkpoint", "sets", "the base model (tokenizer, config, first weights)"),
        _F("--load", "sets", "the restored cut's Megatron checkpoint (an empty dir from the base)"),
        _F("--save", "sets", "where Megatron writes iter_*/ checkpoints that cuts are made of"),
        _F(
            "--save-interval",
            "sets",
            "1: every round boundary has a checkpoint, so a drain can cut at once",
        ),
        _F("--save-hf", "sets", "Miles' HF export each round: what a release is made of"),
        _F("--num-rollout", "sets", "rollouts Miles runs before it exits"),
        _F("--rollout-batch-size", "sets", "groups per round (reads it back to check)"),
        _F("--n-samples-per-prompt", "sets", "G, samples per group (reads it back to check)"),
        _F(
            "--global-batch-size",
            "sets",
            "groups per round x G: one optimizer step per round, padding included",
        ),
        _F("--custom-config-path", "sets", "yeto's own settings (the bridge) as args.yeto_*"),
        _F("--seed", "sets", "the run's seed"),
        _F("--ref-load", "sets", "the base's Megatron checkpoint, when the user gives one"),
        _F(
            "--use-rollout-routing-replay",
            "sets",
            "MoE: train with the experts the sampler routed to (rollout_routed_experts)",
        ),
        _F("--async-save", "refuses", "a cut needs the round's checkpoint complete at once"),
        _F("--no-save-optim", "refuses", "a cut without the optimizer cannot continue training"),
        _F("--colocate", "refuses", "the trainer island runs no engines"),
        _F("--debug-rollout-only", "refuses", "the trainer island trains"),
        _F("--load-debug-rollout-data", "refuses", "rounds come from the durable buffer"),
        _F("--eval-interval", "refuses", "the trainer island runs no engines to evaluate with"),
        _F("--start-rollout-id", "refuses", "yeto resumes from the cut's iter_* checkpoint"),
        _F("--fully-async", "refuses", "yeto's trainer runs Miles' synchronous loop (train.py)"),
        _F("--save-trigger-sentinel", "refuses", "every round is saved already"),
    )
}


def flags_with_role(role: str) -> list[str]:
    return [name for name, f in FLAGS.items() if f.role == role]


def check_user_args(miles_args: Sequence[str]) -> list[str]:
    """Problems with a user's ``miles_args`` (flags yeto sets itself, or refuses)."""
    problems = []
    for arg in miles_args:
        name = str(arg).split("=", 1)[0]
        flag = FLAGS.get(name)
        if flag is None:
            continue
        if flag.role == "refuses":
            problems.append(f"{name}: yeto refuses it ({flag.why})")
        elif flag.role == "sets":
            problems.append(f"{name}: yeto sets it itself ({flag.why}); remove it from miles_args")
    return problems


def set_flags(command: Sequence[str], user_args: Sequence[str] = ()) -> list[str]:
    """The flags of ``command`` that yeto put there (the user's ``miles_args`` left out)."""
    mine = list(command[: len(command) - len(user_args)] if user_args else command)
    return [a for a in mine if str(a).startswith("--")]


def miles_command(
    *,
    python: str,
    entry: str,
    model_dir: str,
    load_dir: str,
    save_dir: str,
    hf_template: str,
    num_rollout: int,
    groups_per_round: int,
    group_size: int,
    custom_config: str,
    seed: int,
    ref_load: Optional[str] = None,
    routed_experts: bool = False,
    rollout_form: str = "function",
    miles_args: Sequence[str] = (),
) -> list[str]:
    """The exact command line of a trainer incarnation (user ``miles_args`` last)."""
    if rollout_form not in ("function", "class"):
        raise ConfigError(
            f"trainer.backend_options.rollout_form = {rollout_form!r}: use 'function' "
            "(generate_rollout, every Miles rollout path) or 'class' (RolloutFnConstructorInput)"
        )
    problems = check_user_args(miles_args)
    if problems:
        raise ConfigError(
            "trainer.backend_options.miles_args: " + "; ".join(problems) + " (see docs/miles.md)"
        )
    cmd = [
        python,
        entry,
        "--rollout-function-path",
        ROLLOUT_FUNCTION if rollout_form == "function" else ROLLOUT_CLASS,
        "--custom-rollout-log-function-path",
        LOG_FUNCTION,
        "--custom-megatron-post-save-hook-path",
        POST_SAVE_HOOK,
        "--debug-train-only",
        "--debug-skip-weight-update",
        "--disable-rollout-global-dataset",
        "--disable-rollout-trim-samples",
        "--hf-checkpoint",
        model_dir,
        "--load",
        load_dir,
        "--save",
        save_dir,
        "--save-interval",
        "1",
        "--save-hf",
        hf_template,
        "--num-rollout",
        str(int(num_rollout)),
        "--rollout-batch-size",
        str(int(groups_per_round)),
        "--n-samples-per-prompt",
        str(int(group_size)),
        "--global-batch-size",
        str(int(groups_per_round) * int(group_size)),
        "--custom-config-path",
        custom_config,
        "--seed",
        str(int(seed)),
    ]
    if ref_load:
        cmd += ["--ref-load", str(ref_load)]
    if routed_experts:
        cmd.append("--use-rollout-routing-replay")
    return cmd + [str(a) for a in miles_args]


def custom_config_text(values: dict[str, Any]) -> str:
    """``--custom-config-path`` content: JSON (a YAML subset), keys ``yeto_*``."""
    bad = [k for k in values if not k.startswith("yeto_")]
    if bad:
        raise ValueError(f"custom config keys must start with yeto_: {bad}")
    return json.dumps(values, indent=1, sort_keys=True) + "\n"


__all__ = [
    "FLAGS",
    "MILES_COMMITS",
    "Flag",
    "check_user_args",
    "miles_command",
    "set_flags",
]
