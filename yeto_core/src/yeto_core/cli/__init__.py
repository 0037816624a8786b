"""The ``yeto`` command line.

Top-level commands live in their own modules and are imported only when
used, so ``yeto plugins`` stays fast. Plugins add commands through the
``yeto_cli`` hook (``yeto bench`` comes from the yeto-bench dev distribution).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Optional

import click

from yeto_core import __version__

#: command name -> "module:attribute" of a click command (imported on use).
COMMANDS: dict[str, str] = {
    "plugins": "yeto_core.cli.plugins_cmd:plugins",
    "buffer": "yeto_core.cli.buffer_cmd:buffer",
    "run": "yeto_core.cli.run_cmd:run",
    "ledger": "yeto_core.cli.ledger_cmd:ledger",
    "cost": "yeto_core.cli.cost_cmd:cost",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported when they are listed or called."""

    def __init__(self, *args: Any, lazy: Optional[dict[str, str]] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        names.update(n for n in self.lazy if self._load(n) is not None)
        return sorted(names)

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        cmd = super().get_command(ctx, name)
        if cmd is None and name in self.lazy:
            cmd = self._load(name)
        return cmd

    def _load(self, name: str) -> Optional[click.Command]:
        module_name, attr = self.lazy[name].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None  # that command is not part of this installation
            raise
        return getattr(module, attr)


def resolve_run(run: str) -> tuple[Any, Any]:
    """``RUN`` of every command (a run dir or a run config) as (run dir, config); a usage error."""
    from yeto_core.errors import ConfigError
    from yeto_core.head.run_dir import resolve_run as _resolve

    try:
        return _resolve(run)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def resolve_store_url(ref: str) -> str:
    """A store URL, or the store of ``RUN``; a usage error when ``ref`` is neither."""
    from yeto_core.errors import ConfigError
    from yeto_core.head.run_dir import resolve_store_url as _resolve

    try:
        return _resolve(ref)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def _print_version(ctx: click.Context, _param: Any, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from yeto_core.plugins import get_plugins

    click.echo(f"yeto {__version__}")
    for info in get_plugins().infos():
        status = f"  [error: {info.error}]" if info.error else ""
        click.echo(f"  {info.name} ({info.distribution} {info.version}){status}")
    ctx.exit()


class RootGroup(LazyGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, lazy=COMMANDS, **kwargs)
        self._plugins_added = False

    def _add_plugin_commands(self) -> None:
        if self._plugins_added:
            return
        self._plugins_added = True
        from yeto_core.plugins import get_plugins

        get_plugins().add_cli(self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._add_plugin_commands()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        cmd = super().get_command(ctx, name)
        if cmd is None:
            self._add_plugin_commands()
            cmd = super().get_command(ctx, name)
        return cmd


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and the registered plugins.",
)
def cli() -> None:
    """yeto: asynchronous GRPO post-training on elastic GPU fleets."""


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of the ``yeto`` script."""
    from yeto_core.errors import YetoError

    try:
        cli.main(args=argv, prog_name="yeto", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except YetoError as exc:
        click.echo(f"yeto: error: {exc}", err=True)
        sys.exit(2)
