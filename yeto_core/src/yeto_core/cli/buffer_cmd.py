"""``yeto buffer …``: inspect a run's durable sample buffer."""

from __future__ import annotations

import json

import click

from yeto_core.cli import exit_codes


@click.group()
def buffer() -> None:
    """Inspect the durable sample buffer of a run's store."""


@buffer.command(
    epilog=exit_codes({2: "RUN is not a run, a store URL or a store directory, or never ran"})
)
@click.argument("run", metavar="RUN")
@click.option("--prefix", default="buffer", show_default=True, help="Key prefix of the buffer.")
@click.option(
    "--layout",
    type=click.Choice(["auto", "jsonl", "objects", "shards"]),
    default="auto",
    show_default=True,
    help="Index layout the run uses.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def stats(run: str, prefix: str, layout: str, as_json: bool) -> None:
    """Backlog, watermark, head position, stale counts and data end of RUN's buffer.

    RUN is a run dir or a run config (TOML); a store URL or a store directory works too.
    """
    from yeto_core.buffer.sample_buffer import open_buffer
    from yeto_core.cli import resolve_store_url
    from yeto_core.plugins import get_plugins

    store_url = resolve_store_url(run)
    store = get_plugins().open_store(store_url)
    buf = open_buffer(store, prefix=prefix, layout=layout, read_only=True)
    try:
        info = buf.stats()
    finally:
        buf.close()
    info = {"store": store_url, **info}
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"buffer of {store_url}")
    table.add_column("field")
    table.add_column("value", justify="right")
    for key, value in info.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "-"
        table.add_row(key.replace("_", " "), "-" if value is None else str(value))
    Console().print(table)
