"""The head's store requests per tick: its housekeeping shares reads with the scheduler.

Counts, never timings: the head is built in this process (nothing launched) and the
backlog reads of its buffer are counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from yeto_core.config.load import parse_config
from yeto_core.head import trainer as head_trainer
from yeto_core.head.run import Head
from yeto_core.plugins import Plugins
from yeto_core.testing.fakes import ScriptIslands


def _head(tmp_path: Path) -> tuple[Head, list[dict[str, Any]]]:
    config = parse_config(
        {
            "name": "head-requests",
            "run_dir": str(tmp_path / "run"),
            "model": {"path": str(tmp_path / "model")},
            "task": {"name": "sort4"},
            "samplers": [{"name": "node", "engine": "hf", "count": 2}],
            "trainer": {"backend": "torch"},
        }
    )
    head = Head(config, Plugins(), provider=ScriptIslands(tmp_path / "none.py"))
    reads: list[dict[str, Any]] = []
    real = head.buffer.backlog

    def counted(*args: Any, **kw: Any) -> Any:
        reads.append(kw)
        return real(*args, **kw)

    head.buffer.backlog = counted  # type: ignore[method-assign]
    return head, reads


def test_the_housekeeping_tick_and_the_scheduler_share_one_backlog_read(tmp_path):
    head, reads = _head(tmp_path)
    status = head.status()  # the housekeeping tick (status.json)
    b = head.backlog_for_scheduler()  # the trainer tick right after it
    assert len(reads) == 1 and reads[0]["fenced"] is head.fences  # as the scheduler counts
    assert (status["backlog_groups"], status["watermark"]) == (b.groups, b.watermark)
    head.backlog_for_scheduler()  # no housekeeping since: a read of its own
    assert len(reads) == 2


def test_an_old_housekeeping_read_is_not_used(tmp_path, monkeypatch):
    head, reads = _head(tmp_path)
    head.status()
    monkeypatch.setattr(head_trainer, "BACKLOG_REUSE_S", -1.0)  # the read is too old
    head.backlog_for_scheduler()
    assert len(reads) == 2
