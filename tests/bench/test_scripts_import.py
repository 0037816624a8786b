"""Every script in ``benchmarks/`` and ``scripts/`` loads: its imports resolve against
the installed distributions. The closing notes' reproduction commands run these
scripts, and nothing else in the suite runs most of them (a helper moved from
``yeto_bench.e2e`` to ``yeto_bench.head_proc`` once left
``benchmarks/quickstart_store.py`` failing at its first line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py")])

# Runs each file as a module that is not __main__ (its imports and top-level
# definitions, not its main()), with its own folder first on sys.path as when it is run.
LOAD = """
import runpy, sys
path = sys.argv[1]
sys.path.insert(0, path.rsplit("/", 1)[0])
runpy.run_path(path, run_name="yeto_script_import_check")
"""


def test_there_are_scripts_to_check() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"quickstart_store.py", "plain_loop.py", "with-seaweedfs.py"} <= names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_loads(path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{path.relative_to(ROOT)} does not load:\n{proc.stderr[-2000:]}"


def test_quickstart_store_shows_its_help() -> None:
    """The SeaweedFS figure's script parses its arguments (it imports the bench's helpers)."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/quickstart_store.py", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--latency-ms" in proc.stdout
