"""``yeto cost RUN``: what each island of a run cost so far (island-seconds × price)."""

from __future__ import annotations

import json
from typing import Any

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
    billed = billed_by_provider(path, config)
    if as_json:
        out = {"islands": [attrs.asdict(c) for c in costs], "total_usd": total}
        if billed:
            out["billed"] = billed
        click.echo(json.dumps(out, indent=2))
        return
    for c in costs:
        state = "running" if c.running else "stopped"
        click.echo(
            f"{c.island:16} {c.seconds:10.1f} s  × ${c.price_per_hour:g}/h = ${c.usd:.4f}  ({state})"
        )
    click.echo(f"{'total':16} ${total:.4f}")
    for provider, handles in billed.items():
        click.echo(f"billed by the {provider!r} provider (its platform's records):")
        for handle, b in handles.items():
            click.echo(f"  {handle:24} {b['island']:12} {b['seconds']:8.0f} s  ${b['usd']:.6f}")
        click.echo(f"  {'total':24} ${sum(b['usd'] for b in handles.values()):.6f}")


def billed_by_provider(path: Any, config: Any) -> dict[str, dict[str, Any]]:
    """``IslandProvider.billed()`` of every provider of the run that reports any."""
    from yeto_core.plugins import Plugins

    plugins = Plugins()
    out = {}
    for name in config.providers():
        try:
            provider = plugins.island_provider(name).create(path)
        except Exception:  # a provider not installed here has nothing to show
            continue
        billed = provider.billed()
        if billed:
            out[name] = billed
    return out
