"""The backlog the head's scheduler decides on leaves out fenced sampler incarnations'
groups (the trainer skips them: a start for them trains nothing), except after the data
end, when every group must be trained or skipped."""

from __future__ import annotations

from pathlib import Path

from yeto_core.buffer.fences import StoreFences, write_fence
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.head.run import HEAD_FENCES_REFRESH_S
from yeto_core.records import LifecycleState, SchedulerInputs
from yeto_core.testing.fake_run import fake_head, fake_run_config
from yeto_core.testing.groups import build_group
from yeto_core.trainer.s1 import s1_decide


def _append(head, host: str, incarnation: int, n: int, start: int = 0) -> None:
    buf = FileSampleBuffer(head.store, host=host)
    for i in range(start, start + n):
        buf.append(build_group(f"{host}-{incarnation}-{i}", host=host, incarnation=incarnation))
    buf.close()


def test_fenced_groups_do_not_count_until_the_data_end(tmp_path: Path) -> None:
    head = fake_head(fake_run_config(tmp_path))  # groups_per_round 2
    _append(head, "sampler-0", 0, 6)  # the lost incarnation's groups
    _append(head, "sampler-1", 0, 1)
    assert head.backlog_for_scheduler().groups == 7
    # the head fences the lost incarnation (as replace_lost does): known at once
    write_fence(head.store, "sampler-0", 0, at=0.0, handle="h0")
    head.fences.add("sampler-0", 0)
    b = head.backlog_for_scheduler()
    assert b.groups == 1 and not b.data_ended
    # the replacement incarnation's groups count again
    _append(head, "sampler-0", 1, 2)
    assert head.backlog_for_scheduler().groups == 3
    # after the data end every group is trained or skipped: the fenced ones count, and
    # the short last round is a whole one (9 groups: 5 rounds of 2)
    FileSampleBuffer(head.store, host="sampler-1").mark_data_end()
    b = head.backlog_for_scheduler()
    assert b.data_ended and b.groups == 10


def test_a_previous_heads_fences_are_found_by_the_listing(tmp_path: Path) -> None:
    config = fake_run_config(tmp_path)
    head = fake_head(config)
    _append(head, "sampler-0", 3, 4)
    write_fence(head.store, "sampler-0", 3, at=0.0, handle="old")  # by an earlier head
    assert head.backlog_for_scheduler().groups == 0
    assert head.fences.refresh_s == HEAD_FENCES_REFRESH_S


def test_fences_added_are_kept_across_listings(tmp_path: Path) -> None:
    head = fake_head(fake_run_config(tmp_path))
    clock = [0.0]
    fences = StoreFences(head.store, refresh_s=1.0, clock=lambda: clock[0])
    fences.add("sampler-1", 2)  # written by this process; a listing may lag behind it
    assert fences("sampler-0", 0) is False  # the first call lists (nothing there)
    clock[0] = 5.0
    assert fences("sampler-0", 0) is False  # listed again
    assert fences("sampler-1", 2) is True


def test_s1_does_not_start_the_trainer_for_fenced_groups(tmp_path: Path) -> None:
    head = fake_head(fake_run_config(tmp_path))
    _append(head, "sampler-0", 0, 40)
    write_fence(head.store, "sampler-0", 0, at=0.0, handle="h0")
    head.fences.add("sampler-0", 0)

    def decide(groups: int) -> str:
        inputs = SchedulerInputs(
            now=0.0,
            state=LifecycleState.STOPPED,
            backlog_groups=groups,
            backlog_samples=2 * groups,
            groups_per_round=2,
            a_hard=3,
            start_s=1.0,
        )
        return s1_decide(inputs).reason

    assert decide(40) == "backlog"  # what the 40 groups would have started
    assert decide(head.backlog_for_scheduler().groups) == "wait_backlog"
