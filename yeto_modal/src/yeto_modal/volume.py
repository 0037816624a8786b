"""The ``modal-volume`` object store (``modal-volume://VOLUME/PREFIX[?environment=ENV]``): one SDK
call per verb, never a mount; no atomic create-if-absent (docs/modal.md: The modal-volume store)."""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

from yeto_core.errors import ConfigError, NotFoundError, StoreError
from yeto_core.ports import ObjectStore
from yeto_core.stores.keys import check_key, check_prefix
from yeto_modal import refuse_unknown

SCHEME = "modal-volume"
OPEN_FILES = "there are open files preventing the operation"


@contextlib.contextmanager
def _sdk_errors(volume: str, path: str = "") -> Iterator[None]:
    """Modal's errors as ours: a missing ``path`` is FileNotFoundError, the rest StoreError."""
    import modal.exception as mx

    try:
        yield
    except mx.NotFoundError:
        raise FileNotFoundError(path) from None
    except mx.AuthError as exc:
        raise StoreError(
            f"Modal volume {volume!r}: no valid Modal token ({exc}); run `modal token new` or "
            "set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"
        ) from None
    except (mx.Error, ConnectionError) as exc:
        raise StoreError(f"Modal volume {volume!r}: {type(exc).__name__}: {exc}") from exc


class VolumeSeam:
    """The Volume calls the store makes, on absolute paths in it (tests put a double here)."""

    def __init__(self, name: str, environment: Optional[str] = None) -> None:
        import modal

        self.name = name
        self.volume = modal.Volume.from_name(
            name, environment_name=environment, create_if_missing=True
        )

    def upload(self, path: str, data: bytes, *, overwrite: bool) -> None:
        """Write one file; ``FileExistsError`` when it exists and not ``overwrite``."""
        with _sdk_errors(self.name), self.volume.batch_upload(force=overwrite) as batch:
            batch.put_file(io.BytesIO(data), path)

    def read(self, path: str) -> bytes:
        """The file's bytes; ``FileNotFoundError`` when there is no such file."""
        with _sdk_errors(self.name, path):
            return b"".join(self.volume.read_file(path))

    def files(self, path: str) -> list[str]:
        """Paths of every file under the directory ``path`` (none when it is missing)."""
        from modal.volume import FileEntryType

        try:
            with _sdk_errors(self.name, path):
                entries = self.volume.listdir(path, recursive=True)
        except FileNotFoundError:
            return []
        return [e.path for e in entries if e.type == FileEntryType.FILE]

    def remove(self, path: str) -> None:
        """Remove one file; ``FileNotFoundError`` when there is none."""
        with _sdk_errors(self.name, path):
            self.volume.remove_file(path)

    def reload(self) -> None:
        """Refresh this container's mount (``RuntimeError`` while a file is open)."""
        self.volume.reload()


#: Makes ``put_if_absent`` exclusive among this process's threads (not across processes).
_CREATE_LOCK = threading.Lock()


def parse_volume_url(url: str) -> tuple[str, str, Optional[str]]:
    """``modal-volume://NAME/PREFIX?environment=ENV`` → (name, prefix, environment)."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME or not parts.netloc:
        raise ConfigError(
            f"store URL {url!r} is not a Modal Volume URL; write modal-volume://VOLUME/PREFIX"
        )
    prefix = parts.path.strip("/")
    if prefix:
        check_prefix(prefix)
    query = parse_qs(parts.query)
    refuse_unknown(f"store URL {url!r}", query, ["environment"])
    return parts.netloc, prefix, query.get("environment", [None])[0]


class ModalVolumeStore(ObjectStore):
    """Objects as files under ``prefix`` in the Volume ``volume`` (created when missing)."""

    PLUGIN_NAME = "modal-volume"
    URL_SCHEMES = (SCHEME,)

    #: Builds the seam from (volume, environment); tests replace it with a double.
    seam_factory: Callable[..., Any] = VolumeSeam

    def __init__(
        self,
        volume: str,
        prefix: str = "",
        *,
        environment: Optional[str] = None,
        seam: Any = None,
    ) -> None:
        self.volume = volume
        self.prefix = prefix.strip("/")
        self.environment = environment
        self.seam = seam if seam is not None else type(self).seam_factory(volume, environment)
        self._root = f"/{self.prefix}/" if self.prefix else "/"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ModalVolumeStore:
        name, prefix, env = parse_volume_url(url)
        refuse_unknown("modal-volume store options", options, ["environment"])
        return cls(name, prefix, environment=options.get("environment") or env)

    def url(self) -> str:
        tail = f"?environment={self.environment}" if self.environment else ""
        return f"{SCHEME}://{self.volume}/{self.prefix}{tail}"

    def credentials_env(self) -> dict[str, str]:
        """Modal's token variables when the head has them (containers on Modal need none)."""
        return {
            k: os.environ[k] for k in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET") if k in os.environ
        }

    def capabilities(self) -> dict[str, Any]:
        """What the store guarantees, for preflight."""
        return {
            "atomic_put": True,
            "atomic_create_if_absent": False,
            "create_if_absent_scope": "process",
            "list_after": True,
        }

    def __repr__(self) -> str:
        return f"ModalVolumeStore({self.url()!r})"

    def _path(self, key: str) -> str:
        return self._root + check_key(key)

    def get(self, key: str) -> bytes:
        try:
            return self.seam.read(self._path(key))
        except (FileNotFoundError, IsADirectoryError):
            raise NotFoundError(f"{key} (in {self.url()})") from None

    def put(self, key: str, data: bytes) -> None:
        self.seam.upload(self._path(key), bytes(data), overwrite=True)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        with _CREATE_LOCK:
            try:
                self.seam.upload(path, bytes(data), overwrite=False)
            except FileExistsError:
                return False
        return True

    def exists(self, key: str) -> bool:
        try:
            self.seam.read(self._path(key))
        except (FileNotFoundError, IsADirectoryError):
            return False
        return True

    def list(self, prefix: str = "", after: Optional[str] = None) -> Iterator[str]:
        check_prefix(prefix)
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        inside = self._root.lstrip("/")  # listdir paths are relative to the volume root
        paths = (p.lstrip("/") for p in self.seam.files((self._root + folder).rstrip("/") or "/"))
        keys = (p[len(inside) :] for p in paths if p.startswith(inside))
        return iter(
            sorted(k for k in keys if k.startswith(prefix) and (after is None or k > after))
        )

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.seam.remove(self._path(key))


def reload_mount(seam: Any, *, attempts: int = 5, wait_s: float = 0.5, sleep=time.sleep) -> int:
    """Reload a mounted volume, retrying while files are open (then StoreError); attempts used."""
    for attempt in range(1, attempts + 1):
        try:
            seam.reload()
            return attempt
        except RuntimeError as exc:
            if OPEN_FILES not in str(exc) or attempt == attempts:
                raise StoreError(
                    f"cannot reload Modal volume {getattr(seam, 'name', '?')!r}: {exc}. A volume "
                    "reloads only while none of its files is open: close them (or reload before "
                    "the engine opens model files)"
                ) from exc
            sleep(wait_s)
    return attempts
