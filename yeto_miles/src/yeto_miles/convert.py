"""yeto rounds as Miles samples: ``list[list[Sample]]``, groups whole, padding marked.

A round of the batch reader (whole groups of G, plus loss-free padding for a
short round) becomes one Miles group per yeto group, and the padding becomes
whole groups of G copies with ``loss_mask`` all zero, ``remove_sample`` set,
reward 0 and ``metadata["yeto_padding"] = True``. Miles normalizes rewards per
group, so an all-padding group has advantage 0 and mixes with no real group.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import numpy as np

from yeto_core.records import Sample as YetoSample

#: ``metadata`` key that marks a loss-free padding sample.
PAD_KEY = "yeto_padding"


class MilesUnavailableError(ImportError):
    """Miles is not importable here (it runs on the trainer image)."""


def sample_class() -> type:
    """Miles' ``Sample`` (``miles.utils.types``, needs only torch and numpy)."""
    try:
        return importlib.import_module("miles.utils.types").Sample
    except ImportError as exc:
        raise MilesUnavailableError(
            f"cannot import miles.utils.types ({exc}); the miles backend runs on the trainer "
            "image where Miles is installed (docs/miles.md: building the trainer image)"
        ) from exc


def to_miles_sample(
    s: YetoSample,
    cls: type,
    *,
    group_index: int,
    index: int,
    metadata: dict[str, Any],
    padding: bool = False,
) -> Any:
    """One Miles ``Sample`` from a yeto sample (tokens, masks, log-probs, experts, status)."""
    response = int(s.response_len)
    mask = np.asarray(s.loss_mask).astype(np.int64)
    if padding:
        mask = np.zeros_like(mask)
    routed = None
    if s.routed_experts is not None:
        routed = np.ascontiguousarray(np.asarray(s.routed_experts), dtype=np.int32)
    out = cls(
        group_index=int(group_index),
        index=int(index),
        tokens=[int(t) for t in np.asarray(s.tokens)],
        response_length=response,
        reward=0.0 if padding else float(s.reward),
        loss_mask=[int(m) for m in mask],
        rollout_log_probs=[float(x) for x in np.asarray(s.logprobs, dtype=np.float64)],
        rollout_routed_experts=routed,
        weight_versions=[str(int(s.weight_version))],
        status=cls.Status(getattr(s.status, "value", s.status)),
        metadata=dict(metadata, **({PAD_KEY: True} if padding else {})),
    )
    if padding:
        out.remove_sample = True
    validate = getattr(out, "validate", None)
    if callable(validate):
        validate()
    return out


def to_miles_groups(
    groups: Sequence[Any],
    positions: Sequence[int],
    padding: Sequence[YetoSample],
    *,
    group_size: int,
    rollout_id: int,
    groups_per_round: int,
    cls: Optional[type] = None,
) -> list[list[Any]]:
    """The Miles groups of one round: real groups in position order, then padding groups."""
    cls = cls or sample_class()
    rows: list[tuple[Sequence[YetoSample], Optional[Any], Optional[int]]] = [
        (g.samples, g, int(p)) for g, p in zip(groups, positions, strict=True)
    ]
    rows += [(padding[k : k + group_size], None, None) for k in range(0, len(padding), group_size)]
    out: list[list[Any]] = []
    index = rollout_id * groups_per_round * group_size
    for g, (samples, grp, pos) in enumerate(rows):
        if len(samples) != group_size:
            raise ValueError(
                f"a group of {len(samples)} samples (position {pos}) in a round of groups of "
                f"{group_size}; the reader keeps only whole groups and pads in whole groups"
            )
        row = []
        for i, s in enumerate(samples):
            meta = {} if grp is None else {"yeto_position": pos, "yeto_group_id": grp.group_id}
            if grp is not None:
                meta["yeto_sample"] = i
            gi = rollout_id * groups_per_round + g
            row.append(
                to_miles_sample(
                    s, cls, group_index=gi, index=index, metadata=meta, padding=grp is None
                )
            )
            index += 1
        out.append(row)
    return out


def is_padding(sample: Any) -> bool:
    return bool((getattr(sample, "metadata", None) or {}).get(PAD_KEY))


def flatten(samples: Iterable[Any]) -> list[Any]:
    out = []
    for s in samples:
        if isinstance(s, list):
            out.extend(flatten(s))
        else:
            out.append(s)
    return out


def padding_metrics(samples: Iterable[Any]) -> dict[str, float]:
    """``rollout/padded_samples`` and ``rollout/padded_fraction`` of a round."""
    flat = flatten(samples)
    pad = sum(1 for s in flat if is_padding(s))
    return {
        "rollout/padded_samples": float(pad),
        "rollout/padded_fraction": float(pad) / len(flat) if flat else 0.0,
    }
