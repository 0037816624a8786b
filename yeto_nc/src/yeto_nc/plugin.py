"""Entry point of yeto-nc (group ``yeto``, name ``nc``): the ``nc`` island provider."""

from yeto_core import hookimpl
from yeto_nc.provider import NcIslands


@hookimpl
def yeto_register_island_providers(register):
    register(NcIslands)
