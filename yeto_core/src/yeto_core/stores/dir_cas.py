"""Compare-and-swap on the ``dir`` store: :class:`DirCompareAndSwap`, a mixin of
:class:`~yeto_core.stores.dir_store.DirStore` (``get_versioned``, ``put_if_match``).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Optional

from yeto_core.ports.store import content_version
from yeto_core.stores.files import mkstemp, random_suffix
from yeto_core.stores.fsync import fsync_dir

_TMP_MARK = ".tmp-"
_CAS_MARK = ".tmp-cas"  # the versions of a compare-and-swap key (a tmp-shaped name: unlisted)
_SHARD = 256  # versions per shard folder
_KEEP = 4  # the versions before the newest that keep their bytes (for readers that lag)


def _unlink_quietly(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _shard_folder(cdir: Path, seq: int) -> Path:
    """The shard folder of ``cdir`` that holds version ``seq``."""
    return cdir / f"s{seq // _SHARD:08d}"


def _shard_file(cdir: Path, seq: int) -> Path:
    """Version ``seq``'s file in its shard folder of ``cdir``."""
    return _shard_folder(cdir, seq) / f"{seq:012d}"


def _is_tomb(folder: Path, st: os.stat_result) -> bool:
    try:
        tomb = os.stat(folder / "tomb")
    except FileNotFoundError:
        return False
    return (tomb.st_ino, tomb.st_dev) == (st.st_ino, st.st_dev)


class DirCompareAndSwap:
    """Numbered versions of a key, each created exclusively (the host holds ``fsync``,
    an empty set ``_shard_dirs``, an empty dict ``_newest_seen`` and the key-to-path
    helpers ``_path``, ``_ensure_parent``, ``_refuse_prefix_dir``,
    ``_write_tmp(key, path, data, sync=)`` and ``get``)."""

    # -- compare-and-swap: numbered versions, each created exclusively --------------------
    #
    # A key written by put_if_match keeps its versions as
    # ``.<name>.tmp-cas/s<seq // 256:08d>/<seq:012d>`` beside it (never listed, like
    # temporary files): the next version is *created* with ``link`` (atomic and exclusive,
    # no lock held), so of two writers swapping from version ``n`` exactly one creates
    # ``n + 1``, and a writer paused at any point blocks nobody. ``get`` reads the newest
    # version; the key's own file is a hard link to a version for ``list``/``exists`` and
    # watchers (made after the version, so it may lag, never lead). Because names are
    # taken in order and never freed, the newest version is the highest taken name: a
    # swap from ``n`` needs ``n``'s name taken (one ``lstat``) and wins ``n + 1``'s link,
    # and a reader probes on from the newest number it saw instead of listing.
    #
    # A version number is never free again: an old version's bytes are dropped by renaming
    # a link to its shard's empty ``tomb`` file over it, so its name stays and a writer that
    # read version ``n``, paused while others swapped on and the old versions were dropped,
    # then tried to link ``n + 1``, finds the name taken and fails (when old versions were
    # deleted instead, that writer created the long-dropped number again and was told it
    # had won: a lost update). Shards of 256 keep each listing short as numbers grow.
    # Versions written before shards (``.<name>.tmp-cas/<seq:012d>``) are read, and their
    # numbers stay taken in the same way.

    def _cas_dir(self, path: Path) -> Path:
        return path.parent / f".{path.name}{_CAS_MARK}"

    @staticmethod
    def _digits(folder: Path) -> list[int]:
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [int(n) for n in names if n.isdigit()]

    def _newest(self, cdir: Path) -> Optional[tuple[int, Path]]:
        """The newest version's number and file (live: every older one may be a tomb).

        From the newest number this store saw for ``cdir`` (still taken), the next
        numbers are probed with ``lstat`` until one is free: names are taken in order
        and never freed, so that is the newest, found without listing a shard of up to
        256 names (every read of a swapped key: the follower's, the sampler's backlog,
        the head's). A number no longer there (the key deleted since) lists, as the
        first read does."""
        seen = self._newest_seen.get(cdir)
        if seen is not None and os.path.lexists(_shard_file(cdir, seen)):
            seq = seen
            while os.path.lexists(_shard_file(cdir, seq + 1)):
                seq += 1
            if seq != seen:
                self._newest_seen[cdir] = seq
            return seq, _shard_file(cdir, seq)
        got = self._newest_listed(cdir)
        if got is not None:
            self._newest_seen[cdir] = got[0]
        else:
            self._newest_seen.pop(cdir, None)
        return got

    @classmethod
    def _newest_listed(cls, cdir: Path) -> Optional[tuple[int, Path]]:
        """:meth:`_newest` by listing ``cdir`` and its newest shard."""
        try:
            names = os.listdir(cdir)
        except (FileNotFoundError, NotADirectoryError):
            return None
        flat = [int(n) for n in names if n.isdigit()]  # written before shards
        best = (max(flat), cdir) if flat else None
        shards = sorted(n for n in names if n[:1] == "s" and n[1:].isdigit())
        for shard in reversed(shards):  # the newest shard may be empty for a moment
            seqs = cls._digits(cdir / shard)
            if seqs:
                top = max(seqs)
                if best is None or top > best[0]:
                    best = (top, cdir / shard)
                break
        if best is None:
            return None
        return best[0], best[1] / f"{best[0]:012d}"

    def _read_cas(self, path: Path) -> Optional[tuple[bytes, int]]:
        cdir = self._cas_dir(path)
        for _ in range(8):
            got = self._newest(cdir)
            if got is None:
                return None
            seq, vpath = got
            try:
                with open(vpath, "rb") as f:
                    st = os.fstat(f.fileno())
                    if st.st_size == 0 and _is_tomb(vpath.parent, st):
                        continue  # dropped while we looked (others swapped on): look again
                    return f.read(), seq
            except FileNotFoundError:
                continue  # the key was deleted while we looked: look again
        return None

    def _shard_dir(self, path: Path, seq: int) -> Path:
        """The shard folder of version ``seq`` of ``path``'s key, made (durably) if missing.

        Folders this store made or found are remembered (a swap per round of the trainer
        would otherwise stat both every time); :meth:`_create_version` forgets one that
        vanished (the key deleted behind the store's back)."""
        cdir = self._cas_dir(path)
        sdir = _shard_folder(cdir, seq)
        known = self._shard_dirs
        if sdir in known:
            return sdir
        if not cdir.is_dir():
            cdir.mkdir(exist_ok=True)
            if self.fsync:
                fsync_dir(path.parent)
        if not sdir.is_dir():
            try:
                sdir.mkdir()
            except FileExistsError:
                pass
            if self.fsync:
                fsync_dir(cdir)
        known.add(sdir)
        return sdir

    def _version_file(self, path: Path, seq: int) -> Path:
        return _shard_file(self._cas_dir(path), seq)

    def _has_version_name(self, path: Path, seq: int) -> bool:
        """Whether version ``seq``'s name is taken (live or dropped; in its shard or, for
        versions written before shards, in the key's folder itself)."""
        cdir = self._cas_dir(path)
        return os.path.lexists(self._version_file(path, seq)) or os.path.lexists(
            cdir / f"{seq:012d}"
        )

    def _create_version(self, key: str, path: Path, seq: int, payload: bytes) -> bool:
        cdir = self._cas_dir(path)
        sdir = self._shard_dir(path, seq)
        name = f"{seq:012d}"
        if os.path.lexists(cdir / name):
            return False  # a version of that number written before shards
        try:
            fd, tmp = mkstemp(prefix=f".v{_TMP_MARK}", dir=sdir)
        except FileNotFoundError:  # the key was deleted since: make its folders again
            self._shard_dirs.discard(sdir)
            sdir = self._shard_dir(path, seq)
            fd, tmp = mkstemp(prefix=f".v{_TMP_MARK}", dir=sdir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            try:
                os.link(tmp, sdir / name)
            except FileExistsError:
                return False
        finally:
            _unlink_quietly(tmp)
        if self.fsync:
            fsync_dir(sdir)
        self._drop(cdir, seq - _KEEP - 1)
        return True

    @staticmethod
    def _drop(cdir: Path, seq: int) -> None:
        """Drop version ``seq``'s bytes, keeping its name taken (a link to the tomb)."""
        if seq < 1:
            return
        for folder in (_shard_folder(cdir, seq), cdir):
            vpath = folder / f"{seq:012d}"
            if not os.path.lexists(vpath):
                continue
            tomb = folder / "tomb"
            if not tomb.exists():
                os.close(os.open(tomb, os.O_WRONLY | os.O_CREAT, 0o644))
            tmp = folder / f".t{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex}"
            try:
                os.link(tomb, tmp)
                os.replace(tmp, vpath)  # atomic: readers see the version or the tomb
            except OSError:
                _unlink_quietly(tmp)  # (a full link count: the version keeps its bytes: safe)
            return

    def _mirror(self, key: str, path: Path, payload: bytes, seq: Optional[int] = None) -> None:
        # not fsynced: get and exists read the versions (each fsynced); the copy only
        # makes the key listed and wakes watchers, and the next swap rewrites it. With
        # ``seq``: a hard link to that version's file (its bytes are the payload; no
        # copy written), unless the version was dropped meanwhile (a writer paused
        # here): then a copy, as without ``seq``.
        tmp = None
        if seq is not None:
            tmp = str(path.parent / f".{path.name}{_TMP_MARK}{random_suffix()}")
            try:
                os.link(self._version_file(path, seq), tmp)
                if os.stat(tmp).st_size != len(payload):  # the version's tomb, not its bytes
                    _unlink_quietly(tmp)
                    tmp = None
            except OSError:
                _unlink_quietly(tmp)
                tmp = None
        if tmp is None:
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
        cur = self._read_cas(path) if version is None or version.startswith("v0:") else None
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
            # The newest version is seq - 1 exactly when its name is taken and seq's is
            # free (names are taken in order and never freed; the link below is the
            # exclusive test of seq's): one lstat, not a read of the newest version.
            if seq < 2 or not self._has_version_name(path, seq - 1):
                return None
        if not self._create_version(key, path, seq, payload):
            return None
        self._mirror(key, path, payload, seq)
        return f"v{seq}"
