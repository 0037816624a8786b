"""Entry point of yeto-bench (group ``yeto``, name ``bench``): adds ``yeto bench``."""

from yeto_core import hookimpl


@hookimpl
def yeto_cli(group):
    from yeto_bench.cli import bench

    group.add_command(bench)
