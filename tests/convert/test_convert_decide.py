"""The conversion decision is a pure function of its inputs (yeto_core.conversion.convertible)."""

from __future__ import annotations

import attrs

from yeto_core.conversion.convertible import (
    IDLE,
    SAMPLER,
    TRAINER,
    ConversionInputs,
    NodeView,
    decide_conversion,
    rank_nodes,
)

NODES = (
    NodeView("fixed-0", SAMPLER, False, 1.0, 0.2, 8),
    NodeView("flex-0", SAMPLER, True, 1.0, 0.2, 8),
    NodeView("flex-1", SAMPLER, True, 1.0, 0.1, 8),
)


def _inputs(**kw) -> ConversionInputs:
    base = dict(
        now=100.0,
        scheduler_action="HOLD",
        scheduler_reason="wait_backlog",
        trainer_node=None,
        backlog_groups=0,
        groups_per_round=8,
        q_on_rounds=3,
        arrival_groups_per_s=0.0,
        conversion_s=20.0,
        nodes=NODES,
        min_samplers=1,
    )
    base.update(kw)
    return ConversionInputs(**base)


def test_a_start_converts_the_node_whose_sampling_is_worth_least() -> None:
    d = decide_conversion(_inputs(scheduler_action="START", scheduler_reason="backlog"))
    assert (d.action, d.reason, d.node) == ("to_trainer", "scheduler_backlog", "flex-1")
    assert d.ranking == ("flex-1", "flex-0")
    # fewer in-flight groups first (the drain abandons least), then value per dollar
    nodes = (NODES[0], attrs.evolve(NODES[1], in_flight=0), NODES[2])
    assert rank_nodes(nodes)[0].name == "flex-0"
    # a pricier node with the same throughput is worth less sampling per dollar
    nodes = (NODES[0], attrs.evolve(NODES[1], price_per_hour=4.0, groups_per_s=0.2), NODES[2])
    assert rank_nodes(nodes)[0].name == "flex-0"


def test_the_guard_never_converts_the_last_sampler_or_below_the_minimum() -> None:
    nodes = (attrs.evolve(NODES[0], role=IDLE), NODES[1])
    d = decide_conversion(
        _inputs(scheduler_action="START", scheduler_reason="backlog", nodes=nodes)
    )
    assert (d.action, d.reason) == ("hold", "guard_pool_minimum")
    d = decide_conversion(
        _inputs(scheduler_action="START", scheduler_reason="backlog", min_samplers=3)
    )
    assert (d.action, d.reason) == ("hold", "guard_pool_minimum")
    # after the data end nothing samples any more: the idle node trains the rest
    nodes = tuple(attrs.evolve(n, role=IDLE) for n in NODES)
    d = decide_conversion(
        _inputs(scheduler_action="START", scheduler_reason="drain", nodes=nodes, data_ended=True)
    )
    assert (d.action, d.node) == ("to_trainer", "flex-1")


def test_no_convertible_node_holds() -> None:
    d = decide_conversion(
        _inputs(scheduler_action="START", scheduler_reason="backlog", nodes=NODES[:1])
    )
    assert (d.action, d.reason) == ("hold", "no_convertible_node")


def test_arrivals_make_the_conversion_start_early_when_it_pays() -> None:
    # 16 waiting + 0.5 g/s x 20 s = 26 >= 24 = Q_on x G: ready when the backlog is
    d = decide_conversion(_inputs(backlog_groups=16, arrival_groups_per_s=0.5))
    assert (d.action, d.reason) == ("to_trainer", "anticipate")
    assert decide_conversion(_inputs(backlog_groups=16, arrival_groups_per_s=0.1)).action == "hold"
    d = decide_conversion(_inputs(backlog_groups=16, arrival_groups_per_s=0.5, data_ended=True))
    assert (d.action, d.reason) == ("hold", "data_end")


def test_an_idle_trainer_goes_back_unless_the_next_round_arrives_within_a_conversion() -> None:
    nodes = (NODES[0], attrs.evolve(NODES[1], role=TRAINER), NODES[2])
    stop = dict(
        scheduler_action="STOP", scheduler_reason="idle", trainer_node="flex-0", nodes=nodes
    )
    d = decide_conversion(_inputs(**stop, backlog_groups=2, arrival_groups_per_s=0.1))
    assert (d.action, d.node) == ("to_sampler", "flex-0")
    d = decide_conversion(_inputs(**stop, backlog_groups=2, arrival_groups_per_s=0.5))
    assert (d.action, d.reason) == ("hold", "keep_arrivals")
    d = decide_conversion(_inputs(**dict(stop, scheduler_action="FINISH")))
    assert (d.action, d.reason) == ("to_sampler", "scheduler_finish")
    d = decide_conversion(_inputs(**dict(stop, scheduler_action="HOLD")))
    assert d.action == "hold"


def test_the_decision_depends_on_its_inputs_only() -> None:
    i = _inputs(scheduler_action="START", scheduler_reason="backlog")
    assert decide_conversion(i) == decide_conversion(i)
    assert decide_conversion(i).inputs is i
