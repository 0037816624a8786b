"""The store dispenser: exclusive claims under concurrent claimers, re-dispense after a crash
between claim and ack, after a fence, a give-back and an expired lease, and exactly-once
groups in the real buffer (dedup by dispense position)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

from yeto_core.buffer.dispenser import CLAIMS, StoreDispenser, claim_key, dispense_report, mark_gone
from yeto_core.buffer.fences import write_fence
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import Sample, SampleGroup, SamplingParams
from yeto_core.sampler.loop import SamplerLoop
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fakes import DigitsTask, WeightFileEngine


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _disp(store, island, inc, **kw):
    kw.setdefault("range_size", 4)
    return StoreDispenser(store, island=island, incarnation=inc, **kw)


def test_concurrent_claimers_get_disjoint_ranges(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "s")
    taken: dict[str, list[int]] = {}
    barrier = threading.Barrier(8)

    def claimer(name: str) -> None:
        d = _disp(store, name, 0, range_size=3)
        barrier.wait()
        got = []
        for _ in range(20):
            slots = d.take(2)
            got.extend(s.position for s in slots)
            d.done(slots)
        taken[name] = got

    threads = [threading.Thread(target=claimer, args=(f"h{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    every = [p for got in taken.values() for p in got]
    assert len(every) == 8 * 40
    assert len(set(every)) == len(every), "a position was dispensed twice"
    # each claimer holds at most one partly used range: the union is nearly dense
    assert max(every) < len(every) + 8 * 3
    rep = dispense_report(store)
    assert rep["double_holds"] == 0 and rep["redispensed"] == {}


CLAIMER = """
import json, sys
from pathlib import Path
from yeto_core.buffer.dispenser import StoreDispenser
from yeto_core.stores.dir_store import DirStore
root, name, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
d = StoreDispenser(DirStore(root), island=name, incarnation=0, range_size=2)
got = []
for _ in range(n):
    slots = d.take(1)
    got.extend(s.position for s in slots)
    d.done(slots)
Path(out).write_text(json.dumps(got))
"""


def test_concurrent_claimer_processes_get_disjoint_ranges(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    DirStore(root)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, root, f"p{i}", "30", str(tmp_path / f"{i}.json")]
        )
        for i in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    every = [x for i in range(4) for x in json.loads((tmp_path / f"{i}.json").read_text())]
    assert len(every) == 120 and len(set(every)) == 120
    assert dispense_report(DirStore(root))["double_holds"] == 0


def test_crash_between_claim_and_ack_is_redispensed_to_the_replacement(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "s")
    first = _disp(store, "node-0", 0)
    slots = first.take(2)  # claimed range 0 (positions 0..3); crashed before the ack
    assert [s.position for s in slots] == [0, 1]
    other = _disp(store, "node-1", 0)
    # another island does not take a live holder's range
    assert [s.position for s in other.take(4)] == [4, 5, 6, 7]
    # a replacement started while its predecessor still runs takes nothing of it
    early = _disp(store, "node-0", 1)
    assert [s.position for s in early.take(4)] == [8, 9, 10, 11]
    mark_gone(store, "node-0", 0)  # the head verified the crashed incarnation gone
    nxt = _disp(store, "node-0", 2)
    got = nxt.take(4)
    assert [s.position for s in got] == [0, 1, 2, 3] and got[0].gen == 1
    nxt.done(got)
    assert store.exists("dispense/acks/000000000000.json")
    body = json.loads(store.get(claim_key(0, 1)))
    assert body["adopted_from"] == {
        "island": "node-0",
        "incarnation": 0,
        "gen": 0,
        "why": "gone",
    }
    assert dispense_report(store)["redispensed"] == {"gone": 1}


def test_fenced_released_and_expired_claims_are_redispensed(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "s")
    clock = Clock()
    a = _disp(store, "a-0", 0, clock=clock, lease_s=60)
    b = _disp(store, "b-0", 0, clock=clock, lease_s=60)
    c = _disp(store, "c-0", 0, clock=clock, lease_s=60)
    a.take(1), b.take(1), c.take(1)  # ranges 0, 1, 2
    write_fence(store, "a-0", 0)
    b.close()  # b stops: gives range 1 back
    clock.t += 61  # c's lease passes
    taker = _disp(store, "z-0", 0, clock=clock, lease_s=60)
    got = taker.take(12)
    assert sorted({s.range for s in got}) == [0, 1, 2]
    why = {
        s.range: json.loads(store.get(claim_key(s.range, 1)))["adopted_from"]["why"] for s in got
    }
    assert why == {0: "fenced", 1: "released", 2: "lease_expired"}
    assert dispense_report(store)["double_holds"] == 0


def test_a_live_claim_is_never_taken_twice(tmp_path: Path) -> None:
    """Without a reason (fence, successor, give-back, lease) a range is never re-dispensed."""
    store = DirStore(tmp_path / "s")
    clock = Clock()
    a = _disp(store, "a-0", 0, clock=clock, lease_s=60)
    a.take(1)
    clock.t += 59
    taker = _disp(store, "z-0", 0, clock=clock, lease_s=60)
    assert {s.range for s in taker.take(8)} == {1, 2}
    assert sorted(store.list(CLAIMS)) == [claim_key(r, 0) for r in range(3)]


def test_epoch_wrap_gives_a_repeated_row_its_own_prompt_id(tmp_path: Path) -> None:
    d = _disp(DirStore(tmp_path / "s"), "h-0", 0, rows=3)
    slots = d.take(7)
    assert [s.row for s in slots] == [0, 1, 2, 0, 1, 2, 0]
    ids = [s.prompt_id("t") for s in slots]
    assert ids[:3] == ["t:0", "t:1", "t:2"] and ids[3] == "t:0-p3"
    assert len(set(ids)) == 7
    assert len({s.group_id("t") for s in slots}) == 7


def _group(gid: str, host: str, inc: int) -> SampleGroup:
    s = Sample(
        tokens=np.array([1, 2], dtype=np.int64),
        prompt_len=1,
        logprobs=np.zeros(1, dtype=np.float32),
        loss_mask=np.ones(1, dtype=np.float32),
        reward=1.0,
        weight_version=0,
    )
    return SampleGroup(gid, "t:0", host, inc, (s, s))


def test_sampler_loop_with_a_dispenser_appends_each_position_once(tmp_path: Path) -> None:
    """A crash after some appends and before the ack: the replacement re-samples the range,
    the buffer keeps one group per dispense position (dedup), nothing is lost."""
    store = DirStore(tmp_path / "s")

    def loop(inc: int) -> SamplerLoop:
        buf = FileSampleBuffer(store, host="node-0")
        return SamplerLoop(
            buf,
            WeightFileEngine(),
            DigitsTask(),
            host="node-0",
            incarnation=inc,
            task_name="digits",
            group_size=2,
            prompts_per_call=4,
            sampling=SamplingParams(max_new_tokens=2),
            dispenser=_disp(store, "node-0", inc, range_size=4),
        )

    first = loop(0)
    first.run(max_rounds=2)
    mark_gone(store, "node-0", 0)  # what the head writes after the verified release
    # crash of incarnation 0 mid-range: two groups of range 2 appended, no ack
    slots = first.dispenser.take(4)
    for s in slots[:2]:
        first.buffer.append(_group(s.group_id("digits"), "node-0", 0))
    second = loop(1)
    second.run(max_rounds=2)
    entries = FileSampleBuffer(store, host="check", read_only=True).entries(0)
    gids = [e.group_id for e in entries]
    assert len(gids) == len(set(gids)) == 16
    assert sorted(int(g.rsplit("-d", 1)[1]) for g in gids) == list(range(16))
    rep = dispense_report(store)
    assert rep["unacked"] == [] and rep["redispensed"] == {"gone": 1}
