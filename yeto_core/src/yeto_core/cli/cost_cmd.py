"""``yeto cost RUN``: what each island of a run cost so far (island-seconds × price)."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command()
@click.argument("run_dir", metavar="RUN", type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cost(run_dir: str, as_json: bool) -> None:
    """Island-seconds and dollars per island of RUN (a run dir), from its cost ledger."""
    import attrs

    from yeto_core.cost import CostLedger
    from yeto_core.run_dir import load_run_config

    path = Path(run_dir)
    try:
        prices = load_run_config(path).island_prices()
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{path}: no config.json ({exc}); is it a run dir?") from None
    ledger = CostLedger(path, prices)
    costs = ledger.costs()
    total = sum(c.usd for c in costs)
    if as_json:
        click.echo(
            json.dumps({"islands": [attrs.asdict(c) for c in costs], "total_usd": total}, indent=2)
        )
        return
    for c in costs:
        state = "running" if c.running else "stopped"
        click.echo(
            f"{c.island:16} {c.seconds:10.1f} s  × ${c.price_per_hour:g}/h = ${c.usd:.4f}  ({state})"
        )
    click.echo(f"{'total':16} ${total:.4f}")
