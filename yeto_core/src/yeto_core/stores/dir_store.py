"""The ``dir`` object store: a local directory (or any POSIX mount).

Durability: ``put`` writes a temporary file in the target directory, fsyncs
it, renames it over the key and fsyncs the directory, so a crash leaves the
old object or the new one, never a part. ``put_if_absent`` hard-links the
fsynced temporary file to the key (``link`` fails if the key exists), which
is atomic and exclusive on POSIX file systems; on a file system without hard
links it falls back to ``O_CREAT|O_EXCL`` (still exclusive, but a crash in the
middle of that write can leave a short object: such mounts are refused for
nothing, so prefer one with hard links). Temporary files are named
``.<name>.tmp-*``, never listed, and keys with that shape are refused.

``list`` walks only the directories that can hold the prefix, prunes whole
directories that sort at or before ``after``, and sorts one directory at a
time after filtering, so listing ``buffer/index/`` after a recent key costs
one ``scandir`` of that directory plus a sort of the few newer names. Keys
are yielded lazily in lexicographic order.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional
from urllib.parse import unquote, urlsplit

from yeto_core.errors import InvalidKeyError, NotFoundError, StoreError
from yeto_core.ports import ObjectStore
from yeto_core.stores.dir_cas import (  # noqa: F401 - re-exported
    _CAS_MARK,
    _TMP_MARK,
    DirCompareAndSwap,
    _unlink_quietly,
)
from yeto_core.stores.files import FILE_MODE, random_suffix
from yeto_core.stores.files import mkstemp as _mkstemp
from yeto_core.stores.fsync import fsync_dir
from yeto_core.stores.keys import check_key, check_prefix
from yeto_core.stores.parallel import on_pool
from yeto_core.stores.watch import Watch

_EUID = os.geteuid()
#: errors of ``link`` that mean "this file system will not link it here" (no hard links,
#: another device, a full link count): create or copy instead
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK)


def _is_tmp_name(name: str) -> bool:
    return name.startswith(".") and _TMP_MARK in name


def path_from_file_url(url: str) -> str:
    """The local path of ``file:///abs``, ``file://localhost/abs`` or a bare path."""
    if not url.startswith("file:"):
        return url
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise StoreError(
            f"file URL {url!r} names host {parts.netloc!r}; a dir store is local: "
            "use file:///absolute/path or a plain path"
        )
    if parts.query or parts.fragment:
        raise StoreError(f"file URL {url!r} has a query or fragment; give only a path")
    return unquote(parts.path)


class DirStore(DirCompareAndSwap, ObjectStore):
    """Objects as files under a root directory (``/path``, ``file:///path``)."""

    PLUGIN_NAME = "dir"
    URL_SCHEMES = ("file",)

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root).absolute()
        self.fsync = bool(fsync)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(
                f"dir store root {self.root} exists and is not a directory; "
                "choose another path for the store"
            ) from None
        self._root_s = str(self.root).rstrip("/")  # "" for "/": keys join as "/key"
        self._made_dirs: set[str] = {str(self.root)}  # directories known to exist (strings)
        self._shard_dirs: set[Path] = set()  # compare-and-swap version folders known to exist
        self._newest_seen: dict[Path, int] = {}  # per swapped key: the newest number seen

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DirStore:
        path = path_from_file_url(url)
        if not path:
            raise StoreError("empty directory store URL; give a path such as ./runs/demo")
        return cls(path, **options)

    def url(self) -> str:
        return str(self.root)

    def local_root(self) -> Path:
        return self.root

    def fsyncs(self) -> bool:
        return self.fsync

    def __repr__(self) -> str:
        return f"DirStore({str(self.root)!r})"

    # -- helpers -----------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        check_key(key)
        name = key.rsplit("/", 1)[-1]
        if _is_tmp_name(name):
            raise InvalidKeyError(
                f"object store key {key!r} has the shape of a dir store temporary file "
                f"('.<name>{_TMP_MARK}…'); choose another name"
            )
        return self.root / key

    def _spath(self, key: str) -> str:
        """:meth:`_path` as a string (the hot paths skip building ``Path`` objects)."""
        check_key(key)
        if _is_tmp_name(key.rpartition("/")[2]):
            self._path(key)  # raises
        return f"{self._root_s}/{key}"

    def _ensure_parent(self, key: str, path: str | Path) -> None:
        parent_s = os.path.dirname(path)
        if parent_s in self._made_dirs:
            return
        parent = Path(parent_s)
        missing = []
        p = parent
        while not p.exists():
            missing.append(p)
            p = p.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(
                f"cannot write {key!r} in {self.root}: a part of its path is an object, "
                "not a prefix (a dir store cannot hold both 'a' and 'a/b')"
            ) from None
        if self.fsync:
            # New directories must be durable in their parents before a file in them is.
            for d in reversed(missing):
                fsync_dir(d.parent)
        self._made_dirs.add(parent_s)

    def _write_tmp(self, key: str, path: str | Path, data: bytes, *, sync: bool = True) -> str:
        parent, _, name = os.fspath(path).rpartition("/")
        try:
            fd, tmp = _mkstemp(prefix=f".{name}{_TMP_MARK}", dir=parent)
        except FileNotFoundError:
            # The directory vanished behind our back (removed by hand): make it again.
            self._made_dirs.discard(parent)
            self._ensure_parent(key, path)
            fd, tmp = _mkstemp(prefix=f".{name}{_TMP_MARK}", dir=parent)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if self.fsync and sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        return tmp

    def _refuse_prefix_dir(self, key: str, path: str | Path) -> None:
        if os.path.isdir(path):
            raise StoreError(
                f"cannot write {key!r} in {self.root}: it is a prefix of other objects "
                "(a dir store cannot hold both 'a' and 'a/b')"
            )

    # -- port --------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        path = self._path(key)
        got = self._read_cas(path)
        if got is not None:
            return got[0]
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFoundError(f"no object {key!r} in {self.root}") from None
        except IsADirectoryError:
            raise NotFoundError(f"{key!r} in {self.root} is a prefix, not an object") from None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        payload = bytes(data)
        self._ensure_parent(key, path)
        self._refuse_prefix_dir(key, path)
        if self._cas_dir(path).is_dir():  # a compare-and-swap key: a plain put is a version too
            while True:
                cur = self._read_cas(path)
                if self._create_version(key, path, (cur[1] if cur else 0) + 1, payload):
                    break
        self._replace_into(key, self._write_tmp(key, path, payload), path)
        if self.fsync:
            fsync_dir(path.parent)

    def _replace_into(self, key: str, tmp: str | Path, path: str | Path) -> None:
        """Rename the temporary file ``tmp`` over ``path``; ``tmp`` is removed when that
        fails (a prefix directory at ``path`` is refused as such)."""
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            _unlink_quietly(tmp)
            self._refuse_prefix_dir(key, path)
            raise
        except BaseException:
            _unlink_quietly(tmp)
            raise

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._spath(key)
        payload = bytes(data)
        self._ensure_parent(key, path)
        # one access() (no exception when absent, the usual case): an object there is
        # kept, a prefix directory refused
        if os.access(path, os.F_OK):
            self._refuse_prefix_dir(key, path)
            return False
        tmp = self._write_tmp(key, path, payload)
        try:
            os.link(tmp, path)
            created = True
        except FileExistsError:
            self._refuse_prefix_dir(key, path)
            created = False
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            # File systems without hard links: exclusive create, then write in place.
            created = self._create_exclusive(path, payload)
        finally:
            _unlink_quietly(tmp)
        if created and self.fsync:
            fsync_dir(os.path.dirname(path))
        return created

    def watch(self, prefix: str) -> Watch:
        """An inotify watch on ``prefix``'s directory (a sleep where inotify is missing)."""
        from yeto_core.stores.watch import dir_watch

        check_prefix(prefix.rstrip("/") + "/" if prefix else "")
        return dir_watch(self.root / prefix.strip("/"))

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        """:meth:`put` of several objects: temporary files fsynced together, renamed into
        place, then each directory that got a name fsynced once."""
        if not self.fsync or len(items) < 2 or len({k for k, _ in items}) < len(items):
            for k, d in items:
                self.put(k, d)
            return
        staged: list[tuple[str, Path, str, int]] = []
        try:
            for key, data in items:
                path = self._path(key)
                self._ensure_parent(key, path)
                self._refuse_prefix_dir(key, path)
                fd, tmp = _mkstemp(prefix=f".{path.name}{_TMP_MARK}", dir=path.parent)
                staged.append((key, path, tmp, fd))
                view = memoryview(bytes(data))
                while view:
                    view = view[os.write(fd, view) :]
            _fsync_all([fd for *_, fd in staged])
        except BaseException:
            for *_, tmp, fd in staged:
                os.close(fd)
                _unlink_quietly(tmp)
            raise
        for *_, fd in staged:
            os.close(fd)
        done = 0
        try:
            for key, path, tmp, _fd in staged:
                try:
                    os.replace(tmp, path)
                except IsADirectoryError:
                    self._refuse_prefix_dir(key, path)
                    raise
                done += 1
        finally:
            for *_, tmp, _fd in staged[done:]:
                _unlink_quietly(tmp)
        for d in sorted({path.parent for _, path, _, _ in staged}):
            fsync_dir(d)

    def put_files(self, items: list[tuple[str, Path]]) -> None:
        """:meth:`put_many` of local files, **hard-linked** into place: no copy is written.

        Every file is fsynced first (concurrently; its mode set to the store's
        :data:`~yeto_core.stores.files.FILE_MODE`), then linked to its key (over an
        existing object: linked to a temporary name and renamed, so a reader sees the
        old object or the new one), and each directory that got a name is fsynced
        once. A file this store cannot link (on another file system, links refused)
        or that has other names (a link the caller kept elsewhere) or another owner is
        copied, as :meth:`put_many` does. The caller hands the files over: a linked file
        *is* the object, so changing it afterwards would change the object.
        """
        if len({k for k, _ in items}) < len(items):
            super().put_files(items)  # a key twice: put in order, the last one wins
            return
        linkable: list[tuple[str, Path, str]] = []
        copies: list[tuple[str, Path]] = []
        fds: list[int] = []
        try:
            for key, src in items:
                path = self._path(key)
                self._ensure_parent(key, path)
                self._refuse_prefix_dir(key, path)
                fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
                st = os.fstat(fd)
                if st.st_nlink != 1 or not stat.S_ISREG(st.st_mode) or st.st_uid != _EUID:
                    os.close(fd)
                    copies.append((key, Path(src)))
                    continue
                fds.append(fd)
                if stat.S_IMODE(st.st_mode) != FILE_MODE:
                    os.fchmod(fd, FILE_MODE)
                linkable.append((key, path, os.fspath(src)))
            if self.fsync:
                _fsync_all(fds)
        finally:
            for fd in fds:
                os.close(fd)
        dirs: set[Path] = set()
        for key, path, src in linkable:
            if self._link_over(key, src, path):
                dirs.add(path.parent)
            else:
                copies.append((key, Path(src)))
        if self.fsync:
            for d in sorted(dirs):
                fsync_dir(d)
        if copies:
            self.put_many([(k, p.read_bytes()) for k, p in copies])

    def _link_over(self, key: str, src: str, path: Path) -> bool:
        """Hard-link ``src`` to ``path``, atomically over an object already there (a link to
        a temporary name, renamed); False when the file system refuses the link."""
        try:
            os.link(src, path)
            return True
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno in _NO_LINK:
                return False
            raise
        tmp = path.parent / f".{path.name}{_TMP_MARK}{random_suffix()}"
        try:
            os.link(src, tmp)
        except OSError as exc:
            if exc.errno in _NO_LINK:
                return False
            raise
        self._replace_into(key, tmp, path)
        return True

    def put_many_if_absent(self, items: list[tuple[str, bytes]]) -> list[bool]:
        """:meth:`put_if_absent` of several objects, synced together.

        Every new object's bytes are written to a temporary file; the files are
        fsynced concurrently (the file system commits them in one journal
        transaction where it can), then linked into place, and each directory that
        got a new name is fsynced once. Every created object is durable on return;
        a crash before leaves temporary files only (never a visible partial object).
        """
        if not self.fsync or len(items) < 2:
            return [self.put_if_absent(k, d) for k, d in items]
        out: list[bool] = [False] * len(items)
        staged: list[tuple[int, str, Path, str, int]] = []  # (slot, key, path, tmp, fd)
        seen: set[Path] = set()
        try:
            for slot, (key, data) in enumerate(items):
                path = self._path(key)
                self._ensure_parent(key, path)
                self._refuse_prefix_dir(key, path)
                if path in seen or os.path.lexists(path):
                    continue  # a repeat in the batch or already there: put_if_absent below
                seen.add(path)
                fd, tmp = _mkstemp(prefix=f".{path.name}{_TMP_MARK}", dir=path.parent)
                staged.append((slot, key, path, tmp, fd))
                view = memoryview(bytes(data))
                while view:
                    view = view[os.write(fd, view) :]
            _fsync_all([fd for *_, fd in staged])
        except BaseException:
            for *_, tmp, fd in staged:
                os.close(fd)
                _unlink_quietly(tmp)
            raise
        dirs: set[Path] = set()
        for *_, fd in staged:
            os.close(fd)
        try:
            for slot, key, path, tmp, _fd in staged:
                try:
                    os.link(tmp, path)
                    out[slot] = True
                    dirs.add(path.parent)
                except FileExistsError:
                    self._refuse_prefix_dir(key, path)
                except OSError as exc:
                    if exc.errno not in _NO_LINK:
                        raise
                    out[slot] = self._create_exclusive(path, items[slot][1])
                    if out[slot]:
                        dirs.add(path.parent)
        finally:
            for *_, tmp, _fd in staged:
                _unlink_quietly(tmp)
        for d in sorted(dirs):
            fsync_dir(d)
        done = {slot for slot, *_ in staged}
        for slot, (key, data) in enumerate(items):
            if slot not in done:  # repeats and existing keys: the plain path decides
                out[slot] = self.put_if_absent(key, data)
        return out

    def _create_exclusive(self, path: str | Path, data: bytes) -> bool:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        return True

    ATOMIC_CAS = True

    def exists(self, key: str) -> bool:
        path = self._path(key)
        return path.is_file() or self._newest(self._cas_dir(path)) is not None

    def list(self, prefix: str = "", after: Optional[str] = None) -> Iterator[str]:
        check_prefix(prefix)
        if after is not None and not isinstance(after, str):
            raise TypeError(f"list(after=...) takes a key string or None, got {after!r}")
        # Start at the deepest directory that holds every key with this prefix.
        base = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        return self._walk(base, prefix, after)

    def _walk(self, rel_dir: str, prefix: str, after: Optional[str]) -> Iterator[str]:
        """Keys under ``rel_dir`` (``""`` or ending in ``/``), in key order.

        Entries of one directory are sorted by ``name`` for files and ``name + "/"``
        for directories: every key under directory ``d`` starts with ``d/``, and
        no file name contains ``/``, so this order is the global key order.
        """
        path = self.root / rel_dir if rel_dir else self.root
        try:
            scan = os.scandir(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        entries: list[tuple[str, bool]] = []
        with scan:
            for entry in scan:
                name = entry.name
                # Cheap string tests first: `sub` sorts after both the file key and
                # every key under a directory of this name, so if `sub` fails the
                # prefix or `after` test, neither form can match.
                sub = rel_dir + name + "/"
                if after is not None and sub < after and not after.startswith(sub):
                    continue
                if not (sub.startswith(prefix) or prefix.startswith(sub)):
                    continue
                if _is_tmp_name(name):
                    continue
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if not is_dir and not entry.is_file():
                        continue  # sockets, broken links, links to directories
                except OSError:
                    continue  # removed while we scanned
                if is_dir:
                    # (Pruned above when every key under `sub` sorts at or before `after`.)
                    entries.append((sub, True))
                else:
                    key = rel_dir + name
                    if not key.startswith(prefix) or (after is not None and key <= after):
                        continue
                    entries.append((key, False))
        entries.sort()
        for key, is_dir in entries:
            if is_dir:
                yield from self._walk(key, prefix, after)
            else:
                yield key

    def delete(self, key: str) -> None:
        path = self._path(key)
        cdir = self._cas_dir(path)
        if cdir.is_dir():
            shutil.rmtree(cdir, ignore_errors=True)
            self._shard_dirs = {d for d in self._shard_dirs if d.parent != cdir}
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            raise StoreError(
                f"cannot delete {key!r} in {self.root}: it is a prefix of other objects, "
                "not an object"
            ) from None
        if self.fsync:
            fsync_dir(path.parent)


def _fsync_all(fds: list[int]) -> None:
    """fsync every descriptor, concurrently (the calls release the GIL), on the process's
    store-io pool (a pool made per call cost the trainer's publish ~2% of its samples)."""
    on_pool(os.fsync, fds)
