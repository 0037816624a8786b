"""A test run that executes nothing fails (pytest's exit 5, and our all-skipped guard)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _pytest(where: pathlib.Path) -> subprocess.CompletedProcess[str]:
    shutil.copy(ROOT / "tests" / "conftest.py", where / "conftest.py")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(where)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_nothing_collected_fails(tmp_path):
    assert _pytest(tmp_path).returncode == 5


def test_everything_skipped_fails(tmp_path):
    (tmp_path / "test_skipped.py").write_text(
        "import pytest\n\n@pytest.mark.skip(reason='x')\ndef test_a():\n    pass\n"
    )
    result = _pytest(tmp_path)
    assert result.returncode == 5, result.stdout
    assert "no test passed" in result.stdout


def test_a_passing_test_passes(tmp_path):
    (tmp_path / "test_ok.py").write_text("def test_a():\n    assert 1 + 1 == 2\n")
    assert _pytest(tmp_path).returncode == 0


def test_ci_script_runs_make_test():
    script = (ROOT / ".ci" / "run").read_text()
    assert "make test" in script and "set -euo pipefail" in script
