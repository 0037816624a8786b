"""yeto core: ports, hooks, records, the sample buffer, cuts, schedulers and the CLI."""

from yeto_core.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
