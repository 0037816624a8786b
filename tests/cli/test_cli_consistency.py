"""The ``yeto`` CLI, consistent across commands (issue 44, item 5).

One word for the run argument, exit codes in every command's help, ``--json``
where a script needs it, one error style, no RST markup in help, no ``None`` in
output, exit 2 for a run that never ran, dry runs that leave nothing behind,
and ``--offline`` honoured by every plugin's preflight.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from yeto_core import hookimpl
from yeto_core import plugins as plugins_mod
from yeto_core.cli import cli, main
from yeto_core.config.load import config_to_dict, load_config
from yeto_core.plugins import Plugins
from yeto_core.testing.minimal import minimal_plugins

ROOT = Path(__file__).resolve().parents[2]


# -- a small run config that preflight passes with inline fakes --------------------------


_fake_plugins = minimal_plugins


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> Plugins:
    pm = _fake_plugins()
    monkeypatch.setattr(plugins_mod, "get_plugins", lambda: pm)
    return pm


def _toml(tmp_path: Path, store: str = "") -> Path:
    path = tmp_path / "run.toml"
    path.write_text(
        f'name = "cli"\nrun_dir = "{tmp_path / "runs" / "cli"}"\n'
        + (f'store = "{store}"\n' if store else "")
        + f'[model]\npath = "{tmp_path / "base"}"\nbase_options = {{ task = "fake-task" }}\n'
        '[task]\nname = "fake-task"\n'
        '[[samplers]]\nengine = "fake-engine"\ngroup_size = 4\nbacklog_cap = 8\n'
        '[trainer]\nbackend = "fake-backend"\ngroups_per_round = 2\n'
        "[backstops]\nwall_clock_s = 60\n"
    )
    return path


def _started(tmp_path: Path) -> Path:
    """A run dir as a head leaves it when it starts (config.json, an empty store)."""
    config = load_config(_toml(tmp_path))
    run_dir = Path(config.run_dir)
    (run_dir / "store").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config_to_dict(config)))
    return run_dir


def _runner() -> CliRunner:
    return CliRunner(mix_stderr=False)


# -- help: one word for the run, exit codes, no RST -------------------------------------


def _commands() -> Iterator[tuple[str, click.Command, click.Context]]:
    """Every command of ``yeto`` (plugin commands included), with its context."""

    def walk(cmd: click.Command, path: list[str], parent: Any) -> Iterator[Any]:
        ctx = click.Context(cmd, info_name=path[-1], parent=parent)
        yield " ".join(path), cmd, ctx
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, name
                yield from walk(sub, [*path, name], ctx)

    yield from walk(cli, ["yeto"], None)


_RST = re.compile(r"``|:[a-z]+:`|`[^`\n]+`_\b")


def test_help_of_every_command_has_no_rst_markup():
    """Regression: `yeto ledger replay --help` showed ``torch`` (docstrings are
    RST for the API docs, but click prints them literally)."""
    seen = 0
    for path, cmd, ctx in _commands():
        text = cmd.get_help(ctx) + "\n" + (cmd.get_short_help_str(200) or "")
        assert not _RST.findall(text), f"{path}: {_RST.findall(text)}\n{text}"
        seen += 1
    assert seen > 15  # core and plugin commands were walked


def test_every_command_lists_its_exit_codes():
    leaves = [(p, c, x) for p, c, x in _commands() if not isinstance(c, click.Group)]
    assert {"yeto run up", "yeto cost", "yeto buffer stats", "yeto plugins"} <= {
        p for p, _, _ in leaves
    }
    for path, cmd, ctx in leaves:
        text = cmd.get_help(ctx)
        assert "Exit codes:" in text, f"{path} lists no exit codes:\n{text}"
        section = text.split("Exit codes:", 1)[1]
        for code in (0, 2):
            assert re.search(rf"^\s+{code}\s+\S", section, re.M), f"{path}: no exit {code}"


def test_run_up_help_lists_every_exit_code_of_the_head():
    from yeto_core.cli.run_cmd import _UP_EXIT_CODES
    from yeto_core.head.run_dir import EXIT_CODES

    assert set(_UP_EXIT_CODES) == set(EXIT_CODES)
    text = _runner().invoke(cli, ["run", "up", "--help"]).output
    for code in EXIT_CODES:
        assert re.search(rf"^\s+{code}\s+\S", text, re.M), code


def test_one_word_for_the_run_argument():
    """Regression: `buffer stats` said STORE_URL where every other command says RUN."""
    args = {}
    for path, cmd, _ctx in _commands():
        for param in cmd.params:
            if isinstance(param, click.Argument):
                args[path] = param.make_metavar()
    assert args["yeto run up"] == "CONFIG"  # a config file (or a run dir to continue)
    others = {p: m for p, m in args.items() if p != "yeto run up"}
    assert others and set(others.values()) == {"RUN"}, others


# -- one error style ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, code",
    [
        (["run", "up"], 2),  # click: a missing argument
        (["no-such-command"], 2),  # click: an unknown command
        (["run", "up", "x.toml", "--offline"], 2),  # a usage error of ours
        (["cost", "no/such/run"], 2),  # neither a run dir nor a config
        (["run", "up", "no-such.toml"], 2),  # a config error (YetoError)
    ],
)
def test_every_user_error_says_yeto_error_on_stderr(argv, code, tmp_path, monkeypatch):
    """Regression: click printed its own `Error: …` and a YetoError escaped the
    CliRunner/`cli` entry as a traceback with exit 1."""
    monkeypatch.chdir(tmp_path)
    res = _runner().invoke(cli, argv)
    assert res.exit_code == code, (res.stdout, res.stderr, res.exception)
    assert "yeto: error: " in res.stderr
    assert not re.search(r"^Error:", res.stderr, re.M), res.stderr
    assert res.stdout == ""


def test_the_yeto_script_entry_prints_the_same_style(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "up"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "yeto: error: Missing argument 'CONFIG'" in err and "\nError:" not in err


# -- a run that never ran ----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["run", "status"], ["cost"], ["ledger", "check"], ["ledger", "replay"], ["buffer", "stats"]],
    ids=lambda a: " ".join(a),
)
def test_a_run_that_never_ran_exits_2_and_creates_nothing(argv, tmp_path, fakes):
    """Regression: `cost`, `ledger check` and `buffer stats` printed empty figures
    (exit 0) for a run that never ran, and created its run dir and store."""
    config = _toml(tmp_path)
    res = _runner().invoke(cli, [*argv, str(config)])
    assert res.exit_code == 2, (res.stdout, res.stderr)
    assert "yeto: error:" in res.stderr and "never ran" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_a_missing_store_directory_exits_2_and_is_not_created(tmp_path):
    for argv in (["buffer", "stats"], ["ledger", "check"]):
        res = _runner().invoke(cli, [*argv, f"file://{tmp_path / 'nothing' / 'store'}"])
        assert res.exit_code == 2 and "no store at" in res.stderr, res.stderr
    assert not (tmp_path / "nothing").exists()


def test_cost_never_prints_none(tmp_path, fakes):
    """Regression: a run with no trained group printed `(None points gained)`."""
    run_dir = _started(tmp_path)
    res = _runner().invoke(cli, ["cost", str(run_dir)])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    assert "None" not in res.stdout and "n/a" in res.stdout
    data = json.loads(_runner().invoke(cli, ["cost", str(run_dir), "--json"]).stdout)
    assert data["reward_points_gained"] is None  # JSON keeps null for "not known"


# -- run up --dry-run: --json, nothing left behind, --offline ----------------------------


def test_dry_run_leaves_no_directory_behind(tmp_path, fakes):
    """Regression: `run up --dry-run` created the run dir and the store's directory."""
    config = _toml(tmp_path)
    res = _runner().invoke(cli, ["run", "up", str(config), "--dry-run"])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    assert "[ok  ] store:" in res.stdout and "writable" in res.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.toml"]
    # a store that exists keeps its contents and gets no leftover probe prefix
    store = tmp_path / "elsewhere"
    (store / "buffer").mkdir(parents=True)
    config = _toml(tmp_path, store=str(store))
    res = _runner().invoke(cli, ["run", "up", str(config), "--dry-run"])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    assert sorted(p.name for p in store.iterdir()) == ["buffer"]
    assert not (tmp_path / "runs").exists()


def test_dry_run_json_prints_the_plan_and_the_preflight_rows(tmp_path, fakes):
    config = _toml(tmp_path)
    res = _runner().invoke(cli, ["run", "up", str(config), "--dry-run", "--json"])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    out = json.loads(res.stdout)
    assert out["passed"] is True
    assert out["plan"]["run"] == "cli" and out["plan"]["trainer"]["backend"] == "fake-backend"
    rows = {c["name"]: c for c in out["checks"]}
    assert rows["store"]["status"] == "ok" and set(rows["store"]) == {"name", "status", "detail"}
    # a failing check: exit 3, and the JSON says which
    bad = tmp_path / "bad.toml"
    bad.write_text(config.read_text().replace("groups_per_round = 2", "groups_per_round = 9"))
    res = _runner().invoke(cli, ["run", "up", str(bad), "--dry-run", "--json"])
    assert res.exit_code == 3
    out = json.loads(res.stdout)
    assert out["passed"] is False
    assert [c["name"] for c in out["checks"] if c["status"] == "fail"] == [
        "trainer.groups_per_round"
    ]
    res = _runner().invoke(cli, ["run", "up", str(config), "--json"])
    assert res.exit_code == 2 and "--json only goes with --dry-run" in res.stderr


def test_offline_still_resolves_the_store_scheme(tmp_path, fakes):
    """Regression: --offline skipped the store check entirely, so `bogus://x` passed."""
    config = _toml(tmp_path, store="bogus://x/run")
    res = _runner().invoke(cli, ["run", "up", str(config), "--dry-run", "--offline"])
    assert res.exit_code == 3, (res.stdout, res.stderr)
    assert "[FAIL] store:" in res.stdout and "No object store for bogus://" in res.stdout
    ok = _runner().invoke(cli, ["run", "up", str(_toml(tmp_path)), "--dry-run", "--offline"])
    assert ok.exit_code == 0, (ok.stdout, ok.stderr)
    assert "[WARN] store:" in ok.stdout and "not probed (--offline)" in ok.stdout


def test_offline_reaches_every_plugin_preflight(tmp_path, monkeypatch):
    seen = []

    def check(config, report, offline):
        seen.append(offline)
        report.ok("offline-aware", f"offline={offline}")

    pm = _fake_plugins(types.SimpleNamespace(yeto_preflight=hookimpl(check)))
    monkeypatch.setattr(plugins_mod, "get_plugins", lambda: pm)
    config = str(_toml(tmp_path))
    assert _runner().invoke(cli, ["run", "up", config, "--dry-run", "--offline"]).exit_code == 0
    assert _runner().invoke(cli, ["run", "up", config, "--dry-run"]).exit_code == 0
    assert seen == [True, False]


def test_sky_example_offline_does_not_contact_the_bucket(tmp_path):
    """Regression: with S3 credentials set, `yeto run up examples/sky/run.toml --dry-run
    --offline` made yeto-s3's check connect to the bucket, fail, and exit 3.

    Runs the `yeto` script in a child process: SkyPilot fixes its catalog directory
    from HOME when first imported, and tests/sky sets up its own HOME for that."""
    from importlib import metadata

    names = {ep.name for ep in metadata.entry_points(group="yeto")}
    if not {"s3", "sky", "torch"} <= names:
        pytest.skip("needs yeto-s3, yeto-sky and yeto-torch installed (make install)")
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "examples" / "sky" / "run.toml", work / "run.toml")
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "YETO_STORE_S3_ACCESS_KEY_ID": "x",
        "YETO_STORE_S3_SECRET_ACCESS_KEY": "y",
        "YETO_STORE_S3_ENDPOINT_URL": "http://127.0.0.1:9",  # nothing listens there
        "SKYPILOT_DISABLE_LOCAL_API_SERVER": "1",
        "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
    }
    env.pop("YETO_DISABLE_PLUGINS", None)
    script = "import sys; from yeto_core.cli import main; sys.exit(main())"
    res = subprocess.run(
        [sys.executable, "-c", script, "run", "up", "run.toml", "--dry-run", "--offline"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[WARN] s3-store:" in res.stdout and "not contacted (--offline)" in res.stdout
    assert "[FAIL]" not in res.stdout
    assert os.listdir(work) == ["run.toml"]  # and the dry run left nothing behind


# -- run down --json ---------------------------------------------------------------------


def test_run_down_json(tmp_path, fakes):
    run_dir = _started(tmp_path)
    res = _runner().invoke(cli, ["run", "down", str(run_dir), "--json"])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    out = json.loads(res.stdout)
    assert out == {
        "run_dir": str(run_dir),
        "head_pid": None,
        "requested": False,
        "stopped": None,
        "stop_reason": None,
    }
    # a live head (this process stands in for it): the stop request is written
    (run_dir / "head.json").write_text(json.dumps({"pid": os.getpid()}))
    res = _runner().invoke(cli, ["run", "down", str(run_dir), "--json", "--no-wait"])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    out = json.loads(res.stdout)
    assert out["requested"] is True and out["head_pid"] == os.getpid()
    assert (run_dir / "DOWN").is_file()
