"""Entry point of yeto-dashboard (group ``yeto``, name ``dashboard``): the ``yeto dashboard`` command."""

from __future__ import annotations

from yeto_core import hookimpl


@hookimpl
def yeto_cli(group):
    from yeto_dashboard.cli import dashboard

    group.add_command(dashboard)
