"""``yeto dashboard RUN``: serve a live page of RUN on 127.0.0.1, or ``--export`` one file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from yeto_core.cli import exit_codes


@click.command(
    epilog=exit_codes(
        {1: "RUN cannot be read, or the export or the server failed (the message says why)"}
    )
)
@click.argument("run_ref", metavar="RUN")
@click.option(
    "--run-id",
    default=None,
    help="With a store URL (or store directory) holding several runs: the run's prefix under it.",
)
@click.option(
    "--port",
    default=8765,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port on 127.0.0.1 (0: any free port).",
)
@click.option(
    "--export",
    "export_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a self-contained HTML report of RUN to this file and exit (no server).",
)
@click.option(
    "--refresh",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.2, 60.0),
    help="Seconds between the page's updates.",
)
def dashboard(
    run_ref: str, run_id: Optional[str], port: int, export_path: Optional[str], refresh: float
) -> None:
    """Show RUN (a run dir, a store directory or a store URL) as a live web page.

    \b
    The page updates while the run goes on and works on a finished run. It only
    reads the run's store and run dir; it never writes to them. Served on
    127.0.0.1 only. With --export, writes one HTML file (data, styles and the
    chart library inlined; it opens offline) and exits.
    """
    from yeto_dashboard.source import DashboardError, open_run

    try:
        source = open_run(run_ref, run_id)
    except DashboardError as exc:
        raise click.ClickException(str(exc)) from None
    if export_path:
        from yeto_dashboard.export import export_html

        try:
            out = export_html(source, Path(export_path))
        except DashboardError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(
            f"wrote {out} ({out.stat().st_size // 1024} KiB): the dashboard of {source.label}"
        )
        return
    from yeto_dashboard.server import serve

    serve(source, port=port, refresh_s=refresh, say=click.echo)
