"""yeto-core's built-in implementations, registered through the same hooks as plugins.

Each hook imports its classes lazily so that ``yeto plugins`` stays fast.
"""

from __future__ import annotations

from yeto_core.hookspecs import hookimpl


@hookimpl
def yeto_register_object_stores(register):
    from yeto_core.stores.dir_store import DirStore

    register(DirStore)
