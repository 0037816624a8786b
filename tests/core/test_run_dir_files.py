"""The head's run-dir files are strict JSON and written durably."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from yeto_core.head.run_dir import json_safe, write_json_atomic


def test_non_finite_numbers_become_null_never_nan_literals(tmp_path: Path) -> None:
    """Regression: summary.json / status.json could hold NaN, which is not JSON."""
    data = {"mean_reward": math.nan, "x": [1.0, math.inf, {"y": -math.inf}], "ok": 0.5}
    write_json_atomic(tmp_path / "status.json", data)
    text = (tmp_path / "status.json").read_text()
    assert "NaN" not in text and "Infinity" not in text

    def strict(name: str) -> None:
        raise ValueError(f"non-strict JSON constant {name}")

    loaded = json.loads(text, parse_constant=strict)
    assert loaded == {"mean_reward": None, "x": [1.0, None, {"y": None}], "ok": 0.5}
    assert json_safe((1, math.nan)) == [1, None]


def test_the_file_and_its_directory_are_fsynced_before_and_after_the_rename(
    tmp_path: Path, monkeypatch
) -> None:
    """Regression: write_json_atomic renamed an unsynced file (a crash could leave it empty)."""
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    def replace(a, b) -> None:
        calls.append("rename")
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_json_atomic(tmp_path / "summary.json", {"a": 1})
    assert calls == ["file", "rename", "dir"]
    assert json.loads((tmp_path / "summary.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary left
    calls.clear()
    # status.json, rewritten every head tick: atomic (a whole old or new file), no fsyncs
    write_json_atomic(tmp_path / "status.json", {"b": 2}, durable=False)
    assert calls == ["rename"]
    assert json.loads((tmp_path / "status.json").read_text()) == {"b": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json", "summary.json"]
