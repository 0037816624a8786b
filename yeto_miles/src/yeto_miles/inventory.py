"""Every Miles flag yeto sets or refuses, and the Miles command line yeto builds: the
contract with Miles' argument parser that ``yeto miles doctor`` checks (docs/miles.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import attrs

from yeto_core.errors import ConfigError

#: The Miles commits the inventory was checked against (first, last), by reading the source.
MILES_COMMITS = ("31f1ca961a94cb860cec3b2dea34ec332bfa8f76",) * 2
MILES_COMMIT_DATE = "2026-08-21"

#: The functions Miles imports from yeto (``module:attribute`` as Miles' path flags take them).
ROLLOUT_FUNCTION = "yeto_miles.rollout.generate_rollout"
ROLLOUT_CLASS = "yeto_miles.rollout.YetoRolloutFn"
LOG_FUNCTION = "yeto_miles.rollout.log_rollout_data"
POST_SAVE_HOOK = "yeto_miles.rollout.post_save_hook"


@attrs.frozen
class Flag:
    name: str
    role: str  # "sets" (yeto passes it) or "refuses" (a user's miles_args may not hold it)
    value: str  # what yeto passes (see _TABLE); empty for a refused flag
    why: str

    def args(self, spec: Any, **fields: Any) -> list[str]:
        """The words this flag adds to the command line of ``spec`` (none, the flag, or both)."""
        value, _, when = self.value.partition(" if ")
        if self.role != "sets" or (when and not getattr(spec, when)):
            return []
        return [self.name] if value == "-" else [self.name, value.format(spec=spec, **fields)]


#: name | role | value | why. The value is a str.format template over ``spec`` (a MilesBackend)
#: and the fields miles_command names, or ``-`` for a bare flag; ``if ATTR``: only when spec.ATTR.
_TABLE = """
--rollout-function-path | sets | {rollout} | Miles takes each round from yeto's rollout function (the durable buffer through yeto's batch reader) instead of generating it
--custom-rollout-log-function-path | sets | {LOG_FUNCTION} | Miles' rollout logging runs over the real samples only, plus padded_samples and padded_fraction
--custom-megatron-post-save-hook-path | sets | {POST_SAVE_HOOK} | after every save (rank 0) the hook tells yeto the round is trained and where its iter_* checkpoint and HF export are
--debug-train-only | sets | - | no SGLang engines and no weight push: samplers follow releases from the store
--debug-skip-weight-update | sets | - | a second guard: Miles never pushes weights to an engine
--disable-rollout-global-dataset | sets | - | prompts come from the samplers, not from a Miles dataset
--disable-rollout-trim-samples | sets | - | Miles never drops a real sample to fit its global batch (yeto pads instead)
--hf-checkpoint | sets | {model} | the base model (tokenizer, config, first weights)
--load | sets | {load} | the restored cut's Megatron checkpoint (a missing dir from the base)
--save | sets | {spec.save_dir} | where Megatron writes the iter_*/ checkpoints that cuts are made of
--save-interval | sets | 1 | every round boundary has a checkpoint, so a drain can cut at once
--save-hf | sets | {spec.hf_template} | Miles' HF export each round: what a release is made of
--num-rollout | sets | {spec.num_rollout} | rollouts Miles runs before it exits: 1000000 unless set, yeto decides when training ends
--rollout-batch-size | sets | {spec.groups_per_round} | groups per round (the rollout function reads it back to check)
--n-samples-per-prompt | sets | {spec.group_size} | G, samples per group (the rollout function reads it back to check)
--global-batch-size | sets | {global_batch} | groups per round x G: one optimizer step per round, padding included
--custom-config-path | sets | {config} | yeto's own settings (the bridge) as args.yeto_*
--seed | sets | {spec.seed} | the run's seed
--ref-load | sets | {spec.ref_load} if ref_load | the base's Megatron checkpoint, when the user gives one
--use-rollout-routing-replay | sets | - if routed_experts | MoE: train with the experts the sampler routed to (rollout_routed_experts)
--async-save | refuses | | a cut needs the round's checkpoint complete at once
--no-save-optim | refuses | | a cut without the optimizer cannot continue training
--colocate | refuses | | the trainer island runs no engines
--debug-rollout-only | refuses | | the trainer island trains
--load-debug-rollout-data | refuses | | rounds come from the durable buffer
--eval-interval | refuses | | the trainer island runs no engines to evaluate with
--start-rollout-id | refuses | | yeto resumes from the cut's iter_* checkpoint
--fully-async | refuses | | yeto's trainer runs Miles' synchronous loop (train.py)
--save-trigger-sentinel | refuses | | every round is saved already
"""
FLAGS: dict[str, Flag] = {
    f.name: f
    for f in (
        Flag(*(x.strip() for x in line.split("|", 3))) for line in _TABLE.strip().splitlines()
    )
}


def flags_with_role(role: str) -> list[str]:
    return [name for name, f in FLAGS.items() if f.role == role]


_PROBLEM = {
    "refuses": "{}: yeto refuses it ({})",
    "sets": "{}: yeto sets it itself ({}); remove it from miles_args",
}


def check_user_args(miles_args: Sequence[str]) -> list[str]:
    """Problems with a user's ``miles_args`` (flags yeto sets itself, or refuses)."""
    flags = [FLAGS.get(str(arg).split("=", 1)[0]) for arg in miles_args]
    return [_PROBLEM[f.role].format(f.name, f.why) for f in flags if f is not None]


def set_flags(command: Sequence[str], user_args: Sequence[str] = ()) -> list[str]:
    """The flags of ``command`` that yeto put there (the user's ``miles_args`` left out)."""
    return [a for a in command[: len(command) - len(user_args)] if str(a).startswith("--")]


def miles_command(spec: Any, *, load_dir: str, custom_config: str) -> list[str]:
    """The exact command line of a trainer incarnation (``spec``: a :class:`MilesBackend`),
    the user's ``miles_args`` last."""
    rollout_form, miles_args = spec.rollout_form, spec.miles_args
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
    fields = dict(
        rollout=ROLLOUT_FUNCTION if rollout_form == "function" else ROLLOUT_CLASS,
        LOG_FUNCTION=LOG_FUNCTION,
        POST_SAVE_HOOK=POST_SAVE_HOOK,
        model=os.path.abspath(spec.model_dir),
        load=load_dir,
        config=custom_config,
        global_batch=int(spec.groups_per_round) * int(spec.group_size),
    )
    cmd = [str(spec.python), str(spec.entry)]
    for flag in FLAGS.values():
        cmd += flag.args(spec, **fields)
    return cmd + [str(a) for a in miles_args]
