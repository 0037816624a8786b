"""A third-party yeto plugin: the ``memory`` object store (``memory://name``), the
``tempdir`` island provider (each island a process group in a fresh empty directory)
and a ``yeto_event`` observer (every event of every stream to ``YETO_EXAMPLE_EVENTS``)."""

from yeto_core import hookimpl
from yeto_core.errors import NotFoundError
from yeto_core.ports import ObjectStore
from yeto_core.stores.keys import check_key, check_prefix

_SPACES: dict[str, dict[str, bytes]] = {}


class MemoryStore(ObjectStore):
    PLUGIN_NAME = "memory"
    URL_SCHEMES = ("memory",)

    def __init__(self, name: str) -> None:
        self.name, self._d = name, _SPACES.setdefault(name, {})

    @classmethod
    def from_url(cls, url, **options):
        return cls(url.split("://", 1)[1])

    def url(self):
        return f"memory://{self.name}"

    def get(self, key):
        try:
            return self._d[check_key(key)]
        except KeyError:
            raise NotFoundError(f"no object {key!r} in memory://{self.name}") from None

    def put(self, key, data):
        self._d[check_key(key)] = bytes(data)

    def put_if_absent(self, key, data):
        if check_key(key) in self._d:
            return False
        self._d[key] = bytes(data)
        return True

    def exists(self, key):
        return check_key(key) in self._d

    def list(self, prefix="", after=None):
        check_prefix(prefix)
        keys = (k for k in self._d if k.startswith(prefix) and (after is None or k > after))
        return iter(sorted(keys))

    def delete(self, key):
        self._d.pop(check_key(key), None)


@hookimpl
def yeto_register_object_stores(register):
    register(MemoryStore)


@hookimpl
def yeto_register_island_providers(register):
    from yeto_example_memory.islands import TempDirIslands

    register(TempDirIslands)


@hookimpl
def yeto_event(event):
    from yeto_example_memory.observer import observe

    observe(event)
