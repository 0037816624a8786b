"""When a node converts, and which one: a pure function (docs/conversion.md).

:func:`decide_conversion` turns the trainer scheduler's decision (S1's START /
STOP / HOLD), the buffer backlog, the measured group arrival rate, the measured
conversion cost, the node prices and the capacity guard into one
:class:`ConversionDecision`: convert a node to the trainer, give the trainer's
node back to the samplers, or hold. It never reads a clock or the store; the
head journals every decision with its inputs (``conversion_decision`` records in
``head/journal``).

Rules, in order:

1. Trainer stopped, the scheduler says START (also its ``drain`` after the data
   end) → ``to_trainer`` of the first ranked node, when the guard allows; else
   HOLD ``no_convertible_node`` / ``guard_pool_minimum``. After the data end no
   node samples any more, so the guard does not apply.
2. Trainer stopped, the data not ended, the scheduler waits for backlog, and the
   backlog plus what arrives during one conversion reaches ``Q_on`` rounds →
   ``to_trainer`` (``anticipate``): the converted trainer is ready when the
   backlog is.
3. Trainer on a node, the scheduler says FINISH → ``to_sampler``; it says STOP
   (idle) but the missing part of one round arrives within one conversion →
   HOLD ``keep_arrivals`` (converting back and again would cost more than the
   wait); else ``to_sampler``.
4. Anything else → HOLD ``pass``.

The guard: after a conversion at least ``max(1, min_samplers)`` nodes sample
(never the last sampler; never below the pool minimum). The ranking: convertible
nodes that sample nothing (idle) first, then those with the fewest in-flight groups (the P0-S drain abandons
least), then the lowest sampling value per dollar (groups per second per
dollar-hour: the node whose sampling is worth least converts), then the name.
"""

from __future__ import annotations

from typing import Optional

import attrs

#: Roles of a node slot.
SAMPLER, TRAINER, IDLE = "sampler", "trainer", "idle"


@attrs.frozen
class NodeView:
    """One node slot as the decision sees it."""

    name: str
    role: str = SAMPLER
    convertible: bool = False
    price_per_hour: float = 0.0
    #: measured groups per second this node appends while sampling (0: not known yet)
    groups_per_s: float = 0.0
    #: groups generating now (what a drain would finish or abandon)
    in_flight: int = 0


@attrs.frozen
class ConversionInputs:
    """Everything :func:`decide_conversion` reads."""

    now: float
    #: the trainer scheduler's decision: START, STOP, HOLD or FINISH, and its reason
    scheduler_action: str
    scheduler_reason: str
    trainer_node: Optional[str]
    backlog_groups: int
    groups_per_round: int
    #: backlog rounds at which the scheduler starts the trainer (S1's Q_on)
    q_on_rounds: int
    #: groups per second arriving in the buffer, measured over the last window
    arrival_groups_per_s: float
    #: seconds one conversion costs (drain + trainer start; measured, else the fallback)
    conversion_s: float
    nodes: tuple[NodeView, ...] = ()
    min_samplers: int = 1
    data_ended: bool = False


@attrs.frozen
class ConversionDecision:
    """``to_trainer`` / ``to_sampler`` of ``node``, or ``hold``; with its reason and ranking."""

    action: str
    reason: str
    node: Optional[str] = None
    #: the convertible sampler nodes in the order they would convert
    ranking: tuple[str, ...] = ()
    inputs: Optional[ConversionInputs] = None


def rank_nodes(nodes: tuple[NodeView, ...]) -> list[NodeView]:
    """The convertible sampler nodes, in the order they convert (module docstring)."""

    def value_per_dollar(n: NodeView) -> float:
        return n.groups_per_s / n.price_per_hour if n.price_per_hour > 0 else n.groups_per_s

    eligible = [n for n in nodes if n.convertible and n.role in (SAMPLER, IDLE)]
    return sorted(
        eligible,
        key=lambda n: (n.role != IDLE, n.in_flight, value_per_dollar(n), n.name),
    )


def guard_allows(node: NodeView, nodes: tuple[NodeView, ...], min_samplers: int) -> bool:
    """Whether ``node`` may leave the samplers: never the last, never below the minimum.

    An idle node (its sampler already stopped) takes nothing from the samplers.
    """
    if node.role != SAMPLER:
        return True
    sampling = sum(1 for n in nodes if n.role == SAMPLER)
    return sampling - 1 >= max(1, int(min_samplers))


def decide_conversion(i: ConversionInputs) -> ConversionDecision:
    """The conversion decision for ``i`` (module docstring: the rules)."""
    ranking = rank_nodes(i.nodes)
    names = tuple(n.name for n in ranking)

    def out(action: str, reason: str, node: Optional[str] = None) -> ConversionDecision:
        return ConversionDecision(action, reason, node, names, i)

    gpr = max(1, i.groups_per_round)
    if i.trainer_node is None:
        want: Optional[str] = None
        if i.scheduler_action == "START":
            want = f"scheduler_{i.scheduler_reason}"
        elif i.data_ended:
            return out("hold", "data_end")
        elif i.scheduler_action == "HOLD" and i.scheduler_reason == "wait_backlog":
            expected = i.backlog_groups + i.arrival_groups_per_s * i.conversion_s
            if i.backlog_groups >= gpr and expected >= i.q_on_rounds * gpr:
                want = "anticipate"
        if want is None:
            return out("hold", "pass")
        if not ranking:
            return out("hold", "no_convertible_node")
        if not (i.data_ended or guard_allows(ranking[0], i.nodes, i.min_samplers)):
            return out("hold", "guard_pool_minimum")
        return out("to_trainer", want, ranking[0].name)
    if i.scheduler_action == "FINISH":
        return out("to_sampler", "scheduler_finish", i.trainer_node)
    if i.scheduler_action == "STOP":
        missing = gpr - i.backlog_groups % gpr
        if not i.data_ended and i.arrival_groups_per_s * i.conversion_s >= missing:
            return out("hold", "keep_arrivals", i.trainer_node)
        return out("to_sampler", f"scheduler_{i.scheduler_reason}", i.trainer_node)
    return out("hold", "pass", i.trainer_node)
