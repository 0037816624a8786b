"""`yeto run up` on a run dir whose run finished prints its summary and starts nothing."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from yeto_core.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def test_a_finished_run_is_not_started_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = {"reward_last": 0.9, "wall_s": 200.0, "groups_appended": 10}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "FINISHED").write_text(json.dumps({"time": 1.0, "reason": "finished (data_end)"}))
    result = CliRunner().invoke(
        cli, ["run", "up", str(ROOT / "examples/quickstart/run.toml"), "--run-dir", str(run_dir)]
    )
    assert result.exit_code == 0, result.output
    assert "already finished (finished (data_end))" in result.output
    assert '"wall_s": 200.0' in result.output
    # Nothing was started: no head record, no island handles, the summary is untouched.
    assert not (run_dir / "head.json").exists()
    assert not (run_dir / "islands").exists()
    assert json.loads((run_dir / "summary.json").read_text()) == summary


def test_run_up_takes_a_run_dir_like_every_command(tmp_path) -> None:
    """`yeto run up RUN` with a run dir continues the config.json the head wrote there."""
    import json

    from click.testing import CliRunner

    from yeto_core.cli import cli
    from yeto_core.config.load import config_to_dict
    from yeto_core.testing.fake_run import fake_run_config

    config = fake_run_config(tmp_path, name="from-run-dir")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(config_to_dict(config)))
    res = CliRunner().invoke(cli, ["run", "up", str(run_dir), "--dry-run"])
    assert "run from-run-dir" in res.output, res.output
    assert res.exit_code in (0, 3), res.output  # the plan is printed; preflight decides
