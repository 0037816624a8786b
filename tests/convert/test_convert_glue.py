"""The head's glue: the converting lifecycle (start = to_trainer, release = to_sampler)
and the gate around S1 (yeto_core.conversion.head), with in-memory parts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import attrs
import pytest

from yeto_core.conversion.convertible import SAMPLER, NodeView
from yeto_core.conversion.head import ConversionGate, ConvertingLifecycle
from yeto_core.conversion.local import LocalConversion, SlotOps
from yeto_core.records import Action, LifecycleState, SchedulerInputs
from yeto_core.stores.dir_store import DirStore
from yeto_core.trainer.loop import Journal
from yeto_core.trainer.s1 import S1Scheduler

S = LifecycleState


class Inner:
    """A trainer lifecycle double: ``fail_start`` makes the start raise (FAILED)."""

    def __init__(self, fail_start: bool = False) -> None:
        self.fail_start, self._state, self.calls = fail_start, S.STOPPED, []
        self.start_seconds: Optional[float] = 2.0
        self.handle: Optional[str] = "trainer-i0"

    def start(self, incarnation: int, cut: Any = None) -> None:
        self.calls.append(("start", incarnation))
        if self.fail_start:
            self._state = S.FAILED
            raise RuntimeError("the trainer island did not start")
        self._state = S.READY

    def state(self) -> LifecycleState:
        return self._state

    def release(self) -> None:
        self.calls.append(("release",))
        self._state = S.STOPPED


class Ops(SlotOps):
    def __init__(self, lifecycle: list) -> None:
        self.lifecycle, self.calls = lifecycle, []

    def drain_sampler(self, node: str) -> dict:
        self.calls.append(("drain", node))
        return {"handle": node, "finished": 1, "abandoned": 0}

    def start_trainer(self, node: str) -> Optional[str]:
        return self.lifecycle[0].start_trainer()

    def launch_sampler(self, node: str) -> Optional[str]:
        self.calls.append(("launch", node))
        return f"{node}-i1"


def _bound(tmp_path: Path, inner: Inner) -> tuple[ConvertingLifecycle, LocalConversion, Ops]:
    port, holder = LocalConversion(), []
    ops = Ops(holder)
    life = ConvertingLifecycle(inner, port, lambda: "flex-0", clock=lambda: 0.0)  # type: ignore[arg-type]
    holder.append(life)
    port.bind(ops, DirStore(tmp_path, fsync=False), ["flex-0"])
    return life, port, ops


def test_a_start_converts_the_node_and_a_release_gives_it_back(tmp_path: Path) -> None:
    inner = Inner()
    life, port, ops = _bound(tmp_path, inner)
    life.start(4)
    assert life.node == "flex-0" and port.role("flex-0") == "trainer"
    assert inner.calls == [("start", 4)] and ops.calls == [("drain", "flex-0")]
    assert life.start_seconds == 2.0  # the drain (0 s here) plus the trainer start
    life.release()  # after the drain's cut
    assert port.role("flex-0") == "sampler" and life.node is None
    assert ops.calls[-1] == ("launch", "flex-0")


def test_a_failed_trainer_start_gives_the_slot_back_at_once(tmp_path: Path) -> None:
    inner = Inner(fail_start=True)
    life, port, ops = _bound(tmp_path, inner)
    with pytest.raises(RuntimeError, match="did not start"):
        life.start(0)
    assert port.role("flex-0") == "sampler" and ops.calls[-1] == ("launch", "flex-0")
    life.release()  # the loop releases the FAILED incarnation: no second launch
    assert [c for c in ops.calls if c[0] == "launch"] == [("launch", "flex-0")]


def _inputs(state: LifecycleState, backlog: int, **kw: Any) -> SchedulerInputs:
    base = dict(
        now=10.0,
        state=state,
        backlog_groups=backlog,
        backlog_samples=backlog,
        groups_per_round=4,
        a_hard=2,
        start_s=5.0,
        idle_since=None,
        data_ended=False,
        failures=0,
        max_failures=3,
        has_release=True,
        first_policy_incarnation=False,
        rounds_this_incarnation=1,
        alpha=None,
        round_s=None,
    )
    base.update(kw)
    return SchedulerInputs(**base)


def test_the_gate_turns_s1_into_conversions_and_journals_each_new_decision(
    tmp_path: Path,
) -> None:
    port = LocalConversion()
    port.bind(Ops([]), DirStore(tmp_path, fsync=False), ["flex-0"])
    nodes = [
        NodeView("sampler-0", SAMPLER, False, 1.0, in_flight=1),
        NodeView("flex-0", SAMPLER, True, 1.0, in_flight=1),
    ]
    journal = Journal(None)
    emitted: list = []
    gate = ConversionGate(
        S1Scheduler(),
        port,
        lambda: (0, tuple(nodes)),
        journal,
        trainer_node=lambda: None,
        emit=emitted.append,
    )
    d = gate.decide(_inputs(S.STOPPED, 12))  # 3 rounds = Q_on: S1 starts
    assert (d.action, gate.take_node(), gate.take_node()) == (Action.START, "flex-0", None)
    nodes[0] = attrs.evolve(nodes[0], role="idle")  # flex-0 would be the last sampler
    d = gate.decide(_inputs(S.STOPPED, 12))
    assert (d.action, d.reason) == (Action.HOLD, "conversion_guard_pool_minimum")
    gate.decide(_inputs(S.STOPPED, 12))  # the same decision again: not journaled again
    recs = journal.read()
    assert [(r["action"], r["reason"]) for r in recs] == [
        ("to_trainer", "scheduler_backlog"),
        ("hold", "guard_pool_minimum"),
    ]
    assert recs[0]["inputs"]["backlog_groups"] == 12 and recs[0]["ranking"] == ["flex-0"]
    assert len(emitted) == 2
