"""On a remote store a sampler reads the backlog for its next decision while a call runs
(a thread, through a read-only copy of the buffer), so the decision itself makes no
round trip; the backlog is never understated and the cap still holds (counts only)."""

from __future__ import annotations

import threading
from typing import Any, Optional

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import RoundSpec
from yeto_core.testing.fake_backend import MemoryBuffer
from yeto_core.testing.fakes import RemoteLookingDirStore, digits_sampler


class CountingBuffer(FileSampleBuffer):
    """Counts the backlog reads made through this object (not through its copies)."""

    reads = 0

    def backlog(self, *args: Any, **kw: Any) -> Any:
        type(self).reads += 1
        return super().backlog(*args, **kw)

    def backlog_without_end(self, *args: Any, **kw: Any) -> Any:
        type(self).reads += 1
        return super().backlog_without_end(*args, **kw)

    def reader_copy(self) -> Optional[FileSampleBuffer]:
        if self.store.local_root() is not None:
            return None
        return FileSampleBuffer(self.store, prefix=self.prefix, layout=self.layout, read_only=True)


def loop_on(tmp_path, *, remote: bool = True, cap: int = 64, fresh: Optional[tuple] = None):
    store = RemoteLookingDirStore(tmp_path / "s", remote=remote)
    CountingBuffer.reads = 0
    buf = CountingBuffer(store, layout="objects", host="h")
    loop = digits_sampler(buf, backlog_cap=cap, fresh_only=fresh, share_of=1)
    return store, buf, loop


def test_the_next_decision_uses_the_backlog_read_during_the_call(tmp_path):
    store, buf, loop = loop_on(tmp_path)
    room, why = loop.claim_room()  # the first decision reads the backlog itself
    assert room == 4 and why == {"backlog_groups": 0} and CountingBuffer.reads == 1
    assert len(loop.run_round()) == 4
    room, why = loop.claim_room()
    assert CountingBuffer.reads == 1  # no read of its own
    assert why["read_ahead"] is True
    # read before or after this call's append, plus this call's 4: never less than there
    assert why["backlog_groups"] in (4, 8) and room == 4


def test_at_the_cap_the_loop_reads_the_backlog_itself_and_waits(tmp_path):
    store, buf, loop = loop_on(tmp_path, cap=8)
    real = loop._read_backlog_ahead

    def read_before_the_append(appending: int) -> None:
        # the read-ahead lands before the call's append (else it may count the call's
        # groups twice, never too few: the room below would then depend on the race)
        real(appending)
        assert loop._backlog_ahead is not None
        loop._backlog_ahead[0].result()

    loop._read_backlog_ahead = read_before_the_append  # type: ignore[method-assign]
    loop.claim_room()
    loop.run_round()
    assert loop.claim_room()[0] == 4
    loop.run_round()  # 8 groups wait: the cap
    room, why = loop.claim_room()
    assert room == 0 and why["read_ahead"] is True and why["backlog_groups"] >= 8
    reads = CountingBuffer.reads
    room, why = loop.claim_room()  # waiting: each next decision reads the store
    assert room == 0 and CountingBuffer.reads == reads + 1 and "read_ahead" not in why
    trainer = FileSampleBuffer(store, layout="objects", host="trainer")
    trainer.commit(trainer.select(RoundSpec(max_groups=8, current_version=0, max_policy_age=9)))
    room, why = loop.claim_room()
    assert room == 4 and why == {"backlog_groups": 0}


def test_fresh_only_decisions_use_the_read_ahead_too(tmp_path):
    # gate 0, rounds of 6: the first read leaves room for one call only (no skipped read)
    store, buf, loop = loop_on(tmp_path, fresh=(0, 6))
    assert loop.claim_room()[0] == 6 and loop.call_size == 4
    loop.run_round()
    room, why = loop.claim_room()
    assert why.get("read_ahead") is True and why["backlog_groups"] >= 4
    assert room == (2 if why["backlog_groups"] == 4 else 0)


def test_on_a_local_store_every_decision_reads_the_backlog(tmp_path):
    store, buf, loop = loop_on(tmp_path, remote=False)
    assert FileSampleBuffer(store, layout="objects").reader_copy() is None
    loop.claim_room()
    loop.run_round()  # its thread finds the buffer offers no copy
    room, why = loop.claim_room()
    assert CountingBuffer.reads == 2 and "read_ahead" not in why
    loop.run_round()
    assert loop._backlog_ahead is None  # no thread again
    loop.claim_room()
    assert CountingBuffer.reads == 3


class HeldLandings(MemoryBuffer):
    """A remote-looking in-memory buffer: reads through a copy (itself), and each host's
    group commits land only when the test lets that host's commit through."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, threading.Event] = {}

    def reader_copy(self) -> HeldLandings:
        return self

    def append_many(self, groups):
        host = groups[0].sampler_host
        assert self.gates.setdefault(host, threading.Event()).wait(10)
        self.gates[host].clear()
        return [self.append(g) for g in groups]


def test_overlapped_islands_count_the_other_islands_commits_in_flight():
    """Two islands on a remote store (reads ahead, commits overlapped), each call's commit
    landing while the other island's next call generates, as on SeaweedFS + 20 ms. The
    trainer is stopped (R == v), so the fresh bound is S1's start threshold. A read made
    as a call starts misses the other island's commit in flight and its next call: counted
    as one call, the islands went past the bound (and on a running trainer those groups
    age out: stale)."""
    age, per_round, per_call = 2, 8, 4
    bound = (age + 1) * per_round
    buf = HeldLandings()
    loops = []
    for h in ("a", "b"):
        loops.append(
            digits_sampler(
                buf,
                host=h,
                prompts_per_call=per_call,
                fresh_only=(age, per_round),
                share_of=2,
                overlap_append=True,
            )
        )
    buf.gates = {h: threading.Event() for h in ("a", "b")}

    def start_call(loop) -> bool:
        if loop.claim_room()[0] <= 0:
            return False
        loop.run_round()  # its read ahead starts, its commit waits at the gate
        if loop._backlog_ahead is not None:
            loop._backlog_ahead[0].result()  # the read is made as the call starts
        return True

    def land(loop) -> None:
        if loop._landing is not None:
            buf.gates[loop.host].set()
            loop.flush()

    a, b = loops
    calls = 0
    for _ in range(12):  # a's commit lands after b's next call started, and b's after a's
        calls += start_call(a)
        land(b)
        calls += start_call(b)
        land(a)
    land(b)
    assert calls >= 4 and len(buf.groups) >= bound - per_call  # sampled up to about the bound
    assert len(buf.groups) <= bound + 1, f"{len(buf.groups)} groups past the bound {bound}"
