"""The ``local`` conversion port: one fixed call order, journaled; a crash at any step
leaves a known state that the next head resolves from the journal."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest

from yeto_core.conversion.local import (
    TO_SAMPLER_STEPS,
    TO_TRAINER_STEPS,
    LocalConversion,
    SlotOps,
)
from yeto_core.errors import YetoError
from yeto_core.stores.dir_store import DirStore

NODES = ["flex-0", "flex-1"]


class Crash(BaseException):
    """The head process dies here (nothing after it runs)."""


class Ops(SlotOps):
    """Slot operations that record what they did; ``crash_in`` dies inside one of them."""

    def __init__(self, crash_in: Optional[str] = None, fail_in: Optional[str] = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.crash_in, self.fail_in = crash_in, fail_in
        self.samplers = set(NODES)
        self.trainer: Optional[str] = None

    def _maybe(self, what: str) -> None:
        if self.crash_in == what:
            raise Crash(what)
        if self.fail_in == what:
            raise RuntimeError(f"{what} failed")

    def drain_sampler(self, node: str) -> dict[str, Any]:
        self.calls.append(("drain_sampler", node))
        self.samplers.discard(node)
        self._maybe("drain_sampler")
        return {"handle": f"h-{node}", "finished": 2, "abandoned": 1}

    def start_trainer(self, node: str) -> Optional[str]:
        self.calls.append(("start_trainer", node))
        self._maybe("start_trainer")
        self.trainer = node
        return "h-trainer"

    def launch_sampler(self, node: str) -> Optional[str]:
        self.calls.append(("launch_sampler", node))
        self._maybe("launch_sampler")
        self.samplers.add(node)
        return f"h2-{node}"


class CrashingStore(DirStore):
    """Dies right after the ``after``-th conversion journal record was written."""

    def __init__(self, root: Path, after: int) -> None:
        super().__init__(root, fsync=False)
        self.after, self.written = after, 0

    def put_if_absent(self, key: str, data: bytes) -> bool:
        ok = super().put_if_absent(key, data)
        if key.startswith("head/conversions/") and ok:
            self.written += 1
            if self.written == self.after:
                raise Crash(f"after record {self.after}")
        return ok


def _port(store, ops) -> LocalConversion:
    port = LocalConversion(min_samplers=1)
    port.bind(ops, store, NODES, clock=lambda: 1.0)
    return port


def _round_trip(port: LocalConversion) -> None:
    port.to_trainer("flex-0")
    port.to_sampler("flex-0")


def _steps(port: LocalConversion) -> list[tuple[str, str]]:
    return [(r["kind"], r.get("step", "")) for r in port.journal()]


def test_a_round_trip_takes_its_steps_in_the_one_order(tmp_path: Path) -> None:
    ops = Ops()
    port = _port(DirStore(tmp_path, fsync=False), ops)
    assert port.capacity() == 1  # two sampling nodes, minimum one
    port.to_trainer("flex-0")
    assert port.role("flex-0") == "trainer" and port.capacity() == 0
    assert ops.calls == [("drain_sampler", "flex-0"), ("start_trainer", "flex-0")]
    port.to_sampler("flex-0")
    assert ops.calls[-1] == ("launch_sampler", "flex-0")
    assert _steps(port) == [("to_trainer", s) for s in TO_TRAINER_STEPS] + [
        ("to_sampler", s) for s in TO_SAMPLER_STEPS
    ]
    assert (port.finished_groups, port.abandoned_groups) == (2, 1)
    assert port.last_s["to_trainer"] is not None and port.conversion_seconds() >= 0


def test_refusals_name_the_node_and_its_role(tmp_path: Path) -> None:
    port = _port(DirStore(tmp_path, fsync=False), Ops())
    with pytest.raises(YetoError, match="not a convertible node"):
        port.to_trainer("fixed-0")
    with pytest.raises(YetoError, match="in the sampler role"):
        port.to_sampler("flex-0")
    port.to_trainer("flex-0")
    with pytest.raises(YetoError, match="'flex-0' is the trainer"):
        port.to_trainer("flex-1")
    with pytest.raises(YetoError, match="not bound"):
        LocalConversion().to_trainer("flex-0")
    with pytest.raises(YetoError, match="min_samplers"):
        LocalConversion(min_samplers=0)


N_RECORDS = len(TO_TRAINER_STEPS) + len(TO_SAMPLER_STEPS)


@pytest.mark.parametrize("after", range(1, N_RECORDS + 1))
def test_a_head_that_dies_after_any_journal_record_is_resolved_by_the_next(
    tmp_path: Path, after: int
) -> None:
    store = CrashingStore(tmp_path, after)
    port = _port(store, Ops())
    with pytest.raises(Crash):
        _round_trip(port)
    # the next head: every island of the dead head was released before it binds
    store.after = -1
    again = LocalConversion()
    resolved = again.bind(Ops(), store, NODES, clock=lambda: 2.0)
    done = after == N_RECORDS
    assert len(resolved) == (0 if done else 1)
    if not done:
        last = port.journal()[after - 1]
        assert resolved[0]["node"] == "flex-0"
        assert resolved[0]["left_at"] == {"kind": last["kind"], "step": last["step"]}
    assert again.roles == {"flex-0": "sampler", "flex-1": "sampler"}
    # and the slot converts again, in order, with a new conversion number
    _round_trip(again)
    tail = again.journal()[-N_RECORDS:]
    assert [(r["kind"], r["step"]) for r in tail] == [
        ("to_trainer", s) for s in TO_TRAINER_STEPS
    ] + [("to_sampler", s) for s in TO_SAMPLER_STEPS]
    before = {r["conversion"] for r in again.journal()[:-N_RECORDS]}
    assert min(r["conversion"] for r in tail) > max(before)  # never a number twice
    # a third head finds nothing to resolve
    assert LocalConversion().bind(Ops(), store, NODES) == []


@pytest.mark.parametrize("where", ["drain_sampler", "start_trainer", "launch_sampler"])
def test_a_head_that_dies_inside_a_step_is_resolved_too(tmp_path: Path, where: str) -> None:
    store = DirStore(tmp_path, fsync=False)
    port = _port(store, Ops(crash_in=where))
    with pytest.raises(Crash):
        _round_trip(port)
    resolved = LocalConversion().bind(Ops(), store, NODES)
    assert [r["node"] for r in resolved] == ["flex-0"]
    step = {"drain_sampler": "begin", "start_trainer": "sampler_released"}.get(where, "begin")
    assert resolved[0]["left_at"] == {
        "kind": "to_sampler" if where == "launch_sampler" else "to_trainer",
        "step": step,
    }


def test_a_step_that_fails_leaves_the_slot_idle_and_says_which(tmp_path: Path) -> None:
    store = DirStore(tmp_path, fsync=False)
    ops = Ops(fail_in="start_trainer")
    port = _port(store, ops)
    with pytest.raises(RuntimeError):
        port.to_trainer("flex-0")
    assert port.role("flex-0") == "idle" and port.last_failure == "trainer_started"
    failed = port.journal()[-1]
    assert failed["step"] == "failed" and failed["failed_step"] == "trainer_started"
    ops.fail_in = None
    port.to_sampler("flex-0")  # the sampler was verified gone: the slot samples again
    assert port.role("flex-0") == "sampler"
    assert LocalConversion().bind(Ops(), store, NODES) == []
