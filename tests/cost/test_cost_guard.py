"""The cost guard's policy: a pure function of spend, prices, burn and stop costs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yeto_core.cost.guard import (
    Burn,
    GuardAction,
    GuardedScheduler,
    GuardInputs,
    Reaction,
    guard_decide,
    stop_cost,
)
from yeto_core.records import Action, LifecycleState
from yeto_core.trainer.s1 import S1Scheduler, SchedulerInputs

A = GuardAction


def _inputs(**kw) -> GuardInputs:
    base = dict(
        now=0.0,
        budget_usd=10.0,
        spent_usd=0.0,
        soft_fraction=0.8,
        react_s=10.0,
        samplers=(Burn("s-0", 3.6, 10.0), Burn("s-1", 7.2, 10.0), Burn("s-2", 3.6, 10.0)),
        trainer=Burn("trainer", 36.0, 60.0),
        trainer_start=Burn("trainer", 36.0, 60.0),
        trainer_start_s=120.0,
        min_samplers=1,
    )
    base.update(kw)
    return GuardInputs(**base)


def test_stop_cost_pays_every_island_through_the_whole_stop() -> None:
    usd, seconds = stop_cost(
        [Burn("a", 3600.0, 1.0), Burn("b", 3600.0, 2.0)], Burn("t", 7200.0, 4.0)
    )
    # releases of 1 s and 2 s, then a 4 s drain; a bound in any order: all pay 7 s
    assert seconds == 7.0
    assert usd == pytest.approx((1.0 + 1.0 + 2.0) * 7.0)
    assert stop_cost([], None) == (0.0, 0.0)


def test_under_the_soft_threshold_it_continues_and_allows_a_trainer_start() -> None:
    d = guard_decide(_inputs(trainer=None, spent_usd=1.0))
    assert d.action == A.CONTINUE and d.reason == "under_soft" and d.allow_trainer_start
    assert d.burn_usd_per_hour == pytest.approx(14.4)


def test_the_soft_stage_releases_the_most_expensive_sampler_first_then_the_trainer() -> None:
    spent = 7.99  # + burn and stop cost is above the soft threshold (8), below the budget
    d = guard_decide(_inputs(spent_usd=spent))
    assert d.soft_usd == pytest.approx(8.0)
    assert 8.0 <= d.projected_usd < 10.0, d
    assert d.action == A.RELEASE_SAMPLER and d.island == "s-1" and d.reason == "soft_budget"
    one = (Burn("s-0", 3.6, 10.0),)
    d = guard_decide(_inputs(spent_usd=spent, samplers=one))
    assert d.action == A.STOP_TRAINER
    d = guard_decide(_inputs(spent_usd=spent, samplers=one, trainer=None))
    assert d.action == A.CONTINUE and d.reason == "soft_floor"
    assert not d.allow_trainer_start
    # below the soft threshold again once the trainer is gone, it stays held
    d = guard_decide(_inputs(spent_usd=1.0, samplers=one, trainer=None))
    assert d.reason == "under_soft" and d.allow_trainer_start
    d = guard_decide(_inputs(spent_usd=1.0, samplers=one, trainer=None, trainer_held=True))
    assert d.reason == "under_soft" and not d.allow_trainer_start


def test_it_stops_the_run_when_waiting_one_more_decision_could_exceed_the_budget() -> None:
    d = guard_decide(_inputs(spent_usd=8.7))
    assert d.projected_usd >= 10.0 and d.action == A.STOP_RUN and d.reason == "budget"
    # the same spend with a faster head (shorter reaction) and cheaper stops: soft only
    d = guard_decide(_inputs(spent_usd=8.7, react_s=0.1, trainer=Burn("trainer", 36.0, 1.0)))
    assert d.action == A.RELEASE_SAMPLER


def test_no_budget_means_no_guard() -> None:
    d = guard_decide(_inputs(budget_usd=0.0, spent_usd=1e9))
    assert d.action == A.CONTINUE and d.reason == "no_budget" and d.allow_trainer_start


def test_a_trainer_start_that_would_exceed_the_budget_is_held() -> None:
    # a start (120 s + 10 s of all at 50.4 $/h, then the releases and a 60 s drain) fits
    # the budget; a start of 1200 s does not
    d = guard_decide(_inputs(trainer=None, spent_usd=0.0, trainer_start_s=120.0))
    assert d.action == A.CONTINUE
    assert d.allow_trainer_start
    d = guard_decide(_inputs(trainer=None, spent_usd=2.0, trainer_start_s=1200.0))
    assert d.action == A.CONTINUE and not d.allow_trainer_start
    # ... and with the samplers waiting at their cap, the rest of the budget buys nothing
    d = guard_decide(
        _inputs(trainer=None, spent_usd=2.0, trainer_start_s=1200.0, samplers_waiting=True)
    )
    assert d.action == A.STOP_RUN and d.reason == "budget_idle"
    d = guard_decide(_inputs(trainer=None, spent_usd=2.0, samplers_waiting=True))
    assert d.action == A.CONTINUE and d.allow_trainer_start  # a trainer may start: wait
    inputs = SchedulerInputs(
        now=0.0,
        state=LifecycleState.STOPPED,
        backlog_groups=64,
        backlog_samples=512,
        groups_per_round=8,
        a_hard=2,
        start_s=10.0,
    )
    allowed = [True]
    sched = GuardedScheduler(S1Scheduler(), lambda: allowed[0])
    assert sched.decide(inputs).action == Action.START
    allowed[0] = False
    held = sched.decide(inputs)
    assert held.action == Action.HOLD and held.reason == "budget_hold"


def test_reaction_uses_the_longest_gap_with_a_margin_never_below_the_floor() -> None:
    r = Reaction(1.0, margin=1.5)
    assert r.seconds() == 1.0  # nothing measured: the floor
    for t in (0.0, 0.5, 1.0, 4.0, 4.5):
        r.mark(t)
    assert r.seconds() == pytest.approx(4.5)  # the 3 s gap (a trained round) x 1.5
    assert Reaction(9.0).seconds() == 9.0


@settings(max_examples=200, deadline=None)
@given(
    budget=st.floats(1.0, 100.0),
    prices=st.lists(st.floats(0.0, 500.0), min_size=1, max_size=6),
    trainer_price=st.floats(0.0, 2000.0),
    react=st.floats(0.5, 30.0),
    gaps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8),
    release_s=st.floats(0.0, 30.0),
    drain_s=st.floats(0.0, 300.0),
    soft=st.floats(0.3, 1.0),
)
def test_following_the_guard_never_exceeds_the_budget(
    budget, prices, trainer_price, react, gaps, release_s, drain_s, soft
) -> None:
    """A fleet whose decisions come at most ``react`` apart and whose stops take what the
    guard was told never overspends, whatever the guard's steps were."""
    samplers = [Burn(f"s-{k}", p, release_s) for k, p in enumerate(prices)]
    trainer = Burn("trainer", trainer_price, drain_s)
    spent = 0.0

    def burn() -> float:
        return sum(s.usd_per_hour for s in samplers) + (trainer.usd_per_hour if trainer else 0)

    def pay(seconds: float) -> None:
        nonlocal spent
        spent += burn() / 3600.0 * seconds

    def inputs() -> GuardInputs:
        return GuardInputs(
            now=0.0,
            budget_usd=budget,
            spent_usd=spent,
            soft_fraction=soft,
            react_s=react,
            samplers=tuple(samplers),
            trainer=trainer,
            trainer_start=Burn("trainer", trainer_price, drain_s),
            trainer_start_s=60.0,
        )

    if guard_decide(inputs()).action != A.CONTINUE:
        return  # the head launches nothing it could not stop within the budget
    for step in range(3_000):
        d = guard_decide(inputs())
        if d.action == A.STOP_RUN:
            for s in list(samplers):  # the head's stop: samplers one by one, then the trainer
                pay(s.stop_s)
                samplers.remove(s)
            if trainer is not None:
                pay(trainer.stop_s)
            break
        if d.action == A.RELEASE_SAMPLER:  # the head is blocked while the release runs
            k = [s.island for s in samplers].index(d.island)
            pay(samplers[k].stop_s)
            del samplers[k]
        elif d.action == A.STOP_TRAINER:
            pay(trainer.stop_s)
            trainer = None
        if burn() == 0:
            break
        pay(react * gaps[step % len(gaps)])  # the next decision comes within react_s
    assert spent <= budget * (1 + 1e-9), (spent, budget)


def test_preflight_fails_a_budget_that_cannot_pay_for_one_stop_of_the_fleet(tmp_path) -> None:
    import attrs

    from yeto_core.config.preflight import Report, check_consistency
    from yeto_core.testing.fake_run import fake_run_config

    config = fake_run_config(tmp_path)  # 2 x 36 $/h + 72 $/h, budget $100
    report = Report()
    check_consistency(config, report)
    assert report.passed and any(c.name == "cost" for c in report.checks)
    tight = attrs.evolve(config, backstops=attrs.evolve(config.backstops, budget_usd=1.0))
    report = Report()
    check_consistency(tight, report)
    (fail,) = [c for c in report.failures() if c.name == "cost"]
    assert "sampler_release_s" in fail.detail and "raise backstops.budget_usd" in fail.detail
