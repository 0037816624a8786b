"""Hypothesis state machine of the buffer: append / select+commit / reset_to / reopen.

Invariants checked against a model (the ordered, deduplicated group ids):
- positions are dense and match the model; a repeated id returns its first position;
- no position is consumed twice within a lineage (between resets);
- the watermark only moves forward between resets;
- a stale group is never returned as trainable, a trainable one is never too old;
- a reopened buffer (a new process) sees the same head, watermark and backlog;
- group commits (``append_many``), also by a second appender with a stale view of the
  index, keep all of the above (layout ``objects``: one index object per call).
"""

from __future__ import annotations

import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import RoundSpec, SampleGroup
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.groups import build_group


def _group(gid: str, version: int) -> SampleGroup:
    return build_group(gid, n=1, version=version, prompt_id="p", n_prompt=1, rewards=[0.0])


class BufferMachine(RuleBasedStateMachine):
    layout = "jsonl"

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="yeto-buffer-sm-")
        self.store = DirStore(self.dir, fsync=False)
        self.buf = FileSampleBuffer(self.store, layout=self.layout)
        self.ids: list[str] = []
        self.versions: list[int] = []
        self.watermark = 0
        self.consumed_in_lineage: set[int] = set()
        self.second: FileSampleBuffer | None = None  # another appender (append_many)

    def teardown(self) -> None:
        self.buf.close()
        if self.second is not None:
            self.second.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(n=st.integers(0, 12), version=st.integers(0, 6))
    def append(self, n: int, version: int) -> None:
        gid = f"g{n}"
        pos = self.buf.append(_group(gid, version))
        if gid in self.ids:
            assert pos == self.ids.index(gid)
        else:
            assert pos == len(self.ids)
            self.ids.append(gid)
            self.versions.append(version)

    @rule(
        ns=st.lists(st.integers(0, 12), max_size=5),
        version=st.integers(0, 6),
        second=st.booleans(),
    )
    def append_many(self, ns: list[int], version: int, second: bool) -> None:
        """A sampler call (group commit), by this buffer or by a second appender whose
        view of the index may be stale (another process on the same store)."""
        if second and self.second is None:
            self.second = FileSampleBuffer(self.store, layout=self.layout)
        buf = self.second if second and self.second is not None else self.buf
        positions = buf.append_many([_group(f"g{n}", version) for n in ns])
        for n, pos in zip(ns, positions, strict=True):
            gid = f"g{n}"
            if gid not in self.ids:
                self.ids.append(gid)
                self.versions.append(version)
            assert pos == self.ids.index(gid)

    @rule(max_groups=st.integers(0, 5), current=st.integers(0, 8), age=st.integers(0, 3))
    def select_and_commit(self, max_groups: int, current: int, age: int) -> None:
        r = self.buf.select(RoundSpec(max_groups, current, age))
        assert r.start == self.watermark
        assert len(r.entries) <= max_groups
        span = list(range(r.start, r.end))
        got = sorted([e.position for e in r.entries] + [e.position for e in r.stale])
        assert got == span  # whole span accounted for, in order, nothing skipped silently
        for e in r.entries:
            assert current - self.versions[e.position] <= age
            assert e.group_id == self.ids[e.position]
        for e in r.stale:
            assert current - self.versions[e.position] > age
        assert not (set(span) & self.consumed_in_lineage)
        new = self.buf.commit(r)
        assert new == r.end >= self.watermark
        self.consumed_in_lineage |= set(span)
        self.watermark = new

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def reset_to(self, data: st.DataObject) -> None:
        w = data.draw(st.integers(0, len(self.ids)))
        self.buf.reset_to(w)
        self.watermark = w
        self.consumed_in_lineage = set()

    @rule()
    def reopen(self) -> None:
        self.buf.close()
        self.buf = FileSampleBuffer(self.store, layout=self.layout)

    @invariant()
    def agrees_with_model(self) -> None:
        b = self.buf.backlog()
        assert b.head_position == len(self.ids)
        assert b.watermark == self.watermark
        assert b.groups == len(self.ids) - self.watermark
        other = FileSampleBuffer(self.store, layout=self.layout, read_only=True)
        assert other.backlog() == b
        other.close()


class ObjectsBufferMachine(BufferMachine):
    layout = "objects"


TestJsonlBuffer = BufferMachine.TestCase
TestJsonlBuffer.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestObjectsBuffer = ObjectsBufferMachine.TestCase
TestObjectsBuffer.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
