"""``yeto plugins``: what is installed and what each plugin provides."""

from __future__ import annotations

import json

import attrs
import click

from yeto_core.cli import exit_codes


@click.command(epilog=exit_codes())
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def plugins(as_json: bool) -> None:
    """List installed plugins, what they provide, and load errors."""
    from yeto_core.plugins import DISABLE_ENV, get_plugins

    infos = get_plugins().infos()
    if as_json:
        click.echo(json.dumps([attrs.asdict(i) for i in infos], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="yeto plugins")
    table.add_column("plugin")
    table.add_column("distribution")
    table.add_column("version")
    table.add_column("provides")
    table.add_column("error", style="red")
    for info in infos:
        provides = "\n".join(f"{port}: {', '.join(names)}" for port, names in info.provides.items())
        planned = "\n".join(
            f"{port}: {', '.join(names)} (planned)" for port, names in info.planned.items()
        )
        provides = "\n".join(p for p in (provides, planned) if p)
        if info.disabled:
            provides = f"disabled ({DISABLE_ENV})"
        table.add_row(info.name, info.distribution, info.version, provides or "-", info.error or "")
    Console().print(table)
