"""Mirror a local directory to a prefix of an object store, object by object.

A run directory (cuts, releases, journals) is written locally and mirrored to a
bucket, or pulled from one onto a fresh machine. The tree uses the commit
protocol of yeto's cuts and releases: files first, a pointer file (``LATEST``,
``LATEST.json``, at any depth) last. The mirror keeps that order both ways:

``push()``
    uploads new or changed files (size and sha256 compared against the index
    the previous push stored, and the remote listing), non-pointer files first,
    then pointer files (deepest first), then the index, then deletes remote
    objects that are gone locally (pointers before data). A reader that follows
    a pointer it sees therefore finds every file the pointer's tree holds.

``pull()``
    reads the remote pointer files, checks that what they name is present,
    downloads every object that differs from the local copy, re-reads the
    pointers and starts again if a push committed meanwhile, and then writes the
    pointer files locally last and removes local files that are not remote.
    Local writes are atomic (temporary file, rename).

A pointer *names* a sibling: the stripped text of ``LATEST`` (``c00000003-i1-stop``
→ ``cuts/c00000003-i1-stop/``), or the ``release_id`` / ``cut_id`` / ``id`` /
``path`` / ``dir`` string of ``LATEST.json``. A pointer whose target is absent
remotely makes ``pull`` retry and then fail with a clear error.

The index lives at ``<prefix>/.yeto-mirror/index.json``; local paths under
``.yeto-mirror/`` are not mirrored.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Optional, Union

import attrs

from yeto_core.errors import InvalidKeyError, NotFoundError, StoreError
from yeto_core.ports import ObjectStore
from yeto_core.stores.keys import check_key, check_prefix

POINTER_NAMES = ("LATEST", "LATEST.json")
INDEX_DIR = ".yeto-mirror"
INDEX_NAME = f"{INDEX_DIR}/index.json"
POINTER_REF_FIELDS = ("release_id", "cut_id", "id", "path", "dir")
_PART_MARK = ".yeto-part-"


@attrs.frozen
class PushResult:
    uploaded: tuple[str, ...]  # in upload order
    deleted: tuple[str, ...]
    unchanged: int


@attrs.frozen
class PullResult:
    downloaded: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: int
    attempts: int


class MirrorError(StoreError):
    """The remote tree could not be pulled consistently (or a local path cannot be mirrored)."""


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _is_temp(name: str) -> bool:
    return name.startswith(".") and (".tmp-" in name or _PART_MARK in name)


def _depth(rel: str) -> int:
    return rel.count("/")


class TreeMirror:
    """Mirror ``local_dir`` to ``prefix`` of ``store`` (``push``) and back (``pull``)."""

    def __init__(
        self,
        local_dir: Union[str, os.PathLike[str]],
        store: ObjectStore,
        prefix: str = "",
        *,
        pointer_names: Iterable[str] = POINTER_NAMES,
        max_pull_attempts: int = 5,
    ) -> None:
        prefix = prefix.strip("/")
        if prefix:
            check_prefix(prefix + "/")
            prefix += "/"
        self.local_dir = Path(local_dir)
        self.store = store
        self.prefix = prefix
        self.pointer_names = frozenset(pointer_names)
        self.max_pull_attempts = max_pull_attempts
        self._hash_cache: dict[tuple[str, int, int, int], str] = {}

    def __repr__(self) -> str:
        return f"TreeMirror({str(self.local_dir)!r}, {self.store!r}, prefix={self.prefix!r})"

    # -- local side --------------------------------------------------------------------

    def is_pointer(self, rel: str) -> bool:
        return posixpath.basename(rel) in self.pointer_names

    def _local_files(self) -> dict[str, tuple[int, str]]:
        """``{relative path: (size, sha256)}`` of the local tree (temp files skipped)."""
        out: dict[str, tuple[int, str]] = {}
        if not self.local_dir.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(self.local_dir):
            rel_dir = os.path.relpath(dirpath, self.local_dir)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            if rel_dir == "":
                dirnames[:] = [d for d in dirnames if d != INDEX_DIR]
            for name in filenames:
                if _is_temp(name):
                    continue
                path = Path(dirpath) / name
                if not path.is_file():
                    continue
                rel = rel_dir + name
                try:
                    check_key(rel)
                except InvalidKeyError as exc:
                    raise MirrorError(f"cannot mirror {path}: {exc}") from None
                st = path.stat()
                ck = (rel, st.st_size, st.st_mtime_ns, st.st_ino)
                digest = self._hash_cache.get(ck)
                if digest is None:
                    digest = _sha256_file(path)
                    self._hash_cache[ck] = digest
                out[rel] = (st.st_size, digest)
        return out

    def _write_local(self, rel: str, data: bytes) -> None:
        path = self.local_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{_PART_MARK}", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def _remove_local(self, rel: str) -> None:
        path = self.local_dir / rel
        try:
            path.unlink()
        except FileNotFoundError:
            return
        parent = path.parent
        while parent != self.local_dir and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent

    # -- remote side -------------------------------------------------------------------

    def _remote_keys(self) -> list[str]:
        cut = len(self.prefix)
        return [
            k[cut:] for k in self.store.list(self.prefix) if not k[cut:].startswith(INDEX_DIR + "/")
        ]

    def _read_index(self) -> dict[str, tuple[int, str]]:
        try:
            raw = json.loads(self.store.get(self.prefix + INDEX_NAME))
        except NotFoundError:
            return {}
        except ValueError:
            return {}  # an unreadable index only costs re-uploads
        files = raw.get("files", {}) if isinstance(raw, dict) else {}
        return {
            rel: (int(v["size"]), str(v["sha256"]))
            for rel, v in files.items()
            if isinstance(v, dict) and "size" in v and "sha256" in v
        }

    def _write_index(self, files: dict[str, tuple[int, str]]) -> None:
        body = {
            "format": 1,
            "files": {rel: {"size": s, "sha256": h} for rel, (s, h) in sorted(files.items())},
        }
        self.store.put(self.prefix + INDEX_NAME, json.dumps(body, sort_keys=True).encode())

    # -- push ----------------------------------------------------------------------------

    def push(self) -> PushResult:
        """Upload the local tree; pointer files last; prune remote objects gone locally."""
        local = self._local_files()
        index = self._read_index()
        remote = set(self._remote_keys())
        changed = [
            rel for rel in sorted(local) if rel not in remote or index.get(rel) != local[rel]
        ]
        data = [rel for rel in changed if not self.is_pointer(rel)]
        pointers = sorted(
            (rel for rel in changed if self.is_pointer(rel)), key=lambda r: (-_depth(r), r)
        )
        uploaded = []
        for rel in data + pointers:
            self.store.put(self.prefix + rel, (self.local_dir / rel).read_bytes())
            uploaded.append(rel)
        self._write_index(local)
        gone = sorted((remote | set(index)) - set(local))
        gone.sort(key=lambda r: (not self.is_pointer(r), r))  # pointers first
        for rel in gone:
            self.store.delete(self.prefix + rel)
        return PushResult(
            uploaded=tuple(uploaded), deleted=tuple(gone), unchanged=len(local) - len(changed)
        )

    # -- pull ------------------------------------------------------------------------------

    def _read_pointers(self, keys: Iterable[str]) -> Optional[dict[str, bytes]]:
        out = {}
        for rel in keys:
            if self.is_pointer(rel):
                try:
                    out[rel] = self.store.get(self.prefix + rel)
                except NotFoundError:
                    return None  # deleted while we read: a push is pruning
        return out

    def pointer_targets(self, rel: str, content: bytes) -> list[str]:
        """The sibling paths a pointer file names (see the module docstring)."""
        base = posixpath.dirname(rel)
        names: list[str] = []
        if rel.endswith(".json"):
            try:
                doc = json.loads(content)
            except ValueError:
                return []
            if isinstance(doc, dict):
                names = [
                    doc[f] for f in POINTER_REF_FIELDS if isinstance(doc.get(f), str) and doc[f]
                ]
        else:
            text = content.decode("utf-8", errors="replace").strip()
            names = [text] if text else []
        out = []
        for name in names:
            target = posixpath.join(base, name) if base else name
            try:
                check_key(target)
            except InvalidKeyError:
                continue
            out.append(target)
        return out

    def _missing_targets(self, pointers: dict[str, bytes], keys: set[str]) -> list[str]:
        missing = []
        for rel, content in pointers.items():
            for target in self.pointer_targets(rel, content):
                if target in keys:
                    continue
                if not any(k.startswith(target + "/") for k in keys):
                    missing.append(f"{rel} -> {target}")
        return missing

    def pull(self, *, force: bool = False) -> PullResult:
        """Make the local tree equal the newest committed remote tree.

        A prefix that holds no mirror (no index a push writes, nothing listed) is
        refused while the local tree has files, since pulling it would delete them
        all: a wrong or empty prefix must not wipe a local copy. ``force=True``
        pulls it anyway (the local tree is emptied).
        """
        problem = ""
        for attempt in range(1, self.max_pull_attempts + 1):
            keys = self._remote_keys()
            key_set = set(keys)
            if not force and not self.store.exists(self.prefix + INDEX_NAME):
                local_now = self._local_files()
                if local_now and not (key_set & set(local_now)):
                    raise MirrorError(
                        f"refusing to pull {self.store!r} prefix {self.prefix!r} into "
                        f"{str(self.local_dir)!r}: no mirror was pushed there (no "
                        f"{INDEX_NAME}) and pulling it would delete the "
                        f"{len(local_now)} local file(s). Check the prefix, or pull with "
                        "force=True to empty the local copy."
                    )
            pointers = self._read_pointers(keys)
            if pointers is None:
                problem = "a pointer file vanished while it was read"
                continue
            missing = self._missing_targets(pointers, key_set)
            if missing:
                problem = f"pointer targets absent remotely: {missing}"
                continue
            index = self._read_index()
            local = self._local_files()
            fetched: dict[str, bytes] = {}
            vanished = False
            for rel in keys:
                if self.is_pointer(rel):
                    continue
                if rel in local and index.get(rel) == local[rel]:
                    continue
                try:
                    fetched[rel] = self.store.get(self.prefix + rel)
                except NotFoundError:
                    vanished = True
                    break
            if vanished:
                problem = "an object vanished while it was downloaded (a push is pruning)"
                continue
            again = self._read_pointers(k for k in self._remote_keys() if self.is_pointer(k))
            if again != pointers:
                problem = "the pointer files changed while the tree was downloaded"
                continue
            downloaded = []
            for rel, data in fetched.items():
                if rel in local and local[rel] == (
                    len(data),
                    hashlib.sha256(data).hexdigest(),
                ):
                    continue
                self._write_local(rel, data)
                downloaded.append(rel)
            removed = sorted(set(local) - key_set)
            removed.sort(key=lambda r: (not self.is_pointer(r), r))
            for rel in removed:
                self._remove_local(rel)
            for rel in sorted(pointers, key=lambda r: (-_depth(r), r)):
                data = pointers[rel]
                if local.get(rel) != (len(data), hashlib.sha256(data).hexdigest()):
                    self._write_local(rel, data)
                    downloaded.append(rel)
            return PullResult(
                downloaded=tuple(downloaded),
                removed=tuple(removed),
                unchanged=len(keys) - len(downloaded),
                attempts=attempt,
            )
        raise MirrorError(
            f"could not pull a committed tree from {self.store!r} prefix {self.prefix!r} "
            f"after {self.max_pull_attempts} attempts: {problem}. If no push is running, "
            "push again from the writer (its pointers name files that are missing)."
        )
