"""Every exit code of ``yeto run up`` and of an island process is documented, once.

Issue 52 item 5: a trainer loop that gave up exits 8 (the seed's code), and
``docs/run-config.md`` lists every exit code.
"""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from yeto_core.head import run_dir
from yeto_core.sampler.engine_server import EXIT_INFRA_FAILED

DOCS = Path(__file__).resolve().parents[2] / "docs" / "run-config.md"


def _table_codes(heading: str) -> dict[int, str]:
    """``| code | meaning |`` rows of the table under ``heading`` in run-config.md."""
    text = DOCS.read_text()
    assert heading in text, f"{DOCS} lacks the section {heading!r}"
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| (.+) \|$", section, re.M)}


def test_a_loop_that_gave_up_has_the_seeds_exit_code_and_codes_are_unique():
    assert run_dir.EXIT_GAVE_UP == 8
    codes = [v for k, v in vars(run_dir).items() if k.startswith("EXIT_") and k != "EXIT_CODES"]
    assert len(codes) == len(set(codes)), f"two exit codes share a number: {sorted(codes)}"
    assert set(codes) == set(run_dir.EXIT_CODES)


def test_every_exit_code_of_run_up_is_in_run_config_md_and_the_help():
    documented = _table_codes("## Exit codes of `yeto run up`")
    assert set(documented) == set(run_dir.EXIT_CODES)
    assert "gave up" in documented[run_dir.EXIT_GAVE_UP]
    assert "breaker" in documented[run_dir.EXIT_BREAKER]
    from yeto_core.cli import cli

    out = CliRunner().invoke(cli, ["run", "up", "--help"]).output
    helped = {int(m[1]) for m in re.finditer(r"^\s+(\d+)\s+\S", out, re.M)}
    assert helped == set(run_dir.EXIT_CODES), out


def test_every_exit_code_of_an_island_process_is_in_run_config_md():
    documented = _table_codes("## Exit codes of an island process")
    assert set(documented) == {0, 1, 2, EXIT_INFRA_FAILED}
