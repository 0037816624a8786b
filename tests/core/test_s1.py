"""S1 and always-on rules as Hypothesis properties over arbitrary inputs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from yeto_core.records import Action, LifecycleState
from yeto_core.trainer.s1 import (
    AlwaysOnScheduler,
    S1Scheduler,
    SchedulerInputs,
    always_on_decide,
    q_on,
    resolve_start_seconds,
    s1_decide,
)

S = LifecycleState

inputs = st.builds(
    SchedulerInputs,
    now=st.floats(0, 1e6),
    state=st.sampled_from(list(S)),
    backlog_groups=st.integers(0, 200),
    backlog_samples=st.integers(0, 2000),
    groups_per_round=st.integers(1, 16),
    a_hard=st.integers(0, 8),
    start_s=st.floats(0, 600),
    idle_since=st.one_of(st.none(), st.floats(0, 1e6)),
    data_ended=st.booleans(),
    failures=st.integers(0, 5),
    max_failures=st.integers(1, 5),
    has_release=st.booleans(),
    first_policy_incarnation=st.booleans(),
    rounds_this_incarnation=st.integers(0, 3),
    alpha=st.one_of(st.none(), st.floats(0.01, 2)),
    round_s=st.one_of(st.none(), st.floats(0.1, 120)),
)


@given(inputs)
def test_decision_returns_its_inputs_and_q_on_is_bounded(i):
    d = s1_decide(i)
    assert d.inputs is i
    assert 1 <= d.q_on <= i.a_hard + 1
    if i.alpha is None or i.round_s is None:
        assert d.q_on == i.a_hard + 1


@given(inputs)
def test_give_up_after_max_failures(i):
    d = s1_decide(i)
    if i.failures >= i.max_failures:
        assert (d.action, d.reason) == (Action.FINISH, "gave_up")
    else:
        assert d.reason != "gave_up"


@given(inputs)
def test_finish_exactly_when_data_ended_and_less_than_one_round(i):
    d = s1_decide(i)
    if i.failures < i.max_failures:
        assert (d.action == Action.FINISH) == (i.data_ended and i.backlog_rounds < 1)


@given(inputs)
def test_start_rules(i):
    d = s1_decide(i)
    if d.action == Action.START:
        assert i.state == S.STOPPED
        assert (
            (not i.has_release)
            or i.backlog_rounds >= d.q_on
            or (i.data_ended and i.backlog_rounds >= 1)
        )
    if (
        i.state == S.STOPPED
        and i.failures < i.max_failures
        and not (i.data_ended and i.backlog_rounds < 1)
    ):
        if not i.has_release or i.backlog_rounds >= d.q_on:
            assert d.action == Action.START


@given(inputs)
def test_stop_only_when_empty_and_idle_for_start_seconds(i):
    d = s1_decide(i)
    if d.action == Action.STOP:
        assert i.state == S.READY and i.backlog_rounds < 1
        assert i.idle_since is not None and i.now - i.idle_since >= i.start_s
        assert not (i.first_policy_incarnation and i.rounds_this_incarnation == 0)
    if (
        i.state == S.READY
        and i.backlog_rounds < 1
        and not i.data_ended
        and i.failures < i.max_failures
        and i.idle_since is not None
        and i.now - i.idle_since >= i.start_s
        and not (i.first_policy_incarnation and i.rounds_this_incarnation == 0)
    ):
        assert d.action == Action.STOP


@given(inputs)
def test_never_stops_or_starts_a_busy_trainer(i):
    d = s1_decide(i)
    if i.state in (S.STARTING, S.TRAINING, S.DRAINING):
        assert d.action in (Action.HOLD, Action.FINISH)


@given(inputs)
def test_always_on_never_stops(i):
    d = always_on_decide(i)
    assert d.action != Action.STOP and d.inputs is i
    if i.state == S.STOPPED and d.action != Action.FINISH:
        assert d.action == Action.START


def test_q_on_derivation_examples():
    base = dict(
        now=0, state=S.STOPPED, backlog_groups=0, backlog_samples=0, groups_per_round=8, a_hard=4
    )
    assert q_on(SchedulerInputs(start_s=120, **base)) == 5  # A_hard + 1
    # 2 * 120 / (0.5 * 120) = 4 rounds pay a start within 1.5x.
    assert q_on(SchedulerInputs(start_s=120, alpha=0.5, round_s=120, **base)) == 4
    assert q_on(SchedulerInputs(start_s=120, alpha=0.1, round_s=20, **base)) == 5  # capped


def test_start_seconds_resolution():
    assert resolve_start_seconds(None, 300.0) == 300.0
    assert resolve_start_seconds(42.0, 300.0) == 42.0
    assert resolve_start_seconds(42.0, 300.0, fixed=90.0) == 90.0


def test_plugins_wrap_the_pure_functions():
    i = SchedulerInputs(
        now=0,
        state=S.STOPPED,
        backlog_groups=0,
        backlog_samples=0,
        groups_per_round=1,
        a_hard=1,
        start_s=1,
        has_release=False,
    )
    assert S1Scheduler().decide(i).reason == "first_policy"
    assert AlwaysOnScheduler().decide(i).reason == "always_on"
