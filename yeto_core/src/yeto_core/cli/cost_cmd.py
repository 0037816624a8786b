"""``yeto cost RUN``: what each island of a run cost so far (island-seconds × price)."""

from __future__ import annotations

import json

import click


@click.command()
@click.argument("run", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cost(run: str, as_json: bool) -> None:
    """Island-seconds and dollars per island of RUN (a run dir or its config), from its cost ledger."""
    import attrs

    from yeto_core.cli import resolve_run
    from yeto_core.cost import CostLedger

    path, config = resolve_run(run)
    ledger = CostLedger(path, config.island_prices())
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
