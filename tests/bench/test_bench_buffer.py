"""``yeto bench buffer`` runs end to end with tiny sizes and prints every key (no timing asserts)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from yeto_core.cli import cli

KEYS = {
    "append_groups_per_s",
    "fsync_limit_groups_per_s",
    "append_ratio",
    "tick_ms_1k",
    "tick_ms_100k",
    "tick_ratio",
    "select_commit_ms",
    "batched_append_groups_per_s",
    "batched_vs_single",
    "batched_fsync_limit_groups_per_s",
    "batched_append_ratio",
}


def test_bench_buffer_prints_one_json_object_with_every_figure(tmp_path):
    args = ["bench", "buffer", "--json", "--groups", "4", "--ticks", "3"]
    args += ["--small-history", "100", "--large-history", "300", "--rounds", "2"]
    args += ["--s3-groups", "0", "--dir", str(tmp_path)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert KEYS <= set(out)
    assert all(out[k] > 0 for k in KEYS)
    ratio = out["append_groups_per_s"] / out["fsync_limit_groups_per_s"]
    assert out["append_ratio"] == pytest.approx(ratio, rel=0.01)
    batched = out["batched_append_groups_per_s"] / out["append_groups_per_s"]
    assert out["batched_vs_single"] == pytest.approx(batched, rel=0.01)
    blimit = out["batched_append_groups_per_s"] / out["batched_fsync_limit_groups_per_s"]
    assert out["batched_append_ratio"] == pytest.approx(blimit, rel=0.01)
    assert "s3_append_ratio" not in out
    assert list(tmp_path.iterdir()) == []  # scratch removed
