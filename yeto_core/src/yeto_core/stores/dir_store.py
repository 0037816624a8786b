"""The ``dir`` object store: a local directory (or any POSIX mount).

Durability: ``put`` writes a temporary file in the target directory, fsyncs
it, renames it over the key and fsyncs the directory, so a crash leaves the
old object or the new one. ``put_if_absent`` links the fsynced temporary file
to the key (``link`` fails if the key exists), which is atomic and exclusive
on POSIX file systems. Temporary files are named ``.<name>.tmp-*`` and never
listed.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from yeto_core.errors import NotFoundError, StoreError
from yeto_core.ports import ObjectStore
from yeto_core.stores.keys import check_key, check_prefix

_TMP_MARK = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirStore(ObjectStore):
    """Objects as files under a root directory (``/path``, ``file:///path``)."""

    PLUGIN_NAME = "dir"
    URL_SCHEMES = ("file",)

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root).absolute()
        self.fsync = fsync
        self.root.mkdir(parents=True, exist_ok=True)
        self._made_dirs: set[Path] = {self.root}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DirStore:
        path = url[len("file://") :] if url.startswith("file://") else url
        if not path:
            raise StoreError("empty directory store URL; give a path such as ./runs/demo")
        return cls(path, **options)

    def url(self) -> str:
        return str(self.root)

    # -- helpers -----------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _ensure_parent(self, path: Path) -> None:
        parent = path.parent
        if parent in self._made_dirs:
            return
        missing = []
        p = parent
        while not p.exists():
            missing.append(p)
            p = p.parent
        parent.mkdir(parents=True, exist_ok=True)
        if self.fsync:
            # New directories must be durable in their parents before a file in them is.
            for d in reversed(missing):
                _fsync_dir(d.parent)
        self._made_dirs.add(parent)

    def _write_tmp(self, path: Path, data: bytes) -> str:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{_TMP_MARK}", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return tmp

    # -- port --------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"no object {key!r} in {self.root}") from None
        except IsADirectoryError:
            raise NotFoundError(f"{key!r} in {self.root} is a prefix, not an object") from None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._ensure_parent(path)
        tmp = self._write_tmp(path, bytes(data))
        try:
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        if self.fsync:
            _fsync_dir(path.parent)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        self._ensure_parent(path)
        if path.exists():
            return False
        tmp = self._write_tmp(path, bytes(data))
        try:
            os.link(tmp, path)
            created = True
        except FileExistsError:
            created = False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            # File systems without hard links: exclusive create, then write in place.
            created = self._create_exclusive(path, data)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        if created and self.fsync:
            _fsync_dir(path.parent)
        return created

    def _create_exclusive(self, path: Path, data: bytes) -> bool:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        return True

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "", after: Optional[str] = None) -> Iterator[str]:
        check_prefix(prefix)
        # Walk only the directory that can hold the prefix.
        base_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root / base_rel if base_rel else self.root
        if not base.is_dir():
            return iter(())
        keys = []
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = os.path.relpath(dirpath, self.root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            # Prune directories that cannot match the prefix or lie before `after`.
            dirnames[:] = [
                d
                for d in dirnames
                if (rel_dir + d + "/").startswith(prefix) or prefix.startswith(rel_dir + d + "/")
            ]
            for name in filenames:
                if name.startswith(".") and _TMP_MARK in name:
                    continue
                key = rel_dir + name
                if key.startswith(prefix) and (after is None or key > after):
                    keys.append(key)
        keys.sort()
        return iter(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        if self.fsync:
            _fsync_dir(path.parent)
