"""Compare-and-swap on the ``dir`` store: :class:`DirCompareAndSwap`, a mixin of
:class:`~yeto_core.stores.dir_store.DirStore` (``get_versioned``, ``put_if_match``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from yeto_core.ports.store import content_version
from yeto_core.stores.files import mkstemp
from yeto_core.stores.fsync import fsync_dir

_TMP_MARK = ".tmp-"
_CAS_MARK = ".tmp-cas"  # the versions of a compare-and-swap key (a tmp-shaped name: unlisted)


def _unlink_quietly(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class DirCompareAndSwap:
    """Numbered versions of a key, each created exclusively (the host holds ``fsync``
    and the key-to-path helpers ``_path``, ``_ensure_parent``, ``_refuse_prefix_dir``,
    ``_write_tmp(key, path, data, sync=)`` and ``get``)."""

    # -- compare-and-swap: numbered versions, each created exclusively --------------------
    #
    # A key written by put_if_match keeps its versions as ``.<name>.tmp-cas/<seq:012d>``
    # beside it (never listed, like temporary files): the next version is *created*
    # with ``link`` (atomic and exclusive, no lock held), so of two writers swapping from
    # version ``n`` exactly one creates ``n + 1``, and a writer paused at any point blocks
    # nobody. ``get`` reads the newest version; the key's own file is a copy for
    # ``list``/``exists`` (written after the version, so it may lag, never lead).

    def _cas_dir(self, path: Path) -> Path:
        return path.parent / f".{path.name}{_CAS_MARK}"

    @staticmethod
    def _versions(cdir: Path) -> list[int]:
        try:
            names = os.listdir(cdir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(n) for n in names if n.isdigit())

    def _read_cas(self, path: Path) -> Optional[tuple[bytes, int]]:
        cdir = self._cas_dir(path)
        for _ in range(8):
            vs = self._versions(cdir)
            if not vs:
                return None
            try:
                return (cdir / f"{vs[-1]:012d}").read_bytes(), vs[-1]
            except FileNotFoundError:
                continue  # pruned or deleted while we looked: look again
        return None

    def _create_version(self, key: str, path: Path, seq: int, payload: bytes) -> bool:
        cdir = self._cas_dir(path)
        if not cdir.is_dir():
            cdir.mkdir(exist_ok=True)
            if self.fsync:
                fsync_dir(path.parent)
        fd, tmp = mkstemp(prefix=f".v{_TMP_MARK}", dir=cdir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            try:
                os.link(tmp, cdir / f"{seq:012d}")
            except FileExistsError:
                return False
        finally:
            _unlink_quietly(tmp)
        if self.fsync:
            fsync_dir(cdir)
        for old in self._versions(cdir):
            if old < seq - 4:
                _unlink_quietly(cdir / f"{old:012d}")
        return True

    def _mirror(self, key: str, path: Path, payload: bytes) -> None:
        # not fsynced: get and exists read the versions (each fsynced); the copy only
        # makes the key listed and wakes watchers, and the next swap rewrites it
        tmp = self._write_tmp(key, path, payload, sync=False)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        path = self._path(key)
        got = self._read_cas(path)
        if got is not None:
            return got[0], f"v{got[1]}"
        data = self.get(key)
        return data, "v0:" + content_version(data)

    def put_if_match(self, key: str, data: bytes, version: Optional[str]) -> Optional[str]:
        path = self._path(key)
        payload = bytes(data)
        self._ensure_parent(key, path)
        self._refuse_prefix_dir(key, path)
        cur = self._read_cas(path)
        if version is None:
            if cur is not None or os.path.lexists(path):
                return None
            seq = 1
        elif version.startswith("v0:"):  # an object written by a plain put
            if cur is not None:
                return None
            try:
                plain = path.read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
            if "v0:" + content_version(plain) != version:
                return None
            seq = 1
        else:
            try:
                seq = int(version[1:]) + 1
            except ValueError:
                return None
            if cur is None or cur[1] != seq - 1:
                return None
        if not self._create_version(key, path, seq, payload):
            return None
        self._mirror(key, path, payload)
        return f"v{seq}"
