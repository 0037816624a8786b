"""An asynchronous run held to ``max_policy_age = 0`` trains what a synchronous one does.

Two real runs (`yeto run up`: head, one `hf` sampler island, the `torch` trainer island,
a `dir` store) on the same seed and base: one with ``sync_rounds`` (call n waits for policy
version n), one asynchronous with the policy-age gate at 0 and ``fresh_only`` (the island
samples only what the trainer can still train). For every policy version both runs reach,
the groups (ids and payload digests), the ledger's rounds, every round's metrics (loss,
gradient norm, ...) and the released weights are bitwise equal. The runs stop at the
``total_rounds`` target the head notices on a tick, then drain what was already sampled,
so they may end a few rounds apart: only the common versions are compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from yeto_core.testing.streams import stream_events

ROOT = Path(__file__).resolve().parents[2]
YETO = [sys.executable, "-c", "from yeto_core.cli import main; main()"]
ROUNDS = 6

CONFIG = """
name = "staleness-zero-{mode}"
run_dir = "{run_dir}"
seed = 3

[model]
path = "{base}"

[task]
name = "sort4"

[[samplers]]
name = "sampler"
engine = "hf"
count = 1
group_size = 4
prompts_per_call = 4
backlog_cap = 8
{mode_line}
engine_options = {{ threads = 1 }}
[samplers.sampling]
max_new_tokens = 6
temperature = 1.0
top_k = 6
top_p = 0.9

[trainer]
backend = "torch"
backend_options = {{ lr = 0.0002, threads = 1 }}
groups_per_round = 4
max_policy_age = 0
total_rounds = {rounds}

[scheduler]
name = "always-on"
tick_s = 0.1

[backstops]
wall_clock_s = 400
silence_s = 120
"""


def _run(tmp_path: Path, base: Path, mode: str) -> Path:
    run_dir = tmp_path / mode
    line = "sync_rounds = true" if mode == "sync" else "fresh_only = true"
    config = tmp_path / f"{mode}.toml"
    config.write_text(
        CONFIG.format(mode=mode, run_dir=run_dir, base=base, mode_line=line, rounds=ROUNDS)
    )
    proc = subprocess.run(
        [*YETO, "run", "up", str(config)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return run_dir / "store"


def _events(store: Path, island: str) -> list[dict]:
    return stream_events(store, island)


def _rounds(store: Path) -> list[dict]:
    return [e["data"] for e in _events(store, "trainer") if e["kind"] == "round_trained"]


def _groups(store: Path) -> list[tuple]:
    lines = (store / "buffer" / "index.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [
        (r["position"], r["group_id"], r["digest"], r["min_version"], r["max_version"])
        for r in sorted(rows, key=lambda r: r["position"])
    ]


def _weights(store: Path, version: int) -> str:
    data = (store / "releases" / str(version) / "model.safetensors").read_bytes()
    return hashlib.sha256(data).hexdigest()


@pytest.mark.timeout(1500)
def test_async_at_policy_age_zero_trains_what_sync_rounds_trains(tmp_path, sort_base):
    sync, asyn = (_run(tmp_path, sort_base, mode) for mode in ("sync", "async"))
    # the asynchronous run really ran without version waits, gated by the policy age
    kinds = {e["kind"] for e in _events(asyn, "sampler-0")}
    assert "sampler_sync_wait" not in kinds and "sampler_backlog_wait" in kinds, kinds
    assert "sampler_sync_wait" in {e["kind"] for e in _events(sync, "sampler-0")}
    rs, ra = _rounds(sync), _rounds(asyn)
    n = min(len(rs), len(ra))
    assert n >= ROUNDS, (len(rs), len(ra))
    for a, b in zip(rs[:n], ra[:n], strict=True):
        assert (a["policy_version"], a["positions"]) == (b["policy_version"], b["positions"])
        assert a["skipped"] == b["skipped"] == {}
        assert a["metrics"] == b["metrics"], (a["policy_version"], a["metrics"], b["metrics"])
    groups = 4 * n
    assert _groups(sync)[:groups] == _groups(asyn)[:groups]
    for version in range(n + 1):
        assert _weights(sync, version) == _weights(asyn, version), version
