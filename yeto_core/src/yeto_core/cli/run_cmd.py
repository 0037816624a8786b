"""``yeto run up|status|scale|down``: start a run, watch it and scale its samplers from
another terminal, stop it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import click

from yeto_core.cli import exit_codes


@click.group()
def run() -> None:
    """Start, watch and stop runs."""


def _say(msg: str) -> None:
    click.echo(msg)


class _Progress:
    """The live progress display: a rich table on a terminal, a line every 5 s otherwise."""

    def __init__(self, live: bool) -> None:
        self.live = None
        self.last_line = 0.0
        if live:
            from rich.live import Live

            self.live = Live(refresh_per_second=4, transient=False)
            self.live.start()

    def __call__(self, status: dict[str, Any]) -> None:
        if self.live is not None:
            self.live.update(status_table(status))
            return
        now = time.monotonic()
        if now - self.last_line >= 5.0:
            self.last_line = now
            click.echo(status_line(status))

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def status_line(s: dict[str, Any]) -> str:
    """One line of progress (non-terminal output and logs)."""
    return (
        f"[{_fmt(s.get('elapsed_s'), '.0f')}s] backlog {s.get('backlog_groups')} groups | "
        f"appended {s.get('groups_appended')} | trainer {s.get('trainer_state')} "
        f"v{_fmt(s.get('policy_version'))} rounds {_fmt(s.get('trained_rounds'))} | "
        f"reward {_fmt(s.get('mean_reward'), '.3f')} | ${_fmt(s.get('cost_usd'), '.4f')}"
        + (f" | {eval_text(s['eval'])}" if s.get("eval") else "")
    )


def eval_text(e: dict[str, Any]) -> str:
    """The newest evaluation in a few words: ``eval v3 reward_mean 0.500 (best 0.625)``."""
    metrics = e.get("metrics") or {}
    best = e.get("best") or {}
    words = [f"eval v{e.get('version')}"]
    for name in ("reward_mean", "reward_best_mean"):
        if metrics.get(name) is not None:
            words.append(f"{name} {metrics[name]:.3f}")
            if best.get(name) is not None:
                words.append(f"(best {best[name]:.3f})")
            break
    return " ".join(words)


def status_table(s: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"yeto run {s.get('run')} ({s.get('state')})", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    rows = [
        ("elapsed", f"{_fmt(s.get('elapsed_s'), '.0f')} s"),
        ("backlog", f"{s.get('backlog_groups')} groups waiting"),
        ("appended / consumed", f"{s.get('groups_appended')} / {s.get('watermark')}"),
        (
            "trainer",
            f"{s.get('trainer_state')} (incarnation {_fmt(s.get('incarnation'))}, "
            f"{_fmt(s.get('trained_rounds'))} rounds)",
        ),
        ("policy version", _fmt(s.get("policy_version"))),
        ("mean reward (last groups)", _fmt(s.get("mean_reward"), ".3f")),
        ("cost so far", f"${_fmt(s.get('cost_usd'), '.4f')}"),
        (
            "samplers",
            ", ".join(f"{k}: {v}" for k, v in (s.get("samplers") or {}).items()) or "-",
        ),
    ]
    if s.get("eval"):
        rows.append(("evaluation", eval_text(s["eval"])))
    if s.get("stop_reason"):
        rows.append(("stopping", str(s["stop_reason"])))
    for k, v in rows:
        table.add_row(k, v)
    return table


_UP_EXIT_CODES = {
    0: "finished, or stopped by `yeto run down`; with --dry-run: every check passed",
    1: "failed (see the message and the run dir's logs/)",
    2: "config or plugin error; nothing started",
    3: "a preflight check failed; nothing started",
    4: "stopped by the cost guard at the budget (docs/cost.md)",
    5: "stopped by the wall-clock backstop",
    6: "stopped by the silence backstop",
    7: "another head runs on this run dir",
    8: "the trainer loop gave up (max_failures failed incarnations in a row)",
    9: "fenced: another head took the run's lease; this one stopped without writing",
    10: "stopped by a run health breaker ([breakers])",
    130: "interrupted (Ctrl-C); the run was stopped cleanly",
}


@run.command(epilog=exit_codes(_UP_EXIT_CODES))
@click.argument("config_path", metavar="CONFIG", type=click.Path())
@click.option("--run-dir", type=click.Path(file_okay=False), help="Overrides run_dir in CONFIG.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan and the checks; start nothing and leave no directory behind.",
)
@click.option(
    "--offline",
    is_flag=True,
    help="With --dry-run: contact no service (the store is not opened, only its URL scheme "
    "resolved; plugins skip their network checks, e.g. yeto-s3's bucket probe); every "
    "other check runs.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With --dry-run: print the plan and the preflight checks as one JSON object.",
)
def up(
    config_path: str, run_dir: Optional[str], dry_run: bool, offline: bool, as_json: bool
) -> None:
    """Start the run of CONFIG (or continue it in its run dir).

    CONFIG is a run config (TOML), or a run dir a head already ran in (its
    config.json is continued).
    """
    from yeto_core.cli import error
    from yeto_core.config.load import load_config
    from yeto_core.config.preflight import run_preflight
    from yeto_core.head import run as run_mod
    from yeto_core.plugins import get_plugins

    if offline and not dry_run:
        raise click.UsageError("--offline only goes with --dry-run: a run needs its store")
    if as_json and not dry_run:
        raise click.UsageError(
            "--json only goes with --dry-run (`yeto run status --json` shows a running run)"
        )
    if Path(config_path).is_dir() and run_dir is None:
        from yeto_core.cli import resolve_run

        _dir, config = resolve_run(config_path)
    else:
        config = load_config(config_path, run_dir=run_dir)
    plugins = get_plugins()
    report = run_preflight(config, plugins, offline=offline, dry_run=dry_run)
    if as_json:
        out = {"plan": plan_dict(config), "checks": report.to_json(), "passed": report.passed}
        click.echo(json.dumps(out, indent=2, sort_keys=True))
    else:
        click.echo(plan_text(config))
        click.echo("preflight:")
        click.echo(report.render())
    if dry_run:
        sys.exit(run_mod.EXIT_OK if report.passed else run_mod.EXIT_PREFLIGHT)
    if not report.passed:
        error("preflight failed; nothing was started")
        sys.exit(run_mod.EXIT_PREFLIGHT)
    other = run_mod.live_head(Path(config.run_dir))
    if other is not None and not _lease_lapsed(plugins, config):
        error(
            f"another head (pid {other['pid']}) runs on {config.run_dir}; "
            f"`yeto run down {config.run_dir}` stops it"
        )
        sys.exit(run_mod.EXIT_BUSY)
    finished = run_mod.read_json(Path(config.run_dir) / run_mod.FINISHED_FILE)
    if finished is not None:
        # A finished run is not started again: its summary and final cut stay as they are.
        click.echo(
            f"yeto: the run in {config.run_dir} already finished ({finished.get('reason')}); "
            "its summary follows. Use another --run-dir to start a new run."
        )
        summary = run_mod.read_json(Path(config.run_dir) / run_mod.SUMMARY_FILE) or {}
        click.echo(json.dumps(summary, indent=2, sort_keys=True))
        sys.exit(run_mod.EXIT_OK)
    head = run_mod.Head(config, plugins)
    head.prepare_base(_say)
    progress = _Progress(live=sys.stdout.isatty())
    head.display = progress
    try:
        code = head.run(_say)
    finally:
        progress.close()
    summary = run_mod.read_json(Path(config.run_dir) / run_mod.SUMMARY_FILE) or {}
    click.echo(summary_text(summary, Path(config.run_dir)))
    click.echo(f"exit {code}: {run_mod.EXIT_CODES.get(code, '')}")
    sys.exit(code)


def plan_dict(config: Any) -> dict[str, Any]:
    """What ``run up`` will start, as data (``--dry-run --json``)."""
    t, b = config.trainer, config.backstops
    return {
        "run": config.name,
        "source": str(config.source),
        "run_dir": str(config.run_dir),
        "store": config.store_url(),
        "model": str(config.model.path),
        "task": config.task.name,
        "samplers": [
            {
                "island": island,
                "engine": s.engine,
                "provider": s.provider,
                "group_size": s.group_size,
                "backlog_cap": s.backlog_cap,
                "min_round_s": s.min_round_s,
                "price_per_hour": s.price_per_hour,
            }
            for island, s in config.sampler_islands()
        ],
        "trainer": {
            "name": t.name,
            "backend": t.backend,
            "provider": t.provider,
            "groups_per_round": t.groups_per_round,
            "max_policy_age": t.max_policy_age,
            "total_rounds": t.total_rounds,
            "price_per_hour": t.price_per_hour,
            "islands": list(config.trainer_islands()) or [t.name],
        },
        "scheduler": {"name": config.scheduler.name, "options": dict(config.scheduler.options)},
        "backstops": {
            "budget_usd": b.budget_usd,
            "wall_clock_s": b.wall_clock_s,
            "silence_s": b.silence_s,
        },
    }


def plan_text(config: Any) -> str:
    """What ``run up`` will start."""
    lines = [
        f"run {config.name}: {config.source}",
        f"  run dir   {config.run_dir}",
        f"  store     {config.store_url()}",
        f"  model     {config.model.path}",
        f"  task      {config.task.name}",
    ]
    for island, s in config.sampler_islands():
        lines.append(
            f"  sampler   {island}: engine {s.engine}, G={s.group_size}, "
            f"backlog cap {s.backlog_cap}, min round {s.min_round_s:g} s, "
            f"${s.price_per_hour:g}/h"
        )
    t = config.trainer
    lines.append(
        f"  trainer   {t.name}: backend {t.backend}, {t.groups_per_round} groups/round, "
        f"max policy age {t.max_policy_age}, "
        f"{t.total_rounds or 'unlimited'} rounds, ${t.price_per_hour:g}/h"
    )
    if t.islands > 1:
        y = config.sync
        lines.append(
            f"  islands   {', '.join(config.trainer_islands())}: syncer {y.syncer}, "
            f"{y.preset}, {y.local_steps} rounds each per outer step, {y.outer_optimizer}"
        )
    lines.append(f"  scheduler {config.scheduler.name} {config.scheduler.options or ''}".rstrip())
    b = config.backstops
    lines.append(
        f"  backstops budget ${b.budget_usd:g}, wall clock {b.wall_clock_s:g} s, "
        f"silence {b.silence_s:g} s (0 = none)"
    )
    return "\n".join(lines)


def summary_text(s: dict[str, Any], run_dir: Path) -> str:
    if not s:
        return f"no summary in {run_dir}"
    keys = [
        "reward_first",
        "reward_last",
        "trainer_starts",
        "trainer_stops",
        "releases_published",
        "sampler_versions_loaded",
        "groups_appended",
        "groups_trained",
        "groups_skipped",
        "groups_skipped_by_samplers",
        "rollouts_failed",
        "samples_truncated",
        "cost_usd",
        "wall_s",
    ]
    lines = [f"summary ({run_dir / 'summary.json'}):"]
    for k in keys:
        v = s.get(k)
        if isinstance(v, float):
            v = f"{v:.3f}"
        lines.append(f"  {k:24} {v}")
    ev = s.get("eval")
    if ev:
        lines.append(f"  {'eval releases':24} {len(ev.get('releases') or [])}")
        last = ev.get("last") or {}
        for name, value in sorted((last.get("metrics") or {}).items()):
            if value is None:
                continue
            best = (ev.get("best") or {}).get(name)
            tail = f" (best {best['value']:.3f} at v{best['version']})" if best else ""
            lines.append(f"  {'eval ' + name:24} {value:.3f} at v{last.get('version')}{tail}")
        if ev.get("discarded") or ev.get("failed"):
            lines.append(
                f"  {'eval not counted':24} {ev.get('discarded', 0)} discarded, "
                f"{ev.get('failed', 0)} failed"
            )
    return "\n".join(lines)


def _run_dir_of(run: str) -> Path:
    """RUN is a run dir, or a config whose run_dir is used (as for every command)."""
    from yeto_core.cli import resolve_run

    return resolve_run(run)[0]


@run.command(epilog=exit_codes({2: "RUN is neither a run dir nor a run config, or never ran"}))
@click.argument("run_ref", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(run_ref: str, as_json: bool) -> None:
    """Show the state of RUN (a run dir or its config), from any terminal."""
    from yeto_core.cli import resolve_started_run
    from yeto_core.cost.ledger import CostLedger
    from yeto_core.head import run as run_mod
    from yeto_core.head.run_dir import load_run_config

    run_dir = resolve_started_run(run_ref)[0]
    st = run_mod.read_json(run_dir / run_mod.STATUS_FILE) or {}
    head = run_mod.live_head(run_dir)
    out = dict(st)
    out["head_alive"] = head is not None
    if head is None and out.get("state") in ("running", "finishing"):
        out["state"] = "head_not_running"
    try:
        config = load_run_config(run_dir)
        out["cost_usd"] = round(CostLedger(run_dir, config.island_prices()).total_usd(), 4)
    except (OSError, ValueError):
        pass
    summary = run_mod.read_json(run_dir / run_mod.SUMMARY_FILE)
    if summary is not None and head is None:
        out["summary"] = summary
    if as_json:
        click.echo(json.dumps(out, indent=2, sort_keys=True, default=str))
        return
    if not st:
        click.echo(f"{run_dir}: no status yet (has `yeto run up` started here?)")
        return
    click.echo(
        f"{run_dir}: {out['state']} (head {'pid ' + str(head['pid']) if head else 'not running'})"
    )
    click.echo("  " + status_line(out))
    if summary is not None and head is None:
        click.echo(summary_text(summary, run_dir))


@run.command(
    epilog=exit_codes(
        {
            0: "the head stopped (or none was running: nothing to stop)",
            1: "the head did not stop within --timeout",
        }
    )
)
@click.argument("run_ref", metavar="RUN")
@click.option("--wait/--no-wait", default=True, help="Wait until the head has stopped.")
@click.option("--timeout", "timeout_s", default=600.0, show_default=True, help="Seconds to wait.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def down(run_ref: str, wait: bool, timeout_s: float, as_json: bool) -> None:
    """Stop RUN (a run dir or its config) cleanly (final cut, samplers stopped) from
    another terminal."""
    from yeto_core.head import run as run_mod

    run_dir = _run_dir_of(run_ref)
    head = run_mod.live_head(run_dir)
    out: dict[str, Any] = {
        "run_dir": str(run_dir),
        "head_pid": head["pid"] if head else None,
        "requested": False,
        "stopped": None,
        "stop_reason": None,
    }

    def say(msg: str) -> None:
        if not as_json:
            click.echo(msg)

    if head is None:
        say(f"{run_dir}: no head is running; nothing to stop")
    else:
        run_mod.request_down(run_dir)
        out["requested"] = True
        say(f"asked the head (pid {head['pid']}) to stop")
    if head is not None and wait:
        deadline = time.monotonic() + timeout_s
        while run_mod.live_head(run_dir) is not None:
            if time.monotonic() > deadline:
                if as_json:
                    out["stopped"] = False
                    click.echo(json.dumps(out, indent=2, sort_keys=True))
                raise click.ClickException(f"the head did not stop within {timeout_s:g} s")
            time.sleep(0.2)
        st = run_mod.read_json(run_dir / run_mod.STATUS_FILE) or {}
        out["stopped"], out["stop_reason"] = True, st.get("stop_reason", "down")
        say(f"stopped: {out['stop_reason']}")
    if as_json:
        click.echo(json.dumps(out, indent=2, sort_keys=True))


_SCALE_EXIT_CODES = {
    0: "the head scaled the groups (islands launched or released)",
    1: "the head refused (beyond the budget, the run stopping), no head runs on RUN, "
    "or no answer within --timeout",
    2: "RUN is not a run, GROUP=N is malformed, or GROUP is not a sampler group that "
    "scales (the trainer, an unknown or a convertible group, N < 1)",
}


@run.command(epilog=exit_codes(_SCALE_EXIT_CODES))
@click.argument("run_ref", metavar="RUN")
@click.option(
    "--samplers",
    "samplers",
    multiple=True,
    required=True,
    metavar="GROUP=N",
    help="A sampler group ([[samplers]] name) and its new island count; repeatable.",
)
@click.option(
    "--timeout",
    "timeout_s",
    default=600.0,
    show_default=True,
    help="Seconds to wait for the head's answer (launches and releases included).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the head's answer as JSON.")
def scale(run_ref: str, samplers: tuple[str, ...], timeout_s: float, as_json: bool) -> None:
    """Change the sampler count of RUN (a run dir or its config) while it runs.

    The head journals the new count, then launches the new islands or releases
    the ones past it (each drained, its unacknowledged prompts dispensed again).
    A head started again on the run keeps the new count.
    """
    from yeto_core.cli import error
    from yeto_core.head import run as run_mod
    from yeto_core.head.scale import (
        ScaleRefused,
        check_scale,
        parse_samplers,
        request_scale,
        scale_result,
    )

    try:
        counts = parse_samplers(samplers)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    from yeto_core.cli import resolve_started_run

    run_dir, config = resolve_started_run(run_ref)
    try:
        check_scale(config, counts)
    except ScaleRefused as exc:
        error(f"refused: {exc}")
        sys.exit(2)
    head = run_mod.live_head(run_dir)
    if head is None:
        error(
            f"no head runs on {run_dir}: `yeto run scale` changes a running run; set "
            "[[samplers]] count in the config and `yeto run up` it"
        )
        sys.exit(1)
    rid = request_scale(run_dir, counts)
    deadline = time.monotonic() + timeout_s
    while (res := scale_result(run_dir, rid)) is None:
        if run_mod.live_head(run_dir) is None and scale_result(run_dir, rid) is None:
            error(f"the head of {run_dir} stopped before it answered; nothing was scaled")
            sys.exit(1)
        if time.monotonic() > deadline:
            error(f"the head did not answer within {timeout_s:g} s (see its status)")
            sys.exit(1)
        time.sleep(0.1)
    if as_json:
        click.echo(json.dumps(res, indent=2, sort_keys=True))
    if not res.get("ok"):
        error(f"refused: {res.get('message')}")
        sys.exit(1)
    if not as_json:
        click.echo(f"scaled {res.get('message')}")
        if res.get("launched"):
            click.echo(f"  launched {', '.join(res['launched'])}")
        if res.get("released"):
            click.echo(f"  released {', '.join(res['released'])}")


def _lease_lapsed(plugins: Any, config: Any) -> bool:
    """Whether the run's head lease in the store lapsed (its holder paused or hung): then a
    new head takes the run over and the old one is fenced (docs/reliability.md)."""
    import socket

    from yeto_core.head.lease import lease_lapsed, read_lease

    try:
        rec = read_lease(plugins.open_store(config.store_url()))
    except Exception:  # the store is unreachable: the head's own claim decides
        return False
    return rec is not None and lease_lapsed(rec, time.time(), socket.gethostname())
