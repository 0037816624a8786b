"""What Miles imports from yeto through its path flags (runs inside Miles' processes).

- ``--rollout-function-path yeto_miles.rollout.generate_rollout`` (legacy form,
  every Miles rollout path) or ``yeto_miles.rollout.YetoRolloutFn`` (the class
  form, built with ``RolloutFnConstructorInput``): asks the trainer
  incarnation for round ``rollout_id`` through the bridge and returns it as
  ``list[list[Sample]]``.
- ``--custom-rollout-log-function-path yeto_miles.rollout.log_rollout_data``:
  Miles' default rollout logging over the real samples only, plus
  ``rollout/padded_samples`` and ``rollout/padded_fraction``.
- ``--custom-megatron-post-save-hook-path yeto_miles.rollout.post_save_hook``:
  tells the incarnation the round is trained and saved.

yeto's settings arrive as ``args.yeto_*`` (``--custom-config-path``).
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import socket
import time
from collections.abc import Callable
from typing import Any, Optional

from yeto_miles.bridge import Bridge, BridgeError, parent_alive
from yeto_miles.convert import flatten, is_padding, padding_metrics, to_miles_groups

_BRIDGES: dict[tuple[str, str], Bridge] = {}


def bridge_of(args: Any) -> Bridge:
    """The bridge named by ``args.yeto_bridge_url`` / ``args.yeto_bridge_prefix``."""
    url = getattr(args, "yeto_bridge_url", None)
    prefix = getattr(args, "yeto_bridge_prefix", None)
    if not url or not prefix:
        raise BridgeError(
            "args.yeto_bridge_url / yeto_bridge_prefix are missing: Miles was not started by "
            "yeto's miles backend (it passes them with --custom-config-path)"
        )
    if (url, prefix) not in _BRIDGES:
        from yeto_core.plugins import get_plugins

        _BRIDGES[(url, prefix)] = Bridge(get_plugins().open_store(url), prefix)
    return _BRIDGES[(url, prefix)]


def next_round(
    args: Any,
    rollout_id: int,
    *,
    sample_cls: Optional[type] = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[list[Any]]:
    """Ask for round ``rollout_id`` and wait until the incarnation hands it over."""
    bridge = bridge_of(args)
    bridge.put_json(
        bridge.request_key(int(rollout_id)),
        {"rollout_id": int(rollout_id), "host": socket.gethostname(), "time": time.time()},
    )
    parent = str(getattr(args, "yeto_parent", ""))

    def alive() -> Optional[str]:
        if bridge.is_closed():
            return "the trainer incarnation closed the bridge (it drained or failed)"
        return parent_alive(parent)

    rec = bridge.wait(
        lambda: bridge.get_batch(int(rollout_id)),
        what=f"round {rollout_id} from the trainer incarnation",
        timeout_s=float(getattr(args, "yeto_wait_s", 86400.0)),
        alive=alive,
        poll_s=float(getattr(args, "yeto_poll_s", 0.2)),
        sleep=sleep,
    )
    g, n = int(rec["group_size"]), int(rec["groups_per_round"])
    want = (getattr(args, "rollout_batch_size", n), getattr(args, "n_samples_per_prompt", g))
    if want != (n, g):
        raise BridgeError(
            f"Miles runs --rollout-batch-size {want[0]} --n-samples-per-prompt {want[1]}, but "
            f"yeto's round {rollout_id} holds {n} groups of {g}; start Miles through yeto"
        )
    return to_miles_groups(
        rec["groups"],
        rec["positions"],
        rec["padding"],
        group_size=g,
        rollout_id=int(rollout_id),
        groups_per_round=n,
        cls=sample_cls,
    )


def _no_eval() -> BridgeError:
    return BridgeError(
        "yeto's rollout function serves training rounds only; the trainer island runs no "
        "engines to evaluate with (do not pass --eval-interval)"
    )


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False):
    """Miles' legacy rollout form: the round as ``list[list[Sample]]``."""
    if evaluation:
        raise _no_eval()
    return next_round(args, rollout_id)


class YetoRolloutFn:
    """Miles' class rollout form: ``YetoRolloutFn(RolloutFnConstructorInput)``."""

    def __init__(self, input: Any) -> None:
        self.args = input.args

    async def __call__(self, input: Any) -> Any:
        if getattr(input, "evaluation", False):
            raise _no_eval()
        groups = await asyncio.to_thread(next_round, self.args, int(input.rollout_id))
        out = importlib.import_module("miles.rollout.base_types").RolloutFnTrainOutput
        return out(samples=groups, metrics=padding_metrics(groups))


def _default_log() -> Callable[..., Any]:
    return importlib.import_module("miles.ray.rollout.metrics").log_rollout_data


def log_rollout_data(
    rollout_id: int,
    args: Any,
    samples: Any,
    rollout_extra_metrics: Optional[dict[str, Any]],
    rollout_time: float,
    *,
    default: Optional[Callable[..., Any]] = None,
) -> bool:
    """Miles' default rollout logging over the real samples, plus the padding figures.

    Returns True: Miles skips its own logging (which would count the padding).
    """
    flat = flatten(samples)
    real = [s for s in flat if not is_padding(s)]
    extra = dict(rollout_extra_metrics or {})
    extra.update(padding_metrics(flat))
    quiet = copy.copy(args)
    quiet.custom_rollout_log_function_path = None  # the default logging, not this one again
    (default or _default_log())(rollout_id, quiet, real, extra, rollout_time)
    return True


def post_save_hook(
    args: Any, rollout_id: int, checkpoint_dir: str, hf_checkpoint_dir: Optional[str]
) -> None:
    """Rank 0, after Miles saved round ``rollout_id``: tell the incarnation where it is."""
    bridge = bridge_of(args)
    bridge.put_json(
        bridge.saved_key(int(rollout_id)),
        {
            "rollout_id": int(rollout_id),
            "checkpoint_dir": str(checkpoint_dir),
            "hf_dir": None if hf_checkpoint_dir is None else str(hf_checkpoint_dir),
            "time": time.time(),
        },
    )
