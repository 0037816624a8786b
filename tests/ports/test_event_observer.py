"""``yeto_event`` fires for every event of every stream, in every process of a run.

The example plugin's observer (``examples/third_party_plugin``) appends each event
it sees to the file ``YETO_EXAMPLE_EVENTS`` names. A fake run (fake sampler
islands, the real trainer island with the fake backend) with that plugin in the
head's plugin manager and installed for the islands must leave in that file
every event of every stream the store holds (head, trainer, samplers) and the
head's journal, each seen in the process that emitted it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

yeto_example_memory = pytest.importorskip("yeto_example_memory")

from yeto_core.events.stream import read_all  # noqa: E402
from yeto_core.head.run import EXIT_OK  # noqa: E402
from yeto_core.testing.fake_island import plugins_with_fakes  # noqa: E402
from yeto_core.testing.fake_run import fake_head, fake_run_config  # noqa: E402


def test_every_event_of_every_stream_reaches_the_observer(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("YETO_EXAMPLE_EVENTS", str(log))
    config = fake_run_config(tmp_path, total_rounds=3)
    plugins = plugins_with_fakes(entry_points=False)
    plugins.add(yeto_example_memory, "example-memory")
    head = fake_head(config, plugins)
    assert head.run(lambda m: None) == EXIT_OK

    seen = [json.loads(line) for line in log.read_text().splitlines()]
    observed = {(e["source"], e["kind"], e["time"]) for e in seen}
    streams = read_all(head.store)
    # both samplers run, but on a loaded machine the three rounds can be filled by one of them
    # before the other's first event is flushed: at least one sampler's stream is required
    samplers = sorted(s for s in streams if s.startswith("sampler-"))
    assert {"head", "trainer"} <= set(streams) and samplers, set(streams)
    for island, events in streams.items():
        assert events, island
        for e in events:
            assert (e.source, e.kind, e.time) in observed, (island, e.kind)
    journal = {e["kind"] for e in seen if e["kind"].startswith("head_")}
    assert {"head_decision", "head_start", "head_started"} <= journal
    pids = {e["source"]: e["pid"] for e in seen}
    assert pids["head"] == os.getpid()
    assert pids["trainer"] != os.getpid()
    assert all(pids[s] != os.getpid() for s in samplers)
