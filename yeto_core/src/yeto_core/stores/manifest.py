"""Manifest directories: the commit protocol shared by consistent cuts and policy releases.

A manifest directory ``<prefix>/<id>/`` in an object store holds data files and
one ``manifest.json``. Writers follow one order, so a reader never trusts a
half-written directory:

1. every data file (``<prefix>/<id>/<name>``),
2. ``manifest.json`` (sha256 and size of every file, plus the record),
3. the pointer (``cuts/LATEST``, ``releases/LATEST.json``), the commit point.

A crash before 3 leaves an uncommitted directory that no pointer names; a
crash before 2 leaves files without a manifest, which readers treat as
invalid. Readers verify every file against its digest while downloading.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Optional

from yeto_core.errors import NotFoundError
from yeto_core.ports import ObjectStore
from yeto_core.records import ShardDigest
from yeto_core.stores.parallel import is_remote, map_all, overlapped

MANIFEST_NAME = "manifest.json"
_CHUNK = 1 << 20
#: the smallest files of a manifest, up to this many bytes in all, are downloaded at once
#: from a remote store (their bytes held together); the others one at a time
OVERLAP_MAX_BYTES = 256 << 20


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a local file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def digest_dir(local_dir: str | os.PathLike[str]) -> tuple[ShardDigest, ...]:
    """Digest every regular file under ``local_dir`` (names are relative POSIX paths, sorted).

    :raises ValueError: when ``local_dir`` holds a file named ``manifest.json`` at its top
        (that name is the protocol's) or holds no file at all.
    """
    root = Path(local_dir)
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.relative_to(root).as_posix()
        if name == MANIFEST_NAME:
            raise ValueError(
                f"{root} holds a file named {MANIFEST_NAME!r}; that name is reserved for the "
                "manifest the core writes. Rename the backend's file."
            )
        out.append(ShardDigest(name=name, sha256=sha256_file(path), size=path.stat().st_size))
    if not out:
        raise ValueError(f"{root} holds no file; the backend wrote nothing to publish or cut")
    return tuple(out)


def upload_files(
    store: ObjectStore,
    key_prefix: str,
    local_dir: str | os.PathLike[str],
    files: Iterable[ShardDigest],
    *,
    handoff: bool = False,
) -> None:
    """Step 1 of the protocol: put every file of ``local_dir`` under ``key_prefix/``.

    Every file is durable when it returns (the manifest, step 2, is written only
    after). On a local store one ``put_many``, which the ``dir`` store syncs together;
    ``handoff``: the caller never changes these files again (a scratch export), so the
    store may keep the files themselves (``put_files``: the ``dir`` store hard-links
    them) instead of a copy of their bytes. On a remote store (no local files) the puts
    are independent round trips: the smallest files, up to :data:`OVERLAP_MAX_BYTES` in
    all, are put at once (a release of five small files costs one round trip, not
    five), the others one at a time; the first failing file's error is raised.
    """
    root = Path(local_dir)
    files = list(files)
    if len(files) > 1 and is_remote(store):
        wave = _smallest(files)

        def put(f: ShardDigest) -> None:
            store.put(f"{key_prefix}/{f.name}", (root / f.name).read_bytes())

        map_all(store, put, wave)
        for f in files:
            if f not in wave:
                put(f)
        return
    if handoff:
        store.put_files([(f"{key_prefix}/{f.name}", root / f.name) for f in files])
        return
    store.put_many([(f"{key_prefix}/{f.name}", (root / f.name).read_bytes()) for f in files])


def download_verified(
    store: ObjectStore,
    key_prefix: str,
    files: Iterable[ShardDigest],
    dest_dir: str | os.PathLike[str],
    *,
    prefixes: Optional[Mapping[str, str]] = None,
) -> list[str]:
    """Download every file under ``key_prefix/`` into ``dest_dir`` and check its digest.

    ``prefixes``: file name -> the key prefix holding that file instead of ``key_prefix``
    (a release's files shared with an earlier release, :mod:`yeto_core.release.shared`).

    :returns: the problems found (empty when every file is present and matches). A file
        that is missing or whose size or sha256 differs from the manifest is named, with
        what was expected and what was found.
    """
    dest = Path(dest_dir)
    files = list(files)
    problems = []

    where = dict(prefixes or {})

    def key_of(f: ShardDigest) -> str:
        return f"{where.get(f.name, key_prefix)}/{f.name}"

    def get(f: ShardDigest) -> Optional[bytes]:
        try:
            return store.get(key_of(f))
        except NotFoundError:
            return None

    # on a remote store, files of up to OVERLAP_MAX_BYTES in all are requested at once
    # (their bytes held together); the rest one at a time, as on a local store
    early: dict[str, tuple[Optional[bytes], Optional[BaseException]]] = {}
    if len(files) > 1 and is_remote(store):
        wave = _smallest(files)
        if len(wave) > 1:
            early = {f.name: r for f, r in zip(wave, overlapped(store, get, wave), strict=True)}
    for f in files:
        key = key_of(f)
        if f.name in early:
            data, exc = early.pop(f.name)
            if exc is not None:
                raise exc
        else:
            data = get(f)
        if data is None:
            problems.append(f"{key}: missing (the manifest lists it)")
            continue
        digest = sha256_bytes(data)
        if len(data) != f.size or digest != f.sha256:
            problems.append(
                f"{key}: sha256 {digest[:16]}… size {len(data)} does not match the manifest's "
                f"{f.sha256[:16]}… size {f.size}"
            )
            continue
        path = dest / f.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return problems


def _smallest(files: list[ShardDigest]) -> list[ShardDigest]:
    """The smallest of ``files``, up to :data:`OVERLAP_MAX_BYTES` in all: those whose
    requests go at once (their bytes held together)."""
    wave, total = [], 0
    for f in sorted(files, key=lambda f: f.size):
        if total + f.size > OVERLAP_MAX_BYTES:
            break
        wave.append(f)
        total += f.size
    return wave


def link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """A hard link ``dst`` to ``src``, else (another device, no hard links on this file
    system) a copy with its metadata."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def place_local(src: Path, path: Path, size: int) -> bool:
    """Link (else copy) the verified local file ``src`` to ``path`` instead of downloading
    it again; False when ``src`` is gone or no longer has ``size`` bytes."""
    try:
        if src.stat().st_size != size:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(src, path)
    except OSError:
        return False
    return True


def delete_dir(store: ObjectStore, key_prefix: str) -> None:
    """Remove a manifest directory: the manifest first (so it turns invalid), then the files."""
    store.delete(f"{key_prefix}/{MANIFEST_NAME}")
    for key in list(store.list(f"{key_prefix}/")):
        store.delete(key)
