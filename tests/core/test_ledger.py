"""The batch ledger: records, rebase at a restore, set-aside at a restart, replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from yeto_core.buffer.batch_reader import BatchReader
from yeto_core.buffer.ledger import BatchLedger, LedgerError
from yeto_core.buffer.ledger_replay import replay
from yeto_core.buffer.sample_buffer import FileSampleBuffer
from yeto_core.records import Trigger
from yeto_core.stores.dir_store import DirStore
from yeto_core.testing.fake_backend import FakeBackend, make_group
from yeto_core.testing.fakes import Clock
from yeto_core.trainer.cut import ConsistentCut, CutStore

G = 4


@pytest.fixture
def run(tmp_path: Path) -> dict[str, Any]:
    clock = Clock(1_700_000_000.0, tick=1.0)
    store = DirStore(tmp_path / "store", fsync=False)
    buf = FileSampleBuffer(store, clock=clock)
    for i in range(12):
        buf.append(make_group(i, 0, g=G))
    reader = BatchReader(
        buf, group_size=G, groups_per_round=2, max_policy_age=100, clock=clock, sleep=lambda s: None
    )
    return {
        "store": store,
        "buf": buf,
        "reader": reader,
        "ledger": BatchLedger(store, clock=clock),
        "cuts": CutStore(store, clock=clock),
        "clock": clock,
        "tmp": tmp_path,
    }


def train(
    run: dict[str, Any], backend: FakeBackend, rounds: int, *, inc: int, seq0: int, parent: Any
) -> int:
    for k in range(rounds):
        batch = run["reader"].take(seq0 + k, short_ok=True)
        backend.train_round(batch)
        run["ledger"].record(batch, seq=seq0 + k + 1, incarnation=inc, parent_cut=parent)
        run["reader"].commit(batch)
    return seq0 + rounds


def cut(run: dict[str, Any], backend: FakeBackend, rounds: int, inc: int) -> ConsistentCut:
    out = run["tmp"] / f"cut{rounds}"
    out.mkdir()
    backend.save_cut(out, Trigger.MANUAL)
    rec = ConsistentCut(
        trigger=Trigger.MANUAL,
        policy_version=rounds,
        trained_rounds=rounds,
        buffer_watermark=run["buf"].watermark,
        incarnation=inc,
    )
    return run["cuts"].commit(out, rec)


def test_rounds_record_positions_version_and_lineage(run: dict[str, Any]) -> None:
    backend = FakeBackend()
    train(run, backend, 2, inc=1, seq0=0, parent=None)
    rounds = run["ledger"].rounds()
    assert [r.positions for r in rounds] == [(0, 1), (2, 3)]
    assert [r.policy_version for r in rounds] == [0, 1]
    assert rounds[1].incarnation == 1 and rounds[1].parent_cut is None
    assert run["ledger"].check(watermark=4) == {
        "rounds": 2,
        "trained": 4,
        "skipped": 0,
        "watermark": 4,
    }
    with pytest.raises(LedgerError, match="comes after round 2"):
        run["ledger"].record(
            attrs.evolve(run["reader"].take(2), positions=(4, 5)),
            seq=2,
            incarnation=1,
            parent_cut=None,
        )


def test_restore_moves_rounds_of_the_dead_incarnation_aside(run: dict[str, Any]) -> None:
    backend = FakeBackend()
    train(run, backend, 1, inc=1, seq0=0, parent=None)
    c = cut(run, backend, 1, 1)
    train(run, backend, 2, inc=1, seq0=1, parent=None)  # then incarnation 1 dies
    moved = run["ledger"].rebase(
        trained_rounds=1, cut_id=c.cut_id, watermark=c.buffer_watermark, incarnation=2
    )
    assert len(moved) == 2 and all(k.startswith("ledger/aside/") for k in moved)
    assert [r.seq for r in run["ledger"].rounds()] == [1]
    # the set-aside rounds are kept, byte for byte
    assert all(run["store"].exists(k) for k in moved)
    with pytest.raises(LedgerError, match="different runs"):
        run["ledger"].rebase(trained_rounds=1, cut_id="x", watermark=99, incarnation=3)


def test_restart_from_base_refuses_earlier_rounds_unless_set_aside(run: dict[str, Any]) -> None:
    backend = FakeBackend()
    train(run, backend, 2, inc=1, seq0=0, parent=None)
    with pytest.raises(LedgerError, match="set_aside_before="):
        run["ledger"].start_from_base()
    first = run["ledger"].rounds()[0].time
    with pytest.raises(LedgerError, match="at or after"):
        run["ledger"].start_from_base(set_aside_before=first + 0.5)
    moved = run["ledger"].start_from_base(set_aside_before=run["clock"].t + 10)
    assert len(moved) == 2 and all(k.startswith("ledger.before-") for k in moved)
    assert run["ledger"].rounds() == [] and run["ledger"].start_from_base() == []


def _cli_options() -> set[str]:
    import click

    from yeto_core.cli import cli

    found: set[str] = set()

    def walk(cmd: click.Command, ctx: click.Context) -> None:
        for param in cmd.params:
            found.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("--"))
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None:
                    walk(sub, click.Context(sub, parent=ctx, info_name=name))

    walk(cli, click.Context(cli, info_name="yeto"))
    return found


def test_the_ledger_refusals_name_only_options_that_exist(run: dict[str, Any]) -> None:
    """Regression: the refusal told the user to pass --ledger-set-aside-before, a flag no
    yeto command has. Every --flag a refusal names is a real CLI option, and every
    name= it names is a parameter of start_from_base."""
    import inspect
    import re

    params = set(inspect.signature(run["ledger"].start_from_base).parameters)
    options = _cli_options()
    assert "--dry-run" in options  # the walk reaches subcommands
    train(run, FakeBackend(), 2, inc=1, seq0=0, parent=None)
    first = run["ledger"].rounds()[0].time
    messages = []
    for kwargs in ({}, {"set_aside_before": first + 0.5}):
        with pytest.raises(LedgerError) as err:
            run["ledger"].start_from_base(**kwargs)
        messages.append(str(err.value))
    for message in messages:
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", message))
        assert flags <= options, f"{sorted(flags - options)} named in: {message}"
        names = set(re.findall(r"\b([a-z_]+)=", message))
        assert names and names <= params, f"{sorted(names - params)} named in: {message}"


def test_a_start_from_the_base_sets_aside_this_runs_rounds_of_an_incarnation_without_a_cut(
    run: dict[str, Any],
) -> None:
    """Regression: an incarnation that trained rounds and died before its first cut made
    every later start in the same head refuse ("recorded at or after ..."), until the
    head gave up."""
    backend = FakeBackend()
    train(run, backend, 1, inc=1, seq0=0, parent=None)  # an earlier run's round
    head_started = run["clock"].t + 0.5
    run["clock"].t += 1.0
    train(run, backend, 2, inc=3, seq0=1, parent=None)  # this run's incarnation 3, no cut
    moved = run["ledger"].start_from_base(set_aside_before=head_started, incarnation=4)
    assert len(moved) == 3
    assert sum(k.startswith("ledger.before-") for k in moved) == 1
    assert sum(k.startswith("ledger/aside/base-i4-") for k in moved) == 2
    assert run["ledger"].rounds() == []  # the new incarnation starts at round 0
    assert all(run["store"].exists(k) for k in moved)  # kept, never deleted


def test_check_names_a_position_trained_twice(run: dict[str, Any]) -> None:
    backend = FakeBackend()
    train(run, backend, 1, inc=1, seq0=0, parent=None)
    run["buf"].reset_to(0)
    run["reader"].reset()
    batch = run["reader"].take(1)
    run["ledger"].record(batch, seq=2, incarnation=1, parent_cut=None)
    with pytest.raises(LedgerError, match="starts at watermark 0"):
        run["ledger"].check()


def test_replay_from_the_base_equals_the_newest_cut_bitwise(run: dict[str, Any]) -> None:
    backend = FakeBackend(seed=3)
    n = train(run, backend, 2, inc=1, seq0=0, parent=None)
    c = cut(run, backend, n, 1)
    # a restore in the middle: the resumed run is still one lineage
    resumed = FakeBackend(seed=3)
    found = run["cuts"].latest_valid(run["tmp"] / "dl")
    assert found is not None
    resumed.restore(found[1])
    run["ledger"].rebase(
        trained_rounds=n, cut_id=c.cut_id, watermark=c.buffer_watermark, incarnation=2
    )
    n = train(run, resumed, 3, inc=2, seq0=n, parent=c.cut_id)
    cut(run, resumed, n, 2)
    result = replay(
        ledger=run["ledger"],
        buffer=run["buf"],
        make_backend=lambda: FakeBackend(seed=3),
        cut_store=run["cuts"],
    )
    assert result.rounds == 5 and result.equal
    # a replay on a backend that trains differently is caught
    other = replay(
        ledger=run["ledger"],
        buffer=run["buf"],
        make_backend=lambda: FakeBackend(seed=4),
        cut_store=run["cuts"],
    )
    assert not other.equal


def test_cli_ledger_check(run: dict[str, Any]) -> None:
    from click.testing import CliRunner

    from yeto_core.cli import cli

    train(run, FakeBackend(), 2, inc=1, seq0=0, parent=None)
    res = CliRunner().invoke(cli, ["ledger", "check", str(run["tmp"] / "store"), "--json"])
    assert res.exit_code == 0, res.output
    assert '"trained": 4' in res.output and '"watermark": 4' in res.output
    res = CliRunner().invoke(cli, ["ledger", "replay", str(run["tmp"] / "nothing")])
    assert res.exit_code != 0 and "neither a run dir nor a run config" in res.output
    # RUN is the same for every command: the run dir works for check too
    res = CliRunner().invoke(cli, ["ledger", "check", str(run["tmp"] / "nothing")])
    assert res.exit_code != 0 and "neither a run dir nor a run config" in res.output
