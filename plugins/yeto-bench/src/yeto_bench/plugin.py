"""Entry point of yeto-bench (group ``yeto``, name ``bench``): ``yeto bench`` and the
``faulty://`` store the fault campaign runs on."""

from yeto_core import hookimpl


@hookimpl
def yeto_cli(group):
    from yeto_bench.cli import bench

    group.add_command(bench)


@hookimpl
def yeto_register_object_stores(register):
    from yeto_bench.faulty_store import FaultyStore

    register(FaultyStore)
